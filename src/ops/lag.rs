//! Consumer lag of a Kafka source: per partition, the end offset the
//! brokers report (read_committed: the last stable offset) minus the
//! position the latest complete checkpoint recorded.
//!
//! Positions come from checkpoints (the only truth the pipeline keeps), so
//! the lag is what a restart would have to read again, and it reaches 0
//! once a checkpoint covers everything the topic holds.

use std::collections::BTreeMap;

use exactly_core::SplitPositions;
use exactly_kafka::wire::{ConsumerClient, OffsetSpec};
use exactly_kafka::KafkaSourceConfig;

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
    /// The end offset a read_committed consumer can read up to: the last
    /// stable offset.
    pub end: i64,
    /// `end - position` (`end - low` without a position), never negative.
    pub lag: i64,
}

/// Reads the end offsets of the source's topic, on connections kept from
/// one reading to the next.
#[derive(Debug)]
pub struct KafkaLagProbe {
    config: KafkaSourceConfig,
    client: Option<ConsumerClient>,
}

impl KafkaLagProbe {
    /// A probe for the topic and brokers of `config` (its client
    /// `properties`, e.g. security settings, apply).
    pub fn new(config: &KafkaSourceConfig) -> Self {
        KafkaLagProbe {
            config: config.clone(),
            client: None,
        }
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.config.topic
    }

    /// The partitions' lags against `positions` (from a checkpoint; `None`:
    /// no checkpoint yet).
    pub async fn lag(&mut self, positions: Option<&SplitPositions>) -> Result<Vec<PartitionLag>, String> {
        let offsets = self.offsets().await?;
        Ok(lag_of(&self.config.topic, &offsets, positions))
    }

    /// `(low, end)` of every partition of the topic.
    async fn offsets(&mut self) -> Result<BTreeMap<i32, (i64, i64)>, String> {
        let topic = self.config.topic.clone();
        let bootstrap = self.config.bootstrap.clone();
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!(
                "cannot read {what} of topic `{topic}` from Kafka at {bootstrap}: {e}. Check that the brokers are \
                 running and reachable at that address and that source.kafka.bootstrap is right"
            )
        };
        let client = match &mut self.client {
            Some(client) => client,
            None => {
                let wire = self.config.wire_config().map_err(|e| e.to_string())?;
                self.client.insert(ConsumerClient::new(wire))
            }
        };
        let metadata = client
            .topic_metadata(&topic)
            .await
            .map_err(|e| fail("the partitions", &e))?;
        let partitions: Vec<i32> = metadata.leaders.keys().copied().collect();
        if partitions.is_empty() {
            return Err(format!("topic `{topic}` has no partitions on Kafka at {bootstrap}"));
        }
        let low = client
            .list_offsets(&topic, &partitions, OffsetSpec::Earliest)
            .await
            .map_err(|e| fail("the first offsets", &e))?;
        let end = client
            .list_offsets(&topic, &partitions, OffsetSpec::LastStable)
            .await
            .map_err(|e| fail("the end offsets", &e))?;
        Ok(partitions
            .into_iter()
            .filter_map(|p| Some((p, (low.get(&p).copied()??, end.get(&p).copied()??))))
            .collect())
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
