//! The unit of data that flows through a pipeline, and the small value types the
//! runtime passes around (checkpoint ids, per-split source positions).

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::split_name::SplitName;

/// Identifier of a checkpoint. Ids never repeat within a region, even across
/// crashes: after a recovery from checkpoint `N` the next checkpoint is above
/// `N` and above every id an earlier run reserved (the store reserves ids
/// ahead), so usually not `N + 1`. With the pipeline and the sink subtask it
/// names a transaction uniquely (see `docs/connectors.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CheckpointId(pub u64);

impl CheckpointId {
    /// The id that follows this one.
    pub fn next(self) -> CheckpointId {
        CheckpointId(self.0 + 1)
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One record. `split` and `offset` identify it deterministically in its source
/// (a Kafka topic-partition and offset, a file and line, ...): replays produce the
/// same pair, which is what idempotent sinks and position fences key on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The source split the record was read from (e.g. `orders-3`), shared
    /// by the records of the split.
    pub split: SplitName,
    /// Position of the record inside its split. The next record to read after this
    /// one is at `offset + 1`.
    pub offset: i64,
    /// Optional key. [`Bytes`] so that a source can hand out slices of one
    /// buffer instead of an allocation per record; serialized as bytes,
    /// which JSON writes as a list of numbers, as it wrote the `Vec<u8>` of
    /// earlier releases.
    pub key: Option<Bytes>,
    /// Raw value bytes (see `key`). `None` is a **null** value — a Kafka
    /// tombstone, a deleted row — which is not the same as an empty value
    /// (`Some` of no bytes): every sink keeps the difference (the Kafka sink
    /// writes a tombstone, the PostgreSQL sink SQL `NULL`, the file sink
    /// `null` in JSON lines), or sends the record to its dead letters saying
    /// why it cannot.
    pub value: Option<Bytes>,
    /// Event or ingestion time in Unix milliseconds, when the source knows it.
    pub timestamp_ms: Option<i64>,
    /// Header name/value pairs, in source order, repeated names kept. A
    /// `None` value is a null header value, distinct from an empty one.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    /// A record with only split, offset and value set.
    pub fn new(split: impl Into<SplitName>, offset: i64, value: impl Into<Bytes>) -> Self {
        Record {
            split: split.into(),
            offset,
            key: None,
            value: Some(value.into()),
            timestamp_ms: None,
            headers: Vec::new(),
        }
    }

    /// A record with a null value (a tombstone) at `offset` of `split`.
    pub fn tombstone(split: impl Into<SplitName>, offset: i64) -> Self {
        Record {
            split: split.into(),
            offset,
            key: None,
            value: None,
            timestamp_ms: None,
            headers: Vec::new(),
        }
    }

    /// The value's bytes, or `None` for a null value. Shorthand for
    /// `record.value.as_deref()`.
    pub fn value_bytes(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }

    /// Whether the value is null (a tombstone).
    pub fn is_tombstone(&self) -> bool {
        self.value.is_none()
    }

    /// For sources that name splits `<topic>-<partition>` (the Kafka source does):
    /// the topic and the partition.
    pub fn topic_partition(&self) -> Option<(&str, i32)> {
        let (topic, partition) = self.split.rsplit_once('-')?;
        Some((topic, partition.parse().ok()?))
    }

    /// Sets the key.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// Where a source stands: for every split, the offset of the **next** record to
/// read. Serializable; stored in every checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SplitPositions(pub BTreeMap<String, i64>);

impl SplitPositions {
    /// Next offset to read for `split`, if the split has a recorded position.
    pub fn get(&self, split: &str) -> Option<i64> {
        self.0.get(split).copied()
    }

    /// Records that everything before `next_offset` in `split` has been read.
    pub fn set(&mut self, split: impl Into<String>, next_offset: i64) {
        self.0.insert(split.into(), next_offset);
    }

    /// Adds every split of `other` (its value wins where both have one).
    pub fn merge(&mut self, other: &SplitPositions) {
        for (k, v) in &other.0 {
            self.0.insert(k.clone(), *v);
        }
    }

    /// True when no split has a position.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_serialize_as_lists_of_numbers_like_before() {
        let record = Record::new("orders-0", 3, "ab").with_key(b"k".to_vec());
        let json = serde_json::to_string(&record).unwrap();
        assert!(json.contains(r#""key":[107]"#), "{json}");
        assert!(json.contains(r#""value":[97,98]"#), "{json}");
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), record);
        let keyless = Record::new("orders-0", 4, "");
        let json = serde_json::to_string(&keyless).unwrap();
        assert!(
            json.contains(r#""key":null"#) && json.contains(r#""value":[]"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), keyless);
    }

    #[test]
    fn a_null_value_is_not_an_empty_one_and_survives_serialization() {
        let empty = Record::new("orders-0", 5, "");
        let null = Record::tombstone("orders-0", 5);
        assert_ne!(empty, null);
        assert!(null.is_tombstone() && !empty.is_tombstone());
        let json = serde_json::to_string(&null).unwrap();
        assert!(json.contains(r#""value":null"#), "{json}");
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), null);
        let mut headers = Record::new("orders-0", 6, "v");
        headers.headers = vec![("a".into(), None), ("a".into(), Some(Vec::new()))];
        let json = serde_json::to_string(&headers).unwrap();
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), headers);
    }
}
