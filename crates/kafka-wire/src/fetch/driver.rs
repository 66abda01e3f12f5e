//! The task behind a [`Fetcher`](super::Fetcher): one Fetch in flight per
//! partition leader, answers turned into chunks, errors into retries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};
use tracing::{debug, info, warn};

use super::partition::read_partition;
use super::settings::{FetchSettings, OffsetReset};
use super::{Command, FetchCounters, FetchedChunk};
use crate::config::{ConnectionOptions, WireConfig};
use crate::connection::KafkaConnection;
use crate::consumer_client::{ConsumerClient, OffsetSpec};
use crate::error::WireError;
use crate::reader::FETCH;

/// Isolation level read_committed: records up to the last stable offset,
/// with the aborted transactions among them listed.
const READ_COMMITTED: i8 = 1;

/// Where the task stands with one partition.
#[derive(Debug)]
struct PartitionState {
    /// The next offset to fetch.
    position: i64,
    /// Bytes it may contribute to an answer; raised after an answer cut
    /// its next batch.
    max_bytes: i32,
    /// Its leader's address, once metadata named one.
    leader: Option<String>,
    /// Part of the Fetch in flight.
    in_flight: bool,
    /// Failures in a row (reset by an answer for it).
    failures: u32,
    /// Not fetched again before then, after a failure.
    retry_at: Option<Instant>,
}

/// The topic's metadata: whether it must be read again, and when.
#[derive(Debug)]
struct MetadataState {
    stale: bool,
    retry_at: Instant,
    failures: u32,
}

/// A Fetch that came back (or failed), with the connection it used when
/// that is still good.
struct Answer {
    leader: String,
    connection: Option<KafkaConnection>,
    /// The partitions asked for, with the offset each was asked at.
    asked: BTreeMap<i32, i64>,
    result: Result<FetchResponse, WireError>,
}

pub(super) struct Driver {
    topic: String,
    topic_name: TopicName,
    settings: FetchSettings,
    options: ConnectionOptions,
    client: ConsumerClient,
    partitions: BTreeMap<i32, PartitionState>,
    /// Connections with no Fetch in flight, by leader address.
    idle: BTreeMap<String, KafkaConnection>,
    /// Leaders with a Fetch in flight.
    busy: BTreeSet<String>,
    in_flight: JoinSet<Answer>,
    metadata: MetadataState,
    /// Per leader, turns the order of its partitions in a request, so each
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
        partitions: BTreeMap<i32, i64>,
        settings: FetchSettings,
        counters: Arc<FetchCounters>,
        out: mpsc::UnboundedSender<Result<FetchedChunk, WireError>>,
    ) -> Driver {
        let partitions = partitions
            .into_iter()
            .map(|(partition, position)| (partition, PartitionState::new(position, &settings)))
            .collect();
        Driver {
            topic: topic.to_string(),
            topic_name: TopicName(StrBytes::from_string(topic.to_string())),
            queued: Arc::new(Semaphore::new(settings.queued_max_bytes)),
            settings,
            options: config.options.clone(),
            client: ConsumerClient::new(config),
            partitions,
            idle: BTreeMap::new(),
            busy: BTreeSet::new(),
            in_flight: JoinSet::new(),
            metadata: MetadataState {
                stale: true,
                retry_at: Instant::now(),
                failures: 0,
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
            if self.metadata.stale && Instant::now() >= self.metadata.retry_at {
                self.refresh_metadata().await?;
            }
            self.launch();
            let wake = self.next_wake();
            tokio::select! {
                command = commands.recv() => match command {
                    None => return Ok(()),
                    Some(Command::Add { partition, offset }) => self.add(partition, offset),
                },
                Some(done) = self.in_flight.join_next(), if !self.in_flight.is_empty() => match done {
                    Ok(answer) => self.answer(answer).await?,
                    Err(error) => {
                        warn!(topic = %self.topic, %error, "a Fetch task failed");
                        return Err(WireError::FetcherStopped { topic: self.topic.clone() });
                    }
                },
                _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            }
        }
    }

    fn add(&mut self, partition: i32, offset: i64) {
        if self.partitions.contains_key(&partition) {
            return;
        }
        debug!(topic = %self.topic, partition, offset, "fetching a partition added");
        self.partitions
            .insert(partition, PartitionState::new(offset, &self.settings));
        self.metadata.stale = true;
        self.metadata.retry_at = Instant::now();
    }

    /// Reads the leaders of every partition. Retried with backoff; only
    /// what no retry cures is an error.
    async fn refresh_metadata(&mut self) -> Result<(), WireError> {
        let metadata = match self.client.topic_metadata(&self.topic).await {
            Ok(metadata) => metadata,
            Err(error) if error.is_retriable() => {
                self.metadata.failures += 1;
                self.metadata.retry_at = Instant::now() + self.backoff(self.metadata.failures);
                self.transient(self.metadata.failures == 1, "reading the topic's metadata", &error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        let mut leaderless = Vec::new();
        for (partition, state) in &mut self.partitions {
            state.leader = metadata.leader_address(*partition).map(str::to_string);
            if state.leader.is_none() {
                leaderless.push(*partition);
            }
        }
        if leaderless.is_empty() {
            self.metadata.stale = false;
            self.metadata.failures = 0;
        } else {
            // Elections take a moment; ask again.
            self.metadata.failures += 1;
            self.metadata.retry_at = Instant::now() + self.backoff(self.metadata.failures);
            let problem = format!("partitions {leaderless:?} have no leader (or are missing from the metadata)");
            self.transient(self.metadata.failures == 1, "finding the partitions' leaders", &problem);
        }
        Ok(())
    }

    /// Sends a Fetch to every leader without one in flight that leads a
    /// partition ready to be fetched.
    fn launch(&mut self) {
        let now = Instant::now();
        let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (partition, state) in &self.partitions {
            let ready = !state.in_flight && state.retry_at.is_none_or(|at| at <= now);
            if let (true, Some(leader)) = (ready, &state.leader) {
                if !self.busy.contains(leader) {
                    by_leader.entry(leader.clone()).or_default().push(*partition);
                }
            }
        }
        for (leader, mut partitions) in by_leader {
            self.take_turns(&leader, &mut partitions);
            let mut asked = BTreeMap::new();
            let wanted: Vec<FetchPartition> = partitions
                .iter()
                .map(|partition| {
                    let state = self.partitions.get_mut(partition).expect("listed above");
                    state.in_flight = true;
                    asked.insert(*partition, state.position);
                    FetchPartition::default()
                        .with_partition(*partition)
                        .with_fetch_offset(state.position)
                        .with_partition_max_bytes(state.max_bytes)
                        .with_current_leader_epoch(-1)
                        .with_last_fetched_epoch(-1)
                        .with_log_start_offset(-1)
                })
                .collect();
            let request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(self.settings.max_wait.as_millis().min(i32::MAX as u128) as i32)
                .with_min_bytes(self.settings.min_bytes)
                .with_max_bytes(self.settings.max_bytes)
                .with_isolation_level(READ_COMMITTED)
                .with_session_id(0)
                .with_session_epoch(-1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(self.topic_name.clone())
                    .with_partitions(wanted)]);
            self.busy.insert(leader.clone());
            let connection = self.idle.remove(&leader);
            let options = self.options.clone();
            self.in_flight.spawn(async move {
                let (connection, result) = fetch(&leader, connection, &options, &request).await;
                Answer {
                    leader,
                    connection,
                    asked,
                    result,
                }
            });
        }
    }

    /// Puts `partitions` of `leader` in the order of its next request: each
    /// of them first in turn.
    fn take_turns(&mut self, leader: &str, partitions: &mut [i32]) {
        let turn = self.rotation.entry(leader.to_string()).or_default();
        partitions.rotate_left(*turn % partitions.len().max(1));
        *turn = turn.wrapping_add(1);
    }

    /// The earliest moment a partition or the metadata waits for. A
    /// partition whose leader has a Fetch in flight waits for its answer,
    /// which wakes the loop anyway.
    fn next_wake(&self) -> Option<Instant> {
        let now = Instant::now();
        let partitions = self
            .partitions
            .values()
            .filter(|state| !state.in_flight)
            .filter(|state| state.leader.as_ref().is_some_and(|leader| !self.busy.contains(leader)))
            .filter_map(|state| state.retry_at)
            .filter(|at| *at > now);
        let metadata = self.metadata.stale.then_some(self.metadata.retry_at);
        partitions.chain(metadata).min()
    }

    async fn answer(&mut self, answer: Answer) -> Result<(), WireError> {
        self.busy.remove(&answer.leader);
        for partition in answer.asked.keys() {
            if let Some(state) = self.partitions.get_mut(partition) {
                state.in_flight = false;
            }
        }
        let response = match answer.result {
            Ok(response) => response,
            Err(error) if error.is_retriable() => {
                self.failed(answer.asked.keys(), &format!("fetching from {}", answer.leader), &error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        if let Some(connection) = answer.connection {
            self.idle.insert(answer.leader.clone(), connection);
        }
        if let Some(error) = ResponseError::try_from_code(response.error_code) {
            let error = WireError::Broker {
                addr: answer.leader.clone(),
                api: ApiKey::Fetch,
                error,
                message: None,
            };
            if !error.is_retriable() {
                return Err(error);
            }
            self.failed(answer.asked.keys(), "fetching", &error);
            return Ok(());
        }
        let data: Vec<PartitionData> = response
            .responses
            .into_iter()
            .filter(|topic| topic.topic == self.topic_name)
            .flat_map(|topic| topic.partitions)
            .collect();
        for data in data {
            if let Some(&asked_at) = answer.asked.get(&data.partition_index) {
                self.partition_answer(&answer.leader, asked_at, data).await?;
            }
        }
        Ok(())
    }

    /// One partition's part of an answer to a Fetch at `asked_at`.
    async fn partition_answer(&mut self, leader: &str, asked_at: i64, data: PartitionData) -> Result<(), WireError> {
        let partition = data.partition_index;
        let context = format!("{}/{partition} at offset {asked_at}", self.topic);
        let Some(state) = self.partitions.get_mut(&partition) else {
            return Ok(());
        };
        if state.position != asked_at {
            return Ok(());
        }
        match ResponseError::try_from_code(data.error_code) {
            None => {}
            Some(ResponseError::OffsetOutOfRange) => return self.reset(partition, asked_at).await,
            Some(code) => {
                let error = WireError::Broker {
                    addr: leader.to_string(),
                    api: ApiKey::Fetch,
                    error: code,
                    message: Some(context),
                };
                if !retried(code) {
                    return Err(error);
                }
                self.failed([&partition], "fetching", &error);
                return Ok(());
            }
        }
        let raw = data.records.unwrap_or_default();
        let size = raw.len();
        let aborted = data
            .aborted_transactions
            .unwrap_or_default()
            .into_iter()
            .map(|t| (t.producer_id.0, t.first_offset));
        let read = read_partition(asked_at, raw, aborted).map_err(|message| WireError::Protocol {
            addr: leader.to_string(),
            message: format!("{context}: {message}"),
        })?;
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
        state.position = read.next;
        let chunk = FetchedChunk {
            partition,
            records: read.records,
            next_offset: read.next,
            high_watermark: data.high_watermark,
            _queued: None,
        };
        self.deliver(chunk, size).await;
        Ok(())
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

    /// A partition whose position is out of range. Below the log's start
    /// (retention deleted records not read yet) it continues where
    /// [`FetchSettings::offset_reset`] says, counted and warned about, or
    /// the fetcher stops under [`OffsetReset::Error`]. Past the log's end
    /// (the topic was recreated, or an unclean leader election truncated
    /// the log) the fetcher stops whatever the setting: going back would
    /// hand out offsets the consumer has passed already, and skipping ahead
    /// would lose what the new log holds there.
    async fn reset(&mut self, partition: i32, position: i64) -> Result<(), WireError> {
        let context = format!("{}/{partition}", self.topic);
        let bounds = async {
            let start = self
                .client
                .list_offsets(&self.topic, &[partition], OffsetSpec::Earliest)
                .await?;
            let end = self
                .client
                .list_offsets(&self.topic, &[partition], OffsetSpec::Latest)
                .await?;
            Ok::<_, WireError>((
                start.get(&partition).copied().flatten(),
                end.get(&partition).copied().flatten(),
            ))
        };
        let (start, end) = match bounds.await {
            Ok((Some(start), Some(end))) => (start, end),
            Ok(_) => return Err(self.out_of_range(&context, "the broker names no bounds for it".into())),
            Err(error) if error.is_retriable() => {
                self.failed([&partition], "looking up an out-of-range partition's bounds", &error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        if position > end {
            return Err(self.out_of_range(
                &context,
                format!(
                    "its log ends at offset {end}, below the position {position} it was read up to: the topic was \
                     recreated, or an unclean leader election truncated it. The positions no longer match the log; \
                     to read the topic anew, start the pipeline under a new `name` or `checkpoint.dir`"
                ),
            ));
        }
        if position >= start {
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
            OffsetReset::Earliest => start,
            OffsetReset::Latest => {
                match self
                    .client
                    .list_offsets(&self.topic, &[partition], OffsetSpec::LastStable)
                    .await
                {
                    Ok(found) => found.get(&partition).copied().flatten().unwrap_or(end),
                    Err(error) if error.is_retriable() => {
                        self.failed([&partition], "looking up an out-of-range partition's end", &error);
                        return Ok(());
                    }
                    Err(error) => return Err(error),
                }
            }
            OffsetReset::Error => {
                return Err(self.out_of_range(
                    &context,
                    format!(
                        "retention deleted offsets {position} to {} before they were read (the log starts at \
                         {start}) and auto.offset.reset = error",
                        start - 1
                    ),
                ))
            }
        };
        self.counters.positions_reset.fetch_add(1, Ordering::Relaxed);
        warn!(
            topic = %self.topic,
            partition,
            position,
            log_start = start,
            continues_at = continue_at,
            reset = ?self.settings.offset_reset,
            "retention deleted records of the partition before they were read: continuing as auto.offset.reset \
             says; the records in between are not read"
        );
        let state = self
            .partitions
            .get_mut(&partition)
            .expect("asked for a known partition");
        state.position = continue_at;
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
            state.failures += 1;
            first |= state.failures == 1;
            let pause = backoff(&self.settings, state.failures);
            state.retry_at = Some(now + pause);
        }
        self.metadata.stale = true;
        self.metadata.retry_at = self.metadata.retry_at.max(now);
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

    fn backoff(&self, failures: u32) -> std::time::Duration {
        backoff(&self.settings, failures)
    }
}

impl PartitionState {
    fn new(position: i64, settings: &FetchSettings) -> PartitionState {
        PartitionState {
            position,
            max_bytes: settings.partition_max_bytes,
            leader: None,
            in_flight: false,
            failures: 0,
            retry_at: None,
        }
    }
}

/// Whether a partition's error code in a Fetch answer is retried, as
/// Kafka's consumer does: the codes Kafka calls retriable (a moved leader,
/// a partition being created, ...) and UNKNOWN_SERVER_ERROR, but not
/// CORRUPT_MESSAGE (the log holds a corrupt batch: re-reading it gives the
/// same) nor what a setting must fix (authorization).
fn retried(code: ResponseError) -> bool {
    match code {
        ResponseError::CorruptMessage => false,
        ResponseError::UnknownServerError => true,
        other => other.is_retriable(),
    }
}

/// The pause after `failures` failures in a row: the first backoff,
/// doubled each time, at most the longest.
fn backoff(settings: &FetchSettings, failures: u32) -> std::time::Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (settings.backoff * 2u32.pow(doublings)).min(settings.max_backoff)
}

/// One Fetch to `leader`, on `connection` or a new one. Gives the
/// connection back while it is still good.
async fn fetch(
    leader: &str,
    connection: Option<KafkaConnection>,
    options: &ConnectionOptions,
    request: &FetchRequest,
) -> (Option<KafkaConnection>, Result<FetchResponse, WireError>) {
    let mut connection = match connection {
        Some(connection) => connection,
        None => match KafkaConnection::connect_with(leader, options).await {
            Ok(connection) => connection,
            Err(error) => return (None, Err(error)),
        },
    };
    let result = match connection.version(ApiKey::Fetch, FETCH) {
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
        let starts = partitions.iter().map(|(p, _)| (*p, 0)).collect();
        let mut driver = Driver::new(
            WireConfig::new("127.0.0.1:9").unwrap(),
            "t",
            starts,
            FetchSettings::default(),
            Arc::default(),
            out,
        );
        for (p, leader) in partitions {
            driver.partitions.get_mut(p).unwrap().leader = Some(leader.to_string());
        }
        driver.metadata.stale = false;
        driver
    }

    #[test]
    fn each_leaders_partitions_come_first_in_turn_whatever_the_other_leaders_do() {
        let mut driver = driver(&[(0, "a"), (1, "b"), (2, "a"), (3, "b")]);
        let mut firsts = Vec::new();
        for _ in 0..4 {
            // Leaders answer in turn, as they do with one Fetch in flight each.
            for leader in ["a", "b"] {
                let mut partitions: Vec<i32> = driver
                    .partitions
                    .iter()
                    .filter(|(_, s)| s.leader.as_deref() == Some(leader))
                    .map(|(p, _)| *p)
                    .collect();
                driver.take_turns(leader, &mut partitions);
                firsts.push(partitions[0]);
            }
        }
        assert_eq!(firsts, [0, 1, 2, 3, 0, 1, 2, 3]);
    }

    #[test]
    fn a_partition_waiting_for_its_busy_leader_does_not_wake_the_loop() {
        let mut driver = driver(&[(0, "a"), (1, "a"), (2, "b")]);
        let past = Instant::now() - std::time::Duration::from_millis(10);
        driver.partitions.get_mut(&0).unwrap().retry_at = Some(past);
        driver.partitions.get_mut(&1).unwrap().in_flight = true;
        driver.busy.insert("a".into());
        assert_eq!(
            driver.next_wake(),
            None,
            "leader a's answer wakes the loop; no spinning until then"
        );
        let soon = Instant::now() + std::time::Duration::from_millis(50);
        driver.partitions.get_mut(&2).unwrap().retry_at = Some(soon);
        assert_eq!(driver.next_wake(), Some(soon));
    }

    #[test]
    fn backoff_doubles_up_to_the_longest() {
        let settings = FetchSettings::default();
        let pauses: Vec<u128> = (1..=6).map(|n| backoff(&settings, n).as_millis()).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(&settings, u32::MAX), settings.max_backoff);
    }
}
