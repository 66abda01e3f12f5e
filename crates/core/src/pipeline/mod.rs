//! The runtime: runs source and sink subtasks, moves records and barriers between
//! them, drives the [`Coordinator`](crate::Coordinator) state machine, persists
//! checkpoints and recovers after failures.
//!
//! Topology: `parallelism` source subtasks feed `parallelism` sink subtasks; a
//! record goes to sink `hash(split) % parallelism`, so each split is written by
//! one sink subtask in order and every sink subtask has `parallelism` inputs whose
//! barriers it aligns (exactly-once) or merely counts (at-least-once).
//!
//! An attempt runs in three steps, one file each: [`restore`] (the latest
//! complete checkpoint; sinks recover, sources seek), [`wiring`] (channels and
//! subtasks: [`source_task`], [`sink_task`]) and [`driver`] (the coordinator's
//! events and actions). [`Pipeline::run`] restarts failed attempts under the
//! restart strategy.

mod config;
mod driver;
mod messages;
mod restore;
mod routing;
mod sink_task;
mod source_task;
mod wiring;

use std::future::Future;
use std::sync::Arc;

use tracing::{error, info, info_span, warn, Instrument};

pub use config::{Guarantee, PipelineConfig, RunSummary};
pub use routing::route;

use crate::error::{ConnectorError, PipelineError, StoreError};
use crate::metrics::Metrics;
use crate::sink::SinkFactory;
use crate::source::SourceFactory;
use crate::store::{CheckpointStore, PipelineDescriptor};

/// A pipeline: one source, one sink, a checkpoint store, and settings.
pub struct Pipeline {
    config: PipelineConfig,
    source: Arc<dyn SourceFactory>,
    sink: Arc<dyn SinkFactory>,
    store: Arc<dyn CheckpointStore>,
    metrics: Arc<Metrics>,
    /// A checkpoint write still running when its attempt failed. The next
    /// attempt waits for it before reading the store, so it never restores an
    /// older checkpoint while a newer one is landing.
    persisting: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Why an attempt ended, and whether another may follow.
struct AttemptFailure {
    error: PipelineError,
    retriable: bool,
    /// A checkpoint completed in the attempt (resets the restart count).
    made_progress: bool,
}

impl Pipeline {
    /// A pipeline; fails when the settings are invalid.
    pub fn new(
        config: PipelineConfig,
        source: Arc<dyn SourceFactory>,
        sink: Arc<dyn SinkFactory>,
        store: Arc<dyn CheckpointStore>,
    ) -> Result<Self, PipelineError> {
        config.validate()?;
        sink.check_checkpointing(&config.checkpoint)
            .map_err(|e| PipelineError::Config(e.to_string()))?;
        Ok(Pipeline {
            config,
            source,
            sink,
            store,
            metrics: Arc::new(Metrics::default()),
            persisting: std::sync::Mutex::new(None),
        })
    }

    /// What the fingerprint is computed from.
    pub fn descriptor(&self) -> PipelineDescriptor {
        PipelineDescriptor {
            name: self.config.name.clone(),
            source: self.source.identity(),
            sink: self.sink.identity(),
            parallelism: self.config.parallelism,
            guarantee: self.config.guarantee.as_str().to_string(),
        }
    }

    /// Live counters.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Runs until the sources are finished (bounded sources) or `shutdown`
    /// resolves, then takes a last checkpoint, commits it and returns. Failures
    /// restart the pipeline from the latest complete checkpoint according to the
    /// restart strategy.
    ///
    /// The pipeline's exclusive lock (see
    /// [`CheckpointStore::lock_exclusive`]) is held for the whole run: while
    /// another process runs the same pipeline, this fails at once with
    /// [`StoreError::Locked`] naming it, touching nothing.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RunSummary, PipelineError> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let span = info_span!("pipeline", name = %self.config.name);
        let store = self.store.clone();
        let _lock = tokio::task::spawn_blocking(move || store.lock_exclusive())
            .await
            .expect("checkpoint store task panicked")
            .map_err(|e| PipelineError::Store {
                pipeline: self.config.name.clone(),
                source: Box::new(e),
            })?;
        let runner = async {
            let mut attempt = 0u32;
            loop {
                match self.run_attempt(stop_rx.clone()).await {
                    Ok(summary) => return Ok(summary),
                    Err(failure) => {
                        if !failure.retriable {
                            error!(error = %failure.error, "pipeline failed; not retriable");
                            return Err(failure.error);
                        }
                        attempt = if failure.made_progress { 1 } else { attempt + 1 };
                        let Some(delay) = self.config.restart.delay(attempt) else {
                            error!(error = %failure.error, attempt, "pipeline failed; restart strategy gives up");
                            return Err(PipelineError::RestartsExhausted {
                                pipeline: self.config.name.clone(),
                                attempts: attempt - 1,
                                last: failure.error.to_string(),
                            });
                        };
                        warn!(error = %failure.error, attempt, ?delay, "pipeline failed; restarting from the latest complete checkpoint");
                        self.metrics.restarted();
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        }
        .instrument(span);
        tokio::pin!(runner);
        tokio::select! {
            r = &mut runner => r,
            _ = shutdown => {
                info!(pipeline = %self.config.name, "shutdown requested: taking a last checkpoint");
                let _ = stop_tx.send(true);
                runner.await
            }
        }
    }

    fn fail(&self, retriable: bool, made_progress: bool, error: PipelineError) -> AttemptFailure {
        AttemptFailure {
            error,
            retriable,
            made_progress,
        }
    }

    fn connector_failure(&self, made_progress: bool, e: ConnectorError) -> AttemptFailure {
        self.fail(
            e.is_retriable(),
            made_progress,
            PipelineError::Connector {
                pipeline: self.config.name.clone(),
                source: e,
            },
        )
    }

    fn store_failure(&self, e: StoreError) -> AttemptFailure {
        let retriable = matches!(e, StoreError::Io { .. });
        self.fail(
            retriable,
            false,
            PipelineError::Store {
                pipeline: self.config.name.clone(),
                source: Box::new(e),
            },
        )
    }

    /// One attempt: restore, wire, drive.
    async fn run_attempt(&self, stop: tokio::sync::watch::Receiver<bool>) -> Result<RunSummary, AttemptFailure> {
        let mut restored = self.restore().await?;
        let sinks = self.recover_sinks(&restored).await?;
        let mut sources = self.restore_sources(&restored).await?;
        self.pin_start(&mut restored, &mut sources).await?;
        let wired = self.wire(sinks, sources, restored.base());
        driver::Driver::new(self, wired, restored.id(), restored.reserved)
            .run(stop)
            .await
    }
}
