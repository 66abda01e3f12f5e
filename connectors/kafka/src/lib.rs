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
//! Every checkpoint's records are one Kafka transaction per sink subtask,
//! committed when the checkpoint completes. Each subtask owns a fixed pool
//! of `pool_size` transactional ids, `<prefix>-<subtask>-<slot>` (prefix
//! `exactly-<pipeline>` unless `transactional_id_prefix` says otherwise),
//! each with its own librdkafka producer, so recovery can find every
//! transaction a crash left behind. A pre-committed transaction's
//! checkpoint records its transactional id, producer id and epoch; after a
//! restart, recovery commits what the checkpoint lists with EndTxn as that
//! producer (`exactly_kafka_wire`: librdkafka's only way back in,
//! InitProducerId, would abort it) and aborts the rest by initializing the
//! other ids. Only the transaction coordinator's answer decides that a
//! transaction is lost (a [`DataLoss`](exactly_core::ConnectorError::DataLoss),
//! or with `on_lost_transaction = "warn"` a counted error log); connection
//! errors are retried. At start, a `transaction_timeout` above the
//! brokers' `transaction.max.timeout.ms` and checkpoint settings under
//! which a checkpoint could outlive its transactions are refused; while
//! running, a transaction 80 % through its timeout fails the attempt so
//! that recovery replays it in time. Records whose key or value cannot be
//! taken as configured stop the run, or go to `dead_letter_topic` in the
//! same transaction. The dataflow, what is retried and how each error is
//! handled, with the reasons, are in [`sink`].
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
mod properties;
pub mod sink;
mod source;

/// The raw protocol client the sink finishes transactions with; its
/// [`read_committed`](exactly_kafka_wire::read_committed) checks what
/// read_committed consumers may see of a topic.
pub use exactly_kafka_wire as wire;

pub use config::{
    KafkaConfigError, KafkaSourceConfig, LogTruncation, StartPosition, Subscription, DEFAULT_MISSING_TOPIC_TIMEOUT,
    DEFAULT_PARTITION_DISCOVERY_INTERVAL, DEFAULT_STARTUP_TIMEOUT,
};
pub use sink::config::{
    check_broker_timeout_limit, check_checkpoint_timing, needed_transaction_time, past_timeout_share,
    timeout_headroom_warning, KafkaSinkConfig, KeyFrom, OnLostTransaction, ValueFrom, ABORT_AHEAD_SHARE,
    CHECKPOINT_SHARE, DEFAULT_EXPECTED_RESTART_TIME, DEFAULT_POOL_SIZE, DEFAULT_TIMEOUT_WARNING_SHARE,
    DEFAULT_TRANSACTION_TIMEOUT, MIN_POOL_SIZE,
};
pub use sink::{KafkaCommittable, KafkaSinkFactory, KafkaSinkMetricsSnapshot, KafkaTransaction};
pub use source::{split_name, KafkaSourceFactory, KafkaSourceMetricsSnapshot};
