//! The requests of [`ConsumerClient`](super::ConsumerClient) in each API
//! version it speaks, and their answers read into plain maps: pure
//! functions, tested without a broker.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, GroupId, ListOffsetsRequest, ListOffsetsResponse, OffsetCommitRequest, OffsetCommitResponse,
    OffsetFetchRequest, OffsetFetchResponse, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, TopicName,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use kafka_protocol::ResponseError;

use crate::connection::versions;
use crate::error::WireError;

/// ListOffsets versions spoken: v1 answers one offset per timestamp (Kafka
/// 4 removed v0), v2 added the isolation level, v4 leader epochs, v6 the
/// flexible encoding, v7 to v9 more special timestamps (not used here), v10
/// a `timeout_ms` for tiered storage. Topics are named in every version.
pub(super) const LIST_OFFSETS: VersionRange = versions(1, 10);
/// OffsetFetch versions spoken: v1 to v7 ask for one group with its topics
/// at the top level (Kafka 4 removed v0; v2 added a top-level error code, v6
/// the flexible encoding, v7 `require_stable`), v8 and v9 for a `groups`
/// array (v9 adds the KIP-848 member id and epoch). v10 names topics by id
/// only, so it is left out (Kafka 4.1 offers v1 to v9; kafka-protocol 0.18
/// encodes up to v9).
pub(super) const OFFSET_FETCH: VersionRange = versions(1, 9);
/// OffsetCommit versions spoken: v2 to v4 carry a retention time (Kafka 4
/// removed v0 and v1), v6 leader epochs, v7 the group instance id, v8 the
/// flexible encoding, v9 is the first for KIP-848 groups. v10 names topics
/// by id only, so it is left out (Kafka 4.1 offers v2 to v9;
/// kafka-protocol 0.18 encodes up to v9).
pub(super) const OFFSET_COMMIT: VersionRange = versions(2, 9);
/// OffsetForLeaderEpoch versions spoken: v2 added the current leader epoch
/// (fenced by the broker like a Fetch's), v3 the replica id (-1: a
/// consumer), v4 the flexible encoding.
pub(super) const OFFSET_FOR_LEADER_EPOCH: VersionRange = versions(3, 4);
/// First OffsetFetch version with the `groups` array.
const OFFSET_FETCH_GROUPS: i16 = 8;
/// First OffsetFetch version with `require_stable`.
const OFFSET_FETCH_REQUIRE_STABLE: i16 = 7;
/// ListOffsets timestamp asking for the log start offset.
pub(super) const EARLIEST_TIMESTAMP: i64 = -2;
/// ListOffsets timestamp asking for the end: the high watermark
/// (read_uncommitted) or the last stable offset (read_committed).
pub(super) const LATEST_TIMESTAMP: i64 = -1;
/// Generation id of a member of no group: a standalone ("simple")
/// consumer's commit.
const NO_GENERATION: i32 = -1;
/// Leader epoch "unknown": the broker checks none.
const NO_LEADER_EPOCH: i32 = -1;

/// The partitions of `topic` in the `topics` of an answer, as (index, error
/// code, `value` of the partition bound to `p`): the answers of the three
/// APIs share this shape in types of their own.
macro_rules! answered_partitions {
    ($topics:expr, $topic:expr, |$p:ident| $value:expr) => {
        $topics
            .into_iter()
            .filter(|t| t.name.0.as_str() == $topic)
            .flat_map(|t| t.partitions)
            .map(|$p| ($p.partition_index, $p.error_code, $value))
    };
}

fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

fn group_id(group: &str) -> GroupId {
    GroupId(StrBytes::from_string(group.to_string()))
}

/// ListOffsets for `partitions` of `topic` at `timestamp` (a time in
/// milliseconds, [`EARLIEST_TIMESTAMP`] or [`LATEST_TIMESTAMP`]), as a
/// consumer (replica id -1) with `isolation_level` (0 read_uncommitted, 1
/// read_committed). The same request encodes in every version of
/// [`LIST_OFFSETS`]; `timeout` is only sent from v10 on.
pub(super) fn list_offsets(
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
    isolation_level: i8,
    timeout: Duration,
) -> ListOffsetsRequest {
    let partitions = partitions
        .iter()
        .map(|&partition| {
            ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_current_leader_epoch(NO_LEADER_EPOCH)
                .with_timestamp(timestamp)
        })
        .collect();
    let topics = vec![ListOffsetsTopic::default()
        .with_name(topic_name(topic))
        .with_partitions(partitions)];
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // The default replica id, 0, would make this a follower of broker 0.
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(isolation_level)
        .with_timeout_ms(timeout_ms)
        .with_topics(topics)
}

/// The offsets of a ListOffsets answer for the `asked` partitions of
/// `topic`: `None` where the broker found none (-1: no record at or after
/// the timestamp).
pub(super) fn listed_offsets(
    addr: &str,
    topic: &str,
    asked: &BTreeSet<i32>,
    response: ListOffsetsResponse,
) -> Result<BTreeMap<i32, Option<i64>>, WireError> {
    let answered = answered_partitions!(response.topics, topic, |p| known_offset(p.offset));
    per_partition(addr, ApiKey::ListOffsets, "", topic, asked, answered)
}

/// OffsetForLeaderEpoch for `asks` of `topic`, as a consumer (replica id
/// -1).
pub(super) fn offset_for_leader_epoch(topic: &str, asks: &[EpochAsk]) -> OffsetForLeaderEpochRequest {
    let partitions = asks
        .iter()
        .map(|ask| {
            OffsetForLeaderPartition::default()
                .with_partition(ask.partition)
                .with_leader_epoch(ask.epoch)
                .with_current_leader_epoch(ask.current_leader_epoch)
        })
        .collect();
    OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(partitions)])
}

/// The answers of an OffsetForLeaderEpoch for the `asked` partitions of
/// `topic`: per partition the epoch end, or its error code (kept per
/// partition: FENCED_LEADER_EPOCH for one, a moved leader for another).
pub(super) fn epoch_ends(
    addr: &str,
    topic: &str,
    asked: &BTreeSet<i32>,
    response: OffsetForLeaderEpochResponse,
) -> Result<BTreeMap<i32, Result<EpochEnd, ResponseError>>, WireError> {
    let mut ends = BTreeMap::new();
    let answered = response
        .topics
        .into_iter()
        .filter(|t| t.topic.0.as_str() == topic)
        .flat_map(|t| t.partitions);
    for p in answered.filter(|p| asked.contains(&p.partition)) {
        let end = match ResponseError::try_from_code(p.error_code) {
            Some(error) => Err(error),
            None => Ok(EpochEnd {
                epoch: (p.leader_epoch >= 0).then_some(p.leader_epoch),
                end_offset: (p.end_offset >= 0).then_some(p.end_offset),
            }),
        };
        ends.insert(p.partition, end);
    }
    if let Some(missing) = asked.iter().find(|p| !ends.contains_key(p)) {
        return Err(WireError::Protocol {
            addr: addr.to_string(),
            message: format!("OffsetForLeaderEpoch answer does not mention {topic}/{missing}"),
        });
    }
    Ok(ends)
}

/// One partition of an OffsetForLeaderEpoch request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochAsk {
    /// The partition.
    pub partition: i32,
    /// The leader epoch whose end is asked: the epoch of the last record a
    /// position passed.
    pub epoch: i32,
    /// The partition's current leader epoch as the asker knows it (-1:
    /// unknown); a broker with another one refuses (FENCED_LEADER_EPOCH or
    /// UNKNOWN_LEADER_EPOCH) instead of answering from an old view.
    pub current_leader_epoch: i32,
}

/// Where a leader epoch ends in a partition's log, as its leader says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEnd {
    /// The largest epoch at or below the one asked that the leader knows
    /// (`None`: it knows none, e.g. one above its latest).
    pub epoch: Option<i32>,
    /// The first offset after that epoch: the log end offset for the
    /// current epoch, the start of the next epoch for an older one
    /// (`None` with `epoch`).
    pub end_offset: Option<i64>,
}

/// OffsetFetch of `partitions` of `topic` for `group` in `version`: one
/// group at the top level before v8, a `groups` array from v8 on. From v7
/// on `require_stable` is set, as librdkafka does for read_committed
/// consumers: a partition with a transactional offset commit still pending
/// answers UNSTABLE_OFFSET_COMMIT (retriable) instead of an older offset.
pub(super) fn offset_fetch(group: &str, topic: &str, partitions: &BTreeSet<i32>, version: i16) -> OffsetFetchRequest {
    let partitions: Vec<i32> = partitions.iter().copied().collect();
    let request = if version >= OFFSET_FETCH_GROUPS {
        let topics = OffsetFetchRequestTopics::default()
            .with_name(topic_name(topic))
            .with_partition_indexes(partitions);
        let group = OffsetFetchRequestGroup::default()
            .with_group_id(group_id(group))
            .with_topics(Some(vec![topics]));
        OffsetFetchRequest::default().with_groups(vec![group])
    } else {
        let topics = OffsetFetchRequestTopic::default()
            .with_name(topic_name(topic))
            .with_partition_indexes(partitions);
        OffsetFetchRequest::default()
            .with_group_id(group_id(group))
            .with_topics(Some(vec![topics]))
    };
    request.with_require_stable(version >= OFFSET_FETCH_REQUIRE_STABLE)
}

/// The committed offsets of an OffsetFetch answer (in `version`) for the
/// `asked` partitions of `topic`: `None` where `group` has none (-1). A
/// group-level error code (v2+: top level; v8+: per group) is an error
/// naming the group.
pub(super) fn fetched_offsets(
    addr: &str,
    group: &str,
    topic: &str,
    asked: &BTreeSet<i32>,
    version: i16,
    response: OffsetFetchResponse,
) -> Result<BTreeMap<i32, Option<i64>>, WireError> {
    let api = ApiKey::OffsetFetch;
    let scope = format!("group `{group}`");
    let answered: Vec<(i32, i16, Option<i64>)> = if version >= OFFSET_FETCH_GROUPS {
        let Some(answer) = response.groups.into_iter().find(|g| g.group_id.0.as_str() == group) else {
            return Err(WireError::Protocol {
                addr: addr.to_string(),
                message: format!("OffsetFetch answer does not mention {scope}"),
            });
        };
        WireError::check(addr, api, answer.error_code, Some(&scope))?;
        answered_partitions!(answer.topics, topic, |p| known_offset(p.committed_offset)).collect()
    } else {
        WireError::check(addr, api, response.error_code, Some(&scope))?;
        answered_partitions!(response.topics, topic, |p| known_offset(p.committed_offset)).collect()
    };
    per_partition(addr, api, &format!("{scope}, "), topic, asked, answered)
}

/// OffsetCommit of `offsets` (partition → offset of the next record to
/// read) of `topic` for `group`, as a standalone consumer: generation -1,
/// no member id, no group instance id, empty metadata, no leader epoch,
/// the broker's retention. The same request encodes in every version of
/// [`OFFSET_COMMIT`].
pub(super) fn offset_commit(group: &str, topic: &str, offsets: &BTreeMap<i32, i64>) -> OffsetCommitRequest {
    let partitions = offsets
        .iter()
        .map(|(&partition, &offset)| {
            OffsetCommitRequestPartition::default()
                .with_partition_index(partition)
                .with_committed_offset(offset)
                .with_committed_leader_epoch(NO_LEADER_EPOCH)
                .with_committed_metadata(Some(StrBytes::from_static_str("")))
        })
        .collect();
    OffsetCommitRequest::default()
        .with_group_id(group_id(group))
        .with_generation_id_or_member_epoch(NO_GENERATION)
        .with_member_id(StrBytes::from_static_str(""))
        .with_group_instance_id(None)
        .with_retention_time_ms(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(partitions)])
}

/// Checks an OffsetCommit answer: every partition of `asked` answered
/// without an error code.
pub(super) fn committed(
    addr: &str,
    group: &str,
    topic: &str,
    asked: &BTreeSet<i32>,
    response: OffsetCommitResponse,
) -> Result<(), WireError> {
    let answered = answered_partitions!(response.topics, topic, |p| ());
    per_partition(
        addr,
        ApiKey::OffsetCommit,
        &format!("group `{group}`, "),
        topic,
        asked,
        answered,
    )?;
    Ok(())
}

/// An offset as Kafka answers it: negative (-1) means none.
fn known_offset(offset: i64) -> Option<i64> {
    (offset >= 0).then_some(offset)
}

/// The values of the partitions of `topic` answered by `api`, for the
/// `asked` ones (others are ignored). A partition's error code is an error
/// whose message names `scope` (e.g. "group `g`, ", or nothing) and
/// `topic/partition`; a partition asked for but not answered is a protocol
/// error.
fn per_partition<T>(
    addr: &str,
    api: ApiKey,
    scope: &str,
    topic: &str,
    asked: &BTreeSet<i32>,
    answered: impl IntoIterator<Item = (i32, i16, T)>,
) -> Result<BTreeMap<i32, T>, WireError> {
    let mut values = BTreeMap::new();
    for (partition, code, value) in answered {
        if !asked.contains(&partition) {
            continue;
        }
        WireError::check(addr, api, code, Some(&format!("{scope}{topic}/{partition}")))?;
        values.insert(partition, value);
    }
    if let Some(missing) = asked.iter().find(|p| !values.contains_key(p)) {
        return Err(WireError::Protocol {
            addr: addr.to_string(),
            message: format!("{api:?} answer does not mention {scope}{topic}/{missing}"),
        });
    }
    Ok(values)
}
