//! The runtime: runs source and sink subtasks, moves records and barriers between
//! them, drives the [`Coordinator`] state machine, persists checkpoints and
//! recovers after failures.
//!
//! Topology: `parallelism` source subtasks feed `parallelism` sink subtasks; a
//! record goes to sink `hash(split) % parallelism`, so each split is written by
//! one sink subtask in order and every sink subtask has `parallelism` inputs whose
//! barriers it aligns (exactly-once) or merely counts (at-least-once).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::coordinator::{Action, CheckpointConfig, CommitLedger, Coordinator, Event, TaskId, TaskState};
use crate::error::{ConnectorError, PipelineError, StoreError};
use crate::fault;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::record::{CheckpointId, Record, SplitPositions};
use crate::restart::RestartStrategy;
use crate::sink::{ErasedSink, SinkContext, SinkFactory};
use crate::source::{Poll, Source, SourceFactory};
use crate::store::{check_fingerprint, CheckpointEntry, CheckpointStore, PipelineDescriptor};

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

/// Settings of a pipeline.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Unique name; checkpoints live in a folder of this name.
    pub name: String,
    /// Delivery guarantee.
    pub guarantee: Guarantee,
    /// Source and sink subtasks.
    pub parallelism: usize,
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
}

impl PipelineConfig {
    /// Defaults for a pipeline called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        PipelineConfig {
            name: name.into(),
            guarantee: Guarantee::ExactlyOnce,
            parallelism: 1,
            checkpoint: CheckpointConfig::default(),
            restart: RestartStrategy::default(),
            batch_size: 500,
            channel_capacity: 16,
            allow_fingerprint_change: false,
        }
    }

    fn validate(&self) -> Result<(), PipelineError> {
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
        Ok(())
    }
}

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct RunSummary {
    /// The last checkpoint completed and committed.
    pub last_checkpoint: Option<CheckpointId>,
    /// Counters at the end.
    pub metrics: MetricsSnapshot,
}

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

enum Msg {
    Records(Vec<Record>),
    Barrier(CheckpointId),
}

enum SourceCommand {
    Barrier(CheckpointId),
    Complete(CheckpointId),
    Stop,
}

enum Report {
    Ack(CheckpointId, TaskId, TaskState),
    SourceFinished(usize),
    Committed(usize, CheckpointId),
    Persisted(CheckpointId, Result<(), StoreError>),
    Failed(TaskId, ConnectorError),
}

struct AttemptFailure {
    error: PipelineError,
    retriable: bool,
    made_progress: bool,
}

/// Checkpoint ids reserved durably at a time (see [`CheckpointStore::reserve_ids`]).
const ID_RESERVATION_BLOCK: u64 = 100;

/// Stable 64-bit FNV-1a, so routing does not change between runs or versions.
fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The sink subtask that receives records of `split`.
pub fn route(split: &str, parallelism: usize) -> usize {
    (stable_hash(split) % parallelism as u64) as usize
}

/// A checkpoint write in progress. It is never abandoned (landing later, it
/// could list transactions this attempt rolled back), so one that outlasts the
/// checkpoint timeout is reported instead, every timeout.
struct CheckpointWrite {
    checkpoint: CheckpointId,
    started: Instant,
    last_report: Option<Instant>,
}

impl Pipeline {
    /// Counts (once) and logs (every checkpoint timeout) a write that has
    /// run longer than the checkpoint timeout.
    fn report_if_slow(&self, write: &mut CheckpointWrite) {
        let timeout = self.config.checkpoint.timeout;
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
            store = %self.store.location(),
            "checkpoint still being written after the checkpoint timeout: nothing commits until the write \
             finishes; check the checkpoint store's disk or mount"
        );
    }

    /// Records in the store, in the background, that every sink committed
    /// everything pending up to `id`. A failure is only logged: the record
    /// spares a later recovery work, and without it recovery asks the sinks.
    fn record_committed(&self, id: CheckpointId) -> tokio::task::JoinHandle<()> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(error) = store.record_committed(id) {
                warn!(checkpoint = %id, %error, "could not record that the checkpoint's transactions are committed");
            }
        })
    }

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
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RunSummary, PipelineError> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let span = info_span!("pipeline", name = %self.config.name);
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

    async fn run_attempt(&self, mut stop: tokio::sync::watch::Receiver<bool>) -> Result<RunSummary, AttemptFailure> {
        let p = self.config.parallelism;
        let descriptor = self.descriptor();

        // 1. Restore the latest complete checkpoint (after any write of the
        //    previous attempt has landed or failed).
        let previous_write = self.persisting.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(write) = previous_write {
            let _ = write.await;
        }
        let store = self.store.clone();
        let latest = tokio::task::spawn_blocking(move || store.latest())
            .await
            .expect("checkpoint store task panicked")
            .map_err(|e| self.store_failure(e))?;
        if let Some(entry) = &latest {
            check_fingerprint(
                self.store.as_ref(),
                entry,
                &descriptor,
                self.config.allow_fingerprint_change,
            )
            .map_err(|e| self.store_failure(e))?;
            info!(checkpoint = %entry.checkpoint.id, entry = %entry.file_name(), "restoring from checkpoint");
        } else {
            info!("no checkpoint found: first start");
        }
        let restored_id = latest.as_ref().map(|e| e.checkpoint.id);
        let store = self.store.clone();
        let mut reserved = tokio::task::spawn_blocking(move || store.id_watermark())
            .await
            .expect("checkpoint store task panicked")
            .map_err(|e| self.store_failure(e))?;
        let positions = latest.as_ref().map(|e| e.checkpoint.positions.clone());
        let store = self.store.clone();
        let committed_through = tokio::task::spawn_blocking(move || store.committed_through())
            .await
            .expect("checkpoint store task panicked")
            .map_err(|e| self.store_failure(e))?;
        // Everything the restored checkpoint lists was committed by every sink
        // before the pipeline stopped: nothing is left to commit, and a store
        // that forgot those transactions since (an expired Kafka transactional
        // id) is not asked about them.
        let all_committed = restored_id.is_some_and(|id| committed_through.is_some_and(|c| c >= id));
        if all_committed {
            info!(
                checkpoint = %restored_id.unwrap_or_default(),
                "every transaction the checkpoint lists was committed before the stop"
            );
        }
        if let (Some(entry), false) = (&latest, all_committed) {
            if let Some(orphaned) = entry.checkpoint.pending.keys().find(|i| **i >= p) {
                return Err(self.fail(
                    false,
                    false,
                    PipelineError::Config(format!(
                        "checkpoint {} holds pending transactions of sink subtask {orphaned}, but parallelism is now {p}: \
                         they would never be committed. Resume with the old parallelism once (it commits them), then change it",
                        entry.checkpoint.id
                    )),
                ));
            }
        }
        // The first checkpoint of this attempt is `base + 1`: above the restored
        // one and above every id an earlier run may have used.
        let base = restored_id.max(reserved).unwrap_or_default();

        // 2. Sinks recover: commit what the checkpoint lists, abort the rest. No
        //    data flows before every sink subtask has recovered.
        let mut sinks = Vec::with_capacity(p);
        for i in 0..p {
            let ctx = SinkContext {
                pipeline: self.config.name.clone(),
                subtask: i,
                parallelism: p,
                metrics: self.metrics.clone(),
            };
            let mut sink = self.sink.create(ctx).map_err(|e| self.connector_failure(false, e))?;
            let pending = latest
                .as_ref()
                .filter(|_| !all_committed)
                .and_then(|e| e.checkpoint.pending.get(&i))
                .map(|l| l.iter().map(|c| c.committable.clone()).collect::<Vec<_>>())
                .unwrap_or_default();
            sink.recover(&pending)
                .instrument(info_span!("recover", subtask = i, pending = pending.len()))
                .await
                .map_err(|e| self.connector_failure(false, e))?;
            fault::point("recovery.after_commit");
            sinks.push(sink);
        }

        // 3. Sources seek.
        let mut sources = Vec::with_capacity(p);
        for i in 0..p {
            let mut source = self.source.create(i, p).map_err(|e| self.connector_failure(false, e))?;
            source
                .restore(positions.as_ref())
                .await
                .map_err(|e| self.connector_failure(false, e))?;
            sources.push(source);
        }

        // 4. Wire and start the subtasks.
        let (report_tx, mut reports) = mpsc::unbounded_channel::<Report>();
        let mut tasks = JoinSet::new();
        // One bounded channel per (source, sink) pair, so a sink that holds back
        // an aligned input back-pressures exactly that source.
        let mut source_outputs: Vec<Vec<mpsc::Sender<Msg>>> = (0..p).map(|_| Vec::with_capacity(p)).collect();
        let mut sink_controls = Vec::with_capacity(p);
        for (i, sink) in sinks.into_iter().enumerate() {
            let mut inputs = Vec::with_capacity(p);
            for outputs in &mut source_outputs {
                let (tx, rx) = mpsc::channel(self.config.channel_capacity);
                outputs.push(tx);
                inputs.push(rx);
            }
            let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
            sink_controls.push(ctl_tx);
            let task = SinkTask {
                index: i,
                sink,
                guarantee: self.config.guarantee,
                ledger: CommitLedger::new(),
                barrier_seen: vec![base; p],
                blocked: vec![false; p],
                closed: vec![false; p],
                next_input: 0,
                last_snapshot: base,
                reports: report_tx.clone(),
                metrics: self.metrics.clone(),
            };
            tasks.spawn(task.run(inputs, ctl_rx).instrument(info_span!("sink", subtask = i)));
        }
        let mut source_controls = Vec::with_capacity(p);
        for ((i, source), outputs) in sources.into_iter().enumerate().zip(source_outputs) {
            let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
            source_controls.push(ctl_tx);
            let task = SourceTask {
                index: i,
                source,
                outputs,
                batch_size: self.config.batch_size,
                reports: report_tx.clone(),
                metrics: self.metrics.clone(),
            };
            tasks.spawn(task.run(ctl_rx).instrument(info_span!("source", subtask = i)));
        }

        // 5. Coordinate.
        let started = Instant::now();
        let now_ms = || started.elapsed().as_millis() as u64;
        let mut coordinator = Coordinator::new(self.config.checkpoint.clone(), p, p, restored_id, reserved, now_ms());
        let mut ticker = tokio::time::interval(Duration::from_millis(10).min(self.config.checkpoint.interval));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut finished_sources = vec![false; p];
        let mut stopping = false;
        let mut want_final = false;
        let mut final_id: Option<CheckpointId> = None;
        let mut final_completed = false;
        let mut committed_upto = vec![restored_id.unwrap_or_default(); p];
        // The latest `committed_upto` minimum handed to the store, and the
        // write that records it.
        let mut recorded_committed = restored_id.unwrap_or_default();
        let mut recording: Option<tokio::task::JoinHandle<()>> = None;
        let mut triggered_at: Option<(CheckpointId, Instant)> = None;
        let mut writing: Option<CheckpointWrite> = None;
        let mut last_completed = restored_id;
        let mut made_progress = false;

        loop {
            let events: Vec<Event> = tokio::select! {
                _ = ticker.tick() => {
                    if let Some(write) = writing.as_mut() {
                        self.report_if_slow(write);
                    }
                    vec![Event::Tick { now_ms: now_ms() }]
                }
                Some(Err(joined)) = tasks.join_next() => {
                    error!(error = %joined, "a subtask panicked");
                    return Err(self.connector_failure(
                        made_progress,
                        ConnectorError::transient("subtask", format!("panicked: {joined}")),
                    ));
                }
                _ = stop.changed(), if !stopping => {
                    stopping = true;
                    for c in &source_controls {
                        let _ = c.send(SourceCommand::Stop);
                    }
                    vec![]
                }
                report = reports.recv() => match report.expect("the coordinator holds a report sender") {
                    Report::Ack(checkpoint, task, state) => vec![Event::Ack { checkpoint, task, state }],
                    Report::SourceFinished(i) => {
                        finished_sources[i] = true;
                        vec![]
                    }
                    Report::Committed(i, id) => {
                        committed_upto[i] = committed_upto[i].max(id);
                        let through = *committed_upto.iter().min().expect("at least one sink");
                        if through > recorded_committed {
                            recorded_committed = through;
                            recording = Some(self.record_committed(through));
                        }
                        vec![]
                    }
                    Report::Persisted(checkpoint, Ok(())) => {
                        writing = None;
                        vec![Event::Persisted { checkpoint, now_ms: now_ms() }]
                    }
                    Report::Persisted(checkpoint, Err(e)) => {
                        writing = None;
                        if let StoreError::FingerprintMismatch { .. } | StoreError::Encode { .. } = e {
                            return Err(self.store_failure(e));
                        }
                        vec![Event::PersistFailed { checkpoint, reason: e.to_string(), now_ms: now_ms() }]
                    }
                    Report::Failed(task, e) => {
                        error!(?task, error = %e, "subtask failed");
                        return Err(self.connector_failure(made_progress, e));
                    }
                }
            };
            if !want_final && finished_sources.iter().all(|f| *f) {
                info!("all sources finished: taking the final checkpoint");
                want_final = true;
                coordinator.handle(Event::RequestCheckpoint);
            }
            for event in events {
                for action in coordinator.handle(event) {
                    match action {
                        Action::Trigger { checkpoint } => {
                            if reserved.is_none_or(|r| checkpoint > r) {
                                let upto = CheckpointId(checkpoint.0 + ID_RESERVATION_BLOCK);
                                let store = self.store.clone();
                                tokio::task::spawn_blocking(move || store.reserve_ids(upto))
                                    .await
                                    .expect("checkpoint store task panicked")
                                    .map_err(|e| self.store_failure(e))?;
                                reserved = Some(upto);
                            }
                            debug!(%checkpoint, "triggering checkpoint");
                            if want_final && final_id.is_none() {
                                final_id = Some(checkpoint);
                            }
                            triggered_at = Some((checkpoint, Instant::now()));
                            for c in &source_controls {
                                let _ = c.send(SourceCommand::Barrier(checkpoint));
                            }
                        }
                        Action::Persist { data } => {
                            let entry = CheckpointEntry::new(descriptor.clone(), data);
                            let store = self.store.clone();
                            let tx = report_tx.clone();
                            let id = entry.checkpoint.id;
                            let write = tokio::task::spawn_blocking(move || {
                                fault::point("coordinator.before_persist");
                                fault::pause_blocking("coordinator.before_persist");
                                let result = store.save(&entry);
                                if result.is_ok() {
                                    fault::point("coordinator.after_persist");
                                }
                                let _ = tx.send(Report::Persisted(id, result));
                            });
                            *self.persisting.lock().unwrap_or_else(|e| e.into_inner()) = Some(write);
                            writing = Some(CheckpointWrite {
                                checkpoint: id,
                                started: Instant::now(),
                                last_report: None,
                            });
                        }
                        Action::Complete { checkpoint } => {
                            let duration = triggered_at
                                .filter(|(id, _)| *id == checkpoint)
                                .map(|(_, t)| t.elapsed().as_millis() as u64)
                                .unwrap_or_default();
                            info!(%checkpoint, duration_ms = duration, "checkpoint complete");
                            self.metrics.checkpoint_completed(checkpoint.0, duration);
                            made_progress = true;
                            last_completed = Some(checkpoint);
                            if final_id == Some(checkpoint) {
                                final_completed = true;
                            }
                            let at = Instant::now();
                            for c in &sink_controls {
                                let _ = c.send((checkpoint, at));
                            }
                            for c in &source_controls {
                                let _ = c.send(SourceCommand::Complete(checkpoint));
                            }
                        }
                        Action::Abort { checkpoint, reason } => {
                            warn!(%checkpoint, %reason, "checkpoint aborted; its transactions roll into the next checkpoint");
                            self.metrics.checkpoint_failed();
                            if final_id == Some(checkpoint) {
                                final_id = None;
                                coordinator.handle(Event::RequestCheckpoint);
                            }
                        }
                        Action::Fail { failures, reason } => {
                            return Err(self.fail(
                                true,
                                made_progress,
                                PipelineError::TooManyCheckpointFailures {
                                    pipeline: self.config.name.clone(),
                                    failures,
                                    tolerated: self.config.checkpoint.tolerable_failures,
                                    reason,
                                },
                            ));
                        }
                    }
                }
            }
            if let (true, Some(id)) = (final_completed, final_id) {
                if committed_upto.iter().all(|c| *c >= id) {
                    info!(checkpoint = %id, "final checkpoint committed; stopping");
                    tasks.abort_all();
                    if let Some(recording) = recording.take() {
                        let _ = recording.await;
                    }
                    return Ok(RunSummary {
                        last_checkpoint: last_completed,
                        metrics: self.metrics.snapshot(),
                    });
                }
            }
        }
    }
}

async fn send(output: &mpsc::Sender<Msg>, msg: Msg) -> Result<(), ConnectorError> {
    output
        .send(msg)
        .await
        .map_err(|_| ConnectorError::transient("source", "a sink subtask stopped"))
}

struct SourceTask {
    index: usize,
    source: Box<dyn Source>,
    /// One channel per sink subtask.
    outputs: Vec<mpsc::Sender<Msg>>,
    batch_size: usize,
    reports: mpsc::UnboundedSender<Report>,
    metrics: Arc<Metrics>,
}

impl SourceTask {
    async fn run(mut self, mut control: mpsc::UnboundedReceiver<SourceCommand>) {
        let task = TaskId::Source(self.index);
        if let Err(e) = self.run_inner(&mut control).await {
            let _ = self.reports.send(Report::Failed(task, e));
        }
    }

    async fn emit(&mut self, records: Vec<Record>) -> Result<(), ConnectorError> {
        let p = self.outputs.len();
        let mut per_sink: Vec<Vec<Record>> = (0..p).map(|_| Vec::new()).collect();
        for r in records {
            per_sink[route(&r.split, p)].push(r);
        }
        for (i, batch) in per_sink.into_iter().enumerate() {
            if !batch.is_empty() {
                send(&self.outputs[i], Msg::Records(batch)).await?;
            }
        }
        Ok(())
    }

    async fn run_inner(&mut self, control: &mut mpsc::UnboundedReceiver<SourceCommand>) -> Result<(), ConnectorError> {
        let mut finished = false;
        loop {
            // Commands first, so barriers are not delayed behind data.
            let command = if finished {
                match control.recv().await {
                    Some(c) => Some(c),
                    None => return Ok(()),
                }
            } else {
                match control.try_recv() {
                    Ok(c) => Some(c),
                    Err(mpsc::error::TryRecvError::Empty) => None,
                    Err(mpsc::error::TryRecvError::Disconnected) => return Ok(()),
                }
            };
            if let Some(command) = command {
                match command {
                    SourceCommand::Barrier(id) => {
                        let position: SplitPositions = self.source.position(id);
                        for output in &self.outputs {
                            send(output, Msg::Barrier(id)).await?;
                        }
                        debug!(checkpoint = %id, "barrier emitted");
                        let state = TaskState::Source(position);
                        let _ = self.reports.send(Report::Ack(id, TaskId::Source(self.index), state));
                    }
                    SourceCommand::Complete(id) => {
                        // Progress publishing only (e.g. consumer-group offsets for lag
                        // tools): a failure here must not restart the pipeline.
                        if let Err(e) = self.source.checkpoint_complete(id).await {
                            warn!(checkpoint = %id, error = %e, "source could not publish checkpoint progress");
                        }
                    }
                    SourceCommand::Stop => {
                        if !finished {
                            finished = true;
                            let _ = self.reports.send(Report::SourceFinished(self.index));
                        }
                    }
                }
                continue;
            }
            match self.source.poll(self.batch_size).await? {
                Poll::Records(records) if records.is_empty() => {}
                Poll::Records(records) => {
                    self.metrics.add_in(records.len() as u64);
                    self.emit(records).await?;
                    fault::point("source.after_emit");
                }
                Poll::Finished => {
                    finished = true;
                    info!("source finished");
                    let _ = self.reports.send(Report::SourceFinished(self.index));
                }
            }
        }
    }
}

struct SinkTask {
    index: usize,
    sink: Box<dyn ErasedSink>,
    guarantee: Guarantee,
    ledger: CommitLedger,
    /// Highest barrier id seen per input.
    barrier_seen: Vec<CheckpointId>,
    /// Inputs held back during alignment (exactly-once only).
    blocked: Vec<bool>,
    /// Inputs whose source has gone.
    closed: Vec<bool>,
    /// Where the next scan over the inputs starts (fairness).
    next_input: usize,
    last_snapshot: CheckpointId,
    reports: mpsc::UnboundedSender<Report>,
    metrics: Arc<Metrics>,
}

impl SinkTask {
    async fn run(
        mut self,
        mut inputs: Vec<mpsc::Receiver<Msg>>,
        mut control: mpsc::UnboundedReceiver<(CheckpointId, Instant)>,
    ) {
        let result = async {
            loop {
                tokio::select! {
                    biased;
                    c = control.recv() => match c {
                        Some((id, at)) => self.commit_up_to(id, at).await?,
                        None => return Ok(()),
                    },
                    m = self.next_message(&mut inputs) => match m {
                        Some((from, msg)) => self.process(from, msg).await?,
                        None => std::future::pending::<()>().await,
                    },
                }
            }
        }
        .await;
        if let Err(e) = result {
            if let Err(abort_error) = self.sink.abort().await {
                warn!(error = %abort_error, "abort after failure failed; recovery will clean up");
            }
            let _ = self.reports.send(Report::Failed(TaskId::Sink(self.index), e));
        }
    }

    /// The next message from an input that is not held back by alignment (held
    /// inputs are not read, so their sources feel back-pressure), or `None`
    /// once every source has gone.
    fn next_message<'a>(
        &'a mut self,
        inputs: &'a mut [mpsc::Receiver<Msg>],
    ) -> impl Future<Output = Option<(usize, Msg)>> + 'a {
        std::future::poll_fn(move |cx| {
            let n = inputs.len();
            for k in 0..n {
                let i = (self.next_input + k) % n;
                if self.blocked[i] || self.closed[i] {
                    continue;
                }
                match inputs[i].poll_recv(cx) {
                    std::task::Poll::Ready(Some(msg)) => {
                        self.next_input = (i + 1) % n;
                        return std::task::Poll::Ready(Some((i, msg)));
                    }
                    std::task::Poll::Ready(None) => self.closed[i] = true,
                    std::task::Poll::Pending => {}
                }
            }
            if self.closed.iter().all(|c| *c) {
                std::task::Poll::Ready(None)
            } else {
                std::task::Poll::Pending
            }
        })
    }

    async fn commit_up_to(&mut self, id: CheckpointId, completed_at: Instant) -> Result<(), ConnectorError> {
        let due = self.ledger.due(id);
        for (checkpoint, committable) in &due {
            self.sink
                .commit(committable)
                .instrument(info_span!("commit", checkpoint = %checkpoint))
                .await?;
            self.ledger.mark_committed(*checkpoint);
            self.metrics.committed(completed_at.elapsed().as_micros() as u64);
        }
        if !due.is_empty() {
            fault::point("sink.after_commit");
        }
        let _ = self.reports.send(Report::Committed(self.index, id));
        Ok(())
    }

    async fn process(&mut self, from: usize, msg: Msg) -> Result<(), ConnectorError> {
        match msg {
            Msg::Records(records) => {
                let interval = self.last_snapshot.next();
                self.sink.write(interval, &records).await?;
                self.metrics.add_out(records.len() as u64);
            }
            Msg::Barrier(id) => {
                self.barrier_seen[from] = self.barrier_seen[from].max(id);
                if self.guarantee == Guarantee::ExactlyOnce {
                    self.blocked[from] = true;
                }
                let aligned = *self.barrier_seen.iter().min().expect("at least one input");
                if aligned > self.last_snapshot {
                    self.snapshot(aligned).await?;
                }
            }
        }
        Ok(())
    }

    async fn snapshot(&mut self, id: CheckpointId) -> Result<(), ConnectorError> {
        let committable = self
            .sink
            .pre_commit()
            .instrument(info_span!("pre_commit", checkpoint = %id))
            .await?;
        match (self.guarantee, committable) {
            (Guarantee::ExactlyOnce, Some(c)) => {
                self.ledger.add(id, c);
                fault::point("sink.after_pre_commit");
                fault::pause("sink.after_pre_commit").await;
            }
            (Guarantee::AtLeastOnce, Some(c)) => {
                self.sink.commit(&c).await?;
                fault::point("sink.after_pre_commit");
                fault::pause("sink.after_pre_commit").await;
            }
            (_, None) => {}
        }
        self.last_snapshot = id;
        self.blocked.iter_mut().for_each(|b| *b = false);
        let state = TaskState::Sink(self.ledger.snapshot());
        let _ = self.reports.send(Report::Ack(id, TaskId::Sink(self.index), state));
        Ok(())
    }
}
