//! `restore`'s work: the topic's partitions and cluster, every owned
//! partition's start offset as a number.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use exactly_core::{ConnectorError, SplitPositions};
use exactly_kafka_wire::kafka_protocol::ResponseError;
use exactly_kafka_wire::{ConsumerClient, OffsetSpec, WireError};
use tokio::time::Instant;

use super::cluster::{check_cluster, checkpointed_partitions, recorded_clusters};
use super::{owns, Settings};
use crate::config::StartPosition;

/// Pause between attempts while the brokers do not answer at start.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Where a subtask starts.
pub(super) struct Opened {
    /// The client of the control path, connected.
    pub(super) client: ConsumerClient,
    pub(super) cluster: Option<String>,
    /// The first offset to read of every owned partition.
    pub(super) next: BTreeMap<i32, i64>,
    /// Owned partitions of the checkpoint missing from the metadata.
    pub(super) waiting: BTreeMap<i32, i64>,
    /// Every partition of the topic.
    pub(super) partitions: BTreeSet<i32>,
}

/// Finds the partitions, checks the cluster, resolves every start offset
/// to a number. Bounded by `startup_timeout`: brokers that do not answer
/// by then are a transient error, a topic that does not exist by then and
/// every error no retry cures (refused credentials, an untrusted
/// certificate, a topic it may not read) a fatal one.
pub(super) async fn open(
    settings: &Settings,
    subtask: usize,
    parallelism: usize,
    positions: Option<&SplitPositions>,
) -> Result<Opened, ConnectorError> {
    let config = &settings.config;
    let deadline = Instant::now() + config.startup_timeout;
    // No single request may outlast the start's own limit.
    let mut wire = settings.wire.clone();
    let limit = config.startup_timeout;
    wire.options.request_timeout = wire.options.request_timeout.min(limit);
    wire.options.connect_timeout = wire.options.connect_timeout.min(limit);
    let mut client = ConsumerClient::new(wire);
    let topic = settings.topic();
    let retry = Retry {
        settings,
        deadline,
        what: "reading the topic's partitions".into(),
    };
    let metadata = loop {
        match client.topic_metadata(topic).await {
            Ok(metadata) => break metadata,
            Err(error) => retry.after(error).await?,
        }
    };
    let partitions: BTreeSet<i32> = metadata.leaders.keys().copied().collect();
    let cluster = metadata.cluster_id;
    let recorded = positions.map(|p| recorded_clusters(p, topic)).unwrap_or_default();
    check_cluster(settings, &recorded, cluster.as_deref())?;
    match (&cluster, positions.is_some() && recorded.is_empty()) {
        (None, _) => tracing::warn!(
            source = %settings.label,
            "the brokers report no cluster id: a checkpoint cannot tell which cluster its offsets belong to"
        ),
        (Some(cluster), true) => tracing::info!(
            source = %settings.label,
            cluster,
            "the checkpoint does not name its cluster (written before the source recorded it): recording this one"
        ),
        (Some(_), false) => {}
    }

    // A checkpoint that read this topic lists every partition that existed
    // then: the missing ones were added since, so they start at the beginning.
    let topic_in_checkpoint = positions.is_some_and(|p| !checkpointed_partitions(p, topic).is_empty());
    let start = if topic_in_checkpoint {
        StartPosition::Earliest
    } else {
        config.start
    };
    let mut next = BTreeMap::new();
    let mut unresolved = Vec::new();
    for p in partitions.iter().copied().filter(|p| owns(*p, subtask, parallelism)) {
        match positions.and_then(|pos| pos.get(&settings.split(p))) {
            Some(offset) => {
                next.insert(p, offset);
            }
            None => unresolved.push(p),
        }
    }
    let waiting: BTreeMap<i32, i64> = positions
        .map(|pos| checkpointed_partitions(pos, topic))
        .unwrap_or_default()
        .into_iter()
        .filter(|(p, _)| owns(*p, subtask, parallelism) && !partitions.contains(p))
        .collect();
    if !unresolved.is_empty() {
        let retry = Retry {
            what: format!("resolving start position {start}"),
            ..retry
        };
        let resolved = loop {
            match resolve(&mut client, settings, start, &unresolved).await {
                Ok(resolved) => break resolved,
                Err(error) => retry.after(error).await?,
            }
        };
        next.extend(resolved);
    }
    Ok(Opened {
        client,
        cluster,
        next,
        waiting,
        partitions,
    })
}

/// The offset of each of `partitions` at one of the log's ends
/// ([`OffsetSpec::Earliest`], [`OffsetSpec::LastStable`], ...), which the
/// broker always names.
pub(super) async fn ends(
    client: &mut ConsumerClient,
    topic: &str,
    partitions: &[i32],
    end: OffsetSpec,
) -> Result<BTreeMap<i32, i64>, WireError> {
    let found = client.list_offsets(topic, partitions, end).await?;
    Ok(found.into_iter().filter_map(|(p, o)| Some((p, o?))).collect())
}

/// Turns `start` into an offset for each of `partitions`.
async fn resolve(
    client: &mut ConsumerClient,
    settings: &Settings,
    start: StartPosition,
    partitions: &[i32],
) -> Result<BTreeMap<i32, i64>, WireError> {
    let topic = settings.topic();
    let found = match start {
        StartPosition::Earliest => client.list_offsets(topic, partitions, OffsetSpec::Earliest).await?,
        // The end a read_committed consumer sees: never inside a
        // transaction still open, whose first records would be skipped.
        StartPosition::Latest => client.list_offsets(topic, partitions, OffsetSpec::LastStable).await?,
        StartPosition::Timestamp(ms) => {
            let mut found = client
                .list_offsets(topic, partitions, OffsetSpec::Timestamp(ms))
                .await?;
            let after: Vec<i32> = found.iter().filter(|(_, o)| o.is_none()).map(|(p, _)| *p).collect();
            if !after.is_empty() {
                // No record at or after the time: start at the end.
                found.extend(client.list_offsets(topic, &after, OffsetSpec::LastStable).await?);
            }
            found
        }
        StartPosition::Group => {
            let mut found = client.committed_offsets(&settings.group, topic, partitions).await?;
            let none: Vec<i32> = found.iter().filter(|(_, o)| o.is_none()).map(|(p, _)| *p).collect();
            if !none.is_empty() {
                tracing::info!(topic, partitions = ?none, "the group has no committed offset: starting at earliest");
                found.extend(client.list_offsets(topic, &none, OffsetSpec::Earliest).await?);
            }
            found
        }
    };
    partitions
        .iter()
        .map(|p| match found.get(p).copied().flatten() {
            Some(offset) => Ok((*p, offset)),
            None => Err(WireError::Protocol {
                addr: settings.config.bootstrap.clone(),
                message: format!("no offset for {topic}/{p} at start position {start}"),
            }),
        })
        .collect()
}

/// What a failed attempt at start leads to.
struct Retry<'a> {
    settings: &'a Settings,
    deadline: Instant,
    /// The step, for messages.
    what: String,
}

impl Retry<'_> {
    /// After `error`: `Ok` once it is time to try again, or the error to
    /// end `restore` with. An error no retry cures is fatal at once; a topic
    /// still unknown at the deadline is fatal, naming it; anything else
    /// then is transient, naming the bootstrap.
    async fn after(&self, error: WireError) -> Result<(), ConnectorError> {
        let (settings, what) = (self.settings, &self.what);
        if !error.is_retriable() {
            return Err(ConnectorError::fatal(settings.context(), format!("{what}: {error}")));
        }
        if Instant::now() + RETRY_PAUSE < self.deadline {
            tracing::debug!(source = %settings.label, %error, "{what}: retrying");
            settings.metrics.control_error();
            tokio::time::sleep(RETRY_PAUSE).await;
            return Ok(());
        }
        let waited = humantime::format_duration(settings.config.startup_timeout);
        if error.broker_error() == Some(ResponseError::UnknownTopicOrPartition) {
            return Err(ConnectorError::fatal(
                settings.context(),
                format!(
                    "topic `{}` does not exist on `{}` (still unknown after {waited}); create it or fix `topic`",
                    settings.topic(),
                    settings.config.bootstrap
                ),
            ));
        }
        Err(ConnectorError::transient(
            settings.context(),
            format!(
                "{what}: Kafka bootstrap `{}` did not answer within {waited} (last error: {error}); \
                 check `bootstrap` and that the brokers are running",
                settings.config.bootstrap
            ),
        ))
    }
}
