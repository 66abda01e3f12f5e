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
mod effects;
mod history;
mod layout;
mod messages;
mod region;
mod restore;
mod routing;
mod sink_task;
mod source_task;
mod wiring;
mod workers;

use std::future::Future;
use std::sync::Arc;

use tracing::{error, info, info_span, warn, Instrument};

pub use config::{Failover, Guarantee, PipelineConfig, RunSummary, STANDBY_TAKEOVER_GRACE};
pub use routing::route;

use crate::error::{ConnectorError, PipelineError, StoreError};
use crate::metrics::Metrics;
use crate::sink::SinkFactory;
use crate::source::SourceFactory;
use crate::store::{CheckpointStore, PipelineDescriptor};
use crate::transform::{Chain, Transform};

/// A pipeline: one source, optional transforms, one sink, a checkpoint
/// store, and settings.
pub struct Pipeline {
    config: PipelineConfig,
    source: Arc<dyn SourceFactory>,
    sink: Arc<dyn SinkFactory>,
    store: Arc<dyn CheckpointStore>,
    metrics: Arc<Metrics>,
    /// Run by every source subtask on what its source reads.
    transforms: Chain,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Why an attempt ended, and whether another may follow.
struct AttemptFailure {
    error: PipelineError,
    retriable: bool,
    /// A checkpoint completed in the attempt (resets the restart count).
    made_progress: bool,
}

impl AttemptFailure {
    /// A connector's failure in pipeline `pipeline`: retriable when the
    /// connector says so.
    fn connector(pipeline: &str, made_progress: bool, e: ConnectorError) -> AttemptFailure {
        AttemptFailure {
            retriable: e.is_retriable(),
            made_progress,
            error: PipelineError::Connector {
                pipeline: pipeline.to_string(),
                source: e,
            },
        }
    }

    /// The checkpoint store's failure in pipeline `pipeline`: retriable
    /// when the store could not be reached or written (the next attempt
    /// reads it again), not when what it holds refuses the start.
    fn store(pipeline: &str, e: StoreError) -> AttemptFailure {
        AttemptFailure {
            retriable: matches!(e, StoreError::Access(_) | StoreError::Fenced { .. }),
            made_progress: false,
            error: PipelineError::Store {
                pipeline: pipeline.to_string(),
                source: Box::new(e),
            },
        }
    }
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
            .map_err(PipelineError::connector_config)?;
        if config.workers.is_some() {
            if store.leases().is_none() {
                return Err(PipelineError::Config(format!(
                    "workers share a pipeline through a checkpoint store every machine reaches, and {} is not one: \
                     set [checkpoint] store = {{ postgres = \"postgres://…\" }}, or drop [workers] to run the \
                     pipeline in one process",
                    store.location()
                )));
            }
            if !sink.fences_zombies() {
                return Err(PipelineError::Config(format!(
                    "the sink `{}` cannot refuse the writes of a worker that lost its region (a zombie) in its own \
                     store, so several workers could both write to it: run the pipeline in one process (drop \
                     [workers]; a second process with --standby takes over when it stops), or use a sink that \
                     fences zombies (PostgreSQL, Kafka)",
                    sink.identity()
                )));
            }
        }
        Ok(Pipeline {
            config,
            source,
            sink,
            store,
            metrics: Arc::new(Metrics::default()),
            transforms: Chain::default(),
        })
    }

    /// The pipeline with `transforms` between its source and its sink, run
    /// in that order on every record in the source subtasks (see
    /// [`Transform`] for what stays right: positions, coordinates, errors).
    /// Their identities join the fingerprint.
    ///
    /// Refused when a transform is a [`Transform::flat_map`] and the sink
    /// does not accept several records at one `(split, offset)`
    /// ([`SinkFactory::accepts_repeated_coordinates`]), or when two
    /// transforms share a name.
    pub fn with_transforms(mut self, transforms: Vec<Transform>) -> Result<Self, PipelineError> {
        let mut names = std::collections::BTreeSet::new();
        for t in &transforms {
            if t.name().is_empty() {
                return Err(PipelineError::Config(
                    "a transform has an empty name: name each transform after what it does".into(),
                ));
            }
            if !names.insert(t.name()) {
                return Err(PipelineError::Config(format!(
                    "two transforms are named `{}`: give each its own name (the names are their identities in the \
                     checkpoints' fingerprint)",
                    t.name()
                )));
            }
            if t.is_flat_map() && !self.sink.accepts_repeated_coordinates() {
                return Err(PipelineError::Config(format!(
                    "transform `{}` is a flat_map, whose outputs share their input's split and offset, and the sink \
                     `{}` does not accept several records at one (split, offset) (it keys or fences on them, and \
                     would keep one output of each input). Fix: make one record of each input with a map, or use \
                     a sink that accepts repeated coordinates",
                    t.name(),
                    self.sink.identity()
                )));
            }
        }
        self.transforms = Chain::new(transforms);
        Ok(self)
    }

    /// What the fingerprint is computed from.
    pub fn descriptor(&self) -> PipelineDescriptor {
        PipelineDescriptor {
            name: self.config.name.clone(),
            source: self.source.identity(),
            sink: self.sink.identity(),
            parallelism: self.config.parallelism,
            guarantee: self.config.guarantee.as_str().to_string(),
            transforms: self.transforms.steps().iter().map(Transform::identity).collect(),
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
    /// [`CheckpointStore::lock`]) is held for the whole run: while
    /// another process runs the same pipeline, this fails at once with
    /// [`StoreError::Locked`] naming it, touching nothing — or, with
    /// [`PipelineConfig::standby`], waits touching nothing until the lock
    /// is free (or `shutdown` resolves: then it returns a summary without
    /// checkpoints) and takes over.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RunSummary, PipelineError> {
        crate::fault::warn_if_ignored();
        let span = info_span!("pipeline", name = %self.config.name);
        tokio::pin!(shutdown);
        if let Some(settings) = self.config.workers {
            // `Pipeline::new` refused workers on a store without leases.
            let leases = self.store.leases().ok_or_else(|| {
                PipelineError::Config(format!("{} keeps no leases for workers", self.store.location()))
            })?;
            return self.run_as_worker(leases, settings, shutdown).instrument(span).await;
        }
        let Some(mut lock) = self.take_lock(&mut shutdown).await? else {
            return Ok(RunSummary {
                last_checkpoint: None,
                regions: Vec::new(),
                metrics: self.metrics.snapshot(),
            });
        };
        let run = crate::ownership::RunGuard::start(&self.config.name);
        // Set when a sink of this run did not close cleanly after its
        // final checkpoint: the run then does not hand over as clean.
        let left_open = std::sync::atomic::AtomicBool::new(false);
        let regions = self.prepare_layout().instrument(span.clone()).await?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let runners = futures_util::future::join_all(
            regions
                .iter()
                .map(|region| self.run_region(region, stop_rx.clone(), &stop_tx, &left_open)),
        )
        .instrument(span);
        tokio::pin!(runners);
        let results = tokio::select! {
            results = &mut runners => results,
            why = lock.lost() => {
                // Another process may take the pipeline now: stop acting at
                // once (no last checkpoint, no commit), as a crash would;
                // the next owner's recovery finishes what this one left.
                error!(pipeline = %self.config.name, %why, "lost the pipeline's lock: stopping at once");
                return Err(PipelineError::Store {
                    pipeline: self.config.name.clone(),
                    source: Box::new(StoreError::Access(crate::store::AccessError::indeterminate(
                        self.store.location(),
                        "holding the pipeline's lock",
                        why,
                    ))),
                });
            }
            _ = &mut shutdown => {
                info!(pipeline = %self.config.name, "shutdown requested: taking a last checkpoint");
                let _ = stop_tx.send(true);
                runners.await
            }
        };
        let mut last = Vec::with_capacity(results.len());
        for result in results {
            last.push(result?);
        }
        // Every region stopped after its final checkpoint's commits: tell
        // the next holder (a standby) that nothing of this run acts any
        // more, unless a sink could not close what it holds.
        if left_open.load(std::sync::atomic::Ordering::Relaxed) {
            info!(pipeline = %self.config.name, "a sink did not close cleanly: the next holder waits before it recovers");
        } else {
            run.end_cleanly();
            match lock.release_cleanly().await {
                Ok(()) => info!(pipeline = %self.config.name, "stopped cleanly: the pipeline's lock is handed over"),
                Err(error) => warn!(
                    pipeline = %self.config.name,
                    error = %crate::ErrorChain(&error),
                    "could not record the clean release of the pipeline's lock: the next holder waits before it recovers"
                ),
            }
        }
        Ok(RunSummary {
            last_checkpoint: last.iter().copied().min().flatten(),
            regions: last,
            metrics: self.metrics.snapshot(),
        })
    }

    /// The pipeline's lock; as a standby, waits for it (and then
    /// [`STANDBY_TAKEOVER_GRACE`], unless the holder handed it over
    /// cleanly). `None`: `shutdown` came first.
    async fn take_lock(
        &self,
        shutdown: &mut (impl Future<Output = ()> + Unpin),
    ) -> Result<Option<crate::store::StoreLock>, PipelineError> {
        let failed = |e: StoreError| PipelineError::Store {
            pipeline: self.config.name.clone(),
            source: Box::new(e),
        };
        let mut waiting_on = None;
        loop {
            let attempt = tokio::select! {
                attempt = self.store.lock() => attempt,
                _ = &mut *shutdown, if self.config.standby.is_some() => return Ok(self.stand_down()),
            };
            match attempt {
                Ok(lock) => {
                    if waiting_on.is_some() && lock.previous_released_cleanly() {
                        // It stopped after its last commits and closed its
                        // sinks before it let go: nothing of it runs.
                        self.metrics.set_standby(false);
                        self.metrics.took_over(true);
                        info!(pipeline = %self.config.name, "the pipeline was handed over cleanly: taking over at once");
                    } else if waiting_on.is_some() {
                        info!(pipeline = %self.config.name, "the pipeline's lock is free: taking over");
                        // The lock frees the moment the holder's session
                        // ends, which the holder may not have noticed yet
                        // (its session ended by the server, not by its
                        // exit): give it the time to stop acting and close
                        // its sinks' sessions before recovering.
                        tokio::select! {
                            _ = tokio::time::sleep(STANDBY_TAKEOVER_GRACE) => {}
                            _ = &mut *shutdown => return Ok(self.stand_down()),
                        }
                        self.metrics.set_standby(false);
                        self.metrics.took_over(false);
                    }
                    return Ok(Some(lock));
                }
                Err(StoreError::Locked { holder, .. }) if self.config.standby.is_some() => {
                    if waiting_on.as_ref() != Some(&holder) {
                        self.metrics.set_standby(true);
                        info!(
                            pipeline = %self.config.name,
                            %holder,
                            "standby: another process runs the pipeline; waiting to take over when it stops"
                        );
                        waiting_on = Some(holder);
                    }
                }
                // A standby outlives a store that cannot be reached for a
                // while: that is when the active process may die too.
                Err(e @ StoreError::Access(_)) if self.config.standby.is_some() => {
                    warn!(pipeline = %self.config.name, error = %crate::ErrorChain(&e), "standby: cannot try the pipeline's lock; trying again");
                }
                Err(e) => return Err(failed(e)),
            }
            let poll = self.config.standby.unwrap_or_default();
            tokio::select! {
                _ = &mut *shutdown => return Ok(self.stand_down()),
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// A standby asked to shut down before it took over: it no longer
    /// waits, and takes nothing.
    fn stand_down(&self) -> Option<crate::store::StoreLock> {
        info!(pipeline = %self.config.name, "shutdown requested while on standby");
        self.metrics.set_standby(false);
        None
    }

    /// Runs one region until its last checkpoint is committed, restarting
    /// failed attempts; a failure that ends the region also asks every other
    /// region to stop (`stop_all`).
    async fn run_region(
        &self,
        region: &region::Region,
        stop: tokio::sync::watch::Receiver<bool>,
        stop_all: &tokio::sync::watch::Sender<bool>,
        left_open: &std::sync::atomic::AtomicBool,
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
                match self.run_attempt(region, None, stop.clone(), left_open).await {
                    Ok(last) => return Ok(last),
                    Err(failure) => {
                        if !failure.retriable {
                            error!(error = %crate::error::ErrorChain(&failure.error), region = %region.label(), "failed; not retriable");
                            return Err(failure.error);
                        }
                        attempt = if failure.made_progress { 1 } else { attempt + 1 };
                        let Some(delay) = self.config.restart.delay(attempt) else {
                            error!(error = %crate::error::ErrorChain(&failure.error), attempt, region = %region.label(), "failed; restart strategy gives up");
                            return Err(PipelineError::RestartsExhausted {
                                pipeline: self.config.name.clone(),
                                attempts: attempt - 1,
                                last: Box::new(failure.error),
                            });
                        };
                        warn!(error = %crate::error::ErrorChain(&failure.error), attempt, ?delay, region = %region.label(), "failed; restarting from its latest complete checkpoint");
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

    fn connector_failure(&self, made_progress: bool, e: ConnectorError) -> AttemptFailure {
        AttemptFailure::connector(&self.config.name, made_progress, e)
    }

    fn store_failure(&self, e: StoreError) -> AttemptFailure {
        AttemptFailure::store(&self.config.name, e)
    }

    /// One attempt of a region: restore, wire, drive. `claimed`: the epoch
    /// under which a worker's claim took the region (it fenced the region's
    /// sequence already); `None`: the attempt takes the sequence itself.
    async fn run_attempt(
        &self,
        region: &region::Region,
        claimed: Option<&restore::Claimed>,
        stop: tokio::sync::watch::Receiver<bool>,
        left_open: &std::sync::atomic::AtomicBool,
    ) -> Result<Option<crate::record::CheckpointId>, AttemptFailure> {
        let mut restored = self.restore(region, claimed).await?;
        // The sinks recover while the sources look up their positions (no
        // record flows before both are done and wired); a sink's failure is
        // reported first, as if they ran one after the other.
        let (sinks, sources) = tokio::join!(
            self.recover_sinks(region, &restored, claimed),
            self.restore_sources(region, &restored)
        );
        let (sinks, mut sources) = (sinks?, sources?);
        self.pin_start(region, &mut restored, &mut sources).await?;
        let wired = self.wire(region, sinks, sources, restored.base());
        let settings = driver::DriverSettings {
            pipeline: self.config.name.clone(),
            region: region.index,
            checkpoint: self.config.checkpoint.clone(),
            tasks: region.tasks(),
        };
        let effects = effects::RegionEffects {
            region,
            epoch: restored.epoch,
            descriptor: self.descriptor(),
            metrics: self.metrics.clone(),
            report_tx: wired.report_tx,
            source_controls: wired.source_controls,
            sink_controls: wired.sink_controls,
            left_open,
            tasks: wired.tasks,
            recording: None,
        };
        driver::Driver::new(
            settings,
            self.metrics.clone(),
            effects,
            wired.reports,
            restored.id(),
            restored.reserved,
        )
        .run(stop)
        .await
    }
}
