//! Property tests of the pure ownership model (`exactly_core::membership`):
//! workers driven by their own state machines ([`Worker`]) over a simulated
//! network against a simulated database whose rows change only by the
//! model's rules ([`RegionLease`]), over random interleavings of workers
//! joining, dying, freezing (SIGSTOP) past their lease and thawing, being
//! cut off from the network and reconnected, store calls delayed and
//! answered out of order, SIGTERM, and per-worker clocks with their own
//! offsets and rates (±1 %).
//!
//! Checked:
//! 1. no region ever has two workers acting on it at one real instant
//!    (`Worker::acting` by each worker's own clock);
//! 2. no write under an epoch is accepted after a newer epoch of its region
//!    was taken;
//! 3. once the faults stop, every region is held by exactly one live worker
//!    (the one its row names), and the counts differ by at most one.
//!
//! The sabotage run (`the_checker_finds_stale_writes_when_the_store_skips_the_epoch_check`)
//! makes the simulated database accept writes without comparing epochs (a
//! store that forgot the condition), and asserts that property 2 then fails:
//! the checker can find what it looks for.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use exactly_core::membership::{
    Claim, DbTime, Epoch, Input, LeaseSettings, Member, MonoTime, Order, RegionLease, View, Worker, WorkerId,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// A fault or a change of the fleet, at some time after the previous one.
#[derive(Clone, Debug)]
enum Op {
    Join,
    Kill(u8),
    Freeze(u8, u16),
    Cut(u8, u16),
    Slow(u8, u16),
    Shutdown(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Join),
        2 => any::<u8>().prop_map(Op::Kill),
        3 => (any::<u8>(), 100u16..9_000).prop_map(|(w, d)| Op::Freeze(w, d)),
        3 => (any::<u8>(), 100u16..9_000).prop_map(|(w, d)| Op::Cut(w, d)),
        2 => (any::<u8>(), 100u16..6_000).prop_map(|(w, d)| Op::Slow(w, d)),
        1 => any::<u8>().prop_map(Op::Shutdown),
    ]
}

#[derive(Clone, Debug)]
struct Scenario {
    regions: usize,
    workers: usize,
    ops: Vec<(u16, Op)>,
    seed: u64,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        1usize..7,
        1usize..5,
        prop::collection::vec((0u16..4_000, op()), 0..14),
        any::<u64>(),
    )
        .prop_map(|(regions, workers, ops, seed)| Scenario {
            regions,
            workers,
            ops,
            seed,
        })
}

/// What a worker sends the database.
#[derive(Clone, Debug)]
enum Request {
    Renew {
        seq: u64,
        regions: Vec<(usize, Epoch)>,
        member: bool,
    },
    Leave,
    Poll,
    Claim {
        region: usize,
        expected: Epoch,
    },
    Release {
        region: usize,
        epoch: Epoch,
    },
    Write {
        region: usize,
        epoch: Epoch,
    },
}

#[derive(Clone, Debug)]
enum Event {
    Tick(usize),
    WriteAttempt(usize),
    AtDb(usize, Request),
    /// An answer or a local event reaching worker `w`; `network` answers are
    /// lost while the worker is cut off.
    AtWorker {
        w: usize,
        input: Input,
        network: bool,
    },
    Fault(Op),
    Thaw(usize),
    Calm,
}

struct SimWorker {
    model: Worker,
    alive: bool,
    exited: bool,
    leaving: bool,
    born: u64,
    offset: u64,
    /// Clock rate in parts per million away from real time.
    ppm: i64,
    frozen_until: u64,
    cut_until: u64,
    slow_until: u64,
    /// Inputs that arrived while frozen, handled at the thaw.
    inbox: VecDeque<Input>,
}

impl SimWorker {
    fn mono(&self, t: u64) -> MonoTime {
        let elapsed = t.saturating_sub(self.born) as i128;
        MonoTime(self.offset + (elapsed * (1_000_000 + self.ppm as i128) / 1_000_000) as u64)
    }

    fn frozen(&self, t: u64) -> bool {
        t < self.frozen_until
    }

    fn cut(&self, t: u64) -> bool {
        t < self.cut_until
    }

    fn present(&self) -> bool {
        self.alive && !self.exited
    }
}

#[derive(Default)]
struct Db {
    leases: Vec<RegionLease>,
    members: BTreeMap<WorkerId, DbTime>,
    /// Per region: every epoch taken, with the real time it was taken.
    taken: Vec<Vec<(Epoch, u64)>>,
}

struct Sim {
    settings: LeaseSettings,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Event>>,
    rng: StdRng,
    db: Db,
    workers: Vec<SimWorker>,
    skip_epoch_check: bool,
    /// Faults have stopped: no more random long delays either.
    calm: bool,
    violations: Vec<String>,
    accepted_writes: usize,
}

impl Sim {
    fn new(regions: usize, seed: u64, skip_epoch_check: bool) -> Sim {
        Sim {
            settings: LeaseSettings::default(),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            db: Db {
                leases: vec![RegionLease::default(); regions],
                taken: vec![Vec::new(); regions],
                ..Db::default()
            },
            workers: Vec::new(),
            skip_epoch_check,
            calm: false,
            violations: Vec::new(),
            accepted_writes: 0,
        }
    }

    fn at(&mut self, t: u64, event: Event) {
        self.events.push(Some(event));
        self.queue.push(Reverse((t, self.seq, self.events.len() - 1)));
        self.seq += 1;
    }

    fn join(&mut self) {
        let index = self.workers.len();
        let id = WorkerId(format!("w{index:03}"));
        let offset = self.rng.random_range(0..1_000_000_000);
        let ppm = self.rng.random_range(-10_000..=10_000);
        self.workers.push(SimWorker {
            model: Worker::new(id, self.settings),
            alive: true,
            exited: false,
            leaving: false,
            born: self.now,
            offset,
            ppm,
            frozen_until: 0,
            cut_until: 0,
            slow_until: 0,
            inbox: VecDeque::new(),
        });
        let first = self.now + self.rng.random_range(0..20);
        self.at(first, Event::Tick(index));
        self.at(first + 50, Event::WriteAttempt(index));
    }

    fn pick(&self, p: u8) -> Option<usize> {
        let present: Vec<usize> = (0..self.workers.len()).filter(|&i| self.workers[i].present()).collect();
        (!present.is_empty()).then(|| present[p as usize % present.len()])
    }

    /// One way of the network for worker `w` sending at `now`: `None` when
    /// the message is lost (cut off), else its delay.
    fn latency(&mut self, w: usize) -> Option<u64> {
        let worker = &self.workers[w];
        if worker.cut(self.now) {
            return None;
        }
        let slow = self.now < worker.slow_until;
        Some(if slow || (!self.calm && self.rng.random_bool(0.03)) {
            self.rng.random_range(300..5_000)
        } else {
            self.rng.random_range(1..40)
        })
    }

    fn send(&mut self, w: usize, request: Request) {
        match self.latency(w) {
            Some(delay) => self.at(self.now + delay, Event::AtDb(w, request)),
            // A refused connection: the runtime learns it soon.
            None => {
                let failure = match request {
                    Request::Renew { seq, .. } => Some(Input::RenewFailed { seq }),
                    Request::Poll => Some(Input::PollFailed),
                    Request::Claim { region, .. } => Some(Input::ClaimRefused { region }),
                    _ => None,
                };
                if let Some(input) = failure {
                    let t = self.now + 100;
                    self.at(
                        t,
                        Event::AtWorker {
                            w,
                            input,
                            network: false,
                        },
                    );
                }
            }
        }
    }

    fn answer(&mut self, w: usize, input: Input) {
        let delay = if self.now < self.workers[w].slow_until {
            self.rng.random_range(300..5_000)
        } else {
            self.rng.random_range(1..40)
        };
        self.at(
            self.now + delay,
            Event::AtWorker {
                w,
                input,
                network: true,
            },
        );
    }

    fn deliver(&mut self, w: usize, input: Input) {
        let worker = &mut self.workers[w];
        if !worker.present() {
            return;
        }
        if worker.frozen(self.now) {
            worker.inbox.push_back(input);
            return;
        }
        let now = worker.mono(self.now);
        let orders = worker.model.handle(now, input);
        self.perform(w, orders);
    }

    fn perform(&mut self, w: usize, orders: Vec<Order>) {
        for order in orders {
            match order {
                Order::Renew { seq, regions, member } => self.send(w, Request::Renew { seq, regions, member }),
                Order::Leave => self.send(w, Request::Leave),
                Order::Poll => self.send(w, Request::Poll),
                Order::Claim { region, expected } => self.send(w, Request::Claim { region, expected }),
                Order::Release { region, epoch } => self.send(w, Request::Release { region, epoch }),
                Order::Start { .. } | Order::Stop { .. } => {}
                Order::HandOver { region, .. } => {
                    // The region's last checkpoint and commit take a while.
                    let t = self.now + self.rng.random_range(10..400);
                    self.at(
                        t,
                        Event::AtWorker {
                            w,
                            input: Input::Stopped { region },
                            network: false,
                        },
                    );
                }
                Order::Exit => self.workers[w].exited = true,
            }
        }
    }

    fn at_db(&mut self, w: usize, request: Request) {
        let now = DbTime(self.now);
        let term = self.settings.term;
        let id = self.workers[w].model.id().clone();
        match request {
            Request::Renew { seq, regions, member } => {
                if member {
                    self.db.members.insert(id.clone(), now.after(term));
                }
                let mut kept = Vec::new();
                for (region, epoch) in regions {
                    if let Some(row) = self.db.leases[region].renew(&id, epoch, now, term) {
                        self.db.leases[region] = row;
                        kept.push((region, epoch));
                    }
                }
                self.answer(w, Input::Renewed { seq, kept });
            }
            Request::Leave => {
                self.db.members.remove(&id);
            }
            Request::Poll => {
                let view = View {
                    now,
                    members: self
                        .db
                        .members
                        .iter()
                        .map(|(worker, expires)| Member {
                            worker: worker.clone(),
                            expires: *expires,
                        })
                        .collect(),
                    leases: self.db.leases.clone(),
                };
                self.answer(w, Input::Viewed(view));
            }
            Request::Claim { region, expected } => {
                let input = match self.db.leases[region].claim(&id, expected, now, term) {
                    Claim::Granted(row) => {
                        let epoch = row.epoch;
                        self.db.leases[region] = row;
                        self.db.taken[region].push((epoch, self.now));
                        Input::Claimed { region, epoch }
                    }
                    Claim::Held { .. } | Claim::EpochMoved { .. } => Input::ClaimRefused { region },
                };
                self.answer(w, input);
            }
            Request::Release { region, epoch } => {
                if let Some(row) = self.db.leases[region].release(&id, epoch, now) {
                    self.db.leases[region] = row;
                }
            }
            Request::Write { region, epoch } => {
                let accepted = self.skip_epoch_check || self.db.leases[region].accepts_write(epoch);
                if !accepted {
                    self.answer(w, Input::Lost { region, epoch });
                    return;
                }
                self.accepted_writes += 1;
                if let Some((newer, taken)) = self.db.taken[region].iter().find(|(e, t)| *e > epoch && *t < self.now) {
                    self.violations.push(format!(
                        "at {} ms a write of region {region} under epoch {epoch} was accepted, although epoch {newer} \
                         was taken at {taken} ms",
                        self.now
                    ));
                }
            }
        }
    }

    fn fault(&mut self, op: Op) {
        match op {
            Op::Join => self.join(),
            Op::Kill(p) => {
                if let Some(w) = self.pick(p) {
                    self.workers[w].alive = false;
                }
            }
            Op::Freeze(p, d) => {
                if let Some(w) = self.pick(p) {
                    let until = self.now + d as u64;
                    self.workers[w].frozen_until = self.workers[w].frozen_until.max(until);
                    self.at(until, Event::Thaw(w));
                }
            }
            Op::Cut(p, d) => {
                if let Some(w) = self.pick(p) {
                    self.workers[w].cut_until = self.now + d as u64;
                }
            }
            Op::Slow(p, d) => {
                if let Some(w) = self.pick(p) {
                    self.workers[w].slow_until = self.now + d as u64;
                }
            }
            Op::Shutdown(p) => {
                if let Some(w) = self.pick(p) {
                    self.shutdown(w);
                }
            }
        }
    }

    fn shutdown(&mut self, w: usize) {
        if self.workers[w].leaving {
            return;
        }
        self.workers[w].leaving = true;
        self.deliver(w, Input::Shutdown);
    }

    fn tick(&mut self, w: usize) {
        let worker = &self.workers[w];
        if !worker.present() {
            return;
        }
        if !worker.frozen(self.now) {
            let now = worker.mono(self.now);
            let orders = self.workers[w].model.handle(now, Input::Tick);
            self.perform(w, orders);
        }
        let next = self.now + self.rng.random_range(10..40);
        self.at(next, Event::Tick(w));
    }

    /// The worker writes for every region it acts on; a write may take long
    /// to arrive (a process frozen between its check and its send, a slow
    /// link).
    fn write_attempt(&mut self, w: usize) {
        let worker = &self.workers[w];
        if !worker.present() {
            return;
        }
        if !worker.frozen(self.now) {
            let now = worker.mono(self.now);
            let acting: Vec<(usize, Epoch)> = (0..self.db.leases.len())
                .filter_map(|r| worker.model.acting(r, now).map(|e| (r, e)))
                .collect();
            for (region, epoch) in acting {
                let delay = match self.latency(w) {
                    Some(_) if !self.calm && self.rng.random_bool(0.05) => self.rng.random_range(500..8_000),
                    Some(delay) => delay,
                    None => continue,
                };
                self.at(self.now + delay, Event::AtDb(w, Request::Write { region, epoch }));
            }
        }
        let next = self.now + self.rng.random_range(50..150);
        self.at(next, Event::WriteAttempt(w));
    }

    fn thaw(&mut self, w: usize) {
        if self.workers[w].frozen(self.now) || !self.workers[w].present() {
            return;
        }
        while let Some(input) = self.workers[w].inbox.pop_front() {
            self.deliver(w, input);
        }
    }

    fn calm(&mut self) {
        self.calm = true;
        for w in 0..self.workers.len() {
            let worker = &mut self.workers[w];
            worker.frozen_until = 0;
            worker.cut_until = 0;
            worker.slow_until = 0;
            self.thaw(w);
        }
        if !self.workers.iter().any(|w| w.present() && !w.leaving) {
            self.join();
        }
    }

    /// Property 1 at the current instant.
    fn check_acting(&mut self) {
        for region in 0..self.db.leases.len() {
            let acting: Vec<(usize, Epoch)> = self
                .workers
                .iter()
                .enumerate()
                .filter(|(_, w)| w.present())
                .filter_map(|(i, w)| w.model.acting(region, w.mono(self.now)).map(|e| (i, e)))
                .collect();
            if acting.len() > 1 {
                self.violations.push(format!(
                    "at {} ms workers {acting:?} (index, epoch) all act on region {region}",
                    self.now
                ));
            }
        }
    }

    fn run_until(&mut self, end: u64) {
        while let Some(Reverse((t, _, index))) = self.queue.peek().copied() {
            if t > end {
                break;
            }
            self.queue.pop();
            self.now = t;
            let event = self.events[index].take().expect("each event runs once");
            match event {
                Event::Tick(w) => self.tick(w),
                Event::WriteAttempt(w) => self.write_attempt(w),
                Event::AtDb(w, request) => self.at_db(w, request),
                Event::AtWorker { w, input, network } => {
                    if network && self.workers[w].cut(self.now) {
                        continue;
                    }
                    self.deliver(w, input)
                }
                Event::Fault(op) => self.fault(op),
                Event::Thaw(w) => self.thaw(w),
                Event::Calm => self.calm(),
            }
            self.check_acting();
            if self.violations.len() > 20 {
                return;
            }
        }
        self.now = end;
    }

    /// Property 3, after the calm period.
    fn check_settled(&mut self) {
        let live: Vec<usize> = (0..self.workers.len())
            .filter(|&w| self.workers[w].present() && !self.workers[w].leaving)
            .collect();
        let mut counts: BTreeMap<usize, usize> = live.iter().map(|&w| (w, 0)).collect();
        for region in 0..self.db.leases.len() {
            let holders: Vec<usize> = live
                .iter()
                .copied()
                .filter(|&w| {
                    self.workers[w]
                        .model
                        .acting(region, self.workers[w].mono(self.now))
                        .is_some()
                })
                .collect();
            if holders.len() != 1 {
                self.violations.push(format!(
                    "after the calm period region {region} is acted on by {holders:?} (live: {live:?}; row {:?})",
                    self.db.leases[region]
                ));
                continue;
            }
            let owner = self.workers[holders[0]].model.id();
            if self.db.leases[region].owner.as_ref() != Some(owner) {
                self.violations.push(format!(
                    "region {region} is acted on by {owner}, but its row names {:?}",
                    self.db.leases[region].owner
                ));
            }
            *counts.entry(holders[0]).or_default() += 1;
        }
        if let (Some(max), Some(min)) = (counts.values().max(), counts.values().min()) {
            if max - min > 1 {
                self.violations
                    .push(format!("after the calm period the shares are uneven: {counts:?}"));
            }
        }
    }
}

/// Runs a scenario; returns the violations found.
fn simulate(s: &Scenario, skip_epoch_check: bool) -> Vec<String> {
    let mut sim = Sim::new(s.regions, s.seed, skip_epoch_check);
    for _ in 0..s.workers {
        sim.join();
    }
    let mut t = 2_000;
    for (gap, op) in &s.ops {
        t += *gap as u64;
        sim.at(t, Event::Fault(op.clone()));
    }
    // The last fault may be a long freeze or cut: calm starts after it.
    let calm = t + 10_000;
    sim.at(calm, Event::Calm);
    sim.run_until(calm + 15_000);
    if sim.violations.is_empty() {
        sim.check_settled();
    }
    assert!(
        skip_epoch_check || sim.accepted_writes > 0,
        "the scenario wrote nothing: the test would prove nothing"
    );
    sim.violations
}

proptest! {
    #![proptest_config(Config { cases: 96, ..Config::default() })]

    #[test]
    fn no_two_workers_act_on_a_region_and_no_stale_write_is_accepted(s in scenario()) {
        let violations = simulate(&s, false);
        prop_assert!(violations.is_empty(), "{}", violations.join("\n"));
    }
}

#[test]
fn a_calm_fleet_shares_the_regions_evenly_and_a_standby_takes_over_a_dead_worker() {
    let s = Scenario {
        regions: 3,
        workers: 4,
        ops: vec![(1_000, Op::Kill(0))],
        seed: 7,
    };
    assert_eq!(simulate(&s, false), Vec::<String>::new());
}

/// The sabotage run: a store that accepts writes without comparing epochs
/// lets a zombie's late write land after the region was taken, and the
/// checker says so.
#[test]
fn the_checker_finds_stale_writes_when_the_store_skips_the_epoch_check() {
    let config = Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let result = runner.run(&scenario(), |s| {
        let violations = simulate(&s, true);
        prop_assert!(violations.is_empty(), "{}", violations.join("\n"));
        Ok(())
    });
    let Err(failure) = result else {
        panic!("with the epoch check skipped, no scenario produced a stale write: the checker proves nothing")
    };
    let message = failure.to_string();
    assert!(message.contains("was accepted, although epoch"), "{message}");
}
