//! Finishing transactions the producer that wrote them can no longer
//! finish: EndTxn as the producer id and epoch a checkpoint recorded
//! (`exactly_kafka_wire::WireClient::end_txn`), what its answers mean, and
//! the checks `recover` makes before anything is touched.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use exactly_core::{fault, ConnectorError};
use exactly_kafka_wire::backoff::Backoff;
use exactly_kafka_wire::{EndTxnOutcome, WireError};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, Producer};

use super::config::{check_broker_timeout_limit, OnLostTransaction};
use super::factory::transactional_id;
use super::metrics::add;
use super::pool::age;
use super::producer::{blocking, retire};
use super::{now_ms, KafkaCommittable, KafkaSink, REQUEST_TIMEOUT};

/// How long EndTxn is retried before the attempt fails (the pipeline
/// restarts and recovery asks again).
pub(super) const COMMIT_DEADLINE: Duration = Duration::from_secs(60);
/// First pause between two commit attempts; doubled up to [`MAX_BACKOFF`].
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause between two commit attempts.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The sink's retries of one call for up to `wait`: the client's one
/// doubling backoff from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`].
pub(super) fn retries_for(wait: Duration) -> Backoff {
    Backoff::new(wait, FIRST_BACKOFF, MAX_BACKOFF)
}

/// The broker's verdict on an EndTxn commit, as the sink acts on it.
#[derive(Debug)]
pub(crate) enum EndTxnVerdict {
    /// Committed now or before.
    Committed,
    /// The broker refused: the transaction is gone (timed out, fenced,
    /// unknown). The reason says which answer it was.
    Lost(String),
    /// Ask again after a pause (coordinator moving or loading, concurrent
    /// transactions, a broker that closed or refused the connection while it
    /// restarts, a timeout).
    Retry {
        /// What was answered.
        reason: String,
        /// The client's error, when the question could not be asked.
        cause: Option<WireError>,
    },
    /// Neither success nor a known refusal: stop rather than guess.
    Fatal {
        /// What was answered.
        reason: String,
        /// The client's error, when the question could not be asked.
        cause: Option<WireError>,
    },
}

/// Maps the outcome of [`WireClient::end_txn`](exactly_kafka_wire::WireClient::end_txn)
/// (commit) to what the sink does.
pub(crate) fn classify_end_txn(result: Result<EndTxnOutcome, WireError>) -> EndTxnVerdict {
    match result {
        Ok(EndTxnOutcome::Ok) => EndTxnVerdict::Committed,
        Ok(outcome @ (EndTxnOutcome::InvalidTxnState | EndTxnOutcome::ProducerFenced(_))) => {
            EndTxnVerdict::Lost(format!("EndTxn answered {outcome}"))
        }
        Ok(outcome @ EndTxnOutcome::InvalidProducerIdMapping) => EndTxnVerdict::Lost(format!(
            "EndTxn answered {outcome}: the broker knows no producer for this id any more (it was \
             stopped longer than the brokers' transactional.id.expiration.ms after the transaction timed out)"
        )),
        Ok(outcome @ EndTxnOutcome::Retriable(_)) => EndTxnVerdict::Retry {
            reason: format!("EndTxn answered {outcome}"),
            cause: None,
        },
        Ok(outcome @ EndTxnOutcome::Other(_)) => EndTxnVerdict::Fatal {
            reason: format!(
                "EndTxn answered {outcome}, which says neither that the transaction is committed nor that it is \
                 gone; stopping so nothing is decided by guess (run again to retry)"
            ),
            cause: None,
        },
        // A broker going down closes connections; one coming up refuses them
        // or answers "not coordinator": none of it says anything about the
        // transaction. Only an answer of the coordinator does.
        Err(error @ WireError::Closed { .. }) => EndTxnVerdict::Retry {
            reason: "the connection closed before EndTxn was answered".into(),
            cause: Some(error),
        },
        Err(error) if error.is_retriable() => EndTxnVerdict::Retry {
            reason: "EndTxn could not be sent".into(),
            cause: Some(error),
        },
        Err(error) => EndTxnVerdict::Fatal {
            reason: "EndTxn could not be sent".into(),
            cause: Some(error),
        },
    }
}

impl KafkaSink {
    /// The guardrail at start: `transaction_timeout` must not exceed the
    /// broker's `transaction.max.timeout.ms`.
    pub(super) async fn check_broker_limit(&self) -> Result<(), ConnectorError> {
        const KEY: &str = "transaction.max.timeout.ms";
        let limit = self.settings.wire.describe_broker_config(KEY).await.map_err(|e| {
            let message = format!("reading the broker's {KEY}");
            let error = if e.is_retriable() {
                self.transient(message)
            } else {
                self.fatal(message)
            };
            error.caused_by(e)
        })?;
        if limit.is_none() {
            tracing::debug!(sink = %self.settings.label, "the broker does not report {KEY}; not checking transaction_timeout against it");
        }
        check_broker_timeout_limit(self.config().transaction_timeout, limit.as_deref()).map_err(|e| self.fatal(e))
    }

    /// A missing topic (`topic`, or `dead_letter_topic`) is fatal.
    pub(super) async fn check_topic(&self, topic: &str) -> Result<(), ConnectorError> {
        let config = self.settings.plain.clone();
        let topic = topic.to_string();
        let name = topic.clone();
        let exists = blocking(move || -> Result<bool, KafkaError> {
            let client: BaseProducer = config.create()?;
            let metadata = client.client().fetch_metadata(Some(&topic), REQUEST_TIMEOUT)?;
            Ok(metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()))
        })
        .await
        .map_err(|e| {
            self.transient(format!("reading the metadata of topic `{name}`"))
                .caused_by(e)
        })?;
        if exists {
            return Ok(());
        }
        let key = if name == self.config().topic {
            "topic"
        } else {
            "dead_letter_topic"
        };
        Err(self.fatal(format!(
            "topic `{name}` does not exist on `{}`; create it (the sink never creates topics) or fix `{key}`",
            self.config().bootstrap
        )))
    }

    /// Waits until every InitProducerId a failed attempt's sink of this
    /// subtask started has ended.
    pub(super) async fn await_earlier_inits(&self) {
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

    /// After a lowering of the parallelism: initializes (and drops) a
    /// producer for every pooled id of the adopted old subtasks that
    /// `listed` does not name, which aborts what they left open. Those ids
    /// are never used again.
    pub(super) async fn abort_adopted(&self, listed: &BTreeSet<String>) -> Result<(), ConnectorError> {
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
    pub(super) fn lost(&self, c: &KafkaCommittable, reason: &str) -> Result<(), ConnectorError> {
        let timeout = self.config().transaction_timeout;
        let hint = if c.began_at_ms == 0 {
            String::new()
        } else {
            let age = age(c.began_at_ms, now_ms());
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
        let dead_letters = match (&self.config().dead_letter_topic, c.dead_letters) {
            (Some(topic), n) if n > 0 => format!(" and {n} dead letters for topic {topic}"),
            _ => String::new(),
        };
        let message = format!(
            "the broker refused to commit transactional id {} (producer {}, epoch {}): {reason}. The data of \
             checkpoint {} ({} records for topic {}{dead_letters}) was lost.{hint}",
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
    pub(super) async fn finish_with_end_txn(&self, c: &KafkaCommittable) -> Result<(), ConnectorError> {
        fault::point_at("kafka_sink.before_end_txn", self.context.subtask);
        fault::pause_at("kafka_sink.before_end_txn", self.context.subtask).await;
        let mut backoff = retries_for(COMMIT_DEADLINE);
        loop {
            let result = self
                .settings
                .wire
                .end_txn(&c.transactional_id, c.producer_id, c.epoch, true)
                .await;
            let (reason, cause) = match classify_end_txn(result) {
                EndTxnVerdict::Committed => {
                    add(&self.settings.metrics.committed_by_end_txn, 1);
                    tracing::info!(sink = %self.settings.label, transactional_id = %c.transactional_id, checkpoint = %c.checkpoint, "transaction committed with EndTxn");
                    return Ok(());
                }
                EndTxnVerdict::Lost(reason) => return self.lost(c, &reason),
                EndTxnVerdict::Fatal { reason, cause } => {
                    let error = self.fatal(format!(
                        "committing transactional id {} of checkpoint {}: {reason}",
                        c.transactional_id, c.checkpoint
                    ));
                    return Err(match cause {
                        Some(cause) => error.caused_by(cause),
                        None => error,
                    });
                }
                EndTxnVerdict::Retry { reason, cause } => (reason, cause),
            };
            if !backoff.fits() {
                let error = self.transient(format!(
                    "committing transactional id {} of checkpoint {} with EndTxn did not succeed within {}: {reason}; \
                     the pipeline restarts and tries again",
                    c.transactional_id,
                    c.checkpoint,
                    humantime::format_duration(COMMIT_DEADLINE)
                ));
                return Err(match cause {
                    Some(cause) => error.caused_by(cause),
                    None => error,
                });
            }
            match &cause {
                Some(cause) => {
                    tracing::debug!(transactional_id = %c.transactional_id, %reason, error = %cause, "EndTxn: retrying")
                }
                None => tracing::debug!(transactional_id = %c.transactional_id, %reason, "EndTxn: retrying"),
            }
            backoff.pause().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use exactly_kafka_wire::kafka_protocol::messages::ApiKey;
    use exactly_kafka_wire::kafka_protocol::ResponseError;

    use super::*;

    fn outcome(o: EndTxnOutcome) -> EndTxnVerdict {
        classify_end_txn(Ok(o))
    }

    #[test]
    fn end_txn_answers_map_to_what_the_sink_does() {
        assert!(matches!(outcome(EndTxnOutcome::Ok), EndTxnVerdict::Committed));
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
                EndTxnVerdict::Retry { cause: None, .. }
            ));
        }
        let EndTxnVerdict::Fatal { reason, .. } = outcome(EndTxnOutcome::Other(59)) else {
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
        assert!(matches!(
            classify_end_txn(Err(closed)),
            EndTxnVerdict::Retry {
                cause: Some(WireError::Closed { .. }),
                ..
            }
        ));
        let timeout = WireError::Timeout {
            addr: "b:1".into(),
            api: ApiKey::EndTxn,
            after: Duration::from_secs(1),
        };
        assert!(matches!(classify_end_txn(Err(timeout)), EndTxnVerdict::Retry { .. }));
        let refused = WireError::Connect {
            addr: "b:1".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(matches!(classify_end_txn(Err(refused)), EndTxnVerdict::Retry { .. }));
        let unsupported = WireError::ApiNotSupported {
            addr: "b:1".into(),
            api: ApiKey::EndTxn,
            broker: None,
            client: exactly_kafka_wire::kafka_protocol::protocol::VersionRange { min: 0, max: 4 },
        };
        assert!(matches!(
            classify_end_txn(Err(unsupported)),
            EndTxnVerdict::Fatal {
                cause: Some(WireError::ApiNotSupported { .. }),
                ..
            }
        ));
    }
}
