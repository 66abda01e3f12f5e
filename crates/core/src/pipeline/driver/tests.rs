//! The real driver on paused time, against recorded effects whose store
//! answers each test decides. Every test is named after the guarantee it
//! checks; the process-level crash tests (`tests/crash_matrix.rs` and the
//! others) check the same guarantees through the binary.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::{Driver, DriverSettings};
use crate::coordinator::{CheckpointConfig, CheckpointData, PendingCommit, TaskId, TaskState};
use crate::error::StoreError;
use crate::metrics::Metrics;
use crate::pipeline::effects::Effects;
use crate::pipeline::messages::{PersistOutcome, Report};
use crate::pipeline::AttemptFailure;
use crate::record::{CheckpointId, SplitPositions};

/// What the driver did, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Did {
    Reserve(u64),
    Persist(u64),
    RecordCommitted(u64),
    Trigger(u64),
    Complete(u64),
    StopSources,
    CloseSinks,
    StopSubtasks,
}

/// Effects that only record; persist outcomes come from the test.
struct Recorded {
    log: Arc<Mutex<Vec<Did>>>,
    /// Persisted entries' contents, by id.
    persisted: Arc<Mutex<Vec<CheckpointData>>>,
    fail_reservations: bool,
}

fn io_error(what: &str) -> StoreError {
    StoreError::Access(crate::store::AccessError::determinate(
        "/checkpoints/p",
        "writing",
        std::io::Error::other(what.to_string()),
    ))
}

#[async_trait]
impl Effects for Recorded {
    async fn reserve_ids(&mut self, upto: CheckpointId) -> Result<(), StoreError> {
        if self.fail_reservations {
            return Err(io_error("disk full"));
        }
        self.log.lock().unwrap().push(Did::Reserve(upto.0));
        Ok(())
    }

    fn persist(&mut self, data: CheckpointData) {
        self.log.lock().unwrap().push(Did::Persist(data.id.0));
        self.persisted.lock().unwrap().push(data);
    }

    fn record_committed(&mut self, id: CheckpointId) {
        self.log.lock().unwrap().push(Did::RecordCommitted(id.0));
    }

    async fn settle(&mut self) {}

    fn trigger(&mut self, checkpoint: CheckpointId) {
        self.log.lock().unwrap().push(Did::Trigger(checkpoint.0));
    }

    fn complete(&mut self, checkpoint: CheckpointId, _at: tokio::time::Instant) {
        self.log.lock().unwrap().push(Did::Complete(checkpoint.0));
    }

    fn stop_sources(&mut self) {
        self.log.lock().unwrap().push(Did::StopSources);
    }

    async fn close_sinks(&mut self) {
        self.log.lock().unwrap().push(Did::CloseSinks);
    }

    async fn panicked(&mut self) -> tokio::task::JoinError {
        std::future::pending().await
    }

    fn stop_subtasks(&mut self) {
        self.log.lock().unwrap().push(Did::StopSubtasks);
    }

    fn store_location(&self) -> String {
        "/checkpoints/p".into()
    }
}

/// A running driver of one region with source 0 and sink 0 (or sinks 0
/// and 1 with `sinks = 2`), and the test's ends of its channels.
struct Harness {
    log: Arc<Mutex<Vec<Did>>>,
    persisted: Arc<Mutex<Vec<CheckpointData>>>,
    metrics: Arc<Metrics>,
    reports: mpsc::UnboundedSender<Report>,
    stop: watch::Sender<bool>,
    driver: JoinHandle<Result<Option<CheckpointId>, AttemptFailure>>,
}

struct Start {
    sinks: usize,
    restored: Option<u64>,
    reserved: Option<u64>,
    fail_reservations: bool,
}

impl Default for Start {
    fn default() -> Self {
        Start {
            sinks: 1,
            restored: None,
            reserved: None,
            fail_reservations: false,
        }
    }
}

fn checkpointing() -> CheckpointConfig {
    CheckpointConfig {
        interval: Duration::from_millis(100),
        min_pause: Duration::ZERO,
        timeout: Duration::from_secs(1),
        tolerable_failures: 3,
    }
}

impl Harness {
    fn start(start: Start) -> Harness {
        let log = Arc::new(Mutex::new(Vec::new()));
        let persisted = Arc::new(Mutex::new(Vec::new()));
        let metrics = Arc::new(Metrics::default());
        let (reports, reports_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = vec![TaskId::Source(0)];
        tasks.extend((0..start.sinks).map(TaskId::Sink));
        let settings = DriverSettings {
            pipeline: "p".into(),
            region: Some(0),
            checkpoint: checkpointing(),
            tasks,
        };
        let effects = Recorded {
            log: log.clone(),
            persisted: persisted.clone(),
            fail_reservations: start.fail_reservations,
        };
        let driver = Driver::new(
            settings,
            metrics.clone(),
            effects,
            reports_rx,
            start.restored.map(CheckpointId),
            start.reserved.map(CheckpointId),
        );
        Harness {
            log,
            persisted,
            metrics,
            reports,
            stop,
            driver: tokio::spawn(driver.run(stop_rx)),
        }
    }

    fn did(&self) -> Vec<Did> {
        self.log.lock().unwrap().clone()
    }

    /// Lets (paused) time run until the driver did `what`; at most a
    /// simulated minute.
    async fn wait_for(&self, what: Did) {
        for _ in 0..60_000 {
            if self.did().contains(&what) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("the driver never did {what:?}; it did {:?}", self.did());
    }

    /// Lets a simulated `d` pass.
    async fn let_pass(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Source 0 and every sink acknowledge checkpoint `n`; each sink lists
    /// one transaction for every id in `pending`.
    fn ack(&self, n: u64, sinks: usize, pending: &[u64]) {
        let send = |r| self.reports.send(r).expect("the driver runs");
        send(Report::Ack(
            CheckpointId(n),
            TaskId::Source(0),
            TaskState::Source(SplitPositions::default()),
        ));
        for sink in 0..sinks {
            let listed = pending
                .iter()
                .map(|&c| PendingCommit {
                    checkpoint: CheckpointId(c),
                    committable: serde_json::json!(format!("tx-{sink}-{c}")),
                })
                .collect();
            send(Report::Ack(
                CheckpointId(n),
                TaskId::Sink(sink),
                TaskState::Sink(listed),
            ));
        }
    }

    fn persisted(&self, n: u64, outcome: PersistOutcome) {
        self.reports
            .send(Report::Persisted(CheckpointId(n), outcome))
            .expect("the driver runs");
    }

    async fn result(self) -> Result<Option<CheckpointId>, AttemptFailure> {
        tokio::time::timeout(Duration::from_secs(60), self.driver)
            .await
            .expect("the driver ends")
            .expect("the driver does not panic")
    }
}

fn position(log: &[Did], what: &Did) -> usize {
    log.iter()
        .position(|d| d == what)
        .unwrap_or_else(|| panic!("{what:?} not in {log:?}"))
}

#[tokio::test(start_paused = true)]
async fn no_commit_before_persist() {
    let h = Harness::start(Start::default());
    h.wait_for(Did::Trigger(1)).await;
    h.ack(1, 1, &[1]);
    h.wait_for(Did::Persist(1)).await;
    h.let_pass(Duration::from_millis(900)).await;
    assert!(
        !h.did().contains(&Did::Complete(1)),
        "every task acknowledged, the write has not landed: nothing commits ({:?})",
        h.did()
    );
    h.persisted(1, PersistOutcome::Persisted);
    h.wait_for(Did::Complete(1)).await;
    let log = h.did();
    assert!(position(&log, &Did::Persist(1)) < position(&log, &Did::Complete(1)));
    assert_eq!(
        h.persisted.lock().unwrap()[0].pending[&0].len(),
        1,
        "the entry lists it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_persist_is_waited_for_never_abandoned() {
    let h = Harness::start(Start::default());
    h.wait_for(Did::Trigger(1)).await;
    h.ack(1, 1, &[1]);
    h.wait_for(Did::Persist(1)).await;
    // Ten checkpoint timeouts: the write is reported, not aborted, and no
    // later checkpoint starts beside it.
    h.let_pass(Duration::from_secs(10)).await;
    assert_eq!(h.metrics.snapshot().checkpoints_failed, 0, "not aborted");
    assert_eq!(h.metrics.snapshot().slow_persists, 1, "reported once");
    assert!(!h.did().contains(&Did::Trigger(2)), "{:?}", h.did());
    h.persisted(1, PersistOutcome::Persisted);
    h.wait_for(Did::Complete(1)).await;
    h.wait_for(Did::Trigger(2)).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_persist_commits_nothing() {
    let h = Harness::start(Start::default());
    h.wait_for(Did::Trigger(1)).await;
    h.ack(1, 1, &[1]);
    h.wait_for(Did::Persist(1)).await;
    h.persisted(1, PersistOutcome::Failed(io_error("no space left")));
    h.wait_for(Did::Trigger(2)).await;
    assert_eq!(h.metrics.snapshot().checkpoints_failed, 1, "aborted");
    // Its transaction rolls into the next checkpoint, which commits it.
    h.ack(2, 1, &[1, 2]);
    h.wait_for(Did::Persist(2)).await;
    h.persisted(2, PersistOutcome::Persisted);
    h.wait_for(Did::Complete(2)).await;
    assert!(!h.did().contains(&Did::Complete(1)), "{:?}", h.did());
    let listed: Vec<u64> = h.persisted.lock().unwrap()[1].pending[&0]
        .iter()
        .map(|p| p.checkpoint.0)
        .collect();
    assert_eq!(listed, vec![1, 2]);
}

#[tokio::test(start_paused = true)]
async fn an_indeterminate_persist_restarts_the_region_without_commit_or_abort() {
    let h = Harness::start(Start::default());
    h.wait_for(Did::Trigger(1)).await;
    h.ack(1, 1, &[1]);
    h.wait_for(Did::Persist(1)).await;
    h.persisted(
        1,
        PersistOutcome::Indeterminate(io_error("connection closed after COMMIT was sent")),
    );
    let log = h.log.clone();
    let metrics = h.metrics.clone();
    let failure = h.result().await.expect_err("the attempt ends");
    assert!(failure.retriable, "the region restarts and reads the store again");
    let log = log.lock().unwrap().clone();
    assert!(!log.contains(&Did::Complete(1)), "no commit: {log:?}");
    assert_eq!(metrics.snapshot().checkpoints_failed, 0, "no abort either");
    assert_eq!(log.last(), Some(&Did::StopSubtasks), "{log:?}");
    assert!(!log.contains(&Did::Trigger(2)), "nothing more: {log:?}");
    assert!(
        !log.contains(&Did::CloseSinks),
        "a failed attempt closes nothing: {log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fenced_persist_drops_the_region_without_commit() {
    let h = Harness::start(Start::default());
    h.wait_for(Did::Trigger(1)).await;
    h.ack(1, 1, &[1]);
    h.wait_for(Did::Persist(1)).await;
    h.persisted(1, PersistOutcome::Fenced(io_error("epoch 3 is taken")));
    let log = h.log.clone();
    let metrics = h.metrics.clone();
    h.result().await.expect_err("the attempt ends");
    assert_eq!(metrics.snapshot().fenced_writes, 1, "counted");
    let log = log.lock().unwrap().clone();
    assert!(!log.contains(&Did::Complete(1)), "{log:?}");
    assert_eq!(log.last(), Some(&Did::StopSubtasks), "{log:?}");
    assert!(
        !log.contains(&Did::CloseSinks),
        "a dropped region closes nothing: {log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn ids_are_reserved_before_the_barriers_that_use_them() {
    let h = Harness::start(Start {
        restored: Some(5),
        reserved: Some(107),
        ..Start::default()
    });
    h.wait_for(Did::Trigger(108)).await;
    assert_eq!(
        h.did(),
        vec![Did::Reserve(208), Did::Trigger(108)],
        "above every id used before"
    );
    h.ack(108, 1, &[108]);
    h.wait_for(Did::Persist(108)).await;
    h.persisted(108, PersistOutcome::Persisted);
    h.wait_for(Did::Trigger(109)).await;
    assert_eq!(
        h.did().iter().filter(|d| matches!(d, Did::Reserve(_))).count(),
        1,
        "109 is inside the reserved block"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_reservation_triggers_nothing() {
    let h = Harness::start(Start {
        fail_reservations: true,
        ..Start::default()
    });
    let log = h.log.clone();
    let failure = h.result().await.expect_err("the attempt ends");
    assert!(failure.retriable);
    assert_eq!(*log.lock().unwrap(), vec![Did::StopSubtasks]);
}

#[tokio::test(start_paused = true)]
async fn commits_are_recorded_once_every_sink_committed() {
    let h = Harness::start(Start {
        sinks: 2,
        ..Start::default()
    });
    h.wait_for(Did::Trigger(1)).await;
    h.ack(1, 2, &[1]);
    h.wait_for(Did::Persist(1)).await;
    h.persisted(1, PersistOutcome::Persisted);
    h.wait_for(Did::Complete(1)).await;
    h.reports.send(Report::Committed(0, CheckpointId(1))).unwrap();
    h.let_pass(Duration::from_millis(50)).await;
    assert!(!h.did().contains(&Did::RecordCommitted(1)), "sink 1 has not committed");
    h.reports.send(Report::Committed(1, CheckpointId(1))).unwrap();
    h.wait_for(Did::RecordCommitted(1)).await;
}

#[tokio::test(start_paused = true)]
async fn the_final_checkpoint_is_committed_before_the_region_stops() {
    let h = Harness::start(Start::default());
    h.wait_for(Did::Trigger(1)).await;
    h.ack(1, 1, &[1]);
    h.persisted(1, PersistOutcome::Persisted);
    h.wait_for(Did::Complete(1)).await;
    h.stop.send(true).unwrap();
    h.wait_for(Did::StopSources).await;
    h.reports.send(Report::SourceFinished(0)).unwrap();
    h.wait_for(Did::Trigger(2)).await;
    h.ack(2, 1, &[2]);
    h.wait_for(Did::Persist(2)).await;
    h.persisted(2, PersistOutcome::Persisted);
    h.wait_for(Did::Complete(2)).await;
    h.let_pass(Duration::from_millis(500)).await;
    assert!(
        !h.driver.is_finished(),
        "the sink has not committed the final checkpoint"
    );
    assert!(
        !h.did().contains(&Did::CloseSinks),
        "no sink closes before the final checkpoint is committed: {:?}",
        h.did()
    );
    assert!(
        !h.did().contains(&Did::Trigger(3)),
        "nothing is triggered after the final checkpoint (five intervals passed): {:?}",
        h.did()
    );
    h.reports.send(Report::Committed(0, CheckpointId(2))).unwrap();
    let log = h.log.clone();
    assert_eq!(h.result().await.ok(), Some(Some(CheckpointId(2))));
    let log = log.lock().unwrap().clone();
    assert!(position(&log, &Did::RecordCommitted(2)) < position(&log, &Did::StopSubtasks));
    // Closed once committed, and only then stopped: a sink's close (its
    // locks released for the next holder) comes after everything it had.
    assert!(position(&log, &Did::Complete(2)) < position(&log, &Did::CloseSinks));
    assert!(position(&log, &Did::CloseSinks) < position(&log, &Did::StopSubtasks));
}
