//! A small raw Kafka protocol client for exactly, on the `kafka-protocol`
//! crate's message types.
//!
//! Two jobs need the wire protocol itself rather than librdkafka:
//!
//! - **Finishing a pre-committed transaction after a crash.** librdkafka
//!   cannot resume a transaction another process began; its only way back
//!   in, InitProducerId, aborts it. [`end_txn`] sends EndTxn straight to the
//!   transaction coordinator with the producer id and epoch recorded at
//!   pre-commit.
//! - **Checking what read_committed consumers may see, independently of
//!   them.** A consumer trusts the broker's list of aborted transactions in
//!   each Fetch answer and its last stable offset. [`read_committed`] reads
//!   the raw log with read_uncommitted and applies the contract itself
//!   ([`CommittedFilter`], testable without a broker), and also reports the
//!   transactions still open and the records aborted: a second judge for
//!   tests, which must agree with a plain read_committed consumer.
//!
//! Underneath is [`KafkaConnection`]: one connection with correlation ids,
//! length-prefixed framing, request/response header versions that follow
//! each API version (flexible versions included), and an ApiVersions
//! handshake that picks the highest version both sides speak.
//!
//! ## Secured clusters
//!
//! [`WireConfig::from_properties`] reads the librdkafka properties the
//! pipeline's Kafka clients get, so recovery reaches the same listeners
//! they do: `security.protocol` `SSL` / `SASL_SSL` wrap every connection
//! in TLS (rustls; the CAs of `ssl.ca.location` or the system's, the host
//! name checked unless `ssl.endpoint.identification.algorithm=none`, an
//! optional client certificate), and `SASL_PLAINTEXT` / `SASL_SSL`
//! authenticate every connection (SaslHandshake v1 + SaslAuthenticate)
//! with `sasl.mechanism` `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`
//! (RFC 5802; the server's signature is checked too). Misconfigurations
//! are not retriable and say which setting to fix: an untrusted or
//! misnamed certificate ([`WireError::Tls`]), a TLS listener reached
//! without TLS ([`WireError::TlsExpected`]), a mechanism the listener does
//! not enable ([`WireError::Sasl`]), refused credentials
//! ([`WireError::Authentication`]). No error, log line or `Debug` output
//! contains the password.
//!
//! ```no_run
//! # async fn demo() -> Result<(), exactly_kafka_wire::WireError> {
//! use exactly_kafka_wire::{end_txn, read_committed, EndTxnOutcome};
//!
//! match end_txn("127.0.0.1:9092", "sink-0-17", 4001, 0, true).await? {
//!     EndTxnOutcome::Ok => {}
//!     outcome if outcome.is_retriable() => { /* try again shortly */ }
//!     outcome => panic!("transaction lost: {outcome}"),
//! }
//! for record in read_committed("127.0.0.1:9092", "out").await? {
//!     println!("{}/{}@{}: {:?}", record.topic, record.partition, record.offset, record.value);
//! }
//! # Ok(()) }
//! ```

pub mod backoff;
mod batch;
mod client;
mod cluster;
mod config;
mod connection;
mod consumer_client;
mod error;
mod fetch;
mod legacy;
mod reader;
pub mod records;
mod sasl;
mod scram;
mod security;
mod tls;
mod topic_id;
mod txn;

/// A writer of v0/v1 message sets, shared with the integration tests.
#[cfg(test)]
#[path = "../tests/common/message_set.rs"]
mod message_set;

pub use client::WireClient;
pub use config::{
    ConnectionOptions, WireConfig, CLIENT_PROPERTIES, DEFAULT_CLIENT_ID, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_COORDINATOR_WAIT, DEFAULT_REQUEST_TIMEOUT,
};
pub use connection::KafkaConnection;
pub use consumer_client::{ConsumerClient, EpochAsk, EpochEnd, Leader, OffsetSpec, TopicMetadata};
pub use error::WireError;
pub use fetch::{
    FetchCounters, FetchPosition, FetchSettings, FetchedChunk, FetchedRecord, Fetcher, OffsetReset, OnTruncation,
    Truncation, FETCH_PROPERTIES,
};
/// The `kafka-protocol` crate, whose message types [`KafkaConnection::request`] takes.
pub use kafka_protocol;
pub use records::{
    committed_records, decode_batches, BatchRecord, CommittedFilter, CommittedRead, CommittedRecord, ControlMarker,
    DecodedBatch, EndedTransaction, OpenTransaction, RecordHeader,
};
pub use security::{CertificateCheck, SaslMechanism, SaslSettings, Security, SecurityProtocol, TlsSettings};
pub use topic_id::TopicId;
pub use txn::{BatchWriter, EndTxnOutcome};

/// `HOST:PORT` of the transaction coordinator of `transactional_id`
/// (FindCoordinator with key type 1, the node mapped through Metadata).
/// See [`WireClient::find_transaction_coordinator`].
pub async fn find_transaction_coordinator(bootstrap: &str, transactional_id: &str) -> Result<String, WireError> {
    WireClient::new(bootstrap)?
        .find_transaction_coordinator(transactional_id)
        .await
}

/// Commits or aborts the open transaction of `transactional_id`, as
/// `producer_id`/`producer_epoch`, without InitProducerId. See
/// [`WireClient::end_txn`].
pub async fn end_txn(
    bootstrap: &str,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
) -> Result<EndTxnOutcome, WireError> {
    WireClient::new(bootstrap)?
        .end_txn(transactional_id, producer_id, producer_epoch, commit)
        .await
}

/// The broker setting `key` (e.g. `transaction.max.timeout.ms`), `None` if
/// the broker does not report it. See [`WireClient::describe_broker_config`].
pub async fn describe_broker_config(bootstrap: &str, key: &str) -> Result<Option<String>, WireError> {
    WireClient::new(bootstrap)?.describe_broker_config(key).await
}

/// What a read_committed consumer sees of `topic`, by partition then
/// offset, decided from the raw log. See [`WireClient::read_topic`].
pub async fn read_committed(bootstrap: &str, topic: &str) -> Result<Vec<CommittedRecord>, WireError> {
    WireClient::new(bootstrap)?.read_committed(topic).await
}
