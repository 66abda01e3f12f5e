//! The store's side of ownership: one region's lease row and the rules for
//! changing it. Every rule is a function of the row and the database's time
//! ([`DbTime`]) alone; the PostgreSQL store's statements implement the same
//! conditions, evaluated inside their transactions.
//!
//! - [`claim`](RegionLease::claim): granted when the lease is free (never
//!   held, released, or expired on the database's clock) or already the
//!   claimant's, *and* the epoch is still the one the claimant saw
//!   (compare-and-set). The epoch goes up by one: the previous owner is
//!   fenced.
//! - [`renew`](RegionLease::renew): granted to the owner of the epoch it
//!   names, even when the lease ran out meanwhile (nobody claimed it, so
//!   nobody else acted).
//! - [`release`](RegionLease::release): the owner gives the lease up at
//!   once (hand-over); the epoch stays, the next claim raises it.
//! - [`accepts_write`](RegionLease::accepts_write): a write is accepted
//!   only under the current epoch — whatever the lease says.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::clock::DbTime;

/// A region's fencing token: raised by every claim, carried by every write
/// of the owner, and compared by the store that keeps the write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch after this one.
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A worker's identity: host, process id, start time and a random tag, so
/// that a restarted process is a new worker.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub String);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A worker's membership row: live while `expires` is ahead of the
/// database's clock. Renewed with its leases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Who.
    pub worker: WorkerId,
    /// Until when, on the database's clock.
    pub expires: DbTime,
}

impl Member {
    /// Whether the member counts at `now`.
    pub fn is_live(&self, now: DbTime) -> bool {
        now < self.expires
    }
}

/// One region's ownership row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionLease {
    /// The worker holding (or last holding) the lease; `None` when never
    /// held or released.
    pub owner: Option<WorkerId>,
    /// The current epoch: the one the latest claim took.
    pub epoch: Epoch,
    /// When the lease runs out, on the database's clock.
    pub expires: DbTime,
}

/// The outcome of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Granted: the new row (epoch raised by one, lease until `expires`).
    Granted(RegionLease),
    /// Another worker's lease runs until `until`.
    Held {
        /// The holder.
        by: WorkerId,
        /// When its lease runs out, unless renewed.
        until: DbTime,
    },
    /// Someone claimed the region since the claimant read it: its epoch is
    /// now `current`.
    EpochMoved {
        /// The epoch the region has now.
        current: Epoch,
    },
}

impl RegionLease {
    /// Whether nobody holds the lease at `now`: never held, released, or
    /// expired.
    pub fn is_free(&self, now: DbTime) -> bool {
        self.owner.is_none() || now > self.expires
    }

    /// Whether `worker` holds the lease at `now`.
    pub fn is_held_by(&self, worker: &WorkerId, now: DbTime) -> bool {
        self.owner.as_ref() == Some(worker) && now <= self.expires
    }

    /// `who` claims the region, having read it at epoch `expected`: granted
    /// when the lease is free or already `who`'s and the epoch has not
    /// moved; the grant raises the epoch by one and runs the lease for
    /// `term` from `now`.
    pub fn claim(&self, who: &WorkerId, expected: Epoch, now: DbTime, term: Duration) -> Claim {
        if let Some(by) = self.owner.as_ref().filter(|by| *by != who && now <= self.expires) {
            return Claim::Held {
                by: by.clone(),
                until: self.expires,
            };
        }
        if self.epoch != expected {
            return Claim::EpochMoved { current: self.epoch };
        }
        Claim::Granted(RegionLease {
            owner: Some(who.clone()),
            epoch: self.epoch.next(),
            expires: now.after(term),
        })
    }

    /// `who` renews the lease it holds under `epoch`: `Some(row)` with the
    /// lease running for `term` from `now`, or `None` when the region was
    /// claimed by someone else or released since (the epoch or the owner
    /// moved).
    pub fn renew(&self, who: &WorkerId, epoch: Epoch, now: DbTime, term: Duration) -> Option<RegionLease> {
        (self.owner.as_ref() == Some(who) && self.epoch == epoch).then(|| RegionLease {
            expires: now.after(term),
            ..self.clone()
        })
    }

    /// `who` gives up the lease it holds under `epoch`, at `now`: `Some(row)`
    /// free at once, or `None` when it no longer holds it.
    pub fn release(&self, who: &WorkerId, epoch: Epoch, now: DbTime) -> Option<RegionLease> {
        (self.owner.as_ref() == Some(who) && self.epoch == epoch).then_some(RegionLease {
            owner: None,
            epoch: self.epoch,
            expires: now,
        })
    }

    /// Whether a write made under `epoch` may be accepted: only under the
    /// current epoch. The lease plays no part: an owner whose lease ran out
    /// but whom nobody fenced still owns the region's data.
    pub fn accepts_write(&self, epoch: Epoch) -> bool {
        self.epoch == epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERM: Duration = Duration::from_secs(3);

    fn w(name: &str) -> WorkerId {
        WorkerId(name.into())
    }

    #[test]
    fn a_claim_fences_and_only_a_free_lease_at_the_epoch_read_is_granted() {
        let free = RegionLease::default();
        let Claim::Granted(a) = free.claim(&w("a"), Epoch(0), DbTime(1_000), TERM) else {
            panic!("a free region is granted")
        };
        assert_eq!((a.epoch, a.expires), (Epoch(1), DbTime(4_000)));
        assert_eq!(
            a.claim(&w("b"), Epoch(1), DbTime(4_000), TERM),
            Claim::Held {
                by: w("a"),
                until: DbTime(4_000)
            },
            "held until the end of the term, inclusive"
        );
        let Claim::Granted(b) = a.claim(&w("b"), Epoch(1), DbTime(4_001), TERM) else {
            panic!("expired")
        };
        assert_eq!(b.epoch, Epoch(2));
        assert!(!b.accepts_write(Epoch(1)), "the old owner is fenced");
        assert!(b.accepts_write(Epoch(2)));
        assert_eq!(
            b.claim(&w("c"), Epoch(1), DbTime(9_000), TERM),
            Claim::EpochMoved { current: Epoch(2) },
            "a claim decided on an old reading takes nothing"
        );
        let Claim::Granted(again) = b.claim(&w("b"), Epoch(2), DbTime(5_000), TERM) else {
            panic!("the holder may claim again (a restart of its region)")
        };
        assert_eq!(again.epoch, Epoch(3));
    }

    #[test]
    fn renewals_and_releases_need_the_owner_and_its_epoch() {
        let Claim::Granted(a) = RegionLease::default().claim(&w("a"), Epoch(0), DbTime(0), TERM) else {
            unreachable!()
        };
        let renewed = a
            .renew(&w("a"), Epoch(1), DbTime(10_000), TERM)
            .expect("not claimed since");
        assert_eq!(renewed.expires, DbTime(13_000));
        assert!(a.renew(&w("a"), Epoch(0), DbTime(1), TERM).is_none());
        assert!(a.renew(&w("b"), Epoch(1), DbTime(1), TERM).is_none());
        let released = a.release(&w("a"), Epoch(1), DbTime(500)).expect("its own");
        assert!(released.is_free(DbTime(500)));
        assert_eq!(released.epoch, Epoch(1), "the next claim raises it");
        assert!(released.renew(&w("a"), Epoch(1), DbTime(600), TERM).is_none());
    }
}
