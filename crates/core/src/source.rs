//! Sources: where records come from.
//!
//! A [`SourceFactory`] describes a source and creates one [`Source`] per parallel
//! subtask. A source reads its share of the splits, reports its position at every
//! barrier, and can be rewound to any position stored in a checkpoint.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::ConnectorError;
use crate::record::{CheckpointId, Record, SplitPositions};

/// What a call to [`Source::poll`] produced.
#[derive(Debug)]
pub enum Poll {
    /// Records, in split order. May be empty when nothing is available right now.
    Records(Vec<Record>),
    /// A bounded source has emitted everything it will ever emit.
    Finished,
}

/// One parallel subtask of a source.
///
/// The runtime calls [`Source::restore`] exactly once, then alternates
/// [`Source::poll`] and [`Source::position`] (the latter at every barrier), and
/// forwards checkpoint completions.
#[async_trait]
pub trait Source: Send + 'static {
    /// Positions the source before any record is read.
    ///
    /// `positions` holds the positions of **all** splits of the pipeline from the
    /// restored checkpoint (`None` on a first start). The source must continue
    /// every split it owns from the recorded offset, and start splits that have no
    /// entry from its configured start position. Called once, before `poll`.
    async fn restore(&mut self, positions: Option<&SplitPositions>) -> Result<(), ConnectorError>;

    /// Returns up to `max_records` records, or `Poll::Finished` for a bounded
    /// source that is done. May wait a short while for data but should return
    /// within about 100 ms so barriers are not delayed; an empty batch is fine.
    async fn poll(&mut self, max_records: usize) -> Result<Poll, ConnectorError>;

    /// The position after the last record returned by `poll`, for every split this
    /// subtask owns, as of barrier `checkpoint`. Called when that barrier is
    /// injected; must not block. A source that publishes progress on completion
    /// can remember the positions by id.
    fn position(&mut self, checkpoint: CheckpointId) -> SplitPositions;

    /// Checkpoint `checkpoint` is durable. A source may publish progress (e.g.
    /// commit consumer-group offsets for lag tools) but must never read it back as
    /// truth. Notifications can be lost or repeated; the default does nothing.
    async fn checkpoint_complete(&mut self, _checkpoint: CheckpointId) -> Result<(), ConnectorError> {
        Ok(())
    }
}

/// Describes a source and creates its subtasks.
pub trait SourceFactory: Send + Sync + 'static {
    /// A stable description of this source's identity and the settings that affect
    /// its state (e.g. `kafka:topic=orders`). Part of the pipeline fingerprint.
    fn identity(&self) -> String;

    /// Creates subtask `subtask` of `parallelism`.
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Source>, ConnectorError>;
}

/// A deterministic, replayable, in-memory source for tests and demos.
///
/// It has `splits` splits named `seq-<n>`; split `n` holds `records_per_split`
/// records whose value is `seq-<n>:<offset>` (so every record is unique and a
/// checker can compute the expected output). Split `n` belongs to subtask
/// `n % parallelism`. `delay_per_poll` slows it down so a test can crash it mid-stream.
#[derive(Clone, Debug)]
pub struct SequenceSourceFactory {
    /// Number of splits.
    pub splits: usize,
    /// Records in each split.
    pub records_per_split: i64,
    /// Records returned per poll at most (also bounded by the runtime's batch size).
    pub batch: usize,
    /// Sleep before each poll.
    pub delay_per_poll: Duration,
}

impl SequenceSourceFactory {
    /// The value of record `offset` of split `split`.
    pub fn value_of(split: usize, offset: i64) -> String {
        format!("seq-{split}:{offset}")
    }

    /// Every value the source emits, in no particular order.
    pub fn expected_values(&self) -> Vec<String> {
        (0..self.splits)
            .flat_map(|s| (0..self.records_per_split).map(move |o| Self::value_of(s, o)))
            .collect()
    }
}

impl SourceFactory for SequenceSourceFactory {
    fn identity(&self) -> String {
        format!(
            "sequence:splits={},records_per_split={}",
            self.splits, self.records_per_split
        )
    }

    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Source>, ConnectorError> {
        let owned = (0..self.splits)
            .filter(|s| s % parallelism == subtask)
            .collect::<Vec<_>>();
        Ok(Box::new(SequenceSource {
            config: self.clone(),
            next: owned.iter().map(|s| (*s, 0)).collect(),
            cursor: 0,
        }))
    }
}

/// Subtask of [`SequenceSourceFactory`].
struct SequenceSource {
    config: SequenceSourceFactory,
    /// (split, next offset) for every owned split.
    next: Vec<(usize, i64)>,
    /// Round-robin cursor over owned splits.
    cursor: usize,
}

fn split_name(split: usize) -> String {
    format!("seq-{split}")
}

#[async_trait]
impl Source for SequenceSource {
    async fn restore(&mut self, positions: Option<&SplitPositions>) -> Result<(), ConnectorError> {
        if let Some(positions) = positions {
            for (split, next) in &mut self.next {
                if let Some(p) = positions.get(&split_name(*split)) {
                    *next = p;
                }
            }
        }
        Ok(())
    }

    async fn poll(&mut self, max_records: usize) -> Result<Poll, ConnectorError> {
        if !self.config.delay_per_poll.is_zero() {
            tokio::time::sleep(self.config.delay_per_poll).await;
        }
        let total = self.config.records_per_split;
        let Some(idx) = (0..self.next.len())
            .map(|i| (self.cursor + i) % self.next.len())
            .find(|i| self.next[*i].1 < total)
        else {
            return Ok(Poll::Finished);
        };
        self.cursor = idx + 1;
        let (split, next) = &mut self.next[idx];
        let n = max_records.min(self.config.batch).max(1) as i64;
        let end = (*next + n).min(total);
        let records = (*next..end)
            .map(|o| Record::new(split_name(*split), o, SequenceSourceFactory::value_of(*split, o)))
            .collect();
        *next = end;
        Ok(Poll::Records(records))
    }

    fn position(&mut self, _checkpoint: CheckpointId) -> SplitPositions {
        let mut p = SplitPositions::default();
        for (split, next) in &self.next {
            p.set(split_name(*split), *next);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn drain(source: &mut dyn Source) -> Vec<Record> {
        let mut out = Vec::new();
        while let Poll::Records(r) = source.poll(7).await.unwrap() {
            out.extend(r);
        }
        out
    }

    #[tokio::test]
    async fn sequence_source_replays_from_a_position() {
        let f = SequenceSourceFactory {
            splits: 3,
            records_per_split: 20,
            batch: 5,
            delay_per_poll: Duration::ZERO,
        };
        let mut a = f.create(0, 2).unwrap();
        a.restore(None).await.unwrap();
        let first = match a.poll(100).await.unwrap() {
            Poll::Records(r) => r,
            Poll::Finished => panic!("finished early"),
        };
        let pos = a.position(CheckpointId(1));
        let rest = drain(a.as_mut()).await;
        // subtask 0 of 2 owns splits 0 and 2
        assert_eq!(first.len() + rest.len(), 40);

        let mut b = f.create(0, 2).unwrap();
        b.restore(Some(&pos)).await.unwrap();
        let key = |r: &Record| (r.split.clone(), r.offset);
        let mut replayed = drain(b.as_mut()).await;
        let mut rest = rest;
        replayed.sort_by_key(key);
        rest.sort_by_key(key);
        assert_eq!(replayed, rest);
    }
}
