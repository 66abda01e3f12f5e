//! The checkpoint coordinator as a pure state machine: events in, actions out, no
//! I/O and no clock of its own (time arrives with the events). The runtime in
//! [`crate::pipeline`] performs the actions; tests drive it directly.
//!
//! Protocol for checkpoint `N`:
//! 1. `Trigger(N)`: the runtime injects barrier `N` into every source subtask.
//! 2. Every source subtask acks with its position, every sink subtask (after its
//!    barriers aligned and it pre-committed) acks with its pending committables.
//! 3. When every task acked: `Persist(N)`; the runtime writes the checkpoint durably.
//! 4. Only after `Persisted(N)`: `Complete(N)`; sinks commit every pending
//!    committable with id ≤ N. A lost `Complete` is covered by the next one.
//!
//! A checkpoint that is declined or times out is aborted; sinks keep their
//! pre-committed transactions, which roll into the next checkpoint's state.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::record::{CheckpointId, SplitPositions};

/// Checkpoint timing and failure tolerance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Time between the starts of two checkpoints.
    pub interval: Duration,
    /// Minimum time between the end of one checkpoint and the start of the next.
    pub min_pause: Duration,
    /// A checkpoint not fully acknowledged after this long is aborted.
    pub timeout: Duration,
    /// Consecutive failed checkpoints tolerated before the pipeline fails.
    pub tolerable_failures: u32,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            interval: Duration::from_secs(1),
            min_pause: Duration::ZERO,
            timeout: Duration::from_secs(60),
            tolerable_failures: 3,
        }
    }
}

/// A participant of the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaskId {
    /// Source subtask `i`.
    Source(usize),
    /// Sink subtask `i`.
    Sink(usize),
}

/// A pre-committed transaction waiting for its checkpoint to complete.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingCommit {
    /// The checkpoint whose interval the transaction holds.
    pub checkpoint: CheckpointId,
    /// The sink's committable.
    pub committable: serde_json::Value,
}

/// What a task reports when it acknowledges a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskState {
    /// A source subtask's positions at the barrier.
    Source(SplitPositions),
    /// A sink subtask's pre-committed, not yet committed transactions (oldest first).
    Sink(Vec<PendingCommit>),
}

/// The content of a complete checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointData {
    /// Checkpoint id.
    pub id: CheckpointId,
    /// Positions of every source split.
    pub positions: SplitPositions,
    /// Per sink subtask, the committables to commit on completion or recovery.
    pub pending: BTreeMap<usize, Vec<PendingCommit>>,
    /// Set in the first entry after a change of the parallelism: the old
    /// one. The sink subtasks that no longer exist are adopted from it (see
    /// `SinkContext::adopted`); `pending` is already keyed by the new
    /// subtasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_parallelism: Option<usize>,
}

/// Inputs of the state machine.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Time passed.
    Tick {
        /// The driver's clock, in milliseconds since it started.
        now_ms: u64,
    },
    /// A task acknowledged a checkpoint.
    Ack {
        /// The checkpoint acknowledged.
        checkpoint: CheckpointId,
        /// Who acknowledged it.
        task: TaskId,
        /// What it reports with it.
        state: TaskState,
    },
    /// A task could not take part in a checkpoint (e.g. pre-commit failed).
    Decline {
        /// The checkpoint declined.
        checkpoint: CheckpointId,
        /// Who declined it.
        task: TaskId,
        /// Why (the task's error, as text).
        reason: String,
    },
    /// The checkpoint was written durably.
    Persisted {
        /// The checkpoint written.
        checkpoint: CheckpointId,
        /// The driver's clock when the write ended.
        now_ms: u64,
    },
    /// Writing the checkpoint failed.
    PersistFailed {
        /// The checkpoint whose write failed.
        checkpoint: CheckpointId,
        /// What the store reported.
        reason: String,
        /// The driver's clock when the write ended.
        now_ms: u64,
    },
    /// Take a checkpoint as soon as possible, ignoring the interval (end of input,
    /// graceful shutdown).
    RequestCheckpoint,
}

/// Outputs of the state machine, for the runtime to carry out in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Inject barrier `checkpoint` into every source subtask.
    Trigger {
        /// The new checkpoint.
        checkpoint: CheckpointId,
    },
    /// Write this checkpoint durably, then report `Persisted` or `PersistFailed`.
    Persist {
        /// What to write.
        data: CheckpointData,
    },
    /// The checkpoint is durable: notify every task (sinks commit ≤ id).
    Complete {
        /// The durable checkpoint.
        checkpoint: CheckpointId,
    },
    /// The checkpoint was abandoned.
    Abort {
        /// The abandoned checkpoint.
        checkpoint: CheckpointId,
        /// Why.
        reason: AbortReason,
    },
    /// Too many consecutive checkpoint failures: fail the pipeline.
    Fail {
        /// Consecutive failed checkpoints, the last one included.
        failures: u32,
        /// Why the last one failed.
        reason: AbortReason,
    },
}

/// Why a checkpoint was abandoned ([`Action::Abort`], [`Action::Fail`]).
/// Metrics tell the causes apart by matching on it; its
/// [`Display`](std::fmt::Display) is the sentence logs and errors show.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AbortReason {
    /// Not every task acknowledged it within the checkpoint timeout.
    #[error("timed out after {timeout_ms} ms with {acknowledged} of {expected} acknowledgements")]
    TimedOut {
        /// The configured timeout.
        timeout_ms: u64,
        /// Tasks that had acknowledged it.
        acknowledged: usize,
        /// Tasks that had to.
        expected: usize,
    },
    /// A task could not take part ([`Event::Decline`]).
    #[error("{task:?} declined: {error}")]
    Declined {
        /// The task that declined.
        task: TaskId,
        /// What it reported.
        error: String,
    },
    /// Writing the checkpoint failed ([`Event::PersistFailed`]).
    #[error("persisting failed: {error}")]
    PersistFailed {
        /// What the store reported.
        error: String,
    },
}

impl AbortReason {
    /// True when the checkpoint ran out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, AbortReason::TimedOut { .. })
    }
}

#[derive(Clone, Debug)]
struct InFlight {
    id: CheckpointId,
    triggered_ms: u64,
    acks: BTreeMap<TaskId, TaskState>,
    persisting: bool,
}

/// The coordinator state machine. See the module documentation.
#[derive(Clone, Debug)]
pub struct Coordinator {
    config: CheckpointConfig,
    /// Every task that must acknowledge a checkpoint.
    tasks: BTreeSet<TaskId>,
    next_id: CheckpointId,
    in_flight: Option<InFlight>,
    last_completed: Option<CheckpointId>,
    last_triggered_ms: u64,
    last_ended_ms: Option<u64>,
    consecutive_failures: u32,
    requested: bool,
    failed: bool,
}

impl Coordinator {
    /// A coordinator for `sources` source and `sinks` sink subtasks, resuming
    /// after `restored` (the id of the checkpoint the pipeline restored from, if
    /// any). The first checkpoint is triggered one interval after `now_ms`.
    ///
    /// `used` is the highest id any earlier run may have triggered (the store's id
    /// watermark): new ids start above both, so an id is never reused, even for a
    /// checkpoint that was triggered and then lost in a crash.
    pub fn new(
        config: CheckpointConfig,
        sources: usize,
        sinks: usize,
        restored: Option<CheckpointId>,
        used: Option<CheckpointId>,
        now_ms: u64,
    ) -> Self {
        let tasks = (0..sources).map(TaskId::Source).chain((0..sinks).map(TaskId::Sink));
        Self::for_tasks(config, tasks, restored, used, now_ms)
    }

    /// Like [`new`](Self::new), for exactly the tasks `tasks` (a region's
    /// subtasks, keeping their pipeline-wide indices).
    pub fn for_tasks(
        config: CheckpointConfig,
        tasks: impl IntoIterator<Item = TaskId>,
        restored: Option<CheckpointId>,
        used: Option<CheckpointId>,
        now_ms: u64,
    ) -> Self {
        Coordinator {
            config,
            tasks: tasks.into_iter().collect(),
            next_id: restored.max(used).map(CheckpointId::next).unwrap_or(CheckpointId(1)),
            in_flight: None,
            last_completed: restored,
            last_triggered_ms: now_ms,
            last_ended_ms: None,
            consecutive_failures: 0,
            requested: false,
            failed: false,
        }
    }

    /// The latest checkpoint that completed (or was restored).
    pub fn last_completed(&self) -> Option<CheckpointId> {
        self.last_completed
    }

    /// The checkpoint in flight, if any.
    pub fn in_flight(&self) -> Option<CheckpointId> {
        self.in_flight.as_ref().map(|f| f.id)
    }

    /// Consecutive failed checkpoints so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// The earliest `now_ms` at which an [`Event::Tick`] leads to an action
    /// (the next checkpoint's trigger, or the timeout of the one in flight),
    /// so a driver can sleep until then instead of ticking: a tick before it
    /// changes nothing. `None` while no tick can (a checkpoint is being
    /// persisted, or the coordinator has failed). Other events move it; ask
    /// again after each.
    pub fn next_tick_ms(&self) -> Option<u64> {
        if self.failed {
            return None;
        }
        let ms = |d: Duration| d.as_millis() as u64;
        match &self.in_flight {
            Some(f) if f.persisting => None,
            Some(f) => Some(f.triggered_ms.saturating_add(ms(self.config.timeout))),
            None if self.requested => Some(0),
            None => {
                let interval = self.last_triggered_ms.saturating_add(ms(self.config.interval));
                let pause = self
                    .last_ended_ms
                    .map_or(0, |end| end.saturating_add(ms(self.config.min_pause)));
                Some(interval.max(pause))
            }
        }
    }

    /// Feeds one event and returns the actions it leads to.
    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.failed {
            return actions;
        }
        match event {
            Event::Tick { now_ms } => {
                self.check_timeout(now_ms, &mut actions);
                self.maybe_trigger(now_ms, &mut actions);
            }
            Event::RequestCheckpoint => {
                self.requested = true;
            }
            Event::Ack {
                checkpoint,
                task,
                state,
            } => {
                let expected = self.tasks.len();
                let known = self.tasks.contains(&task);
                if let Some(f) = self.in_flight.as_mut().filter(|f| f.id == checkpoint && !f.persisting) {
                    if known {
                        f.acks.insert(task, state);
                    }
                    if f.acks.len() == expected {
                        f.persisting = true;
                        actions.push(Action::Persist {
                            data: Self::assemble(f),
                        });
                    }
                }
            }
            Event::Decline {
                checkpoint,
                task,
                reason,
            } => {
                if self
                    .in_flight
                    .as_ref()
                    .is_some_and(|f| f.id == checkpoint && !f.persisting)
                {
                    self.abort(AbortReason::Declined { task, error: reason }, None, &mut actions);
                }
            }
            Event::Persisted { checkpoint, now_ms } => {
                if self
                    .in_flight
                    .as_ref()
                    .is_some_and(|f| f.id == checkpoint && f.persisting)
                {
                    self.in_flight = None;
                    self.last_completed = Some(checkpoint);
                    self.last_ended_ms = Some(now_ms);
                    self.consecutive_failures = 0;
                    actions.push(Action::Complete { checkpoint });
                }
            }
            Event::PersistFailed {
                checkpoint,
                reason,
                now_ms,
            } => {
                if self
                    .in_flight
                    .as_ref()
                    .is_some_and(|f| f.id == checkpoint && f.persisting)
                {
                    self.abort(AbortReason::PersistFailed { error: reason }, Some(now_ms), &mut actions);
                }
            }
        }
        actions
    }

    fn assemble(f: &InFlight) -> CheckpointData {
        let mut data = CheckpointData {
            id: f.id,
            ..CheckpointData::default()
        };
        for (task, state) in &f.acks {
            match (task, state) {
                (_, TaskState::Source(p)) => data.positions.merge(p),
                (TaskId::Sink(i), TaskState::Sink(pending)) => {
                    // Only transactions up to this checkpoint belong to it.
                    let listed = pending.iter().filter(|p| p.checkpoint <= f.id).cloned().collect();
                    data.pending.insert(*i, listed);
                }
                (TaskId::Source(_), TaskState::Sink(_)) => {}
            }
        }
        data
    }

    fn check_timeout(&mut self, now_ms: u64, actions: &mut Vec<Action>) {
        let timeout = self.config.timeout.as_millis() as u64;
        if let Some(f) = &self.in_flight {
            if !f.persisting && now_ms.saturating_sub(f.triggered_ms) >= timeout {
                let reason = AbortReason::TimedOut {
                    timeout_ms: timeout,
                    acknowledged: f.acks.len(),
                    expected: self.tasks.len(),
                };
                self.abort(reason, Some(now_ms), actions);
            }
        }
    }

    fn maybe_trigger(&mut self, now_ms: u64, actions: &mut Vec<Action>) {
        if self.failed || self.in_flight.is_some() {
            return;
        }
        let interval_due = now_ms >= self.last_triggered_ms + self.config.interval.as_millis() as u64;
        let pause_done = self
            .last_ended_ms
            .is_none_or(|end| now_ms >= end + self.config.min_pause.as_millis() as u64);
        if !(self.requested || interval_due && pause_done) {
            return;
        }
        self.requested = false;
        let id = self.next_id;
        self.next_id = id.next();
        self.last_triggered_ms = now_ms;
        self.in_flight = Some(InFlight {
            id,
            triggered_ms: now_ms,
            acks: BTreeMap::new(),
            persisting: false,
        });
        actions.push(Action::Trigger { checkpoint: id });
    }

    fn abort(&mut self, reason: AbortReason, now_ms: Option<u64>, actions: &mut Vec<Action>) {
        let Some(f) = self.in_flight.take() else { return };
        if now_ms.is_some() {
            self.last_ended_ms = now_ms;
        }
        self.consecutive_failures += 1;
        actions.push(Action::Abort {
            checkpoint: f.id,
            reason: reason.clone(),
        });
        if self.consecutive_failures > self.config.tolerable_failures {
            self.failed = true;
            actions.push(Action::Fail {
                failures: self.consecutive_failures,
                reason,
            });
        }
    }
}

/// A sink subtask's record of pre-committed transactions, pure like the
/// coordinator. Completion of checkpoint `N` releases every entry with id ≤ `N`,
/// oldest first, so a lost notification is covered by the next one.
#[derive(Clone, Debug, Default)]
pub struct CommitLedger<C = serde_json::Value> {
    pending: BTreeMap<CheckpointId, C>,
}

impl<C: Clone> CommitLedger<C> {
    /// An empty ledger.
    pub fn new() -> Self {
        CommitLedger {
            pending: BTreeMap::new(),
        }
    }

    /// Records the committable of checkpoint `checkpoint`'s transaction.
    pub fn add(&mut self, checkpoint: CheckpointId, committable: C) {
        self.pending.insert(checkpoint, committable);
    }

    /// What to commit now that `completed` is durable, oldest first. Entries stay
    /// until [`mark_committed`](Self::mark_committed).
    pub fn due(&self, completed: CheckpointId) -> Vec<(CheckpointId, C)> {
        self.pending
            .range(..=completed)
            .map(|(id, c)| (*id, c.clone()))
            .collect()
    }

    /// The transaction of `checkpoint` was committed.
    pub fn mark_committed(&mut self, checkpoint: CheckpointId) {
        self.pending.remove(&checkpoint);
    }

    /// Every pre-committed, not yet committed entry, oldest first.
    pub fn entries(&self) -> Vec<(CheckpointId, C)> {
        self.pending.iter().map(|(id, c)| (*id, c.clone())).collect()
    }

    /// True when nothing waits for a commit.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

impl CommitLedger<serde_json::Value> {
    /// The ledger as checkpoint state.
    pub fn snapshot(&self) -> Vec<PendingCommit> {
        self.entries()
            .into_iter()
            .map(|(checkpoint, committable)| PendingCommit {
                checkpoint,
                committable,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CheckpointConfig {
        CheckpointConfig {
            interval: Duration::from_millis(100),
            min_pause: Duration::from_millis(50),
            timeout: Duration::from_millis(1000),
            tolerable_failures: 1,
        }
    }

    fn ack_all(c: &mut Coordinator, id: CheckpointId) -> Vec<Action> {
        let mut out = c.handle(Event::Ack {
            checkpoint: id,
            task: TaskId::Source(0),
            state: TaskState::Source(SplitPositions::default()),
        });
        out.extend(c.handle(Event::Ack {
            checkpoint: id,
            task: TaskId::Sink(0),
            state: TaskState::Sink(vec![PendingCommit {
                checkpoint: id,
                committable: serde_json::json!(id.0),
            }]),
        }));
        out
    }

    #[test]
    fn the_next_tick_is_due_at_the_interval_the_pause_the_timeout_or_at_once_when_requested() {
        let mut c = Coordinator::new(cfg(), 1, 1, None, None, 0);
        assert_eq!(c.next_tick_ms(), Some(100), "one interval after the start");
        assert!(c.handle(Event::Tick { now_ms: 99 }).is_empty());
        c.handle(Event::Tick { now_ms: 100 });
        assert_eq!(c.next_tick_ms(), Some(1100), "the timeout of the checkpoint in flight");
        ack_all(&mut c, CheckpointId(1));
        assert_eq!(c.next_tick_ms(), None, "nothing a tick can do while it is persisted");
        c.handle(Event::Persisted {
            checkpoint: CheckpointId(1),
            now_ms: 180,
        });
        assert_eq!(
            c.next_tick_ms(),
            Some(230),
            "the pause after the end outlasts the interval"
        );
        c.handle(Event::RequestCheckpoint);
        assert_eq!(c.next_tick_ms(), Some(0), "a requested checkpoint is due at once");
        assert_eq!(
            c.handle(Event::Tick { now_ms: 181 }),
            vec![Action::Trigger {
                checkpoint: CheckpointId(2)
            }]
        );
    }

    #[test]
    fn complete_only_after_persisted() {
        let mut c = Coordinator::new(cfg(), 1, 1, None, None, 0);
        assert!(c.handle(Event::Tick { now_ms: 50 }).is_empty());
        assert_eq!(
            c.handle(Event::Tick { now_ms: 100 }),
            vec![Action::Trigger {
                checkpoint: CheckpointId(1)
            }]
        );
        let actions = ack_all(&mut c, CheckpointId(1));
        assert!(matches!(&actions[..], [Action::Persist { data }] if data.pending[&0].len() == 1));
        assert!(
            c.handle(Event::Tick { now_ms: 5000 }).is_empty(),
            "no timeout while persisting"
        );
        assert_eq!(
            c.handle(Event::Persisted {
                checkpoint: CheckpointId(1),
                now_ms: 5000
            }),
            vec![Action::Complete {
                checkpoint: CheckpointId(1)
            }]
        );
        // min pause after the end of the checkpoint
        assert!(c.handle(Event::Tick { now_ms: 5040 }).is_empty());
        assert_eq!(
            c.handle(Event::Tick { now_ms: 5050 }),
            vec![Action::Trigger {
                checkpoint: CheckpointId(2)
            }]
        );
    }

    #[test]
    fn timeouts_abort_and_too_many_fail_the_pipeline() {
        let mut c = Coordinator::new(cfg(), 1, 1, Some(CheckpointId(7)), Some(CheckpointId(5)), 0);
        assert_eq!(
            c.handle(Event::Tick { now_ms: 100 }),
            vec![Action::Trigger {
                checkpoint: CheckpointId(8)
            }]
        );
        let a = c.handle(Event::Tick { now_ms: 1100 });
        assert!(
            matches!(
                &a[..],
                [Action::Abort {
                    checkpoint: CheckpointId(8),
                    reason: AbortReason::TimedOut {
                        timeout_ms: 1000,
                        acknowledged: 0,
                        expected: 2
                    }
                }]
            ),
            "{a:?}"
        );
        let a = c.handle(Event::Tick { now_ms: 1200 });
        let id = match &a[..] {
            [Action::Trigger { checkpoint }] => *checkpoint,
            other => panic!("{other:?}"),
        };
        assert_eq!(id, CheckpointId(9));
        // a late ack for the aborted checkpoint is ignored
        assert!(ack_all(&mut c, CheckpointId(8)).is_empty());
        let a = c.handle(Event::Decline {
            checkpoint: id,
            task: TaskId::Sink(0),
            reason: "disk full".into(),
        });
        let declined = AbortReason::Declined {
            task: TaskId::Sink(0),
            error: "disk full".into(),
        };
        assert_eq!(
            a,
            vec![
                Action::Abort {
                    checkpoint: id,
                    reason: declined.clone()
                },
                Action::Fail {
                    failures: 2,
                    reason: declined
                }
            ]
        );
        assert!(c.handle(Event::Tick { now_ms: 99_999 }).is_empty());
    }

    #[test]
    fn request_triggers_without_waiting_for_the_interval() {
        let mut c = Coordinator::new(cfg(), 1, 1, None, None, 0);
        c.handle(Event::RequestCheckpoint);
        assert_eq!(
            c.handle(Event::Tick { now_ms: 1 }),
            vec![Action::Trigger {
                checkpoint: CheckpointId(1)
            }]
        );
    }

    #[test]
    fn ledger_releases_everything_up_to_the_completed_id() {
        let mut l = CommitLedger::new();
        l.add(CheckpointId(1), "a");
        l.add(CheckpointId(2), "b");
        l.add(CheckpointId(4), "d");
        assert_eq!(
            l.due(CheckpointId(3)),
            vec![(CheckpointId(1), "a"), (CheckpointId(2), "b")]
        );
        l.mark_committed(CheckpointId(1));
        l.mark_committed(CheckpointId(2));
        assert_eq!(l.entries(), vec![(CheckpointId(4), "d")]);
    }
}
