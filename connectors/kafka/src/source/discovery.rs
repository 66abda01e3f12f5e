//! Partition discovery: every `partition_discovery_interval`, a task reads
//! the topic's metadata and finds the subtask's new partitions with the
//! offsets they start at, while the subtask goes on reading.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use exactly_kafka_wire::{ConsumerClient, OffsetSpec, WireError};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::open::ends;
use super::{owns, Settings};

/// Partitions found by a discovery round.
#[derive(Debug)]
pub(super) struct Discovered {
    /// Every partition of the topic.
    pub(super) all: BTreeSet<i32>,
    /// New partitions of this subtask with the offset to start at: their
    /// checkpointed one for a partition the checkpoint lists, else their
    /// beginning.
    pub(super) added: Vec<(i32, i64)>,
}

/// What a round gives back: the client it borrowed, and what it found.
type Round = (ConsumerClient, Result<Discovered, WireError>);

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
    pub(super) async fn poll(
        &mut self,
        settings: &Arc<Settings>,
        owner: (usize, usize),
        known: &BTreeSet<i32>,
        waiting: &BTreeMap<i32, i64>,
    ) -> Result<Option<Discovered>, WireError> {
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
                let (settings, known, waiting) = (settings.clone(), known.clone(), waiting.clone());
                self.round = Some(tokio::spawn(round(client, settings, owner, known, waiting)));
            }
        }
        Ok(None)
    }
}

/// One round: the topic's partitions, and the new ones of `owner`
/// (`(subtask, parallelism)`) with their start offsets.
async fn round(
    mut client: ConsumerClient,
    settings: Arc<Settings>,
    (subtask, parallelism): (usize, usize),
    known: BTreeSet<i32>,
    waiting: BTreeMap<i32, i64>,
) -> Round {
    let found = async {
        let metadata = client.topic_metadata(settings.topic()).await?;
        let all: BTreeSet<i32> = metadata.leaders.keys().copied().collect();
        let new: Vec<i32> = all
            .difference(&known)
            .copied()
            .filter(|p| owns(*p, subtask, parallelism))
            .collect();
        let fresh: Vec<i32> = new.iter().copied().filter(|p| !waiting.contains_key(p)).collect();
        // New partitions start at their beginning (`start` is for a first start).
        let starts = ends(&mut client, settings.topic(), &fresh, OffsetSpec::Earliest).await?;
        let added = new
            .iter()
            .filter_map(|p| Some((*p, waiting.get(p).or_else(|| starts.get(p)).copied()?)))
            .collect();
        Ok(Discovered { all, added })
    }
    .await;
    (client, found)
}
