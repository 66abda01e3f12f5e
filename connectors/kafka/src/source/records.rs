//! Fetched records as the pipeline's [`Record`]s.

use std::collections::BTreeMap;

use exactly_core::{Record, SplitName};
use exactly_kafka_wire::{FetchedChunk, FetchedRecord};

use super::split_name;

/// The split names of one topic's partitions, each built once and shared
/// by every record of its partition.
#[derive(Debug, Default)]
pub(super) struct SplitNames(BTreeMap<i32, SplitName>);

impl SplitNames {
    /// The split of `partition` of `topic` (one topic per cache).
    pub(super) fn of(&mut self, topic: &str, partition: i32) -> SplitName {
        self.0
            .entry(partition)
            .or_insert_with(|| split_name(topic, partition).into())
            .clone()
    }
}

/// A fetched chunk being handed out, a poll's worth at a time.
#[derive(Debug)]
pub(super) struct Draining {
    pub(super) partition: i32,
    pub(super) split: SplitName,
    /// Where the partition is read up to once every record is handed out.
    pub(super) next_offset: i64,
    /// The leader epoch of the last batch the chunk passed.
    pub(super) next_epoch: Option<i32>,
    records: std::vec::IntoIter<FetchedRecord>,
    /// Holds the chunk's place in the fetcher's queue until it is drained.
    _chunk: FetchedChunk,
}

impl Draining {
    pub(super) fn new(mut chunk: FetchedChunk, split: SplitName) -> Draining {
        let records = std::mem::take(&mut chunk.records).into_iter();
        Draining {
            partition: chunk.partition,
            split,
            next_offset: chunk.next_offset,
            next_epoch: chunk.next_epoch,
            records,
            _chunk: chunk,
        }
    }

    /// The next record, as a [`Record`] of this chunk's split (key and
    /// value are the fetched slices, no copy; a null value — a tombstone —
    /// and a null header value stay null), with the leader epoch of its
    /// batch (`None`: unknown).
    pub(super) fn next_record(&mut self) -> Option<(Record, Option<i32>)> {
        let fetched = self.records.next()?;
        let epoch = (fetched.leader_epoch >= 0).then_some(fetched.leader_epoch);
        let record = Record {
            split: self.split.clone(),
            offset: fetched.offset,
            key: fetched.key,
            value: fetched.value,
            timestamp_ms: (fetched.timestamp >= 0).then_some(fetched.timestamp),
            headers: fetched.headers.into_iter().map(|h| (h.key, h.value)).collect(),
        };
        Some((record, epoch))
    }
}
