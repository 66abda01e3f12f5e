//! Glue between librdkafka and the source: client settings, the callback
//! context (logging, error counting, commit results) and error classification.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use exactly_core::{ConnectorError, Record, SplitName};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};

use crate::source::split_name;

/// Counters of a Kafka source, shared by all its subtasks (and by every run of
/// the pipeline that uses the same factory). Read through
/// [`crate::KafkaSourceFactory::metrics`].
#[derive(Debug, Default)]
pub(crate) struct KafkaSourceMetrics {
    transient_errors: AtomicU64,
    group_commits: AtomicU64,
    group_commit_failures: AtomicU64,
    partitions_discovered: AtomicU64,
}

/// A point-in-time copy of a Kafka source's counters, from
/// [`crate::KafkaSourceFactory::metrics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KafkaSourceMetricsSnapshot {
    /// Non-fatal client errors (broker down, connection refused, timeouts...).
    /// librdkafka retries them by itself; each was logged with `tracing::warn`.
    pub transient_errors: u64,
    /// Successful commits of checkpointed offsets to the consumer group.
    pub group_commits: u64,
    /// Failed commits to the consumer group (best effort: only logged).
    pub group_commit_failures: u64,
    /// Partitions picked up by partition discovery after the start.
    pub partitions_discovered: u64,
}

impl KafkaSourceMetrics {
    /// Reads every counter.
    pub(crate) fn snapshot(&self) -> KafkaSourceMetricsSnapshot {
        KafkaSourceMetricsSnapshot {
            transient_errors: self.transient_errors.load(Ordering::Relaxed),
            group_commits: self.group_commits.load(Ordering::Relaxed),
            group_commit_failures: self.group_commit_failures.load(Ordering::Relaxed),
            partitions_discovered: self.partitions_discovered.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn add_discovered(&self, n: u64) {
        self.partitions_discovered.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn committed(&self, ok: bool) {
        let counter = if ok {
            &self.group_commits
        } else {
            &self.group_commit_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Default prefetch settings of a consumer, each overridable in
/// `properties`: librdkafka queues up to 64 MiB per consumer (most of a
/// pipeline's memory), and once its queue is full it waits a whole second
/// before fetching again. 4 MiB with a 10 ms wait keeps fetches flowing at
/// the same speed with a third of the memory (`BENCHMARKS.md`).
pub const PREFETCH_DEFAULTS: [(&str, &str); 2] =
    [("queued.max.messages.kbytes", "4096"), ("fetch.queue.backoff.ms", "10")];

/// librdkafka settings for `bootstrap` plus `properties`.
pub(crate) fn client_config<'a>(
    bootstrap: &str,
    properties: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (key, value) in properties {
        config.set(key, value);
    }
    config
}

/// Turns a client creation failure into a fatal configuration error.
pub(crate) fn creation_error(what: &str, error: KafkaError) -> ConnectorError {
    let message = match &error {
        KafkaError::ClientConfig(_, description, key, value) => {
            let value = if crate::config::is_secret_property(key) {
                "***"
            } else {
                value.as_str()
            };
            format!("librdkafka rejected the setting `{key}` = \"{value}\" ({description}); fix or remove it in `properties`")
        }
        other => other.to_string(),
    };
    ConnectorError::fatal(what, message)
}

/// Forwards a librdkafka log line to `tracing`.
pub(crate) fn forward_log(level: RDKafkaLogLevel, facility: &str, message: &str) {
    match level {
        RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
            tracing::warn!(target: "librdkafka", facility, "{message}")
        }
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => tracing::info!(target: "librdkafka", facility, "{message}"),
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
    }
}

/// True for consumer errors that retrying will not fix.
pub(crate) fn is_fatal(error: &KafkaError) -> bool {
    if matches!(error, KafkaError::MessageConsumptionFatal(_)) {
        return true;
    }
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::Authentication
        )
    )
}

/// Callbacks of the source's consumer.
pub(crate) struct SourceContext {
    pub(crate) metrics: Arc<KafkaSourceMetrics>,
    /// `<bootstrap>/<topic>`, for log lines.
    pub(crate) label: String,
}

impl ClientContext for SourceContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        forward_log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error, KafkaError::PartitionEOF(_)) {
            return;
        }
        if is_fatal(&error) {
            tracing::error!(source = %self.label, %error, "fatal Kafka consumer error: {reason}");
            return;
        }
        self.metrics.transient_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(source = %self.label, %error, "Kafka client error (librdkafka retries): {reason}");
    }
}

impl ConsumerContext for SourceContext {}

/// Settings shared by every consumer the crate creates: explicit offsets only,
/// nothing stored or committed automatically, committed data only. Unless
/// `properties` says otherwise, offsets that are out of range (deleted by
/// retention) restart at the earliest record, and prefetching follows
/// [`PREFETCH_DEFAULTS`].
pub(crate) fn consumer_config(bootstrap: &str, group: &str, properties: &BTreeMap<String, String>) -> ClientConfig {
    let defaults: Vec<(String, String)> = [("auto.offset.reset", "earliest")]
        .into_iter()
        .chain(PREFETCH_DEFAULTS)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut config = client_config(bootstrap, defaults.iter().map(|(k, v)| (k, v)).chain(properties));
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed");
    config
}

/// The split names of one topic's partitions, each built once and shared
/// by every record of its partition.
#[derive(Debug, Default)]
struct SplitNames(BTreeMap<i32, SplitName>);

impl SplitNames {
    /// The split of `partition` of `topic` (one topic per cache).
    fn of(&mut self, topic: &str, partition: i32) -> SplitName {
        self.0
            .entry(partition)
            .or_insert_with(|| split_name(topic, partition).into())
            .clone()
    }
}

/// Where the keys and values of consumed records are copied: one
/// allocation of [`RecordBuffer::CHUNK`] bytes holds the keys and values
/// of many records (each record's are slices of it, freed with the last
/// record that uses it) instead of two allocations per record.
#[derive(Debug, Default)]
struct RecordBuffer(BytesMut);

impl RecordBuffer {
    /// Bytes allocated at a time (a bigger key or value gets its own).
    const CHUNK: usize = 64 * 1024;

    /// A copy of `bytes` sharing the current chunk.
    fn copy(&mut self, bytes: &[u8]) -> Bytes {
        if bytes.is_empty() {
            return Bytes::new();
        }
        if self.0.capacity() - self.0.len() < bytes.len() {
            self.0 = BytesMut::with_capacity(Self::CHUNK.max(bytes.len()));
        }
        self.0.extend_from_slice(bytes);
        self.0.split().freeze()
    }
}

/// Turns consumed messages into records; what it keeps lasts from poll
/// to poll (so the records of small polls share chunks too).
#[derive(Debug, Default)]
pub(crate) struct RecordMaker {
    names: SplitNames,
    buffer: RecordBuffer,
}

impl RecordMaker {
    /// A consumed message as a [`Record`] of split `<topic>-<partition>`
    /// (a shared name), its key and value in the shared buffer. A header
    /// without a value becomes an empty value.
    pub(crate) fn record(&mut self, message: &BorrowedMessage<'_>) -> Record {
        let headers = message.headers().map_or_else(Vec::new, |h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec).unwrap_or_default()))
                .collect()
        });
        Record {
            split: self.names.of(message.topic(), message.partition()),
            offset: message.offset(),
            key: message.key().map(|k| self.buffer.copy(k)),
            value: message.payload().map_or_else(Bytes::new, |v| self.buffer.copy(v)),
            timestamp_ms: message.timestamp().to_millis(),
            headers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_a_partition_share_one_split_name() {
        let mut names = SplitNames::default();
        let first = names.of("orders", 3);
        assert_eq!(first, "orders-3");
        assert!(names.of("orders", 3).shares_with(&first), "built once per partition");
        assert_eq!(names.of("orders", 4), "orders-4");
    }

    #[test]
    fn keys_and_values_share_one_chunk() {
        let mut buffer = RecordBuffer::default();
        let key = buffer.copy(b"k1");
        let value = buffer.copy(b"{\"id\":1}");
        let next = buffer.copy(b"{\"id\":2}");
        assert_eq!(
            (&key[..], &value[..], &next[..]),
            (&b"k1"[..], &b"{\"id\":1}"[..], &b"{\"id\":2}"[..])
        );
        // Consecutive slices of one allocation.
        assert_eq!(key.as_ptr().wrapping_add(key.len()), value.as_ptr());
        assert_eq!(value.as_ptr().wrapping_add(value.len()), next.as_ptr());
        assert!(buffer.copy(b"").is_empty());
    }

    #[test]
    fn a_full_chunk_starts_a_new_one_and_big_values_fit() {
        let mut buffer = RecordBuffer::default();
        let first = buffer.copy(&vec![1; RecordBuffer::CHUNK - 4]);
        let second = buffer.copy(b"12345");
        assert_ne!(first.as_ptr().wrapping_add(first.len()), second.as_ptr(), "a new chunk");
        assert_eq!(&second[..], b"12345");
        let big = buffer.copy(&vec![7; 3 * RecordBuffer::CHUNK]);
        assert_eq!(big.len(), 3 * RecordBuffer::CHUNK);
        assert!(big.iter().all(|b| *b == 7));
        assert_eq!(first.len(), RecordBuffer::CHUNK - 4, "earlier slices stay valid");
    }
}
