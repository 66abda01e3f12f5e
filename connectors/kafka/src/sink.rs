//! The transactional Kafka sink: [`KafkaSinkFactory`] and its subtasks.
//!
//! See the [crate documentation](crate#the-sink) for the protocol; the
//! comments here explain the bookkeeping.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use exactly_core::{
    erase, fault, CheckpointConfig, CheckpointId, ConnectorError, ErasedSink, JsonPointer, Record, ReplayCheck,
    SinkContext, SinkFactory, TwoPhaseCommitSink,
};
use exactly_kafka_wire::{EndTxnOutcome, WireClient, WireConfig, WireError};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer};
use serde::{Deserialize, Serialize};

use crate::client::client_config;
use crate::config::KafkaConfigError;
use crate::producer::{txn_error_kind, InitError, TxnErrorKind, TxnProducer, STATISTICS_INTERVAL_MS};
use crate::sink_config::{
    check_broker_timeout_limit, check_checkpoint_timing, past_timeout_share, timeout_headroom_warning, KafkaSinkConfig,
    KeyFrom, OnLostTransaction, ValueFrom, ABORT_AHEAD_SHARE,
};

/// Longest single blocking librdkafka call (InitProducerId, commit, abort).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a commit is retried before the attempt fails (and recovery
/// finishes the transaction with EndTxn).
const COMMIT_DEADLINE: Duration = Duration::from_secs(60);
/// First pause between two commit attempts; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Committables remembered as committed, so a repeated commit is a no-op.
const RECENT_COMMITS: usize = 64;

/// The proof of a pre-committed Kafka transaction, stored in the checkpoint:
/// enough to commit it from any process with EndTxn, without
/// InitProducerId (which would abort it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaCommittable {
    /// `<prefix>-<subtask>-<slot>`.
    pub transactional_id: String,
    /// The producer id the transaction was written with.
    pub producer_id: i64,
    /// The producer epoch the transaction was written with.
    pub epoch: i16,
    /// The checkpoint whose interval the transaction holds (the id the
    /// runtime passed to `begin`).
    pub checkpoint: CheckpointId,
    /// The topic written to.
    pub topic: String,
    /// Records in the transaction.
    #[serde(default)]
    pub records: u64,
    /// When its first record was written (Unix milliseconds): the broker's
    /// transaction timeout runs from about then.
    #[serde(default)]
    pub began_at_ms: u64,
}

/// Counters of a Kafka sink, shared by all its subtasks (and by every run of
/// the pipeline that uses the same factory).
#[derive(Debug, Default)]
struct KafkaSinkMetrics {
    committed: AtomicU64,
    committed_by_end_txn: AtomicU64,
    lost_transactions: AtomicU64,
    producers_initialized: AtomicU64,
    timeout_warnings: AtomicU64,
}

/// A point-in-time copy of a Kafka sink's counters, from
/// [`KafkaSinkFactory::metrics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KafkaSinkMetricsSnapshot {
    /// Transactions committed by the producer that wrote them.
    pub committed: u64,
    /// Transactions committed with EndTxn: by `recover` after a restart, or
    /// when the producer that wrote them was gone.
    pub committed_by_end_txn: u64,
    /// Pre-committed transactions the broker refused to commit, counted with
    /// `on_lost_transaction = "warn"` (with `"fail"` the pipeline stops).
    pub lost_transactions: u64,
    /// InitProducerId calls (each fences earlier producers of the id and
    /// aborts what they left open): at `recover`, and when a slot whose
    /// transaction was finished with EndTxn is used again.
    pub producers_initialized: u64,
    /// Pre-committed transactions that used `timeout_warning_share` of
    /// `transaction_timeout` before they were committed.
    pub timeout_warnings: u64,
}

impl KafkaSinkMetrics {
    fn snapshot(&self) -> KafkaSinkMetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        KafkaSinkMetricsSnapshot {
            committed: get(&self.committed),
            committed_by_end_txn: get(&self.committed_by_end_txn),
            lost_transactions: get(&self.lost_transactions),
            producers_initialized: get(&self.producers_initialized),
            timeout_warnings: get(&self.timeout_warnings),
        }
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Writes records to one Kafka topic in transactions tied to checkpoints.
///
/// Every sink subtask owns a fixed pool of `pool_size` transactional ids,
/// `<prefix>-<subtask>-<slot>`, each with its own librdkafka producer; the
/// ids a pipeline owns are known and never grow. See the
/// [crate documentation](crate#the-sink) for how they are used.
///
/// The identity is `kafka:topic=<topic>,transactional_id_prefix=<prefix>,pool_size=<n>`:
/// changing any of them changes which transactions a checkpoint refers to.
#[derive(Debug, Clone)]
pub struct KafkaSinkFactory {
    settings: Arc<Settings>,
}

#[derive(Debug, Clone)]
struct Settings {
    config: KafkaSinkConfig,
    prefix: String,
    /// `<bootstrap>/<topic>`, for logs and errors.
    label: String,
    /// librdkafka settings of every pooled producer, without the id.
    producer: ClientConfig,
    /// For metadata requests.
    plain: ClientConfig,
    wire: WireClient,
    checkpoint_interval: Option<Duration>,
    metrics: Arc<KafkaSinkMetrics>,
    /// Per sink subtask, a lock every InitProducerId in flight holds shared.
    /// `recover` takes it exclusively once before anything else, so an
    /// initialization a failed attempt left running (on a blocking thread,
    /// which cannot be cancelled) has ended before the new attempt commits or
    /// initializes anything: a late one would fence the new attempt's
    /// producer of that id, and with it a transaction it pre-committed.
    inits: Arc<std::sync::Mutex<HashMap<usize, Arc<tokio::sync::RwLock<()>>>>>,
}

impl KafkaSinkFactory {
    /// A sink for the pipeline named `pipeline` (the default transactional
    /// id prefix is `exactly-<pipeline>`). Checks the settings.
    pub fn new(pipeline: &str, config: KafkaSinkConfig) -> Result<Self, KafkaConfigError> {
        config.validate()?;
        let wire =
            WireConfig::from_properties(&config.bootstrap, &config.properties).map_err(|e| KafkaConfigError {
                connector: "sink",
                key: "properties".into(),
                problem: format!("cannot be used to finish transactions after a restart: {e}"),
            })?;
        let plain = client_config(&config.bootstrap, &config.properties);
        let mut producer = plain.clone();
        producer
            .set("enable.idempotence", "true")
            .set(
                "transaction.timeout.ms",
                config.transaction_timeout.as_millis().to_string(),
            )
            .set("statistics.interval.ms", STATISTICS_INTERVAL_MS.to_string());
        Ok(KafkaSinkFactory {
            settings: Arc::new(Settings {
                prefix: config.prefix_for(pipeline),
                label: format!("{}/{}", config.bootstrap, config.topic),
                config,
                producer,
                plain,
                wire: WireClient::with_config(wire),
                checkpoint_interval: None,
                metrics: Arc::default(),
                inits: Arc::default(),
            }),
        })
    }

    /// Tells the sink the pipeline's checkpoint interval, for the warning
    /// about a `transaction_timeout` without enough headroom (the `exactly`
    /// command passes `[checkpoint] interval`). Without it only
    /// `expected_restart_time` is taken into account.
    pub fn with_checkpoint_interval(mut self, interval: Duration) -> Self {
        Arc::make_mut(&mut self.settings).checkpoint_interval = Some(interval);
        self
    }

    /// The settings.
    pub fn config(&self) -> &KafkaSinkConfig {
        &self.settings.config
    }

    /// The prefix of the transactional ids.
    pub fn transactional_id_prefix(&self) -> &str {
        &self.settings.prefix
    }

    /// The transactional ids of sink subtask `subtask`: `<prefix>-<subtask>-<slot>`
    /// for every slot.
    pub fn transactional_ids(&self, subtask: usize) -> Vec<String> {
        (0..self.settings.config.pool_size)
            .map(|slot| transactional_id(&self.settings.prefix, subtask, slot))
            .collect()
    }

    /// Counters of all subtasks created by this factory.
    pub fn metrics(&self) -> KafkaSinkMetricsSnapshot {
        self.settings.metrics.snapshot()
    }
}

impl Settings {
    /// The lock InitProducerId calls of sink subtask `subtask` hold.
    fn init_lock(&self, subtask: usize) -> Arc<tokio::sync::RwLock<()>> {
        let mut inits = self.inits.lock().unwrap_or_else(|e| e.into_inner());
        inits.entry(subtask).or_default().clone()
    }
}

fn transactional_id(prefix: &str, subtask: usize, slot: usize) -> String {
    format!("{prefix}-{subtask}-{slot}")
}

impl SinkFactory for KafkaSinkFactory {
    fn identity(&self) -> String {
        format!(
            "kafka:topic={},transactional_id_prefix={},pool_size={}",
            self.settings.config.topic, self.settings.prefix, self.settings.config.pool_size
        )
    }

    /// Refuses checkpoint settings under which a transaction can wait for
    /// its checkpoint until the broker aborts it (see
    /// [`check_checkpoint_timing`]).
    fn check_checkpointing(&self, checkpoint: &CheckpointConfig) -> Result<(), ConnectorError> {
        check_checkpoint_timing(
            self.settings.config.transaction_timeout,
            checkpoint.interval,
            checkpoint.timeout,
        )
        .map_err(|problem| ConnectorError::fatal(format!("kafka sink {}", self.settings.label), problem))
    }

    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        let slots = self
            .transactional_ids(context.subtask)
            .into_iter()
            .map(|transactional_id| Slot {
                transactional_id,
                producer: None,
                initializing: None,
                state: SlotState::Broken,
            })
            .collect();
        Ok(erase(KafkaSink {
            settings: self.settings.clone(),
            context,
            slots,
            next_slot: 0,
            clock: 0,
            recovered: false,
            recent: VecDeque::new(),
        }))
    }
}

/// What a pooled transactional id is doing.
#[derive(Debug)]
enum SlotState {
    /// Ready for a new transaction.
    Free,
    /// A transaction is open since `began_at_ms` (Unix milliseconds).
    Open { began_at_ms: u64 },
    /// Pre-committed at `at` (the sink's clock); waits for its checkpoint.
    Prepared {
        committable: KafkaCommittable,
        at: u64,
        warned: bool,
    },
    /// Committed (or lost) at `at`. The latest persisted checkpoint may still
    /// list it, and a recovery from that checkpoint sends EndTxn with its
    /// producer id and epoch — which would commit whatever transaction the
    /// id had open then. So the id is not reused until a transaction
    /// pre-committed after `at` is committed: the checkpoint that completed
    /// for it was taken after this commit and no longer lists it.
    Committed { at: u64 },
    /// Unusable until the next `recover` (before it, or after a failure).
    Broken,
}

struct Slot {
    transactional_id: String,
    /// An initialized producer; `None` when the slot must initialize one
    /// before its next transaction.
    producer: Option<Arc<TxnProducer>>,
    /// A producer being initialized in the background since the slot became
    /// free.
    initializing: Option<tokio::task::JoinHandle<Result<TxnProducer, InitError>>>,
    state: SlotState,
}

/// An open transaction: which slot holds it.
pub struct KafkaTransaction {
    slot: usize,
    checkpoint: CheckpointId,
    generation: usize,
    records: u64,
    began_at_ms: u64,
}

/// One sink subtask. See [`KafkaSinkFactory`].
struct KafkaSink {
    settings: Arc<Settings>,
    context: SinkContext,
    slots: Vec<Slot>,
    /// Where the search for a free slot starts (rotation).
    next_slot: usize,
    /// Orders pre-commits and commits (see [`SlotState::Committed`]).
    clock: u64,
    recovered: bool,
    /// The latest committables committed by this subtask.
    recent: VecDeque<KafkaCommittable>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn age(began_at_ms: u64) -> Duration {
    Duration::from_millis(now_ms().saturating_sub(began_at_ms))
}

/// Runs blocking librdkafka work off the runtime's threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// The broker's verdict on an EndTxn commit, as the sink acts on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EndTxnVerdict {
    /// Committed now or before.
    Committed,
    /// The broker refused: the transaction is gone (timed out, fenced,
    /// unknown). The reason says which answer it was.
    Lost(String),
    /// Ask again after a pause (coordinator moving or loading, concurrent
    /// transactions, a broker that closed or refused the connection while it
    /// restarts, a timeout).
    Retry(String),
    /// Neither success nor a known refusal: stop rather than guess.
    Fatal(String),
}

/// Maps the outcome of [`WireClient::end_txn`] (commit) to what the sink does.
pub(crate) fn classify_end_txn(result: &Result<EndTxnOutcome, WireError>) -> EndTxnVerdict {
    match result {
        Ok(EndTxnOutcome::Ok) => EndTxnVerdict::Committed,
        Ok(outcome @ (EndTxnOutcome::InvalidTxnState | EndTxnOutcome::ProducerFenced(_))) => {
            EndTxnVerdict::Lost(format!("EndTxn answered {outcome}"))
        }
        Ok(outcome @ EndTxnOutcome::InvalidProducerIdMapping) => EndTxnVerdict::Lost(format!(
            "EndTxn answered {outcome}: the broker knows no producer for this id any more (it was \
             stopped longer than the brokers' transactional.id.expiration.ms after the transaction timed out)"
        )),
        Ok(outcome @ EndTxnOutcome::Retriable(_)) => EndTxnVerdict::Retry(format!("EndTxn answered {outcome}")),
        Ok(outcome @ EndTxnOutcome::Other(_)) => EndTxnVerdict::Fatal(format!(
            "EndTxn answered {outcome}, which says neither that the transaction is committed nor that it is \
             gone; stopping so nothing is decided by guess (run again to retry)"
        )),
        // A broker going down closes connections; one coming up refuses them
        // or answers "not coordinator": none of it says anything about the
        // transaction. Only an answer of the coordinator does.
        Err(error @ WireError::Closed { .. }) => EndTxnVerdict::Retry(error.to_string()),
        Err(error) if error.is_retriable() => EndTxnVerdict::Retry(error.to_string()),
        Err(error) => EndTxnVerdict::Fatal(error.to_string()),
    }
}

/// What `pointer` found (`answer`): a string's text, `None` for null, the
/// JSON text of anything else.
fn pointed<'r>(answer: Option<serde_json::Value>, pointer: &JsonPointer) -> Result<Part<'r>, String> {
    match answer {
        None => Err(format!("the value has nothing at {pointer}")),
        Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(Cow::Owned(s.into_bytes()))),
        Some(other) => Ok(Some(Cow::Owned(other.to_string().into_bytes()))),
    }
}

/// Bytes of a message's key or value, borrowed from the record where possible.
type Part<'r> = Option<Cow<'r, [u8]>>;

/// The key and value of the message written for `record`. `Err` names the
/// setting and what is wrong with the record.
pub(crate) fn message_parts<'r>(
    record: &'r Record,
    key: &KeyFrom,
    value: &ValueFrom,
) -> Result<(Part<'r>, Part<'r>), String> {
    // Both pointers are answered in one pass over the value.
    let key_pointer = match key {
        KeyFrom::Pointer(p) => Some(p),
        _ => None,
    };
    let value_pointer = match value {
        ValueFrom::Pointer(p) => Some(p),
        ValueFrom::Value => None,
    };
    let pointers: Vec<&JsonPointer> = key_pointer.into_iter().chain(value_pointer).collect();
    let mut answers = if pointers.is_empty() {
        Vec::new()
    } else {
        JsonPointer::find_all(&pointers, &record.value)
            .map_err(|e| format!("the value is not JSON ({e}), so JSON pointers cannot be used"))?
    }
    .into_iter();
    let key_bytes = match key {
        KeyFrom::Key => record.key.as_deref().map(Cow::Borrowed),
        KeyFrom::Value => Some(Cow::Borrowed(&record.value[..])),
        KeyFrom::None => None,
        KeyFrom::Pointer(p) => pointed(answers.next().flatten(), p).map_err(|e| format!("`key`: {e}"))?,
    };
    let value_bytes = match value {
        ValueFrom::Value => Some(Cow::Borrowed(&record.value[..])),
        ValueFrom::Pointer(p) => pointed(answers.next().flatten(), p).map_err(|e| format!("`value`: {e}"))?,
    };
    Ok((key_bytes, value_bytes))
}

impl KafkaSink {
    fn config(&self) -> &KafkaSinkConfig {
        &self.settings.config
    }

    fn where_(&self) -> String {
        format!("kafka sink {} subtask {}", self.settings.label, self.context.subtask)
    }

    fn transient(&self, message: impl ToString) -> ConnectorError {
        ConnectorError::transient(self.where_(), message)
    }

    fn fatal(&self, message: impl ToString) -> ConnectorError {
        ConnectorError::fatal(self.where_(), message)
    }

    fn slot_of(&self, transactional_id: &str) -> Option<usize> {
        self.slots.iter().position(|s| s.transactional_id == transactional_id)
    }

    fn producer(&self, slot: usize) -> Result<Arc<TxnProducer>, ConnectorError> {
        self.slots[slot]
            .producer
            .clone()
            .ok_or_else(|| self.fatal(format!("slot {slot} has no producer")))
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The guardrail at start: `transaction_timeout` must not exceed the
    /// broker's `transaction.max.timeout.ms`.
    async fn check_broker_limit(&self) -> Result<(), ConnectorError> {
        const KEY: &str = "transaction.max.timeout.ms";
        let limit = self.settings.wire.describe_broker_config(KEY).await.map_err(|e| {
            let message = format!("reading the broker's {KEY}: {e}");
            if e.is_retriable() {
                self.transient(message)
            } else {
                self.fatal(message)
            }
        })?;
        if limit.is_none() {
            tracing::debug!(sink = %self.settings.label, "the broker does not report {KEY}; not checking transaction_timeout against it");
        }
        check_broker_timeout_limit(self.config().transaction_timeout, limit.as_deref()).map_err(|e| self.fatal(e))
    }

    /// A missing topic is fatal.
    async fn check_topic(&self) -> Result<(), ConnectorError> {
        let config = self.settings.plain.clone();
        let topic = self.config().topic.clone();
        let exists = blocking(move || -> Result<bool, KafkaError> {
            let client: BaseProducer = config.create()?;
            let metadata = client.client().fetch_metadata(Some(&topic), REQUEST_TIMEOUT)?;
            Ok(metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()))
        })
        .await
        .map_err(|e| self.transient(format!("reading the metadata of topic `{}`: {e}", self.config().topic)))?;
        if exists {
            return Ok(());
        }
        Err(self.fatal(format!(
            "topic `{}` does not exist on `{}`; create it (the sink never creates topics) or fix `topic`",
            self.config().topic,
            self.config().bootstrap
        )))
    }

    /// Drops `slot`'s producer off the runtime's threads (closing a
    /// librdkafka client waits). Nothing is aborted.
    fn retire_producer(&mut self, slot: usize) {
        retire(self.slots[slot].producer.take().into_iter().collect());
    }

    /// Starts initializing a producer for `slot` on a blocking thread. The
    /// call holds the subtask's init lock (shared) until it ends; `None` when
    /// a `recover` of the same subtask waits for that lock (this sink
    /// belongs to an attempt that failed; the slot initializes lazily if it
    /// is ever used).
    fn spawn_init(&self, slot: usize) -> Option<tokio::task::JoinHandle<Result<TxnProducer, InitError>>> {
        self.spawn_init_id(self.slots[slot].transactional_id.clone())
    }

    /// [`spawn_init`](Self::spawn_init) for any transactional id this
    /// subtask owns (its slots', or an adopted old subtask's).
    fn spawn_init_id(&self, id: String) -> Option<tokio::task::JoinHandle<Result<TxnProducer, InitError>>> {
        let Ok(in_flight) = self.settings.init_lock(self.context.subtask).try_read_owned() else {
            tracing::debug!(
                subtask = self.context.subtask,
                transactional_id = %id,
                "a recovery of this subtask runs: not initializing"
            );
            return None;
        };
        let config = self.settings.producer.clone();
        add(&self.settings.metrics.producers_initialized, 1);
        Some(tokio::task::spawn_blocking(move || {
            let _in_flight = in_flight;
            fault::pause_blocking("kafka_sink.before_init_producer");
            TxnProducer::init(&config, &id, REQUEST_TIMEOUT)
        }))
    }

    /// Waits until every InitProducerId a failed attempt's sink of this
    /// subtask started has ended.
    async fn await_earlier_inits(&self) {
        let lock = self.settings.init_lock(self.context.subtask);
        let started = Instant::now();
        drop(lock.write().await);
        let waited = started.elapsed();
        if waited > Duration::from_millis(10) {
            tracing::info!(
                sink = %self.settings.label,
                subtask = self.context.subtask,
                waited_ms = waited.as_millis() as u64,
                "waited for producer initializations of the failed attempt to end before recovering"
            );
        }
    }

    /// Initializes a producer for each of `ids` in parallel, which fences
    /// earlier producers of those ids and aborts what they left open.
    async fn init_producers(&self, ids: Vec<String>) -> Result<Vec<Arc<TxnProducer>>, ConnectorError> {
        let Some(tasks) = ids
            .into_iter()
            .map(|id| self.spawn_init_id(id))
            .collect::<Option<Vec<_>>>()
        else {
            return Err(self.transient("another recovery of this subtask is running; retrying after it"));
        };
        let mut producers = Vec::new();
        let mut first_error = None;
        for task in tasks {
            match task.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())) {
                Ok(p) => producers.push(Arc::new(p)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let Some(e) = first_error else {
            return Ok(producers);
        };
        retire(producers);
        Err(if e.fatal {
            self.fatal(e.message)
        } else {
            self.transient(e.message)
        })
    }

    /// After a lowering of the parallelism: initializes (and drops) a
    /// producer for every pooled id of the adopted old subtasks that
    /// `listed` does not name, which aborts what they left open. Those ids
    /// are never used again.
    async fn abort_adopted(&self, listed: &BTreeSet<String>) -> Result<(), ConnectorError> {
        let pool = self.config().pool_size;
        let ids: Vec<String> = self
            .context
            .adopted
            .iter()
            .flat_map(|&old| (0..pool).map(move |slot| (old, slot)))
            .map(|(old, slot)| transactional_id(&self.settings.prefix, old, slot))
            .filter(|id| !listed.contains(id))
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let aborted = ids.len();
        retire(self.init_producers(ids).await?);
        tracing::info!(
            sink = %self.settings.label,
            subtask = self.context.subtask,
            adopted = ?self.context.adopted,
            aborted,
            "took over the transactional ids of the old subtasks: what they left open is aborted"
        );
        Ok(())
    }

    /// A data-loss report for `c`, or with `on_lost_transaction = "warn"` a
    /// counted error log and `Ok`.
    fn lost(&self, c: &KafkaCommittable, reason: &str) -> Result<(), ConnectorError> {
        let timeout = self.config().transaction_timeout;
        let hint = if c.began_at_ms == 0 {
            String::new()
        } else {
            let age = age(c.began_at_ms);
            let why = if age > timeout {
                "it most likely timed out and the broker aborted it"
            } else {
                "another producer with the same transactional id fenced it (do two pipelines share a \
                 transactional_id_prefix?) or it timed out"
            };
            format!(
                " It began {} ago and transaction_timeout is {}: {why}.",
                humantime::format_duration(Duration::from_secs(age.as_secs())),
                humantime::format_duration(timeout)
            )
        };
        let message = format!(
            "the broker refused to commit transactional id {} (producer {}, epoch {}): {reason}. The data of \
             checkpoint {} ({} records for topic {}) was lost.{hint}",
            c.transactional_id, c.producer_id, c.epoch, c.checkpoint, c.records, c.topic
        );
        match self.config().on_lost_transaction {
            OnLostTransaction::Fail => Err(ConnectorError::DataLoss {
                context: self.where_(),
                checkpoint: c.checkpoint,
                message: format!("{message} Set on_lost_transaction = \"warn\" to go on without it."),
            }),
            OnLostTransaction::Warn => {
                add(&self.settings.metrics.lost_transactions, 1);
                tracing::error!(sink = %self.settings.label, checkpoint = %c.checkpoint, "{message} Going on (on_lost_transaction = \"warn\").");
                Ok(())
            }
        }
    }

    /// Commits `c` with EndTxn as its producer id and epoch, without
    /// InitProducerId: retries what may pass later, reports a refusal as lost.
    async fn finish_with_end_txn(&self, c: &KafkaCommittable) -> Result<(), ConnectorError> {
        fault::point_at("kafka_sink.before_end_txn", self.context.subtask);
        fault::pause_at("kafka_sink.before_end_txn", self.context.subtask).await;
        let deadline = Instant::now() + COMMIT_DEADLINE;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let result = self
                .settings
                .wire
                .end_txn(&c.transactional_id, c.producer_id, c.epoch, true)
                .await;
            let reason = match classify_end_txn(&result) {
                EndTxnVerdict::Committed => {
                    add(&self.settings.metrics.committed_by_end_txn, 1);
                    tracing::info!(sink = %self.settings.label, transactional_id = %c.transactional_id, checkpoint = %c.checkpoint, "transaction committed with EndTxn");
                    return Ok(());
                }
                EndTxnVerdict::Lost(reason) => return self.lost(c, &reason),
                EndTxnVerdict::Fatal(reason) => {
                    return Err(self.fatal(format!(
                        "committing transactional id {} of checkpoint {}: {reason}",
                        c.transactional_id, c.checkpoint
                    )))
                }
                EndTxnVerdict::Retry(reason) => reason,
            };
            if Instant::now() + backoff > deadline {
                return Err(self.transient(format!(
                    "committing transactional id {} of checkpoint {} with EndTxn did not succeed within {}: {reason}; \
                     the pipeline restarts and tries again",
                    c.transactional_id,
                    c.checkpoint,
                    humantime::format_duration(COMMIT_DEADLINE)
                )));
            }
            tracing::debug!(transactional_id = %c.transactional_id, %reason, "EndTxn: retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Commits the transaction `slot` holds with its own producer.
    async fn commit_live(&mut self, slot: usize, c: &KafkaCommittable) -> Result<(), ConnectorError> {
        let producer = self.producer(slot)?;
        let deadline = Instant::now() + COMMIT_DEADLINE;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let p = producer.clone();
            let Err(error) = blocking(move || p.commit(REQUEST_TIMEOUT)).await else {
                add(&self.settings.metrics.committed, 1);
                tracing::debug!(transactional_id = %c.transactional_id, checkpoint = %c.checkpoint, "transaction committed");
                return Ok(());
            };
            match txn_error_kind(&error) {
                TxnErrorKind::Retriable if Instant::now() + backoff < deadline => {
                    tracing::debug!(transactional_id = %c.transactional_id, %error, "commit: retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                TxnErrorKind::Abortable => {
                    let p = producer.clone();
                    if blocking(move || p.abort(REQUEST_TIMEOUT)).await.is_err() {
                        self.retire_producer(slot);
                        retire(vec![producer]);
                    }
                    return self.lost(c, &format!("{error}; librdkafka had to abort the transaction"));
                }
                TxnErrorKind::Fatal => {
                    // The producer is unusable; the broker decides.
                    tracing::warn!(transactional_id = %c.transactional_id, %error, "commit failed fatally; asking the transaction coordinator with EndTxn");
                    self.retire_producer(slot);
                    retire(vec![producer]);
                    return self.finish_with_end_txn(c).await;
                }
                TxnErrorKind::Retriable | TxnErrorKind::Other => {
                    self.slots[slot].state = SlotState::Broken;
                    return Err(self.transient(format!(
                        "committing transactional id {} of checkpoint {}: {error}; the pipeline restarts and \
                         recovery commits it with EndTxn",
                        c.transactional_id, c.checkpoint
                    )));
                }
            }
        }
    }

    /// Bookkeeping after `slot`'s transaction (pre-committed at
    /// `prepared_at`) was committed or lost.
    fn mark_committed(&mut self, slot: Option<usize>, prepared_at: u64, c: &KafkaCommittable) {
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].state, SlotState::Committed { at } if at < prepared_at) {
                self.slots[i].state = SlotState::Free;
                if self.slots[i].producer.is_none() && self.slots[i].initializing.is_none() {
                    // Only now: initializing bumps the epoch, which must not
                    // happen while a persisted checkpoint may list the id.
                    self.slots[i].initializing = self.spawn_init(i);
                }
            }
        }
        if let Some(slot) = slot {
            let at = self.tick();
            self.slots[slot].state = SlotState::Committed { at };
        }
        if self.recent.len() == RECENT_COMMITS {
            self.recent.pop_front();
        }
        self.recent.push_back(c.clone());
    }

    /// Warns (once each) about pre-committed transactions that used
    /// `timeout_warning_share` of `transaction_timeout`.
    fn warn_about_old_transactions(&mut self) {
        let (timeout, share) = (self.config().transaction_timeout, self.config().timeout_warning_share);
        let mut warned = 0;
        for slot in &mut self.slots {
            if let SlotState::Prepared {
                committable,
                warned: w @ false,
                ..
            } = &mut slot.state
            {
                let age = age(committable.began_at_ms);
                if past_timeout_share(age, timeout, share) {
                    *w = true;
                    warned += 1;
                    tracing::warn!(
                        sink = %self.settings.label,
                        transactional_id = %committable.transactional_id,
                        checkpoint = %committable.checkpoint,
                        age = %humantime::format_duration(Duration::from_secs(age.as_secs())),
                        transaction_timeout = %humantime::format_duration(timeout),
                        "a pre-committed transaction is still waiting for its checkpoint; if the broker's \
                         transaction timeout passes first, its records are lost: raise transaction_timeout \
                         or look at why checkpoints are slow"
                    );
                }
            }
        }
        add(&self.settings.metrics.timeout_warnings, warned);
    }

    /// Fails (transient) when an open or pre-committed transaction has used
    /// [`ABORT_AHEAD_SHARE`] of `transaction_timeout`: its checkpoint is late
    /// (checkpoints time out, or a write is slow), and waiting longer risks
    /// the broker aborting it after its checkpoint listed it, which loses its
    /// records. Failing now makes recovery abort it (or commit it, if a
    /// checkpoint listing it did land) and replay its records in time.
    fn fail_if_near_timeout(&self) -> Result<(), ConnectorError> {
        let timeout = self.config().transaction_timeout;
        for slot in &self.slots {
            let (began_at_ms, checkpoint, state) = match &slot.state {
                SlotState::Open { began_at_ms } => (*began_at_ms, None, "open"),
                SlotState::Prepared { committable, .. } => {
                    (committable.began_at_ms, Some(committable.checkpoint), "pre-committed")
                }
                _ => continue,
            };
            let age = age(began_at_ms);
            if past_timeout_share(age, timeout, ABORT_AHEAD_SHARE) {
                let checkpoint = checkpoint.map_or_else(String::new, |c| format!(" of checkpoint {c}"));
                return Err(self.transient(format!(
                    "the {state} transaction{checkpoint} on transactional id {} began {} ago, {:.0} % of \
                     transaction_timeout ({}), and its checkpoint has not completed; failing now so that recovery \
                     aborts and replays it before the broker aborts it. Checkpoints are late: look at the \
                     checkpoint warnings above (timeouts, slow writes)",
                    slot.transactional_id,
                    humantime::format_duration(Duration::from_secs(age.as_secs())),
                    ABORT_AHEAD_SHARE * 100.0,
                    humantime::format_duration(timeout),
                )));
            }
        }
        Ok(())
    }

    fn pool_exhausted(&self) -> ConnectorError {
        let pending: Vec<String> = self
            .slots
            .iter()
            .filter_map(|s| match &s.state {
                SlotState::Prepared { committable, .. } => Some(committable.checkpoint.to_string()),
                _ => None,
            })
            .collect();
        self.transient(format!(
            "all {} transactional producers are busy: {} hold pre-committed transactions waiting for checkpoints \
             (checkpoints {}), the others hold the transactions committed last, whose ids stay reserved until \
             the next checkpoint completes. Checkpoints fail or complete slower than they are taken: raise \
             `pool_size` or the checkpoint interval",
            self.slots.len(),
            pending.len(),
            pending.join(", ")
        ))
    }

    fn free_slot(&self) -> Option<usize> {
        let n = self.slots.len();
        (0..n)
            .map(|k| (self.next_slot + k) % n)
            .find(|&i| matches!(self.slots[i].state, SlotState::Free))
    }
}

#[async_trait]
impl TwoPhaseCommitSink for KafkaSink {
    type Transaction = KafkaTransaction;
    type Committable = KafkaCommittable;

    /// Commits the listed transactions with EndTxn as the producer id and
    /// epoch they were written with — never InitProducerId first, which
    /// would abort them — then initializes a producer for every pooled id
    /// the list does not name, which aborts what a crash left open there.
    /// Listed ids are not initialized: a second recovery from the same
    /// checkpoint must find them at the same epoch.
    async fn recover(&mut self, pending: &[KafkaCommittable]) -> Result<(), ConnectorError> {
        let started = Instant::now();
        self.await_earlier_inits().await;
        self.check_broker_limit().await?;
        if self.context.subtask == 0 {
            let config = self.config();
            if let Some(warning) = timeout_headroom_warning(
                config.transaction_timeout,
                self.settings.checkpoint_interval,
                config.expected_restart_time,
            ) {
                tracing::warn!(sink = %self.settings.label, "{warning}");
            }
        }
        self.check_topic().await?;

        let mut listed = BTreeSet::new();
        for c in pending {
            if c.began_at_ms > 0 && past_timeout_share(age(c.began_at_ms), self.config().transaction_timeout, 1.0) {
                tracing::warn!(transactional_id = %c.transactional_id, checkpoint = %c.checkpoint, "this transaction is older than transaction_timeout; the broker may have aborted it");
            }
            self.finish_with_end_txn(c).await?;
            self.mark_committed(None, 0, c);
            listed.insert(c.transactional_id.clone());
        }

        self.abort_adopted(&listed).await?;
        let unlisted: Vec<usize> = (0..self.slots.len())
            .filter(|&i| !listed.contains(&self.slots[i].transactional_id))
            .collect();
        let ids = unlisted
            .iter()
            .map(|&i| self.slots[i].transactional_id.clone())
            .collect();
        let producers = self.init_producers(ids).await?;
        for i in 0..self.slots.len() {
            self.retire_producer(i);
            self.slots[i].initializing = None;
            self.slots[i].state = SlotState::Committed { at: 0 };
        }
        for (&i, producer) in unlisted.iter().zip(producers) {
            self.slots[i].producer = Some(producer);
            self.slots[i].state = SlotState::Free;
        }
        self.clock = 1;
        self.recovered = true;
        tracing::info!(
            sink = %self.settings.label,
            subtask = self.context.subtask,
            committed = listed.len(),
            initialized = unlisted.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "Kafka sink recovered"
        );
        Ok(())
    }

    /// Takes the next free slot (rotating) and begins a transaction there.
    ///
    /// The runtime calls it lazily, on the first record of an interval, and
    /// the sink keeps it that way rather than beginning eagerly: beginning
    /// is local in librdkafka (the broker hears of the transaction with its
    /// first record), an idle interval then holds no producer and no
    /// transaction, and the broker's transaction timeout starts when data
    /// does.
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<KafkaTransaction, ConnectorError> {
        if !self.recovered {
            return Err(self.fatal("begin called before recover"));
        }
        self.fail_if_near_timeout()?;
        self.warn_about_old_transactions();
        let slot = self.free_slot().ok_or_else(|| self.pool_exhausted())?;
        if self.slots[slot].producer.is_none() {
            let init = match self.slots[slot].initializing.take().or_else(|| self.spawn_init(slot)) {
                Some(init) => init,
                None => return Err(self.transient("a recovery of this subtask is running; retrying after it")),
            };
            match init.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())) {
                Ok(producer) => self.slots[slot].producer = Some(Arc::new(producer)),
                Err(e) if e.fatal => return Err(self.fatal(e.message)),
                Err(e) => return Err(self.transient(e.message)),
            }
        }
        let producer = self.producer(slot)?;
        let generation = match producer.begin() {
            Ok(generation) => generation,
            Err(error) => {
                self.slots[slot].state = SlotState::Broken;
                return Err(self.transient(format!(
                    "beginning a transaction on {}: {error}",
                    self.slots[slot].transactional_id
                )));
            }
        };
        let began_at_ms = now_ms();
        self.slots[slot].state = SlotState::Open { began_at_ms };
        self.next_slot = (slot + 1) % self.slots.len();
        tracing::debug!(
            transactional_id = %producer.transactional_id,
            producer_id = producer.producer_id,
            epoch = producer.epoch,
            %checkpoint,
            "transaction begun"
        );
        Ok(KafkaTransaction {
            slot,
            checkpoint,
            generation,
            records: 0,
            began_at_ms,
        })
    }

    async fn write(&mut self, txn: &mut KafkaTransaction, batch: &[Record]) -> Result<(), ConnectorError> {
        self.fail_if_near_timeout()?;
        let producer = self.producer(txn.slot)?;
        let (key_from, value_from) = (&self.settings.config.key, &self.settings.config.value);
        let topic = &self.settings.config.topic;
        for record in batch {
            let (key, value) = message_parts(record, key_from, value_from).map_err(|e| {
                self.fatal(format!(
                    "record {}@{}: {e}; fix the input or the sink's `key`/`value` setting",
                    record.split, record.offset
                ))
            })?;
            loop {
                let sent = producer.send(
                    topic,
                    None,
                    key.as_deref(),
                    value.as_deref(),
                    record.timestamp_ms,
                    &record.headers,
                    txn.generation,
                );
                match sent {
                    Ok(()) => break,
                    Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)) => {
                        return Err(self.fatal(format!(
                            "record {}@{} is larger than the producer's message.max.bytes; raise it in \
                             `properties` (and the topic's max.message.bytes)",
                            record.split, record.offset
                        )))
                    }
                    Err(error) => return Err(self.transient(format!("producing to topic {topic}: {error}"))),
                }
            }
            txn.records += 1;
        }
        if let Some((n, first)) = producer.failures() {
            return Err(self.transient(format!(
                "{n} records could not be delivered to topic {topic} (first error: {first}); the checkpoint fails \
                 and they are written again after recovery"
            )));
        }
        self.warn_about_old_transactions();
        Ok(())
    }

    /// Flushes every outstanding record and checks each was delivered, then
    /// checks librdkafka's statistics (same producer id and epoch, the
    /// transaction still committable). Any failure fails the checkpoint; the
    /// records are then replayed after recovery.
    async fn pre_commit(&mut self, txn: KafkaTransaction) -> Result<KafkaCommittable, ConnectorError> {
        self.fail_if_near_timeout()?;
        let producer = self.producer(txn.slot)?;
        let p = producer.clone();
        let timeout = self.config().transaction_timeout;
        let checked = blocking(move || {
            p.flush(timeout).map_err(|e| format!("flushing: {e}"))?;
            if let Some((n, first)) = p.failures() {
                return Err(format!("{n} records were not delivered (first error: {first})"));
            }
            p.health()
        })
        .await;
        if let Err(problem) = checked {
            self.slots[txn.slot].state = SlotState::Broken;
            return Err(self.transient(format!(
                "pre-committing the transaction of {} (checkpoint {}): {problem}; the checkpoint fails and its \
                 records are written again after recovery",
                producer.transactional_id, txn.checkpoint
            )));
        }
        let committable = KafkaCommittable {
            transactional_id: producer.transactional_id.clone(),
            producer_id: producer.producer_id,
            epoch: producer.epoch,
            checkpoint: txn.checkpoint,
            topic: self.config().topic.clone(),
            records: txn.records,
            began_at_ms: txn.began_at_ms,
        };
        tracing::debug!(?committable, "transaction pre-committed");
        let at = self.tick();
        self.slots[txn.slot].state = SlotState::Prepared {
            committable: committable.clone(),
            at,
            warned: false,
        };
        Ok(committable)
    }

    /// No checkpoint may list a transaction 80 % through its timeout (see
    /// [`fail_if_near_timeout`](Self::fail_if_near_timeout)).
    async fn check_pending(&mut self) -> Result<(), ConnectorError> {
        self.fail_if_near_timeout()
    }

    /// Commits with the producer that wrote the transaction when it still
    /// holds it; otherwise with EndTxn as the recorded producer id and epoch.
    async fn commit(&mut self, c: &KafkaCommittable) -> Result<(), ConnectorError> {
        if self.recent.contains(c) {
            tracing::debug!(transactional_id = %c.transactional_id, checkpoint = %c.checkpoint, "already committed");
            return Ok(());
        }
        self.warn_about_old_transactions();
        let holder = self
            .slots
            .iter()
            .position(|s| matches!(&s.state, SlotState::Prepared { committable, .. } if committable == c));
        if let Some(slot) = holder {
            let SlotState::Prepared { at, .. } = self.slots[slot].state else {
                unreachable!("found above")
            };
            self.commit_live(slot, c).await?;
            self.mark_committed(Some(slot), at, c);
            return Ok(());
        }
        let slot = self.slot_of(&c.transactional_id);
        if let Some(i) = slot {
            let same_producer = self.slots[i]
                .producer
                .as_ref()
                .is_some_and(|p| (p.producer_id, p.epoch) == (c.producer_id, c.epoch));
            if same_producer && matches!(self.slots[i].state, SlotState::Open { .. } | SlotState::Prepared { .. }) {
                return Err(self.fatal(format!(
                    "refusing to commit transactional id {} of checkpoint {} with EndTxn: the id holds another \
                     transaction with the same producer id and epoch now, which EndTxn would commit instead",
                    c.transactional_id, c.checkpoint
                )));
            }
        }
        self.finish_with_end_txn(c).await?;
        let free_to_reset =
            slot.filter(|&i| matches!(self.slots[i].state, SlotState::Free | SlotState::Committed { .. }));
        if let Some(i) = free_to_reset {
            // librdkafka's producer does not know EndTxn ended it.
            self.retire_producer(i);
        }
        // Not pre-committed here: nothing is known to have been committed after it.
        self.mark_committed(free_to_reset, 0, c);
        Ok(())
    }

    async fn abort(&mut self, txn: KafkaTransaction) -> Result<(), ConnectorError> {
        let producer = self.producer(txn.slot)?;
        match blocking(move || producer.abort(REQUEST_TIMEOUT)).await {
            Ok(()) => {
                self.slots[txn.slot].state = SlotState::Free;
                Ok(())
            }
            Err(error) => {
                self.slots[txn.slot].state = SlotState::Broken;
                Err(self.transient(format!("aborting a transaction: {error}; recovery cleans it up")))
            }
        }
    }

    /// Always [`ReplayCheck::Unknown`]: the transactional ids' state cannot
    /// prove it. The broker keeps, per transactional id, whether its latest
    /// transaction committed or aborted, with the producer id and epoch, but
    /// not which checkpoint it belonged to: each slot's id carries one
    /// checkpoint's transaction after another, and neither the broker nor
    /// the records written hold a checkpoint id. A commit of a checkpoint
    /// after the restored one looks exactly like the commits the restored
    /// one lists (epochs would differ only on brokers that bump the epoch at
    /// every transaction, and a pool slot that committed nothing the
    /// checkpoint lists says nothing either way). So a fallback past
    /// unreadable entries of a Kafka-sink pipeline is refused unless the
    /// operator accepts its possible duplicates (`allow_fallback`).
    async fn check_replay_after(&mut self, _checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError> {
        Ok(ReplayCheck::Unknown)
    }
}

/// Drops producers on a blocking thread when there is a runtime: closing a
/// librdkafka client waits for its threads.
fn retire(producers: Vec<Arc<TxnProducer>>) {
    if let (false, Ok(runtime)) = (producers.is_empty(), tokio::runtime::Handle::try_current()) {
        runtime.spawn_blocking(move || drop(producers));
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        // Nothing is aborted: what is open is recovery's business.
        retire(self.slots.iter_mut().filter_map(|s| s.producer.take()).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exactly_kafka_wire::kafka_protocol::messages::ApiKey;
    use exactly_kafka_wire::kafka_protocol::ResponseError;

    fn outcome(o: EndTxnOutcome) -> EndTxnVerdict {
        classify_end_txn(&Ok(o))
    }

    #[test]
    fn end_txn_answers_map_to_what_the_sink_does() {
        assert_eq!(outcome(EndTxnOutcome::Ok), EndTxnVerdict::Committed);
        for lost in [
            EndTxnOutcome::InvalidTxnState,
            EndTxnOutcome::ProducerFenced(ResponseError::ProducerFenced),
            EndTxnOutcome::ProducerFenced(ResponseError::InvalidProducerEpoch),
            EndTxnOutcome::InvalidProducerIdMapping,
        ] {
            let EndTxnVerdict::Lost(reason) = outcome(lost) else {
                panic!("{lost:?} must be a loss")
            };
            assert!(reason.contains(&format!("error code {}", lost.code())), "{reason}");
        }
        for retry in [
            ResponseError::ConcurrentTransactions,
            ResponseError::CoordinatorLoadInProgress,
            ResponseError::NotCoordinator,
            ResponseError::CoordinatorNotAvailable,
        ] {
            assert!(matches!(
                outcome(EndTxnOutcome::Retriable(retry)),
                EndTxnVerdict::Retry(_)
            ));
        }
        let EndTxnVerdict::Fatal(reason) = outcome(EndTxnOutcome::Other(59)) else {
            panic!("an unknown answer must stop the pipeline")
        };
        assert!(reason.contains("neither"), "{reason}");
    }

    #[test]
    fn wire_errors_map_to_retries_refusals_or_stops() {
        // A broker going down closes the connection: no verdict on the
        // transaction, ask again.
        let closed = WireError::Closed {
            addr: "b:1".into(),
            api: ApiKey::EndTxn,
        };
        assert!(matches!(classify_end_txn(&Err(closed)), EndTxnVerdict::Retry(_)));
        let timeout = WireError::Timeout {
            addr: "b:1".into(),
            api: ApiKey::EndTxn,
            after: Duration::from_secs(1),
        };
        assert!(matches!(classify_end_txn(&Err(timeout)), EndTxnVerdict::Retry(_)));
        let refused = WireError::Connect {
            addr: "b:1".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(matches!(classify_end_txn(&Err(refused)), EndTxnVerdict::Retry(_)));
        let unsupported = WireError::ApiNotSupported {
            addr: "b:1".into(),
            api: ApiKey::EndTxn,
            broker: None,
            client: exactly_kafka_wire::kafka_protocol::protocol::VersionRange { min: 0, max: 4 },
        };
        assert!(matches!(classify_end_txn(&Err(unsupported)), EndTxnVerdict::Fatal(_)));
    }

    #[test]
    fn keys_and_values_come_from_the_configured_place() {
        let record = Record::new("in-0", 7, r#"{"id":42,"name":"ada","tags":["x"],"gone":null}"#).with_key("k");
        let parts = |k: &str, v: &str| {
            message_parts(&record, &KeyFrom::parse(k).unwrap(), &ValueFrom::parse(v).unwrap())
                .map(|(k, v)| (k.map(|k| k.into_owned()), v.map(|v| v.into_owned())))
        };
        let text = |s: &str| Some(s.as_bytes().to_vec());
        assert_eq!(parts("key", "value"), Ok((text("k"), Some(record.value.to_vec()))));
        assert_eq!(parts("value", "value").unwrap().0, Some(record.value.to_vec()));
        assert_eq!(parts("none", "value").unwrap().0, None);
        assert_eq!(parts("/id", "/name"), Ok((text("42"), text("ada"))));
        assert_eq!(parts("/name", "/tags"), Ok((text("ada"), text(r#"["x"]"#))));
        assert_eq!(parts("/gone", "/gone"), Ok((None, None)), "null: no key, a tombstone");
        let e = parts("/missing", "value").unwrap_err();
        assert!(e.contains("`key`") && e.contains("/missing"), "{e}");
        let e = parts("key", "/missing").unwrap_err();
        assert!(e.contains("`value`"), "{e}");
        let plain = Record::new("in-0", 8, "not json");
        let e = message_parts(
            &plain,
            &KeyFrom::Pointer(JsonPointer::parse("/id").unwrap()),
            &ValueFrom::Value,
        )
        .unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        assert!(
            message_parts(&plain, &KeyFrom::Key, &ValueFrom::Value).is_ok(),
            "no JSON needed"
        );
    }

    #[test]
    fn identity_and_transactional_ids() {
        let mut config = KafkaSinkConfig::new("127.0.0.1:1", "out");
        config.pool_size = 3;
        let f = KafkaSinkFactory::new("copy", config.clone()).unwrap();
        assert_eq!(
            f.identity(),
            "kafka:topic=out,transactional_id_prefix=exactly-copy,pool_size=3"
        );
        assert_eq!(
            f.transactional_ids(1),
            ["exactly-copy-1-0", "exactly-copy-1-1", "exactly-copy-1-2"]
        );
        config.transactional_id_prefix = Some("mine".into());
        let f = KafkaSinkFactory::new("copy", config.clone()).unwrap();
        assert_eq!(f.transactional_ids(0)[2], "mine-0-2");
        config.properties.insert("security.protocol".into(), "tls".into());
        let e = KafkaSinkFactory::new("copy", config).unwrap_err().to_string();
        assert!(e.starts_with("kafka sink: `properties`"), "{e}");
    }
}
