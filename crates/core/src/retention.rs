//! Which checkpoints may still be restored: what a sink needs to know to
//! prune its "already committed" markers safely instead of guessing.
//!
//! A region restores its latest complete checkpoint, or an older retained
//! entry when every newer one is unreadable; entries beyond `retain` are
//! deleted, so a checkpoint older than the oldest retained entry is never
//! restored again. The runtime records that oldest id after reading the
//! store and after every persist (once the older entries are pruned) in
//! the [`RestorableCheckpoints`] of the region, which every sink subtask of
//! the region finds in [`SinkContext::restorable`](crate::SinkContext::restorable).
//!
//! How a sink uses it: a marker of transaction `c` is needed while a
//! restorable checkpoint may list `c`, that is one acknowledged before the
//! commit of `c` returned. Any transaction the subtask begins after that
//! commit returned is for a checkpoint above all of those (the runtime
//! begins the interval after the last acknowledged barrier), so once the
//! oldest restorable checkpoint is at or above the checkpoint of such a
//! begin, no restorable checkpoint lists `c` and its marker may go.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::record::CheckpointId;

const UNKNOWN: u64 = u64::MAX;

/// The oldest checkpoint id of a region that may still be restored, shared
/// between the runtime (which sets it) and the region's sinks (which read
/// it). Clones share the value.
///
/// A region restores its latest complete checkpoint, or an older retained
/// entry when every newer one is unreadable; older entries are deleted, so
/// a checkpoint older than the oldest retained entry is never restored
/// again. How a sink uses it to prune its "already committed" markers: a
/// marker of transaction `c` is needed while a restorable checkpoint may
/// list `c`, that is one acknowledged before the commit of `c` returned.
/// Any transaction the subtask begins after that commit returned is for a
/// checkpoint above all of those, so once the oldest restorable checkpoint
/// is at or above the checkpoint of such a begin, no restorable checkpoint
/// lists `c` and its marker may go.
#[derive(Clone, Debug)]
pub struct RestorableCheckpoints(Arc<AtomicU64>);

impl Default for RestorableCheckpoints {
    fn default() -> Self {
        RestorableCheckpoints(Arc::new(AtomicU64::new(UNKNOWN)))
    }
}

impl RestorableCheckpoints {
    /// The oldest checkpoint that may still be restored, `None` while
    /// unknown (before the runtime read the store, or a context built by a
    /// test): then keep every marker a restore might need.
    pub fn oldest(&self) -> Option<CheckpointId> {
        match self.0.load(Ordering::SeqCst) {
            UNKNOWN => None,
            id => Some(CheckpointId(id)),
        }
    }

    /// Records the oldest id among the store's retained entries (`None`:
    /// unknown). The runtime calls it; a sink never does.
    pub fn set(&self, oldest: Option<CheckpointId>) {
        self.0
            .store(oldest.map_or(UNKNOWN, |id| id.0.min(UNKNOWN - 1)), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_until_set_and_shared_by_clones() {
        let floor = RestorableCheckpoints::default();
        let seen_by_a_sink = floor.clone();
        assert_eq!(seen_by_a_sink.oldest(), None);
        floor.set(Some(CheckpointId(0)));
        assert_eq!(seen_by_a_sink.oldest(), Some(CheckpointId(0)));
        floor.set(Some(CheckpointId(7)));
        assert_eq!(seen_by_a_sink.oldest(), Some(CheckpointId(7)));
        floor.set(None);
        assert_eq!(seen_by_a_sink.oldest(), None);
    }
}
