//! The runtime records in the store when every sink committed a checkpoint
//! (`committed-through`), and a recovery from a checkpoint up to that id
//! hands the sinks nothing to commit: its transactions are known committed,
//! even if the store holding them forgot them since (an expired Kafka
//! transactional id).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use exactly_core::{
    erase, CheckpointConfig, CheckpointId, ConnectorError, ErasedSink, Failover, FsCheckpointStore, Pipeline,
    PipelineConfig, Record, SequenceSourceFactory, SinkContext, SinkFactory, TwoPhaseCommitSink,
};

/// What every `recover` of the sink was given, per call.
type Recoveries = Arc<Mutex<Vec<Vec<u64>>>>;

/// A sink whose transactions are checkpoint ids; it only records what
/// `recover` is asked to commit.
struct Recording {
    recoveries: Recoveries,
}

#[async_trait]
impl TwoPhaseCommitSink for Recording {
    type Transaction = u64;
    type Committable = u64;

    async fn recover(&mut self, pending: &[u64]) -> Result<(), ConnectorError> {
        self.recoveries.lock().unwrap().push(pending.to_vec());
        Ok(())
    }
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<u64, ConnectorError> {
        Ok(checkpoint.0)
    }
    async fn write(&mut self, _txn: &mut u64, _batch: &[Record]) -> Result<(), ConnectorError> {
        Ok(())
    }
    async fn pre_commit(&mut self, txn: u64) -> Result<u64, ConnectorError> {
        Ok(txn)
    }
    async fn commit(&mut self, _committable: &u64) -> Result<(), ConnectorError> {
        Ok(())
    }
    async fn abort(&mut self, _txn: u64) -> Result<(), ConnectorError> {
        Ok(())
    }
}

struct RecordingFactory {
    recoveries: Recoveries,
}

impl SinkFactory for RecordingFactory {
    fn identity(&self) -> String {
        "recording".into()
    }
    fn create(&self, _context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        Ok(erase(Recording {
            recoveries: self.recoveries.clone(),
        }))
    }
}

fn pipeline(root: &std::path::Path, recoveries: &Recoveries) -> (Pipeline, FsCheckpointStore) {
    pipeline_with(root, recoveries, |_| {})
}

fn pipeline_with(
    root: &std::path::Path,
    recoveries: &Recoveries,
    tweak: impl FnOnce(&mut PipelineConfig),
) -> (Pipeline, FsCheckpointStore) {
    let mut config = PipelineConfig::new("committed");
    // The store's own folder holds the one checkpoint sequence.
    config.failover = Failover::Global;
    // No checkpoint before the source ends: the final one holds every
    // record, so it lists a transaction to commit.
    config.checkpoint = CheckpointConfig {
        interval: Duration::from_secs(30),
        ..CheckpointConfig::default()
    };
    tweak(&mut config);
    let store = FsCheckpointStore::for_pipeline(root, &config, 3);
    let source = SequenceSourceFactory {
        splits: 1,
        records_per_split: 200,
        batch: 10,
        delay_per_poll: Duration::from_millis(1),
    };
    let sink = RecordingFactory {
        recoveries: recoveries.clone(),
    };
    let p = Pipeline::new(config, Arc::new(source), Arc::new(sink), Arc::new(store.clone())).unwrap();
    (p, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_committed_before_the_stop_is_not_committed_again() {
    let root = tempfile::tempdir().unwrap();
    let recoveries = Recoveries::default();
    let (first, store) = pipeline(root.path(), &recoveries);
    let summary = first.run(std::future::pending()).await.unwrap();
    let last = summary.last_checkpoint.expect("a checkpoint completed");
    assert_eq!(
        store.committed_through().unwrap(),
        Some(last),
        "the final commits are recorded before run returns"
    );

    // The final checkpoint lists the transaction of its interval…
    let entry = store.latest().unwrap().expect("an entry");
    assert_eq!(entry.checkpoint.id, last);
    let listed: Vec<u64> = entry.checkpoint.pending[&0]
        .iter()
        .map(|p| p.committable.as_u64().unwrap())
        .collect();
    assert!(!listed.is_empty(), "the final interval had records: {entry:?}");

    // The same checkpoint folder without the record, for the control below.
    let control = tempfile::tempdir().unwrap();
    let copy = control.path().join("committed");
    std::fs::create_dir(&copy).unwrap();
    for file in std::fs::read_dir(store.dir()).unwrap() {
        let file = file.unwrap();
        if file.file_name() != exactly_core::store::COMMITTED_THROUGH_FILE {
            std::fs::copy(file.path(), copy.join(file.file_name())).unwrap();
        }
    }

    // …which a restart knows to be committed: nothing to commit.
    let (second, _) = pipeline(root.path(), &recoveries);
    second.run(std::future::pending()).await.unwrap();
    assert_eq!(recoveries.lock().unwrap().last(), Some(&Vec::new()));

    // Without the record, recovery is handed the listed transactions.
    let (third, _) = pipeline(control.path(), &recoveries);
    third.run(std::future::pending()).await.unwrap();
    assert_eq!(recoveries.lock().unwrap().last(), Some(&listed));
}

/// Runs the pipeline in `root` until its source ends: its store and last
/// checkpoint.
async fn run_to_the_end(root: &std::path::Path, recoveries: &Recoveries) -> (FsCheckpointStore, CheckpointId) {
    let (first, store) = pipeline(root, recoveries);
    let summary = first.run(std::future::pending()).await.unwrap();
    (store, summary.last_checkpoint.expect("a checkpoint completed"))
}

/// The file of entry `id` in `store`'s folder.
fn entry_file(store: &FsCheckpointStore, id: CheckpointId) -> std::path::PathBuf {
    let names = store.list().unwrap();
    let name = names.iter().find(|n| n.id == id).expect("the entry is listed");
    store.dir().join(&name.file_name)
}

/// An operator deletes the newest entry after its commits were recorded.
/// Restoring the entry before it would replay records that were committed,
/// so the start is refused, naming the checkpoint whose entry is gone and
/// the flag; with `allow_fallback` it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_checkpoint_whose_entry_is_gone_is_not_fallen_back_past_silently() {
    let root = tempfile::tempdir().unwrap();
    let recoveries = Recoveries::default();
    let (store, last) = run_to_the_end(root.path(), &recoveries).await;
    assert_eq!(store.committed_through().unwrap(), Some(last));
    std::fs::remove_file(entry_file(&store, last)).unwrap();
    assert!(store.latest().unwrap().is_some_and(|e| e.checkpoint.id < last));

    let (second, _) = pipeline(root.path(), &recoveries);
    let refused = second.run(std::future::pending()).await.unwrap_err().to_string();
    for part in [
        format!("the entry of checkpoint {last} is gone"),
        format!("every sink committed checkpoint {last} (recorded in committed-through)"),
        "--allow-fallback".to_string(),
    ] {
        assert!(refused.contains(&part), "`{part}` missing from: {refused}");
    }

    let (third, _) = pipeline_with(root.path(), &recoveries, |c| c.allow_fallback = true);
    let again = third
        .run(std::future::pending())
        .await
        .unwrap()
        .last_checkpoint
        .unwrap();
    assert!(again > last, "new checkpoints go on above the gone one");
}

/// An entry set aside by an accepted fallback (`<entry>.unreadable`)
/// explains why committed-through is above the newest readable entry: a
/// restart before the next checkpoint is not refused again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_set_aside_by_an_accepted_fallback_is_not_reported_gone() {
    let root = tempfile::tempdir().unwrap();
    let recoveries = Recoveries::default();
    let (store, last) = run_to_the_end(root.path(), &recoveries).await;
    store
        .quarantine(&entry_file(&store, last).file_name().unwrap().to_string_lossy())
        .unwrap();
    assert_eq!(
        store.quarantined().unwrap().iter().map(|n| n.id).collect::<Vec<_>>(),
        [last]
    );

    let (second, _) = pipeline(root.path(), &recoveries);
    second
        .run(std::future::pending())
        .await
        .expect("the gap is explained by the entry set aside");
}
