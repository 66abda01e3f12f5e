//! The settings of a pipeline and what a finished run reports.

use crate::coordinator::CheckpointConfig;
use crate::error::PipelineError;
use crate::metrics::MetricsSnapshot;
use crate::record::CheckpointId;
use crate::restart::RestartStrategy;

/// What a failure restarts, and so which subtasks checkpoint together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Failover {
    /// Forward chains: source subtask `i` feeds sink subtask `i` only, and
    /// every such pair is a region with its own checkpoints (in
    /// `<dir>/<pipeline>/region-<i>/`), commits and restarts; a failure
    /// restarts its region alone while the others go on.
    #[default]
    Region,
    /// One region of every subtask: records are spread over the sink
    /// subtasks by split, every sink aligns the barriers of every source, and
    /// a failure anywhere restarts everything.
    Global,
}

impl Failover {
    /// `region` / `global`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Failover::Region => "region",
            Failover::Global => "global",
        }
    }
}

/// The delivery guarantee of a pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    /// Aligned barriers and two-phase commit: after any failure every record's
    /// effect is visible exactly once.
    #[default]
    ExactlyOnce,
    /// No alignment; sinks flush at each checkpoint and commit at once. After a
    /// failure records since the last checkpoint are replayed: duplicates are
    /// possible, loss is not. Pair with idempotent sinks.
    AtLeastOnce,
}

impl Guarantee {
    /// `exactly-once` / `at-least-once`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Guarantee::ExactlyOnce => "exactly-once",
            Guarantee::AtLeastOnce => "at-least-once",
        }
    }
}

impl std::str::FromStr for Guarantee {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exactly-once" => Ok(Guarantee::ExactlyOnce),
            "at-least-once" => Ok(Guarantee::AtLeastOnce),
            other => Err(format!(
                "unknown guarantee `{other}`: use \"exactly-once\" or \"at-least-once\""
            )),
        }
    }
}

/// How long a standby that took the pipeline's lock waits before it
/// recovers: a holder whose lock session the server ended (rather than its
/// own exit) notices within a second, stops acting and closes its sinks'
/// sessions in that time. Not waited after a holder that handed the
/// pipeline over cleanly (see [`StoreLock::release_cleanly`](crate::store::StoreLock::release_cleanly)).
pub const STANDBY_TAKEOVER_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Settings of a pipeline.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Unique name; checkpoints live in a folder of this name.
    pub name: String,
    /// Delivery guarantee.
    pub guarantee: Guarantee,
    /// Source and sink subtasks.
    pub parallelism: usize,
    /// Regions (the default) or one global region.
    pub failover: Failover,
    /// Checkpoint timing.
    pub checkpoint: CheckpointConfig,
    /// What to do after a failure.
    pub restart: RestartStrategy,
    /// Records per source poll at most.
    pub batch_size: usize,
    /// Batches buffered between a source and a sink subtask (back-pressure).
    pub channel_capacity: usize,
    /// Resume even when the latest checkpoint's fingerprint differs.
    pub allow_fingerprint_change: bool,
    /// Resume from a checkpoint taken at another parallelism (the rest of
    /// the pipeline unchanged): the new sink subtasks commit what the old
    /// ones left pending and abort the rest they owned, before data flows.
    pub allow_parallelism_change: bool,
    /// Start as if for the first time although the checkpoint folder has a
    /// history none of whose entries can be read (the unreadable entries are
    /// then set aside as `<name>.unreadable`).
    pub allow_first_start: bool,
    /// Restore the newest readable checkpoint although newer entries cannot
    /// be read and the sinks do not prove the replay harmless: the records
    /// after it are written again (duplicates).
    pub allow_fallback: bool,
    /// While another process holds the pipeline's lock, wait as a hot
    /// standby — trying to take it every this often — instead of failing
    /// at once; take over (recovery from the store's latest checkpoints)
    /// as soon as it is free. `None` (the default) refuses at once.
    pub standby: Option<std::time::Duration>,
    /// Run as one worker among several processes of this pipeline: the
    /// regions are shared among the workers under leases in the checkpoint
    /// store ([`CheckpointStore::leases`](crate::store::CheckpointStore::leases)),
    /// each owned under a fencing epoch (see [`crate::membership`]).
    /// `None` (the default): one process runs every region, under the
    /// store's lock.
    pub workers: Option<crate::membership::LeaseSettings>,
}

impl PipelineConfig {
    /// Defaults for a pipeline called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        PipelineConfig {
            name: name.into(),
            guarantee: Guarantee::ExactlyOnce,
            parallelism: 1,
            failover: Failover::default(),
            checkpoint: CheckpointConfig::default(),
            restart: RestartStrategy::default(),
            batch_size: 500,
            channel_capacity: 16,
            allow_fingerprint_change: false,
            allow_parallelism_change: false,
            allow_first_start: false,
            allow_fallback: false,
            standby: None,
            workers: None,
        }
    }

    pub(super) fn validate(&self) -> Result<(), PipelineError> {
        let bad = |m: &str| Err(PipelineError::Config(m.to_string()));
        if self.name.is_empty() || self.name.contains(['/', '\\']) || self.name.starts_with('.') {
            return bad("name must be non-empty, without path separators and not start with '.' (it names the checkpoint folder)");
        }
        if self.parallelism == 0 {
            return bad("parallelism must be at least 1");
        }
        if self.batch_size == 0 || self.channel_capacity == 0 {
            return bad("batch_size and channel_capacity must be at least 1");
        }
        if self.checkpoint.interval.is_zero() {
            return bad("checkpoint.interval must be greater than zero");
        }
        if self.checkpoint.timeout.is_zero() {
            return bad("checkpoint.timeout must be greater than zero");
        }
        if let Some(workers) = &self.workers {
            workers.validate().map_err(PipelineError::Config)?;
            if self.failover != Failover::Region {
                return bad(
                    "workers share a pipeline's regions, and global failover has one: use failover = \"region\" \
                     with workers",
                );
            }
            if self.standby.is_some() {
                return bad(
                    "a worker that owns nothing is already a hot standby: drop `standby` (or `--standby`) with workers",
                );
            }
        }
        Ok(())
    }
}

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct RunSummary {
    /// The last checkpoint completed and committed (with regions: the
    /// lowest of the regions' last checkpoints).
    pub last_checkpoint: Option<CheckpointId>,
    /// Per region, its last completed checkpoint (one entry, region 0, in
    /// global failover).
    pub regions: Vec<Option<CheckpointId>>,
    /// Counters at the end.
    pub metrics: MetricsSnapshot,
}
