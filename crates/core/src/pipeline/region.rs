//! A region: subtasks that exchange records, and so checkpoint, commit and
//! fail over together. In global failover one region holds every subtask;
//! in region failover source subtask `i` feeds sink subtask `i` only, and
//! each such forward chain is a region of its own, with its own checkpoint
//! store (`<dir>/<pipeline>/region-<i>/`), coordinator and restarts.

use tokio::task::JoinHandle;

use crate::coordinator::TaskId;
use crate::retention::RestorableCheckpoints;
use crate::store::{Checkpoints, EntryName};

/// The oldest of `entries` (the store's retained entries).
pub(super) fn oldest(entries: &[EntryName]) -> Option<crate::record::CheckpointId> {
    entries.iter().map(|e| e.id).min()
}

/// The subtasks of one region and where its checkpoints live.
pub(super) struct Region {
    /// `Some(i)` for region `i`; `None` for the one region of global failover.
    pub(super) index: Option<usize>,
    /// Pipeline-wide indices of its source subtasks.
    pub(super) sources: Vec<usize>,
    /// Pipeline-wide indices of its sink subtasks.
    pub(super) sinks: Vec<usize>,
    /// Its checkpoint sequence.
    pub(super) checkpoints: Checkpoints,
    /// The oldest checkpoint of the region that may still be restored, for
    /// its sinks.
    pub(super) restorable: RestorableCheckpoints,
    /// A checkpoint write still running when an attempt failed. The next
    /// attempt waits for it before reading the store, so it never restores an
    /// older checkpoint while a newer one is landing (the fence of the next
    /// attempt would refuse it anyway, or make it visible; waiting keeps a
    /// write that would land from being thrown away).
    persisting: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Region {
    /// Region `index` of `parallelism` (`None`: all subtasks in one).
    pub(super) fn new(index: Option<usize>, parallelism: usize, checkpoints: Checkpoints) -> Region {
        let subtasks: Vec<usize> = match index {
            Some(i) => vec![i],
            None => (0..parallelism).collect(),
        };
        Region {
            index,
            sources: subtasks.clone(),
            sinks: subtasks,
            checkpoints,
            restorable: RestorableCheckpoints::default(),
            persisting: std::sync::Mutex::new(None),
        }
    }

    /// The tasks whose acknowledgements complete a checkpoint of the region.
    pub(super) fn tasks(&self) -> Vec<TaskId> {
        let sources = self.sources.iter().copied().map(TaskId::Source);
        sources.chain(self.sinks.iter().copied().map(TaskId::Sink)).collect()
    }

    /// Remembers the write of a checkpoint of this region in progress.
    pub(super) fn writing(&self, write: JoinHandle<()>) {
        *self.persisting.lock().unwrap_or_else(|e| e.into_inner()) = Some(write);
    }

    /// Waits for a write an earlier attempt left running.
    pub(super) async fn wait_for_previous_write(&self) {
        let previous = self.persisting.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(write) = previous {
            let _ = write.await;
        }
    }

    /// `region 3`, or `global` for the one region of global failover.
    pub(super) fn label(&self) -> String {
        self.index
            .map_or_else(|| "global".to_string(), |i| format!("region {i}"))
    }
}
