//! The Kafka source: [`KafkaSourceFactory`] and its subtasks.
//!
//! One file per step: [`open`] (a topic's partitions, cluster and topic
//! checks, start offsets), [`topic`] (one topic as a subtask reads it),
//! [`discovery`] (partitions and topics added later), [`records`] (fetched
//! records as the pipeline's), [`group`] (offsets published to the consumer
//! group), [`positions`] (what a checkpoint holds: offsets, leader epochs,
//! the cluster and the topic's id), [`cluster`] (the checks of the last
//! two), [`metrics`]. Records come from an [`exactly_kafka_wire::Fetcher`]
//! per topic and subtask.

mod cluster;
mod discovery;
mod group;
mod metrics;
mod open;
mod positions;
mod records;
#[cfg(test)]
mod tests;
mod topic;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use exactly_core::{CheckpointId, ConnectorError, Poll, Record, Source, SourceFactory, SplitPositions};
use exactly_kafka_wire::{FetchSettings, OffsetSpec, WireConfig, WireError};

use crate::config::{KafkaConfigError, KafkaSourceConfig, Subscription};
use discovery::{Discovered, Discovery, Reading};
use group::{GroupCommitter, Progress, TopicOffsets};
pub(crate) use metrics::KafkaSourceMetrics;
pub use metrics::KafkaSourceMetricsSnapshot;
use topic::TopicReader;

/// How long `poll` waits for the first record.
const POLL_WAIT: Duration = Duration::from_millis(100);

/// The split name of a partition: `<topic>-<partition>`, which
/// [`Record::topic_partition`] parses back.
pub fn split_name(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

/// Reads Kafka topics with exactly-once positions: one (`topic`), several
/// (`topics`) or every topic matching a regex (`topic_regex`, topics
/// created later included).
///
/// - With one topic, partition `p` belongs to subtask `p % parallelism`;
///   with several, each topic's partitions go round the subtasks from a
///   place of the topic's own (see [`Subscription::owner`]). Partitions are
///   assigned explicitly (the source never joins the group, no
///   rebalancing).
/// - Splits are named `<topic>-<partition>`; a split's position is the offset of
///   the next record to read. Checkpointed positions are the only truth.
/// - Records are read with Kafka's own protocol (`exactly-kafka-wire`'s
///   [`Fetcher`](exactly_kafka_wire::Fetcher)): read_committed Fetch requests, one in flight per
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
/// ## Leaders, truncation, recreated topics
///
/// Every position records the leader epoch of the last record it passed.
/// The fetcher checks it with the partition's leader on restore and after
/// every change of leader (KIP-320): a log that an unclean leader election
/// truncated below the position stops the pipeline with an error naming
/// the partition, the position and where the log diverges
/// (`on_log_truncation = "resume"` reads on there instead, counted). It
/// fetches with the current leader epoch, so after an election or a
/// rolling restart it follows the new leader at once instead of reading on
/// from a follower. The checkpoint also records the topic's id: a topic
/// deleted and created again under the same name is refused at restore
/// (`accept_topic_id` reads the new one from its beginning), and stops a
/// running pipeline; a topic missing from the metadata stops it after
/// `missing_topic_timeout`.
///
/// The identity is `kafka:topic=<topic>` (`kafka:topics=…`,
/// `kafka:topic_regex=…`). The cluster the offsets belong to
/// decides what they mean too, but knowing it takes a request to the
/// brokers, and an identity is computed without I/O (when the pipeline is
/// built, and for every fingerprint check). So the source records the
/// cluster id (from the brokers' metadata) in its positions instead (see
/// `source::positions`), and `restore` refuses positions taken on another
/// cluster with a fatal error naming both ids and the fix — unless
/// `accept_cluster_id` names the cluster the brokers answer as now.
/// Positions without the entry (written before it existed) are accepted,
/// and carry it from the next checkpoint on.
#[derive(Debug, Clone)]
pub struct KafkaSourceFactory {
    settings: Arc<Settings>,
}

#[derive(Debug)]
struct Settings {
    config: KafkaSourceConfig,
    /// What it reads.
    subscription: Subscription,
    group: String,
    /// How to reach the brokers (bootstrap, security, timeouts).
    wire: WireConfig,
    /// How to fetch.
    fetch: FetchSettings,
    metrics: Arc<KafkaSourceMetrics>,
    /// `<bootstrap>/<topics>`, for logs and errors.
    label: String,
}

impl KafkaSourceFactory {
    /// A source for the pipeline named `pipeline` (the default group is
    /// `exactly-<pipeline>`). Checks the settings.
    pub fn new(pipeline: &str, config: KafkaSourceConfig) -> Result<Self, KafkaConfigError> {
        config.validate()?;
        let (wire, fetch) = config.client_settings()?;
        let group = config.group_for(pipeline);
        let subscription = config.subscription();
        let label = format!("{}/{}", config.bootstrap, subscription.label());
        Ok(KafkaSourceFactory {
            settings: Arc::new(Settings {
                config,
                subscription,
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

    /// What it reads.
    pub fn subscription(&self) -> &Subscription {
        &self.settings.subscription
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
        self.settings.subscription.identity()
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
            running: None,
            progress: Progress::default(),
        }))
    }
}

impl Settings {
    fn context(&self) -> String {
        format!("kafka source {}", self.label)
    }

    /// A fetcher error of `topic` as the pipeline's: what the fetcher stops
    /// on is fatal (it retried everything else itself), with what the
    /// operator can do where the source has a setting for it.
    fn fatal(&self, topic: &str, error: WireError) -> ConnectorError {
        let fix = match &error {
            WireError::LogTruncated {
                divergence: Some(_), ..
            } => format!(
                ". The pipeline stopped rather than skip or repeat records. Find out what the cluster lost (an \
                 unclean leader election, a replaced disk); then either set `on_log_truncation = \"resume\"` in \
                 [source.kafka] to read on at the divergence (the records that no longer exist are counted in \
                 exactly_kafka_source_truncated_offsets_total, and position-fenced sinks drop the new records at \
                 offsets they stored already), or start the pipeline under a new `name` or `checkpoint.dir` to \
                 read `{topic}` anew"
            ),
            WireError::LogTruncated { divergence: None, .. } => format!(
                ". The leader cannot say where its log diverges, so nothing can be resumed safely; start the \
                 pipeline under a new `name` or `checkpoint.dir` to read `{topic}` anew"
            ),
            WireError::TopicRecreated { now, .. } => format!(
                ". The offsets read mean nothing in the new topic; restart the pipeline with `accept_topic_id = \
                 \"{now}\"` in [source.kafka] to read the new topic from its beginning"
            ),
            WireError::TopicMissing { .. } => format!(
                ". Recreate the topic, or fix `topic`; `missing_topic_timeout` ({}) sets how long a missing topic \
                 is waited for",
                humantime::format_duration(self.config.missing_topic_timeout)
            ),
            _ => String::new(),
        };
        ConnectorError::fatal(self.context(), format!("{error}{fix}")).caused_by(error)
    }
}

/// One subtask. See [`KafkaSourceFactory`].
struct KafkaSource {
    settings: Arc<Settings>,
    subtask: usize,
    parallelism: usize,
    /// Set by `restore`.
    running: Option<Running>,
    progress: Progress,
}

/// What a restored subtask reads with.
struct Running {
    /// The topics read, by name.
    topics: BTreeMap<String, TopicReader>,
    /// Which topic's records are taken first in the next poll (turns, so
    /// no topic starves another).
    turn: usize,
    /// The checkpoint's entries of topics not read now (a `topic_regex`
    /// topic deleted since): reported in every position, so a topic that
    /// comes back resumes them.
    kept: SplitPositions,
    discovery: Discovery,
    committer: GroupCommitter,
}

impl Running {
    /// What a discovery round needs to know.
    fn reading(&self) -> Reading {
        Reading {
            known: self.topics.iter().map(|(t, r)| (t.clone(), r.known.clone())).collect(),
            waiting: self
                .topics
                .iter()
                .map(|(t, r)| (t.clone(), r.waiting.clone()))
                .collect(),
        }
    }

    /// Takes what a discovery round found.
    fn discovered(&mut self, settings: &Settings, found: Discovered) {
        for topic in found.gone {
            if let Some(reader) = self.topics.remove(&topic) {
                tracing::warn!(source = %settings.label, %topic, "the topic is gone from the cluster: no longer read; its positions are kept");
                reader.position(&mut self.kept);
            }
        }
        for (topic, partitions) in found.partitions {
            if let Some(reader) = self.topics.get_mut(&topic) {
                reader.add_partitions(settings, partitions);
            }
        }
        for opened in found.opened {
            let topic = opened.topic.clone();
            self.kept.0.retain(|key, _| !entry_of(key, &topic));
            self.topics.insert(topic, TopicReader::start(settings, opened, None));
        }
    }

    /// Hands out up to `max` records from the topics' fetched chunks,
    /// waiting up to [`POLL_WAIT`] for one when none is there.
    async fn take(&mut self, settings: &Settings, max: usize) -> Result<Vec<Record>, ConnectorError> {
        let mut records = Vec::new();
        self.take_round(settings, max, &mut records)?;
        if records.is_empty() && !self.topics.is_empty() {
            let waits = self.topics.values_mut().map(|reader| Box::pin(reader.wait(POLL_WAIT)));
            let (came, _, _) = futures_util::future::select_all(waits).await;
            if came {
                self.take_round(settings, max, &mut records)?;
            }
        } else if self.topics.is_empty() {
            tokio::time::sleep(POLL_WAIT).await;
        }
        Ok(records)
    }

    /// One turn round the topics, each giving what it has without waiting.
    fn take_round(&mut self, settings: &Settings, max: usize, records: &mut Vec<Record>) -> Result<(), ConnectorError> {
        let count = self.topics.len();
        self.turn = self.turn.wrapping_add(1);
        let first = self.turn % count.max(1);
        let mut readers: Vec<&mut TopicReader> = self.topics.values_mut().collect();
        readers.rotate_left(first);
        for reader in readers {
            if records.len() >= max {
                break;
            }
            reader.take(settings, max, records)?;
        }
        Ok(())
    }
}

/// Whether position entry `key` belongs to `topic` (its partitions' entries
/// and facts, and the topic's own facts).
fn entry_of(key: &str, topic: &str) -> bool {
    key.strip_prefix(topic).is_some_and(|rest| {
        rest.starts_with('@')
            || rest.strip_prefix('-').is_some_and(|p| {
                p.split('@')
                    .next()
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
    })
}

/// The topics `positions` hold entries of that match `subscription`.
fn checkpointed_topics(positions: &SplitPositions, subscription: &Subscription) -> std::collections::BTreeSet<String> {
    positions
        .0
        .keys()
        .filter_map(|key| {
            let split = key.split('@').next()?;
            let (topic, partition) = split.rsplit_once('-')?;
            partition.parse::<i32>().ok()?;
            subscription.matches(topic).then(|| topic.to_string())
        })
        .collect()
}

#[async_trait]
impl Source for KafkaSource {
    async fn restore(&mut self, positions: Option<&SplitPositions>) -> Result<(), ConnectorError> {
        if self.running.is_some() {
            return Err(ConnectorError::fatal(self.settings.context(), "restore called twice"));
        }
        let settings = self.settings.clone();
        let owner = (self.subtask, self.parallelism);
        let mut client = open::start_client(&settings);
        let subscribed = open::subscribed_topics(&settings, &mut client).await?;
        let mut topics = BTreeMap::new();
        for topic in &subscribed {
            let opened = open::open(&settings, &mut client, topic, owner, positions).await?;
            tracing::info!(
                source = %settings.label,
                subtask = self.subtask,
                %topic,
                cluster = opened.cluster.as_deref().unwrap_or("unknown"),
                topic_id = %opened.topic_id.map_or_else(|| "unknown".to_string(), |id| id.to_string()),
                positions = ?opened.next,
                "Kafka source assigned"
            );
            if !opened.waiting.is_empty() {
                tracing::warn!(
                    source = %settings.label,
                    subtask = self.subtask,
                    %topic,
                    partitions = ?opened.waiting,
                    "partitions of the checkpoint are missing from the topic's metadata: keeping their \
                     checkpointed offsets until they are back"
                );
            }
            let end = if settings.config.stop_at_end {
                let owned: Vec<i32> = opened.next.keys().copied().collect();
                // The last stable offsets: a transaction still open at
                // start is not waited for.
                let end = open::ends(&mut client, topic, &owned, OffsetSpec::LastStable)
                    .await
                    .map_err(|e| {
                        ConnectorError::transient(settings.context(), format!("reading the end offsets of `{topic}`"))
                            .caused_by(e)
                    })?;
                tracing::info!(source = %settings.label, subtask = self.subtask, %topic, ?end, "bounded run: reading up to these offsets");
                Some(end)
            } else {
                None
            };
            topics.insert(topic.clone(), TopicReader::start(&settings, opened, end));
        }
        // The checkpoint's topics not read now keep their entries.
        let mut kept = SplitPositions::default();
        if let Some(positions) = positions {
            for topic in checkpointed_topics(positions, &settings.subscription) {
                if !topics.contains_key(&topic) {
                    tracing::warn!(source = %settings.label, %topic, "a topic of the checkpoint is not in the cluster: keeping its positions until it is back");
                    for (key, value) in positions.0.iter().filter(|(k, _)| entry_of(k, &topic)) {
                        kept.set(key.clone(), *value);
                    }
                }
            }
        }
        self.running = Some(Running {
            topics,
            turn: 0,
            kept,
            discovery: Discovery::new(client, &settings),
            committer: GroupCommitter::start(settings.clone()),
        });
        Ok(())
    }

    async fn poll(&mut self, max_records: usize) -> Result<Poll, ConnectorError> {
        let settings = self.settings.clone();
        let owner = (self.subtask, self.parallelism);
        let running = self
            .running
            .as_mut()
            .ok_or_else(|| ConnectorError::fatal(settings.context(), "poll called before restore"))?;
        if settings.config.stop_at_end && running.topics.values().all(TopicReader::reached_end) {
            return Ok(Poll::Finished);
        }
        let reading = running.reading();
        let found = running
            .discovery
            .poll(&settings, owner, &reading, &running.kept)
            .await?;
        if let Some(found) = found {
            running.discovered(&settings, found);
        }
        Ok(Poll::Records(running.take(&settings, max_records.max(1)).await?))
    }

    fn position(&mut self, checkpoint: CheckpointId) -> SplitPositions {
        let mut positions = SplitPositions::default();
        if let Some(running) = &self.running {
            positions.merge(&running.kept);
            for reader in running.topics.values() {
                reader.position(&mut positions);
            }
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
        let Some(running) = &self.running else { return Ok(()) };
        let offsets: TopicOffsets = running
            .topics
            .iter()
            .map(|(topic, reader)| (topic.clone(), reader.offsets_in(&positions)))
            .filter(|(_, offsets)| !offsets.is_empty())
            .collect();
        if !offsets.is_empty() {
            running.committer.request(checkpoint, offsets);
        }
        Ok(())
    }
}
