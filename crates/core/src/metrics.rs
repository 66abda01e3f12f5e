//! Counters of a running pipeline, readable at any time through
//! [`crate::Pipeline::metrics`].
//!
//! Everything here is plain atomics: the runtime and the connectors count,
//! and an exporter (the `exactly` command's `/metrics` endpoint) reads a
//! [`MetricsSnapshot`] or the per-subtask and per-region views when it is
//! scraped. Nothing here knows the exposition format.
//!
//! # Scopes
//!
//! - pipeline-wide: records, bytes, checkpoints, commits, restarts, dead
//!   letters, slow checkpoint writes ([`Metrics::snapshot`]);
//! - per subtask ([`Metrics::subtasks`]): records and bytes read by source
//!   subtask `i`, written by sink subtask `i`, and the transactions sink
//!   subtask `i` holds pre-committed;
//! - per region ([`Metrics::regions`]): once the runtime checkpoints
//!   regions apart, it reports each region's checkpoints with the `*_in`
//!   methods and tells which region a subtask belongs to
//!   ([`Metrics::assign_region`]); the pipeline-wide figures keep adding up
//!   every region's.
//!
//! # Readiness
//!
//! [`Metrics::readiness`] says whether the pipeline is recovered and
//! running: a checkpoint completed since the latest (re)start — every
//! subtask acknowledged it, so every subtask is past recovery — and the
//! latest completion is recent enough. With regions, every region must be.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::coordinator::AbortReason;
use crate::record::Record;

/// Upper bounds (microseconds) of the buckets of the duration histograms:
/// 1 ms to 2 min.
pub const DURATION_BUCKETS_US: [u64; 16] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
];

/// A histogram of durations with fixed buckets ([`DURATION_BUCKETS_US`]).
#[derive(Debug, Default)]
pub(crate) struct DurationHistogram {
    /// Per bucket (not cumulative); the last slot counts values above every bound.
    counts: [AtomicU64; DURATION_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
    max_us: AtomicU64,
}

/// A point-in-time copy of a histogram of durations (checkpoint
/// durations, commit latencies).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HistogramSnapshot {
    /// `(upper bound in µs, observations at or below it)`, cumulative, for
    /// every bound of [`DURATION_BUCKETS_US`]; `count` is the `+Inf` bucket.
    pub buckets: Vec<(u64, u64)>,
    /// Sum of all observations, µs.
    pub sum_us: u64,
    /// Number of observations.
    pub count: u64,
    /// Largest observation, µs.
    pub max_us: u64,
}

impl DurationHistogram {
    /// Records one duration.
    pub(crate) fn observe_us(&self, us: u64) {
        let slot = DURATION_BUCKETS_US
            .iter()
            .position(|bound| us <= *bound)
            .unwrap_or(DURATION_BUCKETS_US.len());
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// Reads it.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let buckets = DURATION_BUCKETS_US
            .iter()
            .zip(&self.counts)
            .map(|(bound, n)| {
                cumulative += n.load(Ordering::Relaxed);
                (*bound, cumulative)
            })
            .collect();
        let above = self.counts[DURATION_BUCKETS_US.len()].load(Ordering::Relaxed);
        HistogramSnapshot {
            buckets,
            sum_us: self.sum_us.load(Ordering::Relaxed),
            // Consistent with the buckets even while observations land.
            count: cumulative + above,
            max_us: self.max_us.load(Ordering::Relaxed),
        }
    }
}

/// The checkpoints of one scope: the whole pipeline, or one region.
#[derive(Debug, Default)]
struct CheckpointStats {
    completed: AtomicU64,
    /// Every aborted checkpoint (declined, timed out, persist failed).
    failed: AtomicU64,
    /// The aborted ones that ran out of time.
    timed_out: AtomicU64,
    last_duration_ms: AtomicU64,
    last_completed_id: AtomicU64,
    /// Wall-clock time of the latest completion (0 = none).
    last_completed_unix_ms: AtomicU64,
    duration: DurationHistogram,
    restarts: AtomicU64,
    /// A checkpoint completed since the latest (re)start.
    completed_since_start: AtomicBool,
}

impl CheckpointStats {
    fn completed(&self, id: u64, duration_ms: u64) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        self.last_duration_ms.store(duration_ms, Ordering::Relaxed);
        self.last_completed_id.store(id, Ordering::Relaxed);
        self.last_completed_unix_ms.store(unix_ms_now(), Ordering::Relaxed);
        self.duration.observe_us(duration_ms.saturating_mul(1000));
        self.completed_since_start.store(true, Ordering::Relaxed);
    }

    fn aborted(&self, timed_out: bool) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if timed_out {
            self.timed_out.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.completed_since_start.store(false, Ordering::Relaxed);
    }

    fn snapshot(&self) -> CheckpointStatsSnapshot {
        let at = self.last_completed_unix_ms.load(Ordering::Relaxed);
        CheckpointStatsSnapshot {
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            last_duration_ms: self.last_duration_ms.load(Ordering::Relaxed),
            last_completed_id: self.last_completed_id.load(Ordering::Relaxed),
            last_completed_unix_ms: (at > 0).then_some(at),
            duration: self.duration.snapshot(),
            restarts: self.restarts.load(Ordering::Relaxed),
            completed_since_start: self.completed_since_start.load(Ordering::Relaxed),
        }
    }
}

/// The checkpoints of one region (see [`Metrics::regions`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointStatsSnapshot {
    /// Checkpoints persisted.
    pub completed: u64,
    /// Checkpoints aborted, all causes.
    pub failed: u64,
    /// Of those, the ones that timed out.
    pub timed_out: u64,
    /// Trigger-to-persisted time of the latest completed checkpoint.
    pub last_duration_ms: u64,
    /// Id of the latest completed checkpoint (0 = none).
    pub last_completed_id: u64,
    /// When the latest checkpoint completed, Unix ms (`None`: none yet).
    pub last_completed_unix_ms: Option<u64>,
    /// Trigger-to-persisted times.
    pub duration: HistogramSnapshot,
    /// Restarts after failures.
    pub restarts: u64,
    /// A checkpoint completed since the latest (re)start.
    pub completed_since_start: bool,
}

/// Counters of one subtask index: source subtask `i` reads, sink subtask
/// `i` writes.
#[derive(Debug, Default)]
struct SubtaskCounters {
    records_read: AtomicU64,
    bytes_read: AtomicU64,
    records_written: AtomicU64,
    bytes_written: AtomicU64,
    pending_transactions: AtomicU64,
    /// Region + 1 (0: not assigned).
    region: AtomicU64,
}

/// A point-in-time copy of the counters of subtask index `subtask`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SubtaskSnapshot {
    /// The subtask index.
    pub subtask: usize,
    /// The region it belongs to, once the runtime has said
    /// ([`Metrics::assign_region`]).
    pub region: Option<usize>,
    /// Records source subtask `subtask` read.
    pub records_read: u64,
    /// Their key and value bytes.
    pub bytes_read: u64,
    /// Records sink subtask `subtask` wrote into transactions.
    pub records_written: u64,
    /// Their key and value bytes.
    pub bytes_written: u64,
    /// Transactions sink subtask `subtask` pre-committed that are not
    /// committed yet (waiting for their checkpoint to complete).
    pub pending_transactions: u64,
}

/// Live counters. All are monotonic except the `last_*` and pending gauges.
#[derive(Debug, Default)]
pub struct Metrics {
    records_in: AtomicU64,
    records_out: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// Every checkpoint, whatever its region.
    checkpoints: CheckpointStats,
    commits: AtomicU64,
    commit_latency: DurationHistogram,
    dead_letters: AtomicU64,
    records_filtered: AtomicU64,
    transform_dead_letters: AtomicU64,
    slow_persists: AtomicU64,
    store_cleanup_failures: AtomicU64,
    fenced_writes: AtomicU64,
    takeovers: AtomicU64,
    clean_takeovers: AtomicU64,
    regions_claimed: AtomicU64,
    regions_dropped: AtomicU64,
    regions_owned: AtomicU64,
    subtasks: RwLock<Vec<Arc<SubtaskCounters>>>,
    regions: RwLock<BTreeMap<usize, Arc<CheckpointStats>>>,
    /// Waiting as a hot standby for the pipeline's lock.
    standby: std::sync::atomic::AtomicBool,
}

/// A point-in-time copy of [`Metrics`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetricsSnapshot {
    /// Records read by sources.
    pub records_in: u64,
    /// Records written into sink transactions (including ones later replayed).
    pub records_out: u64,
    /// Key and value bytes of the records read.
    pub bytes_in: u64,
    /// Key and value bytes of the records written.
    pub bytes_out: u64,
    /// Checkpoints persisted.
    pub checkpoints_completed: u64,
    /// Checkpoints aborted (declined, timed out, persist failed).
    pub checkpoints_failed: u64,
    /// Of those, the ones that timed out.
    pub checkpoints_timed_out: u64,
    /// Trigger-to-persisted time of the latest completed checkpoint.
    pub last_checkpoint_duration_ms: u64,
    /// Id of the latest completed checkpoint (0 = none).
    pub last_completed_checkpoint: u64,
    /// When it completed, Unix ms (0 = none).
    pub last_completed_checkpoint_unix_ms: u64,
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
    /// Records a transform's filter dropped (or a flat_map made nothing
    /// of), replays included.
    pub records_filtered: u64,
    /// Records skipped because a transform failed on them with `on_error =
    /// dead-letter` (each logged with the reason), replays included.
    pub transform_dead_letters: u64,
    /// Checkpoint writes still running after a checkpoint timeout (each
    /// counted once; they are waited for, never abandoned).
    pub slow_persists: u64,
    /// Removals of old checkpoint entries that failed (best effort: logged,
    /// counted, never a checkpoint failure).
    pub store_cleanup_failures: u64,
    /// Checkpoint writes refused for their epoch: a newer owner took the
    /// region, and the attempt dropped it without committing.
    pub fenced_writes: u64,
    /// Times this process took the pipeline over as a hot standby.
    pub takeovers: u64,
    /// Of those, the ones after a clean hand-over (no grace waited).
    pub clean_takeovers: u64,
    /// Regions this process (a worker) claimed: each claim raised the
    /// region's epoch, fencing its previous owner.
    pub regions_claimed: u64,
    /// Regions this worker stopped acting on without handing them over: a
    /// write refused for its epoch (another worker took the region), or
    /// its lease's deadline passed (frozen, cut off, a slow store).
    pub regions_dropped: u64,
    /// Regions this worker owns and acts on now.
    pub regions_owned: u64,
    /// Transactions pre-committed and not committed yet, all sink subtasks.
    pub pending_transactions: u64,
}

/// Whether the pipeline is recovered and running (see [`Metrics::readiness`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Readiness {
    /// Ready for traffic: recovered, and checkpoints complete.
    pub ready: bool,
    /// Why not, when not.
    pub reason: Option<String>,
    /// Id of the latest completed checkpoint (0 = none).
    pub last_checkpoint: u64,
    /// Seconds since it completed (`None`: none yet).
    pub last_checkpoint_age_seconds: Option<f64>,
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
        .max(1)
}

fn record_bytes(records: &[Record]) -> u64 {
    records
        .iter()
        .map(|r| (r.value.as_ref().map_or(0, |v| v.len()) + r.key.as_ref().map_or(0, |k| k.len())) as u64)
        .sum()
}

impl Metrics {
    fn subtask(&self, index: usize) -> Arc<SubtaskCounters> {
        if let Some(counters) = self.subtasks.read().unwrap_or_else(|e| e.into_inner()).get(index) {
            return counters.clone();
        }
        let mut all = self.subtasks.write().unwrap_or_else(|e| e.into_inner());
        while all.len() <= index {
            all.push(Arc::default());
        }
        all[index].clone()
    }

    fn region(&self, region: usize) -> Arc<CheckpointStats> {
        if let Some(stats) = self.regions.read().unwrap_or_else(|e| e.into_inner()).get(&region) {
            return stats.clone();
        }
        let mut all = self.regions.write().unwrap_or_else(|e| e.into_inner());
        all.entry(region).or_default().clone()
    }

    /// Counts records read, without a subtask (older callers).
    pub(crate) fn add_in(&self, n: u64) {
        self.records_in.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts records written, without a subtask (older callers).
    pub(crate) fn add_out(&self, n: u64) {
        self.records_out.fetch_add(n, Ordering::Relaxed);
    }

    /// Source subtask `subtask` read `records`.
    pub fn source_read(&self, subtask: usize, records: &[Record]) {
        let (n, bytes) = (records.len() as u64, record_bytes(records));
        self.add_in(n);
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
        let s = self.subtask(subtask);
        s.records_read.fetch_add(n, Ordering::Relaxed);
        s.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Sink subtask `subtask` wrote `records` into its transaction.
    pub fn sink_wrote(&self, subtask: usize, records: &[Record]) {
        let (n, bytes) = (records.len() as u64, record_bytes(records));
        self.add_out(n);
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
        let s = self.subtask(subtask);
        s.records_written.fetch_add(n, Ordering::Relaxed);
        s.bytes_written.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The process waits as a hot standby for the pipeline's lock (`true`),
    /// or no longer does.
    pub fn set_standby(&self, waiting: bool) {
        self.standby.store(waiting, Ordering::Relaxed);
    }

    /// Whether the process waits as a hot standby (see
    /// [`PipelineConfig::standby`](crate::PipelineConfig::standby)).
    pub fn is_standby(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
    }

    /// Sink subtask `subtask` now holds `n` pre-committed transactions that
    /// wait for their checkpoint.
    pub fn set_pending_transactions(&self, subtask: usize, n: usize) {
        self.subtask(subtask)
            .pending_transactions
            .store(n as u64, Ordering::Relaxed);
    }

    /// Subtask index `subtask` (source and sink) belongs to region `region`.
    pub fn assign_region(&self, subtask: usize, region: usize) {
        self.subtask(subtask).region.store(region as u64 + 1, Ordering::Relaxed);
        self.region(region);
    }

    /// Checkpoint `id` of `region` (`None`: the one region of global
    /// failover) completed after `duration_ms`.
    pub fn checkpoint_completed_in(&self, region: Option<usize>, id: u64, duration_ms: u64) {
        self.checkpoints.completed(id, duration_ms);
        if let Some(r) = region {
            self.region(r).completed(id, duration_ms);
        }
    }

    /// A checkpoint of `region` was aborted for `reason`: every cause
    /// counts as failed, timeouts also as timed out.
    pub fn checkpoint_aborted_in(&self, region: Option<usize>, reason: &AbortReason) {
        let timed_out = match reason {
            AbortReason::TimedOut { .. } => true,
            AbortReason::Declined { .. } | AbortReason::PersistFailed { .. } => false,
        };
        self.checkpoints.aborted(timed_out);
        if let Some(r) = region {
            self.region(r).aborted(timed_out);
        }
    }

    /// A transaction was committed `latency_us` after its checkpoint completed.
    pub(crate) fn committed(&self, latency_us: u64) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.commit_latency.observe_us(latency_us);
    }
    pub(crate) fn slow_persist(&self) {
        self.slow_persists.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn store_cleanup_failed(&self) {
        self.store_cleanup_failures.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn fenced_write(&self) {
        self.fenced_writes.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn region_claimed(&self) {
        self.regions_claimed.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn region_dropped(&self) {
        self.regions_dropped.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn set_regions_owned(&self, n: usize) {
        self.regions_owned.store(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn took_over(&self, clean: bool) {
        self.takeovers.fetch_add(1, Ordering::Relaxed);
        if clean {
            self.clean_takeovers.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `region` (`None`: the whole pipeline) restarts after a failure: it
    /// is not ready until a checkpoint completes again, and its sinks' old
    /// pre-committed transactions are recovery's business now.
    pub fn restarted_in(&self, region: Option<usize>) {
        self.checkpoints.restarted();
        let subtasks = self.subtasks.read().unwrap_or_else(|e| e.into_inner()).clone();
        for s in &subtasks {
            let in_region = s.region.load(Ordering::Relaxed);
            if region.is_none_or(|r| in_region == r as u64 + 1) {
                s.pending_transactions.store(0, Ordering::Relaxed);
            }
        }
        if let Some(r) = region {
            self.region(r).restarted();
        }
    }

    /// Counts records a sink routed to its dead-letter destination (malformed
    /// input, values that do not fit). Connectors call this; nothing is dropped
    /// silently.
    pub fn add_dead_letters(&self, n: u64) {
        self.dead_letters.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts what the transforms of a source subtask dropped.
    pub(crate) fn transformed(&self, tally: &crate::transform::Tally) {
        self.records_filtered.fetch_add(tally.filtered, Ordering::Relaxed);
        self.transform_dead_letters
            .fetch_add(tally.dead_letters, Ordering::Relaxed);
    }

    /// Reads every pipeline-wide counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let commits = self.commit_latency.snapshot();
        let checkpoints = self.checkpoints.snapshot();
        MetricsSnapshot {
            records_in: self.records_in.load(Ordering::Relaxed),
            records_out: self.records_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            checkpoints_completed: checkpoints.completed,
            checkpoints_failed: checkpoints.failed,
            checkpoints_timed_out: checkpoints.timed_out,
            last_checkpoint_duration_ms: checkpoints.last_duration_ms,
            last_completed_checkpoint: checkpoints.last_completed_id,
            last_completed_checkpoint_unix_ms: checkpoints.last_completed_unix_ms.unwrap_or_default(),
            commits: self.commits.load(Ordering::Relaxed),
            commit_latency_mean_us: commits.sum_us / commits.count.max(1),
            commit_latency_max_us: commits.max_us,
            restarts: checkpoints.restarts,
            dead_letters: self.dead_letters.load(Ordering::Relaxed),
            records_filtered: self.records_filtered.load(Ordering::Relaxed),
            transform_dead_letters: self.transform_dead_letters.load(Ordering::Relaxed),
            slow_persists: self.slow_persists.load(Ordering::Relaxed),
            fenced_writes: self.fenced_writes.load(Ordering::Relaxed),
            takeovers: self.takeovers.load(Ordering::Relaxed),
            clean_takeovers: self.clean_takeovers.load(Ordering::Relaxed),
            regions_claimed: self.regions_claimed.load(Ordering::Relaxed),
            regions_dropped: self.regions_dropped.load(Ordering::Relaxed),
            regions_owned: self.regions_owned.load(Ordering::Relaxed),
            store_cleanup_failures: self.store_cleanup_failures.load(Ordering::Relaxed),
            pending_transactions: self.subtasks().iter().map(|s| s.pending_transactions).sum(),
        }
    }

    /// Trigger-to-persisted times of every completed checkpoint.
    pub fn checkpoint_durations(&self) -> HistogramSnapshot {
        self.checkpoints.duration.snapshot()
    }

    /// Times from a checkpoint's completion to the commit of each of its
    /// transactions.
    pub fn commit_latencies(&self) -> HistogramSnapshot {
        self.commit_latency.snapshot()
    }

    /// Every subtask index that counted anything, in order.
    pub fn subtasks(&self) -> Vec<SubtaskSnapshot> {
        let all = self.subtasks.read().unwrap_or_else(|e| e.into_inner()).clone();
        all.iter()
            .enumerate()
            .map(|(subtask, s)| {
                let region = s.region.load(Ordering::Relaxed);
                SubtaskSnapshot {
                    subtask,
                    region: region.checked_sub(1).map(|r| r as usize),
                    records_read: s.records_read.load(Ordering::Relaxed),
                    bytes_read: s.bytes_read.load(Ordering::Relaxed),
                    records_written: s.records_written.load(Ordering::Relaxed),
                    bytes_written: s.bytes_written.load(Ordering::Relaxed),
                    pending_transactions: s.pending_transactions.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// The checkpoints of every region the runtime reported, by region
    /// (empty in global failover).
    pub fn regions(&self) -> BTreeMap<usize, CheckpointStatsSnapshot> {
        let all = self.regions.read().unwrap_or_else(|e| e.into_inner()).clone();
        all.into_iter().map(|(r, s)| (r, s.snapshot())).collect()
    }

    /// Ready when a checkpoint completed since the latest (re)start (so
    /// every subtask is past recovery: each acknowledged it) and the latest
    /// completed at most `max_age` ago; with regions, every region must be.
    pub fn readiness(&self, max_age: Duration) -> Readiness {
        let now = unix_ms_now();
        let age = |s: &CheckpointStatsSnapshot| {
            s.last_completed_unix_ms
                .map(|at| now.saturating_sub(at) as f64 / 1000.0)
        };
        let pipeline = self.checkpoints.snapshot();
        let regions = self.regions();
        let scopes: Vec<(Option<usize>, CheckpointStatsSnapshot)> = if regions.is_empty() {
            vec![(None, pipeline.clone())]
        } else {
            regions.into_iter().map(|(r, s)| (Some(r), s)).collect()
        };
        let standby = self
            .is_standby()
            .then(|| "standby: another process runs the pipeline; this one takes over when it stops".to_string());
        let reason = standby.or_else(|| {
            scopes.iter().find_map(|(region, s)| {
                let whose = region.map_or_else(String::new, |r| format!("region {r}: "));
                if !s.completed_since_start {
                    let when = if s.restarts == 0 {
                        "the start"
                    } else {
                        "the latest restart"
                    };
                    return Some(format!(
                        "{whose}no checkpoint completed since {when}: recovering, or checkpoints fail"
                    ));
                }
                match age(s) {
                    Some(a) if a > max_age.as_secs_f64() => Some(format!(
                        "{whose}the latest checkpoint completed {a:.1} s ago, more than the {} s allowed",
                        max_age.as_secs_f64()
                    )),
                    _ => None,
                }
            })
        });
        Readiness {
            ready: reason.is_none(),
            reason,
            last_checkpoint: pipeline.last_completed_id,
            last_checkpoint_age_seconds: age(&pipeline),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::{Action, CheckpointConfig, Coordinator, Event, TaskId};

    #[test]
    fn histograms_are_cumulative_and_count_everything() {
        let h = DurationHistogram::default();
        for us in [500, 1_000, 1_001, 3_000_000, 500_000_000] {
            h.observe_us(us);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 5);
        assert_eq!(s.sum_us, 500 + 1_000 + 1_001 + 3_000_000 + 500_000_000);
        assert_eq!(s.max_us, 500_000_000);
        assert_eq!(s.buckets[0], (1_000, 2), "at or below the bound");
        assert_eq!(s.buckets[1], (2_500, 3));
        assert_eq!(s.buckets.last(), Some(&(120_000_000, 4)), "one above every bound");
        assert!(s.buckets.windows(2).all(|w| w[0].1 <= w[1].1));
    }

    #[test]
    fn subtasks_count_records_and_bytes_apart() {
        let m = Metrics::default();
        let mut keyed = Record::new("s-0", 0, "abcd");
        keyed.key = Some(b"k1".to_vec().into());
        m.source_read(1, &[keyed.clone(), Record::new("s-0", 1, "xy")]);
        m.sink_wrote(0, &[keyed]);
        m.set_pending_transactions(0, 2);
        let s = m.snapshot();
        assert_eq!((s.records_in, s.bytes_in, s.records_out, s.bytes_out), (2, 8, 1, 6));
        assert_eq!(s.pending_transactions, 2);
        let subtasks = m.subtasks();
        assert_eq!(subtasks.len(), 2);
        assert_eq!((subtasks[0].records_written, subtasks[0].records_read), (1, 0));
        assert_eq!((subtasks[1].records_read, subtasks[1].bytes_read), (2, 8));
        assert_eq!(subtasks[0].region, None);
        m.restarted_in(None);
        assert_eq!(
            m.snapshot().pending_transactions,
            0,
            "recovery owns them after a restart"
        );
    }

    /// The timeout classification follows the coordinator's own wording.
    #[test]
    fn the_coordinators_timeouts_are_told_apart() {
        let config = CheckpointConfig {
            interval: Duration::from_millis(10),
            min_pause: Duration::ZERO,
            timeout: Duration::from_millis(100),
            tolerable_failures: 5,
        };
        let mut c = Coordinator::new(config, 1, 1, None, None, 0);
        assert!(matches!(
            c.handle(Event::Tick { now_ms: 10 })[..],
            [Action::Trigger { .. }]
        ));
        let actions = c.handle(Event::Tick { now_ms: 200 });
        let Some(Action::Abort { reason, .. }) = actions.first() else {
            panic!("no abort after the timeout: {actions:?}");
        };
        assert!(reason.is_timeout(), "{reason}");
        let m = Metrics::default();
        m.checkpoint_aborted_in(None, reason);
        m.checkpoint_aborted_in(
            None,
            &AbortReason::Declined {
                task: TaskId::Sink(0),
                error: "boom".into(),
            },
        );
        m.checkpoint_aborted_in(
            None,
            &AbortReason::PersistFailed {
                error: "disk full".into(),
            },
        );
        let s = m.snapshot();
        assert_eq!((s.checkpoints_failed, s.checkpoints_timed_out), (3, 1));
    }

    #[test]
    fn ready_after_a_checkpoint_since_the_latest_restart_and_while_they_are_recent() {
        let m = Metrics::default();
        let r = m.readiness(Duration::from_secs(60));
        assert!(!r.ready);
        assert!(r.reason.as_deref().unwrap().contains("since the start"), "{r:?}");
        m.checkpoint_completed_in(None, 3, 20);
        let r = m.readiness(Duration::from_secs(60));
        assert!(r.ready, "{r:?}");
        assert_eq!(r.last_checkpoint, 3);
        m.restarted_in(None);
        let r = m.readiness(Duration::from_secs(60));
        assert!(!r.ready);
        assert!(r.reason.as_deref().unwrap().contains("latest restart"), "{r:?}");
        m.checkpoint_completed_in(None, 4, 20);
        std::thread::sleep(Duration::from_millis(30));
        let r = m.readiness(Duration::from_millis(10));
        assert!(!r.ready, "too old: {r:?}");
        assert!(r.reason.as_deref().unwrap().contains("s ago"), "{r:?}");
    }

    #[test]
    fn regions_are_counted_apart_and_all_must_be_ready() {
        let m = Metrics::default();
        m.assign_region(0, 0);
        m.assign_region(1, 1);
        m.checkpoint_completed_in(Some(0), 5, 10);
        m.checkpoint_completed_in(Some(1), 7, 10);
        m.checkpoint_aborted_in(
            Some(1),
            &AbortReason::TimedOut {
                timeout_ms: 100,
                acknowledged: 1,
                expected: 2,
            },
        );
        assert!(m.readiness(Duration::from_secs(60)).ready);
        m.set_pending_transactions(0, 1);
        m.set_pending_transactions(1, 1);
        m.restarted_in(Some(1));
        let regions = m.regions();
        assert_eq!(regions[&0].completed, 1);
        assert_eq!(
            (regions[&1].completed, regions[&1].timed_out, regions[&1].restarts),
            (1, 1, 1)
        );
        assert_eq!(
            m.snapshot().checkpoints_completed,
            2,
            "the pipeline adds up its regions"
        );
        assert_eq!(m.subtasks()[1].region, Some(1));
        assert_eq!(m.snapshot().pending_transactions, 1, "only region 1's were reset");
        let r = m.readiness(Duration::from_secs(60));
        assert!(!r.ready);
        assert!(r.reason.as_deref().unwrap().starts_with("region 1:"), "{r:?}");
    }
}
