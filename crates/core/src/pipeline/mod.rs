//! The runtime: runs source and sink subtasks, moves records and barriers between
//! them, drives the [`Coordinator`](crate::Coordinator) state machine, persists
//! checkpoints and recovers after failures.
//!
//! Topology: `parallelism` source subtasks feed `parallelism` sink subtasks; a
//! record goes to sink `hash(split) % parallelism`, so each split is written by
//! one sink subtask in order and every sink subtask has `parallelism` inputs whose
//! barriers it aligns (exactly-once) or merely counts (at-least-once).
//!
//! Subtasks that exchange records form a [`region`]: in region failover (the
//! default) source subtask `i` feeds sink subtask `i` only, and every such
//! forward chain checkpoints, commits and restarts on its own; in global
//! failover records go to sink `hash(split) % parallelism` and every
//! subtask is in one region. [`layout`] keeps the checkpoint folder in the
//! configured shape. An attempt of a region runs in three steps, one file
//! each: [`restore`] (the latest complete checkpoint, or [`history`] when it
//! cannot be read in full; sinks recover, sources seek), [`wiring`] (channels
//! and subtasks: [`source_task`], [`sink_task`]) and [`driver`] (the
//! coordinator's events and actions). [`Pipeline::run`] restarts a failed
//! region under the restart strategy while the others go on.

mod config;
mod driver;
mod history;
mod layout;
mod messages;
mod region;
mod restore;
mod routing;
mod sink_task;
mod source_task;
mod wiring;

use std::future::Future;
use std::sync::Arc;

use tracing::{error, info, info_span, warn, Instrument};

pub use config::{Failover, Guarantee, PipelineConfig, RunSummary};
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
    /// resolves, then takes a last checkpoint in every region, commits it and
    /// returns. A failure restarts its region from the region's latest
    /// complete checkpoint according to the restart strategy (counted per
    /// region) while the other regions go on; a fatal error, data loss or
    /// exhausted restarts in any region stop every region (each takes a last
    /// checkpoint) and end the run with that error.
    ///
    /// The pipeline's exclusive lock (see
    /// [`CheckpointStore::lock_exclusive`]) is held for the whole run: while
    /// another process runs the same pipeline, this fails at once with
    /// [`StoreError::Locked`] naming it, touching nothing.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RunSummary, PipelineError> {
        let span = info_span!("pipeline", name = %self.config.name);
        let store = self.store.clone();
        let _lock = tokio::task::spawn_blocking(move || store.lock_exclusive())
            .await
            .expect("checkpoint store task panicked")
            .map_err(|e| PipelineError::Store {
                pipeline: self.config.name.clone(),
                source: Box::new(e),
            })?;
        let regions = self.prepare_layout().instrument(span.clone()).await?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let runners = futures_util::future::join_all(
            regions
                .iter()
                .map(|region| self.run_region(region, stop_rx.clone(), &stop_tx)),
        )
        .instrument(span);
        tokio::pin!(runners);
        let results = tokio::select! {
            results = &mut runners => results,
            _ = shutdown => {
                info!(pipeline = %self.config.name, "shutdown requested: taking a last checkpoint");
                let _ = stop_tx.send(true);
                runners.await
            }
        };
        let mut last = Vec::with_capacity(results.len());
        for result in results {
            last.push(result?);
        }
        Ok(RunSummary {
            last_checkpoint: last.iter().copied().min().flatten(),
            regions: last,
            metrics: self.metrics.snapshot(),
        })
    }

    /// Runs one region until its last checkpoint is committed, restarting
    /// failed attempts; a failure that ends the region also asks every other
    /// region to stop (`stop_all`).
    async fn run_region(
        &self,
        region: &region::Region,
        stop: tokio::sync::watch::Receiver<bool>,
        stop_all: &tokio::sync::watch::Sender<bool>,
    ) -> Result<Option<crate::record::CheckpointId>, PipelineError> {
        let span = match region.index {
            Some(r) => info_span!("region", region = r),
            None => info_span!("region", region = "global"),
        };
        if let Some(r) = region.index {
            for &subtask in region.sources.iter().chain(&region.sinks) {
                self.metrics.assign_region(subtask, r);
            }
        }
        let result = async {
            let mut attempt = 0u32;
            loop {
                match self.run_attempt(region, stop.clone()).await {
                    Ok(last) => return Ok(last),
                    Err(failure) => {
                        if !failure.retriable {
                            error!(error = %failure.error, region = %region.label(), "failed; not retriable");
                            return Err(failure.error);
                        }
                        attempt = if failure.made_progress { 1 } else { attempt + 1 };
                        let Some(delay) = self.config.restart.delay(attempt) else {
                            error!(error = %failure.error, attempt, region = %region.label(), "failed; restart strategy gives up");
                            return Err(PipelineError::RestartsExhausted {
                                pipeline: self.config.name.clone(),
                                attempts: attempt - 1,
                                last: failure.error.to_string(),
                            });
                        };
                        warn!(error = %failure.error, attempt, ?delay, region = %region.label(), "failed; restarting from its latest complete checkpoint");
                        self.metrics.restarted_in(region.index);
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        }
        .instrument(span)
        .await;
        if result.is_err() {
            let _ = stop_all.send(true);
        }
        result
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

    /// One attempt of a region: restore, wire, drive.
    async fn run_attempt(
        &self,
        region: &region::Region,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Option<crate::record::CheckpointId>, AttemptFailure> {
        let mut restored = self.restore(region).await?;
        // The sinks recover while the sources look up their positions (no
        // record flows before both are done and wired); a sink's failure is
        // reported first, as if they ran one after the other.
        let (sinks, sources) = tokio::join!(
            self.recover_sinks(region, &restored),
            self.restore_sources(region, &restored)
        );
        let (sinks, mut sources) = (sinks?, sources?);
        self.pin_start(region, &mut restored, &mut sources).await?;
        let wired = self.wire(region, sinks, sources, restored.base());
        driver::Driver::new(self, region, wired, restored.id(), restored.reserved)
            .run(stop)
            .await
    }
}
