//! Publishing the offsets of completed checkpoints to the consumer group,
//! for lag tools (best effort; never read back but by `start = "group"`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use exactly_core::{CheckpointId, SplitPositions};
use exactly_kafka_wire::ConsumerClient;
use tokio::sync::watch;

use super::Settings;

/// Position snapshots kept for group commits.
pub(super) const SNAPSHOTS_KEPT: usize = 64;

/// Offsets to commit: by topic, partition → offset.
pub(super) type TopicOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// The latest offsets to commit, and the checkpoint they belong to.
type Latest = Option<(CheckpointId, TopicOffsets)>;

/// Commits checkpointed offsets to the consumer group from a task of its
/// own, one commit at a time; a newer request replaces a pending older one
/// (offsets only grow, so nothing is lost). The outcome of each commit is
/// counted and logged. The task ends once the committer is dropped and
/// the last request is done.
#[derive(Debug)]
pub(super) struct GroupCommitter {
    latest: watch::Sender<Latest>,
}

impl GroupCommitter {
    pub(super) fn start(settings: Arc<Settings>) -> GroupCommitter {
        let (latest, mut requests) = watch::channel::<Latest>(None);
        let mut client = ConsumerClient::new(settings.wire.clone());
        tokio::spawn(async move {
            while requests.changed().await.is_ok() {
                let Some((checkpoint, offsets)) = requests.borrow_and_update().clone() else {
                    continue;
                };
                for (topic, offsets) in &offsets {
                    let result = client.commit_offsets(&settings.group, topic, offsets).await;
                    settings.metrics.committed(result.is_ok());
                    match result {
                        Ok(()) => {
                            tracing::debug!(source = %settings.label, %topic, %checkpoint, "offsets committed to the group")
                        }
                        Err(error) => tracing::warn!(
                            source = %settings.label,
                            %topic,
                            %checkpoint,
                            %error,
                            "committing offsets to the group failed (best effort)"
                        ),
                    }
                }
            }
        });
        GroupCommitter { latest }
    }

    /// Commits `offsets` of `checkpoint` soon, instead of any request not
    /// sent yet.
    pub(super) fn request(&self, checkpoint: CheckpointId, offsets: TopicOffsets) {
        self.latest.send_replace(Some((checkpoint, offsets)));
    }
}

/// Positions recorded at recent barriers, by checkpoint id, so a completed
/// checkpoint's offsets can be committed to the consumer group.
#[derive(Debug, Default)]
pub(super) struct Progress {
    pub(super) recent: VecDeque<(CheckpointId, SplitPositions)>,
    last_completed: Option<CheckpointId>,
}

impl Progress {
    pub(super) fn record(&mut self, checkpoint: CheckpointId, positions: SplitPositions) {
        self.recent.push_back((checkpoint, positions));
        if self.recent.len() > SNAPSHOTS_KEPT {
            self.recent.pop_front();
        }
    }

    /// The positions of completed checkpoint `id`, once per id, never going back.
    pub(super) fn completed(&mut self, id: CheckpointId) -> Option<SplitPositions> {
        if self.last_completed.is_some_and(|last| id <= last) {
            return None;
        }
        self.last_completed = Some(id);
        let found = self.recent.iter().find(|(n, _)| *n == id).map(|(_, p)| p.clone());
        self.recent.retain(|(n, _)| *n > id);
        found
    }
}
