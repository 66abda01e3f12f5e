//! Consumer lag of a Kafka source: per partition, the end offset the
//! brokers report (read_committed: the last stable offset) minus the
//! position the latest complete checkpoint recorded.
//!
//! Positions come from checkpoints (the only truth the pipeline keeps), so
//! the lag is what a restart would have to read again, and it reaches 0
//! once a checkpoint covers everything the topic holds.

use std::collections::BTreeMap;
use std::time::Duration;

use exactly_core::SplitPositions;
use exactly_kafka::KafkaSourceConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

/// How long one metadata or offsets request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Lag of one partition.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PartitionLag {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Next offset to read per the latest checkpoint (`None`: the
    /// checkpoint does not list the partition; it is read from its
    /// beginning, so its lag counts every record it still holds).
    pub position: Option<i64>,
    /// The first offset the partition still holds.
    pub low: i64,
    /// The end offset (the next offset to be written, or the last stable
    /// offset for read_committed).
    pub end: i64,
    /// `end - position` (`end - low` without a position), never negative.
    pub lag: i64,
}

/// Reads the end offsets of the source's topic.
#[derive(Clone, Debug)]
pub struct KafkaLagProbe {
    config: KafkaSourceConfig,
}

impl KafkaLagProbe {
    /// A probe for the topic and brokers of `config` (its client
    /// `properties`, e.g. security settings, apply).
    pub fn new(config: &KafkaSourceConfig) -> Self {
        KafkaLagProbe { config: config.clone() }
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.config.topic
    }

    /// The partitions' lags against `positions` (from a checkpoint; `None`:
    /// no checkpoint yet). Blocking: run it on a blocking thread.
    pub fn lag(&self, positions: Option<&SplitPositions>) -> Result<Vec<PartitionLag>, String> {
        let offsets = self.offsets()?;
        Ok(lag_of(&self.config.topic, &offsets, positions))
    }

    /// `(low, end)` of every partition of the topic.
    fn offsets(&self) -> Result<BTreeMap<i32, (i64, i64)>, String> {
        let topic = &self.config.topic;
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!(
                "cannot read {what} of topic `{topic}` from Kafka at {}: {e}. Check that the brokers are \
                 running and reachable at that address and that source.kafka.bootstrap is right",
                self.config.bootstrap
            )
        };
        let mut client = ClientConfig::new();
        for (key, value) in &self.config.properties {
            client.set(key, value);
        }
        client
            .set("bootstrap.servers", &self.config.bootstrap)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("log_level", "3");
        let consumer: BaseConsumer = client.create().map_err(|e| fail("the partitions", &e))?;
        let metadata = consumer
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
            .map_err(|e| fail("the partitions", &e))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic.as_str())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(format!(
                "topic `{topic}` has no partitions on Kafka at {} (does it exist?)",
                self.config.bootstrap
            ));
        }
        partitions
            .into_iter()
            .map(|p| {
                let offsets = consumer
                    .fetch_watermarks(topic, p, REQUEST_TIMEOUT)
                    .map_err(|e| fail(&format!("the end offset of partition {p}"), &e))?;
                Ok((p, offsets))
            })
            .collect()
    }
}

/// The lag of every partition in `offsets` (`(low, end)`) against the
/// positions of the splits named `<topic>-<partition>`.
pub fn lag_of(
    topic: &str,
    offsets: &BTreeMap<i32, (i64, i64)>,
    positions: Option<&SplitPositions>,
) -> Vec<PartitionLag> {
    offsets
        .iter()
        .map(|(&partition, &(low, end))| {
            let position = positions.and_then(|p| p.get(&exactly_kafka::split_name(topic, partition)));
            PartitionLag {
                topic: topic.to_string(),
                partition,
                position,
                low,
                end,
                lag: (end - position.unwrap_or(low).max(low)).max(0),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_end_minus_the_checkpointed_position() {
        let offsets = BTreeMap::from([(0, (0, 100)), (1, (10, 50)), (2, (5, 5))]);
        let mut positions = SplitPositions::default();
        positions.set("orders-0", 40);
        positions.set("orders-2", 5);
        positions.set("orders@cluster:abc", 0);
        positions.set("other-1", 3);
        let lag = lag_of("orders", &offsets, Some(&positions));
        let got: Vec<_> = lag.iter().map(|l| (l.partition, l.position, l.lag)).collect();
        assert_eq!(got, vec![(0, Some(40), 60), (1, None, 40), (2, Some(5), 0)]);
        let none = lag_of("orders", &offsets, None);
        assert_eq!(none.iter().map(|l| l.lag).collect::<Vec<_>>(), vec![100, 40, 0]);
    }
}
