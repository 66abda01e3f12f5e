//! Record batches and Kafka's read_committed contract, without I/O.
//!
//! [`decode_batches`] turns the raw `records` bytes of a Fetch answer into
//! [`DecodedBatch`]es; a [`CommittedFilter`] takes a partition's batches in
//! log order and keeps what a `read_committed` consumer would see:
//!
//! - records of non-transactional batches are visible at once;
//! - records of a transactional batch are held per producer id until that
//!   producer's next control marker on the partition: COMMIT releases them,
//!   ABORT discards them;
//! - records without a marker yet belong to an open transaction and are not
//!   visible;
//! - control batches themselves are never visible.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::batch::{control_marker, decode_records, take_batch, BatchHeader, FetchedRecord};

/// What a control record marks, from the `type` field of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlMarker {
    /// Type 0: the producer's open transaction on this partition is aborted.
    Abort,
    /// Type 1: the producer's open transaction on this partition is committed.
    Commit,
    /// Any other type (e.g. KRaft's leader-change records): no effect on
    /// transactions.
    Other(i16),
    /// A control batch without its record: compaction keeps a producer's
    /// last marker as an empty batch once the marker's delete horizon
    /// passed. No effect on transactions.
    Emptied,
}

impl ControlMarker {
    /// Reads the key of a control record: `version: i16, type: i16`.
    pub fn from_key(key: &[u8]) -> Option<ControlMarker> {
        let kind = i16::from_be_bytes(key.get(2..4)?.try_into().ok()?);
        Some(match kind {
            0 => ControlMarker::Abort,
            1 => ControlMarker::Commit,
            other => ControlMarker::Other(other),
        })
    }
}

/// A record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    /// The header's key.
    pub key: String,
    /// The header's value (`None` for a null value).
    pub value: Option<Vec<u8>>,
}

/// One record of a [`DecodedBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRecord {
    /// The record's offset.
    pub offset: i64,
    /// Its timestamp (creation or log-append time, as the topic says).
    pub timestamp: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
    /// Its headers, in order.
    pub headers: Vec<RecordHeader>,
}

/// One record batch of a partition, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedBatch {
    /// Offset of the batch's first record.
    pub base_offset: i64,
    /// Offset of its last record (greater than the last remaining record's
    /// after compaction).
    pub last_offset: i64,
    /// The producer id; -1 for a producer that is neither idempotent nor
    /// transactional.
    pub producer_id: i64,
    /// The producer epoch; -1 without a producer id.
    pub producer_epoch: i16,
    /// Whether the batch belongs to a transaction.
    pub transactional: bool,
    /// `Some` for a control batch, with the type of its control record.
    pub control: Option<ControlMarker>,
    /// The data records (empty for a control batch).
    pub records: Vec<BatchRecord>,
}

/// A record as a `read_committed` consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedRecord {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// Its timestamp.
    pub timestamp: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
    /// Its headers, in order.
    pub headers: Vec<RecordHeader>,
    /// The producer id of its batch (-1 for a plain producer).
    pub producer_id: i64,
}

/// A transaction with records but no control marker yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTransaction {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The producer id.
    pub producer_id: i64,
    /// The producer epoch of its latest batch.
    pub producer_epoch: i16,
    /// Offset of its first record on the partition.
    pub first_offset: i64,
    /// Number of records it holds back.
    pub records: usize,
}

/// A COMMIT or ABORT marker, with what it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedTransaction {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The producer id.
    pub producer_id: i64,
    /// The epoch of the marker: the producer's, or the bumped one when the
    /// coordinator aborted the transaction itself (fencing, timeout).
    pub marker_epoch: i16,
    /// Offset of the marker.
    pub marker_offset: i64,
    /// COMMIT (`true`) or ABORT.
    pub committed: bool,
    /// Offset of the transaction's first record on the partition; `None`
    /// when the marker ended no records here.
    pub first_offset: Option<i64>,
    /// Number of records it made visible or discarded.
    pub records: usize,
}

/// What a read_committed consumer sees of one partition
/// ([`CommittedFilter::finish`]) or of a whole topic
/// ([`WireClient::read_topic`](crate::WireClient::read_topic)), and what it
/// does not see. Everything is ordered by partition, then offset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommittedRead {
    /// The committed and non-transactional records.
    pub records: Vec<CommittedRecord>,
    /// Transactions without a COMMIT or ABORT marker yet.
    pub open_transactions: Vec<OpenTransaction>,
    /// Every COMMIT and ABORT marker: whether a given producer's transaction
    /// was committed is read here.
    pub ended_transactions: Vec<EndedTransaction>,
    /// How many records ABORT markers discarded.
    pub aborted_records: usize,
}

impl CommittedRead {
    /// Adds `other` (another partition's) and restores the order.
    pub fn merge(&mut self, other: CommittedRead) {
        self.records.extend(other.records);
        self.open_transactions.extend(other.open_transactions);
        self.ended_transactions.extend(other.ended_transactions);
        self.aborted_records += other.aborted_records;
        self.records.sort_by_key(|record| (record.partition, record.offset));
        self.open_transactions
            .sort_by_key(|open| (open.partition, open.first_offset));
        self.ended_transactions
            .sort_by_key(|ended| (ended.partition, ended.marker_offset));
    }
}

/// Applies Kafka's read_committed contract to the batches of one partition,
/// fed in log order (see the [module documentation](self)).
#[derive(Debug, Clone)]
pub struct CommittedFilter {
    topic: String,
    partition: i32,
    held: BTreeMap<i64, (OpenTransaction, Vec<CommittedRecord>)>,
    read: CommittedRead,
}

impl CommittedFilter {
    /// A filter for `topic`/`partition` that has seen nothing yet.
    pub fn new(topic: &str, partition: i32) -> CommittedFilter {
        CommittedFilter {
            topic: topic.to_string(),
            partition,
            held: BTreeMap::new(),
            read: CommittedRead::default(),
        }
    }

    /// Takes the partition's next batch.
    pub fn push(&mut self, batch: DecodedBatch) {
        if let Some(marker) = batch.control {
            self.mark(&batch, marker);
            return;
        }
        let records = batch.records.into_iter().map(|record| CommittedRecord {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: record.offset,
            timestamp: record.timestamp,
            key: record.key,
            value: record.value,
            headers: record.headers,
            producer_id: batch.producer_id,
        });
        if !batch.transactional {
            self.read.records.extend(records);
            return;
        }
        let records: Vec<_> = records.collect();
        let (open, held) = self.held.entry(batch.producer_id).or_insert_with(|| {
            let open = OpenTransaction {
                topic: self.topic.clone(),
                partition: self.partition,
                producer_id: batch.producer_id,
                producer_epoch: batch.producer_epoch,
                first_offset: batch.base_offset,
                records: 0,
            };
            (open, Vec::new())
        });
        open.producer_epoch = batch.producer_epoch;
        open.records += records.len();
        held.extend(records);
    }

    fn mark(&mut self, batch: &DecodedBatch, marker: ControlMarker) {
        let committed = match marker {
            ControlMarker::Commit => true,
            ControlMarker::Abort => false,
            ControlMarker::Other(_) | ControlMarker::Emptied => return,
        };
        let (first_offset, records) = match self.held.remove(&batch.producer_id) {
            Some((open, records)) => (Some(open.first_offset), records),
            None => (None, Vec::new()),
        };
        self.read.ended_transactions.push(EndedTransaction {
            topic: self.topic.clone(),
            partition: self.partition,
            producer_id: batch.producer_id,
            marker_epoch: batch.producer_epoch,
            marker_offset: batch.base_offset,
            committed,
            first_offset,
            records: records.len(),
        });
        if committed {
            self.read.records.extend(records);
        } else {
            self.read.aborted_records += records.len();
        }
    }

    /// The visible records in offset order, and the transactions still
    /// open.
    pub fn finish(self) -> CommittedRead {
        let open_transactions = self.held.into_values().map(|(open, _)| open).collect();
        let mut read = CommittedRead::default();
        read.merge(CommittedRead {
            open_transactions,
            ..self.read
        });
        read
    }
}

/// What a `read_committed` consumer sees of one partition whose batches are
/// `batches`, in log order: the committed and non-transactional records by
/// offset.
pub fn committed_records(
    topic: &str,
    partition: i32,
    batches: impl IntoIterator<Item = DecodedBatch>,
) -> Vec<CommittedRecord> {
    let mut filter = CommittedFilter::new(topic, partition);
    batches.into_iter().for_each(|batch| filter.push(batch));
    filter.finish().records
}

/// Decodes the complete record batches at the front of `raw` (the `records`
/// of a Fetch answer), consuming them; a trailing partial batch, which a
/// broker may send when it cuts an answer at its byte limit, is left in
/// `raw`. Batches are decompressed as needed (gzip, snappy, lz4, zstd).
///
/// An entry of the message formats before v2 (magic 0 or 1: segments
/// written before Kafka 0.11, still served as they lie on disk) becomes a
/// plain batch (no producer id, never transactional) of its records: one
/// for a plain message, every inner record of a compressed one (gzip,
/// snappy, lz4).
///
/// Fails on a corrupt batch, naming its offset.
pub fn decode_batches(raw: &mut Bytes) -> Result<Vec<DecodedBatch>, String> {
    let mut batches = Vec::new();
    while let Some(batch) = take_batch(raw)? {
        batches.push(decode_batch(batch)?);
    }
    Ok(batches)
}

/// Decodes one complete batch.
fn decode_batch(batch: Bytes) -> Result<DecodedBatch, String> {
    let header = BatchHeader::read(&batch)?;
    let (control, records) = if header.control {
        (Some(control_marker(&header, batch)?), Vec::new())
    } else {
        (None, decode_records(batch)?.into_iter().map(batch_record).collect())
    };
    // A v0/v1 entry's header knows its last offset only.
    let base_offset = match records.first() {
        Some(first) if header.magic < 2 => first.offset,
        _ => header.base_offset,
    };
    Ok(DecodedBatch {
        base_offset,
        last_offset: header.last_offset,
        producer_id: header.producer_id,
        producer_epoch: header.producer_epoch,
        transactional: header.transactional,
        control,
        records,
    })
}

fn batch_record(record: FetchedRecord) -> BatchRecord {
    BatchRecord {
        offset: record.offset,
        timestamp: record.timestamp,
        key: record.key.map(Vec::from),
        value: record.value.map(Vec::from),
        headers: record.headers,
    }
}

#[cfg(test)]
mod tests;
