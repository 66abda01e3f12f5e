//! The Kafka source: [`KafkaSourceFactory`] and its subtasks.
//!
//! One file per step: [`open`] (partitions, cluster check, start offsets),
//! [`discovery`] (partitions added later), [`records`] (fetched records
//! as the pipeline's), [`group`] (offsets published to the consumer group),
//! [`cluster`] (which cluster offsets belong to), [`metrics`]. Records come
//! from an [`exactly_kafka_wire::Fetcher`] per subtask.

mod cluster;
mod discovery;
mod group;
mod metrics;
mod open;
mod records;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use exactly_core::{CheckpointId, ConnectorError, Poll, Record, Source, SourceFactory, SplitPositions};
use exactly_kafka_wire::{FetchSettings, Fetcher, OffsetSpec, WireConfig, WireError};

use crate::config::{KafkaConfigError, KafkaSourceConfig};
use cluster::cluster_marker;
use discovery::{Discovered, Discovery};
use group::{GroupCommitter, Progress};
pub(crate) use metrics::KafkaSourceMetrics;
pub use metrics::KafkaSourceMetricsSnapshot;
use records::{Draining, SplitNames};

/// How long `poll` waits for the first record.
const POLL_WAIT: Duration = Duration::from_millis(100);

/// The split name of a partition: `<topic>-<partition>`, which
/// [`Record::topic_partition`] parses back.
pub fn split_name(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

/// Reads one Kafka topic with exactly-once positions.
///
/// - Partition `p` belongs to subtask `p % parallelism`; partitions are assigned
///   explicitly (the source never joins the group, no rebalancing).
/// - Splits are named `<topic>-<partition>`; a split's position is the offset of
///   the next record to read. Checkpointed positions are the only truth.
/// - Records are read with Kafka's own protocol (`exactly-kafka-wire`'s
///   [`Fetcher`]): read_committed Fetch requests, one in flight per
///   partition leader, answers decoded in place (keys and values are slices
///   of the answer, never copied), at most `queued.max.messages.kbytes`
///   (4 MiB) read ahead per subtask.
/// - New partitions are found every `partition_discovery_interval` and read from
///   their beginning.
/// - On checkpoint completion the checkpointed offsets are committed to the
///   group (`commit_offsets_to_group`), asynchronously and best effort.
///
/// - A partition the checkpoint lists but the topic's metadata does not show
///   when the source opens keeps its checkpointed offset: it is reported in
///   every position (so later checkpoints keep it too) and read from that
///   offset once discovery finds it again — never from its beginning.
///
/// The identity is `kafka:topic=<topic>`. The cluster the offsets belong to
/// decides what they mean too, but knowing it takes a request to the
/// brokers, and an identity is computed without I/O (when the pipeline is
/// built, and for every fingerprint check). So the source records the
/// cluster id (from the brokers' metadata) in its positions instead, as
/// the entry `<topic>@cluster:<id>` (value 0; no split can be named so,
/// topic names have no `@` or `:`), and `restore` refuses positions taken
/// on another cluster with a fatal error naming both ids and the fix —
/// unless `accept_cluster_id` names the cluster the brokers answer as now.
/// Positions without the entry (written before it existed) are accepted,
/// and carry it from the next checkpoint on.
#[derive(Debug, Clone)]
pub struct KafkaSourceFactory {
    settings: Arc<Settings>,
}

#[derive(Debug)]
struct Settings {
    config: KafkaSourceConfig,
    group: String,
    /// How to reach the brokers (bootstrap, security, timeouts).
    wire: WireConfig,
    /// How to fetch.
    fetch: FetchSettings,
    metrics: Arc<KafkaSourceMetrics>,
    /// `<bootstrap>/<topic>`, for logs and errors.
    label: String,
}

impl KafkaSourceFactory {
    /// A source for the pipeline named `pipeline` (the default group is
    /// `exactly-<pipeline>`). Checks the settings.
    pub fn new(pipeline: &str, config: KafkaSourceConfig) -> Result<Self, KafkaConfigError> {
        config.validate()?;
        let (wire, fetch) = config.client_settings()?;
        let group = config.group_for(pipeline);
        let label = format!("{}/{}", config.bootstrap, config.topic);
        Ok(KafkaSourceFactory {
            settings: Arc::new(Settings {
                config,
                group,
                wire,
                fetch,
                metrics: Arc::default(),
                label,
            }),
        })
    }

    /// The settings.
    pub fn config(&self) -> &KafkaSourceConfig {
        &self.settings.config
    }

    /// The consumer group offsets are committed to.
    pub fn group_id(&self) -> &str {
        &self.settings.group
    }

    /// Counters of all subtasks created by this factory.
    pub fn metrics(&self) -> KafkaSourceMetricsSnapshot {
        self.settings.metrics.snapshot()
    }
}

impl SourceFactory for KafkaSourceFactory {
    fn identity(&self) -> String {
        format!("kafka:topic={}", self.settings.config.topic)
    }

    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Source>, ConnectorError> {
        if subtask >= parallelism {
            return Err(ConnectorError::fatal(
                self.settings.context(),
                format!("subtask {subtask} does not exist with parallelism {parallelism}"),
            ));
        }
        Ok(Box::new(KafkaSource {
            settings: self.settings.clone(),
            subtask,
            parallelism,
            reading: None,
            cluster: None,
            next: BTreeMap::new(),
            waiting: BTreeMap::new(),
            known: BTreeSet::new(),
            progress: Progress::default(),
            end: None,
            names: SplitNames::default(),
        }))
    }
}

impl Settings {
    fn context(&self) -> String {
        format!("kafka source {}", self.label)
    }

    fn topic(&self) -> &str {
        &self.config.topic
    }

    fn split(&self, partition: i32) -> String {
        split_name(self.topic(), partition)
    }

    /// A fetcher error as the pipeline's: what the fetcher stops on is
    /// fatal (it retried everything else itself).
    fn fatal(&self, error: WireError) -> ConnectorError {
        ConnectorError::fatal(self.context(), error.to_string())
    }
}

/// One subtask. See [`KafkaSourceFactory`].
struct KafkaSource {
    settings: Arc<Settings>,
    subtask: usize,
    parallelism: usize,
    /// Set by `restore`.
    reading: Option<Reading>,
    /// The id of the cluster the brokers belong to, when they report one.
    cluster: Option<String>,
    /// Next offset to read of every owned partition.
    next: BTreeMap<i32, i64>,
    /// Owned partitions the restored checkpoint lists that the metadata did
    /// not show yet, with their checkpointed offsets: reported in every
    /// position, and where each one resumes once discovery finds it.
    waiting: BTreeMap<i32, i64>,
    /// Every partition of the topic seen so far, owned or not.
    known: BTreeSet<i32>,
    progress: Progress,
    /// With `stop_at_end`: the last stable offset of every owned partition at start.
    end: Option<BTreeMap<i32, i64>>,
    names: SplitNames,
}

/// What a restored subtask reads with.
struct Reading {
    fetcher: Fetcher,
    /// The chunk being handed out.
    draining: Option<Draining>,
    /// The error the fetcher stopped with while a poll had records to hand
    /// out already: reported by the next poll.
    stopped: Option<WireError>,
    discovery: Discovery,
    committer: GroupCommitter,
}

impl KafkaSource {
    /// With `stop_at_end`: every owned partition is read up to its end.
    /// Transaction markers are never delivered, but positions move past
    /// them, so a topic that ends with one is read to its end too.
    fn reached_end(&self) -> bool {
        let Some(end) = &self.end else { return false };
        end.iter().all(|(p, end)| self.next.get(p).is_some_and(|n| n >= end))
    }

    fn reading(&mut self) -> Result<&mut Reading, ConnectorError> {
        self.reading
            .as_mut()
            .ok_or_else(|| ConnectorError::fatal(self.settings.context(), "poll called before restore"))
    }

    /// Takes the partitions a discovery round found.
    fn add_partitions(&mut self, found: Discovered) {
        let added: Vec<(i32, i64)> = found
            .added
            .into_iter()
            .filter(|(p, _)| !self.next.contains_key(p))
            .collect();
        self.known.extend(found.all);
        let Some(reading) = self.reading.as_ref() else { return };
        for &(p, offset) in &added {
            if self.waiting.remove(&p).is_some() {
                tracing::info!(
                    source = %self.settings.label,
                    partition = p,
                    offset,
                    "partition of the checkpoint is back in the metadata: resuming at its checkpointed offset"
                );
            } else {
                tracing::info!(source = %self.settings.label, partition = p, offset, "new partition picked up");
            }
            reading.fetcher.add(p, offset);
            self.next.insert(p, offset);
        }
        self.settings.metrics.add_discovered(added.len() as u64);
    }

    /// Hands out up to `max` records of the chunks fetched, waiting up to
    /// [`POLL_WAIT`] for a first chunk when none is there.
    async fn take(&mut self, max: usize) -> Result<Vec<Record>, ConnectorError> {
        let settings = self.settings.clone();
        let topic = settings.topic();
        let reading = self.reading.as_mut().expect("checked by the caller");
        if let Some(error) = reading.stopped.take() {
            return Err(settings.fatal(error));
        }
        let mut records = Vec::new();
        let mut waited = false;
        while records.len() < max {
            let Some(draining) = reading.draining.as_mut() else {
                let chunk = match reading.fetcher.try_next() {
                    Ok(None) if records.is_empty() && !waited => {
                        waited = true;
                        reading.fetcher.next(POLL_WAIT).await
                    }
                    other => other,
                };
                let chunk = match chunk {
                    Ok(chunk) => chunk,
                    Err(error) if records.is_empty() => return Err(settings.fatal(error)),
                    Err(error) => {
                        // The records taken are handed out (their offsets
                        // are past `next` already); the error comes next.
                        reading.stopped = Some(error);
                        None
                    }
                };
                let Some(chunk) = chunk else { break };
                let split = self.names.of(topic, chunk.partition);
                reading.draining = Some(Draining::new(chunk, split));
                continue;
            };
            let next = self.next.entry(draining.partition).or_default();
            if records.is_empty() {
                records.reserve_exact(max);
            }
            while records.len() < max {
                let Some(record) = draining.next_record() else { break };
                if record.offset < *next {
                    tracing::warn!(
                        source = %settings.label,
                        partition = draining.partition,
                        offset = record.offset,
                        next = *next,
                        "dropping a record delivered again"
                    );
                    continue;
                }
                *next = record.offset + 1;
                records.push(record);
            }
            if records.len() < max {
                // Drained: the partition is read up to where its chunk
                // ends, past markers and aborted records too.
                *next = (*next).max(draining.next_offset);
                reading.draining = None;
            }
        }
        Ok(records)
    }
}

fn owns(partition: i32, subtask: usize, parallelism: usize) -> bool {
    partition as usize % parallelism == subtask
}

#[async_trait]
impl Source for KafkaSource {
    async fn restore(&mut self, positions: Option<&SplitPositions>) -> Result<(), ConnectorError> {
        if self.reading.is_some() {
            return Err(ConnectorError::fatal(self.settings.context(), "restore called twice"));
        }
        let settings = self.settings.clone();
        let mut opened = open::open(&settings, self.subtask, self.parallelism, positions).await?;
        tracing::info!(
            source = %settings.label,
            subtask = self.subtask,
            cluster = opened.cluster.as_deref().unwrap_or("unknown"),
            positions = ?opened.next,
            "Kafka source assigned"
        );
        if !opened.waiting.is_empty() {
            tracing::warn!(
                source = %settings.label,
                subtask = self.subtask,
                partitions = ?opened.waiting,
                "partitions of the checkpoint are missing from the topic's metadata: keeping their checkpointed \
                 offsets until they are back"
            );
        }
        if settings.config.stop_at_end {
            let owned: Vec<i32> = opened.next.keys().copied().collect();
            // The last stable offsets: a transaction still open at start is
            // not waited for.
            let end = open::ends(&mut opened.client, settings.topic(), &owned, OffsetSpec::LastStable)
                .await
                .map_err(|e| ConnectorError::transient(settings.context(), format!("reading the end offsets: {e}")))?;
            tracing::info!(source = %settings.label, subtask = self.subtask, ?end, "bounded run: reading up to these offsets");
            self.end = Some(end);
        }
        let fetcher = Fetcher::start(
            settings.wire.clone(),
            settings.topic(),
            opened.next.clone(),
            settings.fetch.clone(),
            settings.metrics.fetch.clone(),
        );
        self.reading = Some(Reading {
            fetcher,
            draining: None,
            stopped: None,
            discovery: Discovery::new(opened.client, &settings),
            committer: GroupCommitter::start(settings.clone()),
        });
        self.cluster = opened.cluster;
        self.next = opened.next;
        self.waiting = opened.waiting;
        self.known = opened.partitions;
        Ok(())
    }

    async fn poll(&mut self, max_records: usize) -> Result<Poll, ConnectorError> {
        self.reading()?;
        if self.reached_end() {
            return Ok(Poll::Finished);
        }
        let settings = self.settings.clone();
        let owner = (self.subtask, self.parallelism);
        let reading = self.reading.as_mut().expect("checked above");
        let found = reading
            .discovery
            .poll(&settings, owner, &self.known, &self.waiting)
            .await
            .map_err(|e| settings.fatal(e))?;
        if let Some(found) = found {
            self.add_partitions(found);
        }
        Ok(Poll::Records(self.take(max_records.max(1)).await?))
    }

    fn position(&mut self, checkpoint: CheckpointId) -> SplitPositions {
        let mut positions = SplitPositions::default();
        for (partition, next) in self.waiting.iter().chain(&self.next) {
            positions.set(self.settings.split(*partition), *next);
        }
        if let Some(cluster) = &self.cluster {
            positions.set(cluster_marker(self.settings.topic(), cluster), 0);
        }
        self.progress.record(checkpoint, positions.clone());
        positions
    }

    async fn checkpoint_complete(&mut self, checkpoint: CheckpointId) -> Result<(), ConnectorError> {
        if !self.settings.config.commit_offsets_to_group {
            return Ok(());
        }
        let Some(positions) = self.progress.completed(checkpoint) else {
            return Ok(());
        };
        let offsets: BTreeMap<i32, i64> = self
            .next
            .keys()
            .filter_map(|p| Some((*p, positions.get(&self.settings.split(*p))?)))
            .collect();
        if let (false, Some(reading)) = (offsets.is_empty(), &self.reading) {
            reading.committer.request(checkpoint, offsets);
        }
        Ok(())
    }
}
