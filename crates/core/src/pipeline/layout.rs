//! Where a pipeline's checkpoints live, and carrying them over when the
//! layout changes: between global and region failover, or to another
//! parallelism.
//!
//! The layout in force is recorded in the pipeline's folder (`layout`). When
//! the configured one differs, the latest checkpoint of every old sequence
//! (the global one, or every region's) is read, and every new sequence gets
//! an entry of its own before anything runs: all the old positions (each
//! source subtask picks its splits), and the old sinks' pending transactions
//! under their heirs (old subtask `j` → `j % parallelism`), with the old
//! parallelism recorded so the heirs also abort what the old subtasks left.
//! Recording the new layout is the commit point; what the new layout does
//! not use is then set aside (`retired-…`), never deleted. A crash before
//! the record redoes the change from the old entries, which nothing touched.

use std::collections::BTreeMap;

use tracing::{info, warn};

use super::config::Failover;
use super::region::Region;
use super::{AttemptFailure, Pipeline};
use crate::coordinator::{CheckpointData, PendingCommit};
use crate::error::{PipelineError, StoreError};
use crate::record::{CheckpointId, SplitPositions};
use crate::store::{check_fingerprint, AccessError, AllowedChanges, Cas, CheckpointEntry, Checkpoints, Layout, Scope};

impl Pipeline {
    /// The configured layout.
    fn layout(&self) -> Layout {
        Layout {
            failover: self.config.failover,
            parallelism: self.config.parallelism,
        }
    }

    /// The checkpoint sequence `scope`.
    fn checkpoints(&self, scope: Scope) -> Checkpoints {
        Checkpoints::new(self.store.sequence(scope), self.store.retain())
    }

    fn access_failure(&self, e: AccessError) -> PipelineError {
        self.store_failure(e.into()).error
    }

    /// Brings the checkpoint store to the configured layout (carrying the
    /// old checkpoints over when it changed) and returns the regions to run.
    pub(super) async fn prepare_layout(&self) -> Result<Vec<Region>, PipelineError> {
        let wanted = self.layout();
        let recorded = self.store.layout().await.map_err(|e| self.access_failure(e))?;
        let current = match recorded {
            Some(layout) => Some(layout),
            None => self.legacy_layout().await.map_err(fatal)?,
        };
        match current {
            None => self.record_layout(recorded, wanted).await?,
            Some(current) if current == wanted => {}
            Some(current) => {
                self.change_layout(current, wanted).await?;
                self.record_layout(recorded, wanted).await?;
                warn!(from = %current, to = %wanted, "changed the checkpoint layout: every old checkpoint sequence was carried over");
            }
        }
        self.retire_unused(wanted).await.map_err(fatal)?;
        Ok(wanted
            .scopes()
            .into_iter()
            .map(|scope| Region::new(scope.region(), self.config.parallelism, self.checkpoints(scope)))
            .collect())
    }

    /// The regions to run as one worker of several: the store's layout must
    /// be the configured one (recorded now on a first start; several workers
    /// starting at once record the same). A change of layout carries every
    /// sequence over, which one process must do alone.
    pub(super) async fn prepare_worker_layout(&self) -> Result<Vec<Region>, PipelineError> {
        let wanted = self.layout();
        let recorded = self.store.layout().await.map_err(|e| self.access_failure(e))?;
        let moved = |now: Layout| {
            PipelineError::Config(format!(
                "the checkpoints in {} are laid out for {now}, and this worker runs {wanted}: a change of the \
                 parallelism or the failover carries every checkpoint sequence over, which one process must do \
                 alone. Fix: stop every worker, run the pipeline once without [workers] (it carries the \
                 checkpoints over; stop it after its first checkpoint), then start the workers again",
                self.store.location()
            ))
        };
        match recorded {
            Some(now) if now == wanted => {}
            Some(now) => return Err(moved(now)),
            None => match self
                .store
                .record_layout(None, wanted)
                .await
                .map_err(|e| self.access_failure(e))?
            {
                Cas::Done(()) => {}
                Cas::Moved(Some(now)) if now == wanted => {}
                Cas::Moved(now) => return Err(moved(now.unwrap_or(wanted))),
            },
        }
        Ok(wanted
            .scopes()
            .into_iter()
            .map(|scope| Region::new(scope.region(), self.config.parallelism, self.checkpoints(scope)))
            .collect())
    }

    /// Records `wanted` where `recorded` was: the commit point of a change.
    async fn record_layout(&self, recorded: Option<Layout>, wanted: Layout) -> Result<(), PipelineError> {
        match self
            .store
            .record_layout(recorded, wanted)
            .await
            .map_err(|e| self.access_failure(e))?
        {
            Cas::Done(()) => Ok(()),
            Cas::Moved(now) => Err(PipelineError::Config(format!(
                "the layout of the checkpoints in {} changed while this process was changing it (now {}); \
                 is another process starting the same pipeline?",
                self.store.location(),
                now.map_or_else(|| "none".to_string(), |l| l.to_string())
            ))),
        }
    }

    /// A store written before layouts were recorded holds global entries
    /// (at the parallelism its latest one names), or nothing.
    async fn legacy_layout(&self) -> Result<Option<Layout>, AttemptFailure> {
        let latest = self
            .checkpoints(Scope::Global)
            .latest()
            .await
            .map_err(|e| self.store_failure(e))?;
        Ok(latest.map(|entry| Layout {
            failover: Failover::Global,
            parallelism: entry.descriptor.parallelism,
        }))
    }

    /// Carries the latest checkpoints of layout `from` over to `to`: every
    /// new sequence gets an entry before anything runs.
    async fn change_layout(&self, from: Layout, to: Layout) -> Result<(), PipelineError> {
        if from.parallelism != to.parallelism && !self.config.allow_parallelism_change {
            return Err(fatal(self.store_failure(StoreError::ParallelismChanged {
                dir: self.store.location(),
                checkpoint: CheckpointId(0),
                was: from.parallelism,
                now: to.parallelism,
            })));
        }
        let allowed = AllowedChanges {
            any: self.config.allow_fingerprint_change,
            parallelism: true,
        };
        let fail = |e| fatal(self.store_failure(e));
        let mut positions = SplitPositions::default();
        let mut pending: BTreeMap<usize, Vec<PendingCommit>> = BTreeMap::new();
        let mut next = CheckpointId(0);
        for scope in from.scopes() {
            let checkpoints = self.checkpoints(scope);
            let latest = checkpoints.latest().await.map_err(fail)?;
            let head = checkpoints.head().await.map_err(fail)?;
            next = next.max(head.id_watermark.unwrap_or_default());
            let Some(entry) = latest else {
                let names = checkpoints.list().await.map_err(fail)?;
                if names.is_empty() && head.id_watermark.is_none() {
                    continue;
                }
                return Err(fail(StoreError::NoReadableCheckpoint {
                    dir: checkpoints.location(),
                    history: format!(
                        "changing the layout from {from} to {to} needs its latest checkpoint; {} entries, none readable",
                        names.len()
                    ),
                }));
            };
            check_fingerprint(&checkpoints.location(), &entry, &self.descriptor(), allowed).map_err(fail)?;
            next = next.max(entry.checkpoint.id);
            positions.merge(&entry.checkpoint.positions);
            if head.committed_through.is_some_and(|c| c >= entry.checkpoint.id) {
                continue;
            }
            for (old, list) in &entry.checkpoint.pending {
                pending
                    .entry(old % to.parallelism)
                    .or_default()
                    .extend(list.iter().cloned());
            }
        }
        for list in pending.values_mut() {
            list.sort_by_key(|c| c.checkpoint);
        }
        let id = next.next();
        for scope in to.scopes() {
            let checkpoints = self.checkpoints(scope);
            let sinks = Region::new(scope.region(), to.parallelism, checkpoints.clone()).sinks;
            let data = CheckpointData {
                id,
                positions: positions.clone(),
                pending: sinks
                    .iter()
                    .filter_map(|i| pending.get(i).map(|l| (*i, l.clone())))
                    .collect(),
                previous_parallelism: Some(from.parallelism),
            };
            let entry = CheckpointEntry::new(self.descriptor(), data);
            let epoch = checkpoints
                .take(&crate::store::this_process())
                .await
                .map_err(fail)?
                .epoch;
            checkpoints.reserve_ids(epoch, id).await.map_err(fail)?;
            checkpoints.save(epoch, &entry).await.map_err(fail)?;
        }
        Ok(())
    }

    /// Sets aside the checkpoint sequences layout `layout` does not use.
    async fn retire_unused(&self, layout: Layout) -> Result<(), AttemptFailure> {
        let used = layout.scopes();
        let fail = |e: AccessError| self.store_failure(e.into());
        let regions = self.store.regions().await.map_err(fail)?;
        for region in regions.into_iter().filter(|r| !used.contains(&Scope::Region(*r))) {
            info!(
                region,
                "setting aside the checkpoints of a region the layout no longer has"
            );
            self.store.retire(Scope::Region(region)).await.map_err(fail)?;
        }
        if !used.contains(&Scope::Global) {
            let names = self
                .checkpoints(Scope::Global)
                .list()
                .await
                .map_err(|e| self.store_failure(e))?;
            if !names.is_empty() {
                info!("setting aside the global checkpoints: the layout has regions");
                self.store.retire(Scope::Global).await.map_err(fail)?;
            }
        }
        Ok(())
    }
}

/// A failure while preparing the layout ends the run with its error: nothing
/// ran yet, and the next start tries again.
fn fatal(failure: AttemptFailure) -> PipelineError {
    failure.error
}
