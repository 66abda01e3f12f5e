//! The transactional Kafka sink: every checkpoint's records are one Kafka
//! transaction per sink subtask, committed when the checkpoint completes.
//!
//! ```text
//!  write ─────▶ the slot's producer ──(librdkafka: batches, retries, idempotence)──▶ topic partitions
//!               (transactional id <prefix>-<subtask>-<slot>)               records of an open transaction
//!  barrier ───▶ pre_commit: flush, every delivery checked, ──▶ KafkaCommittable ──▶ the checkpoint lists it
//!               producer id and epoch read from the batch     {transactional id, producer id, epoch, checkpoint}
//!               of a delivered record (one Fetch)
//!  completed ─▶ commit: commit_transaction on the producer that wrote it ─────────▶ COMMIT markers
//!  restart ───▶ recover: EndTxn as {producer id, epoch} for what the checkpoint lists
//!               (exactly-kafka-wire), InitProducerId for every other id of the pool
//! ```
//!
//! One file per part: `factory.rs` (settings shared by the subtasks, the
//! ids a subtask owns), [`config`] (`[sink.kafka]` and the timeout
//! guardrails), `pool.rs` (which transactional id takes the next
//! transaction: pure bookkeeping, property-tested), `producer.rs` (one
//! librdkafka transactional producer), `epoch.rs` (each transaction's
//! producer id and epoch, from its records; KIP-360 bumps followed,
//! transactions v2 refused), `encoding.rs` (a record's key, value and
//! headers), `recovery.rs` (EndTxn and what its answers mean),
//! `metrics.rs`.
//!
//! **A pool of ids, never more.** Every sink subtask owns `pool_size`
//! transactional ids, each with its own producer: a pre-committed
//! transaction stays open until its checkpoint completes while the next
//! interval already writes, so one producer is not enough, and a fixed set
//! of ids lets recovery find every transaction a crash left behind (it
//! initializes each id the checkpoint does not list, which aborts what was
//! open there). Why a committed transaction's id rests until the next
//! commit, and so why three ids at least, is in `pool.rs`.
//!
//! **EndTxn, not librdkafka, after a restart.** librdkafka cannot resume a
//! transaction another process began: its only way in, InitProducerId,
//! aborts it. So the committable records the producer id and epoch, and
//! recovery sends EndTxn as that producer (never InitProducerId first on a
//! listed id, and not afterwards either: a second recovery from the same
//! checkpoint must find it at the same epoch). The producer id and epoch
//! are read per transaction from the records it wrote — librdkafka does
//! not expose them, and its statistics go stale when an abort bumps the
//! epoch (KIP-360) — and the sink refuses Kafka transactions v2, which
//! bump the epoch at every commit (why, in `epoch.rs`).
//!
//! # Retries
//!
//! - *Deliveries* are librdkafka's business (the idempotent producer
//!   retries within `message.timeout.ms`). A delivery that still fails
//!   makes the transaction abortable, which no retry of the sink can
//!   mend: the write or pre-commit fails with a transient error, the
//!   checkpoint fails, and the records are written again after recovery.
//!   A full local queue is waited out (5 ms at a time).
//! - *Commits* on the live producer are retried while librdkafka calls the
//!   error retriable, with backoff from 100 ms to 2 s, for up to 60 s.
//! - *EndTxn* is retried on every answer that is not a verdict —
//!   CONCURRENT_TRANSACTIONS, a coordinator moving or loading, a connection
//!   closed, refused or timed out (a broker restarting) — with the same
//!   backoff for up to 60 s; then the attempt fails with a transient error,
//!   the pipeline restarts and asks again. Nothing is decided on a timer.
//! - *Producer initialization* is not retried here: a failure is transient
//!   (the attempt restarts) unless librdkafka calls it fatal (bad settings,
//!   authorization), which stops the pipeline.
//!
//! # Error handling
//!
//! - *Only the transaction coordinator's answer decides that a
//!   transaction is lost.* PRODUCER_FENCED, INVALID_PRODUCER_EPOCH,
//!   INVALID_TXN_STATE and INVALID_PRODUCER_ID_MAPPING to an EndTxn commit
//!   mean the transaction is gone (timed out, or fenced by another producer
//!   of the id): a [`DataLoss`](exactly_core::ConnectorError::DataLoss)
//!   naming the id and the checkpoint, or with `on_lost_transaction =
//!   "warn"` an error log and a count. A connection error never is: it is
//!   retried (above).
//! - *A live commit that fails fatally* (the producer was fenced or broke)
//!   is not taken as a loss: the producer is dropped and the coordinator is
//!   asked with EndTxn. One that fails as abortable was aborted by
//!   librdkafka, and after pre-commit that is a loss, reported as above.
//! - *An EndTxn answer that is neither success nor a known refusal* stops
//!   the pipeline (fatal): nothing is decided by guess; a new run asks
//!   again.
//! - *A record whose key or value cannot be taken as configured* (a JSON
//!   pointer into a value that is not JSON or lacks the field) goes, with
//!   `dead_letter_topic` set, to that topic unchanged with the reason in
//!   headers, in the same transaction as its interval (so it is there
//!   exactly when the interval is, and replayed with it), counted in
//!   `Metrics::dead_letters`; without it, it stops the pipeline with a
//!   fatal error naming the record. Nothing is dropped silently. A record
//!   larger than the producer's `message.max.bytes` stops the pipeline,
//!   naming the setting: its dead letter would be as large, and it is a
//!   setting to fix rather than a bad record.
//! - *Nothing is aborted when a subtask is dropped* (a failed attempt, a
//!   crash): what it left open is recovery's business, and an abort could
//!   race a recovery that already began.
//! - *Transactions are never left to the broker's timeout.* An open or
//!   pre-committed transaction 80 % through `transaction_timeout` fails
//!   the attempt (transient), so recovery aborts or commits it in time; at
//!   start, checkpoint settings under which a checkpoint could outlive its
//!   transactions, and a timeout above the broker's
//!   `transaction.max.timeout.ms`, are refused.
//! - *An epoch that changes between two transactions of one producer*
//!   is followed after an abort (KIP-360, counted in `epoch_bumps`); with
//!   no abort in between it is a commit-time bump (transactions v2) and
//!   stops the pipeline, as does, at start, a librdkafka newer than the
//!   verified ones against brokers that enable transactions v2: a wrong
//!   epoch in a checkpoint would turn into a false data loss at recovery.
//! - Errors keep their cause (librdkafka's or the wire client's) as their
//!   `source`, except a rejected setting whose value may be a secret.

pub mod config;
mod encoding;
mod epoch;
mod factory;
mod metrics;
mod pool;
mod producer;
mod recovery;

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use exactly_core::{fault, CheckpointId, ConnectorError, Record, ReplayCheck, SinkContext, TwoPhaseCommitSink};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use serde::{Deserialize, Serialize};

use config::{past_timeout_share, timeout_headroom_warning, KafkaSinkConfig, ABORT_AHEAD_SHARE};
use encoding::{dead_letter_headers, dead_letter_of, message_of};
pub use factory::KafkaSinkFactory;
use factory::Settings;
use metrics::add;
pub use metrics::KafkaSinkMetricsSnapshot;
use pool::{age, SlotPool, SlotState};
use producer::{blocking, retire, txn_error_kind, InitError, TxnErrorKind, TxnProducer};
use recovery::{retries_for, COMMIT_DEADLINE};

/// Longest single blocking librdkafka call (InitProducerId, commit, abort).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// Records in the transaction, for `topic`.
    #[serde(default)]
    pub records: u64,
    /// Dead letters in the transaction, for `dead_letter_topic`.
    #[serde(default)]
    pub dead_letters: u64,
    /// When its first record was written (Unix milliseconds): the broker's
    /// transaction timeout runs from about then.
    #[serde(default)]
    pub began_at_ms: u64,
}

/// An open transaction: which slot holds it.
#[derive(Debug)]
pub struct KafkaTransaction {
    slot: usize,
    checkpoint: CheckpointId,
    generation: usize,
    records: u64,
    dead_letters: u64,
    began_at_ms: u64,
}

/// The producer side of one pooled transactional id.
struct Slot {
    transactional_id: String,
    /// An initialized producer; `None` when the slot must initialize one
    /// before its next transaction.
    producer: Option<Arc<TxnProducer>>,
    /// A producer being initialized in the background since the slot became
    /// free.
    initializing: Option<tokio::task::JoinHandle<Result<TxnProducer, InitError>>>,
}

/// One sink subtask. See [`KafkaSinkFactory`].
struct KafkaSink {
    settings: Arc<Settings>,
    context: SinkContext,
    /// The producers of the pool, by slot.
    slots: Vec<Slot>,
    /// What each slot is doing.
    pool: SlotPool,
    recovered: bool,
}

/// Now, in Unix milliseconds.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl KafkaSink {
    /// Subtask `context.subtask` of a sink, owning the transactional `ids`.
    fn new(settings: Arc<Settings>, context: SinkContext, ids: Vec<String>) -> KafkaSink {
        let pool = SlotPool::new(ids.len());
        let slots = ids
            .into_iter()
            .map(|transactional_id| Slot {
                transactional_id,
                producer: None,
                initializing: None,
            })
            .collect();
        KafkaSink {
            settings,
            context,
            slots,
            pool,
            recovered: false,
        }
    }

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
        // A worker past its deadline on the region must not initialize: the
        // broker fences whoever initialized the id before, which may be the
        // region's new owner by now.
        if let Some(owned) = self.context.ownership.as_ref().filter(|o| !o.acting.holds()) {
            tracing::warn!(
                subtask = self.context.subtask,
                transactional_id = %id,
                epoch = %owned.epoch,
                "this worker's lease on the region may have run out: not initializing a producer"
            );
            return None;
        }
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
        let acting = self.context.ownership.as_ref().map(|o| o.acting.clone());
        Some(tokio::task::spawn_blocking(move || {
            let _in_flight = in_flight;
            fault::pause_blocking("kafka_sink.before_init_producer");
            // Asked again right before the call: the thread may have waited.
            if acting.is_some_and(|a| !a.holds()) {
                return Err(InitError::past_deadline(&id));
            }
            TxnProducer::init(&config, &id, REQUEST_TIMEOUT)
        }))
    }

    /// Initializes a producer for each of `ids` in parallel, which fences
    /// earlier producers of those ids and aborts what they left open.
    async fn init_producers(&self, ids: Vec<String>) -> Result<Vec<Arc<TxnProducer>>, ConnectorError> {
        let Some(tasks) = ids
            .into_iter()
            .map(|id| self.spawn_init_id(id))
            .collect::<Option<Vec<_>>>()
        else {
            if self.context.ownership.as_ref().is_some_and(|o| !o.acting.holds()) {
                return Err(self.transient(
                    "this worker's lease on the region may have run out (its deadline passed): not initializing \
                     producers",
                ));
            }
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
        Err(e.into_error(self.where_()))
    }

    /// Bookkeeping after `slot`'s pre-committed transaction was committed
    /// (or lost): slots freed by it initialize a new producer if they have
    /// none (only now: initializing bumps the epoch, which must not happen
    /// while a persisted checkpoint may list the id).
    fn mark_committed(&mut self, slot: usize) {
        for freed in self.pool.commit(slot) {
            if self.slots[freed].producer.is_none() && self.slots[freed].initializing.is_none() {
                self.slots[freed].initializing = self.spawn_init(freed);
            }
        }
    }

    /// Warns (once each) about pre-committed transactions that used
    /// `timeout_warning_share` of `transaction_timeout`.
    fn warn_about_old_transactions(&mut self) {
        let (timeout, share) = (self.config().transaction_timeout, self.config().timeout_warning_share);
        let due = self.pool.take_warnings(now_ms(), timeout, share);
        for committable in &due {
            let age = age(committable.began_at_ms, now_ms());
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
        add(&self.settings.metrics.timeout_warnings, due.len() as u64);
    }

    /// Fails (transient) when an open or pre-committed transaction has used
    /// [`ABORT_AHEAD_SHARE`] of `transaction_timeout`: its checkpoint is late
    /// (checkpoints time out, or a write is slow), and waiting longer risks
    /// the broker aborting it after its checkpoint listed it, which loses its
    /// records. Failing now makes recovery abort it (or commit it, if a
    /// checkpoint listing it did land) and replay its records in time.
    fn fail_if_near_timeout(&self) -> Result<(), ConnectorError> {
        let timeout = self.config().transaction_timeout;
        let Some(overdue) = self.pool.overdue(now_ms(), timeout, ABORT_AHEAD_SHARE) else {
            return Ok(());
        };
        let (state, checkpoint) = match overdue.checkpoint {
            None => ("open", String::new()),
            Some(c) => ("pre-committed", format!(" of checkpoint {c}")),
        };
        let age = age(overdue.began_at_ms, now_ms());
        Err(self.transient(format!(
            "the {state} transaction{checkpoint} on transactional id {} began {} ago, {:.0} % of \
             transaction_timeout ({}), and its checkpoint has not completed; failing now so that recovery \
             aborts and replays it before the broker aborts it. Checkpoints are late: look at the \
             checkpoint warnings above (timeouts, slow writes)",
            self.slots[overdue.slot].transactional_id,
            humantime::format_duration(Duration::from_secs(age.as_secs())),
            ABORT_AHEAD_SHARE * 100.0,
            humantime::format_duration(timeout),
        )))
    }

    fn pool_exhausted(&self) -> ConnectorError {
        let pending: Vec<String> = self.pool.pending_checkpoints().iter().map(|c| c.to_string()).collect();
        self.transient(format!(
            "all {} transactional producers are busy: {} hold pre-committed transactions waiting for checkpoints \
             (checkpoints {}), the others hold the transactions committed last, whose ids stay reserved until \
             the next checkpoint completes. Checkpoints fail or complete slower than they are taken: raise \
             `pool_size` or the checkpoint interval",
            self.pool.len(),
            pending.len(),
            pending.join(", ")
        ))
    }

    /// Commits the transaction `slot` holds with its own producer.
    async fn commit_live(&mut self, slot: usize, c: &KafkaCommittable) -> Result<(), ConnectorError> {
        let producer = self.producer(slot)?;
        let mut backoff = retries_for(COMMIT_DEADLINE);
        loop {
            let p = producer.clone();
            let Err(error) = blocking(move || p.commit(REQUEST_TIMEOUT)).await else {
                add(&self.settings.metrics.committed, 1);
                tracing::debug!(transactional_id = %c.transactional_id, checkpoint = %c.checkpoint, "transaction committed");
                return Ok(());
            };
            match txn_error_kind(&error) {
                TxnErrorKind::Retriable if backoff.fits() => {
                    tracing::debug!(transactional_id = %c.transactional_id, %error, "commit: retrying");
                    backoff.pause().await;
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
                    self.pool.broken(slot);
                    return Err(self
                        .transient(format!(
                            "committing transactional id {} of checkpoint {} failed; the pipeline restarts and \
                             recovery commits it with EndTxn",
                            c.transactional_id, c.checkpoint
                        ))
                        .caused_by(error));
                }
            }
        }
    }
}

#[async_trait]
impl TwoPhaseCommitSink for KafkaSink {
    type Transaction = KafkaTransaction;
    type Committable = KafkaCommittable;

    /// Holds nothing another process would wait for: a new holder's
    /// `InitProducerId` on each transactional id fences this process's
    /// producers, and every transaction is committed by now.
    async fn close(&mut self) -> Result<exactly_core::Closed, ConnectorError> {
        Ok(exactly_core::Closed::Released)
    }

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
        self.check_transactions_version().await?;
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
        self.check_topic(&self.config().topic).await?;
        if let Some(dead_letters) = &self.config().dead_letter_topic {
            self.check_topic(dead_letters).await?;
        }

        let mut listed = BTreeSet::new();
        for c in pending {
            if c.began_at_ms > 0
                && past_timeout_share(age(c.began_at_ms, now_ms()), self.config().transaction_timeout, 1.0)
            {
                tracing::warn!(transactional_id = %c.transactional_id, checkpoint = %c.checkpoint, "this transaction is older than transaction_timeout; the broker may have aborted it");
            }
            self.finish_with_end_txn(c).await?;
            self.pool.committed_elsewhere(None, c.clone());
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
        }
        for (&i, producer) in unlisted.iter().zip(producers) {
            self.slots[i].producer = Some(producer);
        }
        let ids: Vec<String> = self.slots.iter().map(|s| s.transactional_id.clone()).collect();
        self.pool.recovered(|slot| listed.contains(&ids[slot]));
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
        let slot = self.pool.free_slot().ok_or_else(|| self.pool_exhausted())?;
        if self.slots[slot].producer.is_none() {
            let init = match self.slots[slot].initializing.take().or_else(|| self.spawn_init(slot)) {
                Some(init) => init,
                None => return Err(self.transient("a recovery of this subtask is running; retrying after it")),
            };
            match init.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())) {
                Ok(producer) => self.slots[slot].producer = Some(Arc::new(producer)),
                Err(e) => return Err(e.into_error(self.where_())),
            }
        }
        let producer = self.producer(slot)?;
        let generation = match producer.begin() {
            Ok(generation) => generation,
            Err(error) => {
                self.pool.broken(slot);
                return Err(self
                    .transient(format!(
                        "beginning a transaction on {} failed",
                        self.slots[slot].transactional_id
                    ))
                    .caused_by(error));
            }
        };
        let began_at_ms = now_ms();
        self.pool.open(slot, began_at_ms);
        tracing::debug!(
            transactional_id = %producer.transactional_id,
            written_as = ?producer.written_as(),
            %checkpoint,
            "transaction begun"
        );
        Ok(KafkaTransaction {
            slot,
            checkpoint,
            generation,
            records: 0,
            dead_letters: 0,
            began_at_ms,
        })
    }

    /// Queues every record of `batch`; a record whose key or value cannot
    /// be taken goes to `dead_letter_topic` (counted) when there is one, and
    /// stops the pipeline otherwise.
    async fn write(&mut self, txn: &mut KafkaTransaction, batch: &[Record]) -> Result<(), ConnectorError> {
        self.fail_if_near_timeout()?;
        let producer = self.producer(txn.slot)?;
        let settings = self.settings.clone();
        let config = &settings.config;
        let mut dead_letters = 0;
        for record in batch {
            let (topic, message, headers) = match message_of(record, &config.key, &config.value) {
                Ok(message) => (&config.topic, message, Cow::Borrowed(&record.headers[..])),
                Err(error) => {
                    let Some(dead_letter_topic) = &config.dead_letter_topic else {
                        return Err(self.fatal(format!(
                            "record {}@{} cannot be written: {error}; fix the input or the sink's `key`/`value` \
                                 setting, or set `dead_letter_topic`",
                            record.split, record.offset
                        )));
                    };
                    tracing::warn!(split = %record.split, offset = record.offset, %error, "record sent to the dead-letter topic {dead_letter_topic}");
                    dead_letters += 1;
                    let headers = dead_letter_headers(record, &error, &config.topic);
                    (dead_letter_topic, dead_letter_of(record), Cow::Owned(headers))
                }
            };
            loop {
                match producer.send(topic, &message, record.timestamp_ms, &headers, txn.generation) {
                    Ok(()) => break,
                    Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(error @ KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)) => {
                        return Err(self
                            .fatal(format!(
                                "record {}@{} is larger than the producer's message.max.bytes; raise it in \
                                 `properties` (and the topic's max.message.bytes)",
                                record.split, record.offset
                            ))
                            .caused_by(error))
                    }
                    Err(error) => {
                        return Err(self
                            .transient(format!("producing to topic {topic} failed"))
                            .caused_by(error))
                    }
                }
            }
        }
        txn.dead_letters += dead_letters;
        txn.records += batch.len() as u64 - dead_letters;
        if dead_letters > 0 {
            self.context.metrics.add_dead_letters(dead_letters);
        }
        if let Some((n, first)) = producer.failures() {
            return Err(self
                .transient(format!(
                    "{n} records could not be delivered (the first error is the cause); the checkpoint fails and \
                     they are written again after recovery"
                ))
                .caused_by(first));
        }
        self.warn_about_old_transactions();
        Ok(())
    }

    /// Flushes every outstanding record and checks each was delivered, then
    /// reads the producer id and epoch the transaction was written with
    /// from its records (see `epoch.rs`). Any failure fails the checkpoint;
    /// the records are then replayed after recovery.
    async fn pre_commit(&mut self, txn: KafkaTransaction) -> Result<KafkaCommittable, ConnectorError> {
        self.fail_if_near_timeout()?;
        let producer = self.producer(txn.slot)?;
        let p = producer.clone();
        let timeout = self.config().transaction_timeout;
        let flushed = blocking(move || {
            p.flush(timeout).map_err(|e| ("flushing failed".to_string(), e))?;
            match p.failures() {
                Some((n, first)) => Err((
                    format!("{n} records were not delivered (the first error is the cause)"),
                    first,
                )),
                None => Ok(()),
            }
        })
        .await;
        if let Err((problem, cause)) = flushed {
            self.pool.broken(txn.slot);
            return Err(self
                .transient(format!(
                    "pre-committing the transaction of {} (checkpoint {}): {problem}; the checkpoint fails and its \
                     records are written again after recovery",
                    producer.transactional_id, txn.checkpoint
                ))
                .caused_by(cause));
        }
        let (producer_id, epoch) = match self.written_as(&producer).await {
            Ok(written_as) => written_as,
            Err(error) => {
                self.pool.broken(txn.slot);
                return Err(error);
            }
        };
        let committable = KafkaCommittable {
            transactional_id: producer.transactional_id.clone(),
            producer_id,
            epoch,
            checkpoint: txn.checkpoint,
            topic: self.config().topic.clone(),
            records: txn.records,
            dead_letters: txn.dead_letters,
            began_at_ms: txn.began_at_ms,
        };
        tracing::debug!(?committable, "transaction pre-committed");
        self.pool.prepare(txn.slot, committable.clone());
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
        if self.pool.committed_recently(c) {
            tracing::debug!(transactional_id = %c.transactional_id, checkpoint = %c.checkpoint, "already committed");
            return Ok(());
        }
        self.warn_about_old_transactions();
        if let Some(slot) = self.pool.holder(c) {
            self.commit_live(slot, c).await?;
            self.mark_committed(slot);
            return Ok(());
        }
        let slot = self.slot_of(&c.transactional_id);
        if let Some(i) = slot {
            // A producer that wrote `c` writes its next transactions with
            // the same producer id and epoch (unless an abort bumped it;
            // then this errs on the safe side). A producer initialized
            // since has a higher epoch.
            let same_producer = self.slots[i]
                .producer
                .as_ref()
                .is_some_and(|p| p.written_as() == Some((c.producer_id, c.epoch)));
            let busy = matches!(self.pool.state(i), SlotState::Open { .. } | SlotState::Prepared { .. });
            if same_producer && busy {
                return Err(self.fatal(format!(
                    "refusing to commit transactional id {} of checkpoint {} with EndTxn: the id holds another \
                     transaction with the same producer id and epoch now, which EndTxn would commit instead",
                    c.transactional_id, c.checkpoint
                )));
            }
        }
        self.finish_with_end_txn(c).await?;
        if self.pool.committed_elsewhere(slot, c.clone()) {
            // librdkafka's producer does not know EndTxn ended it.
            self.retire_producer(slot.expect("a slot was reset"));
        }
        Ok(())
    }

    async fn abort(&mut self, txn: KafkaTransaction) -> Result<(), ConnectorError> {
        let producer = self.producer(txn.slot)?;
        match blocking(move || producer.abort(REQUEST_TIMEOUT)).await {
            Ok(()) => {
                self.pool.aborted(txn.slot);
                Ok(())
            }
            Err(error) => {
                self.pool.broken(txn.slot);
                Err(self
                    .transient("aborting a transaction failed; recovery cleans it up")
                    .caused_by(error))
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

impl Drop for KafkaSink {
    fn drop(&mut self) {
        // Nothing is aborted: what is open is recovery's business.
        retire(self.slots.iter_mut().filter_map(|s| s.producer.take()).collect());
    }
}

#[cfg(test)]
mod committable_tests {
    use super::*;

    /// Checkpoints written by earlier versions list committables of their
    /// form: each form ever written must still deserialize, and today's is
    /// pinned (docs/connectors.md, "Versioning a committable").
    #[test]
    fn committables_of_every_version_deserialize_and_todays_form_is_pinned() {
        // Before the record counts and the transaction's start were kept.
        let first: KafkaCommittable = serde_json::from_str(
            r#"{"transactional_id":"exactly-orders-0-1","producer_id":4001,"epoch":3,"checkpoint":12,"topic":"out"}"#,
        )
        .unwrap();
        assert_eq!(
            (first.records, first.dead_letters, first.began_at_ms),
            (0, 0, 0),
            "fields added later default to zero"
        );
        assert_eq!(first.checkpoint, CheckpointId(12));
        let today = KafkaCommittable {
            records: 500,
            dead_letters: 1,
            began_at_ms: 1_767_225_600_000,
            ..first
        };
        let text = serde_json::to_string(&today).unwrap();
        assert_eq!(
            text,
            r#"{"transactional_id":"exactly-orders-0-1","producer_id":4001,"epoch":3,"checkpoint":12,"topic":"out","records":500,"dead_letters":1,"began_at_ms":1767225600000}"#
        );
        assert_eq!(serde_json::from_str::<KafkaCommittable>(&text).unwrap(), today);
    }
}
