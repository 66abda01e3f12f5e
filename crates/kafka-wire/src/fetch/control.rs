//! The fetcher's control path — reading the topic's metadata, checking
//! positions against their leader's log, looking up an out-of-range
//! partition's bounds — each as a task of its own beside the Fetches, so
//! that a broker that does not answer holds up only what waits for it:
//! never the Fetches to healthy brokers.
//!
//! A task borrows a [`ConsumerClient`] from the driver's pool and gives it
//! back with its answer ([`Done`]); the driver applies the answer.

use std::collections::BTreeMap;

use kafka_protocol::ResponseError;
use tokio::task::JoinSet;

use crate::consumer_client::{ConsumerClient, EpochAsk, EpochEnd, OffsetSpec, TopicMetadata};
use crate::error::WireError;

/// A finished control task: the client it borrowed, and its answer.
pub(super) struct Done {
    pub(super) client: ConsumerClient,
    pub(super) answer: Answer,
}

/// What a control task found.
pub(super) enum Answer {
    /// The topic's metadata.
    Metadata(Result<TopicMetadata, WireError>),
    /// The ends of the epochs of the positions `asked` (partition →
    /// (position, epoch)), asked of the leader at `leader`.
    Epochs {
        leader: String,
        asked: BTreeMap<i32, (i64, i32)>,
        result: Result<BTreeMap<i32, Result<EpochEnd, ResponseError>>, WireError>,
    },
    /// The bounds of `partition`, out of range at `position`.
    Bounds {
        partition: i32,
        position: i64,
        result: Result<Bounds, WireError>,
    },
}

/// A partition's bounds, to place an out-of-range position.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// The log start offset.
    pub(super) start: i64,
    /// The high watermark.
    pub(super) end: i64,
    /// The last stable offset.
    pub(super) stable: i64,
}

/// The offset of `partition` at one of its log's ends.
async fn offset_at(
    client: &mut ConsumerClient,
    topic: &str,
    partition: i32,
    spec: OffsetSpec,
) -> Result<i64, WireError> {
    let found = client.list_offsets(topic, &[partition], spec).await?;
    found
        .get(&partition)
        .copied()
        .flatten()
        .ok_or_else(|| WireError::Protocol {
            addr: client.config().bootstrap().to_string(),
            message: format!("ListOffsets names no {spec:?} offset for {topic}/{partition}"),
        })
}

/// The running control tasks.
#[derive(Default)]
pub(super) struct Control {
    tasks: JoinSet<Done>,
    idle: Vec<ConsumerClient>,
}

impl Control {
    /// A client of the pool, or a new one for `template`'s cluster.
    fn client(&mut self, template: &ConsumerClient) -> ConsumerClient {
        self.idle
            .pop()
            .unwrap_or_else(|| ConsumerClient::new(template.config().clone()))
    }

    /// Reads `topic`'s metadata, from the broker at `prefer` if given.
    pub(super) fn metadata(&mut self, template: &ConsumerClient, topic: &str, prefer: Option<String>) {
        let mut client = self.client(template);
        let topic = topic.to_string();
        self.tasks.spawn(async move {
            let result = client.topic_metadata_at(prefer.as_deref(), &topic).await;
            Done {
                client,
                answer: Answer::Metadata(result),
            }
        });
    }

    /// Asks the leader at `leader` where the epochs of `asked` (partition →
    /// (position, epoch)) end, under `current` leader epoch.
    pub(super) fn epochs(
        &mut self,
        template: &ConsumerClient,
        topic: &str,
        leader: String,
        current: i32,
        asked: BTreeMap<i32, (i64, i32)>,
    ) {
        let mut client = self.client(template);
        let topic = topic.to_string();
        self.tasks.spawn(async move {
            let asks: Vec<EpochAsk> = asked
                .iter()
                .map(|(&partition, &(_, epoch))| EpochAsk {
                    partition,
                    epoch,
                    current_leader_epoch: current,
                })
                .collect();
            let result = client.epoch_ends_at(&leader, &topic, &asks).await;
            Done {
                client,
                answer: Answer::Epochs { leader, asked, result },
            }
        });
    }

    /// Looks up the bounds of `partition`, out of range at `position`.
    pub(super) fn bounds(&mut self, template: &ConsumerClient, topic: &str, partition: i32, position: i64) {
        let mut client = self.client(template);
        let topic = topic.to_string();
        self.tasks.spawn(async move {
            let result = async {
                let start = offset_at(&mut client, &topic, partition, OffsetSpec::Earliest).await?;
                let end = offset_at(&mut client, &topic, partition, OffsetSpec::Latest).await?;
                let stable = offset_at(&mut client, &topic, partition, OffsetSpec::LastStable).await?;
                Ok(Bounds { start, end, stable })
            }
            .await;
            Done {
                client,
                answer: Answer::Bounds {
                    partition,
                    position,
                    result,
                },
            }
        });
    }

    /// The next finished task (`None` while none runs; a task that
    /// panicked is `Err` with its description).
    pub(super) async fn next(&mut self) -> Option<Result<Answer, String>> {
        let done = self.tasks.join_next().await?;
        Some(match done {
            Ok(done) => {
                self.idle.push(done.client);
                Ok(done.answer)
            }
            Err(error) => Err(error.to_string()),
        })
    }

    /// Whether no task runs.
    pub(super) fn is_idle(&self) -> bool {
        self.tasks.is_empty()
    }
}
