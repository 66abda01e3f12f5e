//! The Kafka sink's counters.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a Kafka sink, shared by all its subtasks (and by every run of
/// the pipeline that uses the same factory). Read through
/// [`KafkaSinkFactory::metrics`](super::KafkaSinkFactory::metrics).
#[derive(Debug, Default)]
pub(crate) struct KafkaSinkMetrics {
    pub(super) committed: AtomicU64,
    pub(super) committed_by_end_txn: AtomicU64,
    pub(super) lost_transactions: AtomicU64,
    pub(super) producers_initialized: AtomicU64,
    pub(super) timeout_warnings: AtomicU64,
    pub(super) epoch_bumps: AtomicU64,
}

/// A point-in-time copy of a Kafka sink's counters, from
/// [`KafkaSinkFactory::metrics`](super::KafkaSinkFactory::metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KafkaSinkMetricsSnapshot {
    /// Transactions committed by the producer that wrote them.
    pub committed: u64,
    /// Transactions committed with EndTxn: by `recover` after a restart, or
    /// when the producer that wrote them was gone.
    pub committed_by_end_txn: u64,
    /// Pre-committed transactions the broker refused to commit, counted with
    /// `on_lost_transaction = "warn"` (with `"fail"` the pipeline stops).
    pub lost_transactions: u64,
    /// InitProducerId calls (each fences earlier producers of the id and
    /// aborts what they left open): at `recover`, and when a slot whose
    /// transaction was finished with EndTxn is used again.
    pub producers_initialized: u64,
    /// Pre-committed transactions that used `timeout_warning_share` of
    /// `transaction_timeout` before they were committed.
    pub timeout_warnings: u64,
    /// Producer epochs bumped by librdkafka when it aborted a transaction
    /// after an abortable error (KIP-360), followed: the producer's next
    /// transactions are recorded with the new epoch.
    pub epoch_bumps: u64,
}

impl KafkaSinkMetrics {
    /// The counters now.
    pub(super) fn snapshot(&self) -> KafkaSinkMetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        KafkaSinkMetricsSnapshot {
            committed: get(&self.committed),
            committed_by_end_txn: get(&self.committed_by_end_txn),
            lost_transactions: get(&self.lost_transactions),
            producers_initialized: get(&self.producers_initialized),
            timeout_warnings: get(&self.timeout_warnings),
            epoch_bumps: get(&self.epoch_bumps),
        }
    }
}

/// Adds `n` to `counter`.
pub(super) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
