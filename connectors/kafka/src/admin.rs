//! Test and demo support: create topics, add partitions, produce records and
//! read a topic back, with plain clients (no exactly-once machinery).
//!
//! ```no_run
//! # async fn demo() -> Result<(), exactly_kafka::admin::AdminError> {
//! use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
//! let admin = KafkaAdmin::new("127.0.0.1:9092");
//! admin.create_topic("orders", 3).await?;
//! admin.produce("orders", (0..10).map(|i| ProduceRecord::new(format!("order-{i}")))).await?;
//! let records = admin.read_all("orders").await?;
//! assert_eq!(records.len(), 10);
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use exactly_core::Record;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::client::client_config;
use crate::source::split_name;

/// How long one admin request, delivery or read may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// An admin operation failed.
#[derive(Debug, thiserror::Error)]
#[error("{action} on Kafka `{bootstrap}`: {message}")]
pub struct AdminError {
    /// What was attempted (`creating topic orders`, ...).
    pub action: String,
    /// The bootstrap servers.
    pub bootstrap: String,
    /// What went wrong.
    pub message: String,
}

/// One record to produce.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProduceRecord {
    /// Target partition; `None` lets the producer's partitioner choose (by key).
    pub partition: Option<i32>,
    /// Optional key.
    pub key: Option<Vec<u8>>,
    /// Value bytes; `None` produces a null value (a tombstone).
    pub value: Option<Vec<u8>>,
    /// Create time in Unix milliseconds; `None` = now.
    pub timestamp_ms: Option<i64>,
    /// Headers, in order; a `None` value is a null header value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl ProduceRecord {
    /// A record with only a value.
    pub fn new(value: impl Into<Vec<u8>>) -> Self {
        ProduceRecord {
            value: Some(value.into()),
            ..ProduceRecord::default()
        }
    }

    /// A record with a null value (a tombstone); give it a key.
    pub fn tombstone() -> Self {
        ProduceRecord::default()
    }

    /// Sends it to `partition`.
    pub fn to_partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Sets the key.
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the create time.
    pub fn at(mut self, timestamp_ms: i64) -> Self {
        self.timestamp_ms = Some(timestamp_ms);
        self
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), Some(value.into())));
        self
    }

    /// Adds a header with a null value.
    pub fn with_null_header(mut self, name: impl Into<String>) -> Self {
        self.headers.push((name.into(), None));
        self
    }
}

/// Plain Kafka clients for one cluster.
#[derive(Clone, Debug)]
pub struct KafkaAdmin {
    bootstrap: String,
    properties: BTreeMap<String, String>,
}

impl KafkaAdmin {
    /// Clients for the brokers `bootstrap` (`HOST:PORT[,...]`).
    pub fn new(bootstrap: impl Into<String>) -> Self {
        KafkaAdmin {
            bootstrap: bootstrap.into(),
            properties: BTreeMap::new(),
        }
    }

    /// Adds a librdkafka setting to every client this creates, e.g.
    /// `("compression.type", "lz4")`.
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// The bootstrap servers.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    fn error(&self, action: impl Into<String>, message: impl ToString) -> AdminError {
        AdminError {
            action: action.into(),
            bootstrap: self.bootstrap.clone(),
            message: message.to_string(),
        }
    }

    fn config(&self) -> ClientConfig {
        client_config(&self.bootstrap, &self.properties)
    }

    fn admin_client(&self, action: &str) -> Result<(AdminClient<DefaultClientContext>, AdminOptions), AdminError> {
        let client = self.config().create().map_err(|e| self.error(action, e))?;
        let options = AdminOptions::new()
            .request_timeout(Some(TIMEOUT))
            .operation_timeout(Some(TIMEOUT));
        Ok((client, options))
    }

    /// Creates `topic` with `partitions` partitions (replication factor 1) and
    /// waits until its metadata shows them. An existing topic is an error.
    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), AdminError> {
        self.create_topic_with(topic, partitions, &[]).await
    }

    /// Like [`create_topic`](Self::create_topic), with topic settings
    /// (`[("cleanup.policy", "compact")]`).
    pub async fn create_topic_with(
        &self,
        topic: &str,
        partitions: i32,
        settings: &[(&str, &str)],
    ) -> Result<(), AdminError> {
        let action = format!("creating topic {topic} with {partitions} partitions");
        let (client, options) = self.admin_client(&action)?;
        let new = settings.iter().fold(
            NewTopic::new(topic, partitions, TopicReplication::Fixed(1)),
            |new, (key, value)| new.set(key, value),
        );
        let results = client.create_topics([&new], &options).await;
        check_results(results).map_err(|e| self.error(&action, e))?;
        self.await_partitions(topic, partitions as usize, &action).await
    }

    /// Deletes `topic` and waits until its metadata no longer shows it (a
    /// topic of the same name may be created again then).
    pub async fn delete_topic(&self, topic: &str) -> Result<(), AdminError> {
        let action = format!("deleting topic {topic}");
        let (client, options) = self.admin_client(&action)?;
        let results = client.delete_topics(&[topic], &options).await;
        check_results(results).map_err(|e| self.error(&action, e))?;
        let deadline = std::time::Instant::now() + TIMEOUT;
        while !self.partitions(topic).await?.is_empty() {
            if std::time::Instant::now() > deadline {
                return Err(self.error(&action, "the topic is still in the metadata"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Grows `topic` to `total` partitions (Kafka's CreatePartitions) and waits
    /// until its metadata shows them.
    pub async fn create_partitions(&self, topic: &str, total: usize) -> Result<(), AdminError> {
        let action = format!("growing topic {topic} to {total} partitions");
        let (client, options) = self.admin_client(&action)?;
        let new = NewPartitions::new(topic, total);
        let results = client.create_partitions([&new], &options).await;
        check_results(results).map_err(|e| self.error(&action, e))?;
        self.await_partitions(topic, total, &action).await
    }

    /// The partitions of `topic` as the metadata reports them now.
    pub async fn partitions(&self, topic: &str) -> Result<BTreeSet<i32>, AdminError> {
        let action = format!("reading the partitions of {topic}");
        let consumer = self.plain_consumer(&action, "read_committed")?;
        let topic = topic.to_string();
        let found = tokio::task::spawn_blocking(move || -> Result<BTreeSet<i32>, KafkaError> {
            let metadata = consumer.fetch_metadata(Some(&topic), TIMEOUT)?;
            let t = metadata.topics().iter().find(|t| t.name() == topic);
            match t {
                Some(t) if t.error().is_none() => Ok(t.partitions().iter().map(|p| p.id()).collect()),
                _ => Ok(BTreeSet::new()),
            }
        })
        .await
        .map_err(|e| self.error(&action, e))?;
        found.map_err(|e| self.error(&action, e))
    }

    /// The id of the cluster the brokers belong to, as their metadata
    /// reports it (what the source records in its positions).
    pub async fn cluster_id(&self) -> Result<String, AdminError> {
        let action = "reading the cluster id";
        let consumer = self.plain_consumer(action, "read_committed")?;
        let found = tokio::task::spawn_blocking(move || consumer.client().fetch_cluster_id(TIMEOUT))
            .await
            .map_err(|e| self.error(action, e))?;
        found.ok_or_else(|| self.error(action, format!("the brokers reported none within {TIMEOUT:?}")))
    }

    async fn await_partitions(&self, topic: &str, count: usize, action: &str) -> Result<(), AdminError> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let found = self.partitions(topic).await?;
            if found.len() >= count {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.error(action, format!("the metadata still shows {} partitions", found.len())));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Produces `records` to `topic` with an idempotent producer
    /// (`enable.idempotence=true`, `acks=all`) and waits for every delivery.
    /// Returns the (partition, offset) of each record, in order.
    pub async fn produce(
        &self,
        topic: &str,
        records: impl IntoIterator<Item = ProduceRecord>,
    ) -> Result<Vec<(i32, i64)>, AdminError> {
        let action = format!("producing to {topic}");
        let producer: FutureProducer = self
            .config()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", TIMEOUT.as_millis().to_string())
            .create()
            .map_err(|e| self.error(&action, e))?;
        let mut pending = Vec::new();
        for r in records {
            let mut record = FutureRecord::<[u8], [u8]>::to(topic);
            if let Some(value) = &r.value {
                record = record.payload(value);
            }
            if let Some(key) = &r.key {
                record = record.key(key);
            }
            if let Some(p) = r.partition {
                record = record.partition(p);
            }
            if let Some(ts) = r.timestamp_ms {
                record = record.timestamp(ts);
            }
            if !r.headers.is_empty() {
                let headers = r.headers.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
                    h.insert(Header {
                        key,
                        value: value.as_deref(),
                    })
                });
                record = record.headers(headers);
            }
            // Queued now; delivered in order per partition (idempotence).
            pending.push(producer.send_result(record).map_err(|(e, _)| self.error(&action, e))?);
        }
        let mut delivered = Vec::with_capacity(pending.len());
        for delivery in pending {
            let d = delivery
                .await
                .map_err(|_| self.error(&action, "the producer was dropped"))?
                .map_err(|(e, _)| self.error(&action, e))?;
            delivered.push((d.partition, d.offset));
        }
        Ok(delivered)
    }

    /// The offsets `group` committed for `topic` (partitions without a
    /// committed offset are left out).
    pub async fn committed(&self, group: &str, topic: &str) -> Result<BTreeMap<i32, i64>, AdminError> {
        let action = format!("reading the offsets of group {group} for {topic}");
        let partitions = self.partitions(topic).await?;
        let consumer: BaseConsumer = self
            .config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| self.error(&action, e))?;
        let topic = topic.to_string();
        let found = tokio::task::spawn_blocking(move || -> Result<BTreeMap<i32, i64>, KafkaError> {
            let mut list = TopicPartitionList::new();
            for p in partitions {
                list.add_partition(&topic, p);
            }
            let committed = consumer.committed_offsets(list, TIMEOUT)?;
            Ok(committed
                .elements()
                .iter()
                .filter_map(|e| e.offset().to_raw().filter(|o| *o >= 0).map(|o| (e.partition(), o)))
                .collect())
        })
        .await
        .map_err(|e| self.error(&action, e))?;
        found.map_err(|e| self.error(&action, e))
    }

    /// A consumer for explicit assignments. librdkafka wants a group for
    /// `assign`; nothing is ever committed to it.
    fn plain_consumer(&self, action: &str, isolation: &str) -> Result<BaseConsumer, AdminError> {
        self.config()
            .set("group.id", "exactly-admin-reader")
            .set("isolation.level", isolation)
            .set("enable.partition.eof", "true")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| self.error(action, e))
    }

    /// Every committed record of `topic` (read_committed, from the beginning to
    /// the end of each partition), ordered by partition and offset.
    pub async fn read_all(&self, topic: &str) -> Result<Vec<Record>, AdminError> {
        self.read(topic, "read_committed").await
    }

    /// Like [`read_all`](Self::read_all) with read_uncommitted: includes records
    /// of open and aborted transactions.
    pub async fn read_all_uncommitted(&self, topic: &str) -> Result<Vec<Record>, AdminError> {
        self.read(topic, "read_uncommitted").await
    }

    async fn read(&self, topic: &str, isolation: &str) -> Result<Vec<Record>, AdminError> {
        let action = format!("reading {topic} ({isolation})");
        let partitions = self.partitions(topic).await?;
        if partitions.is_empty() {
            return Err(self.error(&action, "the topic does not exist"));
        }
        let consumer = self.plain_consumer(&action, isolation)?;
        let topic = topic.to_string();
        let read = tokio::task::spawn_blocking(move || -> Result<Vec<Record>, String> {
            let mut list = TopicPartitionList::new();
            for &p in &partitions {
                list.add_partition_offset(&topic, p, Offset::Beginning)
                    .map_err(|e| e.to_string())?;
            }
            consumer.assign(&list).map_err(|e| e.to_string())?;
            let mut at_end = BTreeSet::new();
            let mut records = Vec::new();
            let deadline = Instant::now() + TIMEOUT;
            while at_end.len() < partitions.len() {
                if Instant::now() > deadline {
                    return Err(format!(
                        "partitions {at_end:?} of {partitions:?} reached their end in time"
                    ));
                }
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => records.push(record_of(&m)),
                    Some(Err(KafkaError::PartitionEOF(p))) => {
                        at_end.insert(p);
                    }
                    Some(Err(e)) => tracing::debug!(error = %e, "read_all: transient error"),
                    None => {}
                }
            }
            Ok(records)
        })
        .await
        .map_err(|e| self.error(&action, e))?;
        let mut records = read.map_err(|e| self.error(&action, e))?;
        records.sort_by(|a, b| (a.topic_partition(), a.offset).cmp(&(b.topic_partition(), b.offset)));
        Ok(records)
    }
}

/// A consumed message as a [`Record`] of split `<topic>-<partition>`, null
/// values (and null header values) kept null.
fn record_of(message: &BorrowedMessage<'_>) -> Record {
    Record {
        split: split_name(message.topic(), message.partition()).into(),
        offset: message.offset(),
        key: message.key().map(Bytes::copy_from_slice),
        value: message.payload().map(Bytes::copy_from_slice),
        timestamp_ms: message.timestamp().to_millis(),
        headers: message.headers().map_or_else(Vec::new, |h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        }),
    }
}

fn check_results(results: Result<Vec<rdkafka::admin::TopicResult>, KafkaError>) -> Result<(), String> {
    for result in results.map_err(|e| e.to_string())? {
        if let Err((name, code)) = result {
            return Err(format!("{name}: {code}"));
        }
    }
    Ok(())
}
