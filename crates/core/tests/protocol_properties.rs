//! Property tests of the checkpoint / two-phase-commit protocol: the pure
//! coordinator and the sinks' commit ledgers, driven by random interleavings of
//! triggers, acknowledgements (delivered, lost, repeated), declines, timeouts,
//! persist outcomes, lost or repeated completion notifications, and crashes
//! followed by recovery from the latest persisted checkpoint.
//!
//! Checked:
//! - a transaction is committed only if its checkpoint, or a later one, was
//!   persisted and lists it (no commit from an unfinished checkpoint);
//! - at recovery, everything committed belongs to a checkpoint ≤ the restored one
//!   (no duplicates after replay) and everything aborted to one > it (no loss);
//! - nothing is both committed and aborted;
//! - after the faults stop, every transaction listed by a completed checkpoint is
//!   committed, and every pre-committed transaction ends committed or aborted;
//! - checkpoint ids only grow;
//! - a tick does something exactly when the coordinator said one was due
//!   (`next_tick_ms`, what the driver sleeps until).
//!
//! And with several regions, each driven by a coordinator of its own over
//! its own subtasks (with their pipeline-wide indices) and failing over
//! alone: a region's transactions are committed only after that region's
//! checkpoint listing them was persisted, a coordinator never counts another
//! region's acknowledgement, and a crash of one region never commits, aborts
//! or rolls back another region's transactions.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use exactly_core::{
    Action, CheckpointConfig, CheckpointData, CheckpointId, CommitLedger, Coordinator, Event, PendingCommit,
    SplitPositions, TaskId, TaskState,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Tick(u16),
    SourceAck { pick: u8, lose: bool },
    SinkBarrier { pick: u8, has_data: bool, lose_ack: bool },
    RepeatLastAck,
    Decline { pick: u8 },
    PersistOk,
    PersistFail,
    Notify { pick: u8, lose: bool, repeat: bool },
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..400).prop_map(Op::Tick),
        4 => (any::<u8>(), prop::bool::weighted(0.1)).prop_map(|(pick, lose)| Op::SourceAck { pick, lose }),
        6 => (any::<u8>(), any::<bool>(), prop::bool::weighted(0.1))
            .prop_map(|(pick, has_data, lose_ack)| Op::SinkBarrier { pick, has_data, lose_ack }),
        1 => Just(Op::RepeatLastAck),
        1 => any::<u8>().prop_map(|pick| Op::Decline { pick }),
        3 => Just(Op::PersistOk),
        1 => Just(Op::PersistFail),
        4 => (any::<u8>(), prop::bool::weighted(0.2), prop::bool::weighted(0.2))
            .prop_map(|(pick, lose, repeat)| Op::Notify { pick, lose, repeat }),
        1 => Just(Op::Crash),
    ]
}

/// The whole simulated system (or one region of it).
struct World {
    /// Pipeline-wide indices of its source and sink subtasks.
    sources: Vec<usize>,
    sinks: Vec<usize>,
    now: u64,
    coordinator: Coordinator,
    /// Barrier deliveries still to happen: (checkpoint, task).
    barriers: VecDeque<(CheckpointId, TaskId)>,
    last_ack: Option<Event>,
    persisting: Option<CheckpointData>,
    /// Completion notifications still to deliver: (checkpoint, sink).
    notifications: VecDeque<(CheckpointId, usize)>,
    ledgers: BTreeMap<usize, CommitLedger<u64>>,
    /// The durable checkpoint store.
    persisted: BTreeMap<CheckpointId, CheckpointData>,
    /// Every transaction ever pre-committed: id → (checkpoint, sink).
    prepared: BTreeMap<u64, (CheckpointId, usize)>,
    committed: BTreeSet<u64>,
    aborted: BTreeSet<u64>,
    next_txn: u64,
    last_triggered: Option<CheckpointId>,
    /// The id of the checkpoint this coordinator incarnation restored from.
    restored: Option<CheckpointId>,
}

fn config() -> CheckpointConfig {
    CheckpointConfig {
        interval: Duration::from_millis(100),
        min_pause: Duration::from_millis(20),
        timeout: Duration::from_millis(700),
        tolerable_failures: 1_000_000,
    }
}

impl World {
    fn new(sources: usize, sinks: usize) -> Self {
        Self::with_tasks((0..sources).collect(), (0..sinks).collect(), 0)
    }

    /// Region `r` of a forward-chain pipeline: source `r` and sink `r`;
    /// its transaction ids start at `r << 32` so regions never share one.
    fn region(r: usize) -> Self {
        Self::with_tasks(vec![r], vec![r], (r as u64) << 32)
    }

    fn with_tasks(sources: Vec<usize>, sinks: Vec<usize>, first_txn: u64) -> Self {
        World {
            coordinator: Coordinator::for_tasks(config(), Self::task_ids(&sources, &sinks), None, None, 0),
            ledgers: sinks.iter().map(|&s| (s, CommitLedger::new())).collect(),
            sources,
            sinks,
            now: 0,
            barriers: VecDeque::new(),
            last_ack: None,
            persisting: None,
            notifications: VecDeque::new(),
            persisted: BTreeMap::new(),
            prepared: BTreeMap::new(),
            committed: BTreeSet::new(),
            aborted: BTreeSet::new(),
            next_txn: first_txn,
            last_triggered: None,
            restored: None,
        }
    }

    fn task_ids(sources: &[usize], sinks: &[usize]) -> Vec<TaskId> {
        let sources = sources.iter().map(|&i| TaskId::Source(i));
        sources.chain(sinks.iter().map(|&i| TaskId::Sink(i))).collect()
    }

    fn feed(&mut self, event: Event) {
        for action in self.coordinator.handle(event) {
            match action {
                Action::Trigger { checkpoint } => {
                    if let Some(prev) = self.last_triggered {
                        assert!(checkpoint > prev, "ids only grow: {checkpoint} after {prev}");
                    }
                    if let Some(r) = self.restored {
                        assert!(checkpoint > r, "id {checkpoint} not above the restored {r}");
                    }
                    self.last_triggered = Some(checkpoint);
                    // Barriers reach tasks in order, per task.
                    for &i in &self.sources {
                        self.barriers.push_back((checkpoint, TaskId::Source(i)));
                    }
                    for &i in &self.sinks {
                        self.barriers.push_back((checkpoint, TaskId::Sink(i)));
                    }
                }
                Action::Persist { data } => {
                    assert!(self.persisting.is_none(), "one checkpoint in flight");
                    let listed: Vec<usize> = data.pending.keys().copied().collect();
                    assert_eq!(
                        listed, self.sinks,
                        "a checkpoint holds exactly its own sinks' acknowledgements"
                    );
                    self.persisting = Some(data);
                }
                Action::Complete { checkpoint } => {
                    for &i in &self.sinks {
                        self.notifications.push_back((checkpoint, i));
                    }
                }
                Action::Abort { .. } => {}
                Action::Fail { .. } => panic!("failure tolerance is unbounded here"),
            }
        }
    }

    fn pick<T: Copy>(items: &VecDeque<T>, pick: u8, filter: impl Fn(&T) -> bool) -> Option<usize> {
        let candidates: Vec<usize> = (0..items.len()).filter(|i| filter(&items[*i])).collect();
        (!candidates.is_empty()).then(|| candidates[pick as usize % candidates.len()])
    }

    /// The first barrier of a task is the only deliverable one (channels are FIFO).
    fn first_barrier_of_kind(&self, pick: u8, sink: bool) -> Option<usize> {
        let mut seen = BTreeSet::new();
        let firsts: VecDeque<(usize, (CheckpointId, TaskId))> = self
            .barriers
            .iter()
            .enumerate()
            .filter(|(_, (_, t))| seen.insert(*t))
            .map(|(i, b)| (i, *b))
            .collect();
        Self::pick(&firsts, pick, |(_, (_, t))| matches!(t, TaskId::Sink(_)) == sink).map(|i| firsts[i].0)
    }

    fn commit(&mut self, txn: u64, checkpoint: CheckpointId) {
        let listed = self.persisted.iter().any(|(id, data)| {
            *id >= checkpoint
                && data
                    .pending
                    .values()
                    .flatten()
                    .any(|p| p.committable == serde_json::json!(txn))
        });
        assert!(
            listed,
            "txn {txn} of checkpoint {checkpoint} committed without a persisted checkpoint listing it"
        );
        assert!(!self.aborted.contains(&txn), "txn {txn} committed after being aborted");
        self.committed.insert(txn);
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Tick(ms) => {
                self.now += ms as u64;
                // A driver sleeps until `next_tick_ms`: a tick before it
                // must do nothing, one at or after it something.
                let due = self.coordinator.next_tick_ms();
                let acted = !self
                    .coordinator
                    .clone()
                    .handle(Event::Tick { now_ms: self.now })
                    .is_empty();
                assert_eq!(
                    acted,
                    due.is_some_and(|d| d <= self.now),
                    "a tick at {} with the next tick due at {due:?}",
                    self.now
                );
                self.feed(Event::Tick { now_ms: self.now });
            }
            Op::SourceAck { pick, lose } => {
                if let Some(i) = self.first_barrier_of_kind(pick, false) {
                    let (checkpoint, task) = self.barriers.remove(i).unwrap();
                    let event = Event::Ack {
                        checkpoint,
                        task,
                        state: TaskState::Source(SplitPositions::default()),
                    };
                    self.last_ack = Some(event.clone());
                    if !lose {
                        self.feed(event);
                    }
                }
            }
            Op::SinkBarrier {
                pick,
                has_data,
                lose_ack,
            } => {
                if let Some(i) = self.first_barrier_of_kind(pick, true) {
                    let (checkpoint, task) = self.barriers.remove(i).unwrap();
                    let TaskId::Sink(s) = task else { unreachable!() };
                    if has_data {
                        let txn = self.next_txn;
                        self.next_txn += 1;
                        self.ledgers.get_mut(&s).unwrap().add(checkpoint, txn);
                        self.prepared.insert(txn, (checkpoint, s));
                    }
                    let state = TaskState::Sink(
                        self.ledgers[&s]
                            .entries()
                            .into_iter()
                            .map(|(checkpoint, t)| PendingCommit {
                                checkpoint,
                                committable: serde_json::json!(t),
                            })
                            .collect(),
                    );
                    let event = Event::Ack {
                        checkpoint,
                        task,
                        state,
                    };
                    self.last_ack = Some(event.clone());
                    if !lose_ack {
                        self.feed(event);
                    }
                }
            }
            Op::RepeatLastAck => {
                if let Some(e) = self.last_ack.clone() {
                    self.feed(e);
                }
            }
            Op::Decline { pick } => {
                if let Some(checkpoint) = self.coordinator.in_flight() {
                    let task = TaskId::Sink(self.sinks[pick as usize % self.sinks.len()]);
                    self.feed(Event::Decline {
                        checkpoint,
                        task,
                        reason: "test".into(),
                    });
                }
            }
            Op::PersistOk => {
                if let Some(data) = self.persisting.take() {
                    let id = data.id;
                    self.persisted.insert(id, data);
                    self.feed(Event::Persisted {
                        checkpoint: id,
                        now_ms: self.now,
                    });
                }
            }
            Op::PersistFail => {
                if let Some(data) = self.persisting.take() {
                    self.feed(Event::PersistFailed {
                        checkpoint: data.id,
                        reason: "disk".into(),
                        now_ms: self.now,
                    });
                }
            }
            Op::Notify { pick, lose, repeat } => {
                if let Some(i) = Self::pick(&self.notifications, pick, |_| true) {
                    let (checkpoint, s) = self.notifications[i];
                    if !repeat {
                        self.notifications.remove(i);
                    }
                    if !lose {
                        let ledger = self.ledgers.get_mut(&s).unwrap();
                        let due = ledger.due(checkpoint);
                        for (cp, _) in &due {
                            ledger.mark_committed(*cp);
                        }
                        for (cp, txn) in due {
                            self.commit(txn, cp);
                        }
                    }
                }
            }
            Op::Crash => self.crash_and_recover(),
        }
    }

    fn crash_and_recover(&mut self) {
        // Whatever was in flight is gone: barriers, acks, notifications, the write.
        self.barriers.clear();
        self.notifications.clear();
        self.persisting = None;
        self.last_ack = None;
        let latest = self.persisted.values().next_back().cloned();
        let restored = latest.as_ref().map(|d| d.id);
        for s in self.sinks.clone() {
            let listed: Vec<u64> = latest
                .as_ref()
                .and_then(|d| d.pending.get(&s))
                .map(|l| l.iter().map(|p| p.committable.as_u64().unwrap()).collect())
                .unwrap_or_default();
            for txn in &listed {
                let (cp, _) = self.prepared[txn];
                self.commit(*txn, cp);
            }
            // Abort everything this sink owns that is neither listed nor committed.
            for (txn, (cp, owner)) in &self.prepared {
                if *owner == s && !listed.contains(txn) && !self.committed.contains(txn) && !self.aborted.contains(txn)
                {
                    assert!(
                        restored.is_none_or(|r| *cp > r),
                        "txn {txn} of checkpoint {cp} aborted although checkpoint {restored:?} covers its input: loss"
                    );
                    self.aborted.insert(*txn);
                }
            }
            self.ledgers.insert(s, CommitLedger::new());
        }
        for txn in &self.committed {
            let (cp, _) = self.prepared[txn];
            assert!(
                restored.is_some_and(|r| cp <= r),
                "txn {txn} of checkpoint {cp} is committed but its input will be replayed from {restored:?}: duplicate"
            );
        }
        // The store's id watermark covers every id ever triggered.
        self.coordinator = Coordinator::for_tasks(
            config(),
            Self::task_ids(&self.sources, &self.sinks),
            restored,
            self.last_triggered,
            self.now,
        );
        self.restored = restored;
    }

    /// No more faults: deliver everything until a checkpoint completes and all
    /// its notifications are delivered.
    fn settle(&mut self) {
        self.feed(Event::RequestCheckpoint);
        let start = self.coordinator.last_completed();
        for _ in 0..10_000 {
            if self.coordinator.last_completed() > start && self.notifications.is_empty() && self.persisting.is_none() {
                break;
            }
            if let Some(i) = self.first_barrier_of_kind(0, false) {
                let (checkpoint, task) = self.barriers.remove(i).unwrap();
                self.feed(Event::Ack {
                    checkpoint,
                    task,
                    state: TaskState::Source(SplitPositions::default()),
                });
            } else if self.first_barrier_of_kind(0, true).is_some() {
                self.apply(Op::SinkBarrier {
                    pick: 0,
                    has_data: false,
                    lose_ack: false,
                });
            } else if self.persisting.is_some() {
                self.apply(Op::PersistOk);
            } else if !self.notifications.is_empty() {
                self.apply(Op::Notify {
                    pick: 0,
                    lose: false,
                    repeat: false,
                });
            } else {
                self.apply(Op::Tick(50));
            }
        }
        assert!(
            self.coordinator.last_completed() > start,
            "no checkpoint completed once faults stopped"
        );
        for (s, l) in &self.ledgers {
            assert!(
                l.is_empty(),
                "sink {s} still has pending transactions: {:?}",
                l.entries()
            );
        }
        for data in self.persisted.values() {
            for p in data.pending.values().flatten() {
                let txn = p.committable.as_u64().unwrap();
                assert!(self.committed.contains(&txn), "listed txn {txn} never committed");
            }
        }
        for txn in self.prepared.keys() {
            assert!(
                self.committed.contains(txn) ^ self.aborted.contains(txn),
                "txn {txn} neither committed nor aborted (or both)"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn commits_follow_completed_checkpoints(
        sources in 1usize..=3,
        sinks in 1usize..=3,
        ops in prop::collection::vec(op(), 0..250),
    ) {
        let mut world = World::new(sources, sinks);
        for op in ops {
            world.apply(op);
        }
        world.settle();
    }
}

/// What one region's history looks like from outside: everything other
/// regions may never change.
fn outcome(world: &World) -> (BTreeSet<u64>, BTreeSet<u64>, Vec<CheckpointId>) {
    (
        world.committed.clone(),
        world.aborted.clone(),
        world.persisted.keys().copied().collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn regions_checkpoint_and_fail_over_alone(
        regions in 2usize..=4,
        ops in prop::collection::vec((any::<u8>(), op(), any::<u8>()), 0..400),
    ) {
        let mut worlds: Vec<World> = (0..regions).map(World::region).collect();
        for (pick, op, stray) in ops {
            let r = pick as usize % regions;
            let others: Vec<_> = (0..regions).filter(|o| *o != r).map(|o| outcome(&worlds[o])).collect();
            worlds[r].apply(op);
            // An acknowledgement of another region's sink reaching this
            // region's coordinator must not count towards its checkpoint.
            let foreign = (r + 1 + stray as usize % (regions - 1)) % regions;
            if let Some(checkpoint) = worlds[r].coordinator.in_flight() {
                let event = Event::Ack {
                    checkpoint,
                    task: TaskId::Sink(foreign),
                    state: TaskState::Sink(Vec::new()),
                };
                worlds[r].feed(event);
            }
            let after: Vec<_> = (0..regions).filter(|o| *o != r).map(|o| outcome(&worlds[o])).collect();
            prop_assert_eq!(others, after, "an operation of region {} changed another region", r);
        }
        for world in &mut worlds {
            world.settle();
        }
    }
}
