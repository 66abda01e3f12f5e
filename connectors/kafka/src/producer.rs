//! One transactional librdkafka producer of the sink's pool: its callbacks
//! (delivery results per transaction, producer id and epoch from the
//! statistics) and its blocking calls. Every method that waits for the broker
//! blocks; the sink calls them from `spawn_blocking`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use serde::Deserialize;

use crate::client::forward_log;

/// How often librdkafka reports statistics, where the producer id and epoch
/// are read from.
pub(crate) const STATISTICS_INTERVAL_MS: u64 = 100;

/// The `eos` object of librdkafka's statistics JSON.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub(crate) struct EosStatistics {
    /// `Assigned` once InitProducerId answered.
    pub idemp_state: String,
    /// `Ready`, `InTransaction`, ..., `AbortableError`, `FatalError`.
    pub txn_state: String,
    /// The producer id, or -1.
    pub producer_id: i64,
    /// The epoch, or -1.
    pub producer_epoch: i64,
}

#[derive(Deserialize)]
struct Statistics {
    eos: Option<EosStatistics>,
}

/// Callbacks of a pooled producer.
pub(crate) struct TxnContext {
    /// The transactional id, for log lines.
    transactional_id: String,
    /// Number of the current transaction; delivery results of older ones
    /// (purged by an abort) are ignored.
    generation: AtomicUsize,
    /// Failed deliveries of the current transaction.
    failures: AtomicU64,
    first_failure: Mutex<Option<String>>,
    latest: Mutex<Option<EosStatistics>>,
}

impl ClientContext for TxnContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        forward_log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(transactional_id = %self.transactional_id, %error, "Kafka producer error: {reason}");
    }

    fn stats_raw(&self, statistics: &[u8]) {
        match serde_json::from_slice::<Statistics>(statistics) {
            Ok(Statistics { eos: Some(eos) }) => *lock(&self.latest) = Some(eos),
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, "unreadable librdkafka statistics"),
        }
    }
}

impl ProducerContext for TxnContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, generation: usize) {
        if generation != self.generation.load(Ordering::SeqCst) {
            return;
        }
        if let Err((error, _)) = result {
            self.failures.fetch_add(1, Ordering::SeqCst);
            lock(&self.first_failure).get_or_insert_with(|| error.to_string());
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a failed transactional call may be handled (librdkafka's
/// classification of `rd_kafka_error_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxnErrorKind {
    /// Call it again.
    Retriable,
    /// The transaction must be aborted.
    Abortable,
    /// The producer is unusable (fenced, ...).
    Fatal,
    /// Anything else.
    Other,
}

pub(crate) fn txn_error_kind(error: &KafkaError) -> TxnErrorKind {
    match error {
        KafkaError::Transaction(e) if e.is_fatal() => TxnErrorKind::Fatal,
        KafkaError::Transaction(e) if e.txn_requires_abort() => TxnErrorKind::Abortable,
        KafkaError::Transaction(e) if e.is_retriable() => TxnErrorKind::Retriable,
        _ => TxnErrorKind::Other,
    }
}

/// Why a producer could not be initialized.
#[derive(Debug)]
pub(crate) struct InitError {
    /// Retrying will not help (bad settings, authorization).
    pub fatal: bool,
    pub message: String,
}

/// A transactional producer whose InitProducerId succeeded, with the
/// producer id and epoch it was given.
pub(crate) struct TxnProducer {
    producer: ThreadedProducer<TxnContext>,
    pub transactional_id: String,
    pub producer_id: i64,
    pub epoch: i16,
}

impl TxnProducer {
    /// Creates the producer of `transactional_id` from `config` (without
    /// the id) and initializes it: InitProducerId fences earlier producers
    /// of the id and (on Apache Kafka) aborts the transaction they left
    /// open. Then waits for the statistics to report the producer id and
    /// epoch. Blocking.
    pub fn init(config: &ClientConfig, transactional_id: &str, timeout: Duration) -> Result<TxnProducer, InitError> {
        let mut config = config.clone();
        config.set("transactional.id", transactional_id);
        let context = TxnContext {
            transactional_id: transactional_id.to_string(),
            generation: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            first_failure: Mutex::new(None),
            latest: Mutex::new(None),
        };
        let producer: ThreadedProducer<TxnContext> = config.create_with_context(context).map_err(|e| InitError {
            fatal: true,
            message: crate::client::creation_error(&format!("creating the producer of {transactional_id}"), e)
                .to_string(),
        })?;
        producer.init_transactions(timeout).map_err(|e| InitError {
            fatal: txn_error_kind(&e) == TxnErrorKind::Fatal,
            message: format!("InitProducerId for transactional id {transactional_id}: {e}"),
        })?;
        let deadline = Instant::now() + timeout.max(Duration::from_millis(10 * STATISTICS_INTERVAL_MS));
        loop {
            let latest = lock(&producer.context().latest).clone();
            if let Some(eos) = latest.filter(|e| e.idemp_state == "Assigned" && e.producer_id >= 0) {
                let epoch = i16::try_from(eos.producer_epoch).map_err(|_| InitError {
                    fatal: true,
                    message: format!("librdkafka reports epoch {} for {transactional_id}", eos.producer_epoch),
                })?;
                return Ok(TxnProducer {
                    producer,
                    transactional_id: transactional_id.to_string(),
                    producer_id: eos.producer_id,
                    epoch,
                });
            }
            if Instant::now() > deadline {
                return Err(InitError {
                    fatal: false,
                    message: format!(
                        "librdkafka's statistics reported no producer id for {transactional_id} \
                         after InitProducerId"
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(STATISTICS_INTERVAL_MS / 4));
        }
    }

    /// Begins a transaction (local; no broker round trip) and returns its
    /// generation, which every record of it carries.
    pub fn begin(&self) -> KafkaResult<usize> {
        self.producer.begin_transaction()?;
        let context = self.producer.context();
        context.failures.store(0, Ordering::SeqCst);
        *lock(&context.first_failure) = None;
        Ok(context.generation.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Queues one record of transaction `generation`. Never blocks;
    /// `QueueFull` is returned as is for the caller to wait and retry.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp_ms: Option<i64>,
        headers: &[(String, Vec<u8>)],
        generation: usize,
    ) -> KafkaResult<()> {
        let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(topic, generation);
        record.partition = partition;
        record.key = key;
        record.payload = value;
        record.timestamp = timestamp_ms;
        if !headers.is_empty() {
            record.headers = Some(headers.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
                h.insert(Header {
                    key,
                    value: Some(value),
                })
            }));
        }
        self.producer.send(record).map_err(|(e, _)| e)
    }

    /// The failed deliveries of the current transaction so far: how many,
    /// and the first error.
    pub fn failures(&self) -> Option<(u64, String)> {
        let context = self.producer.context();
        let n = context.failures.load(Ordering::SeqCst);
        (n > 0).then(|| (n, lock(&context.first_failure).clone().unwrap_or_default()))
    }

    /// Waits until every queued record is delivered or failed. Blocking.
    pub fn flush(&self, timeout: Duration) -> KafkaResult<()> {
        self.producer.flush(timeout)
    }

    /// Checks the latest statistics: same producer id and epoch as at
    /// initialization, and a transaction state that can still commit.
    pub fn health(&self) -> Result<(), String> {
        let latest = lock(&self.producer.context().latest).clone();
        let Some(eos) = latest else {
            return Ok(());
        };
        if eos.producer_id != self.producer_id || eos.producer_epoch != i64::from(self.epoch) {
            return Err(format!(
                "librdkafka now reports producer {}/epoch {} for {}, not {}/{}: the transaction was aborted",
                eos.producer_id, eos.producer_epoch, self.transactional_id, self.producer_id, self.epoch
            ));
        }
        if matches!(
            eos.txn_state.as_str(),
            "AbortableError" | "FatalError" | "AbortingTransaction"
        ) {
            return Err(format!(
                "the transaction of {} is in state {}",
                self.transactional_id, eos.txn_state
            ));
        }
        Ok(())
    }

    /// Commits the open transaction (flushes first). Blocking.
    pub fn commit(&self, timeout: Duration) -> KafkaResult<()> {
        self.producer.commit_transaction(timeout)
    }

    /// Aborts the open transaction. Blocking.
    pub fn abort(&self, timeout: Duration) -> KafkaResult<()> {
        self.producer.abort_transaction(timeout)
    }
}
