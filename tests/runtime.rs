//! In-process runtime behaviour on the real file sink: metrics, restarts after
//! transient failures, fatal errors, checkpoint timeouts whose transactions roll
//! into the next checkpoint, and graceful shutdown.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use exactly::core::membership::Epoch;
use exactly::core::store::{AccessError, Cas, Head, Layout, Listed, Marks, Removal, StoreLock};
use exactly::core::{
    CheckpointConfig, CheckpointId, CheckpointStore, ConnectorError, EntryName, ErasedSink, Failover,
    FsCheckpointStore, Pipeline, PipelineConfig, PipelineError, Record, RestartStrategy, Scope, SequenceSourceFactory,
    SequenceStore, SinkContext, SinkFactory, StoreError,
};
use exactly::file::{read_committed_lines, FileSinkFactory};

/// Wraps the file sink and injects failures or delays — an adapter around a
/// real sink, not a stand-in for it.
struct Faulty {
    inner: FileSinkFactory,
    writes: Arc<AtomicU32>,
    pre_commits: Arc<AtomicU32>,
    fail_write_at: Option<(u32, bool)>,
    slow_pre_commit_at: Option<(u32, Duration)>,
}

struct FaultySink {
    inner: Box<dyn ErasedSink>,
    writes: Arc<AtomicU32>,
    pre_commits: Arc<AtomicU32>,
    fail_write_at: Option<(u32, bool)>,
    slow_pre_commit_at: Option<(u32, Duration)>,
}

impl SinkFactory for Faulty {
    fn identity(&self) -> String {
        self.inner.identity()
    }
    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        Ok(Box::new(FaultySink {
            inner: self.inner.create(context)?,
            writes: self.writes.clone(),
            pre_commits: self.pre_commits.clone(),
            fail_write_at: self.fail_write_at,
            slow_pre_commit_at: self.slow_pre_commit_at,
        }))
    }
}

#[async_trait]
impl ErasedSink for FaultySink {
    async fn recover(&mut self, pending: &[serde_json::Value]) -> Result<(), ConnectorError> {
        self.inner.recover(pending).await
    }
    async fn write(&mut self, checkpoint: CheckpointId, batch: &[Record]) -> Result<(), ConnectorError> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((at, fatal)) = self.fail_write_at {
            if n == at {
                return Err(if fatal {
                    ConnectorError::fatal("test sink", "permission denied")
                } else {
                    ConnectorError::transient("test sink", "connection reset")
                });
            }
        }
        self.inner.write(checkpoint, batch).await
    }
    async fn pre_commit(&mut self) -> Result<Option<serde_json::Value>, ConnectorError> {
        let n = self.pre_commits.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((at, delay)) = self.slow_pre_commit_at {
            if n == at {
                tokio::time::sleep(delay).await;
            }
        }
        self.inner.pre_commit().await
    }
    async fn commit(&mut self, committable: &serde_json::Value) -> Result<(), ConnectorError> {
        self.inner.commit(committable).await
    }
    async fn abort(&mut self) -> Result<(), ConnectorError> {
        self.inner.abort().await
    }
    async fn check_replay_after(
        &mut self,
        checkpoint: CheckpointId,
    ) -> Result<exactly::core::ReplayCheck, ConnectorError> {
        self.inner.check_replay_after(checkpoint).await
    }
}

const SPLITS: usize = 3;
const PER_SPLIT: i64 = 600;

fn source() -> SequenceSourceFactory {
    SequenceSourceFactory {
        splits: SPLITS,
        records_per_split: PER_SPLIT,
        batch: 20,
        delay_per_poll: Duration::from_millis(2),
    }
}

fn pipeline(dir: &Path, sink: Faulty, tweak: impl FnOnce(&mut PipelineConfig)) -> Pipeline {
    let mut config = PipelineConfig::new("runtime-test");
    config.parallelism = 2;
    config.checkpoint = CheckpointConfig {
        interval: Duration::from_millis(40),
        ..CheckpointConfig::default()
    };
    config.restart = RestartStrategy::FixedDelay {
        delay: Duration::from_millis(10),
        max_attempts: 3,
    };
    tweak(&mut config);
    Pipeline::new(
        config,
        Arc::new(source()),
        Arc::new(sink),
        Arc::new(FsCheckpointStore::new(dir.join("checkpoints"), "runtime-test", 3)),
    )
    .unwrap()
}

fn faulty(dir: &Path) -> Faulty {
    Faulty {
        inner: FileSinkFactory::new(dir.join("out")),
        writes: Arc::default(),
        pre_commits: Arc::default(),
        fail_write_at: None,
        slow_pre_commit_at: None,
    }
}

fn assert_exactly_once(dir: &Path) {
    let lines = read_committed_lines(&dir.join("out")).unwrap();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for l in lines {
        *counts.entry(l).or_default() += 1;
    }
    let expected = source().expected_values();
    assert_eq!(counts.len(), expected.len(), "missing or unexpected records");
    assert!(counts.values().all(|c| *c == 1), "duplicates in the output");
    assert!(expected.iter().all(|e| counts.contains_key(e)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_run_reports_its_counters() {
    let dir = tempfile::tempdir().unwrap();
    // One checkpoint sequence, whose last id the counters report.
    let p = pipeline(dir.path(), faulty(dir.path()), |c| c.failover = Failover::Global);
    let summary = p.run(std::future::pending()).await.unwrap();
    assert_exactly_once(dir.path());
    let m = summary.metrics;
    let total = (SPLITS as u64) * PER_SPLIT as u64;
    assert_eq!((m.records_in, m.records_out), (total, total));
    assert!(m.checkpoints_completed >= 2, "{m:?}");
    assert_eq!(m.last_completed_checkpoint, summary.last_checkpoint.unwrap().0);
    assert!(m.commits >= 2 && m.commit_latency_max_us > 0, "{m:?}");
    assert_eq!((m.checkpoints_failed, m.restarts), (0, 0));
    assert_eq!(p.metrics().snapshot().records_in, total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_restarts_from_the_last_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = faulty(dir.path());
    sink.fail_write_at = Some((40, false));
    let p = pipeline(dir.path(), sink, |_| {});
    let summary = p.run(std::future::pending()).await.unwrap();
    assert_eq!(summary.metrics.restarts, 1);
    assert!(
        summary.metrics.records_in > (SPLITS as u64) * PER_SPLIT as u64,
        "records were replayed"
    );
    assert_exactly_once(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_failure_stops_the_pipeline_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = faulty(dir.path());
    sink.fail_write_at = Some((5, true));
    let p = pipeline(dir.path(), sink, |_| {});
    let err = p.run(std::future::pending()).await.unwrap_err();
    assert!(matches!(err, PipelineError::Connector { .. }), "{err}");
    assert!(err.to_string().contains("permission denied"), "{err}");
    assert_eq!(p.metrics().snapshot().restarts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_give_up_after_the_strategys_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = faulty(dir.path());
    sink.fail_write_at = Some((1, false));
    // Fails on the very first write of the first attempt only; with no restarts
    // allowed the pipeline must give up instead of looping.
    let p = pipeline(dir.path(), sink, |c| c.restart = RestartStrategy::None);
    let err = p.run(std::future::pending()).await.unwrap_err();
    assert!(matches!(err, PipelineError::RestartsExhausted { .. }), "{err}");
    assert!(err.to_string().contains("connection reset"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_checkpoint_rolls_its_transactions_into_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = faulty(dir.path());
    sink.slow_pre_commit_at = Some((3, Duration::from_millis(300)));
    let p = pipeline(dir.path(), sink, |c| {
        c.checkpoint.timeout = Duration::from_millis(100);
        c.checkpoint.tolerable_failures = 5;
    });
    let summary = p.run(std::future::pending()).await.unwrap();
    assert!(summary.metrics.checkpoints_failed >= 1, "{:?}", summary.metrics);
    assert_eq!(summary.metrics.restarts, 0);
    assert_exactly_once(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_failed_checkpoints_fail_the_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = faulty(dir.path());
    sink.slow_pre_commit_at = Some((1, Duration::from_millis(400)));
    let p = pipeline(dir.path(), sink, |c| {
        c.checkpoint.timeout = Duration::from_millis(50);
        c.checkpoint.tolerable_failures = 0;
        c.restart = RestartStrategy::None;
    });
    let err = p.run(std::future::pending()).await.unwrap_err();
    assert!(err.to_string().contains("consecutive checkpoints failed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_takes_a_last_checkpoint_and_commits_it() {
    let dir = tempfile::tempdir().unwrap();
    let slow = SequenceSourceFactory {
        delay_per_poll: Duration::from_millis(20),
        ..source()
    };
    let mut config = PipelineConfig::new("shutdown");
    config.parallelism = 2;
    config.checkpoint.interval = Duration::from_secs(3600);
    let p = Pipeline::new(
        config,
        Arc::new(slow),
        Arc::new(FileSinkFactory::new(dir.path().join("out"))),
        Arc::new(FsCheckpointStore::new(dir.path().join("checkpoints"), "shutdown", 3)),
    )
    .unwrap();
    let summary = p.run(tokio::time::sleep(Duration::from_millis(300))).await.unwrap();
    let lines = read_committed_lines(&dir.path().join("out")).unwrap();
    assert!(!lines.is_empty(), "the last checkpoint was committed");
    assert_eq!(
        lines.len() as u64,
        summary.metrics.records_in,
        "everything read was committed"
    );
    assert!(
        lines.len() < SPLITS * PER_SPLIT as usize,
        "stopped before the end of the input"
    );
    assert_eq!(summary.last_checkpoint, Some(CheckpointId(1)));
}

/// A checkpoint store whose write of checkpoint `slow_id` takes `delay`,
/// and whose deletion of old entries fails when `fail_prune` is set: an
/// adapter around the real folder store, every sequence the same.
#[derive(Clone)]
struct SlowStore {
    inner: Arc<dyn CheckpointStore>,
    slow_id: CheckpointId,
    delay: Duration,
    fail_prune: bool,
}

/// One sequence of a [`SlowStore`].
struct SlowSequence {
    inner: Arc<dyn SequenceStore>,
    store: SlowStore,
}

#[async_trait]
impl CheckpointStore for SlowStore {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn retain(&self) -> usize {
        self.inner.retain()
    }
    fn sequence(&self, scope: Scope) -> Arc<dyn SequenceStore> {
        Arc::new(SlowSequence {
            inner: self.inner.sequence(scope),
            store: self.clone(),
        })
    }
    async fn regions(&self) -> Result<Vec<usize>, AccessError> {
        self.inner.regions().await
    }
    async fn layout(&self) -> Result<Option<Layout>, AccessError> {
        self.inner.layout().await
    }
    async fn record_layout(
        &self,
        expected: Option<Layout>,
        layout: Layout,
    ) -> Result<Cas<(), Option<Layout>>, AccessError> {
        self.inner.record_layout(expected, layout).await
    }
    async fn retire(&self, scope: Scope) -> Result<(), AccessError> {
        self.inner.retire(scope).await
    }
    async fn lock(&self) -> Result<StoreLock, StoreError> {
        self.inner.lock().await
    }
}

#[async_trait]
impl SequenceStore for SlowSequence {
    fn location(&self) -> String {
        self.inner.location()
    }
    async fn head(&self) -> Result<Head, AccessError> {
        self.inner.head().await
    }
    async fn fence(&self, expected: Epoch, owner: &str) -> Result<Cas<Head>, AccessError> {
        self.inner.fence(expected, owner).await
    }
    async fn advance(&self, epoch: Epoch, marks: Marks) -> Result<Cas<Head>, AccessError> {
        self.inner.advance(epoch, marks).await
    }
    async fn list(&self) -> Result<Vec<Listed>, AccessError> {
        self.inner.list().await
    }
    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>, AccessError> {
        self.inner.read(name).await
    }
    async fn write(&self, epoch: Epoch, name: &str, bytes: Vec<u8>) -> Result<Cas<()>, AccessError> {
        if EntryName::parse(name).is_some_and(|n| n.id == self.store.slow_id) {
            tokio::time::sleep(self.store.delay).await;
        }
        self.inner.write(epoch, name, bytes).await
    }
    async fn remove(&self, epoch: Epoch, name: &str, how: Removal) -> Result<Cas<()>, AccessError> {
        if self.store.fail_prune && how == Removal::Delete {
            return Err(AccessError::determinate(
                self.inner.location(),
                format!("deleting {name}"),
                std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            ));
        }
        self.inner.remove(epoch, name, how).await
    }
}

/// A checkpoint write that outlasts the checkpoint timeout is waited for
/// (abandoning it could let a late write list rolled-back transactions),
/// reported (counted once in `slow_persists`, logged every timeout), and the
/// run still ends exactly once with no checkpoint counted as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_checkpoint_write_is_waited_for_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = PipelineConfig::new("slow-store");
    config.parallelism = 2;
    // One checkpoint sequence: one checkpoint 2, one slow write.
    config.failover = Failover::Global;
    config.checkpoint = CheckpointConfig {
        interval: Duration::from_millis(40),
        timeout: Duration::from_millis(150),
        ..CheckpointConfig::default()
    };
    let store = SlowStore {
        inner: Arc::new(FsCheckpointStore::new(dir.path().join("checkpoints"), "slow-store", 3)),
        slow_id: CheckpointId(2),
        delay: Duration::from_millis(600),
        fail_prune: false,
    };
    let p = Pipeline::new(
        config,
        Arc::new(source()),
        Arc::new(FileSinkFactory::new(dir.path().join("out"))),
        Arc::new(store),
    )
    .unwrap();
    let summary = p.run(std::future::pending()).await.unwrap();
    assert_eq!(summary.metrics.slow_persists, 1, "{:?}", summary.metrics);
    assert_eq!(summary.metrics.checkpoints_failed, 0, "{:?}", summary.metrics);
    assert_eq!(summary.metrics.restarts, 0);
    let lines = read_committed_lines(&dir.path().join("out")).unwrap();
    assert_eq!(lines.len(), SPLITS * PER_SPLIT as usize);
    let distinct: std::collections::HashSet<&String> = lines.iter().collect();
    assert_eq!(distinct.len(), lines.len(), "no duplicates");
}

/// Removing old entries is best effort: a store that cannot delete them
/// still completes every checkpoint (the new entry is durable before the
/// clean-up), and each failure is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_clean_up_of_old_entries_fails_no_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = PipelineConfig::new("no-prune");
    config.parallelism = 2;
    config.checkpoint = CheckpointConfig {
        interval: Duration::from_millis(40),
        ..CheckpointConfig::default()
    };
    config.restart = RestartStrategy::None;
    let store = SlowStore {
        inner: Arc::new(FsCheckpointStore::new(dir.path().join("checkpoints"), "no-prune", 1)),
        slow_id: CheckpointId(u64::MAX),
        delay: Duration::ZERO,
        fail_prune: true,
    };
    let p = Pipeline::new(
        config,
        Arc::new(source()),
        Arc::new(FileSinkFactory::new(dir.path().join("out"))),
        Arc::new(store),
    )
    .unwrap();
    let summary = p.run(std::future::pending()).await.expect("the run ends well");
    assert_eq!(summary.metrics.checkpoints_failed, 0, "{:?}", summary.metrics);
    assert!(summary.metrics.checkpoints_completed > 1, "{:?}", summary.metrics);
    assert_eq!(
        summary.metrics.store_cleanup_failures, summary.metrics.checkpoints_completed,
        "every clean-up after a checkpoint's save failed and was counted: {:?}",
        summary.metrics
    );
    assert_exactly_once(dir.path());
}
