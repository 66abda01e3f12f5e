//! # exactly-kafka
//!
//! A Kafka source whose offsets live in exactly's checkpoints.
//!
//! - [`KafkaSourceConfig`]: the `[source.kafka]` settings (see its docs for
//!   every key and default), checked by [`KafkaSourceConfig::validate`].
//! - [`KafkaSourceFactory`]: implements [`exactly_core::SourceFactory`].
//!   Partition `p` of the topic belongs to subtask `p % parallelism` and is
//!   assigned explicitly; splits are named `<topic>-<partition>`; records are
//!   read with `read_committed`; new partitions are picked up and read from
//!   their beginning.
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
//! poll, so a checkpoint taken before any record arrived still pins the exact
//! offset (`latest` never moves forward on a restart).
//!
//! After a checkpoint completes its offsets are committed to the consumer
//! group (when `commit_offsets_to_group`) so lag tools see progress; they are
//! read only by `start = "group"` on a first start.
//!
//! ## Errors
//!
//! Broker outages are retried by librdkafka; each client error is logged with
//! `tracing::warn` and counted ([`KafkaSourceMetricsSnapshot::transient_errors`]).
//! Fatal consumer errors (authorization, librdkafka fatal errors) become
//! [`exactly_core::ConnectorError::Fatal`]. Brokers that do not answer within
//! `startup_timeout` at `restore` give a transient error naming the bootstrap.

pub mod admin;
mod client;
mod config;
mod source;

pub use client::KafkaSourceMetricsSnapshot;
pub use config::{
    KafkaConfigError, KafkaSourceConfig, StartPosition, DEFAULT_PARTITION_DISCOVERY_INTERVAL, DEFAULT_STARTUP_TIMEOUT,
};
pub use source::{split_name, KafkaSourceFactory};
