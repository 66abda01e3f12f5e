//! The driver's effects on the world, behind a seam: reserve checkpoint ids,
//! persist a checkpoint, record committed checkpoints, send barriers, tell
//! sinks and sources that a checkpoint completed, stop the sources, close
//! the sinks after the final checkpoint, stop every subtask. [`RegionEffects`] does them for real (the region's
//! checkpoint store and its subtasks' channels); the driver's tests record
//! them and decide the store's answers, on paused time (in the manner of
//! RisingWave's `GlobalBarrierWorkerContext`).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use super::messages::{PersistOutcome, Report, SinkCommand, SourceCommand};
use super::region::Region;
use crate::coordinator::CheckpointData;
use crate::error::StoreError;
use crate::fault;
use crate::membership::Epoch;
use crate::metrics::Metrics;
use crate::record::CheckpointId;
use crate::store::{AccessError, CheckpointEntry, PipelineDescriptor};

/// What a region's driver does outside itself. Every call is made from the
/// driver's task, in the order the protocol needs; the driver never calls
/// [`complete`](Self::complete) for a checkpoint before its
/// [`persist`](Self::persist) reported [`PersistOutcome::Persisted`].
#[async_trait]
pub(super) trait Effects: Send {
    /// Durably records that checkpoint ids up to `upto` may be in use; the
    /// driver waits for it before triggering any of them, so an id is never
    /// used twice, even across crashes.
    async fn reserve_ids(&mut self, upto: CheckpointId) -> Result<(), StoreError>;

    /// Starts writing the checkpoint `data` durably, in the background; its
    /// outcome arrives on the driver's report channel as
    /// [`Report::Persisted`]. A write is never abandoned: it runs to its end
    /// even when the attempt ends first.
    fn persist(&mut self, data: CheckpointData);

    /// Starts recording, in the background, that every sink subtask has
    /// committed everything pending up to `id`. Best effort.
    fn record_committed(&mut self, id: CheckpointId);

    /// After [`stop_subtasks`](Self::stop_subtasks) at the end of a
    /// clean attempt: waits until the records started by
    /// [`record_committed`](Self::record_committed) have landed or failed,
    /// the attempt's checkpoint writes have ended and its subtasks are
    /// gone, so nothing of it acts any more (at most [`CLOSE_TIMEOUT`] for
    /// the subtasks; one still there after that is noted like a sink that
    /// did not close).
    async fn settle(&mut self);

    /// Injects barrier `checkpoint` into every source subtask of the region.
    fn trigger(&mut self, checkpoint: CheckpointId);

    /// Checkpoint `checkpoint` is durable (since `at`): every sink subtask
    /// commits what is pending up to it, and the sources hear of it.
    fn complete(&mut self, checkpoint: CheckpointId, at: tokio::time::Instant);

    /// Asks every source subtask to stop reading (barriers still flow).
    fn stop_sources(&mut self);

    /// Closes every sink subtask's sink (see
    /// [`TwoPhaseCommitSink::close`](crate::TwoPhaseCommitSink::close))
    /// and waits until each has answered, for at most [`CLOSE_TIMEOUT`].
    /// Called only once the final checkpoint is committed, never after a
    /// failure. A sink that does not close in time or fails to is noted:
    /// the pipeline then does not tell the next holder that it stopped
    /// cleanly.
    async fn close_sinks(&mut self);

    /// Resolves when a subtask of the attempt panicked (never while none
    /// did).
    async fn panicked(&mut self) -> tokio::task::JoinError;

    /// Stops every subtask of the attempt.
    fn stop_subtasks(&mut self);

    /// Where the checkpoints are written, for messages.
    fn store_location(&self) -> String;
}

/// The real effects of one attempt of a region.
pub(super) struct RegionEffects<'p> {
    pub(super) region: &'p Region,
    /// The epoch the attempt took the region's sequence under.
    pub(super) epoch: Epoch,
    pub(super) descriptor: PipelineDescriptor,
    pub(super) metrics: Arc<Metrics>,
    /// Where the checkpoint writer reports.
    pub(super) report_tx: mpsc::UnboundedSender<Report>,
    pub(super) source_controls: Vec<mpsc::UnboundedSender<SourceCommand>>,
    /// "Commit everything pending up to N", "close".
    pub(super) sink_controls: Vec<mpsc::UnboundedSender<SinkCommand>>,
    /// Set when a sink did not close cleanly (see
    /// [`Effects::close_sinks`]).
    pub(super) left_open: &'p std::sync::atomic::AtomicBool,
    /// Every subtask of the attempt.
    pub(super) tasks: tokio::task::JoinSet<()>,
    pub(super) recording: Option<JoinHandle<()>>,
}

/// How long [`Effects::close_sinks`] waits for a sink to close.
pub(super) const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How a checkpoint write's result tells the driver what to do.
fn outcome(result: Result<(), StoreError>) -> PersistOutcome {
    match result {
        Ok(()) => PersistOutcome::Persisted,
        Err(e @ StoreError::Fenced { .. }) => PersistOutcome::Fenced(e),
        Err(e @ StoreError::Access(AccessError::Indeterminate { .. })) => PersistOutcome::Indeterminate(e),
        Err(e) => PersistOutcome::Failed(e),
    }
}

#[async_trait]
impl Effects for RegionEffects<'_> {
    async fn reserve_ids(&mut self, upto: CheckpointId) -> Result<(), StoreError> {
        self.region.checkpoints.reserve_ids(self.epoch, upto).await
    }

    fn persist(&mut self, data: CheckpointData) {
        let lists_pending = data.pending.values().any(|pending| !pending.is_empty());
        let entry = CheckpointEntry::new(self.descriptor.clone(), data);
        let checkpoints = self.region.checkpoints.clone();
        let epoch = self.epoch;
        let tx = self.report_tx.clone();
        let metrics = self.metrics.clone();
        let restorable = self.region.restorable.clone();
        let id = entry.checkpoint.id;
        // The coordinator points of a region take `@<region>`.
        let region = self.region.index;
        let point = move |name: &str| match region {
            Some(r) => fault::point_at(name, r),
            None => fault::point(name),
        };
        let write = tokio::spawn(async move {
            point("coordinator.before_persist");
            fault::pause("coordinator.before_persist").await;
            let outcome = outcome(checkpoints.save(epoch, &entry).await);
            if let PersistOutcome::Persisted = outcome {
                point("coordinator.after_persist");
                if lists_pending {
                    point("coordinator.after_persist_pending");
                }
                // The new entry is durable whatever happens here.
                if let Err(error) = checkpoints.prune(epoch).await {
                    metrics.store_cleanup_failed();
                    warn!(checkpoint = %id, %error, "could not remove old checkpoint entries; retrying after the next checkpoint");
                }
                // What is left may be restored. When the store cannot be
                // listed, the value from before stays: the oldest restorable
                // checkpoint only rises, so it is still a safe bound (unknown
                // makes sinks fall back to rules that protect only the latest
                // checkpoint).
                if let Ok(left) = checkpoints.list().await {
                    restorable.set(super::region::oldest(&left));
                }
            }
            let _ = tx.send(Report::Persisted(id, outcome));
        });
        self.region.writing(write);
    }

    fn record_committed(&mut self, id: CheckpointId) {
        let checkpoints = self.region.checkpoints.clone();
        let epoch = self.epoch;
        self.recording = Some(tokio::spawn(async move {
            if let Err(error) = checkpoints.record_committed(epoch, id).await {
                warn!(checkpoint = %id, %error, "could not record that the checkpoint's transactions are committed");
            }
        }));
    }

    async fn settle(&mut self) {
        if let Some(recording) = self.recording.take() {
            let _ = recording.await;
        }
        self.region.wait_for_previous_write().await;
        let drained =
            tokio::time::timeout(CLOSE_TIMEOUT, async { while self.tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            warn!("a subtask was still running {CLOSE_TIMEOUT:?} after it was stopped: the next holder of the pipeline waits before it recovers");
            self.left_open.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn trigger(&mut self, checkpoint: CheckpointId) {
        for c in &self.source_controls {
            let _ = c.send(SourceCommand::Barrier(checkpoint));
        }
    }

    fn complete(&mut self, checkpoint: CheckpointId, at: tokio::time::Instant) {
        let at = at.into_std();
        for c in &self.sink_controls {
            let _ = c.send(SinkCommand::Commit(checkpoint, at));
        }
        for c in &self.source_controls {
            let _ = c.send(SourceCommand::Complete(checkpoint));
        }
    }

    fn stop_sources(&mut self) {
        for c in &self.source_controls {
            let _ = c.send(SourceCommand::Stop);
        }
    }

    async fn close_sinks(&mut self) {
        let mut answers = Vec::with_capacity(self.sink_controls.len());
        for c in &self.sink_controls {
            let (done, answer) = tokio::sync::oneshot::channel();
            if c.send(SinkCommand::Close(done)).is_ok() {
                answers.push(answer);
            } else {
                warn!("a sink subtask had ended before it could close its sink");
                self.left_open.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        // One deadline for all: the sinks close at the same time.
        let deadline = tokio::time::Instant::now() + CLOSE_TIMEOUT;
        for answer in answers {
            let why = match tokio::time::timeout_at(deadline, answer).await {
                Ok(Ok(Ok(crate::sink::Closed::Released))) => continue,
                Ok(Ok(Ok(crate::sink::Closed::Unknown))) => {
                    // The sink does not say it holds nothing (the trait's
                    // default): not an error, but no clean hand-over.
                    tracing::info!("a sink cannot tell whether it let go of everything it held: the next holder of the pipeline waits before it recovers");
                    self.left_open.store(true, std::sync::atomic::Ordering::Relaxed);
                    continue;
                }
                Ok(Ok(Err(e))) => crate::error::ErrorChain(&e).to_string(),
                Ok(Err(_)) => "the sink subtask ended without answering".to_string(),
                Err(_) => format!("no answer within {CLOSE_TIMEOUT:?}"),
            };
            warn!(error = %why, "a sink did not close cleanly: the next holder of the pipeline waits before it recovers");
            self.left_open.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    async fn panicked(&mut self) -> tokio::task::JoinError {
        loop {
            match self.tasks.join_next().await {
                Some(Err(joined)) => return joined,
                Some(Ok(())) => {}
                None => std::future::pending().await,
            }
        }
    }

    fn stop_subtasks(&mut self) {
        self.tasks.abort_all();
    }

    fn store_location(&self) -> String {
        self.region.checkpoints.location()
    }
}
