//! Discovery: every `partition_discovery_interval`, a task reads the
//! metadata of the topics a subtask reads and finds their new partitions
//! (with the offsets they start at), and — for a `topic_regex` — the topics
//! created since that match (opened, read from their beginning) and those
//! deleted since, while the subtask goes on reading.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use exactly_core::{ConnectorError, SplitPositions};
use exactly_kafka_wire::{ConsumerClient, OffsetSpec, WireError};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::open::{ends, open, Opened};
use super::positions::Position;
use super::Settings;

/// New partitions of one topic found by a discovery round.
#[derive(Debug)]
pub(super) struct Found {
    /// Every partition of the topic.
    pub(super) all: BTreeSet<i32>,
    /// New partitions of this subtask with the offset to start at: their
    /// checkpointed one for a partition the checkpoint lists, else their
    /// beginning.
    pub(super) added: Vec<(i32, Position)>,
}

/// What a round found.
#[derive(Debug, Default)]
pub(super) struct Discovered {
    /// New partitions, by topic read.
    pub(super) partitions: BTreeMap<String, Found>,
    /// Topics created since that match the regex, opened.
    pub(super) opened: Vec<Opened>,
    /// Topics read that the cluster no longer has (regex only).
    pub(super) gone: Vec<String>,
}

/// What a subtask reads now, for a round: per topic, the partitions seen
/// and those of the checkpoint still missing.
#[derive(Debug, Clone, Default)]
pub(super) struct Reading {
    pub(super) known: BTreeMap<String, BTreeSet<i32>>,
    pub(super) waiting: BTreeMap<String, BTreeMap<i32, Position>>,
}

/// What a round gives back: the client it borrowed, and what it found.
type Round = (ConsumerClient, Result<Discovered, ConnectorError>);

/// The discovery rounds of one subtask.
#[derive(Debug)]
pub(super) struct Discovery {
    /// The control-path client, while no round holds it.
    client: Option<ConsumerClient>,
    round: Option<JoinHandle<Round>>,
    next_round: Instant,
}

impl Discovery {
    /// Rounds with `client`, the first one an interval from now.
    pub(super) fn new(client: ConsumerClient, settings: &Settings) -> Discovery {
        Discovery {
            client: Some(client),
            round: None,
            next_round: Instant::now() + settings.config.partition_discovery_interval,
        }
    }

    /// What a finished round found (`None` while none finished); starts the
    /// next round when it is due. A failed round is logged, counted and
    /// retried at the next interval; `Err` only for what no retry cures.
    /// `kept`: the positions of the checkpoint's topics not read now (a
    /// topic that comes back resumes them, or is checked against them).
    pub(super) async fn poll(
        &mut self,
        settings: &Arc<Settings>,
        owner: (usize, usize),
        reading: &Reading,
        kept: &SplitPositions,
    ) -> Result<Option<Discovered>, ConnectorError> {
        if self.round.as_ref().is_some_and(JoinHandle::is_finished) {
            let round = self.round.take().expect("checked above").await;
            self.next_round = Instant::now() + settings.config.partition_discovery_interval;
            let (client, found) = match round {
                Ok(round) => round,
                Err(error) => {
                    tracing::warn!(source = %settings.label, %error, "partition discovery panicked; retrying later");
                    self.client = Some(ConsumerClient::new(settings.wire.clone()));
                    return Ok(None);
                }
            };
            self.client = Some(client);
            return match found {
                Ok(found) => Ok(Some(found)),
                Err(error) if error.is_retriable() => {
                    settings.metrics.control_error();
                    tracing::warn!(source = %settings.label, %error, "partition discovery failed; retrying later");
                    Ok(None)
                }
                Err(error) => Err(error),
            };
        }
        if self.round.is_none() && Instant::now() >= self.next_round {
            if let Some(client) = self.client.take() {
                let (settings, reading, kept) = (settings.clone(), reading.clone(), kept.clone());
                self.round = Some(tokio::spawn(round(client, settings, owner, reading, kept)));
            }
        }
        Ok(None)
    }
}

/// One round for `owner` (`(subtask, parallelism)`).
async fn round(
    mut client: ConsumerClient,
    settings: Arc<Settings>,
    owner: (usize, usize),
    reading: Reading,
    kept: SplitPositions,
) -> Round {
    let found = async {
        let mut discovered = Discovered::default();
        if settings.subscription.named().is_none() {
            let names = client.topic_names().await.map_err(|e| transient(&settings, e))?;
            let matching: BTreeSet<String> = names.into_iter().filter(|t| settings.subscription.matches(t)).collect();
            discovered.gone = reading
                .known
                .keys()
                .filter(|t| !matching.contains(*t))
                .cloned()
                .collect();
            for topic in matching.iter().filter(|t| !reading.known.contains_key(*t)) {
                // A topic created since the pipeline started: from its
                // beginning (or from the positions it had, if it is one
                // of the checkpoint's that came back).
                let positions = Some(&kept);
                let opened = open(&settings, &mut client, topic, owner, positions).await?;
                tracing::info!(source = %settings.label, %topic, partitions = ?opened.next, "new topic picked up");
                discovered.opened.push(opened);
            }
        }
        for (topic, known) in &reading.known {
            if discovered.gone.contains(topic) {
                continue;
            }
            let waiting = reading.waiting.get(topic).cloned().unwrap_or_default();
            let found = partitions(&mut client, &settings, topic, owner, known, &waiting)
                .await
                .map_err(|e| transient(&settings, e))?;
            discovered.partitions.insert(topic.clone(), found);
        }
        Ok(discovered)
    }
    .await;
    (client, found)
}

/// The partitions of `topic`, and the new ones of `owner` with their start
/// offsets.
async fn partitions(
    client: &mut ConsumerClient,
    settings: &Settings,
    topic: &str,
    (subtask, parallelism): (usize, usize),
    known: &BTreeSet<i32>,
    waiting: &BTreeMap<i32, Position>,
) -> Result<Found, WireError> {
    let metadata = client.topic_metadata(topic).await?;
    let all: BTreeSet<i32> = metadata.leaders.keys().copied().collect();
    let new: Vec<i32> = all
        .difference(known)
        .copied()
        .filter(|p| settings.subscription.owner(topic, *p, parallelism) == subtask)
        .collect();
    let fresh: Vec<i32> = new.iter().copied().filter(|p| !waiting.contains_key(p)).collect();
    // New partitions start at their beginning (`start` is for a first start).
    let starts = ends(client, topic, &fresh, OffsetSpec::Earliest).await?;
    let added = new
        .iter()
        .filter_map(|p| {
            let position = waiting
                .get(p)
                .copied()
                .or_else(|| starts.get(p).map(|o| Position::at(*o)))?;
            Some((*p, position))
        })
        .collect();
    Ok(Found { all, added })
}

/// A client error of a round as the pipeline's: fatal for what no retry
/// cures, else transient (the round is tried again).
fn transient(settings: &Settings, error: WireError) -> ConnectorError {
    if error.is_retriable() {
        ConnectorError::transient(settings.context(), "partition discovery").caused_by(error)
    } else {
        ConnectorError::fatal(settings.context(), format!("partition discovery: {error}")).caused_by(error)
    }
}
