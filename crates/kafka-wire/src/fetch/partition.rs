//! One partition's part of a read_committed Fetch answer, turned into the
//! records to deliver and the next offset to fetch. No I/O.

use bytes::Bytes;

use super::aborted::{AbortedFilter, Verdict};
use crate::batch::{control_marker, decode_records_into, take_batch, BatchHeader, FetchedRecord};

/// What one partition's data in a Fetch answer holds for a consumer at
/// `position`.
#[derive(Debug, Default)]
pub(crate) struct PartitionRead {
    /// The records to deliver, in offset order, all at or after the
    /// position.
    pub records: Vec<FetchedRecord>,
    /// The next offset to fetch: past the last complete batch, control
    /// batches and aborted batches included (which deliver nothing).
    pub next: i64,
    /// The leader epoch of the last batch passed (`None`: no batch, or
    /// only batches that carry none).
    pub last_epoch: Option<i32>,
    /// The answer held bytes but not one complete batch from the position
    /// on: the broker cut a batch at the partition's byte limit, so the
    /// next Fetch must allow more. (Apache Kafka sends nothing instead of
    /// a cut first batch, and the partition waits for its turn to come
    /// first in a request, when the broker sends its next batch whole;
    /// brokers that send the cut bytes are served this way.)
    pub cut: bool,
}

/// Reads the batches of `raw` (a partition's `records` in a read_committed
/// Fetch answer from `position`), dropping what `aborted` (the answer's
/// aborted transactions, `(producer id, first offset)`) and the control
/// batches cover, and the records before `position` (an answer starts at
/// the batch that holds the position).
///
/// Entries of message formats v0 and v1 are read too: plain batches to the
/// filter (no producer, no transaction), their records delivered, the
/// position moved past them alike; a compressed entry holding the position
/// delivers its inner records from the position on.
///
/// Fails on a corrupt batch or message (bad CRC, undecodable records),
/// naming the offset.
pub(crate) fn read_partition(
    position: i64,
    mut raw: Bytes,
    aborted: impl IntoIterator<Item = (i64, i64)>,
) -> Result<PartitionRead, String> {
    let had_bytes = !raw.is_empty();
    let mut filter = AbortedFilter::new(aborted);
    let mut read = PartitionRead {
        records: Vec::new(),
        next: position,
        last_epoch: None,
        cut: false,
    };
    while let Some(batch) = take_batch(&mut raw)? {
        let header = BatchHeader::read(&batch)?;
        if header.last_offset < read.next {
            continue;
        }
        let verdict = filter.judge(&header, || control_marker(&header, batch.clone()))?;
        if verdict == Verdict::Deliver {
            let start = read.records.len();
            decode_records_into(batch, &mut read.records)?;
            // Only the batch holding the position can start before it.
            let before = read.records[start..].partition_point(|record| record.offset < read.next);
            read.records.drain(start..start + before);
        }
        read.next = header.last_offset + 1;
        if header.leader_epoch >= 0 {
            read.last_epoch = Some(header.leader_epoch);
        }
    }
    read.cut = had_bytes && read.next == position;
    Ok(read)
}

#[cfg(test)]
mod tests;
