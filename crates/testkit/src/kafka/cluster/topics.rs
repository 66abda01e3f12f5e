//! Topics of a [`KafkaCluster`]: created (with an explicit replica
//! assignment if the test wants one), configured and deleted through the
//! controller, and read back from Metadata: each partition's leader, leader
//! epoch, replicas and in-sync replicas.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, DeleteTopicsRequest, IncrementalAlterConfigsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::{kafka_error, metadata_of, request_to, KafkaCluster, Step, Versioned};
use crate::error::Result;
use crate::kafka::jvm::kafka_uuid;
use crate::kafka::wire::KafkaRequestError;

/// How long the controller may take to create or delete a topic before it
/// answers REQUEST_TIMED_OUT (the kit then waits on).
const CONTROLLER_TIMEOUT_MS: i32 = 30_000;
/// `IncrementalAlterConfigs`' resource type of a topic.
const TOPIC_RESOURCE: i8 = 2;
/// `IncrementalAlterConfigs`' SET operation.
const SET: i8 = 0;

impl Versioned for CreateTopicsRequest {
    const VERSION: i16 = 7;
}

impl Versioned for DeleteTopicsRequest {
    const VERSION: i16 = 6;
}

impl Versioned for IncrementalAlterConfigsRequest {
    const VERSION: i16 = 1;
}

/// A topic as the cluster's Metadata describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicState {
    /// The topic's id as Kafka prints it (22 characters of URL-safe
    /// base64): a topic deleted and created again under the same name gets
    /// a new one.
    pub topic_id: String,
    /// Every partition, by index.
    pub partitions: BTreeMap<i32, PartitionState>,
}

/// One partition of a [`TopicState`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionState {
    /// The node id of its leader; `None` while it has none (offline, or an
    /// election under way).
    pub leader: Option<i32>,
    /// The leader epoch: raised by every leader change.
    pub leader_epoch: i32,
    /// The replicas' node ids; the first is the preferred leader.
    pub replicas: Vec<i32>,
    /// The in-sync replicas' node ids.
    pub isr: Vec<i32>,
    /// The replicas whose broker is offline.
    pub offline: Vec<i32>,
}

impl PartitionState {
    /// Whether it has a leader and every replica is in sync.
    pub fn is_fully_replicated(&self) -> bool {
        let mut replicas = self.replicas.clone();
        let mut isr = self.isr.clone();
        replicas.sort_unstable();
        isr.sort_unstable();
        self.leader.is_some() && replicas == isr
    }

    /// Whether its preferred replica (the first) leads it.
    pub fn is_led_by_preferred(&self) -> bool {
        self.leader.is_some() && self.leader == self.replicas.first().copied()
    }
}

impl KafkaCluster {
    /// Creates a topic of `partitions` partitions with `replication_factor`
    /// replicas each, placed by the controller, with topic `config`
    /// (`min.insync.replicas`, `unclean.leader.election.enable`, ...), and
    /// waits until every running broker's Metadata shows every partition
    /// with a leader and all its replicas in sync.
    pub fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        config: &[(&str, &str)],
    ) -> Result<()> {
        let topic = CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(partitions)
            .with_replication_factor(replication_factor);
        self.create(name, topic, config)
    }

    /// Creates a topic whose partition `i` has the replicas
    /// `assignment[i]` (node ids; the first is the preferred leader and
    /// leads once created), with topic `config`, and waits as
    /// [`create_topic`](Self::create_topic) does.
    pub fn create_topic_with_assignment(
        &self,
        name: &str,
        assignment: &[Vec<i32>],
        config: &[(&str, &str)],
    ) -> Result<()> {
        let assignments = assignment
            .iter()
            .enumerate()
            .map(|(partition, replicas)| {
                CreatableReplicaAssignment::default()
                    .with_partition_index(i32::try_from(partition).unwrap_or(i32::MAX))
                    .with_broker_ids(replicas.iter().map(|id| BrokerId(*id)).collect())
            })
            .collect();
        let topic = CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(-1)
            .with_replication_factor(-1)
            .with_assignments(assignments);
        self.create(name, topic, config)
    }

    fn create(&self, name: &str, topic: CreatableTopic, config: &[(&str, &str)]) -> Result<()> {
        let action = format!("creating topic {name}");
        let topic = topic.with_configs(
            config
                .iter()
                .map(|(key, value)| {
                    CreatableTopicConfig::default()
                        .with_name(StrBytes::from_string(key.to_string()))
                        .with_value(Some(StrBytes::from_string(value.to_string())))
                })
                .collect(),
        );
        let request = CreateTopicsRequest::default()
            .with_topics(vec![topic])
            .with_timeout_ms(CONTROLLER_TIMEOUT_MS);
        let mut retried = false;
        self.wait_until(&action, |cluster| {
            let response = cluster.any_broker(&action, |port| request_to(port, &request))?;
            let result = response
                .topics
                .first()
                .ok_or_else(|| kafka_error(&action, missing("the topic's result")))?;
            match KafkaRequestError::from_code(result.error_code, result.error_message.as_ref()) {
                None => Ok(Step::Done(())),
                // An earlier try that timed out created it after all.
                Some(err) if retried && err.response_error() == Some(ResponseError::TopicAlreadyExists) => {
                    Ok(Step::Done(()))
                }
                Some(err) if err.is_retriable() => {
                    retried = true;
                    Ok(Step::NotYet(err.to_string()))
                }
                Some(err) => Err(kafka_error(&action, err)),
            }
        })?;
        self.wait_on_every_broker(name, "every partition led and fully in sync", |state| {
            !state.partitions.is_empty() && state.partitions.values().all(PartitionState::is_fully_replicated)
        })?;
        tracing::info!(topic = name, "Kafka topic created");
        Ok(())
    }

    /// Deletes a topic and waits until no running broker's Metadata knows
    /// it any more.
    pub fn delete_topic(&self, name: &str) -> Result<()> {
        let action = format!("deleting topic {name}");
        let request = DeleteTopicsRequest::default()
            .with_topics(vec![DeleteTopicState::default().with_name(Some(topic_name(name)))])
            .with_timeout_ms(CONTROLLER_TIMEOUT_MS);
        let mut retried = false;
        self.wait_until(&action, |cluster| {
            let response = cluster.any_broker(&action, |port| request_to(port, &request))?;
            let result = response
                .responses
                .first()
                .ok_or_else(|| kafka_error(&action, missing("the topic's result")))?;
            match KafkaRequestError::from_code(result.error_code, result.error_message.as_ref()) {
                None => Ok(Step::Done(())),
                Some(err) if retried && err.response_error() == Some(ResponseError::UnknownTopicOrPartition) => {
                    Ok(Step::Done(()))
                }
                // UNKNOWN_TOPIC_OR_PARTITION is retriable to Kafka, not here:
                // the topic is not there to delete.
                Some(err)
                    if err.is_retriable() && err.response_error() != Some(ResponseError::UnknownTopicOrPartition) =>
                {
                    retried = true;
                    Ok(Step::NotYet(err.to_string()))
                }
                Some(err) => Err(kafka_error(&action, err)),
            }
        })?;
        self.wait_until(&format!("{name} gone from every broker's Metadata"), |cluster| {
            for (node_id, port) in cluster.answering_ports() {
                match topic_on(port, name) {
                    Err(err) if err.response_error() == Some(ResponseError::UnknownTopicOrPartition) => {}
                    Err(err) => return Ok(Step::NotYet(format!("node {node_id}: {err}"))),
                    Ok(state) => return Ok(Step::NotYet(format!("node {node_id} still has {state:?}"))),
                }
            }
            Ok(Step::Done(()))
        })?;
        tracing::info!(topic = name, "Kafka topic deleted");
        Ok(())
    }

    /// Sets topic configs (`unclean.leader.election.enable`,
    /// `min.insync.replicas`, ...; other keys keep their values). The
    /// controller has applied them when this returns; brokers apply them as
    /// they replay the metadata log, within moments.
    pub fn alter_topic_config(&self, topic: &str, config: &[(&str, &str)]) -> Result<()> {
        let action = format!("setting {config:?} on topic {topic}");
        let resource = AlterConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE)
            .with_resource_name(StrBytes::from_string(topic.to_string()))
            .with_configs(
                config
                    .iter()
                    .map(|(key, value)| {
                        AlterableConfig::default()
                            .with_name(StrBytes::from_string(key.to_string()))
                            .with_config_operation(SET)
                            .with_value(Some(StrBytes::from_string(value.to_string())))
                    })
                    .collect(),
            );
        let request = IncrementalAlterConfigsRequest::default().with_resources(vec![resource]);
        self.wait_until(&action, |cluster| {
            let response = cluster.any_broker(&action, |port| request_to(port, &request))?;
            let result = response
                .responses
                .first()
                .ok_or_else(|| kafka_error(&action, missing("the topic's result")))?;
            match KafkaRequestError::from_code(result.error_code, result.error_message.as_ref()) {
                None => Ok(Step::Done(())),
                Some(err) if err.is_retriable() => Ok(Step::NotYet(err.to_string())),
                Some(err) => Err(kafka_error(&action, err)),
            }
        })
    }

    /// The topic as the first broker that answers describes it.
    pub fn topic(&self, name: &str) -> Result<TopicState> {
        let action = format!("reading topic {name} from Metadata");
        self.any_broker(&action, |port| topic_on(port, name))
    }

    /// Each partition's leader (`None`: it has none now).
    pub fn leaders(&self, topic: &str) -> Result<BTreeMap<i32, Option<i32>>> {
        self.map_partitions(topic, |p| p.leader)
    }

    /// Each partition's leader epoch.
    pub fn leader_epochs(&self, topic: &str) -> Result<BTreeMap<i32, i32>> {
        self.map_partitions(topic, |p| p.leader_epoch)
    }

    /// Each partition's in-sync replicas.
    pub fn isr(&self, topic: &str) -> Result<BTreeMap<i32, Vec<i32>>> {
        self.map_partitions(topic, |p| p.isr.clone())
    }

    /// Waits until `condition` holds for the topic as the first broker that
    /// answers describes it, and returns that description. A topic not
    /// (yet) known counts as not holding.
    pub fn wait_for_topic(
        &self,
        name: &str,
        what: &str,
        mut condition: impl FnMut(&TopicState) -> bool,
    ) -> Result<TopicState> {
        self.wait_until(&format!("{what} ({name})"), |cluster| match cluster.topic(name) {
            Ok(state) if condition(&state) => Ok(Step::Done(state)),
            Ok(state) => Ok(Step::NotYet(format!("{state:?}"))),
            Err(err) => Ok(Step::NotYet(err.to_string())),
        })
    }

    /// Waits until `condition` holds for the topic as every broker that
    /// answers describes it.
    pub(super) fn wait_on_every_broker(
        &self,
        name: &str,
        what: &str,
        condition: impl Fn(&TopicState) -> bool,
    ) -> Result<()> {
        self.wait_until(&format!("{what} ({name}) on every broker"), |cluster| {
            for (node_id, port) in cluster.answering_ports() {
                match topic_on(port, name) {
                    Ok(state) if condition(&state) => {}
                    Ok(state) => return Ok(Step::NotYet(format!("node {node_id}: {state:?}"))),
                    Err(err) => return Ok(Step::NotYet(format!("node {node_id}: {err}"))),
                }
            }
            Ok(Step::Done(()))
        })
    }

    fn map_partitions<T>(&self, topic: &str, f: impl Fn(&PartitionState) -> T) -> Result<BTreeMap<i32, T>> {
        let state = self.topic(topic)?;
        Ok(state.partitions.iter().map(|(index, p)| (*index, f(p))).collect())
    }
}

/// The topic as the broker on `port` describes it; the topic's error (such
/// as UNKNOWN_TOPIC_OR_PARTITION) as an error.
pub(super) fn topic_on(port: u16, name: &str) -> Result<TopicState, KafkaRequestError> {
    let metadata = metadata_of(port, Some(&[name]))?;
    let topic = metadata
        .topics
        .into_iter()
        .find(|topic| topic.name.as_ref().is_some_and(|n| n.0.as_str() == name))
        .ok_or_else(|| missing("the topic in the Metadata answer"))?;
    topic_state(topic)
}

fn topic_state(topic: MetadataResponseTopic) -> Result<TopicState, KafkaRequestError> {
    if let Some(err) = KafkaRequestError::from_code(topic.error_code, None) {
        return Err(err);
    }
    let ids = |nodes: &[BrokerId]| nodes.iter().map(|id| id.0).collect::<Vec<_>>();
    Ok(TopicState {
        topic_id: kafka_uuid(*topic.topic_id.as_bytes()),
        partitions: topic
            .partitions
            .iter()
            .map(|p| {
                let state = PartitionState {
                    leader: (p.leader_id.0 >= 0).then_some(p.leader_id.0),
                    leader_epoch: p.leader_epoch,
                    replicas: ids(&p.replica_nodes),
                    isr: ids(&p.isr_nodes),
                    offline: ids(&p.offline_replicas),
                };
                (p.partition_index, state)
            })
            .collect(),
    })
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// An answer lacking what the request asked for.
pub(super) fn missing(what: &str) -> KafkaRequestError {
    KafkaRequestError::Incomplete { what: what.to_string() }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::metadata_response::MetadataResponsePartition;

    use super::*;

    fn partition(leader: i32, replicas: &[i32], isr: &[i32]) -> PartitionState {
        PartitionState {
            leader: (leader >= 0).then_some(leader),
            leader_epoch: 0,
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            offline: Vec::new(),
        }
    }

    #[test]
    fn a_partition_is_fully_replicated_when_led_and_every_replica_is_in_sync() {
        assert!(partition(2, &[2, 1, 3], &[1, 3, 2]).is_fully_replicated());
        assert!(!partition(2, &[2, 1, 3], &[2, 1]).is_fully_replicated());
        assert!(!partition(-1, &[2, 1], &[2, 1]).is_fully_replicated());
    }

    #[test]
    fn the_first_replica_is_the_preferred_leader() {
        assert!(partition(2, &[2, 1], &[2, 1]).is_led_by_preferred());
        assert!(!partition(1, &[2, 1], &[2, 1]).is_led_by_preferred());
        assert!(!partition(-1, &[2, 1], &[1]).is_led_by_preferred());
    }

    #[test]
    fn metadata_becomes_a_topic_state_or_the_topics_error() {
        let topic = MetadataResponseTopic::default()
            .with_name(Some(topic_name("t")))
            .with_partitions(vec![MetadataResponsePartition::default()
                .with_partition_index(0)
                .with_leader_id(BrokerId(-1))
                .with_leader_epoch(4)
                .with_replica_nodes(vec![BrokerId(1), BrokerId(2)])
                .with_isr_nodes(vec![BrokerId(1)])
                .with_offline_replicas(vec![BrokerId(1)])]);
        let state = topic_state(topic.clone()).unwrap();
        assert_eq!(state.topic_id.len(), 22);
        assert_eq!(
            state.partitions[&0],
            PartitionState {
                leader: None,
                leader_epoch: 4,
                replicas: vec![1, 2],
                isr: vec![1],
                offline: vec![1],
            }
        );
        let err = topic_state(topic.with_error_code(3)).unwrap_err();
        assert_eq!(err.response_error(), Some(ResponseError::UnknownTopicOrPartition));
    }
}
