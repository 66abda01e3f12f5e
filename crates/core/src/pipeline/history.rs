//! A region's checkpoint history that cannot be read in full: no readable
//! entry at all (refused unless a first start is accepted), or newer entries
//! than the newest readable one (a fallback, allowed only when the sinks
//! prove the replay harmless or the operator accepts it).

use tracing::warn;

use super::region::Region;
use super::restore::Restored;
use super::{AttemptFailure, Pipeline};
use crate::error::StoreError;
use crate::membership::Epoch;
use crate::record::CheckpointId;
use crate::sink::{ErasedSink, ReplayCheck};
use crate::store::{CheckpointEntry, Checkpoints};

impl Pipeline {
    /// No readable entry: a first start, unless the sequence has a history
    /// (entries that cannot be read, ids reserved by a run that got as far
    /// as a checkpoint). Then it is refused, or with `allow_first_start`
    /// accepted and the unreadable entries set aside (under `epoch`).
    pub(super) async fn check_first_start(
        &self,
        checkpoints: &Checkpoints,
        epoch: Epoch,
        reserved: Option<CheckpointId>,
    ) -> Result<(), AttemptFailure> {
        let fail = |e| self.store_failure(e);
        let names = checkpoints.list().await.map_err(fail)?;
        if names.is_empty() && reserved.is_none() {
            return Ok(());
        }
        let mut history = Vec::new();
        for name in &names {
            history.push(format!(
                "{} ({})",
                name.file_name,
                why_unreadable(checkpoints, &name.file_name).await
            ));
        }
        if let Some(reserved) = reserved {
            history.push(format!("ids reserved up to {reserved}"));
        }
        let history = history.join("; ");
        if !self.config.allow_first_start {
            return Err(self.store_failure(StoreError::NoReadableCheckpoint {
                dir: checkpoints.location(),
                history,
            }));
        }
        warn!(%history, "starting as if for the first time although the checkpoint folder has a history (allow_first_start)");
        for name in names {
            checkpoints.set_aside(epoch, &name.file_name).await.map_err(fail)?;
        }
        Ok(())
    }

    /// The entries newer than `entry` (which the store skipped as
    /// unreadable), each with why it cannot be read.
    pub(super) async fn unreadable_newer_than(
        &self,
        checkpoints: &Checkpoints,
        entry: &CheckpointEntry,
    ) -> Result<Vec<(String, String)>, AttemptFailure> {
        let newest = (entry.checkpoint.id, entry.created_unix_ms);
        let names = checkpoints.list().await.map_err(|e| self.store_failure(e))?;
        let mut unreadable = Vec::new();
        for n in names.into_iter().filter(|n| (n.id, n.created_unix_ms) > newest) {
            let problem = why_unreadable(checkpoints, &n.file_name).await;
            unreadable.push((n.file_name, problem));
        }
        Ok(unreadable)
    }

    /// Restoring the newest readable entry falls back past unreadable newer
    /// ones, or past a committed checkpoint whose entry is gone: allowed when
    /// nothing a later checkpoint committed would be written again — the
    /// store's committed-through record is not past the
    /// restored checkpoint and every sink subtask proves it (or its writes
    /// are replay-safe) — or when `allow_fallback` accepts the duplicates.
    /// The unreadable entries are then set aside.
    pub(super) async fn check_fallback(
        &self,
        region: &Region,
        restored: &Restored,
        sinks: &mut [(usize, Box<dyn ErasedSink>)],
    ) -> Result<(), AttemptFailure> {
        if restored.skipped.is_empty() && restored.gone.is_none() {
            return Ok(());
        }
        let id = restored.id().unwrap_or_default();
        let mut known = Vec::new();
        if let Some(through) = restored.committed_through.filter(|c| *c > id) {
            known.push(format!(
                "every sink committed checkpoint {through} (recorded in committed-through)"
            ));
        }
        let mut duplicates = Duplicates::default();
        for (i, sink) in sinks.iter_mut() {
            let answer = sink
                .check_replay_after(id)
                .await
                .map_err(|e| self.connector_failure(false, e))?;
            duplicates.add(*i, answer);
            match answer {
                ReplayCheck::Safe => {}
                ReplayCheck::CommittedLater { checkpoint, records } => known.push(format!(
                    "sink subtask {i} committed transactions up to checkpoint {checkpoint}{}",
                    records.map_or_else(String::new, |n| format!(" holding {n} records"))
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
            .chain(restored.gone.map(|gone| {
                format!(
                    "the entry of checkpoint {gone} is gone (deleted or moved, not set aside as .unreadable), \
                     although committed-through records that every sink committed it"
                )
            }))
            .collect::<Vec<_>>()
            .join("; ");
        if known.is_empty() {
            warn!(%skipped, checkpoint = %id, "falling back past unreadable checkpoint entries: the sinks prove nothing after the restored checkpoint was committed");
        } else if self.config.allow_fallback {
            warn!(
                %skipped,
                checkpoint = %id,
                known = %known.join("; "),
                duplicates = %duplicates,
                "falling back past unreadable checkpoint entries although later checkpoints may have been committed \
                 (allow_fallback): the records after the restored checkpoint are written again and duplicate what those committed"
            );
        } else {
            return Err(self.store_failure(StoreError::FallbackRefused {
                dir: region.checkpoints.location(),
                skipped,
                restored: id,
                known: known.join("; "),
            }));
        }
        for (name, _) in &restored.skipped {
            region
                .checkpoints
                .set_aside(restored.epoch, name)
                .await
                .map_err(|e| self.store_failure(e))?;
        }
        Ok(())
    }
}

/// Why the entry `name` cannot be read.
async fn why_unreadable(checkpoints: &Checkpoints, name: &str) -> String {
    match checkpoints.read(name).await {
        Ok(_) => "readable now".into(),
        Err(problem) => problem.kind.to_string(),
    }
}

/// The duplicates a fallback writes, from the sinks' answers: the records of
/// the later commits each sink counted, and the subtasks that could not count
/// theirs.
#[derive(Debug, Default)]
struct Duplicates {
    /// The sum of the counts, `None` while no sink counted.
    counted: Option<u64>,
    uncounted: Vec<usize>,
}

impl Duplicates {
    fn add(&mut self, subtask: usize, answer: ReplayCheck) {
        match answer {
            ReplayCheck::Safe => {}
            ReplayCheck::CommittedLater {
                records: Some(records), ..
            } => self.counted = Some(self.counted.unwrap_or(0) + records),
            ReplayCheck::CommittedLater { records: None, .. } | ReplayCheck::Unknown => self.uncounted.push(subtask),
        }
    }
}

impl std::fmt::Display for Duplicates {
    /// `1234 records`, `at least 1234 records (sink subtasks [1] cannot count theirs)`,
    /// or `unknown (sink subtasks [0, 1] cannot count theirs)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.counted, self.uncounted.is_empty()) {
            (Some(n), true) => write!(f, "{n} records"),
            (Some(n), false) => write!(
                f,
                "at least {n} records (sink subtasks {:?} cannot count theirs)",
                self.uncounted
            ),
            (None, true) => write!(f, "none counted by the sinks"),
            (None, false) => write!(f, "unknown (sink subtasks {:?} cannot count theirs)", self.uncounted),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_add_up_what_the_sinks_counted_and_name_who_could_not() {
        let mut d = Duplicates::default();
        d.add(0, ReplayCheck::Safe);
        assert_eq!(d.to_string(), "none counted by the sinks");
        d.add(
            1,
            ReplayCheck::CommittedLater {
                checkpoint: CheckpointId(7),
                records: Some(120),
            },
        );
        d.add(
            2,
            ReplayCheck::CommittedLater {
                checkpoint: CheckpointId(9),
                records: Some(30),
            },
        );
        assert_eq!((d.counted, d.to_string()), (Some(150), "150 records".to_string()));
        d.add(3, ReplayCheck::Unknown);
        d.add(4, ReplayCheck::committed_later(CheckpointId(8)));
        assert_eq!(
            d.to_string(),
            "at least 150 records (sink subtasks [3, 4] cannot count theirs)"
        );
    }
}
