//! Step 1 of an attempt of a region: read the region's latest complete
//! checkpoint, let every sink subtask of the region recover from it, and seek
//! every source subtask of the region to its positions.

use tracing::{info, info_span, Instrument};

use super::region::Region;
use super::{AttemptFailure, Pipeline};
use crate::coordinator::CheckpointData;
use crate::fault;
use crate::membership::Epoch;
use crate::record::{CheckpointId, SplitPositions};
use crate::sink::{ErasedSink, SinkContext};
use crate::source::Source;
use crate::store::{check_fingerprint, AllowedChanges, CheckpointEntry};

/// A worker's claim of a region: the epoch the claim raised, and until
/// when the worker may act on it.
pub(super) struct Claimed {
    pub(super) epoch: Epoch,
    pub(super) acting: crate::acting::ActingGate,
}

/// What an attempt starts from.
pub(super) struct Restored {
    /// The epoch this attempt took the region's sequence under: every write
    /// of the attempt carries it.
    pub(super) epoch: Epoch,
    /// The latest complete checkpoint, if any.
    pub(super) latest: Option<CheckpointEntry>,
    /// The highest checkpoint id any run reserved (the sequence's id
    /// watermark).
    pub(super) reserved: Option<CheckpointId>,
    /// Every transaction `latest` lists is known committed (recorded in the
    /// store after the commits): nothing is left for the sinks to commit.
    pub(super) all_committed: bool,
    /// The store's record of committed checkpoints.
    pub(super) committed_through: Option<CheckpointId>,
    /// Entries newer than `latest` that cannot be read, with why: restoring
    /// `latest` falls back past them.
    pub(super) skipped: Vec<(String, String)>,
    /// A checkpoint after `latest` that the store records every sink
    /// committed (`committed_through`) although its entry is gone and was
    /// not set aside by an accepted fallback: deleted or moved behind the
    /// pipeline's back. Restoring `latest` falls back past it as well.
    pub(super) gone: Option<CheckpointId>,
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

    /// The parallelism before a change of it, when the restored checkpoint
    /// is the first one after the change.
    fn previous_parallelism(&self) -> Option<usize> {
        self.latest.as_ref().and_then(|e| e.checkpoint.previous_parallelism)
    }

    /// The committables sink subtask `subtask` must commit in `recover`
    /// (after a change of the parallelism, those of the old subtasks it
    /// adopts are listed under it), oldest checkpoint first.
    fn pending(&self, subtask: usize) -> Vec<serde_json::Value> {
        self.latest
            .as_ref()
            .filter(|_| !self.all_committed)
            .and_then(|e| e.checkpoint.pending.get(&subtask))
            .map(|l| l.iter().map(|c| c.committable.clone()).collect())
            .unwrap_or_default()
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
    /// Takes the region's checkpoint sequence (fences it: no write of an
    /// earlier attempt or owner is accepted any more, and every one accepted
    /// before is visible), then reads its latest complete checkpoint and
    /// checks it belongs to this pipeline.
    ///
    /// `claimed`: a worker's granted claim fenced the sequence at this epoch
    /// already; the attempt reads the head after it and goes on only while
    /// the epoch is still that one (else another worker took the region:
    /// [`StoreError::Fenced`](crate::StoreError::Fenced)).
    pub(super) async fn restore(&self, region: &Region, claimed: Option<&Claimed>) -> Result<Restored, AttemptFailure> {
        region.wait_for_previous_write().await;
        let checkpoints = &region.checkpoints;
        let fail = |e| self.store_failure(e);
        let head = match claimed {
            None => checkpoints.take(&crate::store::this_process()).await.map_err(fail)?,
            Some(claimed) => {
                let head = checkpoints.head().await.map_err(fail)?;
                if head.epoch != claimed.epoch {
                    return Err(fail(checkpoints.fenced(claimed.epoch, head.epoch)));
                }
                head
            }
        };
        let epoch = head.epoch;
        let latest = checkpoints.latest().await.map_err(fail)?;
        let reserved = head.id_watermark;
        let skipped = match &latest {
            None => {
                self.check_first_start(checkpoints, epoch, reserved).await?;
                Vec::new()
            }
            Some(entry) => self.unreadable_newer_than(checkpoints, entry).await?,
        };
        if let Some(entry) = &latest {
            let allowed = AllowedChanges {
                any: self.config.allow_fingerprint_change,
                parallelism: self.config.allow_parallelism_change,
            };
            check_fingerprint(&checkpoints.location(), entry, &self.descriptor(), allowed).map_err(fail)?;
            info!(checkpoint = %entry.checkpoint.id, entry = %entry.file_name(), %epoch, "restoring from checkpoint");
        } else {
            info!(%epoch, "no checkpoint found: first start");
        }
        let committed_through = head.committed_through;
        // Unreadable newer entries are checked anyway (and explain the gap).
        let gone = match (&latest, committed_through) {
            (Some(entry), Some(through)) if through > entry.checkpoint.id && skipped.is_empty() => {
                let quarantined = checkpoints.set_aside_entries().await.map_err(fail)?;
                let set_aside = quarantined.iter().any(|q| q.id >= through);
                (!set_aside).then_some(through)
            }
            _ => None,
        };
        let retained = checkpoints.list().await.map_err(fail)?;
        region.restorable.set(super::region::oldest(&retained));
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
            epoch,
            latest,
            reserved,
            all_committed,
            committed_through,
            skipped,
            gone,
        })
    }

    /// Creates every sink subtask of the region and lets it commit what the
    /// checkpoint lists and abort the rest it owns. No data flows before
    /// every sink subtask has recovered.
    pub(super) async fn recover_sinks(
        &self,
        region: &Region,
        restored: &Restored,
        claimed: Option<&Claimed>,
    ) -> Result<Vec<(usize, Box<dyn ErasedSink>)>, AttemptFailure> {
        let p = self.config.parallelism;
        let previous = restored.previous_parallelism();
        let mut sinks = Vec::with_capacity(region.sinks.len());
        for &i in &region.sinks {
            let adopted = adopted_subtasks(i, p, previous);
            if !adopted.is_empty() {
                info!(
                    subtask = i,
                    ?adopted,
                    "taking over the sink subtasks of the higher parallelism"
                );
            }
            let mut context = SinkContext::new(&self.config.name, i, p, self.metrics.clone())
                .with_adopted(adopted)
                .with_restorable(region.restorable.clone());
            if let Some(claimed) = claimed {
                context = context.with_ownership(crate::sink::Ownership {
                    epoch: restored.epoch,
                    first_checkpoint: restored.base().next(),
                    acting: claimed.acting.clone(),
                });
            }
            let sink = self
                .sink
                .create(context)
                .map_err(|e| self.connector_failure(false, e))?;
            sinks.push((i, sink));
        }
        self.check_fallback(region, restored, &mut sinks).await?;
        for (i, sink) in sinks.iter_mut() {
            let pending = restored.pending(*i);
            let pending = if fault::abort_pending_on_recover() && !pending.is_empty() {
                tracing::error!(
                    subtask = *i,
                    listed = pending.len(),
                    "TEST ONLY ({}=1): recovering as if the checkpoint listed nothing, so the sink aborts \
                     the transactions it lists instead of committing them; their records are lost",
                    fault::ABORT_PENDING_ON_RECOVER_ENV
                );
                Vec::new()
            } else {
                pending
            };
            sink.recover(&pending)
                .instrument(info_span!("recover", subtask = *i, pending = pending.len()))
                .await
                .map_err(|e| self.connector_failure(false, e))?;
            fault::point_at("recovery.after_commit", *i);
        }
        Ok(sinks)
    }

    /// Creates every source subtask of the region and seeks it to the
    /// checkpoint's positions (or its start position on a first start).
    pub(super) async fn restore_sources(
        &self,
        region: &Region,
        restored: &Restored,
    ) -> Result<Vec<(usize, Box<dyn Source>)>, AttemptFailure> {
        let p = self.config.parallelism;
        let mut sources = Vec::with_capacity(region.sources.len());
        for &i in &region.sources {
            let mut source = self.source.create(i, p).map_err(|e| self.connector_failure(false, e))?;
            source
                .restore(restored.positions())
                .await
                .map_err(|e| self.connector_failure(false, e))?;
            sources.push((i, source));
        }
        Ok(sources)
    }

    /// On a first start, persists checkpoint 0 — the sources' resolved start
    /// positions and nothing pending — before any record flows, so every
    /// later attempt (after a crash before the first checkpoint, or an
    /// in-process restart) starts from the same place: `start = "latest"` or
    /// a timestamp is resolved once, never again.
    pub(super) async fn pin_start(
        &self,
        region: &Region,
        restored: &mut Restored,
        sources: &mut [(usize, Box<dyn Source>)],
    ) -> Result<(), AttemptFailure> {
        if restored.latest.is_some() {
            return Ok(());
        }
        let mut positions = SplitPositions::default();
        for (_, source) in sources.iter_mut() {
            positions.merge(&source.position(CheckpointId(0)));
        }
        let entry = CheckpointEntry::new(
            self.descriptor(),
            CheckpointData {
                id: CheckpointId(0),
                positions,
                ..CheckpointData::default()
            },
        );
        region
            .checkpoints
            .save(restored.epoch, &entry)
            .await
            .map_err(|e| self.store_failure(e))?;
        info!(
            entry = %entry.file_name(),
            splits = entry.checkpoint.positions.0.len(),
            "first start: the sources' start positions are pinned in checkpoint 0"
        );
        restored.latest = Some(entry);
        Ok(())
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
