//! Message sets of the formats before v2 (magic 0 and 1), read as Kafka's
//! own consumer reads them.
//!
//! Kafka 4.x no longer writes these formats, but a topic with a long
//! retention may still hold segments written by a broker of 0.10 or
//! older, and the broker serves them as they lie on disk. In a Fetch
//! answer such a segment's bytes are a sequence of entries, each
//! `offset (8) | size (4) | message (size)`, laid like a v2 batch's first
//! twelve bytes (so [`take_batch`](crate::batch::take_batch) splits them
//! off the same way, and a broker's cut entry is left for the next fetch
//! alike). A message is
//!
//! ```text
//! crc (4, CRC32 of the rest) | magic (1) | attributes (1)
//!   | timestamp (8, v1 only) | key (4 + n, -1 null) | value (4 + n, -1 null)
//! ```
//!
//! The low three bits of the attributes name the codec (0 none, 1 gzip,
//! 2 snappy, 3 lz4); bit 3 gives v1 timestamps the broker's time
//! (LogAppendTime).
//!
//! ## Compressed messages
//!
//! A compressed message is a wrapper: its value is an inner message set,
//! compressed, whose messages are plain ones. The wrapper's offset is the
//! offset of the last inner message. In v0 the inner offsets are absolute;
//! in v1 they are relative, and a message's offset is the wrapper's minus
//! the last inner relative offset plus its own (not the wrapper's minus the
//! count: compaction may have removed some). A wrapper offset of 0 means a
//! base of 0 (some librdkafka versions produced that). With LogAppendTime
//! on a v1 wrapper, every inner v1 message has the wrapper's timestamp.
//!
//! The decompressors are `kafka-protocol`'s (the ones v2 batches use):
//!
//! - snappy: Kafka's Java clients wrote xerial's framing (`\x82SNAPPY\0`,
//!   a version and a compatible version, then length-prefixed blocks);
//!   others wrote raw snappy. Both are read, as Java's consumer does.
//! - lz4: Kafka before 0.10 computed the frame descriptor's checksum over
//!   the frame's magic number too (KAFKA-3160), and Java's consumer ignores
//!   that checksum in magic-0 messages. The LZ4 library checks it always,
//!   so for magic 0 the checksum byte is set to the right value before
//!   decoding: what was written is read, no more is accepted.
//!
//! ## What comes out
//!
//! The records come out as [`FetchedRecord`]s: offset, timestamp (-1 in
//! v0, which has none), key and value (nulls kept as `None`), no headers,
//! leader epoch -1 (unknown: these formats predate leader epochs).
//! Keys and values of uncompressed messages are slices of the fetched
//! bytes; those of compressed ones slices of the decompressed set. These
//! formats have no producer ids, transactions or control batches, so their
//! records are always delivered, under read_committed too.
//!
//! Like Java's consumer, every message's CRC is checked (inner ones too),
//! an empty or null inner set, a compressed inner message and a v1 wrapper
//! offset below its last inner relative offset are errors, and a partial
//! message at the end of an inner set ends the set.

use bytes::{Buf, Bytes};
use kafka_protocol::compression::{self, Decompressor};
use twox_hash::XxHash32;

use crate::batch::{FetchedRecord, BATCH_PREFIX};

/// Smallest message: CRC (4), magic (1), attributes (1), key length (4),
/// value length (4).
pub(crate) const MESSAGE_OVERHEAD_V0: usize = 14;
/// Bits of the attributes naming the compression codec.
const COMPRESSION: u8 = 0x7;
/// Attribute bit of a v1 message whose timestamp is the broker's.
const LOG_APPEND_TIME: u8 = 1 << 3;
/// Codec numbers of the attributes.
const NONE: u8 = 0;
const GZIP: u8 = 1;
const SNAPPY: u8 = 2;
const LZ4: u8 = 3;
/// An LZ4 frame's magic number, as it lies in the frame.
const LZ4_MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];

/// One message as it lies in a message set, with its entry's offset.
#[derive(Debug)]
struct Message {
    offset: i64,
    magic: u8,
    attributes: u8,
    /// -1 in v0.
    timestamp: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
}

impl Message {
    /// Reads the message of `entry` (one complete entry: offset, size,
    /// message) and checks its CRC. Key and value are slices of `entry`.
    fn read(entry: &Bytes) -> Result<Message, String> {
        let offset = (&entry[..8]).get_i64();
        let at = |what: String| format!("the message at offset {offset}: {what}");
        if entry.len() < BATCH_PREFIX + MESSAGE_OVERHEAD_V0 {
            return Err(at(format!(
                "{} bytes, fewer than the smallest message",
                entry.len().saturating_sub(BATCH_PREFIX)
            )));
        }
        let supplied_crc = (&entry[BATCH_PREFIX..]).get_u32();
        if crc32fast::hash(&entry[BATCH_PREFIX + 4..]) != supplied_crc {
            return Err(at("CRC mismatch (corrupt data)".into()));
        }
        let magic = entry[BATCH_PREFIX + 4];
        let attributes = entry[BATCH_PREFIX + 5];
        let mut at_field = BATCH_PREFIX + 6;
        let timestamp = match magic {
            0 => -1,
            1 => {
                let timestamp = entry
                    .get(at_field..at_field + 8)
                    .ok_or_else(|| at("a v1 message too short for its timestamp".into()))?;
                at_field += 8;
                (&timestamp[..]).get_i64()
            }
            other => return Err(at(format!("magic {other} in a message set of format v0/v1"))),
        };
        let key = field(entry, &mut at_field).map_err(|e| at(format!("key: {e}")))?;
        let value = field(entry, &mut at_field).map_err(|e| at(format!("value: {e}")))?;
        Ok(Message {
            offset,
            magic,
            attributes,
            timestamp,
            key,
            value,
        })
    }

    fn codec(&self) -> u8 {
        self.attributes & COMPRESSION
    }

    /// Its timestamp as a message inside `wrapper`: the wrapper's for a v1
    /// message in a v1 wrapper with LogAppendTime, else its own.
    fn timestamp_in(&self, wrapper: &Message) -> i64 {
        let log_append_time = wrapper.magic == 1 && wrapper.attributes & LOG_APPEND_TIME != 0;
        if self.magic == 1 && log_append_time {
            wrapper.timestamp
        } else {
            self.timestamp
        }
    }

    fn into_record(self, offset: i64, timestamp: i64) -> FetchedRecord {
        FetchedRecord {
            offset,
            timestamp,
            key: self.key,
            value: self.value,
            headers: Vec::new(),
            leader_epoch: -1,
        }
    }
}

/// A length-prefixed byte string (-1: null) at `entry[*at..]`, as a slice.
fn field(entry: &Bytes, at: &mut usize) -> Result<Option<Bytes>, String> {
    let length = entry
        .get(*at..*at + 4)
        .ok_or("its length runs past the message's end")?;
    let length = (&length[..]).get_i32();
    *at += 4;
    if length == -1 {
        return Ok(None);
    }
    let length = usize::try_from(length).map_err(|_| format!("negative length {length}"))?;
    if entry.len() - *at < length {
        return Err(format!("{length} bytes run past the message's end"));
    }
    *at += length;
    Ok(Some(entry.slice(*at - length..*at)))
}

/// Decodes one complete entry of a v0/v1 message set (as
/// [`take_batch`](crate::batch::take_batch) returns it) onto the end of
/// `out`: one record for a plain message, every inner record of a
/// compressed one. Errors name the entry's offset; on an error `out` is
/// left as it was.
pub(crate) fn decode_into(entry: Bytes, out: &mut Vec<FetchedRecord>) -> Result<(), String> {
    let wrapper = Message::read(&entry)?;
    if wrapper.codec() == NONE {
        let timestamp = wrapper.timestamp;
        let offset = wrapper.offset;
        out.push(wrapper.into_record(offset, timestamp));
        return Ok(());
    }
    let at = |what: String| format!("the compressed message at offset {}: {what}", wrapper.offset);
    let Some(value) = wrapper.value.clone() else {
        return Err(at("a null value instead of a message set".into()));
    };
    let set = decompress(wrapper.codec(), wrapper.magic, value).map_err(at)?;
    let inner = inner_messages(set).map_err(at)?;
    let Some(last) = inner.last() else {
        return Err(at("an empty message set".into()));
    };
    // Inner offsets are absolute in v0, relative in v1.
    let base = match wrapper.magic {
        0 => 0,
        _ if wrapper.offset == 0 => 0,
        _ if wrapper.offset < last.offset => {
            return Err(at(format!(
                "the last inner relative offset {} is past the wrapper's offset",
                last.offset
            )));
        }
        _ => wrapper.offset - last.offset,
    };
    if let Some(compressed) = inner.iter().find(|message| message.codec() != NONE) {
        return Err(at(format!("the inner message {} is compressed too", compressed.offset)));
    }
    out.reserve(inner.len());
    for message in inner {
        let timestamp = message.timestamp_in(&wrapper);
        let offset = base + message.offset;
        out.push(message.into_record(offset, timestamp));
    }
    Ok(())
}

/// The messages of a decompressed inner message set, each CRC-checked. A
/// partial message at the end ends the set (as in Java's consumer).
fn inner_messages(mut set: Bytes) -> Result<Vec<Message>, String> {
    let mut messages = Vec::new();
    while set.len() >= BATCH_PREFIX {
        let size = (&set[8..BATCH_PREFIX]).get_i32();
        let size = usize::try_from(size)
            .ok()
            .filter(|size| *size >= MESSAGE_OVERHEAD_V0)
            .ok_or_else(|| format!("an inner message of {size} bytes, fewer than the smallest message"))?;
        if set.len() < BATCH_PREFIX + size {
            break;
        }
        messages.push(Message::read(&set.split_to(BATCH_PREFIX + size))?);
    }
    Ok(messages)
}

/// The inner message set in `value`, compressed with `codec` by a writer of
/// message format `magic`.
fn decompress(codec: u8, magic: u8, mut value: Bytes) -> Result<Bytes, String> {
    let take = |set: &mut Bytes| Ok(std::mem::take(set));
    let (name, decompressed) = match codec {
        GZIP => ("gzip", compression::Gzip::decompress(&mut value, take)),
        SNAPPY => ("snappy", compression::Snappy::decompress(&mut value, take)),
        LZ4 if magic == 0 => {
            let mut frame = value.to_vec();
            set_descriptor_checksum(&mut frame);
            ("lz4", compression::Lz4::decompress(&mut Bytes::from(frame), take))
        }
        LZ4 => ("lz4", compression::Lz4::decompress(&mut value, take)),
        other => {
            return Err(format!(
                "compression codec {other}, which message format v{magic} does not have"
            ))
        }
    };
    decompressed.map_err(|e| format!("decompressing {name}: {e:#}"))
}

/// Sets the descriptor checksum of the LZ4 frame at the front of `frame` to
/// the right value: the second byte of the xxHash32 of the descriptor
/// (flags, block descriptor and the optional content size and dictionary
/// id). Magic-0 writers hashed the frame's magic number too (KAFKA-3160).
/// Leaves what is no LZ4 frame header for the decoder to refuse.
fn set_descriptor_checksum(frame: &mut [u8]) {
    if frame.len() < 7 || frame[..4] != LZ4_MAGIC {
        return;
    }
    let flags = frame[4];
    let content_size = if flags & 0x08 != 0 { 8 } else { 0 };
    let dictionary_id = if flags & 0x01 != 0 { 4 } else { 0 };
    let checksum_at = 6 + content_size + dictionary_id;
    if frame.len() <= checksum_at {
        return;
    }
    frame[checksum_at] = (XxHash32::oneshot(0, &frame[4..checksum_at]) >> 8) as u8;
}

#[cfg(test)]
mod tests;
