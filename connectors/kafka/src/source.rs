//! The Kafka source: [`KafkaSourceFactory`] and its subtasks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use exactly_core::{CheckpointId, ConnectorError, Poll, Record, Source, SourceFactory, SplitPositions};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;

use crate::client::{
    consumer_config, creation_error, is_fatal, KafkaSourceMetrics, KafkaSourceMetricsSnapshot, RecordMaker,
    SourceContext,
};
use crate::config::{KafkaConfigError, KafkaSourceConfig, StartPosition};

/// How long `poll` waits for the first record.
const POLL_WAIT: Duration = Duration::from_millis(100);
/// Longest single metadata / offset request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between attempts while the brokers do not answer at start.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Position snapshots kept for group commits.
const SNAPSHOTS_KEPT: usize = 64;

type KafkaConsumer = BaseConsumer<SourceContext>;

/// The split name of a partition: `<topic>-<partition>`, which
/// [`Record::topic_partition`] parses back.
pub fn split_name(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

/// Reads one Kafka topic with exactly-once positions.
///
/// - Partition `p` belongs to subtask `p % parallelism`; partitions are assigned
///   explicitly (the consumer never joins the group, no rebalancing).
/// - Splits are named `<topic>-<partition>`; a split's position is the offset of
///   the next record to read. Checkpointed positions are the only truth.
/// - Records are read with `isolation.level=read_committed`.
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
    metrics: Arc<KafkaSourceMetrics>,
    /// `<bootstrap>/<topic>`, for logs and errors.
    label: String,
}

impl KafkaSourceFactory {
    /// A source for the pipeline named `pipeline` (the default group is
    /// `exactly-<pipeline>`). Checks the settings.
    pub fn new(pipeline: &str, config: KafkaSourceConfig) -> Result<Self, KafkaConfigError> {
        config.validate()?;
        let group = config.group_for(pipeline);
        let label = format!("{}/{}", config.bootstrap, config.topic);
        Ok(KafkaSourceFactory {
            settings: Arc::new(Settings {
                config,
                group,
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
        Ok(Box::new(self.subtask(subtask, parallelism)?))
    }
}

impl KafkaSourceFactory {
    fn subtask(&self, subtask: usize, parallelism: usize) -> Result<KafkaSource, ConnectorError> {
        if subtask >= parallelism {
            return Err(ConnectorError::fatal(
                self.settings.context(),
                format!("subtask {subtask} does not exist with parallelism {parallelism}"),
            ));
        }
        Ok(KafkaSource {
            settings: self.settings.clone(),
            subtask,
            parallelism,
            consumer: None,
            cluster: None,
            next: BTreeMap::new(),
            waiting: BTreeMap::new(),
            known: BTreeSet::new(),
            next_discovery: Instant::now(),
            discovery: None,
            progress: Mutex::default(),
            committer: Arc::default(),
            end: None,
            maker: Arc::default(),
        })
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
}

/// Partitions found by a discovery round.
struct Discovered {
    /// Every partition of the topic.
    all: BTreeSet<i32>,
    /// New partitions of this subtask with the offset to start at: their
    /// checkpointed one for a partition the checkpoint lists, else their
    /// beginning.
    added: Vec<(i32, i64)>,
}

/// One subtask. See [`KafkaSourceFactory`].
struct KafkaSource {
    settings: Arc<Settings>,
    subtask: usize,
    parallelism: usize,
    consumer: Option<Arc<KafkaConsumer>>,
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
    next_discovery: Instant,
    discovery: Option<JoinHandle<Result<Discovered, KafkaError>>>,
    progress: Mutex<Progress>,
    committer: Arc<GroupCommitter>,
    /// With `stop_at_end`: the high watermark of every owned partition at start.
    end: Option<BTreeMap<i32, i64>>,
    /// Makes the records (locked once per poll).
    maker: Arc<Mutex<RecordMaker>>,
}

impl KafkaSource {
    /// With `stop_at_end`: every owned partition is read up to its end. Control
    /// records (transaction markers) are never delivered, so the consumer's own
    /// position, which moves past them, counts too.
    fn reached_end(&self, consumer: &KafkaConsumer) -> bool {
        let Some(end) = &self.end else { return false };
        let fetched = consumer.position().ok();
        end.iter().all(|(p, end)| {
            self.next.get(p).is_some_and(|n| n >= end)
                || fetched.as_ref().is_some_and(|list| {
                    list.find_partition(self.settings.topic(), *p)
                        .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= *end))
                })
        })
    }

    fn consumer(&self) -> Result<Arc<KafkaConsumer>, ConnectorError> {
        self.consumer
            .clone()
            .ok_or_else(|| ConnectorError::fatal(self.settings.context(), "poll called before restore"))
    }

    /// Harvests a finished discovery round and starts the next one when due.
    async fn discover(&mut self, consumer: &Arc<KafkaConsumer>) -> Result<(), ConnectorError> {
        if self.discovery.as_ref().is_some_and(JoinHandle::is_finished) {
            let round = self.discovery.take().expect("checked above").await;
            self.next_discovery = Instant::now() + self.settings.config.partition_discovery_interval;
            match round {
                Ok(Ok(found)) => self.add_partitions(consumer, found)?,
                Ok(Err(error)) => {
                    tracing::warn!(source = %self.settings.label, %error, "partition discovery failed; retrying later")
                }
                Err(error) => tracing::warn!(source = %self.settings.label, %error, "partition discovery panicked"),
            }
        } else if self.discovery.is_none() && Instant::now() >= self.next_discovery {
            let consumer = consumer.clone();
            let settings = self.settings.clone();
            let known = self.known.clone();
            let waiting = self.waiting.clone();
            let (subtask, parallelism) = (self.subtask, self.parallelism);
            self.discovery = Some(tokio::task::spawn_blocking(move || {
                let all = topic_partitions(&consumer, settings.topic(), REQUEST_TIMEOUT)?;
                let mut added = Vec::new();
                for &p in all.difference(&known).filter(|p| owns(**p, subtask, parallelism)) {
                    let offset = match waiting.get(&p) {
                        Some(restored) => *restored,
                        None => consumer.fetch_watermarks(settings.topic(), p, REQUEST_TIMEOUT)?.0,
                    };
                    added.push((p, offset));
                }
                Ok(Discovered { all, added })
            }));
        }
        Ok(())
    }

    fn add_partitions(&mut self, consumer: &KafkaConsumer, found: Discovered) -> Result<(), ConnectorError> {
        let added: Vec<(i32, i64)> = found
            .added
            .into_iter()
            .filter(|(p, _)| !self.next.contains_key(p))
            .collect();
        self.known.extend(found.all);
        if added.is_empty() {
            return Ok(());
        }
        consumer
            .incremental_assign(&partition_list(self.settings.topic(), added.iter().copied()))
            .map_err(|e| {
                ConnectorError::transient(self.settings.context(), format!("assigning new partitions: {e}"))
            })?;
        for (p, offset) in &added {
            if self.waiting.remove(p).is_some() {
                tracing::info!(
                    source = %self.settings.label,
                    partition = p,
                    offset,
                    "partition of the checkpoint is back in the metadata: resuming at its checkpointed offset"
                );
            } else {
                tracing::info!(source = %self.settings.label, partition = p, offset, "new partition picked up");
            }
            self.next.insert(*p, *offset);
        }
        self.settings.metrics.add_discovered(added.len() as u64);
        Ok(())
    }
}

fn owns(partition: i32, subtask: usize, parallelism: usize) -> bool {
    partition as usize % parallelism == subtask
}

#[async_trait]
impl Source for KafkaSource {
    async fn restore(&mut self, positions: Option<&SplitPositions>) -> Result<(), ConnectorError> {
        if self.consumer.is_some() {
            return Err(ConnectorError::fatal(self.settings.context(), "restore called twice"));
        }
        let config = &self.settings.config;
        crate::preflight::check_security(&config.bootstrap, &config.properties, &self.settings.context()).await?;
        let settings = self.settings.clone();
        let positions = positions.cloned();
        let (subtask, parallelism) = (self.subtask, self.parallelism);
        let opened = tokio::task::spawn_blocking(move || open(&settings, subtask, parallelism, positions.as_ref()))
            .await
            .map_err(|e| ConnectorError::fatal(self.settings.context(), format!("restore panicked: {e}")))??;
        tracing::info!(
            source = %self.settings.label,
            subtask = self.subtask,
            cluster = opened.cluster.as_deref().unwrap_or("unknown"),
            positions = ?opened.next,
            "Kafka source assigned"
        );
        if !opened.waiting.is_empty() {
            tracing::warn!(
                source = %self.settings.label,
                subtask = self.subtask,
                partitions = ?opened.waiting,
                "partitions of the checkpoint are missing from the topic's metadata: keeping their checkpointed \
                 offsets until they are back"
            );
        }
        self.consumer = Some(Arc::new(opened.consumer));
        self.cluster = opened.cluster;
        self.next = opened.next;
        self.waiting = opened.waiting;
        self.known = opened.partitions;
        self.next_discovery = Instant::now() + self.settings.config.partition_discovery_interval;
        if self.settings.config.stop_at_end {
            let consumer = self.consumer()?;
            let settings = self.settings.clone();
            let owned: Vec<i32> = self.next.keys().copied().collect();
            let end = tokio::task::spawn_blocking(move || {
                owned
                    .into_iter()
                    .map(|p| {
                        Ok((
                            p,
                            consumer
                                .fetch_watermarks(settings.topic(), p, settings.config.startup_timeout)?
                                .1,
                        ))
                    })
                    .collect::<Result<BTreeMap<i32, i64>, KafkaError>>()
            })
            .await
            .map_err(|e| ConnectorError::fatal(self.settings.context(), format!("restore panicked: {e}")))?
            .map_err(|e| ConnectorError::transient(self.settings.context(), format!("reading the end offsets: {e}")))?;
            tracing::info!(source = %self.settings.label, subtask = self.subtask, ?end, "bounded run: reading up to these offsets");
            self.end = Some(end);
        }
        Ok(())
    }

    async fn poll(&mut self, max_records: usize) -> Result<Poll, ConnectorError> {
        let consumer = self.consumer()?;
        if self.reached_end(&consumer) {
            return Ok(Poll::Finished);
        }
        self.discover(&consumer).await?;
        let max = max_records.max(1);
        // What librdkafka has fetched already is taken on this thread (a
        // zero wait never blocks): no hand-over to a blocking thread and
        // back per batch while records keep coming. Only an empty queue is
        // waited for, on a blocking thread.
        let mut fetched = fetch(&consumer, &self.settings, &self.maker, max, Duration::ZERO)?;
        if fetched.is_empty() {
            let (settings, maker) = (self.settings.clone(), self.maker.clone());
            fetched = tokio::task::spawn_blocking(move || fetch(&consumer, &settings, &maker, max, POLL_WAIT))
                .await
                .map_err(|e| ConnectorError::fatal(self.settings.context(), format!("poll panicked: {e}")))??;
        }
        let mut records = Vec::with_capacity(fetched.len());
        for (partition, record) in fetched {
            match self.next.get_mut(&partition) {
                Some(next) if record.offset >= *next => {
                    *next = record.offset + 1;
                    records.push(record);
                }
                Some(next) => tracing::warn!(
                    source = %self.settings.label,
                    partition,
                    offset = record.offset,
                    next = *next,
                    "dropping a record delivered again"
                ),
                None => {
                    tracing::warn!(source = %self.settings.label, partition, "dropping a record of a partition not owned")
                }
            }
        }
        Ok(Poll::Records(records))
    }

    fn position(&mut self, checkpoint: CheckpointId) -> SplitPositions {
        let mut positions = SplitPositions::default();
        for (partition, next) in self.waiting.iter().chain(&self.next) {
            positions.set(self.settings.split(*partition), *next);
        }
        if let Some(cluster) = &self.cluster {
            positions.set(cluster_marker(self.settings.topic(), cluster), 0);
        }
        self.progress
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .record(checkpoint, positions.clone());
        positions
    }

    async fn checkpoint_complete(&mut self, checkpoint: CheckpointId) -> Result<(), ConnectorError> {
        if !self.settings.config.commit_offsets_to_group {
            return Ok(());
        }
        let completed = self
            .progress
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .completed(checkpoint);
        let (Some(positions), Some(consumer)) = (completed, &self.consumer) else {
            return Ok(());
        };
        let offsets: Vec<(i32, i64)> = self
            .next
            .keys()
            .filter_map(|p| Some((*p, positions.get(&self.settings.split(*p))?)))
            .collect();
        if !offsets.is_empty() {
            self.committer
                .request(consumer.clone(), self.settings.clone(), checkpoint, offsets);
        }
        Ok(())
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        // Closing a consumer waits for librdkafka; never do that on a runtime thread.
        if let (Some(consumer), Ok(runtime)) = (self.consumer.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn_blocking(move || drop(consumer));
        }
    }
}

/// Commits checkpointed offsets to the consumer group from a blocking thread,
/// one commit at a time; a newer request replaces a pending older one (offsets
/// only grow, so nothing is lost). librdkafka does not report the outcome of
/// an asynchronous manual commit, hence a synchronous one off the runtime.
#[derive(Debug, Default)]
struct GroupCommitter {
    slot: Mutex<CommitSlot>,
}

#[derive(Debug, Default)]
struct CommitSlot {
    pending: Option<(CheckpointId, Vec<(i32, i64)>)>,
    running: bool,
}

impl GroupCommitter {
    fn request(
        self: &Arc<Self>,
        consumer: Arc<KafkaConsumer>,
        settings: Arc<Settings>,
        checkpoint: CheckpointId,
        offsets: Vec<(i32, i64)>,
    ) {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.pending = Some((checkpoint, offsets));
        if std::mem::replace(&mut slot.running, true) {
            return;
        }
        drop(slot);
        let this = self.clone();
        tokio::task::spawn_blocking(move || loop {
            let (checkpoint, offsets) = {
                let mut slot = this.slot.lock().unwrap_or_else(|e| e.into_inner());
                match slot.pending.take() {
                    Some(next) => next,
                    None => {
                        slot.running = false;
                        return;
                    }
                }
            };
            let result = consumer.commit(&partition_list(settings.topic(), offsets), CommitMode::Sync);
            settings.metrics.committed(result.is_ok());
            match result {
                Ok(()) => tracing::debug!(source = %settings.label, %checkpoint, "offsets committed to the group"),
                Err(error) => tracing::warn!(
                    source = %settings.label,
                    %checkpoint,
                    %error,
                    "committing offsets to the group failed (best effort)"
                ),
            }
        });
    }
}

/// Positions recorded at recent barriers, by checkpoint id, so a completed
/// checkpoint's offsets can be committed to the consumer group.
#[derive(Debug, Default)]
struct Progress {
    recent: VecDeque<(CheckpointId, SplitPositions)>,
    last_completed: Option<CheckpointId>,
}

impl Progress {
    fn record(&mut self, checkpoint: CheckpointId, positions: SplitPositions) {
        self.recent.push_back((checkpoint, positions));
        if self.recent.len() > SNAPSHOTS_KEPT {
            self.recent.pop_front();
        }
    }

    /// The positions of completed checkpoint `id`, once per id, never going back.
    fn completed(&mut self, id: CheckpointId) -> Option<SplitPositions> {
        if self.last_completed.is_some_and(|last| id <= last) {
            return None;
        }
        self.last_completed = Some(id);
        let found = self.recent.iter().find(|(n, _)| *n == id).map(|(_, p)| p.clone());
        self.recent.retain(|(n, _)| *n > id);
        found
    }
}

/// A partition list of `topic` with explicit offsets.
fn partition_list(topic: &str, offsets: impl IntoIterator<Item = (i32, i64)>) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for (partition, offset) in offsets {
        list.add_partition_offset(topic, partition, Offset::Offset(offset))
            .expect("explicit offsets are valid");
    }
    list
}

/// The partitions of `topic`, or the metadata error.
fn topic_partitions(consumer: &KafkaConsumer, topic: &str, timeout: Duration) -> Result<BTreeSet<i32>, KafkaError> {
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition));
    };
    if let Some(error) = t.error() {
        return Err(KafkaError::MetadataFetch(error.into()));
    }
    Ok(t.partitions().iter().map(|p| p.id()).collect())
}

/// A consumer assigned to its partitions at their start offsets.
struct Opened {
    consumer: KafkaConsumer,
    cluster: Option<String>,
    next: BTreeMap<i32, i64>,
    /// Owned partitions of the checkpoint missing from the metadata.
    waiting: BTreeMap<i32, i64>,
    partitions: BTreeSet<i32>,
}

/// The position entry naming the cluster the positions of `topic` were
/// read from (see [`KafkaSourceFactory`]).
fn cluster_marker(topic: &str, cluster: &str) -> String {
    format!("{topic}{CLUSTER_MARKER}{cluster}")
}

/// Between the topic and the cluster id in [`cluster_marker`].
const CLUSTER_MARKER: &str = "@cluster:";

/// The clusters `positions` say the offsets of `topic` were read from.
fn recorded_clusters<'a>(positions: &'a SplitPositions, topic: &str) -> BTreeSet<&'a str> {
    positions
        .0
        .keys()
        .filter_map(|key| key.strip_prefix(topic)?.strip_prefix(CLUSTER_MARKER))
        .collect()
}

/// Whether offsets read from the clusters `recorded` may be resumed on the
/// cluster `current` the brokers answer as.
fn check_cluster(settings: &Settings, recorded: &BTreeSet<&str>, current: Option<&str>) -> Result<(), ConnectorError> {
    if recorded.is_empty() {
        return Ok(());
    }
    let config = &settings.config;
    let was = recorded
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(" and ");
    let Some(current) = current else {
        return Err(ConnectorError::transient(
            settings.context(),
            format!(
                "the checkpoint's offsets were read from Kafka cluster {was}, and `{}` did not tell its cluster id \
                 within {} to check it is the same cluster; check `bootstrap` and that the brokers are running",
                config.bootstrap,
                humantime::format_duration(config.startup_timeout)
            ),
        ));
    };
    if recorded.iter().all(|c| *c == current) {
        return Ok(());
    }
    if config.accept_cluster_id.as_deref() == Some(current) {
        tracing::warn!(
            source = %settings.label,
            was = %was,
            now = current,
            "resuming the checkpoint's offsets, read from another cluster, on this one, as `accept_cluster_id` says"
        );
        return Ok(());
    }
    Err(ConnectorError::fatal(
        settings.context(),
        format!(
            "the checkpoint's offsets of topic `{topic}` were read from Kafka cluster {was}, but `{bootstrap}` is \
             cluster `{current}`: offsets of one cluster mean nothing in another (resuming would skip or repeat \
             records). Point `bootstrap` back at cluster {was}; to read cluster `{current}` from `start` instead, \
             run the pipeline under a new `name` or `checkpoint.dir` (a first start); only if cluster `{current}` \
             holds the very same offsets (a migration that kept them), set `accept_cluster_id = \"{current}\"` in \
             [source.kafka]",
            topic = settings.topic(),
            bootstrap = config.bootstrap,
        ),
    ))
}

/// The cluster id the brokers report, retried until `deadline`; `None` when
/// they report none by then.
fn cluster_id(consumer: &KafkaConsumer, deadline: Instant) -> Option<String> {
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if let Some(id) = consumer
            .client()
            .fetch_cluster_id(remaining.clamp(Duration::from_millis(100), REQUEST_TIMEOUT))
        {
            return Some(id);
        }
        if Instant::now() + RETRY_PAUSE >= deadline {
            return None;
        }
        std::thread::sleep(RETRY_PAUSE);
    }
}

/// Creates the consumer, finds the partitions, resolves every start offset to a
/// number and assigns. Blocking; bounded by `startup_timeout`.
fn open(
    settings: &Arc<Settings>,
    subtask: usize,
    parallelism: usize,
    positions: Option<&SplitPositions>,
) -> Result<Opened, ConnectorError> {
    let config = &settings.config;
    let deadline = Instant::now() + config.startup_timeout;
    let context = SourceContext {
        metrics: settings.metrics.clone(),
        label: settings.label.clone(),
    };
    let consumer: KafkaConsumer = consumer_config(&config.bootstrap, &settings.group, &config.properties)
        .create_with_context(context)
        .map_err(|e| creation_error(&settings.context(), e))?;
    let partitions = retry(settings, deadline, "reading the topic's partitions", |timeout| {
        topic_partitions(&consumer, settings.topic(), timeout)
    })?;
    let cluster = cluster_id(&consumer, deadline);
    let recorded = positions
        .map(|p| recorded_clusters(p, settings.topic()))
        .unwrap_or_default();
    check_cluster(settings, &recorded, cluster.as_deref())?;
    match (&cluster, positions.is_some() && recorded.is_empty()) {
        (None, _) => tracing::warn!(
            source = %settings.label,
            "the brokers report no cluster id: a checkpoint cannot tell which cluster its offsets belong to"
        ),
        (Some(cluster), true) => tracing::info!(
            source = %settings.label,
            cluster,
            "the checkpoint does not name its cluster (written before the source recorded it): recording this one"
        ),
        (Some(_), false) => {}
    }

    // A checkpoint that read this topic lists every partition that existed
    // then: the missing ones were added since, so they start at the beginning.
    let topic_in_checkpoint = positions.is_some_and(|p| {
        p.0.keys().any(|split| {
            split
                .strip_prefix(settings.topic())
                .is_some_and(|rest| rest.starts_with('-'))
        })
    });
    let start = if topic_in_checkpoint {
        StartPosition::Earliest
    } else {
        config.start
    };
    let mut next = BTreeMap::new();
    let mut unresolved = Vec::new();
    for p in partitions.iter().copied().filter(|p| owns(*p, subtask, parallelism)) {
        match positions.and_then(|pos| pos.get(&settings.split(p))) {
            Some(offset) => {
                next.insert(p, offset);
            }
            None => unresolved.push(p),
        }
    }
    let waiting: BTreeMap<i32, i64> = positions
        .map(|pos| checkpointed_partitions(pos, settings.topic()))
        .unwrap_or_default()
        .into_iter()
        .filter(|(p, _)| owns(*p, subtask, parallelism) && !partitions.contains(p))
        .collect();
    if !unresolved.is_empty() {
        let resolved = retry(
            settings,
            deadline,
            &format!("resolving start position {start}"),
            |timeout| resolve(&consumer, settings.topic(), start, &unresolved, timeout),
        )?;
        next.extend(resolved);
    }
    consumer
        .assign(&partition_list(settings.topic(), next.iter().map(|(p, o)| (*p, *o))))
        .map_err(|e| ConnectorError::fatal(settings.context(), format!("assigning partitions: {e}")))?;
    Ok(Opened {
        consumer,
        cluster,
        next,
        waiting,
        partitions,
    })
}

/// The partitions of `topic` that `positions` hold an offset for.
fn checkpointed_partitions(positions: &SplitPositions, topic: &str) -> BTreeMap<i32, i64> {
    positions
        .0
        .iter()
        .filter_map(|(split, offset)| {
            let partition = split.strip_prefix(topic)?.strip_prefix('-')?.parse().ok()?;
            Some((partition, *offset))
        })
        .collect()
}

/// Runs `attempt` until it succeeds or `deadline` passes.
fn retry<T>(
    settings: &Settings,
    deadline: Instant,
    what: &str,
    mut attempt: impl FnMut(Duration) -> Result<T, KafkaError>,
) -> Result<T, ConnectorError> {
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let error = match attempt(remaining.clamp(Duration::from_millis(100), REQUEST_TIMEOUT)) {
            Ok(value) => return Ok(value),
            Err(error) if is_fatal(&error) => {
                return Err(ConnectorError::fatal(settings.context(), format!("{what}: {error}")))
            }
            Err(error) => error,
        };
        if Instant::now() + RETRY_PAUSE < deadline {
            tracing::debug!(source = %settings.label, %error, "{what}: retrying");
            std::thread::sleep(RETRY_PAUSE);
            continue;
        }
        let waited = humantime::format_duration(settings.config.startup_timeout);
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition) {
            return Err(ConnectorError::fatal(
                settings.context(),
                format!(
                    "topic `{}` does not exist on `{}` (still unknown after {waited}); create it or fix `topic`",
                    settings.topic(),
                    settings.config.bootstrap
                ),
            ));
        }
        return Err(ConnectorError::transient(
            settings.context(),
            format!(
                "{what}: Kafka bootstrap `{}` did not answer within {waited} (last error: {error}); \
                 check `bootstrap` and that the brokers are running",
                settings.config.bootstrap
            ),
        ));
    }
}

/// Turns `start` into an offset for each of `partitions`.
fn resolve(
    consumer: &KafkaConsumer,
    topic: &str,
    start: StartPosition,
    partitions: &[i32],
    timeout: Duration,
) -> Result<Vec<(i32, i64)>, KafkaError> {
    let watermark = |p: i32, high: bool| -> Result<i64, KafkaError> {
        let (low, hi) = consumer.fetch_watermarks(topic, p, timeout)?;
        Ok(if high { hi } else { low })
    };
    let lookup = |list: TopicPartitionList| -> Result<Vec<(i32, Offset)>, KafkaError> {
        let found = match start {
            StartPosition::Group => consumer.committed_offsets(list, timeout)?,
            _ => consumer.offsets_for_times(list, timeout)?,
        };
        found
            .elements()
            .iter()
            .map(|e| e.error().map(|()| (e.partition(), e.offset())))
            .collect()
    };
    let keyed = |offset: i64| partition_list_with(topic, partitions, Offset::Offset(offset));
    let mut resolved = Vec::with_capacity(partitions.len());
    match start {
        StartPosition::Earliest | StartPosition::Latest => {
            for &p in partitions {
                resolved.push((p, watermark(p, start == StartPosition::Latest)?));
            }
        }
        StartPosition::Timestamp(ms) => {
            for (p, offset) in lookup(keyed(ms))? {
                let offset = match offset {
                    Offset::Offset(o) => o,
                    // No record at or after the time: start at the end.
                    _ => watermark(p, true)?,
                };
                resolved.push((p, offset));
            }
        }
        StartPosition::Group => {
            for (p, offset) in lookup(partition_list_with(topic, partitions, Offset::Invalid))? {
                let offset = match offset {
                    Offset::Offset(o) => o,
                    _ => {
                        tracing::info!(
                            topic,
                            partition = p,
                            "the group has no committed offset: starting at earliest"
                        );
                        watermark(p, false)?
                    }
                };
                resolved.push((p, offset));
            }
        }
    }
    Ok(resolved)
}

fn partition_list_with(topic: &str, partitions: &[i32], offset: Offset) -> TopicPartitionList {
    let mut list = TopicPartitionList::with_capacity(partitions.len());
    for &p in partitions {
        list.add_partition_offset(topic, p, offset).expect("valid offset");
    }
    list
}

/// Up to `max` records: waits up to `wait` for the first, then takes what
/// is already there (with a zero `wait` it never blocks). Non-fatal errors
/// were logged and counted by the context; librdkafka retries them itself.
fn fetch(
    consumer: &KafkaConsumer,
    settings: &Settings,
    maker: &Mutex<RecordMaker>,
    max: usize,
    wait: Duration,
) -> Result<Vec<(i32, Record)>, ConnectorError> {
    let deadline = Instant::now() + wait;
    let mut maker = maker.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::new();
    while out.len() < max {
        let wait = if out.is_empty() {
            deadline.saturating_duration_since(Instant::now())
        } else {
            Duration::ZERO
        };
        match consumer.poll(wait) {
            Some(Ok(message)) => {
                if out.is_empty() {
                    // Room for a whole batch once one record came: no regrowing.
                    out.reserve_exact(max);
                }
                out.push((message.partition(), maker.record(&message)))
            }
            Some(Err(error)) if is_fatal(&error) => {
                let detail = consumer
                    .client()
                    .fatal_error()
                    .map_or_else(|| error.to_string(), |(code, reason)| format!("{code}: {reason}"));
                return Err(ConnectorError::fatal(settings.context(), detail));
            }
            Some(Err(_)) => {}
            None if !out.is_empty() || Instant::now() >= deadline => break,
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(n: i64) -> SplitPositions {
        let mut p = SplitPositions::default();
        p.set("t-0", n);
        p
    }

    #[test]
    fn completed_checkpoints_map_to_their_snapshot() {
        let mut progress = Progress::default();
        progress.record(CheckpointId(8), at(1));
        progress.record(CheckpointId(9), at(2));
        assert_eq!(progress.completed(CheckpointId(8)), Some(at(1)));
        assert_eq!(progress.completed(CheckpointId(8)), None, "repeated");
        progress.record(CheckpointId(10), at(3));
        progress.record(CheckpointId(11), at(4));
        assert_eq!(progress.completed(CheckpointId(10)), Some(at(3)));
        assert_eq!(progress.completed(CheckpointId(9)), None, "going back");
        assert_eq!(progress.completed(CheckpointId(11)), Some(at(4)));
        assert!(progress.recent.is_empty());
    }

    #[test]
    fn old_snapshots_are_dropped() {
        let mut progress = Progress::default();
        for n in 0..200 {
            progress.record(CheckpointId(n as u64 + 1), at(n));
        }
        assert_eq!(progress.recent.len(), SNAPSHOTS_KEPT);
        assert_eq!(progress.completed(CheckpointId(1)), None, "snapshot 1 is gone");
        assert_eq!(progress.completed(CheckpointId(200)), Some(at(199)));
    }

    #[test]
    fn positions_name_their_cluster_and_another_one_is_refused() {
        let factory = |accept: Option<&str>| {
            let mut config = KafkaSourceConfig::new("127.0.0.1:1", "orders");
            config.accept_cluster_id = accept.map(String::from);
            KafkaSourceFactory::new("p", config).unwrap()
        };
        let mut p = at(3);
        p.set("orders-0", 5);
        p.set(cluster_marker("orders", "A-1_x"), 0);
        p.set(cluster_marker("other", "B"), 0);
        p.set("orders-x-1", 7);
        let recorded = recorded_clusters(&p, "orders");
        assert_eq!(recorded, ["A-1_x"].into());
        assert_eq!(
            checkpointed_partitions(&p, "orders"),
            [(0, 5)].into(),
            "the marker is no partition"
        );

        let plain = factory(None);
        assert!(check_cluster(&plain.settings, &recorded, Some("A-1_x")).is_ok());
        assert!(
            check_cluster(&plain.settings, &BTreeSet::new(), Some("B")).is_ok(),
            "nothing recorded"
        );
        let refused = check_cluster(&plain.settings, &recorded, Some("B")).unwrap_err();
        assert!(!refused.is_retriable(), "{refused}");
        for part in [
            "cluster `A-1_x`",
            "is cluster `B`",
            "accept_cluster_id = \"B\"",
            "new `name`",
        ] {
            assert!(refused.to_string().contains(part), "`{part}` missing from {refused}");
        }
        let unknown = check_cluster(&plain.settings, &recorded, None).unwrap_err();
        assert!(unknown.is_retriable(), "{unknown}");

        let accepting = factory(Some("B"));
        assert!(check_cluster(&accepting.settings, &recorded, Some("B")).is_ok());
        assert!(
            check_cluster(&accepting.settings, &recorded, Some("C")).is_err(),
            "only the named cluster"
        );
    }

    #[test]
    fn identity_and_ownership() {
        let f = KafkaSourceFactory::new("p", KafkaSourceConfig::new("127.0.0.1:1", "orders")).unwrap();
        assert_eq!(f.identity(), "kafka:topic=orders");
        assert_eq!(f.group_id(), "exactly-p");
        assert!(f.create(2, 2).is_err());
        assert!(owns(4, 0, 2) && owns(5, 1, 2) && owns(5, 0, 1));
        let r = Record::new(split_name("my-topic", 12), 0, "");
        assert_eq!(r.topic_partition(), Some(("my-topic", 12)));
    }
}
