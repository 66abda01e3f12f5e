//! One topic of a subtask: its fetcher, where each owned partition
//! stands, and handing its fetched records out as the pipeline's.

use std::collections::{BTreeMap, BTreeSet};

use exactly_core::{ConnectorError, Record, SplitPositions};
use exactly_kafka_wire::{FetchPosition, FetchedChunk, Fetcher, TopicId, WireError};

use super::discovery::Found;
use super::open::Opened;
use super::positions::{record_cluster, record_from, record_position, record_topic_id, Position};
use super::records::{Draining, SplitNames};
use super::Settings;

/// One topic as a subtask reads it.
pub(super) struct TopicReader {
    pub(super) topic: String,
    fetcher: Fetcher,
    /// The chunk being handed out.
    draining: Option<Draining>,
    /// The error the fetcher stopped with while a poll had records to hand
    /// out already: reported by the next poll.
    stopped: Option<WireError>,
    /// The id of the cluster the brokers belong to, when they report one.
    cluster: Option<String>,
    /// The id of the topic read, when the brokers name one.
    topic_id: Option<TopicId>,
    /// Next offset to read of every owned partition, with the leader epoch
    /// of the record before it.
    pub(super) next: BTreeMap<i32, Position>,
    /// Owned partitions the restored checkpoint lists that the metadata did
    /// not show yet, with their checkpointed positions: reported in every
    /// position, and where each one resumes once discovery finds it.
    pub(super) waiting: BTreeMap<i32, Position>,
    /// Owned partitions that pass over records older than a `start` time
    /// until they read one at or after it (Unix ms).
    from_ms: BTreeMap<i32, i64>,
    /// Every partition of the topic seen so far, owned or not.
    pub(super) known: BTreeSet<i32>,
    /// With `stop_at_end`: the last stable offset of every owned partition
    /// at start.
    end: Option<BTreeMap<i32, i64>>,
    names: SplitNames,
}

impl TopicReader {
    /// Starts fetching an opened topic; `end` bounds a `stop_at_end` run.
    pub(super) fn start(settings: &Settings, opened: Opened, end: Option<BTreeMap<i32, i64>>) -> TopicReader {
        let mut fetch = settings.fetch.clone();
        if settings.subscription.named().is_none() {
            // A topic read because it matches a regex may be deleted: the
            // discovery notices and stops reading it, no error.
            fetch.missing_topic_timeout = std::time::Duration::from_secs(365 * 24 * 3600);
        }
        let fetcher = Fetcher::start_at(
            settings.wire.clone(),
            &opened.topic,
            opened
                .next
                .iter()
                .map(|(p, position)| (*p, fetch_position(*position)))
                .collect(),
            opened.topic_id,
            fetch,
            settings.metrics.fetch.clone(),
        );
        TopicReader {
            topic: opened.topic,
            fetcher,
            draining: None,
            stopped: None,
            cluster: opened.cluster,
            topic_id: opened.topic_id,
            next: opened.next,
            waiting: opened.waiting,
            from_ms: opened.from_ms,
            known: opened.partitions,
            end,
            names: SplitNames::default(),
        }
    }

    /// With `stop_at_end`: every owned partition is read up to its end.
    /// Transaction markers are never delivered, but positions move past
    /// them, so a topic that ends with one is read to its end too.
    pub(super) fn reached_end(&self) -> bool {
        let Some(end) = &self.end else { return false };
        end.iter()
            .all(|(p, end)| self.next.get(p).is_some_and(|n| n.next >= *end))
    }

    /// Takes the partitions a discovery round found.
    pub(super) fn add_partitions(&mut self, settings: &Settings, found: Found) {
        let added: Vec<(i32, Position)> = found
            .added
            .into_iter()
            .filter(|(p, _)| !self.next.contains_key(p))
            .collect();
        self.known.extend(found.all);
        for &(p, position) in &added {
            let offset = position.next;
            if self.waiting.remove(&p).is_some() {
                tracing::info!(
                    source = %settings.label,
                    topic = %self.topic,
                    partition = p,
                    offset,
                    "partition of the checkpoint is back in the metadata: resuming at its checkpointed offset"
                );
            } else {
                tracing::info!(source = %settings.label, topic = %self.topic, partition = p, offset, "new partition picked up");
            }
            self.fetcher.add_at(p, fetch_position(position));
            self.next.insert(p, position);
        }
        settings.metrics.add_discovered(added.len() as u64);
    }

    /// Whether records (or an error) are queued to hand out at once.
    pub(super) fn ready(&mut self) -> bool {
        self.draining.is_some() || self.stopped.is_some()
    }

    /// Waits up to `wait` for the fetcher's next chunk and keeps it to hand
    /// out; whether one (or an error) came.
    pub(super) async fn wait(&mut self, wait: std::time::Duration) -> bool {
        if self.ready() {
            return true;
        }
        match self.fetcher.next(wait).await {
            Ok(None) => false,
            Ok(Some(chunk)) => {
                let split = split_of(&mut self.names, &self.topic, &chunk);
                self.keep(split, chunk);
                true
            }
            Err(error) => {
                self.stopped = Some(error);
                true
            }
        }
    }

    /// Hands out onto `records` up to `max` of them, from the chunks
    /// fetched, without waiting.
    pub(super) fn take(
        &mut self,
        settings: &Settings,
        max: usize,
        records: &mut Vec<Record>,
    ) -> Result<(), ConnectorError> {
        while records.len() < max {
            let Some(draining) = self.draining.as_mut() else {
                if let Some(error) = self.stopped.take() {
                    if records.is_empty() {
                        return Err(settings.fatal(&self.topic, error));
                    }
                    // The records taken are handed out (their offsets are
                    // past `next` already); the error comes next.
                    self.stopped = Some(error);
                    return Ok(());
                }
                match self.fetcher.try_next() {
                    Ok(None) => return Ok(()),
                    Ok(Some(chunk)) => {
                        let split = split_of(&mut self.names, &self.topic, &chunk);
                        self.keep(split, chunk);
                    }
                    Err(error) => self.stopped = Some(error),
                }
                continue;
            };
            let partition = draining.partition;
            let next = self.next.entry(partition).or_insert(Position::at(0));
            if records.is_empty() {
                records.reserve_exact(max);
            }
            while records.len() < max {
                let Some((record, epoch)) = draining.next_record() else {
                    break;
                };
                if record.offset < next.next {
                    tracing::warn!(
                        source = %settings.label,
                        topic = %self.topic,
                        partition,
                        offset = record.offset,
                        next = next.next,
                        "dropping a record delivered again"
                    );
                    continue;
                }
                next.next = record.offset + 1;
                next.epoch = epoch.or(next.epoch);
                if let Some(&from) = self.from_ms.get(&partition) {
                    if record.timestamp_ms.is_some_and(|ts| ts < from) {
                        // Before the `start` time: not part of the run.
                        continue;
                    }
                    self.from_ms.remove(&partition);
                }
                records.push(record);
            }
            if records.len() < max {
                // Drained: the partition is read up to where its chunk
                // ends, past markers and aborted records too.
                if draining.next_offset > next.next {
                    next.next = draining.next_offset;
                    next.epoch = draining.next_epoch.or(next.epoch);
                }
                self.draining = None;
            }
        }
        Ok(())
    }

    /// Keeps `chunk` to hand out, or applies the truncation it tells of.
    fn keep(&mut self, split: Option<exactly_core::SplitName>, chunk: FetchedChunk) {
        if let Some(truncation) = chunk.truncation {
            // The log was truncated below what was read, and the fetcher
            // goes on at the divergence: the records from there on are new
            // ones at offsets handed out before.
            tracing::warn!(
                topic = %self.topic,
                partition = chunk.partition,
                position = truncation.position,
                divergence = truncation.divergence,
                no_longer_exist = truncation.position - truncation.divergence,
                "the partition's log was truncated below the position read; reading on at the divergence as \
                 `on_log_truncation = \"resume\"` says"
            );
            self.next.insert(
                chunk.partition,
                Position {
                    next: truncation.divergence,
                    epoch: Some(truncation.divergence_epoch),
                },
            );
            return;
        }
        let split = split.expect("a chunk of records has a split");
        self.draining = Some(Draining::new(chunk, split));
    }

    /// Writes what the topic's positions are into `positions`.
    pub(super) fn position(&self, positions: &mut SplitPositions) {
        for (partition, position) in self.waiting.iter().chain(&self.next) {
            record_position(positions, &self.topic, *partition, *position);
        }
        for (partition, from) in &self.from_ms {
            record_from(positions, &self.topic, *partition, *from);
        }
        if let Some(cluster) = &self.cluster {
            record_cluster(positions, &self.topic, cluster);
        }
        if let Some(id) = self.topic_id {
            record_topic_id(positions, &self.topic, id);
        }
    }

    /// The offsets of the owned partitions in `positions` (a completed
    /// checkpoint's), to commit to the consumer group.
    pub(super) fn offsets_in(&self, positions: &SplitPositions) -> BTreeMap<i32, i64> {
        self.next
            .keys()
            .filter_map(|p| Some((*p, positions.get(&super::split_name(&self.topic, *p))?)))
            .collect()
    }
}

/// The split of a chunk of records (`None` for a chunk without any, which
/// only tells of a truncation).
fn split_of(names: &mut SplitNames, topic: &str, chunk: &FetchedChunk) -> Option<exactly_core::SplitName> {
    chunk.truncation.is_none().then(|| names.of(topic, chunk.partition))
}

/// A source position as the fetcher's.
fn fetch_position(position: Position) -> FetchPosition {
    FetchPosition {
        offset: position.next,
        epoch: position.epoch,
    }
}
