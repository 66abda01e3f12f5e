//! Transforms between source and sink keep the checkpointed positions
//! right: a record a filter drops still counts as passed, so a restart
//! after a checkpoint — a failure and restart inside a run, or a new run
//! after a stop — neither replays nor skips anything, and the committed
//! output is exactly what the transforms make of the input.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use exactly_core::{
    erase, CheckpointConfig, CheckpointId, ConnectorError, ErasedSink, FsCheckpointStore, OnTransformError, Pipeline,
    PipelineConfig, Record, RestartStrategy, SequenceSourceFactory, SinkContext, SinkFactory, Transform,
    TransformError, TwoPhaseCommitSink,
};

/// Committed values per (sink subtask, checkpoint): a commit of the same
/// transaction twice writes the same entry.
type Committed = Arc<Mutex<BTreeMap<(usize, u64), Vec<String>>>>;

struct Collecting {
    subtask: usize,
    committed: Committed,
    /// Fail one write after something was committed (a restart from a
    /// checkpoint with filtered records behind it).
    fail_once: Arc<AtomicBool>,
}

type Txn = (u64, Vec<String>);

#[async_trait]
impl TwoPhaseCommitSink for Collecting {
    type Transaction = Txn;
    type Committable = Txn;

    async fn recover(&mut self, pending: &[Txn]) -> Result<(), ConnectorError> {
        for c in pending {
            self.commit(c).await?;
        }
        Ok(())
    }
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<Txn, ConnectorError> {
        Ok((checkpoint.0, Vec::new()))
    }
    async fn write(&mut self, txn: &mut Txn, batch: &[Record]) -> Result<(), ConnectorError> {
        if !self.committed.lock().unwrap().is_empty() && self.fail_once.swap(false, Ordering::SeqCst) {
            return Err(ConnectorError::transient("collecting sink", "injected failure"));
        }
        txn.1.extend(
            batch
                .iter()
                .map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap()),
        );
        Ok(())
    }
    async fn pre_commit(&mut self, txn: Txn) -> Result<Txn, ConnectorError> {
        Ok(txn)
    }
    async fn commit(&mut self, c: &Txn) -> Result<(), ConnectorError> {
        self.committed.lock().unwrap().insert((self.subtask, c.0), c.1.clone());
        Ok(())
    }
    async fn abort(&mut self, _txn: Txn) -> Result<(), ConnectorError> {
        Ok(())
    }
}

struct CollectingFactory {
    committed: Committed,
    fail_once: Arc<AtomicBool>,
    repeated_coordinates: bool,
}

impl SinkFactory for CollectingFactory {
    fn identity(&self) -> String {
        "collecting".into()
    }
    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        Ok(erase(Collecting {
            subtask: context.subtask,
            committed: self.committed.clone(),
            fail_once: self.fail_once.clone(),
        }))
    }
    fn accepts_repeated_coordinates(&self) -> bool {
        self.repeated_coordinates
    }
}

const SPLITS: usize = 2;
const RECORDS: i64 = 600;

fn source() -> SequenceSourceFactory {
    SequenceSourceFactory {
        splits: SPLITS,
        records_per_split: RECORDS,
        batch: 10,
        delay_per_poll: Duration::from_millis(5),
    }
}

fn offset_of(r: &Record) -> Result<i64, TransformError> {
    let value = std::str::from_utf8(r.value_bytes().unwrap_or_default())
        .map_err(|e| TransformError::new("not UTF-8").caused_by(e))?;
    let (_, offset) = value.rsplit_once(':').ok_or_else(|| TransformError::new("no offset"))?;
    offset
        .parse()
        .map_err(|e| TransformError::new("bad offset").caused_by(e))
}

/// Drop multiples of 3, upper-case, split multiples of 5 in two.
fn transforms() -> Vec<Transform> {
    vec![
        Transform::filter("not-multiples-of-3", |r| Ok(offset_of(r)? % 3 != 0)),
        Transform::map("upper-case", |mut r| {
            let upper = String::from_utf8_lossy(r.value_bytes().unwrap_or_default()).to_uppercase();
            r.value = Some(upper.into());
            Ok(r)
        }),
        Transform::flat_map("halves-of-multiples-of-5", |r| {
            if offset_of(&r)? % 5 != 0 {
                return Ok(vec![r]);
            }
            let v = String::from_utf8_lossy(r.value_bytes().unwrap_or_default()).to_string();
            Ok(vec![
                Record::new("ignored", -1, format!("{v}#a")),
                Record::new("ignored", -1, format!("{v}#b")),
            ])
        }),
    ]
}

/// What the transforms make of the source's records, computed from the
/// source's definition alone.
fn expected() -> Vec<String> {
    let mut all = Vec::new();
    for split in 0..SPLITS {
        for offset in (0..RECORDS).filter(|o| o % 3 != 0) {
            let v = SequenceSourceFactory::value_of(split, offset).to_uppercase();
            if offset % 5 == 0 {
                all.push(format!("{v}#a"));
                all.push(format!("{v}#b"));
            } else {
                all.push(v);
            }
        }
    }
    all.sort();
    all
}

fn committed_values(committed: &Committed) -> Vec<String> {
    let mut all: Vec<String> = committed.lock().unwrap().values().flatten().cloned().collect();
    all.sort();
    all
}

fn pipeline(root: &std::path::Path, sink: CollectingFactory) -> Pipeline {
    let mut config = PipelineConfig::new("transformed");
    config.parallelism = 2;
    config.checkpoint = CheckpointConfig {
        interval: Duration::from_millis(30),
        ..CheckpointConfig::default()
    };
    config.restart = RestartStrategy::FixedDelay {
        delay: Duration::from_millis(20),
        max_attempts: 5,
    };
    let store = FsCheckpointStore::for_pipeline(root, &config, 3);
    Pipeline::new(config, Arc::new(source()), Arc::new(sink), Arc::new(store)).unwrap()
}

fn factory(committed: &Committed, fail_once: bool) -> CollectingFactory {
    CollectingFactory {
        committed: committed.clone(),
        fail_once: Arc::new(AtomicBool::new(fail_once)),
        repeated_coordinates: true,
    }
}

/// Waits until something is committed.
async fn first_commit(committed: Committed) {
    while committed.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_inside_a_run_after_filtered_records_neither_replays_nor_skips() {
    let root = tempfile::tempdir().unwrap();
    let committed = Committed::default();
    let p = pipeline(root.path(), factory(&committed, true))
        .with_transforms(transforms())
        .unwrap();
    let summary = p.run(std::future::pending()).await.unwrap();
    assert!(summary.metrics.restarts >= 1, "the injected failure restarted a region");
    assert_eq!(committed_values(&committed), expected());
    assert!(summary.metrics.records_filtered >= 2 * 200, "{:?}", summary.metrics);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_after_a_stop_goes_on_from_the_checkpoint_exactly_once() {
    let root = tempfile::tempdir().unwrap();
    let committed = Committed::default();
    let first = pipeline(root.path(), factory(&committed, false))
        .with_transforms(transforms())
        .unwrap();
    first.run(first_commit(committed.clone())).await.unwrap();
    let partial = committed_values(&committed);
    assert!(
        !partial.is_empty() && partial.len() < expected().len(),
        "stopped mid-way: {}",
        partial.len()
    );

    // Other transforms are another pipeline: refused, naming them.
    let changed = pipeline(root.path(), factory(&committed, false))
        .with_transforms(vec![Transform::filter("not-multiples-of-3", |_| Ok(true))])
        .unwrap();
    let refused = changed.run(std::future::pending()).await.unwrap_err().to_string();
    assert!(refused.contains("transforms was"), "{refused}");

    let second = pipeline(root.path(), factory(&committed, false))
        .with_transforms(transforms())
        .unwrap();
    second.run(std::future::pending()).await.unwrap();
    assert_eq!(committed_values(&committed), expected());
}

#[tokio::test]
async fn a_flat_map_needs_a_sink_that_accepts_repeated_coordinates_and_errors_stop_or_count() {
    let root = tempfile::tempdir().unwrap();
    let committed = Committed::default();
    let strict = CollectingFactory {
        repeated_coordinates: false,
        ..factory(&committed, false)
    };
    let refused = pipeline(root.path(), strict)
        .with_transforms(transforms())
        .unwrap_err()
        .to_string();
    for part in [
        "halves-of-multiples-of-5",
        "flat_map",
        "collecting",
        "repeated coordinates",
    ] {
        assert!(refused.contains(part), "`{part}` missing from {refused}");
    }
    let twice = pipeline(root.path(), factory(&committed, false))
        .with_transforms(vec![Transform::map("a", Ok), Transform::map("a", Ok)])
        .unwrap_err()
        .to_string();
    assert!(twice.contains("two transforms are named `a`"), "{twice}");

    // A failing transform stops the pipeline, naming it and the record…
    let failing = || {
        Transform::map("refuses-7", |r| {
            if offset_of(&r)? == 7 {
                return Err(TransformError::new("seven"));
            }
            Ok(r)
        })
    };
    let stopped = pipeline(root.path(), factory(&committed, false))
        .with_transforms(vec![failing()])
        .unwrap()
        .run(std::future::pending())
        .await
        .unwrap_err();
    let text = exactly_core::ErrorChain(&stopped).to_string();
    assert!(
        text.contains("transform `refuses-7`") && text.contains("@7: seven"),
        "{text}"
    );

    // …or, as dead letters, counts and skips each such record.
    let other = tempfile::tempdir().unwrap();
    let counted = Committed::default();
    let summary = pipeline(other.path(), factory(&counted, false))
        .with_transforms(vec![failing().on_error(OnTransformError::DeadLetter)])
        .unwrap()
        .run(std::future::pending())
        .await
        .unwrap();
    assert_eq!(summary.metrics.transform_dead_letters, SPLITS as u64);
    assert_eq!(committed_values(&counted).len(), SPLITS * RECORDS as usize - SPLITS);
}
