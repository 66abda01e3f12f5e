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
use std::sync::Arc;

use tracing::{info, warn};

use super::config::Failover;
use super::region::Region;
use super::{AttemptFailure, Pipeline};
use crate::coordinator::{CheckpointData, PendingCommit};
use crate::error::{PipelineError, StoreError};
use crate::record::{CheckpointId, SplitPositions};
use crate::store::{check_fingerprint, AllowedChanges, CheckpointEntry, CheckpointStore, Layout};

impl Pipeline {
    /// The configured layout.
    fn layout(&self) -> Layout {
        Layout {
            failover: self.config.failover,
            parallelism: self.config.parallelism,
        }
    }

    /// The store of checkpoint sequence `scope` (`None`: the global one).
    fn scope_store(&self, scope: Option<usize>) -> Arc<dyn CheckpointStore> {
        match scope {
            Some(r) => self.store.region(r),
            None => self.store.clone(),
        }
    }

    /// Brings the checkpoint folder to the configured layout (carrying the
    /// old checkpoints over when it changed) and returns the regions to run.
    pub(super) async fn prepare_layout(&self) -> Result<Vec<Region>, PipelineError> {
        let wanted = self.layout();
        let recorded = self
            .with_store(&self.store, |store| store.layout())
            .await
            .map_err(fatal)?;
        let current = match recorded {
            Some(layout) => Some(layout),
            None => self.legacy_layout().await.map_err(fatal)?,
        };
        match current {
            None => {
                self.with_store(&self.store, move |store| store.record_layout(&wanted))
                    .await
                    .map_err(fatal)?;
            }
            Some(current) if current == wanted => {}
            Some(current) => self.change_layout(current, wanted).await?,
        }
        self.retire_unused(wanted).await.map_err(fatal)?;
        Ok(wanted
            .scopes()
            .into_iter()
            .map(|scope| Region::new(scope, self.config.parallelism, self.scope_store(scope)))
            .collect())
    }

    /// A folder written before layouts were recorded holds global entries
    /// (at the parallelism its latest one names), or nothing.
    async fn legacy_layout(&self) -> Result<Option<Layout>, AttemptFailure> {
        let latest = self.with_store(&self.store, |store| store.latest()).await?;
        Ok(latest.map(|entry| Layout {
            failover: Failover::Global,
            parallelism: entry.descriptor.parallelism,
        }))
    }

    /// Carries the latest checkpoints of layout `from` over to `to`.
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
        let mut positions = SplitPositions::default();
        let mut pending: BTreeMap<usize, Vec<PendingCommit>> = BTreeMap::new();
        let mut next = CheckpointId(0);
        for scope in from.scopes() {
            let store = self.scope_store(scope);
            let latest = self.with_store(&store, |store| store.latest()).await.map_err(fatal)?;
            let reserved = self
                .with_store(&store, |store| store.id_watermark())
                .await
                .map_err(fatal)?;
            let committed = self
                .with_store(&store, |store| store.committed_through())
                .await
                .map_err(fatal)?;
            next = next.max(reserved.unwrap_or_default());
            let Some(entry) = latest else {
                let names = self.with_store(&store, |store| store.list()).await.map_err(fatal)?;
                if names.is_empty() && reserved.is_none() {
                    continue;
                }
                return Err(fatal(self.store_failure(StoreError::NoReadableCheckpoint {
                    dir: store.location(),
                    history: format!(
                        "changing the layout from {from} to {to} needs its latest checkpoint; {} entries, none readable",
                        names.len()
                    ),
                })));
            };
            check_fingerprint(store.as_ref(), &entry, &self.descriptor(), allowed)
                .map_err(|e| fatal(self.store_failure(e)))?;
            next = next.max(entry.checkpoint.id);
            positions.merge(&entry.checkpoint.positions);
            if committed.is_some_and(|c| c >= entry.checkpoint.id) {
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
            let sinks = Region::new(scope, to.parallelism, self.scope_store(scope)).sinks;
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
            self.with_store(&self.scope_store(scope), move |store| {
                store.reserve_ids(id)?;
                store.save(&entry)
            })
            .await
            .map_err(fatal)?;
        }
        self.with_store(&self.store, move |store| store.record_layout(&to))
            .await
            .map_err(fatal)?;
        warn!(%from, %to, checkpoint = %id, "changed the checkpoint layout: every old checkpoint sequence was carried over");
        Ok(())
    }

    /// Sets aside the checkpoint sequences layout `layout` does not use.
    async fn retire_unused(&self, layout: Layout) -> Result<(), AttemptFailure> {
        let used = layout.scopes();
        let regions = self.with_store(&self.store, |store| store.regions()).await?;
        for region in regions.into_iter().filter(|r| !used.contains(&Some(*r))) {
            info!(
                region,
                "setting aside the checkpoints of a region the layout no longer has"
            );
            self.with_store(&self.store, move |store| store.retire(Some(region)))
                .await?;
        }
        if !used.contains(&None) {
            let names = self.with_store(&self.store, |store| store.list()).await?;
            if !names.is_empty() {
                info!("setting aside the global checkpoints: the layout has regions");
                self.with_store(&self.store, |store| store.retire(None)).await?;
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
