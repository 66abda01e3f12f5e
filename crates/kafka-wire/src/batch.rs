//! The v2 record batch format, shared by the log-level reader and the
//! fetcher: taking complete batches off the front of a Fetch answer's
//! `records`, reading a batch's header without decoding its records, and
//! decoding its records as slices of the answer (no copy of keys and
//! values).
//!
//! An entry of the older message formats (magic 0 and 1, see
//! [`legacy`](crate::legacy)) starts like a batch (offset, size, then the
//! magic byte at the same place), so it is taken off an answer alike, has
//! a header (of a plain batch: no producer, no transaction), and its
//! records are decoded by [`legacy`](crate::legacy).

use bytes::{Buf, Bytes};
use kafka_protocol::compression::{self, Decompressor};

use crate::legacy;
use crate::records::{ControlMarker, RecordHeader};

/// Bytes before a batch's payload that tell its length: base offset (8) and
/// batch length (4).
pub(crate) const BATCH_PREFIX: usize = 12;
/// Position of the partition leader epoch in a v2 batch.
const LEADER_EPOCH_AT: usize = 12;
/// Position of the magic byte in a batch (and in a v0/v1 entry).
pub(crate) const MAGIC_AT: usize = 16;
/// Position of the attributes in a v2 batch.
const ATTRIBUTES_AT: usize = 21;
/// Position of `lastOffsetDelta` in a v2 batch.
const LAST_OFFSET_DELTA_AT: usize = 23;
/// Position of the producer id in a v2 batch.
const PRODUCER_ID_AT: usize = 43;
/// Position of the producer epoch in a v2 batch.
const PRODUCER_EPOCH_AT: usize = 51;
/// Size of a v2 batch header, up to and including the record count.
pub(crate) const BATCH_HEADER: usize = 61;
/// Attribute bit of a transactional batch.
const TRANSACTIONAL: i16 = 1 << 4;
/// Attribute bit of a control batch.
const CONTROL: i16 = 1 << 5;

/// Takes the next complete batch (or v0/v1 entry) off the front of `raw`.
/// `Ok(None)` when `raw` holds no complete batch: it is empty, or holds the
/// start of a batch a broker cut at its byte limit (left in `raw`).
pub(crate) fn take_batch(raw: &mut Bytes) -> Result<Option<Bytes>, String> {
    if raw.len() < BATCH_PREFIX {
        return Ok(None);
    }
    let length = i32::from_be_bytes(raw[8..BATCH_PREFIX].try_into().expect("4 bytes"));
    let length = usize::try_from(length).map_err(|_| format!("negative batch length {length}"))?;
    if raw.len() < BATCH_PREFIX + length {
        return Ok(None);
    }
    Ok(Some(raw.split_to(BATCH_PREFIX + length)))
}

/// What a batch's header says, read without decoding (or checking the
/// CRC of) its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    /// Its message format: 2, or 0 and 1 for an entry of a message set.
    pub magic: i8,
    /// Offset of the batch's first record; for a v0/v1 entry its offset,
    /// which is its last record's (a compressed entry's first record is
    /// known only once decompressed).
    pub base_offset: i64,
    /// Offset of its last record as written (records compacted away since
    /// may leave the last remaining one below it).
    pub last_offset: i64,
    /// The producer id; -1 for a producer that is neither idempotent nor
    /// transactional.
    pub producer_id: i64,
    /// The producer epoch; -1 without a producer id.
    pub producer_epoch: i16,
    /// Whether the batch belongs to a transaction.
    pub transactional: bool,
    /// Whether it is a control batch (a transaction marker).
    pub control: bool,
    /// The leader epoch of the partition when the batch was appended (-1
    /// when unknown).
    pub leader_epoch: i32,
}

impl BatchHeader {
    /// Reads the header of one complete batch (as [`take_batch`] returns
    /// it). An entry of message format v0 or v1 has the header of a plain
    /// batch (no producer id, no transaction, no control): those formats
    /// have none of them.
    pub(crate) fn read(batch: &[u8]) -> Result<BatchHeader, String> {
        let base_offset = (&batch[..8]).get_i64();
        let magic = *batch.get(MAGIC_AT).ok_or("batch shorter than its header")? as i8;
        match magic {
            2 => {}
            0 | 1 if batch.len() < BATCH_PREFIX + legacy::MESSAGE_OVERHEAD_V0 => {
                return Err(format!(
                    "the message at offset {base_offset} is shorter than the smallest message"
                ));
            }
            0 | 1 => {
                return Ok(BatchHeader {
                    magic,
                    base_offset,
                    last_offset: base_offset,
                    producer_id: -1,
                    producer_epoch: -1,
                    transactional: false,
                    control: false,
                    leader_epoch: -1,
                })
            }
            other => {
                return Err(format!(
                    "the batch at offset {base_offset} has an unknown magic {other}"
                ))
            }
        }
        if batch.len() < BATCH_HEADER {
            return Err(format!(
                "the batch at offset {base_offset} is shorter than a batch header"
            ));
        }
        let attributes = (&batch[ATTRIBUTES_AT..]).get_i16();
        let last_offset_delta = (&batch[LAST_OFFSET_DELTA_AT..]).get_i32();
        Ok(BatchHeader {
            magic,
            base_offset,
            last_offset: base_offset + i64::from(last_offset_delta),
            producer_id: (&batch[PRODUCER_ID_AT..]).get_i64(),
            producer_epoch: (&batch[PRODUCER_EPOCH_AT..]).get_i16(),
            transactional: attributes & TRANSACTIONAL != 0,
            control: attributes & CONTROL != 0,
            leader_epoch: (&batch[LEADER_EPOCH_AT..]).get_i32(),
        })
    }
}

/// One record of a batch: its key, value and header values are slices of
/// the fetched bytes (or of the batch's decompressed payload), not copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    /// The record's offset.
    pub offset: i64,
    /// Its timestamp in Unix milliseconds: the producer's (creation time),
    /// or the broker's for a topic with `message.timestamp.type =
    /// LogAppendTime`; -1 for a record of message format v0, which has no
    /// timestamps.
    pub timestamp: i64,
    /// Its key (`None`: a null key).
    pub key: Option<Bytes>,
    /// Its value (`None`: a null value, a tombstone).
    pub value: Option<Bytes>,
    /// Its headers, in order, repeated keys included (none in message
    /// formats v0 and v1, which have no headers).
    pub headers: Vec<RecordHeader>,
    /// The partition's leader epoch when the record was appended (its
    /// batch's; -1 when unknown): what a position that passed it records,
    /// so that a log truncated below it later can be told (KIP-320).
    pub leader_epoch: i32,
}

/// Decodes the records of one complete batch (see [`decode_records_into`]).
pub(crate) fn decode_records(batch: Bytes) -> Result<Vec<FetchedRecord>, String> {
    let mut records = Vec::new();
    decode_records_into(batch, &mut records)?;
    Ok(records)
}

/// Decodes the records of one complete batch onto the end of `out`: checks
/// its CRC, decompresses its payload as needed (gzip, snappy, lz4, zstd)
/// and reads every record. Keys, values and header values are slices of
/// `batch` (or of its decompressed payload). An entry of message format v0
/// or v1 is decoded by [`legacy::decode_into`]. On an error `out` may hold
/// some of the batch's records.
pub(crate) fn decode_records_into(batch: Bytes, out: &mut Vec<FetchedRecord>) -> Result<(), String> {
    let header = BatchHeader::read(&batch)?;
    if header.magic < 2 {
        return legacy::decode_into(batch, out);
    }
    let at = |what: &str| format!("the batch at offset {}: {what}", header.base_offset);
    let supplied_crc = (&batch[CRC_AT..]).get_u32();
    if crc32c::crc32c(&batch[ATTRIBUTES_AT..]) != supplied_crc {
        return Err(at("CRC mismatch (corrupt data)"));
    }
    let attributes = (&batch[ATTRIBUTES_AT..]).get_i16();
    let base_timestamp = (&batch[BASE_TIMESTAMP_AT..]).get_i64();
    let max_timestamp = (&batch[MAX_TIMESTAMP_AT..]).get_i64();
    let count = (&batch[RECORD_COUNT_AT..]).get_i32();
    let count = usize::try_from(count).map_err(|_| at(&format!("negative record count {count}")))?;
    let batch_info = BatchInfo {
        base_offset: header.base_offset,
        leader_epoch: header.leader_epoch,
        base_timestamp,
        log_append_time: (attributes & LOG_APPEND_TIME != 0).then_some(max_timestamp),
        count,
    };
    let mut payload = batch.slice(BATCH_HEADER..);
    let decoded = match attributes & COMPRESSION {
        0 => batch_info.read(&mut payload, out),
        codec => {
            // The decompressors' own errors are anyhow's; the records' stay ours.
            let read = |buf: &mut Bytes| Ok(batch_info.read(buf, out));
            let decompressed = match codec {
                1 => compression::Gzip::decompress(&mut payload, read),
                2 => compression::Snappy::decompress(&mut payload, read),
                3 => compression::Lz4::decompress(&mut payload, read),
                4 => compression::Zstd::decompress(&mut payload, read),
                other => return Err(at(&format!("unknown compression codec {other}"))),
            };
            decompressed
                .map_err(|e| format!("decompressing: {e}"))
                .and_then(|read| read)
        }
    };
    decoded.map_err(|e| at(&e))
}

/// Bit of the attributes giving a batch's timestamps the broker's time.
const LOG_APPEND_TIME: i16 = 1 << 3;
/// Bits of the attributes naming the compression codec.
const COMPRESSION: i16 = 0x7;
/// Position of the CRC in a v2 batch.
const CRC_AT: usize = 17;
/// Position of the first timestamp in a v2 batch.
const BASE_TIMESTAMP_AT: usize = 27;
/// Position of the max timestamp in a v2 batch.
const MAX_TIMESTAMP_AT: usize = 35;
/// Position of the record count in a v2 batch.
const RECORD_COUNT_AT: usize = 57;

/// What the records of a batch are read against.
struct BatchInfo {
    base_offset: i64,
    leader_epoch: i32,
    base_timestamp: i64,
    /// The batch's max timestamp, when it replaces every record's own.
    log_append_time: Option<i64>,
    count: usize,
}

impl BatchInfo {
    /// Reads `count` records off `payload` (the batch's records, after
    /// decompression) onto the end of `records`.
    fn read(&self, payload: &mut Bytes, records: &mut Vec<FetchedRecord>) -> Result<(), String> {
        records.reserve(self.count.min(payload.len()));
        let mut at = Cursor::new(payload, 0, payload.len());
        for _ in 0..self.count {
            let length = at.varint()?;
            let length = usize::try_from(length).map_err(|_| format!("negative record length {length}"))?;
            let end = at.at.checked_add(length).filter(|end| *end <= at.end);
            let end = end.ok_or_else(|| format!("a record of {length} bytes runs past the batch's end"))?;
            records.push(self.record(Cursor::new(payload, at.at, end))?);
            at.at = end;
        }
        payload.advance(at.at);
        Ok(())
    }

    /// One record: attributes, timestamp and offset deltas, key, value,
    /// headers. Only the key and the value (and header values) become
    /// slices of the payload: one reference each, nothing else counted.
    fn record(&self, mut record: Cursor<'_>) -> Result<FetchedRecord, String> {
        if record.at == record.end {
            return Err("an empty record".into());
        }
        record.at += 1; // attributes: unused
        let timestamp_delta = record.varlong()?;
        let offset_delta = record.varint()?;
        let key = record.bytes()?;
        let value = record.bytes()?;
        let count = record.varint()?;
        let count = usize::try_from(count).map_err(|_| format!("negative header count {count}"))?;
        let mut headers = Vec::with_capacity(count.min(record.end - record.at));
        for _ in 0..count {
            let key = record.range()?.ok_or("a header with a null key")?;
            let key = String::from_utf8(record.payload[key].to_vec())
                .map_err(|_| "a header key that is not UTF-8".to_string())?;
            let value = record.range()?.map(|value| record.payload[value].to_vec());
            headers.push(RecordHeader { key, value });
        }
        Ok(FetchedRecord {
            offset: self.base_offset + i64::from(offset_delta),
            timestamp: self
                .log_append_time
                .unwrap_or(self.base_timestamp.wrapping_add(timestamp_delta)),
            key,
            value,
            headers,
            leader_epoch: self.leader_epoch,
        })
    }
}

/// Reads fields off `payload[at..end]` without taking slices of it until
/// a key or value is wanted.
struct Cursor<'p> {
    payload: &'p Bytes,
    at: usize,
    end: usize,
}

impl<'p> Cursor<'p> {
    fn new(payload: &'p Bytes, at: usize, end: usize) -> Cursor<'p> {
        Cursor { payload, at, end }
    }

    /// A length-prefixed byte string (-1: null), as a slice of the payload.
    fn bytes(&mut self) -> Result<Option<Bytes>, String> {
        Ok(self.range()?.map(|range| self.payload.slice(range)))
    }

    /// Where a length-prefixed byte string (-1: null) lies in the payload.
    fn range(&mut self) -> Result<Option<std::ops::Range<usize>>, String> {
        let length = self.varint()?;
        if length == -1 {
            return Ok(None);
        }
        let length = usize::try_from(length).map_err(|_| format!("negative length {length}"))?;
        if self.end - self.at < length {
            return Err(format!("a field of {length} bytes runs past its record's end"));
        }
        self.at += length;
        Ok(Some(self.at - length..self.at))
    }

    /// A zigzag-encoded variable-length `i32`.
    fn varint(&mut self) -> Result<i32, String> {
        let value = self.varlong()?;
        i32::try_from(value).map_err(|_| format!("varint {value} out of range"))
    }

    /// A zigzag-encoded variable-length `i64`.
    fn varlong(&mut self) -> Result<i64, String> {
        let mut raw = 0u64;
        for (i, byte) in self.payload[self.at..self.end].iter().copied().enumerate().take(10) {
            raw |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.at += i + 1;
                return Ok((raw >> 1) as i64 ^ -((raw & 1) as i64));
            }
        }
        Err("a truncated or overlong varint".into())
    }
}

/// The marker a control batch carries, from the key of its control record;
/// [`ControlMarker::Emptied`] for a control batch without a record
/// (compaction keeps a producer's last marker as an empty batch once the
/// marker's delete horizon passed).
pub(crate) fn control_marker(header: &BatchHeader, batch: Bytes) -> Result<ControlMarker, String> {
    let records = decode_records(batch)?;
    let Some(record) = records.first() else {
        return Ok(ControlMarker::Emptied);
    };
    ControlMarker::from_key(record.key.as_deref().unwrap_or_default()).ok_or_else(|| {
        format!(
            "the control batch at offset {} has no valid control key",
            header.base_offset
        )
    })
}

#[cfg(test)]
mod tests;
