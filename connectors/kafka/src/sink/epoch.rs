//! The producer id and epoch of every transaction, which its committable
//! records and EndTxn names after a restart.
//!
//! **From the records, per transaction.** At pre-commit the sink reads the
//! header of the batch that holds one of the transaction's delivered
//! records (one read_uncommitted Fetch from the partition's leader,
//! [`WireClient::batch_writer`](exactly_kafka_wire::WireClient::batch_writer)):
//! the producer id and epoch written there are the ones the transaction
//! coordinator knows the transaction by. librdkafka does not expose them,
//! and its statistics (which the sink read once per producer before) lag
//! and go stale: after an abortable error librdkafka bumps the epoch when
//! the transaction is aborted (KIP-360), and a figure read once turned
//! into a refused pre-commit (a needless restart) or, read before the
//! bump, into a committable that a recovery's EndTxn is fenced with — a
//! false data loss. A bump is now simply followed (logged, counted).
//!
//! **Transactions v2 (KIP-890) are refused.** With transactions v2 a
//! producer's epoch is bumped at *every* commit (EndTxn v5), so an epoch
//! recorded at pre-commit no longer names the producer once the live
//! commit went through, and the sink's EndTxn recovery — which commits a
//! checkpoint's transactions again after a crash, "already committed" being
//! success — would be fenced (INVALID_PRODUCER_EPOCH / PRODUCER_FENCED):
//! a committed checkpoint reported as lost. The slot pool's reasoning
//! (same producer, same epoch across transactions) would not hold either.
//! librdkafka up to 2.12 (rdkafka 0.39) speaks EndTxn v0-1 and Produce up
//! to v10, so it never uses transactions v2; a later librdkafka may, when
//! the brokers enable the `transaction.version` feature at level 2 (Apache
//! Kafka 4.x does by default). So `recover` refuses a librdkafka newer than
//! the versions verified here when the brokers have that feature enabled,
//! naming both fixes; and a producer whose epoch changes between two
//! transactions without an abort in between (an epoch bumped at a commit)
//! stops the pipeline with the same explanation, whatever the version says.
//! `connectors/kafka/tests/transactions_v2.rs` shows, on a broker, what a
//! client speaking transactions v2 gets.

use std::time::Duration;

use exactly_core::ConnectorError;
use exactly_kafka_wire::kafka_protocol::messages::{ApiKey, ApiVersionsRequest};
use exactly_kafka_wire::kafka_protocol::protocol::StrBytes;
use exactly_kafka_wire::{BatchWriter, WireError};

use super::metrics::add;
use super::producer::TxnProducer;
use super::recovery::retries_for;
use super::KafkaSink;

/// How long reading a transaction's batch header is retried (a leader
/// moving, a broker restarting) before the pre-commit fails.
const WRITER_DEADLINE: Duration = Duration::from_secs(30);

/// The newest librdkafka (major, minor) verified not to use transactions
/// v2: 2.12, bundled by rdkafka 0.39.
pub(crate) const LIBRDKAFKA_VERIFIED: (u32, u32) = (2, 12);

/// The broker feature that turns transactions v2 on at level 2.
pub(crate) const TRANSACTION_VERSION_FEATURE: &str = "transaction.version";

/// Why the sink refuses to run a librdkafka of version `librdkafka` (hex
/// as `rd_kafka_version()` gives it, and its text) against brokers whose
/// finalized `transaction.version` is `finalized` (`None`: not reported),
/// if it does.
pub(crate) fn transactions_v2_refusal(librdkafka: (i32, &str), finalized: Option<i16>) -> Option<String> {
    let (hex, text) = librdkafka;
    let (major, minor) = ((hex as u32) >> 24, ((hex as u32) >> 16) & 0xff);
    if (major, minor) <= LIBRDKAFKA_VERIFIED || finalized.is_none_or(|level| level < 2) {
        return None;
    }
    let (verified_major, verified_minor) = LIBRDKAFKA_VERIFIED;
    Some(format!(
        "the Kafka sink runs on librdkafka {text}, newer than the versions it was verified with (up to \
         {verified_major}.{verified_minor}), and the brokers enable Kafka transactions v2 (KIP-890: the finalized \
         feature {TRANSACTION_VERSION_FEATURE} is {}). A producer speaking transactions v2 bumps its epoch at \
         every commit, so the producer epoch a checkpoint records would be stale once the transaction is \
         committed, and the EndTxn recovery would report committed checkpoints as lost. Build exactly with \
         rdkafka 0.39 (librdkafka 2.12), or keep the brokers on transactions v1 (kafka-features.sh \
         --bootstrap-server <brokers> downgrade --feature {TRANSACTION_VERSION_FEATURE}=1)",
        finalized.unwrap_or_default()
    ))
}

/// The refusal of a producer whose epoch changed at a commit (see the
/// module docs).
fn bumped_at_commit(producer: &TxnProducer, from: (i64, i16), now: (i64, i16)) -> String {
    format!(
        "the producer of transactional id {} wrote this transaction as producer {}, epoch {}, and the previous \
         one as producer {}, epoch {}, with no abort in between: its epoch was bumped at a commit, which only \
         Kafka transactions v2 (KIP-890) do. The Kafka sink does not support transactions v2: the epoch a \
         checkpoint records would be stale once committed, and recovery would report committed checkpoints as \
         lost. Build exactly with rdkafka 0.39 (librdkafka 2.12), or keep the brokers on transactions v1 \
         (kafka-features.sh --bootstrap-server <brokers> downgrade --feature {TRANSACTION_VERSION_FEATURE}=1)",
        producer.transactional_id, now.0, now.1, from.0, from.1
    )
}

/// How a transaction's producer id and epoch compare with the previous
/// transaction's on the same producer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EpochChange {
    /// The producer's first pre-committed transaction.
    First,
    /// Same producer id and epoch as before.
    Same,
    /// Another epoch (or producer id) after an abort: librdkafka bumped the
    /// epoch when it aborted a transaction that had hit an abortable error
    /// (KIP-360), and the sink follows.
    Bumped {
        /// The producer id and epoch before.
        from: (i64, i16),
    },
    /// Another epoch without an abort in between: the producer bumped its
    /// epoch at a commit, which only Kafka's transactions v2 (KIP-890) do.
    /// The sink does not support that (see the module docs).
    BumpedAtCommit {
        /// The producer id and epoch before.
        from: (i64, i16),
    },
}

/// Compares `now` (the producer id and epoch of a transaction's records)
/// with `previous` (those of the producer's previous pre-committed
/// transaction), `aborted` telling whether an abort came in between.
pub(crate) fn epoch_change(previous: Option<(i64, i16)>, aborted: bool, now: (i64, i16)) -> EpochChange {
    match previous {
        None => EpochChange::First,
        Some(from) if from == now => EpochChange::Same,
        Some(from) if aborted => EpochChange::Bumped { from },
        Some(from) => EpochChange::BumpedAtCommit { from },
    }
}

impl KafkaSink {
    /// The start-up check against transactions v2 (see the module docs):
    /// reads the brokers' finalized `transaction.version` only when the
    /// linked librdkafka is newer than the verified ones.
    pub(super) async fn check_transactions_version(&self) -> Result<(), ConnectorError> {
        let (hex, text) = rdkafka::util::get_rdkafka_version();
        if transactions_v2_refusal((hex, &text), Some(i16::MAX)).is_none() {
            return Ok(());
        }
        let finalized = self.finalized_transaction_version().await.map_err(|e| {
            let error = self.transient(format!(
                "reading the brokers' finalized {TRANSACTION_VERSION_FEATURE} (librdkafka {text} is newer than the \
                 verified versions)"
            ));
            error.caused_by(e)
        })?;
        match transactions_v2_refusal((hex, &text), finalized) {
            Some(refusal) => Err(self.fatal(refusal)),
            None => {
                tracing::info!(sink = %self.settings.label, librdkafka = %text, ?finalized, "librdkafka is newer than the verified versions, but the brokers do not enable transactions v2");
                Ok(())
            }
        }
    }

    /// The finalized level of `transaction.version` as a broker reports it
    /// in ApiVersions (v3+); `None` when it does not.
    async fn finalized_transaction_version(&self) -> Result<Option<i16>, WireError> {
        let mut connection = self.settings.wire.connect().await?;
        let Some(versions) = connection.broker_versions(ApiKey::ApiVersions).filter(|v| v.max >= 3) else {
            return Ok(None);
        };
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("exactly-kafka-sink"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let response = connection.request(versions.max.min(3), &request).await?;
        Ok(response
            .finalized_features
            .iter()
            .find(|f| f.name.as_str() == TRANSACTION_VERSION_FEATURE)
            .map(|f| f.max_version_level))
    }

    /// The producer id and epoch the transaction being pre-committed on
    /// `producer` was written with, from the header of the batch holding
    /// its first delivered record; checked against the producer's previous
    /// transaction (a KIP-360 bump is followed, a bump at a commit
    /// refused). Call after every record was delivered.
    pub(super) async fn written_as(&self, producer: &TxnProducer) -> Result<(i64, i16), ConnectorError> {
        let Some((topic, partition, offset)) = producer.first_delivered() else {
            return Err(self.transient(format!(
                "no record of the transaction of {} was reported delivered, so the producer id and epoch it was \
                 written with cannot be read",
                producer.transactional_id
            )));
        };
        let writer = self.batch_writer(&topic, partition, offset).await?;
        let now = (writer.producer_id, writer.producer_epoch);
        if !writer.transactional || writer.producer_id < 0 {
            return Err(self.fatal(format!(
                "the record at {topic}/{partition} offset {offset}, written by the transaction of {}, is in a batch \
                 that is not transactional ({writer:?}); was the topic written by another producer at that offset?",
                producer.transactional_id
            )));
        }
        match producer.follow(now) {
            EpochChange::First | EpochChange::Same => {}
            EpochChange::Bumped { from } => {
                add(&self.settings.metrics.epoch_bumps, 1);
                tracing::info!(
                    sink = %self.settings.label,
                    transactional_id = %producer.transactional_id,
                    from = ?from,
                    to = ?now,
                    "the producer's epoch was bumped when it aborted a transaction after an abortable error \
                     (KIP-360); its transactions are recorded with the new one"
                );
            }
            EpochChange::BumpedAtCommit { from } => return Err(self.fatal(bumped_at_commit(producer, from, now))),
        }
        Ok(now)
    }

    /// [`WireClient::batch_writer`](exactly_kafka_wire::WireClient::batch_writer),
    /// retried with backoff while the answer may change (a leader moving, a
    /// broker restarting) for up to [`WRITER_DEADLINE`].
    async fn batch_writer(&self, topic: &str, partition: i32, offset: i64) -> Result<BatchWriter, ConnectorError> {
        let mut backoff = retries_for(WRITER_DEADLINE);
        loop {
            let error = match self.settings.wire.batch_writer(topic, partition, offset).await {
                Ok(Some(writer)) => return Ok(writer),
                Ok(None) => {
                    return Err(self.transient(format!(
                        "the leader of {topic}/{partition} returned no batch holding offset {offset}, where a record \
                         of the transaction being pre-committed was delivered"
                    )))
                }
                Err(error) if error.is_retriable() && backoff.fits() => error,
                Err(error) => {
                    return Err(self
                        .transient(format!(
                            "reading which producer wrote {topic}/{partition} offset {offset} (the transaction being \
                             pre-committed) failed"
                        ))
                        .caused_by(error))
                }
            };
            tracing::debug!(topic, partition, offset, %error, "reading a batch header: retrying");
            backoff.pause().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_followed_after_an_abort_and_refused_after_a_commit() {
        assert_eq!(epoch_change(None, false, (7, 0)), EpochChange::First);
        assert_eq!(epoch_change(None, true, (7, 3)), EpochChange::First);
        assert_eq!(epoch_change(Some((7, 0)), false, (7, 0)), EpochChange::Same);
        assert_eq!(
            epoch_change(Some((7, 0)), true, (7, 0)),
            EpochChange::Same,
            "an abort without a bump"
        );
        assert_eq!(
            epoch_change(Some((7, 0)), true, (7, 1)),
            EpochChange::Bumped { from: (7, 0) },
            "KIP-360: the epoch bumped by the abort"
        );
        assert_eq!(
            epoch_change(Some((7, 32766)), true, (8, 0)),
            EpochChange::Bumped { from: (7, 32766) },
            "an exhausted epoch brings a new producer id"
        );
        assert_eq!(
            epoch_change(Some((7, 0)), false, (7, 1)),
            EpochChange::BumpedAtCommit { from: (7, 0) },
            "transactions v2 bump at every commit"
        );
    }

    #[test]
    fn a_newer_librdkafka_is_refused_only_where_brokers_enable_transactions_v2() {
        let verified = (0x020c01ff, "2.12.1");
        for finalized in [None, Some(0), Some(1), Some(2), Some(3)] {
            assert_eq!(transactions_v2_refusal(verified, finalized), None, "{finalized:?}");
        }
        let older = (0x020300ff, "2.3.0");
        assert_eq!(transactions_v2_refusal(older, Some(2)), None);
        let newer = (0x020d00ff, "2.13.0");
        assert_eq!(
            transactions_v2_refusal(newer, None),
            None,
            "brokers without the feature"
        );
        assert_eq!(transactions_v2_refusal(newer, Some(1)), None, "transactions v1");
        let refusal = transactions_v2_refusal(newer, Some(2)).unwrap();
        for part in [
            "librdkafka 2.13.0",
            "up to 2.12",
            "transaction.version is 2",
            "KIP-890",
            "rdkafka 0.39",
            "downgrade --feature transaction.version=1",
        ] {
            assert!(refusal.contains(part), "`{part}` missing from: {refusal}");
        }
        assert!(transactions_v2_refusal((0x030000ff, "3.0.0"), Some(2)).is_some());
    }

    #[test]
    fn the_linked_librdkafka_is_a_verified_one() {
        let (hex, text) = rdkafka::util::get_rdkafka_version();
        assert_eq!(
            transactions_v2_refusal((hex, &text), Some(2)),
            None,
            "librdkafka {text} is not among the verified versions: check what it does with transactions v2 \
             (connectors/kafka/tests/transactions_v2.rs) before raising LIBRDKAFKA_VERIFIED"
        );
    }
}
