//! Which commit markers a sink subtask may delete: a pure account of the
//! order of its begins and commits.
//!
//! A marker (a row of the commit-log table written inside the prepared
//! transaction) is what lets a repeated `COMMIT PREPARED` of a gid that is no
//! longer prepared tell "already committed" from "lost". Repeated commits
//! happen in `recover`, for the transactions the restored checkpoint lists.
//! Deleting the marker of a transaction that a restorable checkpoint still
//! lists turns a good restore into a false [`DataLoss`](exactly_core::ConnectorError::DataLoss).
//!
//! # The rule
//!
//! The marker of transaction `c` may be deleted once the sink has committed a
//! transaction `d` that it *began after the commit of `c` had returned*, the
//! oldest checkpoint the pipeline may still restore
//! ([`SinkContext::restorable`](exactly_core::SinkContext::restorable)) is at
//! or above `d`'s checkpoint, and the marker is older than
//! `commit_log_retention`.
//!
//! Why that is safe for the latest checkpoint: a checkpoint lists `c` only if
//! this subtask acknowledged it while `c` was still uncommitted, that is
//! before the commit of `c` returned (the sink task acknowledges with its
//! uncommitted committables, and commits and acknowledges one at a time). The
//! runtime begins `d` for checkpoint `last acknowledged + 1`, so `d`'s
//! checkpoint is above every checkpoint that lists `c`. `d` is committed only
//! after a checkpoint at or above `d`'s was persisted: from then on the latest
//! checkpoint no longer lists `c`, and no later one will. Transactions
//! committed in `recover` were committed before anything of the run began, so
//! the first commit of the run releases them (and every marker of earlier
//! runs).
//!
//! The same holds for every *older* entry kept by `[checkpoint] retain`
//! (restored only when every newer one is unreadable): each restorable entry
//! is at or above the oldest restorable checkpoint, hence at or above `d`'s.
//! While the oldest restorable checkpoint is unknown (a sink built outside
//! the runtime), only the latest checkpoint is protected by the rule, and
//! older entries by `commit_log_retention` alone.
//!
//! What follows for a fallback to an older entry `n`: a deleted marker's
//! checkpoint is below `d`'s, which is at or below the oldest restorable
//! checkpoint at the time, which is at or below `n` (the oldest restorable
//! checkpoint only rises). So every marker of a checkpoint after `n` is still
//! there, and the records they count are exactly what the replay duplicates.
//!
//! Checkpoint numbers here are the ones in the gids (the checkpoint passed to
//! `begin`).

use std::collections::BTreeMap;

/// The account of one sink subtask (and the subtasks it owns).
#[derive(Debug, Default)]
pub(crate) struct MarkerFloor {
    /// The highest checkpoint of a transaction known committed.
    committed: Option<u64>,
    /// Transactions begun and not committed yet: checkpoint → `committed` at
    /// their begin.
    begun: BTreeMap<u64, Option<u64>>,
    /// Commits whose release waits for the oldest restorable checkpoint to
    /// reach them: checkpoint of `d` → the markers it releases (at or below).
    releases: BTreeMap<u64, u64>,
    /// Markers of checkpoints at or below this may be deleted.
    floor: Option<u64>,
}

impl MarkerFloor {
    /// Recovery committed (or found committed) transactions up to checkpoint
    /// `committed`, before anything of this run began.
    pub(crate) fn recovered(&mut self, committed: Option<u64>) {
        self.committed = self.committed.max(committed);
    }

    /// A transaction for `checkpoint` began (a later begin of the same
    /// checkpoint, after an abort, replaces the earlier one).
    pub(crate) fn began(&mut self, checkpoint: u64) {
        self.begun.insert(checkpoint, self.committed);
    }

    /// The commit of the transaction of `checkpoint` returned.
    pub(crate) fn committed(&mut self, checkpoint: u64) {
        // Commits come in checkpoint order: what began before and is still
        // here was aborted, or is this one.
        let mut released = None;
        while let Some(entry) = self.begun.first_entry() {
            if *entry.key() > checkpoint {
                break;
            }
            let (begun, committed_then) = entry.remove_entry();
            if begun == checkpoint {
                released = committed_then;
            }
        }
        if let Some(released) = released {
            let entry = self.releases.entry(checkpoint).or_insert(released);
            *entry = (*entry).max(released);
        }
        self.committed = self.committed.max(Some(checkpoint));
    }

    /// Markers of checkpoints at or below this may be deleted (`None`:
    /// none yet), given the oldest checkpoint that may still be restored
    /// (`None`: unknown, so only the latest checkpoint is protected).
    pub(crate) fn floor(&mut self, restorable: Option<u64>) -> Option<u64> {
        let waiting = match restorable {
            Some(oldest) => self.releases.split_off(&oldest.saturating_add(1)),
            None => BTreeMap::new(),
        };
        let settled = std::mem::replace(&mut self.releases, waiting);
        self.floor = self.floor.max(settled.into_values().max());
        self.floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_is_released_by_the_commit_of_a_transaction_begun_after_its_commit() {
        let mut m = MarkerFloor::default();
        m.recovered(None);
        m.began(1);
        m.began(2); // checkpoint 1 failed: 1 and 2 are both pending
        m.committed(1);
        assert_eq!(
            m.floor(None),
            None,
            "the checkpoint that lists 1 may still be the latest"
        );
        m.committed(2);
        assert_eq!(
            m.floor(None),
            None,
            "2 began before 1 was committed: 1 may be listed with 2"
        );
        m.began(3);
        assert_eq!(m.floor(None), None, "3 is not committed yet");
        m.committed(3);
        assert_eq!(m.floor(None), Some(2), "3 began after 1 and 2 were committed");
    }

    #[test]
    fn recovered_commits_are_released_by_the_first_commit_of_the_run() {
        let mut m = MarkerFloor::default();
        m.recovered(Some(40));
        m.began(45);
        assert_eq!(m.floor(None), None);
        m.committed(45);
        assert_eq!(m.floor(None), Some(40));
    }

    #[test]
    fn a_release_waits_until_the_oldest_restorable_checkpoint_reaches_the_releasing_commit() {
        let mut m = MarkerFloor::default();
        m.began(1);
        m.committed(1);
        m.began(2);
        m.committed(2); // releases 1
        m.began(3);
        m.committed(3); // releases 2
        assert_eq!(m.floor(Some(1)), None, "checkpoint 1 may be restored and lists 1");
        assert_eq!(
            m.floor(Some(2)),
            Some(1),
            "every restorable entry began after 1's commit"
        );
        assert_eq!(m.floor(Some(2)), Some(1), "asking again changes nothing");
        m.began(4);
        m.committed(4); // releases 3
        assert_eq!(m.floor(Some(3)), Some(2));
        assert_eq!(m.floor(Some(9)), Some(3));
        assert_eq!(m.floor(Some(0)), Some(3), "the floor never falls");
    }

    #[test]
    fn no_marker_after_a_restorable_checkpoint_is_ever_released() {
        // Whatever the order of begins and commits and however the oldest
        // restorable checkpoint rises, the floor stays below it.
        let mut m = MarkerFloor::default();
        let mut oldest = 0;
        for checkpoint in 1..200u64 {
            m.began(checkpoint);
            if checkpoint % 3 != 0 {
                m.committed(checkpoint);
            }
            if checkpoint % 7 == 0 {
                oldest = checkpoint - 5;
            }
            if let Some(floor) = m.floor(Some(oldest)) {
                assert!(floor < oldest, "floor {floor} with restorable {oldest}");
            }
        }
        assert!(m.floor(Some(oldest)).is_some());
    }

    #[test]
    fn aborted_and_repeated_begins_are_forgotten() {
        let mut m = MarkerFloor::default();
        m.began(1);
        m.committed(1);
        m.began(2); // aborted
        m.began(2); // again, after the abort
        m.began(3);
        m.committed(3);
        assert_eq!(m.floor(None), Some(1));
        assert!(m.begun.is_empty(), "the aborted begin of 2 is gone");
        m.began(4);
        m.committed(4);
        assert_eq!(m.floor(None), Some(3), "the floor only rises");
    }
}
