//! # exactly-kafka
//!
//! A Kafka source whose offsets live in exactly's checkpoints, and a
//! transactional Kafka sink that ties every checkpoint to Kafka transactions.
//!
//! - [`KafkaSourceConfig`]: the `[source.kafka]` settings (see its docs for
//!   every key and default), checked by [`KafkaSourceConfig::validate`].
//! - [`KafkaSourceFactory`]: implements [`exactly_core::SourceFactory`].
//!   Partition `p` of the topic belongs to subtask `p % parallelism` and is
//!   assigned explicitly; splits are named `<topic>-<partition>`; records are
//!   read with `read_committed`; new partitions are picked up and read from
//!   their beginning. The source speaks Kafka's protocol itself
//!   ([`exactly_kafka_wire::Fetcher`]): no librdkafka consumer, no copy of
//!   a key or value on the way to the sink.
//! - [`KafkaSinkConfig`] / [`KafkaSinkFactory`]: the `[sink.kafka]` settings
//!   and the transactional sink (see [below](#the-sink)).
//! - [`admin`]: plain clients for tests and demos (create topics, produce,
//!   read a topic back).
//!
//! ## Offsets
//!
//! The offsets in the checkpoint are the only truth. `restore` seeks every
//! partition the checkpoint lists to its offset. Other partitions start at
//! `start` on a first start; when the checkpoint has positions for the topic,
//! a partition it does not list was created after that checkpoint and is read
//! from its beginning (so records that arrived in it before a crash are not
//! skipped). Every start position is resolved to a number before the first
//! poll, and the runtime persists them in checkpoint 0 before any record
//! flows, so `latest` never moves forward on a restart. A partition the
//! checkpoint lists but the metadata does not show at start keeps its
//! checkpointed offset until it is back. Offsets are valid only on the
//! cluster they were read from: the checkpoint records the cluster id
//! (`<topic>@cluster:<id>`), and resuming against another cluster is refused,
//! naming both ids, unless `accept_cluster_id` names the new one.
//!
//! After a checkpoint completes its offsets are committed to the consumer
//! group (when `commit_offsets_to_group`) so lag tools see progress; they are
//! read only by `start = "group"` on a first start.
//!
//! ## Errors
//!
//! Broker outages, connections that fail and partitions whose leader moved
//! are retried with backoff (after fresh metadata); each is logged with
//! `tracing` (a warning when a run of failures starts) and counted
//! ([`KafkaSourceMetricsSnapshot::transient_errors`]). What no retry cures
//! is [`exactly_core::ConnectorError::Fatal`], with a message naming the
//! setting to fix: a refused password, a SASL mechanism the listener does
//! not enable, an untrusted or misnamed certificate, a TLS listener reached
//! without TLS, a topic the credentials may not read, a corrupt record
//! batch. Brokers that do not answer within `startup_timeout` at `restore`
//! give a transient error naming the bootstrap; a topic still unknown then
//! a fatal one naming the topic.
//!
//! ## The sink
//!
//! Every sink subtask owns a fixed pool of `pool_size` transactional ids,
//! `<prefix>-<subtask>-<slot>` (prefix `exactly-<pipeline>` unless
//! `transactional_id_prefix` says otherwise), each with its own librdkafka
//! producer. The set of ids a pipeline owns is known and never grows, so
//! recovery can find every transaction a crash left behind.
//!
//! | step | what the sink does |
//! |---|---|
//! | `begin` | takes the next free slot (rotating) and begins a transaction there — lazily, on the first record of an interval, as the runtime calls it: beginning is local in librdkafka, an idle interval holds no transaction, and the broker's timeout starts with the data |
//! | `write` | queues the records (key and value as configured; timestamp and headers kept) |
//! | `pre_commit` | flushes, fails the checkpoint on any delivery error, checks librdkafka's statistics (same producer id and epoch, transaction still committable) and returns `{transactional_id, producer_id, epoch, checkpoint, topic}` |
//! | `commit` | `commit_transaction` on the producer that still holds the transaction; otherwise EndTxn (`exactly_kafka_wire::end_txn`) as the recorded producer id and epoch |
//! | `recover` | EndTxn-commits every listed transaction (never InitProducerId first: it would abort it), then initializes a producer for every pooled id the list does not name, which aborts what was left open there |
//!
//! EndTxn answers: `Ok` (also for an already committed transaction) is
//! success; INVALID_TXN_STATE, PRODUCER_FENCED / INVALID_PRODUCER_EPOCH and
//! INVALID_PRODUCER_ID_MAPPING mean the transaction is gone (it timed out, or
//! another producer of the id fenced it): a
//! [`DataLoss`](exactly_core::ConnectorError::DataLoss) naming the id and the
//! checkpoint, or with `on_lost_transaction = "warn"` an error log and a
//! count ([`KafkaSinkMetricsSnapshot::lost_transactions`]). Coordinator
//! moves, loading coordinators, CONCURRENT_TRANSACTIONS and connections that
//! are closed, refused or time out (a broker restarting) are retried with
//! backoff for up to 60 s, then the attempt fails and the pipeline restarts
//! and asks again: only an answer of the transaction coordinator decides
//! that a transaction is gone. A pipeline stopped for longer than the
//! brokers' `transactional.id.expiration.ms` restarts cleanly: the runtime
//! records in the checkpoint folder when every sink has committed a
//! checkpoint (`committed-through`), and the transactions of such a
//! checkpoint are not asked about again. Before a new attempt's `recover`
//! touches anything, it waits for the InitProducerId calls the failed
//! attempt left running (a late one would fence the new producer of its id).
//!
//! **Why slots, and why one more than expected.** A pre-committed
//! transaction stays open until its checkpoint completes while the next
//! interval already writes, so a subtask needs at least two producers.
//! A third is needed because a committed transaction's id is kept out of
//! use until the next checkpoint completes: until then the latest persisted
//! checkpoint still lists it, a recovery from it sends EndTxn with its
//! producer id and epoch, and a new transaction on the same producer (same
//! id and epoch) would be committed by that EndTxn. Each further slot rides
//! out one more failed checkpoint in a row; when every slot is busy the next
//! `begin` fails with an error that says so (the pipeline restarts). For the
//! same reason `recover` does not initialize the listed ids: a second
//! recovery from the same checkpoint must find them at the same epoch.
//!
//! **Guardrails.** At start, checkpoint settings under which a checkpoint
//! could outlive its transactions are refused: `[checkpoint] interval` plus
//! `timeout` must be at most half of `transaction_timeout` (default 15 min);
//! the error names both keys and the values that would fit. While running,
//! a transaction still open or waiting for its checkpoint after 80 % of
//! `transaction_timeout` fails the attempt (a transient error), so recovery
//! aborts and replays it before the broker would abort it. At `recover` the
//! broker's `transaction.max.timeout.ms` (DescribeConfigs) is read and a
//! larger `transaction_timeout` is refused. A warning says
//! when `transaction_timeout` is less than 1.5 × (2 checkpoint intervals +
//! `expected_restart_time`); the interval comes from
//! [`KafkaSinkFactory::with_checkpoint_interval`], which the `exactly`
//! command calls with `[checkpoint] interval`. Every pre-committed
//! transaction older than `timeout_warning_share` of the timeout is warned
//! about once.
//!
//! **Records.** A record whose key or value cannot be taken as configured (a
//! JSON pointer into a value that is not JSON or lacks the field) stops the
//! pipeline with a fatal error naming the record: nothing is dropped silently.
//!
//! **Brokers.** Apache Kafka; the tests run against Apache Kafka 4.1.1 (a
//! single KRaft node started by exactly-testkit, or the cluster named by
//! `EXACTLY_KAFKA_BOOTSTRAP`). A Kafka-compatible broker must implement the
//! transaction protocol as Kafka does (InitProducerId aborting an open
//! transaction, EndTxn error codes, aborted transactions listed in
//! read_committed Fetch answers), or exactly-once does not hold.

pub mod admin;
mod client;
mod config;
mod producer;
mod sink;
mod sink_config;
mod source;

/// The raw protocol client the sink finishes transactions with; its
/// [`read_committed`](exactly_kafka_wire::read_committed) checks what
/// read_committed consumers may see of a topic.
pub use exactly_kafka_wire as wire;

pub use config::{
    KafkaConfigError, KafkaSourceConfig, StartPosition, DEFAULT_PARTITION_DISCOVERY_INTERVAL, DEFAULT_STARTUP_TIMEOUT,
};
pub use sink::{KafkaCommittable, KafkaSinkFactory, KafkaSinkMetricsSnapshot, KafkaTransaction};
pub use sink_config::{
    check_broker_timeout_limit, check_checkpoint_timing, needed_transaction_time, past_timeout_share,
    timeout_headroom_warning, KafkaSinkConfig, KeyFrom, OnLostTransaction, ValueFrom, ABORT_AHEAD_SHARE,
    CHECKPOINT_SHARE, DEFAULT_EXPECTED_RESTART_TIME, DEFAULT_POOL_SIZE, DEFAULT_TIMEOUT_WARNING_SHARE,
    DEFAULT_TRANSACTION_TIMEOUT, MIN_POOL_SIZE,
};
pub use source::{split_name, KafkaSourceFactory, KafkaSourceMetricsSnapshot};
