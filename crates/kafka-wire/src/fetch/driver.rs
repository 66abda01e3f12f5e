//! The task behind a [`Fetcher`](super::Fetcher): one Fetch in flight per
//! broker, answers turned into chunks, errors into retries.
//!
//! ## Leaders and epochs
//!
//! Every Fetch carries the partition's current leader epoch from the
//! metadata (KIP-320), so a broker that no longer leads the partition —
//! after an election, a rolling restart, a preferred-leader election —
//! refuses it (FENCED_LEADER_EPOCH) instead of serving it as a follower,
//! and the metadata is read again. Whenever a partition's leader epoch
//! changes under a position that has an epoch (the epoch of the last
//! record it passed), the position is checked with the new leader
//! (OffsetForLeaderEpoch) before the next Fetch: a log that an unclean
//! election truncated below the position is found there, and stops the
//! fetcher ([`WireError::LogTruncated`]) or — with
//! [`OnTruncation::Resume`] — goes on at the divergence, counted.
//!
//! ## A slow broker stalls only its own partitions
//!
//! Fetches run as tasks of their own, one per broker. The control path —
//! metadata, epoch checks, out-of-range lookups — runs as tasks too
//! ([`Control`]), asked of a broker that answered recently rather than
//! one whose Fetch is overdue. A Fetch unanswered well past its wait is
//! taken as a sign its broker is in trouble: the metadata is read again (at
//! another broker), and partitions whose leader moved meanwhile are
//! fetched from the new one without waiting for the old answer.
//!
//! ## Topics
//!
//! From Fetch v13 on the topic is named by its id (KIP-516): a topic
//! deleted and created again under the same name is not read as if it were
//! the old one. A new id in the metadata stops the fetcher
//! ([`WireError::TopicRecreated`]); a topic missing from the metadata is
//! waited for, counted as missing, up to
//! [`FetchSettings::missing_topic_timeout`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use kafka_protocol::ResponseError;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};
use tracing::{debug, info, warn};

use super::control::{self, Bounds, Control};
use super::partition::read_partition;
use super::settings::{FetchSettings, OffsetReset};
use super::state::{backoff, judge, resume_at, Check, Checked, PartitionState};
use super::{Command, FetchCounters, FetchPosition, FetchedChunk, Truncation};
use crate::config::{ConnectionOptions, WireConfig};
use crate::connection::{versions, KafkaConnection};
use crate::consumer_client::{ConsumerClient, EpochEnd, Leader, TopicMetadata};
use crate::error::WireError;
use crate::topic_id::TopicId;

/// Isolation level read_committed: records up to the last stable offset,
/// with the aborted transactions among them listed.
const READ_COMMITTED: i8 = 1;
/// Fetch versions spoken when the topic's id is known: v13 names topics by
/// id, v15 replaces the replica id by a replica state (a consumer sends the
/// default, -1), v16 adds the new leader's address to errors (KIP-951).
const FETCH_BY_ID: VersionRange = versions(4, 16);
/// Fetch versions spoken while the topic's id is unknown (a broker that
/// names none): up to v12, which name topics.
const FETCH_BY_NAME: VersionRange = versions(4, 12);
/// How long past its wait (`fetch.wait.max.ms`) a Fetch may go unanswered
/// before its broker is suspected: the metadata is read again elsewhere.
const OVERDUE: Duration = Duration::from_secs(2);
/// Least pause between metadata reads prompted by overdue Fetches.
const SUSPECT_REFRESH: Duration = Duration::from_secs(1);

/// The topic's metadata: whether it must be read again, and when.
#[derive(Debug)]
struct MetadataState {
    stale: bool,
    retry_at: Instant,
    failures: u32,
    /// A read is running.
    running: bool,
    /// When the last read was answered.
    read_at: Instant,
    /// Since when the topic is missing from it.
    missing_since: Option<Instant>,
}

/// A Fetch in flight to one broker.
#[derive(Debug)]
struct InFlight {
    sent: Instant,
}

/// A Fetch that came back (or failed), with the connection it used when
/// that is still good.
struct Answer {
    broker: Leader,
    id: u64,
    connection: Option<KafkaConnection>,
    /// The partitions asked for, with the offset each was asked at.
    asked: BTreeMap<i32, i64>,
    result: Result<FetchResponse, WireError>,
}

pub(super) struct Driver {
    topic: String,
    topic_name: TopicName,
    /// The topic's id: the one the positions belong to, or the first the
    /// metadata named.
    topic_id: Option<TopicId>,
    settings: FetchSettings,
    options: ConnectionOptions,
    /// The template of the control path's clients (never used itself).
    client: ConsumerClient,
    partitions: BTreeMap<i32, PartitionState>,
    /// Connections with no Fetch in flight, by broker address.
    idle: BTreeMap<String, KafkaConnection>,
    /// Brokers with a Fetch in flight, by address.
    busy: BTreeMap<String, InFlight>,
    /// When each broker last answered, by address.
    answered: BTreeMap<String, Instant>,
    /// Every broker's address by node id, from the last metadata read.
    brokers: BTreeMap<i32, String>,
    in_flight: JoinSet<Answer>,
    next_fetch_id: u64,
    control: Control,
    metadata: MetadataState,
    /// Per broker, turns the order of its partitions in a request, so each
    /// comes first in turn: a broker always sends the first partition's
    /// next batch, even one larger than the byte limits, and fills the
    /// answer from the first partitions first.
    rotation: BTreeMap<String, usize>,
    counters: Arc<FetchCounters>,
    out: mpsc::UnboundedSender<Result<FetchedChunk, WireError>>,
    queued: Arc<Semaphore>,
}

impl Driver {
    pub(super) fn new(
        config: WireConfig,
        topic: &str,
        partitions: BTreeMap<i32, FetchPosition>,
        topic_id: Option<TopicId>,
        settings: FetchSettings,
        counters: Arc<FetchCounters>,
        out: mpsc::UnboundedSender<Result<FetchedChunk, WireError>>,
    ) -> Driver {
        let partitions = partitions
            .into_iter()
            .map(|(partition, position)| (partition, PartitionState::new(position, &settings)))
            .collect();
        let now = Instant::now();
        Driver {
            topic: topic.to_string(),
            topic_name: TopicName(StrBytes::from_string(topic.to_string())),
            topic_id,
            queued: Arc::new(Semaphore::new(settings.queued_max_bytes)),
            settings,
            options: config.options.clone(),
            client: ConsumerClient::new(config),
            partitions,
            idle: BTreeMap::new(),
            busy: BTreeMap::new(),
            answered: BTreeMap::new(),
            brokers: BTreeMap::new(),
            in_flight: JoinSet::new(),
            next_fetch_id: 0,
            control: Control::default(),
            metadata: MetadataState {
                stale: true,
                retry_at: now,
                failures: 0,
                running: false,
                read_at: now,
                missing_since: None,
            },
            rotation: BTreeMap::new(),
            counters,
            out,
        }
    }

    /// Fetches until the [`Fetcher`](super::Fetcher) is dropped, or an
    /// error no retry cures, which it hands to the consumer.
    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        if let Err(error) = self.drive(&mut commands).await {
            warn!(topic = %self.topic, %error, "the fetcher stops");
            let _ = self.out.send(Err(error));
        }
    }

    async fn drive(&mut self, commands: &mut mpsc::UnboundedReceiver<Command>) -> Result<(), WireError> {
        loop {
            self.check_missing()?;
            self.read_metadata();
            self.check_epochs();
            self.launch();
            let wake = self.next_wake();
            tokio::select! {
                command = commands.recv() => match command {
                    None => return Ok(()),
                    Some(Command::Add { partition, position }) => self.add(partition, position),
                },
                Some(done) = self.in_flight.join_next(), if !self.in_flight.is_empty() => match done {
                    Ok(answer) => self.answer(answer).await?,
                    Err(error) => {
                        warn!(topic = %self.topic, %error, "a Fetch task failed");
                        return Err(WireError::FetcherStopped { topic: self.topic.clone() });
                    }
                },
                Some(done) = self.control.next(), if !self.control.is_idle() => match done {
                    Ok(answer) => self.control_answer(answer).await?,
                    Err(error) => {
                        warn!(topic = %self.topic, %error, "a control task of the fetcher failed");
                        return Err(WireError::FetcherStopped { topic: self.topic.clone() });
                    }
                },
                _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            }
        }
    }

    fn add(&mut self, partition: i32, position: FetchPosition) {
        if self.partitions.contains_key(&partition) {
            return;
        }
        debug!(topic = %self.topic, partition, ?position, "fetching a partition added");
        self.partitions
            .insert(partition, PartitionState::new(position, &self.settings));
        self.stale_now();
    }

    /// Marks the metadata stale, to be read at once.
    fn stale_now(&mut self) {
        self.metadata.stale = true;
        self.metadata.retry_at = self.metadata.retry_at.min(Instant::now());
    }

    /// Fails with [`WireError::TopicMissing`] once the topic has been
    /// missing for longer than allowed.
    fn check_missing(&self) -> Result<(), WireError> {
        match self.metadata.missing_since {
            Some(since) if since.elapsed() >= self.settings.missing_topic_timeout => Err(WireError::TopicMissing {
                topic: self.topic.clone(),
                bootstrap: self.client.config().bootstrap().to_string(),
                missing_for: since.elapsed(),
            }),
            _ => Ok(()),
        }
    }

    /// Starts a metadata read when one is due and none runs: the metadata
    /// is stale (and its backoff over), older than `metadata.max.age.ms`,
    /// or a Fetch is overdue.
    fn read_metadata(&mut self) {
        if self.metadata.running {
            return;
        }
        let now = Instant::now();
        let due = (self.metadata.stale && now >= self.metadata.retry_at)
            || now >= self.metadata.read_at + self.settings.metadata_max_age
            || (!self.overdue(now).is_empty() && now >= self.metadata.read_at + SUSPECT_REFRESH);
        if !due {
            return;
        }
        self.metadata.running = true;
        let prefer = self.responsive_broker(now);
        self.control.metadata(&self.client, &self.topic, prefer);
    }

    /// Brokers whose Fetch is overdue.
    fn overdue(&self, now: Instant) -> BTreeSet<&str> {
        let limit = self.settings.max_wait + OVERDUE;
        self.busy
            .iter()
            .filter(|(_, fetch)| now.duration_since(fetch.sent) > limit)
            .map(|(address, _)| address.as_str())
            .collect()
    }

    /// The broker that answered last among those without an overdue
    /// Fetch: the one to ask the control path's questions.
    fn responsive_broker(&self, now: Instant) -> Option<String> {
        let overdue = self.overdue(now);
        self.answered
            .iter()
            .filter(|(address, _)| !overdue.contains(address.as_str()))
            .max_by_key(|(_, at)| **at)
            .map(|(address, _)| address.clone())
    }

    /// Starts an epoch check at each leader for its partitions that need
    /// one.
    fn check_epochs(&mut self) {
        let mut by_leader: BTreeMap<(String, i32), BTreeMap<i32, (i64, i32)>> = BTreeMap::new();
        for (partition, state) in &mut self.partitions {
            if state.check != Check::Needed || state.resetting {
                continue;
            }
            let (Some(leader), Some(epoch)) = (&state.leader, state.epoch) else {
                if state.epoch.is_none() {
                    state.check = Check::Done;
                }
                continue;
            };
            if state.retry_at.is_some_and(|at| at > Instant::now()) {
                continue;
            }
            state.check = Check::Running;
            by_leader
                .entry((leader.address.clone(), leader.epoch))
                .or_default()
                .insert(*partition, (state.position, epoch));
        }
        for ((leader, current), asked) in by_leader {
            debug!(topic = %self.topic, %leader, ?asked, "checking positions against the leader's log");
            self.control.epochs(&self.client, &self.topic, leader, current, asked);
        }
    }

    /// Sends a Fetch to every broker without one in flight that serves a
    /// partition ready to be fetched.
    fn launch(&mut self) {
        let now = Instant::now();
        let mut by_broker: BTreeMap<String, (Leader, Vec<i32>)> = BTreeMap::new();
        for (partition, state) in &self.partitions {
            if !state.fetchable(now) {
                continue;
            }
            let Some(source) = state.source(now) else { continue };
            if !self.busy.contains_key(&source.address) {
                by_broker
                    .entry(source.address.clone())
                    .or_insert_with(|| (source.clone(), Vec::new()))
                    .1
                    .push(*partition);
            }
        }
        let range = if self.topic_id.is_some() {
            FETCH_BY_ID
        } else {
            FETCH_BY_NAME
        };
        for (address, (broker, mut partitions)) in by_broker {
            self.take_turns(&address, &mut partitions);
            let id = self.next_fetch_id;
            self.next_fetch_id += 1;
            let mut asked = BTreeMap::new();
            let wanted: Vec<FetchPartition> = partitions
                .iter()
                .map(|partition| {
                    let state = self.partitions.get_mut(partition).expect("listed above");
                    state.in_flight = Some(id);
                    asked.insert(*partition, state.position);
                    self.counters.fetch_from(&self.topic, *partition, Some(broker.node));
                    let current_epoch = state.leader.as_ref().map_or(-1, |l| l.epoch);
                    FetchPartition::default()
                        .with_partition(*partition)
                        .with_fetch_offset(state.position)
                        .with_partition_max_bytes(state.max_bytes)
                        .with_current_leader_epoch(current_epoch)
                        .with_last_fetched_epoch(-1)
                        .with_log_start_offset(-1)
                })
                .collect();
            let mut topic = FetchTopic::default()
                .with_topic(self.topic_name.clone())
                .with_partitions(wanted);
            if let Some(id) = self.topic_id {
                topic = topic.with_topic_id(id.to_wire());
            }
            let rack = self.settings.rack.clone().unwrap_or_default();
            let request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(self.settings.max_wait.as_millis().min(i32::MAX as u128) as i32)
                .with_min_bytes(self.settings.min_bytes)
                .with_max_bytes(self.settings.max_bytes)
                .with_isolation_level(READ_COMMITTED)
                .with_session_id(0)
                .with_session_epoch(-1)
                .with_rack_id(StrBytes::from_string(rack))
                .with_topics(vec![topic]);
            self.busy.insert(address.clone(), InFlight { sent: now });
            let connection = self.idle.remove(&address);
            let options = self.options.clone();
            self.in_flight.spawn(async move {
                let (connection, result) = fetch(&broker.address, connection, &options, range, &request).await;
                Answer {
                    broker,
                    id,
                    connection,
                    asked,
                    result,
                }
            });
        }
    }

    /// Puts `partitions` of `broker` in the order of its next request: each
    /// of them first in turn.
    fn take_turns(&mut self, broker: &str, partitions: &mut [i32]) {
        let turn = self.rotation.entry(broker.to_string()).or_default();
        partitions.rotate_left(*turn % partitions.len().max(1));
        *turn = turn.wrapping_add(1);
    }

    /// The earliest moment something waits for: a partition's backoff, the
    /// metadata's next read, an overdue Fetch. A partition whose broker has
    /// a Fetch in flight waits for its answer, which wakes the loop anyway.
    fn next_wake(&self) -> Option<Instant> {
        let now = Instant::now();
        let partitions = self
            .partitions
            .values()
            .filter(|state| state.in_flight.is_none())
            .filter(|state| {
                state
                    .source(now)
                    .is_some_and(|source| !self.busy.contains_key(&source.address))
                    || state.check == Check::Needed
            })
            .filter_map(|state| state.retry_at)
            .filter(|at| *at > now);
        let metadata = if self.metadata.running {
            None
        } else {
            let mut due = self.metadata.read_at + self.settings.metadata_max_age;
            if self.metadata.stale {
                due = due.min(self.metadata.retry_at);
            }
            if let Some(first) = self.busy.values().map(|f| f.sent).min() {
                let suspect = (first + self.settings.max_wait + OVERDUE).max(self.metadata.read_at + SUSPECT_REFRESH);
                due = due.min(suspect);
            }
            Some(due)
        };
        let missing = self
            .metadata
            .missing_since
            .map(|since| since + self.settings.missing_topic_timeout);
        partitions.chain(metadata).chain(missing).min()
    }

    async fn answer(&mut self, answer: Answer) -> Result<(), WireError> {
        let address = answer.broker.address.clone();
        self.busy.remove(&address);
        // Partitions still waiting for this Fetch (not abandoned for a new
        // leader meanwhile).
        let mine: BTreeMap<i32, i64> = answer
            .asked
            .iter()
            .filter(|(p, _)| self.partitions.get(p).is_some_and(|s| s.in_flight == Some(answer.id)))
            .map(|(p, at)| (*p, *at))
            .collect();
        for partition in mine.keys() {
            if let Some(state) = self.partitions.get_mut(partition) {
                state.in_flight = None;
            }
        }
        let response = match answer.result {
            Ok(response) => response,
            Err(error) if error.is_retriable() => {
                self.failed(mine.keys(), &format!("fetching from {address}"), &error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        self.answered.insert(address.clone(), Instant::now());
        self.counters.count_fetch(answer.broker.node);
        if let Some(connection) = answer.connection {
            self.idle.insert(address.clone(), connection);
        }
        if let Some(error) = ResponseError::try_from_code(response.error_code) {
            let error = WireError::Broker {
                addr: address,
                api: ApiKey::Fetch,
                error,
                message: None,
            };
            if !error.is_retriable() && error.broker_error() != Some(ResponseError::UnknownTopicId) {
                return Err(error);
            }
            self.failed(mine.keys(), "fetching", &error);
            return Ok(());
        }
        let topic_id = self.topic_id.map(TopicId::to_wire);
        let data: Vec<PartitionData> = response
            .responses
            .into_iter()
            .filter(|topic| topic.topic == self.topic_name || Some(topic.topic_id) == topic_id)
            .flat_map(|topic| topic.partitions)
            .collect();
        for data in data {
            if let Some(&asked_at) = mine.get(&data.partition_index) {
                self.partition_answer(&answer.broker, asked_at, data).await?;
            }
        }
        Ok(())
    }

    /// One partition's part of an answer from `broker` to a Fetch at
    /// `asked_at`.
    async fn partition_answer(&mut self, broker: &Leader, asked_at: i64, data: PartitionData) -> Result<(), WireError> {
        let partition = data.partition_index;
        let context = format!("{}/{partition} at offset {asked_at}", self.topic);
        let now = Instant::now();
        let Some(state) = self.partitions.get_mut(&partition) else {
            return Ok(());
        };
        if state.position != asked_at {
            return Ok(());
        }
        let from_replica = state.leader.as_ref().is_some_and(|l| l.node != broker.node);
        match ResponseError::try_from_code(data.error_code) {
            None => {}
            Some(_) if from_replica => {
                // A replica that cannot serve (behind, out of range, no
                // longer a replica): back to the leader, as Kafka's
                // consumer does.
                debug!(topic = %self.topic, partition, replica = broker.node, code = data.error_code, "the read replica cannot serve; fetching from the leader");
                state.replica = None;
                return Ok(());
            }
            Some(ResponseError::OffsetOutOfRange) => {
                state.resetting = true;
                self.control.bounds(&self.client, &self.topic, partition, asked_at);
                return Ok(());
            }
            Some(code) => {
                let error = WireError::Broker {
                    addr: broker.address.clone(),
                    api: ApiKey::Fetch,
                    error: code,
                    message: Some(context),
                };
                if !retried(code) {
                    return Err(error);
                }
                // KIP-951: the refusing broker may name the new leader.
                let hint = &data.current_leader;
                if hint.leader_id.0 >= 0 && hint.leader_epoch > state.leader.as_ref().map_or(-1, |l| l.epoch) {
                    debug!(topic = %self.topic, partition, leader = hint.leader_id.0, epoch = hint.leader_epoch, "the broker names a newer leader");
                }
                self.failed([&partition], "fetching", &error);
                return Ok(());
            }
        }
        if data.preferred_read_replica.0 >= 0 && data.preferred_read_replica.0 != broker.node {
            self.read_replica(partition, data.preferred_read_replica.0, now);
            return Ok(());
        }
        let raw = data.records.unwrap_or_default();
        let size = raw.len();
        let aborted = data
            .aborted_transactions
            .unwrap_or_default()
            .into_iter()
            .map(|t| (t.producer_id.0, t.first_offset));
        let read = read_partition(asked_at, raw, aborted).map_err(|message| WireError::Protocol {
            addr: broker.address.clone(),
            message: format!("{context}: {message}"),
        })?;
        let state = self.partitions.get_mut(&partition).expect("checked above");
        if state.failures > 0 {
            info!(topic = %self.topic, partition, "fetching again after {} failures", state.failures);
        }
        state.failures = 0;
        state.retry_at = None;
        if read.cut {
            state.max_bytes = state
                .max_bytes
                .saturating_mul(2)
                .min(self.settings.max_bytes.max(state.max_bytes));
            debug!(topic = %self.topic, partition, max_bytes = state.max_bytes, "a batch larger than the partition's byte limit");
        }
        if read.next == asked_at && read.records.is_empty() {
            return Ok(());
        }
        state.advance(read.next, read.last_epoch);
        let chunk = FetchedChunk {
            partition,
            records: read.records,
            next_offset: read.next,
            next_epoch: state.epoch,
            high_watermark: data.high_watermark,
            truncation: None,
            _queued: None,
        };
        self.deliver(chunk, size).await;
        Ok(())
    }

    /// The leader of `partition` named replica `node` to fetch from
    /// (KIP-392): fetched there until the metadata is due again, or the
    /// replica fails.
    fn read_replica(&mut self, partition: i32, node: i32, now: Instant) {
        let address = self.known_broker(node);
        let Some(state) = self.partitions.get_mut(&partition) else {
            return;
        };
        let Some(leader) = state.leader.clone() else { return };
        match address {
            Some(address) => {
                debug!(topic = %self.topic, partition, replica = node, "the leader names a replica to fetch from");
                let replica = Leader {
                    node,
                    address,
                    epoch: leader.epoch,
                };
                state.replica = Some((replica, now + self.settings.metadata_max_age));
            }
            None => self.stale_now(),
        }
    }

    /// The address of broker `node`, from the leaders and replicas known.
    fn known_broker(&self, node: i32) -> Option<String> {
        self.partitions
            .values()
            .filter_map(|s| s.leader.as_ref())
            .find(|l| l.node == node)
            .map(|l| l.address.clone())
            .or_else(|| self.brokers.get(&node).cloned())
    }

    /// Queues `chunk` once `size` bytes fit under the queue's limit.
    async fn deliver(&self, mut chunk: FetchedChunk, size: usize) {
        let permits = size.min(self.settings.queued_max_bytes) as u32;
        // The semaphore is never closed.
        if let Ok(permit) = self.queued.clone().acquire_many_owned(permits).await {
            chunk._queued = Some(permit);
        }
        // A closed channel means the Fetcher is being dropped.
        let _ = self.out.send(Ok(chunk));
    }

    async fn control_answer(&mut self, answer: control::Answer) -> Result<(), WireError> {
        match answer {
            control::Answer::Metadata(result) => self.metadata_answer(result),
            control::Answer::Epochs { leader, asked, result } => self.epochs_answer(&leader, asked, result).await,
            control::Answer::Bounds {
                partition,
                position,
                result,
            } => self.bounds_answer(partition, position, result).await,
        }
    }

    /// Applies a metadata read: the topic's id, every partition's leader.
    fn metadata_answer(&mut self, result: Result<TopicMetadata, WireError>) -> Result<(), WireError> {
        self.metadata.running = false;
        let now = Instant::now();
        let metadata = match result {
            Ok(metadata) => metadata,
            Err(error) if error.broker_error() == Some(ResponseError::UnknownTopicOrPartition) => {
                let since = *self.metadata.missing_since.get_or_insert(now);
                if self.counters.set_missing(&self.topic, true) {
                    warn!(topic = %self.topic, timeout = ?self.settings.missing_topic_timeout, "the topic is missing from the metadata (deleted?); waiting for it");
                }
                debug!(topic = %self.topic, missing_for = ?since.elapsed(), "topic still missing");
                self.metadata_failed(now, "reading the topic's metadata", &error);
                return Ok(());
            }
            Err(error) if error.is_retriable() => {
                self.metadata_failed(now, "reading the topic's metadata", &error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        self.metadata.read_at = now;
        if self.metadata.missing_since.take().is_some() {
            self.counters.set_missing(&self.topic, false);
            info!(topic = %self.topic, "the topic is back in the metadata");
        }
        match (self.topic_id, metadata.topic_id) {
            (Some(was), Some(now)) if was != now => {
                return Err(WireError::TopicRecreated {
                    topic: self.topic.clone(),
                    was,
                    now,
                })
            }
            (None, Some(id)) => self.topic_id = Some(id),
            _ => {}
        }
        self.brokers = metadata.brokers.clone();
        let mut leaderless = Vec::new();
        for (partition, state) in &mut self.partitions {
            let leader = metadata.leader(*partition);
            if leader.is_none() {
                leaderless.push(*partition);
            }
            let was = state.leader.clone();
            if state.lead(leader.clone()) {
                self.counters.leader_changes.fetch_add(1, Ordering::Relaxed);
                info!(
                    topic = %self.topic,
                    partition,
                    was = ?was.map(|l| (l.node, l.epoch)),
                    now = ?leader.map(|l| (l.node, l.epoch)),
                    "the partition's leader changed"
                );
            }
            if state.leader.is_none() {
                self.counters.fetch_from(&self.topic, *partition, None);
            }
        }
        if leaderless.is_empty() {
            self.metadata.stale = false;
            self.metadata.failures = 0;
        } else {
            // Elections take a moment; ask again.
            let problem = format!("partitions {leaderless:?} have no leader (or are missing from the metadata)");
            self.metadata_failed(now, "finding the partitions' leaders", &problem);
        }
        Ok(())
    }

    fn metadata_failed(&mut self, now: Instant, what: &str, error: &dyn std::fmt::Display) {
        self.metadata.stale = true;
        self.metadata.failures += 1;
        self.metadata.retry_at = now + backoff(&self.settings, self.metadata.failures);
        self.transient(self.metadata.failures == 1, what, error);
    }

    /// Applies the leader's answer to epoch checks of `asked` (partition →
    /// (position, epoch)).
    async fn epochs_answer(
        &mut self,
        leader: &str,
        asked: BTreeMap<i32, (i64, i32)>,
        result: Result<BTreeMap<i32, Result<EpochEnd, ResponseError>>, WireError>,
    ) -> Result<(), WireError> {
        let ends = match result {
            Ok(ends) => ends,
            Err(error) if error.is_retriable() => {
                for partition in asked.keys() {
                    if let Some(state) = self.partitions.get_mut(partition) {
                        state.check = Check::Needed;
                    }
                }
                self.failed(asked.keys(), &format!("checking positions at {leader}"), &error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        for (partition, end) in ends {
            let Some(&(position, epoch)) = asked.get(&partition) else {
                continue;
            };
            let Some(state) = self.partitions.get_mut(&partition) else {
                continue;
            };
            if state.check != Check::Running || state.position != position || state.epoch != Some(epoch) {
                continue;
            }
            let end = match end {
                Ok(end) => end,
                Err(code) => {
                    state.check = Check::Needed;
                    let error = WireError::Broker {
                        addr: leader.to_string(),
                        api: ApiKey::OffsetForLeaderEpoch,
                        error: code,
                        message: Some(format!("{}/{partition}", self.topic)),
                    };
                    if !code.is_retriable() && code != ResponseError::UnknownTopicId {
                        return Err(error);
                    }
                    self.failed([&partition], "checking a position", &error);
                    continue;
                }
            };
            match judge(position, end) {
                Checked::Valid => {
                    debug!(topic = %self.topic, partition, position, epoch, ?end, "position checked");
                    state.check = Check::Done;
                    state.checked_under = state.leader.as_ref().map(|l| l.epoch);
                }
                Checked::Truncated { divergence } => {
                    let truncated = WireError::LogTruncated {
                        topic: self.topic.clone(),
                        partition,
                        position,
                        epoch,
                        divergence,
                    };
                    let Some((at, at_epoch)) = resume_at(self.settings.on_truncation, divergence) else {
                        return Err(truncated);
                    };
                    warn!(
                        topic = %self.topic,
                        partition,
                        position,
                        epoch,
                        divergence = at,
                        lost = position - at,
                        "{truncated}; going on at the divergence as the truncation policy says"
                    );
                    self.counters.truncations.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .truncated_offsets
                        .fetch_add(u64::try_from(position - at).unwrap_or(0), Ordering::Relaxed);
                    let state = self.partitions.get_mut(&partition).expect("checked above");
                    state.position = at;
                    state.epoch = Some(at_epoch);
                    state.check = Check::Done;
                    state.checked_under = state.leader.as_ref().map(|l| l.epoch);
                    let chunk = FetchedChunk {
                        partition,
                        records: Vec::new(),
                        next_offset: at,
                        next_epoch: Some(at_epoch),
                        high_watermark: -1,
                        truncation: Some(Truncation {
                            position,
                            epoch,
                            divergence: at,
                            divergence_epoch: at_epoch,
                        }),
                        _queued: None,
                    };
                    self.deliver(chunk, 0).await;
                }
            }
        }
        Ok(())
    }

    /// A partition out of range at `position`, with its bounds. Below the
    /// log's start (retention deleted records not read yet) it continues
    /// where [`FetchSettings::offset_reset`] says, counted and warned
    /// about, or the fetcher stops under [`OffsetReset::Error`]. Past the
    /// log's end the position is checked against the leader's log when it
    /// has an epoch (which finds a truncation and its divergence); without
    /// one, or when that check found no divergence, the fetcher stops:
    /// going back would hand out offsets the consumer has passed already,
    /// and skipping ahead would lose what the new log holds there.
    async fn bounds_answer(
        &mut self,
        partition: i32,
        position: i64,
        result: Result<Bounds, WireError>,
    ) -> Result<(), WireError> {
        let context = format!("{}/{partition}", self.topic);
        let Some(state) = self.partitions.get_mut(&partition) else {
            return Ok(());
        };
        state.resetting = false;
        if state.position != position {
            return Ok(());
        }
        let bounds = match result {
            Ok(bounds) => bounds,
            Err(error) if error.is_retriable() => {
                self.failed([&partition], "looking up an out-of-range partition's bounds", &error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        if position > bounds.end {
            if state.epoch.is_some() && !state.past_end_checked {
                debug!(topic = %self.topic, partition, position, end = bounds.end, "position past the log's end: checking the leader's log");
                state.past_end_checked = true;
                state.check = Check::Needed;
                return Ok(());
            }
            return Err(self.out_of_range(
                &context,
                format!(
                    "its log ends at offset {}, below the position {position} it was read up to: the topic was \
                     recreated, or an unclean leader election truncated it. The positions no longer match the log; \
                     to read the topic anew, start the pipeline under a new `name` or `checkpoint.dir`",
                    bounds.end
                ),
            ));
        }
        if position >= bounds.start {
            // In range again (the log start moved while the answer was on
            // its way): fetch at the position once more.
            self.failed(
                [&partition],
                "fetching",
                &format!("{context}: offset {position} was out of range"),
            );
            return Ok(());
        }
        let continue_at = match self.settings.offset_reset {
            OffsetReset::Earliest => bounds.start,
            OffsetReset::Latest => bounds.stable,
            OffsetReset::Error => {
                return Err(self.out_of_range(
                    &context,
                    format!(
                        "retention deleted offsets {position} to {} before they were read (the log starts at \
                         {}) and auto.offset.reset = error",
                        bounds.start - 1,
                        bounds.start
                    ),
                ))
            }
        };
        self.counters.positions_reset.fetch_add(1, Ordering::Relaxed);
        warn!(
            topic = %self.topic,
            partition,
            position,
            log_start = bounds.start,
            continues_at = continue_at,
            reset = ?self.settings.offset_reset,
            "retention deleted records of the partition before they were read: continuing as auto.offset.reset \
             says; the records in between are not read"
        );
        let state = self.partitions.get_mut(&partition).expect("checked above");
        state.position = continue_at;
        // The epoch of the records skipped says nothing of the new place.
        state.epoch = None;
        state.check = Check::Done;
        Ok(())
    }

    /// The error that stops the fetcher for a partition out of range.
    fn out_of_range(&self, context: &str, problem: String) -> WireError {
        WireError::Broker {
            addr: self.client.config().bootstrap().to_string(),
            api: ApiKey::Fetch,
            error: ResponseError::OffsetOutOfRange,
            message: Some(format!("{context}: {problem}")),
        }
    }

    /// Backs off `partitions` after a retriable `error` and reads the
    /// metadata again (a moved leader is the usual cause).
    fn failed<'a>(&mut self, partitions: impl IntoIterator<Item = &'a i32>, what: &str, error: &dyn std::fmt::Display) {
        let now = Instant::now();
        let mut first = false;
        for partition in partitions {
            let Some(state) = self.partitions.get_mut(partition) else {
                continue;
            };
            state.failed(now, &self.settings);
            first |= state.failures == 1;
        }
        self.stale_now();
        self.transient(first, what, error);
    }

    /// Counts a ridden-out error; logs it as a warning when it starts a
    /// run of failures, at debug level after that.
    fn transient(&self, first: bool, what: &str, error: &dyn std::fmt::Display) {
        self.counters.transient_errors.fetch_add(1, Ordering::Relaxed);
        if first {
            warn!(topic = %self.topic, %error, "{what} failed; retrying");
        } else {
            debug!(topic = %self.topic, %error, "{what} failed again; retrying");
        }
    }
}

impl Drop for Driver {
    /// A fetcher that stops no longer reads its topic: it is not missing,
    /// and its partitions are fetched from nowhere.
    fn drop(&mut self) {
        self.counters.set_missing(&self.topic, false);
        for partition in self.partitions.keys() {
            self.counters.fetch_from(&self.topic, *partition, None);
        }
    }
}

/// Whether a partition's error code in a Fetch answer is retried, as
/// Kafka's consumer does: the codes Kafka calls retriable (a moved leader,
/// a fenced or unknown leader epoch, a partition being created, ...),
/// UNKNOWN_TOPIC_ID (the metadata read then tells a deleted or recreated
/// topic) and UNKNOWN_SERVER_ERROR, but not CORRUPT_MESSAGE (the log holds
/// a corrupt batch: re-reading it gives the same) nor what a setting must
/// fix (authorization).
fn retried(code: ResponseError) -> bool {
    match code {
        ResponseError::CorruptMessage => false,
        ResponseError::UnknownServerError | ResponseError::UnknownTopicId => true,
        other => other.is_retriable(),
    }
}

/// One Fetch to `broker`, on `connection` or a new one, in the highest
/// version of `range` both sides speak. Gives the connection back while it
/// is still good.
async fn fetch(
    broker: &str,
    connection: Option<KafkaConnection>,
    options: &ConnectionOptions,
    range: VersionRange,
    request: &FetchRequest,
) -> (Option<KafkaConnection>, Result<FetchResponse, WireError>) {
    let mut connection = match connection {
        Some(connection) => connection,
        None => match KafkaConnection::connect_with(broker, options).await {
            Ok(connection) => connection,
            Err(error) => return (None, Err(error)),
        },
    };
    let result = match connection.version(ApiKey::Fetch, range) {
        Ok(version) => connection.request(version, request).await,
        Err(error) => Err(error),
    };
    let connection = result.is_ok().then_some(connection);
    (connection, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(partitions: &[(i32, &str)]) -> Driver {
        let (out, _) = mpsc::unbounded_channel();
        let starts = partitions.iter().map(|(p, _)| (*p, FetchPosition::offset(0))).collect();
        let mut driver = Driver::new(
            WireConfig::new("127.0.0.1:9").unwrap(),
            "t",
            starts,
            None,
            FetchSettings::default(),
            Arc::default(),
            out,
        );
        for (p, leader) in partitions {
            driver.partitions.get_mut(p).unwrap().leader = Some(Leader {
                node: leader.as_bytes()[0] as i32,
                address: leader.to_string(),
                epoch: 0,
            });
        }
        driver.metadata.stale = false;
        driver
    }

    #[test]
    fn each_brokers_partitions_come_first_in_turn_whatever_the_other_brokers_do() {
        let mut driver = driver(&[(0, "a"), (1, "b"), (2, "a"), (3, "b")]);
        let mut firsts = Vec::new();
        for _ in 0..4 {
            // Brokers answer in turn, as they do with one Fetch in flight each.
            for leader in ["a", "b"] {
                let mut partitions: Vec<i32> = driver
                    .partitions
                    .iter()
                    .filter(|(_, s)| s.leader.as_ref().map(|l| l.address.as_str()) == Some(leader))
                    .map(|(p, _)| *p)
                    .collect();
                driver.take_turns(leader, &mut partitions);
                firsts.push(partitions[0]);
            }
        }
        assert_eq!(firsts, [0, 1, 2, 3, 0, 1, 2, 3]);
    }

    #[test]
    fn a_partition_waiting_for_its_busy_broker_does_not_wake_the_loop() {
        let mut driver = driver(&[(0, "a"), (1, "a"), (2, "b")]);
        let now = Instant::now();
        driver.metadata.read_at = now;
        let past = now - Duration::from_millis(10);
        driver.partitions.get_mut(&0).unwrap().retry_at = Some(past);
        driver.partitions.get_mut(&1).unwrap().in_flight = Some(1);
        driver.busy.insert("a".into(), InFlight { sent: now });
        let metadata_due = driver.next_wake().expect("the metadata's age or the overdue Fetch");
        assert!(
            metadata_due >= now + Duration::from_millis(500),
            "broker a's answer wakes the loop; no spinning until then"
        );
        let soon = Instant::now() + Duration::from_millis(50);
        driver.partitions.get_mut(&2).unwrap().retry_at = Some(soon);
        assert_eq!(driver.next_wake(), Some(soon));
    }

    #[tokio::test]
    async fn the_metadata_is_read_again_once_older_than_its_max_age_with_no_error_before() {
        let mut driver = driver(&[(0, "a"), (1, "b")]);
        driver.settings.metadata_max_age = Duration::from_secs(5);
        let now = Instant::now();
        driver.metadata.read_at = now - Duration::from_secs(4);
        driver.read_metadata();
        assert!(
            !driver.metadata.running,
            "younger than metadata.max.age.ms, not stale, no Fetch overdue: nothing to read"
        );
        let wake = driver.next_wake().expect("the metadata's age wakes the loop");
        assert!(
            wake <= now + Duration::from_secs(1),
            "the loop wakes when the metadata comes of age, not later"
        );
        driver.metadata.read_at = now - Duration::from_secs(5);
        driver.read_metadata();
        assert!(
            driver.metadata.running,
            "older than metadata.max.age.ms: read again (a leader moved by a preferred election is found \
             without any error to say so)"
        );
    }

    #[test]
    fn the_control_path_is_asked_of_a_broker_without_an_overdue_fetch() {
        let mut driver = driver(&[(0, "a"), (1, "b")]);
        let now = Instant::now();
        driver.answered.insert("a".into(), now);
        driver.answered.insert("b".into(), now - Duration::from_secs(1));
        assert_eq!(driver.responsive_broker(now).as_deref(), Some("a"));
        driver.busy.insert(
            "a".into(),
            InFlight {
                sent: now - Duration::from_secs(30),
            },
        );
        assert_eq!(
            driver.overdue(now).into_iter().collect::<Vec<_>>(),
            ["a"],
            "a Fetch far past its wait"
        );
        assert_eq!(driver.responsive_broker(now).as_deref(), Some("b"));
    }
}
