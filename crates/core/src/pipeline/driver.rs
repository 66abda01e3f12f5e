//! Step 3 of an attempt of a region: drive the region's [`Coordinator`] with
//! its subtasks' reports and the clock, and carry out its actions — trigger
//! barriers, persist checkpoints in the region's store, tell sinks to
//! commit — until the final checkpoint is committed or something fails.
//!
//! Every effect goes through [`Effects`], so the tests in `driver/tests.rs`
//! run this very driver on paused time against recorded effects.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::effects::Effects;
use super::messages::{PersistOutcome, Report};
use super::AttemptFailure;
use crate::coordinator::{Action, CheckpointConfig, Coordinator, Event, TaskId};
use crate::error::{ConnectorError, PipelineError, StoreError};
use crate::metrics::Metrics;
use crate::record::CheckpointId;

#[cfg(test)]
mod tests;

/// Checkpoint ids reserved durably at a time (see
/// [`Checkpoints::reserve_ids`](crate::Checkpoints::reserve_ids)).
pub(super) const ID_RESERVATION_BLOCK: u64 = 100;

/// The longest the driver sleeps when nothing is due (a safety net: every
/// deadline it waits for is computed, see [`Driver::next_wake`]).
const IDLE_WAKE: Duration = Duration::from_millis(250);

/// A checkpoint write in progress. It is never abandoned (landing later, it
/// could list transactions this attempt rolled back), so one that outlasts the
/// checkpoint timeout is reported instead, every timeout.
struct CheckpointWrite {
    checkpoint: CheckpointId,
    started: Instant,
    last_report: Option<Instant>,
}

/// What woke the driver.
enum Wake {
    Tick,
    Panicked(tokio::task::JoinError),
    Stop,
    Report(Report),
}

/// What the driver needs to know about the region it drives.
pub(super) struct DriverSettings {
    /// The pipeline's name, for errors.
    pub(super) pipeline: String,
    /// `Some(i)` for region `i`, `None` for the one region of global failover.
    pub(super) region: Option<usize>,
    pub(super) checkpoint: CheckpointConfig,
    /// The tasks whose acknowledgements complete a checkpoint.
    pub(super) tasks: Vec<TaskId>,
}

/// The state of one attempt's coordination.
pub(super) struct Driver<E: Effects> {
    settings: DriverSettings,
    metrics: Arc<Metrics>,
    effects: E,
    reports: mpsc::UnboundedReceiver<Report>,
    coordinator: Coordinator,
    started: Instant,
    /// The highest checkpoint id reserved in the store.
    reserved: Option<CheckpointId>,
    /// Per source subtask: it has finished (or stopped).
    finished_sources: BTreeMap<usize, bool>,
    stopping: bool,
    /// A final checkpoint was asked for (sources finished or shutdown).
    want_final: bool,
    final_id: Option<CheckpointId>,
    final_completed: bool,
    /// Per sink subtask: everything pending up to this id is committed.
    committed_upto: BTreeMap<usize, CheckpointId>,
    /// The latest `committed_upto` minimum handed to the store.
    recorded_committed: CheckpointId,
    triggered_at: Option<(CheckpointId, Instant)>,
    writing: Option<CheckpointWrite>,
    last_completed: Option<CheckpointId>,
    made_progress: bool,
}

impl<E: Effects> Driver<E> {
    /// A driver for subtasks that start from `restored` (`None`: a first
    /// start) with ids reserved up to `reserved`; they report on `reports`.
    pub(super) fn new(
        settings: DriverSettings,
        metrics: Arc<Metrics>,
        effects: E,
        reports: mpsc::UnboundedReceiver<Report>,
        restored: Option<CheckpointId>,
        reserved: Option<CheckpointId>,
    ) -> Driver<E> {
        let coordinator = Coordinator::for_tasks(
            settings.checkpoint.clone(),
            settings.tasks.iter().copied(),
            restored,
            reserved,
            0,
        );
        let sources = settings.tasks.iter().filter_map(|t| match t {
            TaskId::Source(i) => Some((*i, false)),
            TaskId::Sink(_) => None,
        });
        let sinks = settings.tasks.iter().filter_map(|t| match t {
            TaskId::Sink(i) => Some((*i, restored.unwrap_or_default())),
            TaskId::Source(_) => None,
        });
        Driver {
            finished_sources: sources.collect(),
            committed_upto: sinks.collect(),
            settings,
            metrics,
            effects,
            reports,
            coordinator,
            started: Instant::now(),
            reserved,
            stopping: false,
            want_final: false,
            final_id: None,
            final_completed: false,
            recorded_committed: restored.unwrap_or_default(),
            triggered_at: None,
            writing: None,
            last_completed: restored,
            made_progress: false,
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Coordinates until the final checkpoint is committed (`Ok` with the
    /// last completed checkpoint) or the attempt fails. Either way the
    /// subtasks are stopped before it returns; after the final checkpoint
    /// their sinks are closed first.
    pub(super) async fn run(
        mut self,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Option<CheckpointId>, AttemptFailure> {
        let result = self.coordinate(stop).await;
        if result.is_ok() {
            // The final checkpoint is committed: nothing is pending.
            self.effects.close_sinks().await;
        }
        self.effects.stop_subtasks();
        if result.is_ok() {
            self.effects.settle().await;
        }
        result
    }

    async fn coordinate(
        &mut self,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Option<CheckpointId>, AttemptFailure> {
        loop {
            let wake_at = self.next_wake();
            let wake = tokio::select! {
                _ = tokio::time::sleep_until(wake_at) => Wake::Tick,
                joined = self.effects.panicked() => Wake::Panicked(joined),
                _ = stop.changed(), if !self.stopping => Wake::Stop,
                report = self.reports.recv() => {
                    Wake::Report(report.expect("the driver's effects hold a report sender"))
                }
            };
            let events = self.on_wake(wake)?;
            if !self.want_final && self.finished_sources.values().all(|f| *f) {
                info!("all sources finished: taking the final checkpoint");
                self.want_final = true;
                self.coordinator.handle(Event::RequestCheckpoint);
            }
            for event in events {
                for action in self.coordinator.handle(event) {
                    self.apply(action).await?;
                }
            }
            if let Some(last) = self.finished() {
                return Ok(last);
            }
        }
    }

    /// When the driver looks at the clock next: when the coordinator has a
    /// tick due (the next trigger, or the timeout of the checkpoint in
    /// flight; at once after a checkpoint was requested), when a slow
    /// checkpoint write is to be reported again, and at the latest
    /// [`IDLE_WAKE`] from now. Reports wake it in between.
    fn next_wake(&self) -> Instant {
        let mut at = Instant::now() + IDLE_WAKE;
        if let Some(ms) = self.coordinator.next_tick_ms() {
            at = at.min(self.started + Duration::from_millis(ms));
        }
        if let Some(write) = &self.writing {
            let timeout = self.settings.checkpoint.timeout;
            at = at.min(write.last_report.unwrap_or(write.started) + timeout);
        }
        at
    }

    fn store_failure(&self, e: StoreError) -> AttemptFailure {
        AttemptFailure::store(&self.settings.pipeline, e)
    }

    /// The coordinator events a wake-up brings.
    fn on_wake(&mut self, wake: Wake) -> Result<Vec<Event>, AttemptFailure> {
        let now_ms = self.now_ms();
        Ok(match wake {
            Wake::Tick => {
                self.report_if_slow();
                vec![Event::Tick { now_ms }]
            }
            Wake::Panicked(joined) => {
                error!(error = %joined, "a subtask panicked");
                return Err(AttemptFailure::connector(
                    &self.settings.pipeline,
                    self.made_progress,
                    ConnectorError::transient("subtask", format!("panicked: {joined}")),
                ));
            }
            Wake::Stop => {
                self.stopping = true;
                self.effects.stop_sources();
                vec![]
            }
            Wake::Report(Report::Ack(checkpoint, task, state)) => vec![Event::Ack {
                checkpoint,
                task,
                state,
            }],
            Wake::Report(Report::SourceFinished(i)) => {
                self.finished_sources.insert(i, true);
                vec![]
            }
            Wake::Report(Report::Committed(i, id)) => {
                let upto = self.committed_upto.entry(i).or_default();
                *upto = (*upto).max(id);
                let through = *self.committed_upto.values().min().expect("at least one sink");
                if through > self.recorded_committed {
                    self.recorded_committed = through;
                    self.effects.record_committed(through);
                }
                vec![]
            }
            Wake::Report(Report::Persisted(checkpoint, outcome)) => {
                self.writing = None;
                match outcome {
                    PersistOutcome::Persisted => vec![Event::Persisted { checkpoint, now_ms }],
                    PersistOutcome::Failed(
                        e @ (StoreError::FingerprintMismatch { .. } | StoreError::Encode { .. }),
                    ) => return Err(self.store_failure(e)),
                    PersistOutcome::Failed(e) => vec![Event::PersistFailed {
                        checkpoint,
                        reason: e.to_string(),
                        now_ms,
                    }],
                    // The entry may or may not be there: committing could
                    // commit what no durable checkpoint lists, aborting could
                    // lose what one does. Neither: the region restarts and
                    // reads the store again.
                    PersistOutcome::Indeterminate(e) => {
                        error!(%checkpoint, error = %e, "the checkpoint write may or may not have landed: restarting the region to read the store again");
                        return Err(self.store_failure(e));
                    }
                    PersistOutcome::Fenced(e) => {
                        self.metrics.fenced_write();
                        warn!(%checkpoint, error = %e, "the checkpoint write was refused for its epoch: the region was taken; dropping it without committing");
                        return Err(self.store_failure(e));
                    }
                }
            }
            Wake::Report(Report::Failed(task, e)) => {
                error!(?task, error = %crate::error::ErrorChain(&e), "subtask failed");
                return Err(AttemptFailure::connector(
                    &self.settings.pipeline,
                    self.made_progress,
                    e,
                ));
            }
        })
    }

    /// Carries out one action of the coordinator.
    async fn apply(&mut self, action: Action) -> Result<(), AttemptFailure> {
        match action {
            Action::Trigger { checkpoint } => self.trigger(checkpoint).await?,
            Action::Persist { data } => {
                let id = data.id;
                self.effects.persist(data);
                self.writing = Some(CheckpointWrite {
                    checkpoint: id,
                    started: Instant::now(),
                    last_report: None,
                });
            }
            Action::Complete { checkpoint } => {
                let duration = self
                    .triggered_at
                    .filter(|(id, _)| *id == checkpoint)
                    .map(|(_, t)| t.elapsed().as_millis() as u64)
                    .unwrap_or_default();
                info!(%checkpoint, duration_ms = duration, "checkpoint complete");
                self.metrics
                    .checkpoint_completed_in(self.settings.region, checkpoint.0, duration);
                self.made_progress = true;
                self.last_completed = Some(checkpoint);
                if self.final_id == Some(checkpoint) {
                    self.final_completed = true;
                }
                self.effects.complete(checkpoint, Instant::now());
            }
            Action::Abort { checkpoint, reason } => {
                warn!(%checkpoint, %reason, "checkpoint aborted; its transactions roll into the next checkpoint");
                self.metrics.checkpoint_aborted_in(self.settings.region, &reason);
                if self.final_id == Some(checkpoint) {
                    self.final_id = None;
                    self.coordinator.handle(Event::RequestCheckpoint);
                }
            }
            Action::Fail { failures, reason } => {
                return Err(AttemptFailure {
                    error: PipelineError::TooManyCheckpointFailures {
                        pipeline: self.settings.pipeline.clone(),
                        failures,
                        tolerated: self.settings.checkpoint.tolerable_failures,
                        reason,
                    },
                    retriable: true,
                    made_progress: self.made_progress,
                });
            }
        }
        Ok(())
    }

    /// Reserves ids ahead when `checkpoint` reaches the reserved block (so
    /// an id is never used twice, even across crashes), then sends barrier
    /// `checkpoint` into every source subtask.
    async fn trigger(&mut self, checkpoint: CheckpointId) -> Result<(), AttemptFailure> {
        if self.final_completed {
            // Nothing comes after the final checkpoint: the attempt ends
            // once the sinks committed it, and a later one would still be
            // running (pre-committing, persisting) as it ends.
            debug!(%checkpoint, "the final checkpoint completed: not triggering another");
            return Ok(());
        }
        if self.reserved.is_none_or(|r| checkpoint > r) {
            let upto = CheckpointId(checkpoint.0 + ID_RESERVATION_BLOCK);
            self.effects
                .reserve_ids(upto)
                .await
                .map_err(|e| self.store_failure(e))?;
            self.reserved = Some(upto);
        }
        debug!(%checkpoint, "triggering checkpoint");
        if self.want_final && self.final_id.is_none() {
            self.final_id = Some(checkpoint);
        }
        self.triggered_at = Some((checkpoint, Instant::now()));
        self.effects.trigger(checkpoint);
        Ok(())
    }

    /// Once the final checkpoint completed and every sink committed it: the
    /// last completed checkpoint.
    fn finished(&mut self) -> Option<Option<CheckpointId>> {
        let id = self.final_id.filter(|_| self.final_completed)?;
        if self.committed_upto.values().any(|c| *c < id) {
            return None;
        }
        info!(checkpoint = %id, "final checkpoint committed; stopping");
        Some(self.last_completed)
    }

    /// Counts (once) and logs (every checkpoint timeout) a write that has
    /// run longer than the checkpoint timeout.
    fn report_if_slow(&mut self) {
        let Some(write) = self.writing.as_mut() else {
            return;
        };
        let timeout = self.settings.checkpoint.timeout;
        if write.last_report.unwrap_or(write.started).elapsed() < timeout {
            return;
        }
        if write.last_report.is_none() {
            self.metrics.slow_persist();
        }
        write.last_report = Some(Instant::now());
        warn!(
            checkpoint = %write.checkpoint,
            waited_s = write.started.elapsed().as_secs(),
            store = %self.effects.store_location(),
            "checkpoint still being written after the checkpoint timeout: nothing commits until the write \
             finishes; check the checkpoint store's disk or mount"
        );
    }
}
