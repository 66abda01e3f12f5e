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
/// Fails on a corrupt batch (bad CRC, undecodable records) and on the
/// pre-0.11 message format, naming the offset.
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
    }
    read.cut = had_bytes && read.next == position;
    Ok(read)
}

#[cfg(test)]
mod tests;
