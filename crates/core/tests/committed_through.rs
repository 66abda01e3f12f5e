//! The runtime records in the store when every sink committed a checkpoint
//! (`committed-through`), and a recovery from a checkpoint up to that id
//! hands the sinks nothing to commit: its transactions are known committed,
//! even if the store holding them forgot them since (an expired Kafka
//! transactional id).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use exactly_core::{
    erase, CheckpointConfig, CheckpointId, CheckpointStore, ConnectorError, ErasedSink, Failover, FsCheckpointStore,
    Pipeline, PipelineConfig, Record, SequenceSourceFactory, SinkContext, SinkFactory, TwoPhaseCommitSink,
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
    let mut config = PipelineConfig::new("committed");
    // The store's own folder holds the one checkpoint sequence.
    config.failover = Failover::Global;
    // No checkpoint before the source ends: the final one holds every
    // record, so it lists a transaction to commit.
    config.checkpoint = CheckpointConfig {
        interval: Duration::from_secs(30),
        ..CheckpointConfig::default()
    };
    let store = FsCheckpointStore::new(root, "committed", 3);
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
