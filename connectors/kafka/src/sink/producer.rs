//! One transactional librdkafka producer of the sink's pool: its callbacks
//! (delivery results per transaction: failures, and where its first
//! record landed), the producer id and epoch its transactions were written
//! with, and its blocking calls. Every method that waits for the broker
//! blocks; the sink calls them through [`blocking`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exactly_core::{BoxError, ConnectorError};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{DeliveryResult, Message as _};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use super::encoding::{kafka_headers, Message};
use super::epoch::{epoch_change, EpochChange};
use crate::client::forward_log;

/// Callbacks of a pooled producer.
pub(crate) struct TxnContext {
    /// The transactional id, for log lines.
    transactional_id: String,
    /// Number of the current transaction; delivery results of older ones
    /// (purged by an abort) are ignored.
    generation: AtomicUsize,
    /// Failed deliveries of the current transaction.
    failures: AtomicU64,
    first_failure: Mutex<Option<KafkaError>>,
    /// Whether `first_delivered` is set (read without the lock on every
    /// delivery).
    delivered: AtomicBool,
    /// Topic, partition and offset of a record of the current transaction
    /// that was delivered (the first one reported).
    first_delivered: Mutex<Option<(String, i32, i64)>>,
}

impl ClientContext for TxnContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        forward_log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(transactional_id = %self.transactional_id, %error, "Kafka producer error: {reason}");
    }

    /// librdkafka's statistics (only with `statistics.interval.ms` set in
    /// `properties`) are not read: a transaction's producer id and epoch
    /// come from its records.
    fn stats_raw(&self, _statistics: &[u8]) {}
}

impl ProducerContext for TxnContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, generation: usize) {
        if generation != self.generation.load(Ordering::SeqCst) {
            return;
        }
        match result {
            Ok(message) => {
                if !self.delivered.load(Ordering::Acquire) {
                    lock(&self.first_delivered)
                        .get_or_insert_with(|| (message.topic().to_string(), message.partition(), message.offset()));
                    self.delivered.store(true, Ordering::Release);
                }
            }
            Err((error, _)) => {
                // The error first: a count above 0 always comes with it.
                lock(&self.first_failure).get_or_insert_with(|| error.clone());
                self.failures.fetch_add(1, Ordering::SeqCst);
            }
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
    /// What failed.
    pub message: String,
    /// librdkafka's error, if it is safe to show (a rejected setting's
    /// value may be a secret: then it is in `message`, redacted).
    pub cause: Option<BoxError>,
}

impl InitError {
    /// Not initialized: the worker's deadline on the region passed (see
    /// `exactly_core::acting`).
    pub(crate) fn past_deadline(id: &str) -> InitError {
        InitError {
            fatal: false,
            message: format!(
                "not initializing transactional id {id}: this worker's lease on the region may have run out"
            ),
            cause: None,
        }
    }

    /// The connector error of `context` this is.
    pub(crate) fn into_error(self, context: String) -> ConnectorError {
        let error = if self.fatal {
            ConnectorError::fatal(context, self.message)
        } else {
            ConnectorError::transient(context, self.message)
        };
        match self.cause {
            Some(cause) => error.caused_by(cause),
            None => error,
        }
    }
}

/// The producer id and epoch a producer's transactions were written with.
#[derive(Debug, Default)]
struct WrittenAs {
    /// Those of the latest pre-committed transaction.
    latest: Option<(i64, i16)>,
    /// Whether a transaction was aborted since.
    aborted: bool,
}

/// A transactional producer whose InitProducerId succeeded.
pub(crate) struct TxnProducer {
    producer: ThreadedProducer<TxnContext>,
    pub transactional_id: String,
    written_as: Mutex<WrittenAs>,
}

impl TxnProducer {
    /// Creates the producer of `transactional_id` from `config` (without
    /// the id) and initializes it: InitProducerId fences earlier producers
    /// of the id and (on Apache Kafka) aborts the transaction they left
    /// open. Blocking.
    pub(super) fn init(
        config: &ClientConfig,
        transactional_id: &str,
        timeout: Duration,
    ) -> Result<TxnProducer, InitError> {
        let mut config = config.clone();
        config.set("transactional.id", transactional_id);
        let context = TxnContext {
            transactional_id: transactional_id.to_string(),
            generation: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            first_failure: Mutex::new(None),
            delivered: AtomicBool::new(false),
            first_delivered: Mutex::new(None),
        };
        let producer: ThreadedProducer<TxnContext> = config.create_with_context(context).map_err(|e| {
            let (message, cause) = crate::client::creation_problem(e);
            InitError {
                fatal: true,
                message: format!("creating the producer of {transactional_id}: {message}"),
                cause,
            }
        })?;
        producer.init_transactions(timeout).map_err(|e| InitError {
            fatal: txn_error_kind(&e) == TxnErrorKind::Fatal,
            message: format!("InitProducerId for transactional id {transactional_id} failed"),
            cause: Some(e.into()),
        })?;
        Ok(TxnProducer {
            producer,
            transactional_id: transactional_id.to_string(),
            written_as: Mutex::default(),
        })
    }

    /// The producer id and epoch of the latest transaction this producer
    /// pre-committed, if any.
    pub(super) fn written_as(&self) -> Option<(i64, i16)> {
        lock(&self.written_as).latest
    }

    /// Records that the transaction being pre-committed was written as
    /// `now` (producer id, epoch), and how that compares with the previous
    /// one.
    pub(super) fn follow(&self, now: (i64, i16)) -> EpochChange {
        let mut written_as = lock(&self.written_as);
        let change = epoch_change(written_as.latest, written_as.aborted, now);
        *written_as = WrittenAs {
            latest: Some(now),
            aborted: false,
        };
        change
    }

    /// Topic, partition and offset of a delivered record of the current
    /// transaction.
    pub(super) fn first_delivered(&self) -> Option<(String, i32, i64)> {
        lock(&self.producer.context().first_delivered).clone()
    }

    /// Begins a transaction (local; no broker round trip) and returns its
    /// generation, which every record of it carries.
    pub(super) fn begin(&self) -> KafkaResult<usize> {
        self.producer.begin_transaction()?;
        let context = self.producer.context();
        context.failures.store(0, Ordering::SeqCst);
        *lock(&context.first_failure) = None;
        *lock(&context.first_delivered) = None;
        context.delivered.store(false, Ordering::Release);
        Ok(context.generation.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Queues `message` (with `timestamp_ms` and `headers`) to `topic` in
    /// transaction `generation`. Never blocks; `QueueFull` is returned as
    /// is for the caller to wait and retry.
    pub(super) fn send(
        &self,
        topic: &str,
        message: &Message<'_>,
        timestamp_ms: Option<i64>,
        headers: &[(String, Option<Vec<u8>>)],
        generation: usize,
    ) -> KafkaResult<()> {
        let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(topic, generation);
        record.key = message.key.as_deref();
        record.payload = message.value.as_deref();
        record.timestamp = timestamp_ms;
        if !headers.is_empty() {
            record.headers = Some(kafka_headers(headers));
        }
        self.producer.send(record).map_err(|(e, _)| e)
    }

    /// The failed deliveries of the current transaction so far: how many,
    /// and the first error.
    pub(super) fn failures(&self) -> Option<(u64, KafkaError)> {
        let context = self.producer.context();
        let n = context.failures.load(Ordering::SeqCst);
        let first = lock(&context.first_failure).clone();
        first.filter(|_| n > 0).map(|first| (n, first))
    }

    /// Waits until every queued record is delivered or failed. Blocking.
    pub(super) fn flush(&self, timeout: Duration) -> KafkaResult<()> {
        self.producer.flush(timeout)
    }

    /// Commits the open transaction (flushes first). Blocking.
    pub(super) fn commit(&self, timeout: Duration) -> KafkaResult<()> {
        self.producer.commit_transaction(timeout)
    }

    /// Aborts the open transaction. Blocking. After an abortable error
    /// librdkafka bumps the producer's epoch here (KIP-360); the next
    /// transaction's records carry the new one.
    pub(super) fn abort(&self, timeout: Duration) -> KafkaResult<()> {
        lock(&self.written_as).aborted = true;
        self.producer.abort_transaction(timeout)
    }
}

/// Runs blocking librdkafka work off the runtime's threads.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Drops producers on a blocking thread when there is a runtime: closing a
/// librdkafka client waits for its threads.
pub(crate) fn retire(producers: Vec<Arc<TxnProducer>>) {
    if let (false, Ok(runtime)) = (producers.is_empty(), tokio::runtime::Handle::try_current()) {
        runtime.spawn_blocking(move || drop(producers));
    }
}
