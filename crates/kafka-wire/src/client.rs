//! [`WireClient`]: the calls exactly needs, each opening the connections it
//! uses and closing them when done.

use std::time::Duration;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{ApiKey, DescribeConfigsRequest};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use kafka_protocol::ResponseError;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::cluster::{connect_any, metadata, not_ready_backoff, transaction_coordinator, COORDINATOR_NOT_READY};
use crate::config::WireConfig;
use crate::connection::{versions, KafkaConnection};
use crate::error::WireError;
use crate::reader;
use crate::records::{CommittedRead, CommittedRecord};
use crate::txn::{batch_writer_on, end_txn_on, BatchWriter, EndTxnOutcome};

/// DescribeConfigs versions spoken (kafka-protocol implements v1 to v4; v4
/// is the flexible encoding).
const DESCRIBE_CONFIGS: VersionRange = versions(1, 4);
/// DescribeConfigs resource type of a broker.
const RESOURCE_BROKER: i8 = 4;
/// Pause between two reads of [`WireClient::read_topic_settled`].
const SETTLE_PAUSE: Duration = Duration::from_millis(100);

/// A raw-protocol client for one Kafka cluster.
///
/// Cheap to clone; holds no connection between calls.
#[derive(Debug, Clone)]
pub struct WireClient {
    config: WireConfig,
}

impl WireClient {
    /// A client for the brokers `bootstrap` (`HOST:PORT[,HOST:PORT...]`).
    pub fn new(bootstrap: &str) -> Result<WireClient, WireError> {
        Ok(WireClient {
            config: WireConfig::new(bootstrap)?,
        })
    }

    /// A client with explicit settings (see
    /// [`WireConfig::from_properties`] for librdkafka-style properties).
    pub fn with_config(config: WireConfig) -> WireClient {
        WireClient { config }
    }

    /// The settings.
    pub fn config(&self) -> &WireConfig {
        &self.config
    }

    /// A connection to the first bootstrap server that answers.
    pub async fn connect(&self) -> Result<KafkaConnection, WireError> {
        connect_any(&self.config).await
    }

    /// `HOST:PORT` of the transaction coordinator of `transactional_id`.
    /// A coordinator that is not ready yet is asked again for up to
    /// [`WireConfig::coordinator_wait`].
    pub async fn find_transaction_coordinator(&self, transactional_id: &str) -> Result<String, WireError> {
        let mut connection = self.connect().await?;
        transaction_coordinator(&mut connection, transactional_id, self.config.coordinator_wait).await
    }

    /// Commits (`commit = true`) or aborts the open transaction of
    /// `transactional_id` as producer `producer_id`/`producer_epoch`,
    /// without InitProducerId (which would abort it): FindCoordinator, then
    /// EndTxn on the coordinator.
    ///
    /// The broker's verdict is the [`EndTxnOutcome`]. A coordinator that is
    /// not ready (FindCoordinator or EndTxn answering
    /// COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS or
    /// NOT_COORDINATOR — a fresh cluster answers EndTxn with NOT_COORDINATOR
    /// for a moment after FindCoordinator named the coordinator) is found and
    /// asked again, with backoff, for up to [`WireConfig::coordinator_wait`];
    /// if it is still not ready then, the outcome is
    /// [`EndTxnOutcome::Retriable`], like CONCURRENT_TRANSACTIONS, which is
    /// left to the caller. `Err` means the question could not be asked (no
    /// broker reachable, EndTxn not supported, ...).
    ///
    /// `Ok` means the coordinator has written the decision to its
    /// transaction log: the transaction can no longer end the other way.
    /// Kafka answers before it writes the COMMIT (or ABORT) markers to the
    /// transaction's partitions, so read_committed consumers see the records
    /// a moment later (see [`read_topic_settled`](Self::read_topic_settled)).
    /// While the markers are being written the same call answers
    /// CONCURRENT_TRANSACTIONS (retriable), afterwards `Ok` again: a retry
    /// after a lost answer is safe. Kafka aborts an open transaction after
    /// the producer's `transaction.timeout.ms`, bumping the epoch, so a later
    /// commit is [`EndTxnOutcome::ProducerFenced`].
    pub async fn end_txn(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<EndTxnOutcome, WireError> {
        let mut backoff = not_ready_backoff(self.config.coordinator_wait);
        loop {
            let outcome = self
                .end_txn_once(
                    transactional_id,
                    producer_id,
                    producer_epoch,
                    commit,
                    backoff.remaining(),
                )
                .await?;
            let moved = matches!(outcome, EndTxnOutcome::Retriable(error) if COORDINATOR_NOT_READY.contains(&error));
            if !moved || !backoff.fits() {
                return Ok(outcome);
            }
            debug!(%transactional_id, %outcome, backoff = ?backoff.next_pause(), "EndTxn: the coordinator is not ready; finding it again");
            backoff.pause().await;
        }
    }

    /// FindCoordinator (asked again for up to `wait`), then one EndTxn.
    async fn end_txn_once(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        wait: Duration,
    ) -> Result<EndTxnOutcome, WireError> {
        let mut bootstrap = self.connect().await?;
        let coordinator = match transaction_coordinator(&mut bootstrap, transactional_id, wait).await {
            Ok(coordinator) => coordinator,
            Err(error) => {
                let outcome = error.broker_error().map(|e| EndTxnOutcome::from_code(e.code()));
                return match outcome {
                    Some(outcome @ EndTxnOutcome::Retriable(_)) => Ok(outcome),
                    _ => Err(error),
                };
            }
        };
        let mut connection = if coordinator == bootstrap.addr() {
            bootstrap
        } else {
            KafkaConnection::connect_with(&coordinator, &self.config.options).await?
        };
        end_txn_on(&mut connection, transactional_id, producer_id, producer_epoch, commit).await
    }

    /// Who wrote the record at `offset` of `topic`/`partition`: the header
    /// of its batch (producer id, epoch, transactional or not), read with
    /// one read_uncommitted Fetch from the partition's leader, so a record
    /// of a transaction still open is found too. `None` when the leader
    /// returns no batch covering `offset` (at or past the high watermark,
    /// below the log start). A leader that moved is an error
    /// ([`WireError::is_retriable`]): ask again.
    ///
    /// What a transaction's records carry is the producer id and epoch
    /// [`end_txn`](Self::end_txn) must name to end that transaction — a
    /// figure from the data itself rather than from the producer's own
    /// account.
    pub async fn batch_writer(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<Option<BatchWriter>, WireError> {
        let mut bootstrap = self.connect().await?;
        let cluster = metadata(&mut bootstrap, Some(topic)).await?;
        let leader = cluster.leaders.get(&partition).copied();
        let Some(address) = leader.and_then(|node| cluster.broker(node)).map(str::to_string) else {
            return Err(WireError::Broker {
                addr: bootstrap.addr().to_string(),
                api: ApiKey::Metadata,
                error: ResponseError::LeaderNotAvailable,
                message: Some(format!("no leader known for {topic}/{partition}")),
            });
        };
        let mut connection = if address == bootstrap.addr() {
            bootstrap
        } else {
            KafkaConnection::connect_with(&address, &self.config.options).await?
        };
        batch_writer_on(&mut connection, topic, partition, offset).await
    }

    /// The value of the broker setting `key` (e.g.
    /// `transaction.max.timeout.ms`) as one broker of the cluster reports it
    /// through DescribeConfigs, asked for that key alone. `None` when the
    /// broker does not offer DescribeConfigs, answers with an error code for
    /// its own resource (logged as a warning), does not know the key, or
    /// hides its value (sensitive settings).
    pub async fn describe_broker_config(&self, key: &str) -> Result<Option<String>, WireError> {
        let mut connection = self.connect().await?;
        let cluster = metadata(&mut connection, None).await?;
        // A broker's configuration is described by that broker itself.
        let own_id = cluster
            .brokers
            .iter()
            .find(|(_, address)| address.as_str() == connection.addr());
        let (node_id, address) = match own_id.or_else(|| cluster.brokers.iter().next()) {
            Some((id, address)) => (*id, address.clone()),
            None => {
                return Err(WireError::Protocol {
                    addr: connection.addr().to_string(),
                    message: "Metadata lists no broker".into(),
                })
            }
        };
        if address != connection.addr() {
            connection = KafkaConnection::connect_with(&address, &self.config.options).await?;
        }
        let version = match connection.version(ApiKey::DescribeConfigs, DESCRIBE_CONFIGS) {
            Ok(version) => version,
            Err(WireError::ApiNotSupported { .. }) => return Ok(None),
            Err(error) => return Err(error),
        };
        let resource = DescribeConfigsResource::default()
            .with_resource_type(RESOURCE_BROKER)
            .with_resource_name(StrBytes::from_string(node_id.to_string()))
            .with_configuration_keys(Some(vec![StrBytes::from_string(key.to_string())]));
        let request = DescribeConfigsRequest::default().with_resources(vec![resource]);
        let response = connection.request(version, &request).await?;
        let Some(result) = response.results.into_iter().next() else {
            return Ok(None);
        };
        if let Some(error) = ResponseError::try_from_code(result.error_code) {
            let message = result.error_message.as_deref().unwrap_or_default();
            warn!(broker = %connection.addr(), node_id, %error, message, "the broker does not describe its configuration");
            return Ok(None);
        }
        let value = result
            .configs
            .into_iter()
            .find(|config| config.name.as_str() == key)
            .and_then(|config| config.value)
            .map(|value| value.to_string());
        debug!(broker = %connection.addr(), node_id, key, ?value, "DescribeConfigs");
        Ok(value)
    }

    /// What a read_committed consumer sees of `topic`, decided from the log
    /// itself (see [`read_topic`](Self::read_topic)).
    pub async fn read_committed(&self, topic: &str) -> Result<Vec<CommittedRecord>, WireError> {
        Ok(self.read_topic(topic).await?.records)
    }

    /// Reads every partition of `topic` from its log start to its high
    /// watermark with read_uncommitted Fetch requests, decodes the record
    /// batches and applies the read_committed contract itself (see
    /// [`CommittedFilter`](crate::CommittedFilter)): unlike a consumer, it
    /// does not rely on the broker's list of aborted transactions.
    pub async fn read_topic(&self, topic: &str) -> Result<CommittedRead, WireError> {
        reader::read_topic(&self.config, topic).await
    }

    /// Like [`read_topic`](Self::read_topic), but reads `topic` again, after
    /// a short pause, while the log still holds open transactions, for up to
    /// `within`; returns the last read (whose
    /// [`open_transactions`](CommittedRead::open_transactions) the caller
    /// can check).
    ///
    /// A transaction that was just committed or aborted (by a producer's
    /// `commit_transaction` or by [`end_txn`](Self::end_txn)) is decided, but
    /// its markers reach the partitions a moment later; this waits for them.
    /// A transaction left open by a producer that died stays open until the
    /// broker aborts it (`transaction.timeout.ms`) or the producer's
    /// transactional id is initialized again.
    pub async fn read_topic_settled(&self, topic: &str, within: Duration) -> Result<CommittedRead, WireError> {
        let deadline = Instant::now() + within;
        loop {
            let read = self.read_topic(topic).await?;
            if read.open_transactions.is_empty() || Instant::now() + SETTLE_PAUSE > deadline {
                return Ok(read);
            }
            debug!(
                topic,
                open = read.open_transactions.len(),
                "open transactions; reading again"
            );
            tokio::time::sleep(SETTLE_PAUSE).await;
        }
    }
}
