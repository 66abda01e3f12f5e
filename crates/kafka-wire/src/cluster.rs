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
use tracing::{debug, warn};

use crate::backoff::Backoff;
use crate::config::WireConfig;
use crate::connection::{versions, KafkaConnection};
use crate::error::WireError;
use crate::topic_id::TopicId;

/// Metadata versions spoken: v1 added `controller_id` and null-means-all
/// topics, v4 `allow_auto_topic_creation`, v9 flexible encoding, v10
/// topic ids, v13 a top-level error code.
const METADATA: VersionRange = versions(1, 13);
/// FindCoordinator versions spoken: v1 added `key_type` (0 = group,
/// 1 = transaction), v3 flexible encoding, v4 batched `coordinator_keys`.
const FIND_COORDINATOR: VersionRange = versions(1, 6);

/// The brokers of the cluster by node id, and the partitions of the topics
/// asked for with their leaders.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterMetadata {
    /// The cluster id (Metadata v2+).
    pub cluster_id: Option<String>,
    /// `HOST:PORT` by node id.
    pub brokers: BTreeMap<i32, String>,
    /// Leader node id by partition, for the one topic asked for (-1 when
    /// the broker knows none).
    pub leaders: BTreeMap<i32, i32>,
    /// The error code of every partition of that topic whose metadata
    /// carries one (LEADER_NOT_AVAILABLE, REPLICA_NOT_AVAILABLE, ...).
    pub partition_errors: BTreeMap<i32, ResponseError>,
    /// The leader epoch of every partition of that topic (Metadata v7+; -1
    /// when the broker names none).
    pub leader_epochs: BTreeMap<i32, i32>,
    /// The topic's id (Metadata v10+; `None` when the broker names none).
    pub topic_id: Option<TopicId>,
}

impl ClusterMetadata {
    /// The address of node `node_id`.
    pub(crate) fn broker(&self, node_id: i32) -> Option<&str> {
        self.brokers.get(&node_id).map(String::as_str)
    }
}

/// How long [`connect_any`] waits for one bootstrap server before it tries
/// the next one beside it.
const BOOTSTRAP_STAGGER: Duration = Duration::from_millis(300);

/// Opens a connection to a server of the bootstrap list: the first that
/// answers, tried in order but not one after the other — every
/// [`BOOTSTRAP_STAGGER`] without an answer the next server is tried beside
/// the ones still connecting, so one frozen or blackholed broker delays
/// the others by a fraction of a second, not by a connection timeout.
/// An error no retry cures (refused credentials, an untrusted certificate,
/// a listener of another protocol) is returned at once: the other servers
/// would say the same.
pub(crate) async fn connect_any(config: &WireConfig) -> Result<KafkaConnection, WireError> {
    let servers: Vec<String> = config.servers().to_vec();
    let mut attempts = tokio::task::JoinSet::new();
    let mut next = 0;
    let mut last = None;
    loop {
        if next < servers.len() {
            let (server, options) = (servers[next].clone(), config.options.clone());
            attempts.spawn(async move {
                let result = KafkaConnection::connect_with(&server, &options).await;
                (server, result)
            });
            next += 1;
        }
        let stagger = tokio::time::sleep(BOOTSTRAP_STAGGER);
        tokio::select! {
            done = attempts.join_next() => match done {
                None => break,
                Some(Ok((_, Ok(connection)))) => return Ok(connection),
                Some(Ok((_, Err(error)))) if !error.is_retriable() => return Err(error),
                Some(Ok((server, Err(error)))) => {
                    debug!(%server, %error, "bootstrap server unreachable");
                    last = Some(error);
                }
                Some(Err(join)) => debug!(error = %join, "a bootstrap connection attempt failed"),
            },
            _ = stagger, if next < servers.len() => {}
        }
        if attempts.is_empty() && next >= servers.len() {
            break;
        }
    }
    let last = last.unwrap_or_else(|| WireError::Connect {
        addr: config.bootstrap().to_string(),
        source: std::io::Error::other("every connection attempt ended without an answer"),
    });
    Err(WireError::NoBrokerReachable {
        bootstrap: config.bootstrap().to_string(),
        last: Box::new(last),
    })
}

/// Metadata of the cluster and, when `topic` is given, of that topic (an
/// unknown topic is an error; it is never auto-created). A partition whose
/// metadata carries an error code is an error too (see
/// [`partition_metadata`] for a lenient variant).
pub(crate) async fn metadata(
    connection: &mut KafkaConnection,
    topic: Option<&str>,
) -> Result<ClusterMetadata, WireError> {
    let cluster = partition_metadata(connection, topic).await?;
    if let (Some(topic), Some((partition, error))) = (topic, cluster.partition_errors.first_key_value()) {
        return Err(WireError::Broker {
            addr: connection.addr().to_string(),
            api: ApiKey::Metadata,
            error: *error,
            message: Some(format!("topic `{topic}` partition {partition}")),
        });
    }
    Ok(cluster)
}

/// Like [`metadata`], but partitions whose metadata carries an error code
/// are listed in [`ClusterMetadata::partition_errors`] instead of failing
/// the call.
pub(crate) async fn partition_metadata(
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
    let mut partition_errors = BTreeMap::new();
    let mut leader_epochs = BTreeMap::new();
    let mut topic_id = None;
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
        topic_id = TopicId::from_wire(found.topic_id);
        for partition in &found.partitions {
            if let Some(error) = ResponseError::try_from_code(partition.error_code) {
                partition_errors.insert(partition.partition_index, error);
            }
            leaders.insert(partition.partition_index, partition.leader_id.0);
            leader_epochs.insert(partition.partition_index, partition.leader_epoch);
        }
    }
    Ok(ClusterMetadata {
        cluster_id: response.cluster_id.map(|id| id.to_string()),
        brokers,
        leaders,
        partition_errors,
        leader_epochs,
        topic_id,
    })
}

/// The names of every topic of the cluster (Metadata asked for all
/// topics), internal ones (`__consumer_offsets`, ...) included.
pub(crate) async fn topic_names(
    connection: &mut KafkaConnection,
) -> Result<std::collections::BTreeSet<String>, WireError> {
    let request = MetadataRequest::default()
        .with_topics(None)
        .with_allow_auto_topic_creation(false);
    let (_, response) = connection.negotiated_request(METADATA, &request).await?;
    WireError::check(connection.addr(), ApiKey::Metadata, response.error_code, None)?;
    Ok(response
        .topics
        .into_iter()
        .filter(|t| ResponseError::try_from_code(t.error_code).is_none())
        .filter_map(|t| t.name.map(|n| n.0.to_string()))
        .collect())
}

/// `HOST:PORT`, bracketing IPv6 literals.
fn format_address(host: &str, port: i32) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Coordinator answers that say "not yet": the internal topic is being
/// created (a fresh cluster creates `__transaction_state` on the first
/// transactional request and `__consumer_offsets` on the first group
/// request), its partition is loading, or its leadership is moving.
pub(crate) const COORDINATOR_NOT_READY: [ResponseError; 3] = [
    ResponseError::CoordinatorNotAvailable,
    ResponseError::CoordinatorLoadInProgress,
    ResponseError::NotCoordinator,
];
/// First pause between FindCoordinator attempts; doubled up to
/// [`MAX_COORDINATOR_BACKOFF`].
pub(crate) const FIRST_COORDINATOR_BACKOFF: Duration = Duration::from_millis(50);
pub(crate) const MAX_COORDINATOR_BACKOFF: Duration = Duration::from_secs(1);

/// What a coordinator is looked up for: FindCoordinator's `key_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CoordinatorKind {
    /// A consumer group (key type 0), coordinated through `__consumer_offsets`.
    Group,
    /// A transactional id (key type 1), coordinated through
    /// `__transaction_state`.
    Transaction,
}

impl CoordinatorKind {
    fn key_type(self) -> i8 {
        match self {
            CoordinatorKind::Group => 0,
            CoordinatorKind::Transaction => 1,
        }
    }

    /// How a key of this kind is named in messages.
    fn key_name(self) -> &'static str {
        match self {
            CoordinatorKind::Group => "group",
            CoordinatorKind::Transaction => "transactional id",
        }
    }
}

/// Pauses between attempts while a coordinator answers that it is not
/// ready ([`COORDINATOR_NOT_READY`]): from [`FIRST_COORDINATOR_BACKOFF`],
/// doubled up to [`MAX_COORDINATOR_BACKOFF`], for as long as the next pause
/// still ends before the deadline.
pub(crate) fn not_ready_backoff(wait: Duration) -> Backoff {
    Backoff::new(wait, FIRST_COORDINATOR_BACKOFF, MAX_COORDINATOR_BACKOFF)
}

/// Whether to try again after `error`: it says the coordinator is not
/// ready, and the next pause of `backoff` ends before its deadline.
pub(crate) fn retries_not_ready(backoff: &Backoff, error: &WireError) -> bool {
    error.broker_error().is_some_and(|e| COORDINATOR_NOT_READY.contains(&e)) && backoff.fits()
}

/// The address of the transaction coordinator of `transactional_id`; see
/// [`coordinator`].
pub(crate) async fn transaction_coordinator(
    connection: &mut KafkaConnection,
    transactional_id: &str,
    wait: Duration,
) -> Result<String, WireError> {
    coordinator(connection, CoordinatorKind::Transaction, transactional_id, wait).await
}

/// The address of the coordinator of `key` (a group or a transactional id,
/// as `kind` says), asked on `connection`: FindCoordinator, then the node id
/// is mapped to its address through Metadata (falling back to the address
/// in the FindCoordinator answer for a node Metadata does not list).
///
/// A coordinator that is not ready yet ([`COORDINATOR_NOT_READY`]) is asked
/// again with backoff for up to `wait`; after that its last answer is the
/// error.
pub(crate) async fn coordinator(
    connection: &mut KafkaConnection,
    kind: CoordinatorKind,
    key: &str,
    wait: Duration,
) -> Result<String, WireError> {
    let mut backoff = not_ready_backoff(wait);
    loop {
        match find_coordinator_once(connection, kind, key).await {
            Err(error) if retries_not_ready(&backoff, &error) => {
                debug!(
                    kind = kind.key_name(),
                    key,
                    %error,
                    attempts = backoff.attempts(),
                    backoff = ?backoff.next_pause(),
                    "coordinator not ready; asking again"
                );
                backoff.pause().await;
            }
            result => return result,
        }
    }
}

/// One FindCoordinator for `key`, mapped to an address.
async fn find_coordinator_once(
    connection: &mut KafkaConnection,
    kind: CoordinatorKind,
    key: &str,
) -> Result<String, WireError> {
    let api = ApiKey::FindCoordinator;
    let version = connection.version(api, FIND_COORDINATOR)?;
    let key_bytes = StrBytes::from_string(key.to_string());
    let mut request = FindCoordinatorRequest::default().with_key_type(kind.key_type());
    if version >= 4 {
        request.coordinator_keys = vec![key_bytes];
    } else {
        request.key = key_bytes;
    }
    let response = connection.request(version, &request).await?;
    let (code, message, node_id, host, port) = if version >= 4 {
        let Some(found) = response.coordinators.into_iter().find(|c| c.key.as_str() == key) else {
            return Err(WireError::Protocol {
                addr: connection.addr().to_string(),
                message: format!("FindCoordinator answer does not mention {} `{key}`", kind.key_name()),
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
        "{} `{key}`{}",
        kind.key_name(),
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
    debug!(kind = kind.key_name(), key, node_id, %address, "coordinator");
    Ok(address)
}
