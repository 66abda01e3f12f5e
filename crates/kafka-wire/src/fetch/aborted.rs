//! Which batches of a read_committed Fetch answer a consumer may deliver,
//! without I/O.
//!
//! A read_committed Fetch answer holds the partition's batches up to its
//! last stable offset — committed, aborted and plain ones alike — and lists
//! the aborted transactions that overlap them: `(producer id, offset of the
//! transaction's first record)`. The consumer drops what they cover
//! (KIP-98):
//!
//! - walking the batches in log order, a transaction of the list becomes
//!   "aborted" for its producer once a batch of that producer reaches its
//!   first offset;
//! - a transactional batch of a producer in the aborted state is dropped;
//! - the producer's ABORT marker ends that state (its next transaction may
//!   well commit);
//! - control batches (COMMIT and ABORT markers) are never delivered.
//!
//! Everything else — plain batches, idempotent ones, committed
//! transactions — is delivered. The list belongs to one answer: a filter
//! is made per answer and partition.

use std::collections::{BTreeSet, VecDeque};

use crate::batch::BatchHeader;
use crate::records::ControlMarker;

/// The read_committed verdicts for the batches of one partition of one
/// Fetch answer, fed in log order.
#[derive(Debug, Default)]
pub(crate) struct AbortedFilter {
    /// Aborted transactions of the answer not reached yet, by first offset.
    pending: VecDeque<(i64, i64)>,
    /// Producers whose current transaction is aborted.
    aborted: BTreeSet<i64>,
}

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Deliver its records.
    Deliver,
    /// Skip it: a control batch, or a batch of an aborted transaction.
    Skip,
}

impl AbortedFilter {
    /// A filter for an answer listing `aborted` transactions as
    /// `(producer id, first offset)`, in any order.
    pub(crate) fn new(aborted: impl IntoIterator<Item = (i64, i64)>) -> AbortedFilter {
        let mut pending: Vec<(i64, i64)> = aborted.into_iter().map(|(producer, first)| (first, producer)).collect();
        pending.sort_unstable();
        AbortedFilter {
            pending: pending.into(),
            aborted: BTreeSet::new(),
        }
    }

    /// The verdict on the next batch. `marker` is asked for the marker of a
    /// control batch of a producer (it decodes the batch's one record), and
    /// only then.
    pub(crate) fn judge<E>(
        &mut self,
        header: &BatchHeader,
        marker: impl FnOnce() -> Result<ControlMarker, E>,
    ) -> Result<Verdict, E> {
        if header.producer_id >= 0 {
            while let Some(&(first, producer)) = self.pending.front() {
                if first > header.last_offset {
                    break;
                }
                self.aborted.insert(producer);
                self.pending.pop_front();
            }
            if header.control {
                if marker()? == ControlMarker::Abort {
                    self.aborted.remove(&header.producer_id);
                }
                return Ok(Verdict::Skip);
            }
            if header.transactional && self.aborted.contains(&header.producer_id) {
                return Ok(Verdict::Skip);
            }
        }
        Ok(if header.control {
            Verdict::Skip
        } else {
            Verdict::Deliver
        })
    }
}

#[cfg(test)]
mod tests;
