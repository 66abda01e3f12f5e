//! [`KafkaSinkFactory`]: the settings every subtask of a Kafka sink shares,
//! the transactional ids it owns, and the subtasks it creates.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use exactly_core::{erase, CheckpointConfig, ConnectorError, ErasedSink, SinkContext, SinkFactory};
use exactly_kafka_wire::{WireClient, WireConfig};
use rdkafka::config::ClientConfig;

use super::config::{check_checkpoint_timing, KafkaSinkConfig};
use super::metrics::{KafkaSinkMetrics, KafkaSinkMetricsSnapshot};
use super::KafkaSink;
use crate::client::client_config;
use crate::config::KafkaConfigError;

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
    pub(super) settings: Arc<Settings>,
}

/// What every subtask of one sink shares.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) config: KafkaSinkConfig,
    pub(super) prefix: String,
    /// `<bootstrap>/<topic>`, for logs and errors.
    pub(super) label: String,
    /// librdkafka settings of every pooled producer, without the id.
    pub(super) producer: ClientConfig,
    /// For metadata requests.
    pub(super) plain: ClientConfig,
    pub(super) wire: WireClient,
    pub(super) checkpoint_interval: Option<Duration>,
    pub(super) metrics: Arc<KafkaSinkMetrics>,
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
        producer.set("enable.idempotence", "true").set(
            "transaction.timeout.ms",
            config.transaction_timeout.as_millis().to_string(),
        );
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
    pub(super) fn init_lock(&self, subtask: usize) -> Arc<tokio::sync::RwLock<()>> {
        let mut inits = self.inits.lock().unwrap_or_else(|e| e.into_inner());
        inits.entry(subtask).or_default().clone()
    }
}

/// The transactional id of `slot` of sink subtask `subtask`.
pub(super) fn transactional_id(prefix: &str, subtask: usize, slot: usize) -> String {
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

    /// The broker fences zombies: a new owner's recovery ends the listed
    /// transactions and calls InitProducerId on every other transactional
    /// id of the subtask's pool, which bumps the producer epoch (an earlier
    /// owner's produce, AddPartitionsToTxn and EndTxn are refused with
    /// PRODUCER_FENCED); and an earlier owner commits only after a
    /// checkpoint write under its own epoch, which the checkpoint store
    /// refuses once the region was claimed.
    fn fences_zombies(&self) -> bool {
        true
    }

    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        let ids = self.transactional_ids(context.subtask);
        Ok(erase(KafkaSink::new(self.settings.clone(), context, ids)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
