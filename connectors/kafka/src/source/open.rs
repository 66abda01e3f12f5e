//! Opening a topic — at `restore`, or when discovery finds a new one: its
//! partitions and cluster, the checks of what the checkpoint says of it,
//! every owned partition's start offset as a number.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use exactly_core::{ConnectorError, SplitPositions};
use exactly_kafka_wire::kafka_protocol::ResponseError;
use exactly_kafka_wire::{ConsumerClient, OffsetSpec, TopicId, WireError};
use tokio::time::Instant;

use super::cluster::{check_cluster, check_topic_id};
use super::positions::{checkpointed_partitions, recorded_clusters, recorded_topic_ids, waiting_for_start, Position};
use super::Settings;
use crate::config::StartPosition;

/// Pause between attempts while the brokers do not answer at start.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Where a subtask starts reading a topic.
#[derive(Debug)]
pub(super) struct Opened {
    /// The topic.
    pub(super) topic: String,
    pub(super) cluster: Option<String>,
    /// The topic's id, when the brokers name one.
    pub(super) topic_id: Option<TopicId>,
    /// The first offset to read of every owned partition, with the epoch
    /// of the record before it when known.
    pub(super) next: BTreeMap<i32, Position>,
    /// Owned partitions of the checkpoint missing from the metadata.
    pub(super) waiting: BTreeMap<i32, Position>,
    /// Owned partitions that pass over records before a `start` time they
    /// have not reached yet (Unix ms).
    pub(super) from_ms: BTreeMap<i32, i64>,
    /// Every partition of the topic.
    pub(super) partitions: BTreeSet<i32>,
}

/// A client of the control path for `restore`: no single request may
/// outlast the start's own limit.
pub(super) fn start_client(settings: &Settings) -> ConsumerClient {
    let limit = settings.config.startup_timeout;
    let mut wire = settings.wire.clone();
    wire.options.request_timeout = wire.options.request_timeout.min(limit);
    wire.options.connect_timeout = wire.options.connect_timeout.min(limit);
    ConsumerClient::new(wire)
}

/// The topics a subtask reads at `restore`: the topics named, or those the
/// cluster has that match the regex. Bounded by `startup_timeout` like
/// [`open`].
pub(super) async fn subscribed_topics(
    settings: &Settings,
    client: &mut ConsumerClient,
) -> Result<Vec<String>, ConnectorError> {
    if let Some(named) = settings.subscription.named() {
        return Ok(named);
    }
    let retry = Retry {
        settings,
        topic: String::new(),
        deadline: Instant::now() + settings.config.startup_timeout,
        what: "listing the cluster's topics".into(),
    };
    let names = loop {
        match client.topic_names().await {
            Ok(names) => break names,
            Err(error) => retry.after(error).await?,
        }
    };
    Ok(names.into_iter().filter(|t| settings.subscription.matches(t)).collect())
}

/// Opens `topic` for subtask `subtask` of `parallelism`: finds its
/// partitions, checks the cluster and the topic's id against what
/// `positions` recorded, resolves every start offset to a number. A topic
/// the positions hold nothing of starts at `start` on a first start
/// (`positions` is `None`), else at its beginning (it was created since).
/// Bounded by `startup_timeout`: brokers that do not answer by then are a
/// transient error, a topic that does not exist by then and every error no
/// retry cures (refused credentials, an untrusted certificate, a topic it
/// may not read) a fatal one.
pub(super) async fn open(
    settings: &Settings,
    client: &mut ConsumerClient,
    topic: &str,
    (subtask, parallelism): (usize, usize),
    positions: Option<&SplitPositions>,
) -> Result<Opened, ConnectorError> {
    let config = &settings.config;
    let deadline = Instant::now() + config.startup_timeout;
    let owns = |p: i32| settings.subscription.owner(topic, p, parallelism) == subtask;
    let retry = Retry {
        settings,
        topic: topic.to_string(),
        deadline,
        what: format!("reading the partitions of `{topic}`"),
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
    check_cluster(settings, topic, &recorded, cluster.as_deref())?;
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

    // A topic deleted and created again since: refused, or (accepted) read
    // from its beginning as if the checkpoint had never read it. Topic ids
    // are a cluster's own: offsets moved to another cluster (accepted
    // above) come with ids of the old one, which say nothing here.
    let same_cluster = recorded.is_empty() || cluster.as_deref().is_some_and(|c| recorded.contains(c));
    let recorded_ids = positions
        .filter(|_| same_cluster)
        .map(|p| recorded_topic_ids(p, topic))
        .unwrap_or_default();
    let same_topic = check_topic_id(settings, topic, &recorded_ids, metadata.topic_id)?;
    let positions = positions.filter(|_| same_topic);
    let checkpointed = positions
        .map(|pos| checkpointed_partitions(pos, topic))
        .unwrap_or_default();
    // A checkpoint that read this topic lists every partition that existed
    // then: the missing ones were added since, so they start at the
    // beginning. So does a recreated topic accepted above, and a topic of
    // several that the checkpoint does not list (created since).
    let several = settings.subscription.named().is_none_or(|named| named.len() > 1);
    let start = if !checkpointed.is_empty() || !same_topic || (several && positions.is_some()) {
        StartPosition::Earliest
    } else {
        config.start
    };
    let mut next = BTreeMap::new();
    let mut unresolved = Vec::new();
    for p in partitions.iter().copied().filter(|p| owns(*p)) {
        match checkpointed.get(&p) {
            Some(position) => {
                next.insert(p, *position);
            }
            None => unresolved.push(p),
        }
    }
    let waiting: BTreeMap<i32, Position> = checkpointed
        .into_iter()
        .filter(|(p, _)| owns(*p) && !partitions.contains(p))
        .collect();
    let mut from_ms: BTreeMap<i32, i64> = positions
        .map(|pos| waiting_for_start(pos, topic))
        .unwrap_or_default()
        .into_iter()
        .filter(|(p, _)| next.contains_key(p) || waiting.contains_key(p))
        .collect();
    if !unresolved.is_empty() {
        let retry = Retry {
            what: format!("resolving start position {start}"),
            ..retry
        };
        let resolved = loop {
            match resolve(client, settings, topic, start, &unresolved).await {
                Ok(resolved) => break resolved,
                Err(error) => retry.after(error).await?,
            }
        };
        for (p, (offset, from)) in resolved {
            next.insert(p, Position::at(offset));
            if let Some(from) = from {
                from_ms.insert(p, from);
            }
        }
    }
    Ok(Opened {
        topic: topic.to_string(),
        cluster,
        topic_id: metadata.topic_id,
        next,
        waiting,
        from_ms,
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

/// Turns `start` into an offset for each of `partitions`, with the start
/// time a partition still has to wait for: a time after every record below
/// the last stable offset starts there, and passes over the records after
/// it that are older than the time (a transaction still open, a producer's
/// clock behind) until the first one at or after it — the offset Kafka's
/// offsets-for-times would name once that record is written.
async fn resolve(
    client: &mut ConsumerClient,
    settings: &Settings,
    topic: &str,
    start: StartPosition,
    partitions: &[i32],
) -> Result<BTreeMap<i32, (i64, Option<i64>)>, WireError> {
    let mut waits = BTreeMap::new();
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
                // No record at or after the time yet: start at the end, and
                // wait there for the first record at or after the time.
                found.extend(client.list_offsets(topic, &after, OffsetSpec::LastStable).await?);
                waits.extend(after.into_iter().map(|p| (p, ms)));
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
            Some(offset) => Ok((*p, (offset, waits.get(p).copied()))),
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
    /// The topic opened (empty while listing topics).
    topic: String,
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
                    self.topic, settings.config.bootstrap
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
