//! [`LeaseStore`]: where the workers of one pipeline keep their membership
//! and region leases — a store every worker reaches, whose clock judges
//! every lease. It performs the [`Worker`](super::Worker)'s
//! [`Order`](super::Order)s that touch the rows (poll, claim, renew,
//! release, leave), each as one transaction that applies the rules of
//! [`RegionLease`](super::RegionLease) at the store's own time.
//!
//! A region's lease lives beside its checkpoint sequence: a claim that is
//! granted raises the sequence's epoch in the same transaction (the fence
//! of [`SequenceStore::fence`](crate::store::SequenceStore::fence)), so the
//! lease's epoch and the epoch every checkpoint write is checked against
//! are one number.
//!
//! Errors say whether the call may have taken effect
//! ([`AccessError::Indeterminate`]): a claim whose answer was lost may have
//! been granted — the worker treats it as [`Input::ClaimFailed`](super::Input::ClaimFailed),
//! and the next poll tells.

use std::time::Duration;

use async_trait::async_trait;

use super::lease::{Claim, Epoch, WorkerId};
use super::worker::View;
use crate::store::AccessError;

/// The membership and lease rows of one pipeline's workers.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Reads, in one transaction, the store's time, every membership row
    /// and the lease rows of regions `0..regions` (a region never claimed
    /// reads as free at its sequence's epoch) — [`Order::Poll`](super::Order::Poll).
    async fn view(&self, regions: usize) -> Result<View, AccessError>;

    /// `who` claims `region`, having read it at epoch `expected`:
    /// [`RegionLease::claim`](super::RegionLease::claim) at the store's time, with a lease of `term`.
    /// Granted, the region's sequence is fenced at the new epoch in the same
    /// transaction (owner `who`): from then on every write of an older
    /// epoch is refused.
    async fn claim(&self, region: usize, who: &WorkerId, expected: Epoch, term: Duration)
        -> Result<Claim, AccessError>;

    /// Renews, in one transaction, the leases of `regions` that are still
    /// `who`'s under those epochs ([`RegionLease::renew`](super::RegionLease::renew), even when they
    /// ran out meanwhile) and, when `member`, `who`'s membership row
    /// (making it), each for `term` from the store's time; returns the
    /// regions renewed — [`Order::Renew`](super::Order::Renew).
    async fn renew(
        &self,
        who: &WorkerId,
        regions: &[(usize, Epoch)],
        member: bool,
        term: Duration,
    ) -> Result<Vec<(usize, Epoch)>, AccessError>;

    /// `who` gives up the lease of `region` it holds under `epoch`
    /// ([`RegionLease::release`](super::RegionLease::release)): free at once, the epoch unchanged (the
    /// next claim raises it). `false` when it was no longer `who`'s.
    async fn release(&self, region: usize, who: &WorkerId, epoch: Epoch) -> Result<bool, AccessError>;

    /// Deletes `who`'s membership row — [`Order::Leave`](super::Order::Leave).
    async fn leave(&self, who: &WorkerId) -> Result<(), AccessError>;

    /// The process that runs the pipeline alone (without workers, holding
    /// the store's lock), if one does now: workers must not run beside it
    /// (it neither claims nor fences as they do). `None` by default.
    async fn sole_holder(&self) -> Result<Option<String>, AccessError> {
        Ok(None)
    }
}
