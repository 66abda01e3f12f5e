//! The transactional-id slot pool of one sink subtask, as pure bookkeeping:
//! which slot may take the next transaction, which ones hold pre-committed
//! transactions, which ones must rest. No producer, no clock, no I/O — the
//! sink asks it and acts; the property tests below drive it the way the
//! runtime drives the sink.
//!
//! **The invariant.** A slot whose transaction was committed is not handed
//! out again until a transaction pre-committed *after* that commit has been
//! committed. Until then the latest persisted checkpoint may still list the
//! committed transaction, a recovery from it sends EndTxn with its producer
//! id and epoch, and a new transaction on the same producer (same id, same
//! epoch) would be committed by that EndTxn — records of an interval the
//! checkpoint does not cover. A transaction pre-committed after the commit
//! was acknowledged in a checkpoint that no longer listed it; once that
//! transaction is committed, its checkpoint is persisted and is the one a
//! recovery starts from.
//!
//! **Why at least three slots.** One writes the current interval, one holds
//! the transaction waiting for its checkpoint, one holds the transaction
//! committed last. Each further slot rides out one more failed checkpoint
//! in a row (its transaction stays pending and is listed again).

use std::collections::VecDeque;
use std::time::Duration;

use exactly_core::CheckpointId;

use super::config::past_timeout_share;
use super::KafkaCommittable;

/// Committables remembered as committed, so a repeated commit is a no-op.
const RECENT_COMMITS: usize = 64;

/// What a pooled transactional id is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Ready for a new transaction.
    Free,
    /// A transaction is open since `began_at_ms` (Unix milliseconds).
    Open { began_at_ms: u64 },
    /// Pre-committed at `at` (the pool's clock); waits for its checkpoint.
    Prepared {
        committable: KafkaCommittable,
        at: u64,
        /// Whether the age warning was logged for it.
        warned: bool,
    },
    /// Committed (or lost) at `at`: resting until a transaction
    /// pre-committed after `at` is committed (see the module docs).
    Committed { at: u64 },
    /// Unusable until the next recovery (before it, or after a failure).
    Broken,
}

/// An open or pre-committed transaction past a share of its timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Overdue {
    /// Its slot.
    pub slot: usize,
    /// When its first record was written (Unix milliseconds).
    pub began_at_ms: u64,
    /// The checkpoint that lists it, once pre-committed.
    pub checkpoint: Option<CheckpointId>,
}

/// The slots of one sink subtask. See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct SlotPool {
    slots: Vec<SlotState>,
    /// Where the search for a free slot starts (rotation).
    next: usize,
    /// Orders pre-commits and commits.
    clock: u64,
    /// The latest committables committed, oldest first.
    recent: VecDeque<KafkaCommittable>,
}

impl SlotPool {
    /// `size` slots, all [`Broken`](SlotState::Broken) until
    /// [`recovered`](Self::recovered).
    pub(crate) fn new(size: usize) -> SlotPool {
        SlotPool {
            slots: vec![SlotState::Broken; size],
            next: 0,
            clock: 0,
            recent: VecDeque::new(),
        }
    }

    /// Number of slots.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// What slot `slot` is doing.
    pub(crate) fn state(&self, slot: usize) -> &SlotState {
        &self.slots[slot]
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// After recovery: the slots `listed` says the restored checkpoint
    /// names rest (a second recovery from the same checkpoint must find
    /// them as they are), the others are free.
    pub(crate) fn recovered(&mut self, listed: impl Fn(usize) -> bool) {
        for (slot, state) in self.slots.iter_mut().enumerate() {
            *state = if listed(slot) {
                SlotState::Committed { at: 0 }
            } else {
                SlotState::Free
            };
        }
        self.clock = 1;
    }

    /// The next free slot, rotating over the pool; `None` when every slot
    /// is busy or resting.
    pub(crate) fn free_slot(&self) -> Option<usize> {
        let n = self.slots.len();
        (0..n)
            .map(|k| (self.next + k) % n)
            .find(|&i| self.slots[i] == SlotState::Free)
    }

    /// A transaction begins on the free `slot`.
    pub(crate) fn open(&mut self, slot: usize, began_at_ms: u64) {
        debug_assert_eq!(self.slots[slot], SlotState::Free, "opening a slot that is not free");
        self.slots[slot] = SlotState::Open { began_at_ms };
        self.next = (slot + 1) % self.slots.len();
    }

    /// The open transaction of `slot` is pre-committed as `committable`.
    pub(crate) fn prepare(&mut self, slot: usize, committable: KafkaCommittable) {
        debug_assert!(
            matches!(self.slots[slot], SlotState::Open { .. }),
            "pre-committing a slot that is not open"
        );
        let at = self.tick();
        self.slots[slot] = SlotState::Prepared {
            committable,
            at,
            warned: false,
        };
    }

    /// The slot holding `committable` pre-committed.
    pub(crate) fn holder(&self, committable: &KafkaCommittable) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| matches!(s, SlotState::Prepared { committable: c, .. } if c == committable))
    }

    /// Whether `committable` was committed lately (a repeated commit).
    pub(crate) fn committed_recently(&self, committable: &KafkaCommittable) -> bool {
        self.recent.contains(committable)
    }

    /// The pre-committed transaction of `slot` was committed (or lost):
    /// the slot rests, and every slot resting since before that
    /// transaction was pre-committed is free again. Returns the slots
    /// freed.
    pub(crate) fn commit(&mut self, slot: usize) -> Vec<usize> {
        let SlotState::Prepared { committable, at, .. } = self.slots[slot].clone() else {
            debug_assert!(false, "committing a slot that holds no pre-committed transaction");
            return Vec::new();
        };
        let freed = self.free_resting_before(at);
        let now = self.tick();
        self.slots[slot] = SlotState::Committed { at: now };
        self.remember(committable);
        freed
    }

    /// `committable`, which no slot holds pre-committed (listed by a
    /// restored checkpoint, or left by a producer that is gone), was
    /// committed with EndTxn. Its id's slot `slot`, if free or resting,
    /// rests from now (returns `true`: its producer does not know the
    /// transaction ended and must be replaced); nothing else is freed, as
    /// nothing pre-committed here is known to have been committed after
    /// it.
    pub(crate) fn committed_elsewhere(&mut self, slot: Option<usize>, committable: KafkaCommittable) -> bool {
        self.remember(committable);
        let Some(slot) = slot.filter(|&s| matches!(self.slots[s], SlotState::Free | SlotState::Committed { .. }))
        else {
            return false;
        };
        let now = self.tick();
        self.slots[slot] = SlotState::Committed { at: now };
        true
    }

    /// The open transaction of `slot` was aborted: the slot is free.
    pub(crate) fn aborted(&mut self, slot: usize) {
        self.slots[slot] = SlotState::Free;
    }

    /// `slot` is unusable until the next recovery.
    pub(crate) fn broken(&mut self, slot: usize) {
        self.slots[slot] = SlotState::Broken;
    }

    fn free_resting_before(&mut self, prepared_at: u64) -> Vec<usize> {
        let mut freed = Vec::new();
        for (slot, state) in self.slots.iter_mut().enumerate() {
            if matches!(state, SlotState::Committed { at } if *at < prepared_at) {
                *state = SlotState::Free;
                freed.push(slot);
            }
        }
        freed
    }

    fn remember(&mut self, committable: KafkaCommittable) {
        if self.recent.len() == RECENT_COMMITS {
            self.recent.pop_front();
        }
        self.recent.push_back(committable);
    }

    /// The checkpoints of the pre-committed transactions, by slot.
    pub(crate) fn pending_checkpoints(&self) -> Vec<CheckpointId> {
        self.slots
            .iter()
            .filter_map(|s| match s {
                SlotState::Prepared { committable, .. } => Some(committable.checkpoint),
                _ => None,
            })
            .collect()
    }

    /// The first open or pre-committed transaction that has used `share`
    /// of `timeout` at `now_ms`.
    pub(crate) fn overdue(&self, now_ms: u64, timeout: Duration, share: f64) -> Option<Overdue> {
        self.slots.iter().enumerate().find_map(|(slot, state)| {
            let (began_at_ms, checkpoint) = match state {
                SlotState::Open { began_at_ms } => (*began_at_ms, None),
                SlotState::Prepared { committable, .. } => (committable.began_at_ms, Some(committable.checkpoint)),
                _ => return None,
            };
            past_timeout_share(age(began_at_ms, now_ms), timeout, share).then_some(Overdue {
                slot,
                began_at_ms,
                checkpoint,
            })
        })
    }

    /// The pre-committed transactions that have used `share` of `timeout`
    /// at `now_ms` and were not reported yet; each is reported once.
    pub(crate) fn take_warnings(&mut self, now_ms: u64, timeout: Duration, share: f64) -> Vec<KafkaCommittable> {
        let mut due = Vec::new();
        for state in &mut self.slots {
            if let SlotState::Prepared {
                committable,
                warned: warned @ false,
                ..
            } = state
            {
                if past_timeout_share(age(committable.began_at_ms, now_ms), timeout, share) {
                    *warned = true;
                    due.push(committable.clone());
                }
            }
        }
        due
    }
}

/// How long ago `began_at_ms` was at `now_ms`.
pub(crate) fn age(began_at_ms: u64, now_ms: u64) -> Duration {
    Duration::from_millis(now_ms.saturating_sub(began_at_ms))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn committable(slot: usize, checkpoint: u64) -> KafkaCommittable {
        KafkaCommittable {
            transactional_id: format!("p-0-{slot}"),
            producer_id: 1000 + slot as i64,
            epoch: 0,
            checkpoint: CheckpointId(checkpoint),
            topic: "out".into(),
            records: 1,
            dead_letters: 0,
            began_at_ms: 1_000 * checkpoint,
        }
    }

    #[test]
    fn a_committed_slot_rests_until_a_later_transaction_commits() {
        let mut pool = SlotPool::new(3);
        assert_eq!(pool.free_slot(), None, "nothing before recovery");
        pool.recovered(|_| false);
        let a = pool.free_slot().unwrap();
        pool.open(a, 0);
        pool.prepare(a, committable(a, 1));
        let b = pool.free_slot().unwrap();
        assert_ne!(a, b);
        pool.open(b, 0);
        assert_eq!(pool.commit(a), Vec::<usize>::new());
        assert_eq!(
            pool.state(a),
            &SlotState::Committed { at: 3 },
            "recovered at 1, prepared at 2"
        );
        pool.prepare(b, committable(b, 2));
        let c = pool.free_slot().unwrap();
        assert!(c != a && c != b, "the committed slot rests");
        pool.open(c, 0);
        assert_eq!(pool.free_slot(), None);
        assert_eq!(pool.commit(b), vec![a], "b was pre-committed after a's commit");
        assert_eq!(pool.free_slot(), Some(a));
        assert!(pool.committed_recently(&committable(a, 1)));
        assert!(!pool.committed_recently(&committable(c, 3)));
    }

    #[test]
    fn recovery_rests_the_listed_slots_and_frees_the_rest() {
        let mut pool = SlotPool::new(4);
        pool.recovered(|slot| slot == 1 || slot == 2);
        assert_eq!(pool.state(1), &SlotState::Committed { at: 0 });
        assert_eq!(pool.free_slot(), Some(0));
        pool.open(0, 0);
        assert_eq!(pool.free_slot(), Some(3));
        pool.prepare(0, committable(0, 5));
        assert_eq!(pool.commit(0), vec![1, 2], "the first commit after recovery frees them");
    }

    #[test]
    fn a_transaction_committed_elsewhere_rests_its_free_slot_only() {
        let mut pool = SlotPool::new(3);
        pool.recovered(|_| false);
        pool.open(0, 0);
        assert!(
            !pool.committed_elsewhere(Some(0), committable(0, 1)),
            "an open slot is left alone"
        );
        assert!(pool.committed_elsewhere(Some(1), committable(1, 1)));
        assert!(matches!(pool.state(1), SlotState::Committed { .. }));
        assert!(!pool.committed_elsewhere(None, committable(9, 1)));
        assert!(pool.committed_recently(&committable(9, 1)));
    }

    #[test]
    fn old_transactions_are_overdue_and_warned_about_once() {
        let minute = Duration::from_secs(60);
        let mut pool = SlotPool::new(3);
        pool.recovered(|_| false);
        pool.open(0, 0);
        assert_eq!(pool.overdue(47_999, minute, 0.8), None);
        let overdue = pool.overdue(48_000, minute, 0.8).unwrap();
        assert_eq!((overdue.slot, overdue.checkpoint), (0, None));
        let mut c = committable(0, 4);
        c.began_at_ms = 0;
        pool.prepare(0, c.clone());
        assert_eq!(
            pool.overdue(48_000, minute, 0.8).unwrap().checkpoint,
            Some(CheckpointId(4))
        );
        assert!(pool.take_warnings(29_000, minute, 0.5).is_empty());
        assert_eq!(pool.take_warnings(30_000, minute, 0.5), vec![c]);
        assert!(pool.take_warnings(59_000, minute, 0.5).is_empty(), "once");
        assert_eq!(pool.pending_checkpoints(), vec![CheckpointId(4)]);
    }

    /// What the runtime does to one sink subtask, in an order it may do it.
    #[derive(Debug, Clone)]
    enum Step {
        /// Records arrive: a transaction is begun if none is open.
        Write,
        /// The barrier of the next checkpoint: the open transaction (if
        /// any) is pre-committed and the acknowledgement lists every
        /// pending one. Only when no checkpoint is in flight.
        Barrier,
        /// The checkpoint in flight completes (`true`: its pending
        /// transactions are committed, oldest first) or is aborted.
        End(bool),
        /// The attempt fails; a new one recovers from the latest completed
        /// checkpoint.
        Restart,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => Just(Step::Write),
            3 => Just(Step::Barrier),
            2 => Just(Step::End(true)),
            1 => Just(Step::End(false)),
            1 => Just(Step::Restart),
        ]
    }

    /// Steps of one attempt (no restart) in which every interval has
    /// records: a barrier always comes after a write.
    fn attempt_steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            3 => Just(vec![Step::Write, Step::Barrier]),
            2 => Just(vec![Step::Write]),
            2 => Just(vec![Step::End(true)]),
            1 => Just(vec![Step::End(false)]),
        ];
        proptest::collection::vec(step, 1..120).prop_map(|steps| steps.concat())
    }

    /// The runtime around one pool, and what a recovery would do.
    struct Model {
        pool: SlotPool,
        checkpoint: u64,
        open: Option<usize>,
        /// Pre-committed, not yet committed: (checkpoint, slot).
        pending: Vec<(u64, usize)>,
        /// The checkpoint in flight and the transactions it lists.
        in_flight: Option<(u64, Vec<(u64, usize)>)>,
        /// What the latest completed checkpoint lists: what a recovery
        /// would send EndTxn for.
        latest: Vec<(u64, usize)>,
        /// Aborted checkpoints since the last completed one.
        failed_in_a_row: usize,
        /// The run of aborted checkpoints the last completed one ended.
        previous_run: usize,
        /// The longest two runs of aborted checkpoints one completed
        /// checkpoint apart, together.
        worst_runs: usize,
    }

    impl Model {
        fn new(size: usize) -> Model {
            let mut pool = SlotPool::new(size);
            pool.recovered(|_| false);
            Model {
                pool,
                checkpoint: 0,
                open: None,
                pending: Vec::new(),
                in_flight: None,
                latest: Vec::new(),
                failed_in_a_row: 0,
                previous_run: 0,
                worst_runs: 0,
            }
        }

        /// Applies `step`; `Err` when the pool ran out of slots.
        fn apply(&mut self, step: &Step) -> Result<(), String> {
            match step {
                Step::Write if self.open.is_none() => {
                    let Some(slot) = self.pool.free_slot() else {
                        return Err(format!("no free slot: {:?}", self.pool.slots));
                    };
                    // The invariant: no transaction a recovery would commit
                    // with EndTxn is on the slot handed out.
                    let listed: BTreeSet<usize> = self.latest.iter().map(|&(_, s)| s).collect();
                    assert!(
                        !listed.contains(&slot),
                        "slot {slot} handed out while the latest completed checkpoint lists its transaction \
                         {:?}; pool {:?}",
                        self.latest,
                        self.pool.slots
                    );
                    self.pool.open(slot, 0);
                    self.open = Some(slot);
                }
                Step::Write => {}
                Step::Barrier if self.in_flight.is_none() => {
                    self.checkpoint += 1;
                    if let Some(slot) = self.open.take() {
                        self.pool.prepare(slot, committable(slot, self.checkpoint));
                        self.pending.push((self.checkpoint, slot));
                    }
                    self.in_flight = Some((self.checkpoint, self.pending.clone()));
                }
                Step::Barrier => {}
                Step::End(completed) => {
                    let Some((checkpoint, listed)) = self.in_flight.take() else {
                        return Ok(());
                    };
                    if !completed {
                        self.failed_in_a_row += 1;
                        self.worst_runs = self.worst_runs.max(self.previous_run + self.failed_in_a_row);
                        return Ok(());
                    }
                    self.previous_run = std::mem::take(&mut self.failed_in_a_row);
                    self.latest = listed;
                    let due: Vec<(u64, usize)> =
                        self.pending.iter().copied().filter(|&(c, _)| c <= checkpoint).collect();
                    self.pending.retain(|&(c, _)| c > checkpoint);
                    for (c, slot) in due {
                        assert_eq!(self.pool.holder(&committable(slot, c)), Some(slot));
                        self.pool.commit(slot);
                    }
                }
                Step::Restart => {
                    let listed: BTreeSet<usize> = self.latest.iter().map(|&(_, s)| s).collect();
                    self.pool = SlotPool::new(self.pool.len());
                    self.pool.recovered(|slot| listed.contains(&slot));
                    self.open = None;
                    self.pending.clear();
                    self.in_flight = None;
                    self.failed_in_a_row = 0;
                }
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Safety, whatever the interleaving and the pool size: a slot is
        /// never handed out while the latest completed checkpoint lists a
        /// transaction of its id (the model asserts it at every `Write`).
        #[test]
        fn no_slot_is_reused_while_a_recovery_could_end_txn_it(
            size in 3usize..7,
            steps in proptest::collection::vec(step(), 1..200),
        ) {
            let mut model = Model::new(size);
            for step in &steps {
                if model.apply(step).is_err() {
                    // Out of slots: the sink fails the attempt; the runtime restarts.
                    model.apply(&Step::Restart).unwrap();
                }
            }
        }

        /// Liveness within an attempt whose intervals all have records: a
        /// pool never runs out while any two runs of failed checkpoints one
        /// completed checkpoint apart fail at most `size - 3` checkpoints
        /// together (the default 5 rides out two failed checkpoints in a
        /// row, or one after one). Right after a recovery the slots the
        /// restored checkpoint lists rest until the first commit, like a
        /// previous run.
        #[test]
        fn three_slots_plus_one_per_failed_checkpoint_never_run_out(
            size in 3usize..7,
            steps in attempt_steps(),
        ) {
            let mut model = Model::new(size);
            for step in &steps {
                let result = model.apply(step);
                if model.worst_runs + 3 <= size {
                    prop_assert!(result.is_ok(), "runs of {} failed checkpoints, {} slots: {:?}", model.worst_runs, size, result);
                } else if result.is_err() {
                    model.apply(&Step::Restart).unwrap();
                    model.worst_runs = usize::MAX / 2;
                }
            }
        }
    }
}
