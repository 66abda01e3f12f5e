//! The Kafka source's counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use exactly_kafka_wire::FetchCounters;

/// Counters of a Kafka source, shared by all its subtasks (and by every run of
/// the pipeline that uses the same factory). Read through
/// [`KafkaSourceFactory::metrics`](super::KafkaSourceFactory::metrics).
#[derive(Debug, Default)]
pub(crate) struct KafkaSourceMetrics {
    /// What the subtasks' fetchers rode out.
    pub(super) fetch: Arc<FetchCounters>,
    /// What the rest rode out: metadata, offsets, discovery.
    control_errors: AtomicU64,
    group_commits: AtomicU64,
    group_commit_failures: AtomicU64,
    partitions_discovered: AtomicU64,
}

/// A point-in-time copy of a Kafka source's counters, from
/// [`KafkaSourceFactory::metrics`](super::KafkaSourceFactory::metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaSourceMetricsSnapshot {
    /// Errors the source rode out (broker down, connection refused,
    /// timeouts, a partition whose leader moved...): retried with backoff,
    /// each logged with `tracing` (a warning when a run of failures starts).
    pub transient_errors: u64,
    /// Successful commits of checkpointed offsets to the consumer group.
    pub group_commits: u64,
    /// Failed commits to the consumer group (best effort: only logged).
    pub group_commit_failures: u64,
    /// Partitions picked up by partition discovery after the start.
    pub partitions_discovered: u64,
    /// Partitions moved on because retention had deleted records before
    /// they were read (`auto.offset.reset`); each was logged with the
    /// offsets skipped. Above 0, records were lost to retention.
    pub positions_reset: u64,
    /// Partitions whose log was found truncated below the position read
    /// and read on from the divergence (`on_log_truncation = "resume"`).
    pub truncations: u64,
    /// Offsets read before such truncations that no longer exist in the
    /// log (from each divergence to the position read then).
    pub truncated_offsets: u64,
    /// Times a partition's leader (or leader epoch) changed under a fetcher.
    pub leader_changes: u64,
    /// The topics read that are missing from the metadata now (deleted):
    /// the source waits for them up to `missing_topic_timeout`, and the
    /// pipeline is not ready meanwhile.
    pub missing_topics: std::collections::BTreeSet<String>,
    /// Fetch answers received, by the node id of the broker that sent them.
    pub fetches_by_node: std::collections::BTreeMap<i32, u64>,
    /// The node id of the broker each partition (topic, partition) is
    /// fetched from now (its leader, or a replica it named).
    pub fetching_from: std::collections::BTreeMap<(String, i32), i32>,
}

impl KafkaSourceMetrics {
    /// Reads every counter.
    pub(crate) fn snapshot(&self) -> KafkaSourceMetricsSnapshot {
        KafkaSourceMetricsSnapshot {
            transient_errors: self.fetch.transient_errors() + self.control_errors.load(Ordering::Relaxed),
            group_commits: self.group_commits.load(Ordering::Relaxed),
            group_commit_failures: self.group_commit_failures.load(Ordering::Relaxed),
            partitions_discovered: self.partitions_discovered.load(Ordering::Relaxed),
            positions_reset: self.fetch.positions_reset(),
            truncations: self.fetch.truncations(),
            truncated_offsets: self.fetch.truncated_offsets(),
            leader_changes: self.fetch.leader_changes(),
            missing_topics: self.fetch.missing_topics(),
            fetches_by_node: self.fetch.fetches_by_node(),
            fetching_from: self.fetch.fetching_from(),
        }
    }

    pub(super) fn add_discovered(&self, n: u64) {
        self.partitions_discovered.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn control_error(&self) {
        self.control_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn committed(&self, ok: bool) {
        let counter = if ok {
            &self.group_commits
        } else {
            &self.group_commit_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
