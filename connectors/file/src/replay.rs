//! Whether a fallback to an older checkpoint would write committed files
//! again: read from the names of the committed files in the folder.
//!
//! A committed file is named after the checkpoint whose interval it holds
//! (`part-<pipeline>-<subtask>-<checkpoint>-<run>.<ext>`), and it gets that
//! name only at commit. So a committed file of a later checkpoint than the
//! one about to be restored, written by a subtask whose records this subtask
//! replays, is a commit that the replay duplicates; pending files are not
//! (recovery deletes them). The subtasks whose records this one replays are
//! itself and every `j` with `j % parallelism` equal to it: the old ones it
//! adopts after a lowering of the parallelism, and those of a higher
//! parallelism the pipeline ran at before.

use exactly_core::{CheckpointId, ReplayCheck};

use crate::names::{self, PartName};

/// Whose files count: pipeline `pipeline`'s subtask `subtask` of
/// `parallelism`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Replayer<'a> {
    pub(crate) pipeline: &'a str,
    pub(crate) subtask: usize,
    pub(crate) parallelism: usize,
}

impl Replayer<'_> {
    /// The answer for a replay of everything after `checkpoint`, given the
    /// names of the files in the folder:
    ///
    /// - [`ReplayCheck::CommittedLater`] with the highest such checkpoint
    ///   when a committed file of this pipeline and of a replayed subtask
    ///   holds a later checkpoint;
    /// - otherwise [`ReplayCheck::Unknown`] when a committed file of the
    ///   older form (no pipeline in its name) of a replayed subtask does:
    ///   it may be this pipeline's or another one's;
    /// - otherwise [`ReplayCheck::Safe`].
    ///
    /// The record count is left to the caller, which reads the files
    /// [`later_files`](Self::later_files) names.
    pub(crate) fn check<'n>(&self, checkpoint: CheckpointId, files: impl IntoIterator<Item = &'n str>) -> ReplayCheck {
        let mut ours = None;
        let mut unattributed = false;
        for (_, part) in self.replayed_after(checkpoint, files) {
            match part.pipeline.as_deref() {
                Some(p) if p == self.pipeline => ours = ours.max(Some(part.checkpoint)),
                Some(_) => {}
                None => unattributed = true,
            }
        }
        match ours {
            Some(later) => ReplayCheck::committed_later(CheckpointId(later)),
            None if unattributed => ReplayCheck::Unknown,
            None => ReplayCheck::Safe,
        }
    }

    /// The committed files of this pipeline whose records a replay of
    /// everything after `checkpoint` writes again (the ones behind a
    /// `CommittedLater` of [`check`](Self::check)).
    pub(crate) fn later_files<'n>(
        &self,
        checkpoint: CheckpointId,
        files: impl IntoIterator<Item = &'n str>,
    ) -> Vec<&'n str> {
        self.replayed_after(checkpoint, files)
            .filter(|(_, part)| part.pipeline.as_deref() == Some(self.pipeline))
            .map(|(name, _)| name)
            .collect()
    }

    /// Whether a committed file of the older form (no pipeline in its name)
    /// of a replayed subtask holds a later checkpoint than `checkpoint`: it
    /// may be this pipeline's, so the records of the later commits cannot
    /// be counted.
    pub(crate) fn unattributed_later<'n>(
        &self,
        checkpoint: CheckpointId,
        files: impl IntoIterator<Item = &'n str>,
    ) -> bool {
        self.replayed_after(checkpoint, files)
            .any(|(_, part)| part.pipeline.is_none())
    }

    /// The committed files of any pipeline, with their parsed names, of a
    /// replayed subtask and a checkpoint after `checkpoint`.
    fn replayed_after<'n>(
        &self,
        checkpoint: CheckpointId,
        files: impl IntoIterator<Item = &'n str>,
    ) -> impl Iterator<Item = (&'n str, PartName)> {
        let parallelism = self.parallelism.max(1);
        let subtask = self.subtask;
        files
            .into_iter()
            .filter_map(|name| Some((name, names::parse_committed(name)?)))
            .filter(move |(_, part)| part.subtask % parallelism == subtask && part.checkpoint > checkpoint.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUBTASK_1_OF_2: Replayer<'static> = Replayer {
        pipeline: "orders-to-files",
        subtask: 1,
        parallelism: 2,
    };

    fn check(after: u64, files: &[&str]) -> ReplayCheck {
        SUBTASK_1_OF_2.check(CheckpointId(after), files.iter().copied())
    }

    #[test]
    fn a_committed_file_of_a_later_checkpoint_is_a_commit_the_replay_duplicates() {
        let files = [
            "part-orders-to-files-1-0000000004-0a1b2c3d.txt",
            "part-orders-to-files-1-0000000009-0a1b2c3d.jsonl",
            "part-orders-to-files-1-0000000007-ffffffff.txt",
        ];
        assert_eq!(check(3, &files), ReplayCheck::committed_later(CheckpointId(9)));
        assert_eq!(check(8, &files), ReplayCheck::committed_later(CheckpointId(9)));
        assert_eq!(check(9, &files), ReplayCheck::Safe, "nothing after 9");
        assert_eq!(check(12, &files), ReplayCheck::Safe);
        assert_eq!(
            SUBTASK_1_OF_2.later_files(CheckpointId(5), files),
            [files[1], files[2]],
            "the files whose records come again"
        );
    }

    #[test]
    fn only_the_replayed_subtasks_of_this_pipeline_count() {
        let files = [
            // Pending: recovery deletes it, nothing was committed.
            ".part-orders-to-files-1-0000000009-0a1b2c3d.pending",
            // Subtask 0 is replayed by subtask 0.
            "part-orders-to-files-0-0000000009-0a1b2c3d.txt",
            // Another pipeline in the folder, with a name that starts alike.
            "part-orders-1-0000000009-0a1b2c3d.txt",
            "part-orders-to-files-2-1-0000000009-0a1b2c3d.txt",
            ".exactly-orders-to-files.lock",
        ];
        assert_eq!(check(3, &files), ReplayCheck::Safe);
    }

    #[test]
    fn adopted_and_higher_parallelism_subtasks_count() {
        // Subtask 3 of parallelism 4 is replayed by subtask 1 of 2.
        let files = ["part-orders-to-files-3-0000000006-0a1b2c3d.txt"];
        assert_eq!(check(5, &files), ReplayCheck::committed_later(CheckpointId(6)));
    }

    #[test]
    fn a_later_file_named_in_the_older_form_cannot_be_attributed() {
        let older = ["part-1-0000000006-0a1b2c3d.txt"];
        assert_eq!(check(5, &older), ReplayCheck::Unknown);
        assert_eq!(check(6, &older), ReplayCheck::Safe, "not later");
        let both = [
            "part-1-0000000006-0a1b2c3d.txt",
            "part-orders-to-files-1-0000000006-0a1b2c3d.txt",
        ];
        assert_eq!(check(5, &both), ReplayCheck::committed_later(CheckpointId(6)));
        assert!(SUBTASK_1_OF_2.unattributed_later(CheckpointId(5), both));
        assert!(!SUBTASK_1_OF_2.unattributed_later(CheckpointId(6), both));
    }
}
