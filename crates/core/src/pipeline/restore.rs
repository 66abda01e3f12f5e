//! Step 1 of an attempt: read the latest complete checkpoint, let every sink
//! subtask recover from it, and seek every source subtask to its positions.

use tracing::{info, info_span, Instrument};

use super::{AttemptFailure, Pipeline};
use crate::error::{PipelineError, StoreError};
use crate::fault;
use crate::record::{CheckpointId, SplitPositions};
use crate::sink::{ErasedSink, SinkContext};
use crate::source::Source;
use crate::store::{check_fingerprint, CheckpointEntry, CheckpointStore};

/// What an attempt starts from.
pub(super) struct Restored {
    /// The latest complete checkpoint, if any.
    pub(super) latest: Option<CheckpointEntry>,
    /// The highest checkpoint id any run reserved (see
    /// [`CheckpointStore::reserve_ids`]).
    pub(super) reserved: Option<CheckpointId>,
    /// Every transaction `latest` lists is known committed (recorded in the
    /// store after the commits): nothing is left for the sinks to commit.
    pub(super) all_committed: bool,
}

impl Restored {
    /// The id of the restored checkpoint.
    pub(super) fn id(&self) -> Option<CheckpointId> {
        self.latest.as_ref().map(|e| e.checkpoint.id)
    }

    /// The first checkpoint of this attempt is `base + 1`: above the restored
    /// one and above every id an earlier run may have used.
    pub(super) fn base(&self) -> CheckpointId {
        self.id().max(self.reserved).unwrap_or_default()
    }

    fn positions(&self) -> Option<&SplitPositions> {
        self.latest.as_ref().map(|e| &e.checkpoint.positions)
    }

    /// The committables sink subtask `subtask` must commit in `recover`.
    fn pending(&self, subtask: usize) -> Vec<serde_json::Value> {
        self.latest
            .as_ref()
            .filter(|_| !self.all_committed)
            .and_then(|e| e.checkpoint.pending.get(&subtask))
            .map(|l| l.iter().map(|c| c.committable.clone()).collect())
            .unwrap_or_default()
    }
}

impl Pipeline {
    /// Runs `call` on the store from a blocking thread.
    async fn with_store<T: Send + 'static>(
        &self,
        call: impl FnOnce(&dyn CheckpointStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, AttemptFailure> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || call(store.as_ref()))
            .await
            .expect("checkpoint store task panicked")
            .map_err(|e| self.store_failure(e))
    }

    /// Reads the latest complete checkpoint (after any write of the previous
    /// attempt has landed or failed) and checks it belongs to this pipeline.
    pub(super) async fn restore(&self) -> Result<Restored, AttemptFailure> {
        let previous_write = self.persisting.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(write) = previous_write {
            let _ = write.await;
        }
        let latest = self.with_store(|store| store.latest()).await?;
        if let Some(entry) = &latest {
            check_fingerprint(
                self.store.as_ref(),
                entry,
                &self.descriptor(),
                self.config.allow_fingerprint_change,
            )
            .map_err(|e| self.store_failure(e))?;
            info!(checkpoint = %entry.checkpoint.id, entry = %entry.file_name(), "restoring from checkpoint");
        } else {
            info!("no checkpoint found: first start");
        }
        let reserved = self.with_store(|store| store.id_watermark()).await?;
        let committed_through = self.with_store(|store| store.committed_through()).await?;
        // Everything the restored checkpoint lists was committed by every sink
        // before the pipeline stopped: nothing is left to commit, and a store
        // that forgot those transactions since (an expired Kafka transactional
        // id) is not asked about them.
        let restored_id = latest.as_ref().map(|e| e.checkpoint.id);
        let all_committed = restored_id.is_some_and(|id| committed_through.is_some_and(|c| c >= id));
        if all_committed {
            info!(
                checkpoint = %restored_id.unwrap_or_default(),
                "every transaction the checkpoint lists was committed before the stop"
            );
        }
        let restored = Restored {
            latest,
            reserved,
            all_committed,
        };
        self.check_orphans(&restored)?;
        Ok(restored)
    }

    /// Refuses to resume when the checkpoint lists uncommitted transactions
    /// of sink subtasks that no longer exist.
    fn check_orphans(&self, restored: &Restored) -> Result<(), AttemptFailure> {
        let p = self.config.parallelism;
        let (Some(entry), false) = (&restored.latest, restored.all_committed) else {
            return Ok(());
        };
        match entry.checkpoint.pending.keys().find(|i| **i >= p) {
            None => Ok(()),
            Some(orphaned) => Err(self.fail(
                false,
                false,
                PipelineError::Config(format!(
                    "checkpoint {} holds pending transactions of sink subtask {orphaned}, but parallelism is now {p}: \
                     they would never be committed. Resume with the old parallelism once (it commits them), then change it",
                    entry.checkpoint.id
                )),
            )),
        }
    }

    /// Creates every sink subtask and lets it commit what the checkpoint
    /// lists and abort the rest it owns. No data flows before every sink
    /// subtask has recovered.
    pub(super) async fn recover_sinks(&self, restored: &Restored) -> Result<Vec<Box<dyn ErasedSink>>, AttemptFailure> {
        let p = self.config.parallelism;
        let mut sinks = Vec::with_capacity(p);
        for i in 0..p {
            let context = SinkContext {
                pipeline: self.config.name.clone(),
                subtask: i,
                parallelism: p,
                metrics: self.metrics.clone(),
            };
            let mut sink = self
                .sink
                .create(context)
                .map_err(|e| self.connector_failure(false, e))?;
            let pending = restored.pending(i);
            sink.recover(&pending)
                .instrument(info_span!("recover", subtask = i, pending = pending.len()))
                .await
                .map_err(|e| self.connector_failure(false, e))?;
            fault::point("recovery.after_commit");
            sinks.push(sink);
        }
        Ok(sinks)
    }

    /// Creates every source subtask and seeks it to the checkpoint's
    /// positions (or its start position on a first start).
    pub(super) async fn restore_sources(&self, restored: &Restored) -> Result<Vec<Box<dyn Source>>, AttemptFailure> {
        let p = self.config.parallelism;
        let mut sources = Vec::with_capacity(p);
        for i in 0..p {
            let mut source = self.source.create(i, p).map_err(|e| self.connector_failure(false, e))?;
            source
                .restore(restored.positions())
                .await
                .map_err(|e| self.connector_failure(false, e))?;
            sources.push(source);
        }
        Ok(sources)
    }
}
