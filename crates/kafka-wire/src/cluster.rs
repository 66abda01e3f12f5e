//! Reaching the cluster: a bootstrap connection, Metadata (node id →
//! address, partition leaders) and FindCoordinator.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, FindCoordinatorRequest, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use kafka_protocol::ResponseError;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::WireConfig;
use crate::connection::{versions, KafkaConnection};
use crate::error::WireError;

/// Metadata versions spoken: v1 added `controller_id` and null-means-all
/// topics, v4 `allow_auto_topic_creation`, v9 flexible encoding, v10
/// topic ids, v13 a top-level error code.
const METADATA: VersionRange = versions(1, 13);
/// FindCoordinator versions spoken: v1 added `key_type` (1 = transaction),
/// v3 flexible encoding, v4 batched `coordinator_keys`.
const FIND_COORDINATOR: VersionRange = versions(1, 6);
/// FindCoordinator `key_type` of a transactional id.
const KEY_TYPE_TRANSACTION: i8 = 1;

/// The brokers of the cluster by node id, and the partitions of the topics
/// asked for with their leaders.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterMetadata {
    /// `HOST:PORT` by node id.
    pub brokers: BTreeMap<i32, String>,
    /// Leader node id by partition, for the one topic asked for.
    pub leaders: BTreeMap<i32, i32>,
}

impl ClusterMetadata {
    /// The address of node `node_id`.
    pub fn broker(&self, node_id: i32) -> Option<&str> {
        self.brokers.get(&node_id).map(String::as_str)
    }
}

/// Opens a connection to the first server of the bootstrap list that
/// answers.
pub(crate) async fn connect_any(config: &WireConfig) -> Result<KafkaConnection, WireError> {
    let mut last = None;
    for server in config.servers() {
        match KafkaConnection::connect_with(server, &config.options).await {
            Ok(connection) => return Ok(connection),
            // Refused credentials, an untrusted certificate, a listener of
            // another protocol: the other servers would say the same.
            Err(error) if !error.is_retriable() => return Err(error),
            Err(error) => {
                debug!(%server, %error, "bootstrap server unreachable");
                last = Some(error);
            }
        }
    }
    let last = last.expect("a WireConfig has at least one server");
    Err(WireError::NoBrokerReachable {
        bootstrap: config.bootstrap().to_string(),
        last: Box::new(last),
    })
}

/// Metadata of the cluster and, when `topic` is given, of that topic (an
/// unknown topic is an error; it is never auto-created).
pub(crate) async fn metadata(
    connection: &mut KafkaConnection,
    topic: Option<&str>,
) -> Result<ClusterMetadata, WireError> {
    let topics = topic.map(|name| {
        vec![MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))]
    });
    // `Some(vec![])` asks for no topic at all (v1+), `None` for all of them.
    let request = MetadataRequest::default()
        .with_topics(Some(topics.unwrap_or_default()))
        .with_allow_auto_topic_creation(false);
    let (_, response) = connection.negotiated_request(METADATA, &request).await?;
    cluster_metadata(connection.addr(), topic, response)
}

fn cluster_metadata(addr: &str, topic: Option<&str>, response: MetadataResponse) -> Result<ClusterMetadata, WireError> {
    WireError::check(addr, ApiKey::Metadata, response.error_code, None)?;
    let brokers = response
        .brokers
        .iter()
        .map(|broker| (broker.node_id.0, format_address(&broker.host, broker.port)))
        .collect();
    let mut leaders = BTreeMap::new();
    if let Some(wanted) = topic {
        let found = response
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|name| name.0.as_str() == wanted));
        let Some(found) = found else {
            return Err(WireError::Protocol {
                addr: addr.to_string(),
                message: format!("Metadata answer does not mention topic `{wanted}`"),
            });
        };
        WireError::check(
            addr,
            ApiKey::Metadata,
            found.error_code,
            Some(&format!("topic `{wanted}`")),
        )?;
        for partition in &found.partitions {
            let context = format!("topic `{wanted}` partition {}", partition.partition_index);
            WireError::check(addr, ApiKey::Metadata, partition.error_code, Some(&context))?;
            leaders.insert(partition.partition_index, partition.leader_id.0);
        }
    }
    Ok(ClusterMetadata { brokers, leaders })
}

/// `HOST:PORT`, bracketing IPv6 literals.
fn format_address(host: &str, port: i32) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// FindCoordinator answers that say "not yet": the transaction log is being
/// created (a fresh cluster creates it on the first transactional request),
/// its partition is loading, or its leadership is moving.
pub(crate) const COORDINATOR_NOT_READY: [ResponseError; 3] = [
    ResponseError::CoordinatorNotAvailable,
    ResponseError::CoordinatorLoadInProgress,
    ResponseError::NotCoordinator,
];
/// First pause between FindCoordinator attempts; doubled up to
/// [`MAX_COORDINATOR_BACKOFF`].
pub(crate) const FIRST_COORDINATOR_BACKOFF: Duration = Duration::from_millis(50);
pub(crate) const MAX_COORDINATOR_BACKOFF: Duration = Duration::from_secs(1);

/// The address of the transaction coordinator of `transactional_id`, asked
/// on `connection`: FindCoordinator (key type 1), then the node id is mapped
/// to its address through Metadata (falling back to the address in the
/// FindCoordinator answer for a node Metadata does not list).
///
/// A coordinator that is not ready yet ([`COORDINATOR_NOT_READY`]) is asked
/// again with backoff for up to `wait`; after that its last answer is the
/// error.
pub(crate) async fn transaction_coordinator(
    connection: &mut KafkaConnection,
    transactional_id: &str,
    wait: Duration,
) -> Result<String, WireError> {
    let deadline = Instant::now() + wait;
    let mut backoff = FIRST_COORDINATOR_BACKOFF;
    let mut attempts = 1u32;
    loop {
        match find_coordinator_once(connection, transactional_id).await {
            Err(WireError::Broker { error, .. })
                if COORDINATOR_NOT_READY.contains(&error) && Instant::now() + backoff <= deadline =>
            {
                debug!(%transactional_id, %error, attempts, ?backoff, "transaction coordinator not ready; asking again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_COORDINATOR_BACKOFF);
                attempts += 1;
            }
            result => return result,
        }
    }
}

/// One FindCoordinator for `transactional_id`, mapped to an address.
async fn find_coordinator_once(connection: &mut KafkaConnection, transactional_id: &str) -> Result<String, WireError> {
    let api = ApiKey::FindCoordinator;
    let version = connection.version(api, FIND_COORDINATOR)?;
    let key = StrBytes::from_string(transactional_id.to_string());
    let mut request = FindCoordinatorRequest::default().with_key_type(KEY_TYPE_TRANSACTION);
    if version >= 4 {
        request.coordinator_keys = vec![key];
    } else {
        request.key = key;
    }
    let response = connection.request(version, &request).await?;
    let (code, message, node_id, host, port) = if version >= 4 {
        let Some(found) = response
            .coordinators
            .into_iter()
            .find(|c| c.key.as_str() == transactional_id)
        else {
            return Err(WireError::Protocol {
                addr: connection.addr().to_string(),
                message: format!("FindCoordinator answer does not mention transactional id `{transactional_id}`"),
            });
        };
        (
            found.error_code,
            found.error_message,
            found.node_id,
            found.host,
            found.port,
        )
    } else {
        (
            response.error_code,
            response.error_message,
            response.node_id,
            response.host,
            response.port,
        )
    };
    let context = format!(
        "transactional id `{transactional_id}`{}",
        message
            .filter(|m| !m.is_empty())
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    );
    WireError::check(connection.addr(), api, code, Some(&context))?;
    let BrokerId(node_id) = node_id;
    let announced = format_address(&host, port);
    let cluster = metadata(connection, None).await?;
    let address = match cluster.broker(node_id) {
        Some(address) => {
            if address != announced {
                debug!(node_id, %address, %announced, "FindCoordinator and Metadata disagree; using Metadata");
            }
            address.to_string()
        }
        None => {
            warn!(node_id, %announced, "coordinator node is not in Metadata; using the FindCoordinator address");
            announced
        }
    };
    debug!(%transactional_id, node_id, %address, "transaction coordinator");
    Ok(address)
}
