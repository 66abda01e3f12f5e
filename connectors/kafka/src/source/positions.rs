//! What the source writes into a checkpoint's positions, and reads back.
//!
//! A checkpoint's positions are a map of names to numbers. Beside one entry
//! per partition — `<topic>-<partition>` → the next offset to read — the
//! source records facts the offsets only mean something with, under names
//! no split can have (topic names hold no `@`):
//!
//! | entry | value | what it says |
//! |---|---|---|
//! | `<topic>-<partition>@leader-epoch` | epoch | the leader epoch of the last record the position passed: a restore checks with the partition's leader that its log still holds it (KIP-320) |
//! | `<topic>@cluster:<id>` | 0 | the cluster the offsets were read from |
//! | `<topic>@topic-id:<id>` | 0 | the topic the offsets were read from (a topic recreated under the same name has another id) |
//! | `<topic>-<partition>@from-ms` | Unix ms | a `start` time not reached yet in that partition: records before it are passed over until one at or after it is read |
//!
//! Checkpoints written before an entry existed restore without it.

use std::collections::BTreeMap;

use exactly_core::SplitPositions;
use exactly_kafka_wire::TopicId;

use super::split_name;

/// Between a split and the epoch of its position.
const LEADER_EPOCH: &str = "@leader-epoch";
/// Between the topic and the cluster id.
const CLUSTER: &str = "@cluster:";
/// Between the topic and its id.
const TOPIC_ID: &str = "@topic-id:";
/// Between a split and the start time it waits for.
const FROM_MS: &str = "@from-ms";

/// A partition's position as the source keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    /// The next offset to read.
    pub(super) next: i64,
    /// The leader epoch of the last record before `next`, when known.
    pub(super) epoch: Option<i32>,
}

impl Position {
    /// A position without a known epoch.
    pub(super) fn at(next: i64) -> Position {
        Position { next, epoch: None }
    }
}

/// Writes the entries of `partition`'s `position` into `positions`.
pub(super) fn record_position(positions: &mut SplitPositions, topic: &str, partition: i32, position: Position) {
    let split = split_name(topic, partition);
    if let Some(epoch) = position.epoch {
        positions.set(format!("{split}{LEADER_EPOCH}"), i64::from(epoch));
    }
    positions.set(split, position.next);
}

/// Records the cluster the positions of `topic` were read from.
pub(super) fn record_cluster(positions: &mut SplitPositions, topic: &str, cluster: &str) {
    positions.set(format!("{topic}{CLUSTER}{cluster}"), 0);
}

/// Records the id of the topic the positions of `topic` were read from.
pub(super) fn record_topic_id(positions: &mut SplitPositions, topic: &str, id: TopicId) {
    positions.set(format!("{topic}{TOPIC_ID}{id}"), 0);
}

/// Records that `partition` waits for a record at or after `from_ms`.
pub(super) fn record_from(positions: &mut SplitPositions, topic: &str, partition: i32, from_ms: i64) {
    positions.set(format!("{}{FROM_MS}", split_name(topic, partition)), from_ms);
}

/// The partitions of `topic` that `positions` hold an offset for, with the
/// epoch recorded beside it.
pub(super) fn checkpointed_partitions(positions: &SplitPositions, topic: &str) -> BTreeMap<i32, Position> {
    positions
        .0
        .iter()
        .filter_map(|(split, offset)| {
            let partition: i32 = split.strip_prefix(topic)?.strip_prefix('-')?.parse().ok()?;
            let epoch = positions
                .get(&format!("{split}{LEADER_EPOCH}"))
                .and_then(|e| i32::try_from(e).ok());
            Some((partition, Position { next: *offset, epoch }))
        })
        .collect()
}

/// The start times the partitions of `topic` still wait for.
pub(super) fn waiting_for_start(positions: &SplitPositions, topic: &str) -> BTreeMap<i32, i64> {
    positions
        .0
        .iter()
        .filter_map(|(key, from)| {
            let partition = key.strip_prefix(topic)?.strip_prefix('-')?.strip_suffix(FROM_MS)?;
            Some((partition.parse().ok()?, *from))
        })
        .collect()
}

/// The clusters `positions` say the offsets of `topic` were read from.
pub(super) fn recorded_clusters<'a>(positions: &'a SplitPositions, topic: &str) -> std::collections::BTreeSet<&'a str> {
    positions
        .0
        .keys()
        .filter_map(|key| key.strip_prefix(topic)?.strip_prefix(CLUSTER))
        .collect()
}

/// The ids of the topic `positions` say the offsets of `topic` were read
/// from (one, unless entries of several runs were merged; unreadable ones
/// are left out).
pub(super) fn recorded_topic_ids(positions: &SplitPositions, topic: &str) -> std::collections::BTreeSet<TopicId> {
    positions
        .0
        .keys()
        .filter_map(|key| key.strip_prefix(topic)?.strip_prefix(TOPIC_ID)?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fact_reads_back_and_no_fact_reads_as_a_partition() {
        let mut positions = SplitPositions::default();
        record_position(
            &mut positions,
            "orders",
            0,
            Position {
                next: 40,
                epoch: Some(3),
            },
        );
        record_position(&mut positions, "orders", 1, Position::at(7));
        record_position(&mut positions, "orders-x", 0, Position::at(99));
        record_cluster(&mut positions, "orders", "C1");
        let id = TopicId([7; 16]);
        record_topic_id(&mut positions, "orders", id);
        record_from(&mut positions, "orders", 1, 1_700_000_000_000);
        assert_eq!(
            checkpointed_partitions(&positions, "orders"),
            BTreeMap::from([
                (
                    0,
                    Position {
                        next: 40,
                        epoch: Some(3)
                    }
                ),
                (1, Position::at(7))
            ]),
            "facts and another topic's splits are not partitions of `orders`"
        );
        assert_eq!(
            recorded_clusters(&positions, "orders").into_iter().collect::<Vec<_>>(),
            ["C1"]
        );
        assert_eq!(
            recorded_topic_ids(&positions, "orders").into_iter().collect::<Vec<_>>(),
            [id]
        );
        assert_eq!(
            waiting_for_start(&positions, "orders"),
            BTreeMap::from([(1, 1_700_000_000_000)])
        );
        assert!(recorded_topic_ids(&positions, "orders-x").is_empty());
    }

    #[test]
    fn positions_of_older_checkpoints_have_no_epoch() {
        let mut positions = SplitPositions::default();
        positions.set("orders-2", 5);
        assert_eq!(
            checkpointed_partitions(&positions, "orders"),
            BTreeMap::from([(2, Position::at(5))])
        );
    }
}
