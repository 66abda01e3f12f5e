//! [`ConsumerClient`]: the calls a consumer makes beside Fetch, on
//! connections kept between calls.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use kafka_protocol::protocol::{Request, VersionRange};
use kafka_protocol::ResponseError;
use tracing::debug;

use crate::backoff::Backoff;
use crate::cluster::{
    coordinator, not_ready_backoff, partition_metadata, retries_not_ready, topic_names, ClusterMetadata,
    CoordinatorKind,
};
use crate::config::WireConfig;
use crate::connection::api_key;
use crate::error::WireError;

mod connections;
mod requests;
#[cfg(test)]
mod tests;
mod topic;

use connections::Connections;
pub use requests::{EpochAsk, EpochEnd};
use requests::{LIST_OFFSETS, OFFSET_COMMIT, OFFSET_FETCH, OFFSET_FOR_LEADER_EPOCH};
use topic::partitions_by_leader;
pub use topic::{Leader, OffsetSpec, TopicMetadata};

/// The calls a consumer makes beside Fetch: topic metadata, offsets by
/// position or time, and a consumer group's committed offsets.
///
/// Keeps its connections between calls: one per broker address (the
/// partition leaders, the groups' coordinators, the bootstrap server that
/// answered first), and the coordinator of each group asked about. A call
/// whose connection fails (I/O error, timeout, closed by the broker)
/// returns that error, which is retriable ([`WireError::is_retriable`]),
/// and drops the connection: the next call opens a new one. Calls are not
/// retried otherwise, except while a group coordinator is not ready (see
/// [`committed_offsets`](Self::committed_offsets)).
///
/// Needs `&mut self` per call: one call at a time per client.
#[derive(Debug)]
pub struct ConsumerClient {
    config: WireConfig,
    /// Kept connections, one per broker address.
    connections: Connections,
    /// The coordinator's address by group, until a call at it fails.
    coordinators: BTreeMap<String, String>,
}

impl ConsumerClient {
    /// A client for the cluster of `config` (its bootstrap servers,
    /// security, timeouts and [`WireConfig::coordinator_wait`]). Connects
    /// on the first call.
    pub fn new(config: WireConfig) -> ConsumerClient {
        ConsumerClient {
            config,
            connections: Connections::default(),
            coordinators: BTreeMap::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &WireConfig {
        &self.config
    }

    /// Metadata of `topic`, which is never auto-created: its partitions
    /// with their leaders, the brokers and the cluster id.
    ///
    /// An unknown topic is `Err(WireError::Broker { error:
    /// UnknownTopicOrPartition, .. })` (retriable: it may be being
    /// created). A partition whose metadata carries an error
    /// (LEADER_NOT_AVAILABLE, ...) is listed with leader `None`, not an
    /// error. Asked on any open connection, else on the first bootstrap
    /// server that answers (TLS, SASL and credential errors are returned at
    /// once, without trying the other servers).
    pub async fn topic_metadata(&mut self, topic: &str) -> Result<TopicMetadata, WireError> {
        let (_, cluster) = self.cluster_metadata(topic).await?;
        let metadata = TopicMetadata::from_cluster(cluster);
        debug!(topic, partitions = metadata.leaders.len(), leaders = ?metadata.leaders, "topic metadata");
        Ok(metadata)
    }

    /// The names of every topic of the cluster, internal ones
    /// (`__consumer_offsets`, ...) included; asked on any open connection,
    /// else on a bootstrap server.
    pub async fn topic_names(&mut self) -> Result<BTreeSet<String>, WireError> {
        let address = self.connections.any(&self.config).await?;
        let connection = self.connections.to(&address, &self.config).await?;
        let result = topic_names(connection).await;
        self.connections.settle(&address, result)
    }

    /// Like [`topic_metadata`](Self::topic_metadata), asked of the broker
    /// at `address` when it is given (the one the caller trusts to answer
    /// soon: not a broker whose requests hang), on a kept or a new
    /// connection; any broker otherwise.
    pub async fn topic_metadata_at(&mut self, address: Option<&str>, topic: &str) -> Result<TopicMetadata, WireError> {
        let Some(address) = address else {
            return self.topic_metadata(topic).await;
        };
        let result = match self.connections.to(address, &self.config).await {
            Ok(connection) => partition_metadata(connection, Some(topic)).await,
            Err(error) => Err(error),
        };
        let cluster = self.connections.settle(address, result)?;
        Ok(TopicMetadata::from_cluster(cluster))
    }

    /// Where each of `asks` (a partition, the epoch of its position, its
    /// current leader epoch) ends, asked of the partitions' leader at
    /// `leader` with OffsetForLeaderEpoch. Per partition: the end, or the
    /// partition's error code (FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH,
    /// NOT_LEADER_OR_FOLLOWER, ...: the caller reads the metadata again and
    /// asks the new leader). An error of the exchange itself is `Err`. An
    /// empty `asks` sends nothing.
    pub async fn epoch_ends_at(
        &mut self,
        leader: &str,
        topic: &str,
        asks: &[EpochAsk],
    ) -> Result<BTreeMap<i32, Result<EpochEnd, ResponseError>>, WireError> {
        if asks.is_empty() {
            return Ok(BTreeMap::new());
        }
        let asked: BTreeSet<i32> = asks.iter().map(|a| a.partition).collect();
        let request = |_| requests::offset_for_leader_epoch(topic, asks);
        let (_, response) = self
            .connections
            .request(leader, &self.config, OFFSET_FOR_LEADER_EPOCH, request)
            .await?;
        let ends = requests::epoch_ends(leader, topic, &asked, response)?;
        debug!(topic, leader, ?ends, "OffsetForLeaderEpoch");
        Ok(ends)
    }

    /// The offset at `spec` of each of `partitions` of `topic` (duplicates
    /// are asked once): Metadata, then one ListOffsets per leader for its
    /// partitions (read_committed for `LastStable` and times, read_uncommitted for the log's ends).
    ///
    /// [`Earliest`](OffsetSpec::Earliest) is the log start offset,
    /// [`Latest`](OffsetSpec::Latest) the high watermark,
    /// [`LastStable`](OffsetSpec::LastStable) the last stable offset,
    /// [`Timestamp`](OffsetSpec::Timestamp) the offset of the first record
    /// whose timestamp is at or after the time, `None` when there is none.
    /// The ends (every spec but a time) are always `Some`.
    ///
    /// Errors: a partition the topic does not have is
    /// UNKNOWN_TOPIC_OR_PARTITION, one without a leader its metadata error
    /// (LEADER_NOT_AVAILABLE, ...), and a partition's error code in the
    /// answer (NOT_LEADER_OR_FOLLOWER after a leader moved,
    /// OFFSET_NOT_AVAILABLE, ...) is `WireError::Broker` naming
    /// `topic/partition`; these are retriable. A negative time is
    /// [`WireError::InvalidConfig`]. An empty `partitions` sends nothing.
    pub async fn list_offsets(
        &mut self,
        topic: &str,
        partitions: &[i32],
        spec: OffsetSpec,
    ) -> Result<BTreeMap<i32, Option<i64>>, WireError> {
        let timestamp = spec.wire_timestamp()?;
        let asked: BTreeSet<i32> = partitions.iter().copied().collect();
        if asked.is_empty() {
            return Ok(BTreeMap::new());
        }
        let (answered_by, cluster) = self.cluster_metadata(topic).await?;
        let by_leader = partitions_by_leader(&answered_by, topic, &asked, &cluster)?;
        let timeout = self.config.options.request_timeout;
        let mut offsets = BTreeMap::new();
        for (address, partitions) in by_leader {
            let isolation = spec.isolation_level();
            let request = |_| requests::list_offsets(topic, &partitions, timestamp, isolation, timeout);
            let (_, response) = self
                .connections
                .request(&address, &self.config, LIST_OFFSETS, request)
                .await?;
            let leader_asked = partitions.iter().copied().collect();
            offsets.extend(requests::listed_offsets(&address, topic, &leader_asked, response)?);
        }
        debug!(topic, ?spec, ?offsets, "ListOffsets");
        Ok(offsets)
    }

    /// The offsets `group` has committed for `partitions` of `topic`
    /// (duplicates are asked once), `None` where it has none (a group that
    /// never committed, or does not exist, has none anywhere): OffsetFetch
    /// at the group's coordinator (FindCoordinator key type 0).
    ///
    /// While the coordinator is not ready — COORDINATOR_NOT_AVAILABLE,
    /// COORDINATOR_LOAD_IN_PROGRESS or NOT_COORDINATOR, from FindCoordinator
    /// or OffsetFetch; a fresh cluster creates `__consumer_offsets` on the
    /// first group request, so the first call may take a few seconds — it
    /// is found and asked again with backoff for up to
    /// [`WireConfig::coordinator_wait`], after which that error is returned
    /// (retriable). A partition with a transactional offset commit still
    /// pending answers UNSTABLE_OFFSET_COMMIT (retriable), as for a
    /// read_committed consumer; other error codes are `WireError::Broker`
    /// naming the group (and `topic/partition`). An empty `partitions`
    /// sends nothing.
    pub async fn committed_offsets(
        &mut self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, Option<i64>>, WireError> {
        let asked: BTreeSet<i32> = partitions.iter().copied().collect();
        if asked.is_empty() {
            return Ok(BTreeMap::new());
        }
        let offsets = self
            .at_coordinator(
                group,
                OFFSET_FETCH,
                |version| requests::offset_fetch(group, topic, &asked, version),
                |addr, version, response| requests::fetched_offsets(addr, group, topic, &asked, version, response),
            )
            .await?;
        debug!(group, topic, ?offsets, "OffsetFetch");
        Ok(offsets)
    }

    /// Commits `offsets` (partition → offset of the next record to read,
    /// as Kafka consumers commit) of `topic` for `group` as a standalone
    /// ("simple") consumer: OffsetCommit with generation id -1, an empty
    /// member id and no group membership, at the group's coordinator. These
    /// are the offsets lag tools read (`kafka-consumer-groups.sh
    /// --describe`, librdkafka's `committed()`); each commit replaces the
    /// group's earlier offsets of those partitions, higher or lower.
    ///
    /// A group with active members (one that uses group management) refuses
    /// the commit (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, ...: not
    /// retriable). A coordinator that is not ready is waited for as in
    /// [`committed_offsets`](Self::committed_offsets); committing the same
    /// offsets again is harmless, so the caller may retry any retriable
    /// error. An empty `offsets` sends nothing.
    pub async fn commit_offsets(
        &mut self,
        group: &str,
        topic: &str,
        offsets: &BTreeMap<i32, i64>,
    ) -> Result<(), WireError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let asked: BTreeSet<i32> = offsets.keys().copied().collect();
        self.at_coordinator(
            group,
            OFFSET_COMMIT,
            |_| requests::offset_commit(group, topic, offsets),
            |addr, _, response| requests::committed(addr, group, topic, &asked, response),
        )
        .await?;
        debug!(group, topic, ?offsets, "OffsetCommit");
        Ok(())
    }

    /// Metadata of the cluster and `topic`, partition errors kept, with
    /// the address of the broker that answered.
    async fn cluster_metadata(&mut self, topic: &str) -> Result<(String, ClusterMetadata), WireError> {
        let address = self.connections.any(&self.config).await?;
        let connection = self.connections.to(&address, &self.config).await?;
        let result = partition_metadata(connection, Some(topic)).await;
        let cluster = self.connections.settle(&address, result)?;
        Ok((address, cluster))
    }

    /// One request to the coordinator of `group`, built by `request` for
    /// the version chosen within `client` and read by `answer` (address,
    /// version, response). While FindCoordinator or the answer say the
    /// coordinator is not ready, finds it and asks again with backoff, for
    /// up to [`WireConfig::coordinator_wait`].
    async fn at_coordinator<R, T>(
        &mut self,
        group: &str,
        client: VersionRange,
        request: impl Fn(i16) -> R,
        answer: impl Fn(&str, i16, R::Response) -> Result<T, WireError>,
    ) -> Result<T, WireError>
    where
        R: Request + Debug,
    {
        let mut backoff = not_ready_backoff(self.config.coordinator_wait);
        loop {
            let result = match self.group_coordinator(group, &backoff).await {
                Ok(address) => {
                    let answered = self.connections.request(&address, &self.config, client, &request).await;
                    answered.and_then(|(version, response)| answer(&address, version, response))
                }
                Err(error) => Err(error),
            };
            let Err(error) = result else {
                return result;
            };
            // The coordinator may have moved, or its broker gone away.
            self.coordinators.remove(group);
            if !retries_not_ready(&backoff, &error) {
                return Err(error);
            }
            debug!(
                group,
                api = ?api_key::<R>(),
                %error,
                attempts = backoff.attempts(),
                backoff = ?backoff.next_pause(),
                "group coordinator not ready; finding it again"
            );
            backoff.pause().await;
        }
    }

    /// The address of the coordinator of `group`: cached, else found with
    /// FindCoordinator (asked again while not ready, until `backoff`'s
    /// deadline).
    async fn group_coordinator(&mut self, group: &str, backoff: &Backoff) -> Result<String, WireError> {
        if let Some(address) = self.coordinators.get(group) {
            return Ok(address.clone());
        }
        let bootstrap = self.connections.any(&self.config).await?;
        let connection = self.connections.to(&bootstrap, &self.config).await?;
        let result = coordinator(connection, CoordinatorKind::Group, group, backoff.remaining()).await;
        let address = self.connections.settle(&bootstrap, result)?;
        debug!(group, coordinator = %address, "group coordinator");
        self.coordinators.insert(group.to_string(), address.clone());
        Ok(address)
    }
}
