//! Counters of a running pipeline, readable at any time through
//! [`crate::Pipeline::metrics`].

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters. All are monotonic except the `last_*` gauges.
#[derive(Debug, Default)]
pub struct Metrics {
    records_in: AtomicU64,
    records_out: AtomicU64,
    checkpoints_completed: AtomicU64,
    checkpoints_failed: AtomicU64,
    last_checkpoint_duration_ms: AtomicU64,
    last_completed_checkpoint: AtomicU64,
    commits: AtomicU64,
    commit_latency_total_us: AtomicU64,
    commit_latency_max_us: AtomicU64,
    restarts: AtomicU64,
    dead_letters: AtomicU64,
    slow_persists: AtomicU64,
    store_cleanup_failures: AtomicU64,
}

/// A point-in-time copy of [`Metrics`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetricsSnapshot {
    /// Records read by sources.
    pub records_in: u64,
    /// Records written into sink transactions (including ones later replayed).
    pub records_out: u64,
    /// Checkpoints persisted.
    pub checkpoints_completed: u64,
    /// Checkpoints aborted (declined, timed out, persist failed).
    pub checkpoints_failed: u64,
    /// Trigger-to-persisted time of the latest completed checkpoint.
    pub last_checkpoint_duration_ms: u64,
    /// Id of the latest completed checkpoint (0 = none).
    pub last_completed_checkpoint: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Mean time from checkpoint completion to the commit of a transaction.
    pub commit_latency_mean_us: u64,
    /// Largest such time.
    pub commit_latency_max_us: u64,
    /// Pipeline restarts after failures.
    pub restarts: u64,
    /// Records a sink could not write and sent to its dead-letter destination.
    pub dead_letters: u64,
    /// Checkpoint writes still running after a checkpoint timeout (each
    /// counted once; they are waited for, never abandoned).
    pub slow_persists: u64,
    /// Removals of old checkpoint entries that failed (best effort: logged,
    /// counted, never a checkpoint failure).
    pub store_cleanup_failures: u64,
}

impl Metrics {
    pub(crate) fn add_in(&self, n: u64) {
        self.records_in.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn add_out(&self, n: u64) {
        self.records_out.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn checkpoint_completed(&self, id: u64, duration_ms: u64) {
        self.checkpoints_completed.fetch_add(1, Ordering::Relaxed);
        self.last_checkpoint_duration_ms.store(duration_ms, Ordering::Relaxed);
        self.last_completed_checkpoint.store(id, Ordering::Relaxed);
    }
    pub(crate) fn checkpoint_failed(&self) {
        self.checkpoints_failed.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn committed(&self, latency_us: u64) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.commit_latency_total_us.fetch_add(latency_us, Ordering::Relaxed);
        self.commit_latency_max_us.fetch_max(latency_us, Ordering::Relaxed);
    }
    pub(crate) fn slow_persist(&self) {
        self.slow_persists.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn store_cleanup_failed(&self) {
        self.store_cleanup_failures.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts records a sink routed to its dead-letter destination (malformed
    /// input, values that do not fit). Connectors call this; nothing is dropped
    /// silently.
    pub fn add_dead_letters(&self, n: u64) {
        self.dead_letters.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let commits = self.commits.load(Ordering::Relaxed);
        MetricsSnapshot {
            records_in: self.records_in.load(Ordering::Relaxed),
            records_out: self.records_out.load(Ordering::Relaxed),
            checkpoints_completed: self.checkpoints_completed.load(Ordering::Relaxed),
            checkpoints_failed: self.checkpoints_failed.load(Ordering::Relaxed),
            last_checkpoint_duration_ms: self.last_checkpoint_duration_ms.load(Ordering::Relaxed),
            last_completed_checkpoint: self.last_completed_checkpoint.load(Ordering::Relaxed),
            commits,
            commit_latency_mean_us: self.commit_latency_total_us.load(Ordering::Relaxed) / commits.max(1),
            commit_latency_max_us: self.commit_latency_max_us.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            dead_letters: self.dead_letters.load(Ordering::Relaxed),
            slow_persists: self.slow_persists.load(Ordering::Relaxed),
            store_cleanup_failures: self.store_cleanup_failures.load(Ordering::Relaxed),
        }
    }
}
