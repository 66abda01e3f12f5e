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
use exactly_kafka::{KafkaSourceConfig, Subscription};

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

/// Reads the end offsets of the source's topics, on connections kept from
/// one reading to the next.
#[derive(Debug)]
pub struct KafkaLagProbe {
    config: KafkaSourceConfig,
    subscription: Subscription,
    client: Option<ConsumerClient>,
}

impl KafkaLagProbe {
    /// A probe for the topic and brokers of `config` (its client
    /// `properties`, e.g. security settings, apply).
    pub fn new(config: &KafkaSourceConfig) -> Self {
        KafkaLagProbe {
            config: config.clone(),
            subscription: config.subscription(),
            client: None,
        }
    }

    /// What the source reads, for messages.
    pub fn topics_label(&self) -> String {
        self.subscription.label()
    }

    /// The partitions' lags against `positions` (from a checkpoint; `None`:
    /// no checkpoint yet), topic by topic.
    pub async fn lag(&mut self, positions: Option<&SplitPositions>) -> Result<Vec<PartitionLag>, String> {
        let mut lags = Vec::new();
        for topic in self.topics().await? {
            let offsets = self.offsets(&topic).await?;
            lags.extend(lag_of(&topic, &offsets, positions));
        }
        Ok(lags)
    }

    /// The client, connected on first use.
    fn client(&mut self) -> Result<&mut ConsumerClient, String> {
        if self.client.is_none() {
            let wire = self.config.wire_config().map_err(|e| e.to_string())?;
            self.client = Some(ConsumerClient::new(wire));
        }
        Ok(self.client.as_mut().expect("set above"))
    }

    /// The topics the source reads now.
    async fn topics(&mut self) -> Result<Vec<String>, String> {
        if let Some(named) = self.subscription.named() {
            return Ok(named);
        }
        let bootstrap = self.config.bootstrap.clone();
        let names = self
            .client()?
            .topic_names()
            .await
            .map_err(|e| format!("cannot list the topics of Kafka at {bootstrap}: {e}"))?;
        Ok(names.into_iter().filter(|t| self.subscription.matches(t)).collect())
    }

    /// `(low, end)` of every partition of `topic`.
    async fn offsets(&mut self, topic: &str) -> Result<BTreeMap<i32, (i64, i64)>, String> {
        let topic = topic.to_string();
        let bootstrap = self.config.bootstrap.clone();
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!(
                "cannot read {what} of topic `{topic}` from Kafka at {bootstrap}: {e}. Check that the brokers are \
                 running and reachable at that address and that source.kafka.bootstrap is right"
            )
        };
        let client = self.client()?;
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
