//! Even, sticky shares of the regions among the live workers.
//!
//! With `W` live workers (membership rows not expired on the database's
//! clock) and `R` regions, every worker's [`quota`] is `R / W`, and the first
//! `R % W` workers in id order may hold one more: every worker computes the
//! same quotas from the same rows, and the counts differ by at most one. A
//! worker keeps what it holds up to its quota (sticky: a join moves only the
//! regions the newcomer needs), hands over its highest-numbered regions above
//! it, and claims free regions below it, starting at an offset of its own so
//! that several hungry workers rarely race for the same region. A worker
//! whose quota is 0 is a hot standby.

use std::collections::BTreeSet;

use super::clock::DbTime;
use super::lease::{Member, RegionLease, WorkerId};

/// The live workers at `now`, in id order, without repeats.
pub fn live_workers(members: &[Member], now: DbTime) -> Vec<WorkerId> {
    let live: BTreeSet<&WorkerId> = members.iter().filter(|m| m.is_live(now)).map(|m| &m.worker).collect();
    live.into_iter().cloned().collect()
}

/// How many of `regions` regions `me` should hold among the `live` workers
/// (in id order); `None` when `me` is not one of them (it claims and hands
/// over nothing until its membership is renewed).
pub fn quota(live: &[WorkerId], regions: usize, me: &WorkerId) -> Option<usize> {
    let rank = live.iter().position(|w| w == me)?;
    let (share, extra) = (regions / live.len(), regions % live.len());
    Some(share + usize::from(rank < extra))
}

/// What a worker should do after reading the rows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Free regions to claim, in the order to try them.
    pub claim: Vec<usize>,
    /// Regions to hand over (last checkpoint, then release).
    pub hand_over: Vec<usize>,
}

/// What `me` should do, seen from the rows read at `now` (`leases[r]` is
/// region `r`'s), holding `held` and with claims of `claiming` in flight.
pub fn plan(
    me: &WorkerId,
    members: &[Member],
    leases: &[RegionLease],
    now: DbTime,
    held: &BTreeSet<usize>,
    claiming: &BTreeSet<usize>,
) -> Plan {
    let live = live_workers(members, now);
    let Some(quota) = quota(&live, leases.len(), me) else {
        return Plan::default();
    };
    let mut plan = Plan::default();
    if held.len() > quota {
        plan.hand_over = held.iter().rev().take(held.len() - quota).copied().collect();
        plan.hand_over.sort_unstable();
        return plan;
    }
    let wanted = quota.saturating_sub(held.len() + claiming.len());
    if wanted == 0 || leases.is_empty() {
        return plan;
    }
    let rank = live.iter().position(|w| w == me).unwrap_or(0);
    let start = rank * leases.len() / live.len();
    plan.claim = (0..leases.len())
        .map(|i| (start + i) % leases.len())
        .filter(|r| !held.contains(r) && !claiming.contains(r) && leases[*r].is_free(now))
        .take(wanted)
        .collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::Epoch;

    fn w(name: &str) -> WorkerId {
        WorkerId(name.into())
    }

    fn members(names: &[&str]) -> Vec<Member> {
        names
            .iter()
            .map(|n| Member {
                worker: w(n),
                expires: DbTime(10_000),
            })
            .collect()
    }

    #[test]
    fn quotas_are_even_and_add_up() {
        for workers in 1..8 {
            for regions in 0..20 {
                let live: Vec<_> = (0..workers).map(|i| w(&format!("w{i}"))).collect();
                let quotas: Vec<_> = live.iter().map(|me| quota(&live, regions, me).unwrap()).collect();
                assert_eq!(quotas.iter().sum::<usize>(), regions);
                assert!(quotas.iter().max().unwrap() - quotas.iter().min().unwrap() <= 1);
            }
        }
        assert_eq!(quota(&[w("a")], 3, &w("b")), None, "not a live member");
    }

    #[test]
    fn a_worker_keeps_its_share_hands_over_extras_and_claims_only_free_regions() {
        let now = DbTime(5_000);
        let held_by = |owner: &str| RegionLease {
            owner: Some(w(owner)),
            epoch: Epoch(1),
            expires: DbTime(8_000),
        };
        let leases = vec![held_by("a"), held_by("a"), held_by("a"), RegionLease::default()];
        let all = members(&["a", "b"]);
        let a_holds: BTreeSet<usize> = [0, 1, 2].into();
        let none = BTreeSet::new();
        assert_eq!(
            plan(&w("a"), &all, &leases, now, &a_holds, &none),
            Plan {
                claim: vec![],
                hand_over: vec![2]
            },
            "a's quota is 2: it hands over its highest region"
        );
        assert_eq!(
            plan(&w("b"), &all, &leases, now, &none, &none).claim,
            vec![3],
            "b claims the free region, not a's"
        );
        assert_eq!(
            plan(&w("b"), &all, &leases, now, &none, &[3].into()).claim,
            Vec::<usize>::new(),
            "one claim in flight already"
        );
        assert_eq!(
            plan(&w("c"), &all, &leases, now, &none, &none),
            Plan::default(),
            "not a member yet"
        );
        let standby = members(&["a", "b", "c", "d", "e"]);
        assert_eq!(
            quota(&live_workers(&standby, now), 4, &w("e")),
            Some(0),
            "a hot standby"
        );
    }
}
