//! Step 1 of an attempt: read the latest complete checkpoint, let every sink
//! subtask recover from it, and seek every source subtask to its positions.

use tracing::{info, info_span, warn, Instrument};

use super::{AttemptFailure, Pipeline};
use crate::coordinator::CheckpointData;
use crate::error::StoreError;
use crate::fault;
use crate::record::{CheckpointId, SplitPositions};
use crate::sink::{ErasedSink, ReplayCheck, SinkContext};
use crate::source::Source;
use crate::store::{check_fingerprint, AllowedChanges, CheckpointEntry, CheckpointStore};

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
    /// The store's record of committed checkpoints.
    committed_through: Option<CheckpointId>,
    /// Entries newer than `latest` that cannot be read, with why: restoring
    /// `latest` falls back past them.
    skipped: Vec<(String, String)>,
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

    /// The parallelism the restored checkpoint was taken with.
    fn previous_parallelism(&self) -> Option<usize> {
        self.latest.as_ref().map(|e| e.descriptor.parallelism)
    }

    /// The committables sink subtask `subtask` must commit in `recover`:
    /// its own and those of the old subtasks it adopts, oldest checkpoint
    /// first.
    fn pending(&self, subtask: usize, adopted: &[usize]) -> Vec<serde_json::Value> {
        let Some(entry) = self.latest.as_ref().filter(|_| !self.all_committed) else {
            return Vec::new();
        };
        let mut pending: Vec<_> = std::iter::once(subtask)
            .chain(adopted.iter().copied())
            .filter_map(|i| entry.checkpoint.pending.get(&i))
            .flatten()
            .collect();
        pending.sort_by_key(|c| c.checkpoint);
        pending.into_iter().map(|c| c.committable.clone()).collect()
    }
}

/// The sink subtasks of the old parallelism `previous` that subtask
/// `subtask` of `parallelism` takes over: old subtask `j` goes to
/// `j % parallelism`, so every old subtask that no longer exists has exactly
/// one heir. Empty when the parallelism did not shrink.
pub(super) fn adopted_subtasks(subtask: usize, parallelism: usize, previous: Option<usize>) -> Vec<usize> {
    (parallelism..previous.unwrap_or(0))
        .filter(|j| j % parallelism == subtask)
        .collect()
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
        let reserved = self.with_store(|store| store.id_watermark()).await?;
        let skipped = match &latest {
            None => {
                self.check_first_start(reserved).await?;
                Vec::new()
            }
            Some(entry) => self.unreadable_newer_than(entry).await?,
        };
        if let Some(entry) = &latest {
            let allowed = AllowedChanges {
                any: self.config.allow_fingerprint_change,
                parallelism: self.config.allow_parallelism_change,
            };
            check_fingerprint(self.store.as_ref(), entry, &self.descriptor(), allowed)
                .map_err(|e| self.store_failure(e))?;
            info!(checkpoint = %entry.checkpoint.id, entry = %entry.file_name(), "restoring from checkpoint");
        } else {
            info!("no checkpoint found: first start");
        }
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
        Ok(Restored {
            latest,
            reserved,
            all_committed,
            committed_through,
            skipped,
        })
    }

    /// The entries newer than `entry` (which the store skipped as
    /// unreadable), each with why it cannot be read.
    async fn unreadable_newer_than(&self, entry: &CheckpointEntry) -> Result<Vec<(String, String)>, AttemptFailure> {
        let newest = (entry.checkpoint.id, entry.created_unix_ms);
        let names = self.with_store(|store| store.list()).await?;
        Ok(names
            .into_iter()
            .filter(|n| (n.id, n.created_unix_ms) > newest)
            .map(|n| {
                let problem = self
                    .store
                    .read(&n.file_name)
                    .err()
                    .unwrap_or_else(|| "readable now".into());
                (n.file_name, problem)
            })
            .collect())
    }

    /// Restoring the newest readable entry falls back past unreadable newer
    /// ones: allowed when nothing a later checkpoint committed would be
    /// written again — the store's committed-through record is not past the
    /// restored checkpoint and every sink subtask proves it (or its writes
    /// are replay-safe) — or when `allow_fallback` accepts the duplicates.
    /// The unreadable entries are then set aside.
    async fn check_fallback(
        &self,
        restored: &Restored,
        sinks: &mut [Box<dyn ErasedSink>],
    ) -> Result<(), AttemptFailure> {
        if restored.skipped.is_empty() {
            return Ok(());
        }
        let id = restored.id().unwrap_or_default();
        let mut known = Vec::new();
        if let Some(through) = restored.committed_through.filter(|c| *c > id) {
            known.push(format!(
                "every sink committed checkpoint {through} (recorded in committed-through)"
            ));
        }
        for (i, sink) in sinks.iter_mut().enumerate() {
            let answer = sink
                .check_replay_after(id)
                .await
                .map_err(|e| self.connector_failure(false, e))?;
            match answer {
                ReplayCheck::Safe => {}
                ReplayCheck::CommittedLater(later) => known.push(format!(
                    "sink subtask {i} committed the transaction of checkpoint {later}"
                )),
                ReplayCheck::Unknown => known.push(format!(
                    "sink subtask {i} cannot tell whether it committed anything after it"
                )),
            }
        }
        let skipped = restored
            .skipped
            .iter()
            .map(|(name, problem)| format!("{name}: {problem}"))
            .collect::<Vec<_>>()
            .join("; ");
        if known.is_empty() {
            warn!(%skipped, checkpoint = %id, "falling back past unreadable checkpoint entries: the sinks prove nothing after the restored checkpoint was committed");
        } else if self.config.allow_fallback {
            warn!(
                %skipped,
                checkpoint = %id,
                known = %known.join("; "),
                "falling back past unreadable checkpoint entries although later checkpoints may have been committed \
                 (allow_fallback): the records after the restored checkpoint are written again and duplicate what those committed"
            );
        } else {
            return Err(self.store_failure(StoreError::FallbackRefused {
                dir: self.store.location(),
                skipped,
                restored: id,
                known: known.join("; "),
            }));
        }
        for (name, _) in &restored.skipped {
            let name = name.clone();
            self.with_store(move |store| store.quarantine(&name)).await?;
        }
        Ok(())
    }

    /// No readable entry: a first start, unless the folder has a history
    /// (entries that cannot be read, ids reserved by a run that got as far
    /// as a checkpoint). Then it is refused, or with `allow_first_start`
    /// accepted and the unreadable entries set aside.
    async fn check_first_start(&self, reserved: Option<CheckpointId>) -> Result<(), AttemptFailure> {
        let names = self.with_store(|store| store.list()).await?;
        if names.is_empty() && reserved.is_none() {
            return Ok(());
        }
        let mut history: Vec<String> = Vec::new();
        for name in &names {
            let problem = self
                .store
                .read(&name.file_name)
                .err()
                .unwrap_or_else(|| "readable now".into());
            history.push(format!("{} ({problem})", name.file_name));
        }
        if let Some(reserved) = reserved {
            history.push(format!("ids reserved up to {reserved}"));
        }
        let history = history.join("; ");
        if !self.config.allow_first_start {
            return Err(self.store_failure(StoreError::NoReadableCheckpoint {
                dir: self.store.location(),
                history,
            }));
        }
        warn!(%history, "starting as if for the first time although the checkpoint folder has a history (allow_first_start)");
        for name in names {
            let file = name.file_name.clone();
            self.with_store(move |store| store.quarantine(&file)).await?;
        }
        Ok(())
    }

    /// Creates every sink subtask and lets it commit what the checkpoint
    /// lists and abort the rest it owns. No data flows before every sink
    /// subtask has recovered.
    pub(super) async fn recover_sinks(&self, restored: &Restored) -> Result<Vec<Box<dyn ErasedSink>>, AttemptFailure> {
        let p = self.config.parallelism;
        let previous = restored.previous_parallelism();
        let mut sinks = Vec::with_capacity(p);
        for i in 0..p {
            let adopted = adopted_subtasks(i, p, previous);
            if !adopted.is_empty() {
                info!(
                    subtask = i,
                    ?adopted,
                    "taking over the sink subtasks of the higher parallelism"
                );
            }
            let context = SinkContext::new(&self.config.name, i, p, self.metrics.clone()).with_adopted(adopted);
            sinks.push(
                self.sink
                    .create(context)
                    .map_err(|e| self.connector_failure(false, e))?,
            );
        }
        self.check_fallback(restored, &mut sinks).await?;
        for (i, sink) in sinks.iter_mut().enumerate() {
            let pending = restored.pending(i, &adopted_subtasks(i, p, previous));
            sink.recover(&pending)
                .instrument(info_span!("recover", subtask = i, pending = pending.len()))
                .await
                .map_err(|e| self.connector_failure(false, e))?;
            fault::point_at("recovery.after_commit", i);
        }
        Ok(sinks)
    }

    /// On a first start, persists checkpoint 0 — the sources' resolved start
    /// positions and nothing pending — before any record flows, so every
    /// later attempt (after a crash before the first checkpoint, or an
    /// in-process restart) starts from the same place: `start = "latest"` or
    /// a timestamp is resolved once, never again.
    pub(super) async fn pin_start(
        &self,
        restored: &mut Restored,
        sources: &mut [Box<dyn Source>],
    ) -> Result<(), AttemptFailure> {
        if restored.latest.is_some() {
            return Ok(());
        }
        let mut positions = SplitPositions::default();
        for source in sources.iter_mut() {
            positions.merge(&source.position(CheckpointId(0)));
        }
        let entry = CheckpointEntry::new(
            self.descriptor(),
            CheckpointData {
                id: CheckpointId(0),
                positions,
                pending: Default::default(),
            },
        );
        let saved = entry.clone();
        self.with_store(move |store| store.save(&saved)).await?;
        info!(
            entry = %entry.file_name(),
            splits = entry.checkpoint.positions.0.len(),
            "first start: the sources' start positions are pinned in checkpoint 0"
        );
        restored.latest = Some(entry);
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::adopted_subtasks;

    #[test]
    fn every_old_subtask_has_exactly_one_heir() {
        assert_eq!(adopted_subtasks(0, 2, Some(3)), vec![2]);
        assert_eq!(adopted_subtasks(1, 2, Some(3)), Vec::<usize>::new());
        assert_eq!(adopted_subtasks(0, 2, Some(7)), vec![2, 4, 6]);
        assert_eq!(adopted_subtasks(1, 2, Some(7)), vec![3, 5]);
        assert_eq!(adopted_subtasks(0, 1, Some(3)), vec![1, 2]);
        for p in 1..6 {
            for previous in 0..12 {
                let mut heirs: Vec<usize> = (0..p).flat_map(|i| adopted_subtasks(i, p, Some(previous))).collect();
                heirs.sort();
                assert_eq!(
                    heirs,
                    (p..previous.max(p)).collect::<Vec<_>>(),
                    "p {p}, previous {previous}"
                );
            }
        }
        assert!(adopted_subtasks(0, 4, Some(2)).is_empty(), "raising adopts nothing");
        assert!(adopted_subtasks(0, 4, None).is_empty(), "a first start adopts nothing");
    }
}
