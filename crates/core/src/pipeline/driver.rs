//! Step 3 of an attempt of a region: drive the region's [`Coordinator`] with
//! its subtasks' reports and the clock, and carry out its actions — trigger
//! barriers, persist checkpoints in the region's store, tell sinks to
//! commit — until the final checkpoint is committed or something fails.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use super::messages::{Report, SourceCommand};
use super::region::Region;
use super::wiring::Wired;
use super::{AttemptFailure, Pipeline};
use crate::coordinator::{Action, Coordinator, Event};
use crate::error::{ConnectorError, PipelineError, StoreError};
use crate::fault;
use crate::record::CheckpointId;
use crate::store::CheckpointEntry;

/// Checkpoint ids reserved durably at a time (see
/// [`CheckpointStore::reserve_ids`](crate::CheckpointStore::reserve_ids)).
const ID_RESERVATION_BLOCK: u64 = 100;

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

/// The state of one attempt's coordination.
pub(super) struct Driver<'p> {
    pipeline: &'p Pipeline,
    region: &'p Region,
    wired: Wired,
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
    /// The latest `committed_upto` minimum handed to the store, and the
    /// write that records it.
    recorded_committed: CheckpointId,
    recording: Option<tokio::task::JoinHandle<()>>,
    triggered_at: Option<(CheckpointId, Instant)>,
    writing: Option<CheckpointWrite>,
    last_completed: Option<CheckpointId>,
    made_progress: bool,
}

impl<'p> Driver<'p> {
    /// A driver for subtasks that start from `restored` (`None`: a first
    /// start) with ids reserved up to `reserved`.
    pub(super) fn new(
        pipeline: &'p Pipeline,
        region: &'p Region,
        wired: Wired,
        restored: Option<CheckpointId>,
        reserved: Option<CheckpointId>,
    ) -> Driver<'p> {
        let config = pipeline.config.checkpoint.clone();
        let coordinator = Coordinator::for_tasks(config, region.tasks(), restored, reserved, 0);
        Driver {
            pipeline,
            region,
            wired,
            coordinator,
            started: Instant::now(),
            reserved,
            finished_sources: region.sources.iter().map(|&i| (i, false)).collect(),
            stopping: false,
            want_final: false,
            final_id: None,
            final_completed: false,
            committed_upto: region
                .sinks
                .iter()
                .map(|&i| (i, restored.unwrap_or_default()))
                .collect(),
            recorded_committed: restored.unwrap_or_default(),
            recording: None,
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
    /// last completed checkpoint) or the attempt fails.
    pub(super) async fn run(
        mut self,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Option<CheckpointId>, AttemptFailure> {
        loop {
            let wake_at = self.next_wake();
            let wake = tokio::select! {
                _ = tokio::time::sleep_until(wake_at) => Wake::Tick,
                Some(Err(joined)) = self.wired.tasks.join_next() => Wake::Panicked(joined),
                _ = stop.changed(), if !self.stopping => Wake::Stop,
                report = self.wired.reports.recv() => {
                    Wake::Report(report.expect("the driver holds a report sender"))
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
            if let Some(last) = self.finished().await {
                return Ok(last);
            }
        }
    }

    /// When the driver looks at the clock next: when the coordinator has a
    /// tick due (the next trigger, or the timeout of the checkpoint in
    /// flight; at once after a checkpoint was requested), when a slow
    /// checkpoint write is to be reported again, and at the latest
    /// [`IDLE_WAKE`] from now. Reports wake it in between.
    fn next_wake(&self) -> tokio::time::Instant {
        let now = Instant::now();
        let mut at = now + IDLE_WAKE;
        if let Some(ms) = self.coordinator.next_tick_ms() {
            at = at.min(self.started + Duration::from_millis(ms));
        }
        if let Some(write) = &self.writing {
            let timeout = self.pipeline.config.checkpoint.timeout;
            at = at.min(write.last_report.unwrap_or(write.started) + timeout);
        }
        tokio::time::Instant::from_std(at)
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
                return Err(self.pipeline.connector_failure(
                    self.made_progress,
                    ConnectorError::transient("subtask", format!("panicked: {joined}")),
                ));
            }
            Wake::Stop => {
                self.stopping = true;
                for c in &self.wired.source_controls {
                    let _ = c.send(SourceCommand::Stop);
                }
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
                    self.recording = Some(self.record_committed(through));
                }
                vec![]
            }
            Wake::Report(Report::Persisted(checkpoint, Ok(()))) => {
                self.writing = None;
                vec![Event::Persisted { checkpoint, now_ms }]
            }
            Wake::Report(Report::Persisted(checkpoint, Err(e))) => {
                self.writing = None;
                if let StoreError::FingerprintMismatch { .. } | StoreError::Encode { .. } = e {
                    return Err(self.pipeline.store_failure(e));
                }
                vec![Event::PersistFailed {
                    checkpoint,
                    reason: e.to_string(),
                    now_ms,
                }]
            }
            Wake::Report(Report::Failed(task, e)) => {
                error!(?task, error = %e, "subtask failed");
                return Err(self.pipeline.connector_failure(self.made_progress, e));
            }
        })
    }

    /// Carries out one action of the coordinator.
    async fn apply(&mut self, action: Action) -> Result<(), AttemptFailure> {
        match action {
            Action::Trigger { checkpoint } => self.trigger(checkpoint).await?,
            Action::Persist { data } => {
                let lists_pending = data.pending.values().any(|pending| !pending.is_empty());
                let entry = CheckpointEntry::new(self.pipeline.descriptor(), data);
                let store = self.region.store.clone();
                let tx = self.wired.report_tx.clone();
                let metrics = self.pipeline.metrics.clone();
                let restorable = self.region.restorable.clone();
                let id = entry.checkpoint.id;
                // The coordinator points of a region take `@<region>`.
                let region = self.region.index;
                let point = move |name: &str| match region {
                    Some(r) => fault::point_at(name, r),
                    None => fault::point(name),
                };
                let write = tokio::task::spawn_blocking(move || {
                    point("coordinator.before_persist");
                    fault::pause_blocking("coordinator.before_persist");
                    let result = store.save(&entry);
                    if result.is_ok() {
                        point("coordinator.after_persist");
                        if lists_pending {
                            point("coordinator.after_persist_pending");
                        }
                        // The new entry is durable whatever happens here.
                        if let Err(error) = store.prune() {
                            metrics.store_cleanup_failed();
                            warn!(checkpoint = %id, %error, "could not remove old checkpoint entries; retrying after the next checkpoint");
                        }
                        // What is left may be restored. When the folder cannot
                        // be listed, the value from before stays: the oldest
                        // restorable checkpoint only rises, so it is still a
                        // safe bound (unknown makes sinks fall back to rules
                        // that protect only the latest checkpoint).
                        if let Ok(left) = store.list() {
                            restorable.set(super::region::oldest(&left));
                        }
                    }
                    let _ = tx.send(Report::Persisted(id, result));
                });
                self.region.writing(write);
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
                self.pipeline
                    .metrics
                    .checkpoint_completed_in(self.region.index, checkpoint.0, duration);
                self.made_progress = true;
                self.last_completed = Some(checkpoint);
                if self.final_id == Some(checkpoint) {
                    self.final_completed = true;
                }
                let at = Instant::now();
                for c in &self.wired.sink_controls {
                    let _ = c.send((checkpoint, at));
                }
                for c in &self.wired.source_controls {
                    let _ = c.send(SourceCommand::Complete(checkpoint));
                }
            }
            Action::Abort { checkpoint, reason } => {
                warn!(%checkpoint, %reason, "checkpoint aborted; its transactions roll into the next checkpoint");
                self.pipeline.metrics.checkpoint_aborted_in(self.region.index, &reason);
                if self.final_id == Some(checkpoint) {
                    self.final_id = None;
                    self.coordinator.handle(Event::RequestCheckpoint);
                }
            }
            Action::Fail { failures, reason } => {
                let config = &self.pipeline.config;
                return Err(self.pipeline.fail(
                    true,
                    self.made_progress,
                    PipelineError::TooManyCheckpointFailures {
                        pipeline: config.name.clone(),
                        failures,
                        tolerated: config.checkpoint.tolerable_failures,
                        reason,
                    },
                ));
            }
        }
        Ok(())
    }

    /// Reserves ids ahead when `checkpoint` reaches the reserved block (so
    /// an id is never used twice, even across crashes), then sends barrier
    /// `checkpoint` into every source subtask.
    async fn trigger(&mut self, checkpoint: CheckpointId) -> Result<(), AttemptFailure> {
        if self.reserved.is_none_or(|r| checkpoint > r) {
            let upto = CheckpointId(checkpoint.0 + ID_RESERVATION_BLOCK);
            let store = self.region.store.clone();
            tokio::task::spawn_blocking(move || store.reserve_ids(upto))
                .await
                .expect("checkpoint store task panicked")
                .map_err(|e| self.pipeline.store_failure(e))?;
            self.reserved = Some(upto);
        }
        debug!(%checkpoint, "triggering checkpoint");
        if self.want_final && self.final_id.is_none() {
            self.final_id = Some(checkpoint);
        }
        self.triggered_at = Some((checkpoint, Instant::now()));
        for c in &self.wired.source_controls {
            let _ = c.send(SourceCommand::Barrier(checkpoint));
        }
        Ok(())
    }

    /// Once the final checkpoint completed and every sink committed it:
    /// stops the subtasks, waits for the record of the commits, and returns
    /// the summary.
    async fn finished(&mut self) -> Option<Option<CheckpointId>> {
        let id = self.final_id.filter(|_| self.final_completed)?;
        if self.committed_upto.values().any(|c| *c < id) {
            return None;
        }
        info!(checkpoint = %id, "final checkpoint committed; stopping");
        self.wired.tasks.abort_all();
        if let Some(recording) = self.recording.take() {
            let _ = recording.await;
        }
        Some(self.last_completed)
    }

    /// Counts (once) and logs (every checkpoint timeout) a write that has
    /// run longer than the checkpoint timeout.
    fn report_if_slow(&mut self) {
        let Some(write) = self.writing.as_mut() else {
            return;
        };
        let timeout = self.pipeline.config.checkpoint.timeout;
        if write.last_report.unwrap_or(write.started).elapsed() < timeout {
            return;
        }
        if write.last_report.is_none() {
            self.pipeline.metrics.slow_persist();
        }
        write.last_report = Some(Instant::now());
        warn!(
            checkpoint = %write.checkpoint,
            waited_s = write.started.elapsed().as_secs(),
            store = %self.region.store.location(),
            "checkpoint still being written after the checkpoint timeout: nothing commits until the write \
             finishes; check the checkpoint store's disk or mount"
        );
    }

    /// Records in the store, in the background, that every sink committed
    /// everything pending up to `id`. A failure is only logged: the record
    /// spares a later recovery work, and without it recovery asks the sinks.
    fn record_committed(&self, id: CheckpointId) -> tokio::task::JoinHandle<()> {
        let store = self.region.store.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(error) = store.record_committed(id) {
                warn!(checkpoint = %id, %error, "could not record that the checkpoint's transactions are committed");
            }
        })
    }
}
