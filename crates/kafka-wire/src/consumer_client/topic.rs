//! What a consumer asks about a topic: its partitions' leaders, and
//! which offset of a partition it wants.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::ApiKey;
use kafka_protocol::ResponseError;

use super::requests::{EARLIEST_TIMESTAMP, LATEST_TIMESTAMP};
use crate::cluster::ClusterMetadata;
use crate::error::WireError;
use crate::topic_id::TopicId;

/// What [`ConsumerClient::topic_metadata`] reports of one topic.
///
/// [`ConsumerClient::topic_metadata`]: super::ConsumerClient::topic_metadata
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    /// The cluster id, as every client of the cluster sees it (`None` from
    /// a broker that reports none).
    pub cluster_id: Option<String>,
    /// Every partition of the topic with the node id of its leader; `None`
    /// while the partition has no usable leader (its metadata carries an
    /// error such as LEADER_NOT_AVAILABLE, or no leader id). A partition
    /// whose only error is REPLICA_NOT_AVAILABLE keeps its leader: a
    /// follower is down, the leader serves.
    pub leaders: BTreeMap<i32, Option<i32>>,
    /// `HOST:PORT` of every broker of the cluster, by node id (as the
    /// brokers advertise themselves).
    pub brokers: BTreeMap<i32, String>,
    /// The leader epoch of every partition (-1 where the broker names none):
    /// it grows with every change of leader, so a client that fetches
    /// with it is refused by a broker that led the partition before
    /// (FENCED_LEADER_EPOCH) instead of being served by a follower.
    pub leader_epochs: BTreeMap<i32, i32>,
    /// The topic's id (`None` from a broker that names none): a topic
    /// deleted and created again under the same name has another one.
    pub topic_id: Option<TopicId>,
}

impl TopicMetadata {
    /// `HOST:PORT` of the leader of `partition`: `None` for a partition the
    /// topic does not have, one without a leader, or a leader that is not
    /// among [`brokers`](Self::brokers).
    pub fn leader_address(&self, partition: i32) -> Option<&str> {
        let leader = self.leaders.get(&partition).copied().flatten()?;
        self.brokers.get(&leader).map(String::as_str)
    }

    /// The leader of `partition` with its address and epoch: `None` as for
    /// [`leader_address`](Self::leader_address).
    pub fn leader(&self, partition: i32) -> Option<Leader> {
        let node = self.leaders.get(&partition).copied().flatten()?;
        Some(Leader {
            node,
            address: self.brokers.get(&node)?.clone(),
            epoch: self.leader_epochs.get(&partition).copied().unwrap_or(-1),
        })
    }

    /// The topic's part of `cluster` (Metadata asked for one topic).
    pub(super) fn from_cluster(cluster: ClusterMetadata) -> TopicMetadata {
        let leaders = cluster
            .leaders
            .keys()
            .map(|&partition| (partition, usable_leader(&cluster, partition)))
            .collect();
        TopicMetadata {
            cluster_id: cluster.cluster_id,
            leaders,
            brokers: cluster.brokers,
            leader_epochs: cluster.leader_epochs,
            topic_id: cluster.topic_id,
        }
    }
}

/// A partition's leader as the metadata names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// Its node id.
    pub node: i32,
    /// `HOST:PORT`, as it advertises itself.
    pub address: String,
    /// The partition's leader epoch (-1: unknown).
    pub epoch: i32,
}

/// The leader of `partition` in `cluster` if it can serve: a leader id, and
/// no error in the partition's metadata but REPLICA_NOT_AVAILABLE.
fn usable_leader(cluster: &ClusterMetadata, partition: i32) -> Option<i32> {
    let leader = *cluster.leaders.get(&partition)?;
    let error = cluster.partition_errors.get(&partition);
    let usable = matches!(error, None | Some(ResponseError::ReplicaNotAvailable));
    (usable && leader >= 0).then_some(leader)
}

/// Which offset of a partition [`ConsumerClient::list_offsets`] asks for.
///
/// [`ConsumerClient::list_offsets`]: super::ConsumerClient::list_offsets
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The log start offset: the first offset still in the log.
    Earliest,
    /// The high watermark: the offset the next record produced will get
    /// (transactions still open included, as read_uncommitted sees it).
    Latest,
    /// The last stable offset: the end a read_committed consumer can read
    /// up to now (below the first record of a transaction still open; the
    /// high watermark when none is).
    LastStable,
    /// The offset of the first record whose timestamp is at or after this
    /// time (milliseconds since the Unix epoch, `>= 0`), below the last
    /// stable offset (asked read_committed).
    Timestamp(i64),
}

impl OffsetSpec {
    /// The ListOffsets isolation level of this spec: read_committed (1) for
    /// [`LastStable`](OffsetSpec::LastStable) and times (as a read_committed
    /// consumer asks: never an offset inside a transaction still open),
    /// read_uncommitted (0) for the log's ends.
    pub(super) fn isolation_level(self) -> i8 {
        i8::from(matches!(self, OffsetSpec::LastStable | OffsetSpec::Timestamp(_)))
    }

    /// The ListOffsets `timestamp` of this spec. A negative time is refused:
    /// Kafka reads -1, -2, ... as special positions, not as times.
    pub(super) fn wire_timestamp(self) -> Result<i64, WireError> {
        match self {
            OffsetSpec::Earliest => Ok(EARLIEST_TIMESTAMP),
            OffsetSpec::Latest | OffsetSpec::LastStable => Ok(LATEST_TIMESTAMP),
            OffsetSpec::Timestamp(ms) if ms >= 0 => Ok(ms),
            OffsetSpec::Timestamp(ms) => Err(WireError::InvalidConfig {
                key: "OffsetSpec::Timestamp".into(),
                message: format!(
                    "{ms} is not a time (milliseconds since the Unix epoch, >= 0); use OffsetSpec::Earliest or \
                     OffsetSpec::Latest for the ends of a partition"
                ),
            }),
        }
    }
}

/// The asked partitions of `topic` grouped by the address of their leader.
/// A partition the topic does not have, or one without a leader, is a
/// (retriable) `WireError::Broker` of Metadata, as answered by `addr`.
pub(super) fn partitions_by_leader(
    addr: &str,
    topic: &str,
    asked: &BTreeSet<i32>,
    cluster: &ClusterMetadata,
) -> Result<BTreeMap<String, Vec<i32>>, WireError> {
    let metadata_error = |error, message: String| WireError::Broker {
        addr: addr.to_string(),
        api: ApiKey::Metadata,
        error,
        message: Some(message),
    };
    let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for &partition in asked {
        let Some(&leader) = cluster.leaders.get(&partition) else {
            let message = format!(
                "{topic}/{partition}: the topic has {} partitions",
                cluster.leaders.len()
            );
            return Err(metadata_error(ResponseError::UnknownTopicOrPartition, message));
        };
        let Some(address) = usable_leader(cluster, partition).and_then(|leader| cluster.broker(leader)) else {
            let error = cluster.partition_errors.get(&partition).copied();
            let message = format!("{topic}/{partition} has no leader (leader id {leader})");
            return Err(metadata_error(
                error.unwrap_or(ResponseError::LeaderNotAvailable),
                message,
            ));
        };
        by_leader.entry(address.to_string()).or_default().push(partition);
    }
    Ok(by_leader)
}
