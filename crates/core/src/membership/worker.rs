//! One worker's ownership state machine: inputs (its clock ticking, the
//! store's answers, its regions stopping, SIGTERM) in, [`Order`]s out, no
//! I/O. The runtime performs the orders and feeds back the answers; it acts
//! on a region only while [`Worker::acting`] says so, and ticks the worker
//! by [`Worker::next_tick`].
//!
//! The rule that keeps two owners from acting at once: a worker may act on
//! a region until `sent + term − margin` on its own monotonic clock, where
//! `sent` is its reading when it *sent* the claim or renewal that the
//! database granted (the worker records it itself when it gives the order,
//! so the runtime cannot pass a later one). The database evaluated the grant
//! after that moment, so the lease runs at least `term` past it; the worker
//! stops `margin` before. An answer that arrives late extends nothing it
//! would not have extended on time.

use std::collections::{BTreeMap, BTreeSet};

use super::balance;
use super::clock::{DbTime, LeaseSettings, MonoTime};
use super::lease::{Epoch, Member, RegionLease, WorkerId};

/// The rows a poll read, in one transaction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// The database's clock in that transaction.
    pub now: DbTime,
    /// The workers' membership rows.
    pub members: Vec<Member>,
    /// Every region's lease row, region `r` at index `r`.
    pub leases: Vec<RegionLease>,
}

/// What happens to a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Its clock moved (see [`Worker::next_tick`]).
    Tick,
    /// The renewal `seq` was granted: `kept` are the regions (of those it
    /// named) still the worker's under those epochs; the others were lost.
    Renewed {
        /// The renewal's number, from its [`Order::Renew`].
        seq: u64,
        /// Regions and epochs whose leases were renewed.
        kept: Vec<(usize, Epoch)>,
    },
    /// The renewal `seq` failed or its outcome is unknown.
    RenewFailed {
        /// The renewal's number.
        seq: u64,
    },
    /// A poll read these rows.
    Viewed(View),
    /// A poll failed.
    PollFailed,
    /// A claim was granted: the region is the worker's under `epoch`.
    Claimed {
        /// The region.
        region: usize,
        /// Its new epoch.
        epoch: Epoch,
    },
    /// A claim was refused (held by another, or the epoch moved).
    ClaimRefused {
        /// The region.
        region: usize,
    },
    /// A claim failed with an unknown outcome: it may have been granted.
    ClaimFailed {
        /// The region.
        region: usize,
    },
    /// The region's runner ended (after a hand-over, a stop, or on its own).
    Stopped {
        /// The region.
        region: usize,
    },
    /// A write under `epoch` was refused for its epoch: someone took the
    /// region.
    Lost {
        /// The region.
        region: usize,
        /// The refused epoch.
        epoch: Epoch,
    },
    /// SIGTERM: hand every region over, then exit.
    Shutdown,
}

/// What the worker asks the runtime to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Order {
    /// Renew the leases of `regions` (under their epochs), and the
    /// membership row when `member`, in one transaction; answer with
    /// [`Input::Renewed`] or [`Input::RenewFailed`] and `seq`.
    Renew {
        /// The renewal's number.
        seq: u64,
        /// The regions held, with their epochs.
        regions: Vec<(usize, Epoch)>,
        /// Whether to renew the membership (not once shutting down: the
        /// others' shares must no longer count this worker).
        member: bool,
    },
    /// Delete the membership row at once (SIGTERM): the other workers
    /// count their shares without this one while it hands over.
    Leave,
    /// Read the membership and lease rows; answer with [`Input::Viewed`].
    Poll,
    /// Claim the region (lease, then fence) if its epoch is still
    /// `expected`; answer with [`Input::Claimed`], [`Input::ClaimRefused`]
    /// or [`Input::ClaimFailed`].
    Claim {
        /// The region.
        region: usize,
        /// The epoch the worker read.
        expected: Epoch,
    },
    /// Start acting on the region under `epoch`: read its latest
    /// checkpoint and recover.
    Start {
        /// The region.
        region: usize,
        /// The epoch every write of this ownership carries.
        epoch: Epoch,
    },
    /// Stop acting on the region at once, without a last checkpoint: the
    /// lease may be gone. Answer with [`Input::Stopped`].
    Stop {
        /// The region.
        region: usize,
        /// The epoch it was held under.
        epoch: Epoch,
    },
    /// Take a last checkpoint of the region, commit it and stop; answer
    /// with [`Input::Stopped`].
    HandOver {
        /// The region.
        region: usize,
        /// The epoch it is held under.
        epoch: Epoch,
    },
    /// Give the lease up at once (announce it to the other workers).
    Release {
        /// The region.
        region: usize,
        /// The epoch it was held under.
        epoch: Epoch,
    },
    /// Shut down: every region was handed over.
    Exit,
}

/// A region the worker holds.
#[derive(Clone, Debug)]
struct Held {
    epoch: Epoch,
    /// The worker acts on it until then, exclusive.
    deadline: MonoTime,
    handing_over: bool,
}

/// A renewal in flight.
#[derive(Clone, Debug)]
struct Renewal {
    sent: MonoTime,
    asked: Vec<(usize, Epoch)>,
}

/// One worker's ownership state. See the module documentation.
#[derive(Clone, Debug)]
pub struct Worker {
    me: WorkerId,
    settings: LeaseSettings,
    held: BTreeMap<usize, Held>,
    /// Claims in flight, with when they were sent.
    claiming: BTreeMap<usize, MonoTime>,
    renewals: BTreeMap<u64, Renewal>,
    next_seq: u64,
    last_renewal: Option<MonoTime>,
    polling: Option<MonoTime>,
    last_poll: Option<MonoTime>,
    shutting_down: bool,
    exited: bool,
}

impl Worker {
    /// A worker `me` holding nothing; its first tick registers it.
    pub fn new(me: WorkerId, settings: LeaseSettings) -> Worker {
        Worker {
            me,
            settings,
            held: BTreeMap::new(),
            claiming: BTreeMap::new(),
            renewals: BTreeMap::new(),
            next_seq: 0,
            last_renewal: None,
            polling: None,
            last_poll: None,
            shutting_down: false,
            exited: false,
        }
    }

    /// Who the worker is.
    pub fn id(&self) -> &WorkerId {
        &self.me
    }

    /// The epoch under which the worker may act on `region` at `now`, or
    /// `None`: it does not hold it, or its deadline has passed.
    pub fn acting(&self, region: usize, now: MonoTime) -> Option<Epoch> {
        self.held.get(&region).filter(|h| now < h.deadline).map(|h| h.epoch)
    }

    /// Until when (exclusive) the worker may act on `region` under
    /// `epoch`, on its own clock; `None` when it does not hold it so.
    pub fn deadline(&self, region: usize, epoch: Epoch) -> Option<MonoTime> {
        self.held.get(&region).filter(|h| h.epoch == epoch).map(|h| h.deadline)
    }

    /// The regions the worker holds (acting or handing over), lowest first.
    pub fn held(&self) -> Vec<(usize, Epoch)> {
        self.held.iter().map(|(r, h)| (*r, h.epoch)).collect()
    }

    /// When the worker must be ticked next: its earliest deadline, its next
    /// renewal or poll, or the time-out of one in flight. `None` once it
    /// exited.
    pub fn next_tick(&self) -> Option<MonoTime> {
        if self.exited {
            return None;
        }
        let s = &self.settings;
        let mut next = self.held.values().map(|h| h.deadline).min();
        let mut at = |t: MonoTime| next = Some(next.map_or(t, |n| n.min(t)));
        at(self.last_renewal.map_or(MonoTime(0), |t| t.after(s.renew_every)));
        if !self.shutting_down {
            match self.polling {
                Some(sent) => at(sent.after(s.term)),
                None => at(self.last_poll.map_or(MonoTime(0), |t| t.after(s.poll))),
            }
        }
        if let Some(sent) = self.claiming.values().min() {
            at(sent.after(s.term));
        }
        next
    }

    /// Feeds one input at `now` (the worker's clock) and returns the orders
    /// it leads to, in order.
    pub fn handle(&mut self, now: MonoTime, input: Input) -> Vec<Order> {
        let mut orders = Vec::new();
        if self.exited {
            return orders;
        }
        match input {
            Input::Tick => self.tick(now, &mut orders),
            Input::Renewed { seq, kept } => self.renewed(seq, &kept, &mut orders),
            Input::RenewFailed { seq } => {
                self.renewals.remove(&seq);
            }
            Input::Viewed(view) => self.viewed(now, &view, &mut orders),
            Input::PollFailed => self.polling = None,
            Input::Claimed { region, epoch } => self.claimed(now, region, epoch, &mut orders),
            Input::ClaimRefused { region } | Input::ClaimFailed { region } => {
                self.claiming.remove(&region);
            }
            Input::Stopped { region } => {
                if let Some(held) = self.held.remove(&region) {
                    orders.push(Order::Release {
                        region,
                        epoch: held.epoch,
                    });
                }
            }
            Input::Lost { region, epoch } => {
                if self.held.get(&region).is_some_and(|h| h.epoch == epoch) {
                    self.held.remove(&region);
                    orders.push(Order::Stop { region, epoch });
                    // Conditional on the holder and the epoch: frees nothing
                    // that is someone else's, and a lease still this
                    // worker's (its lost write was a sink's) goes at once.
                    orders.push(Order::Release { region, epoch });
                }
            }
            Input::Shutdown => {
                if !self.shutting_down {
                    orders.push(Order::Leave);
                }
                self.shutting_down = true;
                for (&region, held) in self.held.iter_mut().filter(|(_, h)| !h.handing_over) {
                    held.handing_over = true;
                    orders.push(Order::HandOver {
                        region,
                        epoch: held.epoch,
                    });
                }
            }
        }
        if self.shutting_down && self.held.is_empty() && self.claiming.is_empty() {
            self.exited = true;
            orders.push(Order::Exit);
        }
        orders
    }

    fn tick(&mut self, now: MonoTime, orders: &mut Vec<Order>) {
        let s = self.settings;
        let expired: Vec<usize> = self
            .held
            .iter()
            .filter(|(_, h)| h.deadline <= now)
            .map(|(r, _)| *r)
            .collect();
        for region in expired {
            let held = self.held.remove(&region).expect("listed");
            orders.push(Order::Stop {
                region,
                epoch: held.epoch,
            });
        }
        // An answer this late could extend nothing: forget the request.
        let window = s.acting_window();
        self.renewals.retain(|_, r| now < r.sent.after(window));
        self.claiming.retain(|_, sent| now < sent.after(s.term));
        if self.polling.is_some_and(|sent| now >= sent.after(s.term)) {
            self.polling = None;
        }
        if self.last_renewal.is_none_or(|t| now >= t.after(s.renew_every)) {
            let seq = self.next_seq;
            self.next_seq += 1;
            let asked = self.held();
            self.renewals.insert(
                seq,
                Renewal {
                    sent: now,
                    asked: asked.clone(),
                },
            );
            self.last_renewal = Some(now);
            orders.push(Order::Renew {
                seq,
                regions: asked,
                member: !self.shutting_down,
            });
        }
        if !self.shutting_down && self.polling.is_none() && self.last_poll.is_none_or(|t| now >= t.after(s.poll)) {
            self.polling = Some(now);
            self.last_poll = Some(now);
            orders.push(Order::Poll);
        }
    }

    fn renewed(&mut self, seq: u64, kept: &[(usize, Epoch)], orders: &mut Vec<Order>) {
        let Some(renewal) = self.renewals.remove(&seq) else {
            return;
        };
        let until = renewal.sent.after(self.settings.acting_window());
        for &(region, epoch) in &renewal.asked {
            let Some(held) = self.held.get_mut(&region).filter(|h| h.epoch == epoch) else {
                continue;
            };
            if kept.contains(&(region, epoch)) {
                held.deadline = held.deadline.max(until);
            } else {
                self.held.remove(&region);
                orders.push(Order::Stop { region, epoch });
            }
        }
        // Leases renewed for regions the worker no longer acts on (it
        // stopped them at their deadline meanwhile): free them at once.
        for &(region, epoch) in kept {
            if self.held.get(&region).is_none_or(|h| h.epoch != epoch) {
                orders.push(Order::Release { region, epoch });
            }
        }
    }

    fn viewed(&mut self, now: MonoTime, view: &View, orders: &mut Vec<Order>) {
        self.polling = None;
        if self.shutting_down {
            return;
        }
        let held: BTreeSet<usize> = self.held.keys().copied().collect();
        let claiming: BTreeSet<usize> = self.claiming.keys().copied().collect();
        // Leases the database says are the worker's although it does not act
        // on them (a grant or renewal whose answer came too late or not at
        // all): free them at once rather than at their expiry.
        for (region, lease) in view.leases.iter().enumerate() {
            let forgotten = lease.is_held_by(&self.me, view.now)
                && !claiming.contains(&region)
                && self.held.get(&region).is_none_or(|h| h.epoch != lease.epoch);
            if forgotten {
                orders.push(Order::Release {
                    region,
                    epoch: lease.epoch,
                });
            }
        }
        let plan = balance::plan(&self.me, &view.members, &view.leases, view.now, &held, &claiming);
        for region in plan.hand_over {
            if let Some(held) = self.held.get_mut(&region).filter(|h| !h.handing_over) {
                held.handing_over = true;
                orders.push(Order::HandOver {
                    region,
                    epoch: held.epoch,
                });
            }
        }
        for region in plan.claim {
            self.claiming.insert(region, now);
            orders.push(Order::Claim {
                region,
                expected: view.leases[region].epoch,
            });
        }
    }

    fn claimed(&mut self, now: MonoTime, region: usize, epoch: Epoch, orders: &mut Vec<Order>) {
        let deadline = self
            .claiming
            .remove(&region)
            .map(|sent| sent.after(self.settings.acting_window()));
        match deadline {
            Some(deadline) if now < deadline && !self.shutting_down => {
                self.held.insert(
                    region,
                    Held {
                        epoch,
                        deadline,
                        handing_over: false,
                    },
                );
                orders.push(Order::Start { region, epoch });
            }
            // Too late to act on (or forgotten, or shutting down): free it.
            _ => orders.push(Order::Release { region, epoch }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> LeaseSettings {
        LeaseSettings::default()
    }

    fn view(now: u64, members: &[&str], leases: Vec<RegionLease>) -> View {
        View {
            now: DbTime(now),
            members: members
                .iter()
                .map(|m| Member {
                    worker: WorkerId(m.to_string()),
                    expires: DbTime(now + 3_000),
                })
                .collect(),
            leases,
        }
    }

    #[test]
    fn a_worker_acts_until_term_minus_margin_after_it_sent_the_grant_request() {
        let mut w = Worker::new(WorkerId("a".into()), settings());
        let first = w.handle(MonoTime(0), Input::Tick);
        assert_eq!(
            first,
            vec![
                Order::Renew {
                    seq: 0,
                    regions: vec![],
                    member: true
                },
                Order::Poll
            ]
        );
        let orders = w.handle(
            MonoTime(100),
            Input::Viewed(view(0, &["a"], vec![RegionLease::default()])),
        );
        assert_eq!(
            orders,
            vec![Order::Claim {
                region: 0,
                expected: Epoch(0)
            }]
        );
        // The answer comes 1.9 s later: the window still counts from 100.
        let orders = w.handle(
            MonoTime(2_000),
            Input::Claimed {
                region: 0,
                epoch: Epoch(1),
            },
        );
        assert_eq!(
            orders,
            vec![Order::Start {
                region: 0,
                epoch: Epoch(1)
            }]
        );
        assert_eq!(w.acting(0, MonoTime(2_599)), Some(Epoch(1)));
        assert_eq!(w.acting(0, MonoTime(2_600)), None, "100 + 3 s − 500 ms");
        assert_eq!(w.next_tick(), Some(MonoTime(250)), "the next poll");
        let renew = w.handle(MonoTime(1_000), Input::Tick);
        assert!(renew.contains(&Order::Renew {
            seq: 1,
            regions: vec![(0, Epoch(1))],
            member: true
        }));
        w.handle(
            MonoTime(2_500),
            Input::Renewed {
                seq: 1,
                kept: vec![(0, Epoch(1))],
            },
        );
        assert_eq!(w.acting(0, MonoTime(3_499)), Some(Epoch(1)), "1000 + 2500");
        assert_eq!(w.acting(0, MonoTime(3_500)), None);
        let stop = w.handle(MonoTime(3_500), Input::Tick);
        assert!(stop.contains(&Order::Stop {
            region: 0,
            epoch: Epoch(1)
        }));
    }

    #[test]
    fn a_late_grant_is_released_and_a_lost_lease_stops_the_region() {
        let mut w = Worker::new(WorkerId("a".into()), settings());
        w.handle(MonoTime(0), Input::Tick);
        w.handle(
            MonoTime(0),
            Input::Viewed(view(0, &["a"], vec![RegionLease::default(), RegionLease::default()])),
        );
        let late = w.handle(
            MonoTime(2_500),
            Input::Claimed {
                region: 0,
                epoch: Epoch(1),
            },
        );
        assert_eq!(
            late,
            vec![Order::Release {
                region: 0,
                epoch: Epoch(1)
            }]
        );
        w.handle(
            MonoTime(100),
            Input::Claimed {
                region: 1,
                epoch: Epoch(4),
            },
        );
        let lost = w.handle(
            MonoTime(200),
            Input::Lost {
                region: 1,
                epoch: Epoch(4),
            },
        );
        assert_eq!(
            lost,
            vec![
                Order::Stop {
                    region: 1,
                    epoch: Epoch(4)
                },
                Order::Release {
                    region: 1,
                    epoch: Epoch(4)
                }
            ]
        );
        assert_eq!(w.acting(1, MonoTime(201)), None);
    }

    #[test]
    fn shutdown_hands_every_region_over_then_exits() {
        let mut w = Worker::new(WorkerId("a".into()), settings());
        w.handle(MonoTime(0), Input::Tick);
        w.handle(
            MonoTime(0),
            Input::Viewed(view(0, &["a"], vec![RegionLease::default()])),
        );
        w.handle(
            MonoTime(10),
            Input::Claimed {
                region: 0,
                epoch: Epoch(1),
            },
        );
        assert_eq!(
            w.handle(MonoTime(20), Input::Shutdown),
            vec![
                Order::Leave,
                Order::HandOver {
                    region: 0,
                    epoch: Epoch(1)
                }
            ]
        );
        assert_eq!(w.acting(0, MonoTime(30)), Some(Epoch(1)), "it acts until handed over");
        assert_eq!(
            w.handle(MonoTime(40), Input::Stopped { region: 0 }),
            vec![
                Order::Release {
                    region: 0,
                    epoch: Epoch(1)
                },
                Order::Exit
            ]
        );
        assert_eq!(w.next_tick(), None);
    }
}
