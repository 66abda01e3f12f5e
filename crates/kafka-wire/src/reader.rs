//! The log-level committed reader: raw batches of every partition, fetched
//! with read_uncommitted, filtered by [`CommittedFilter`].

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use kafka_protocol::ResponseError;
use tracing::debug;

use crate::cluster::{connect_any, metadata};
use crate::config::WireConfig;
use crate::connection::{versions, KafkaConnection};
use crate::error::WireError;
use crate::records::{decode_batches, CommittedFilter, CommittedRead};

/// Fetch versions spoken: v4 added isolation levels and the v2 record
/// format, v12 is the flexible encoding. v13 switched to topic ids.
pub(crate) const FETCH: VersionRange = versions(4, 12);
/// ListOffsets versions spoken: v1 single offsets per timestamp, v2
/// isolation levels, v6 flexible encoding.
const LIST_OFFSETS: VersionRange = versions(1, 10);
/// ListOffsets timestamp asking for the log start offset.
const EARLIEST: i64 = -2;
/// How long the broker may wait for data before answering a Fetch (there
/// always is data below the high watermark being read to).
const FETCH_MAX_WAIT_MS: i32 = 500;
/// Isolation level read_uncommitted: every record up to the high watermark,
/// markers and open transactions included.
const READ_UNCOMMITTED: i8 = 0;
/// Byte limit of one Fetch answer (Kafka's consumer default, 50 MiB); the
/// broker still sends at least one batch when the first one is larger.
const FETCH_MAX_BYTES: i32 = 50 * 1024 * 1024;
/// First byte limit per partition and fetch; doubled after a Fetch that
/// brought no complete batch, up to [`FETCH_MAX_BYTES`].
const PARTITION_BYTES: i32 = 1024 * 1024;
/// Fetch answers in a row that may bring no batch before reading a
/// partition counts as stalled.
const MAX_EMPTY_FETCHES: u32 = 20;

/// A partition being read: the next offset to fetch, where to stop, and
/// what was read so far.
#[derive(Debug)]
struct PartitionState {
    next: i64,
    /// The high watermark of the first Fetch answer.
    end: Option<i64>,
    filter: CommittedFilter,
    max_bytes: i32,
    empty_fetches: u32,
    /// Whether the start was moved to the log start offset already.
    rewound: bool,
}

/// Reads every partition of `topic` from its log start to its high
/// watermark (as the first Fetch answer reports it).
pub(crate) async fn read_topic(config: &WireConfig, topic: &str) -> Result<CommittedRead, WireError> {
    let mut bootstrap = connect_any(config).await?;
    let cluster = metadata(&mut bootstrap, Some(topic)).await?;
    let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for (&partition, &leader) in &cluster.leaders {
        let Some(address) = cluster.broker(leader) else {
            return Err(WireError::Protocol {
                addr: bootstrap.addr().to_string(),
                message: format!("the leader {leader} of {topic}/{partition} is not among the brokers in Metadata"),
            });
        };
        by_leader.entry(address.to_string()).or_default().push(partition);
    }
    let mut read = CommittedRead::default();
    let mut bootstrap = Some(bootstrap);
    for (address, partitions) in by_leader {
        let mut leader = match bootstrap.take() {
            Some(connection) if connection.addr() == address => connection,
            other => {
                bootstrap = other;
                KafkaConnection::connect_with(&address, &config.options).await?
            }
        };
        for (partition, state) in read_partitions(&mut leader, topic, &partitions).await? {
            let partition_read = state.filter.finish();
            debug!(
                topic,
                partition,
                end = state.next,
                visible = partition_read.records.len(),
                open = partition_read.open_transactions.len(),
                aborted = partition_read.aborted_records,
                "partition read"
            );
            read.merge(partition_read);
        }
    }
    Ok(read)
}

/// Reads `partitions` of `topic`, all led by `leader`, from offset 0 (or
/// the log start offset, when the log no longer begins at 0) up to the high
/// watermark that the first Fetch answer reports.
async fn read_partitions(
    leader: &mut KafkaConnection,
    topic: &str,
    partitions: &[i32],
) -> Result<BTreeMap<i32, PartitionState>, WireError> {
    let mut states: BTreeMap<i32, PartitionState> = partitions
        .iter()
        .map(|&partition| {
            let state = PartitionState {
                next: 0,
                end: None,
                filter: CommittedFilter::new(topic, partition),
                max_bytes: PARTITION_BYTES,
                empty_fetches: 0,
                rewound: false,
            };
            (partition, state)
        })
        .collect();
    let version = leader.version(ApiKey::Fetch, FETCH)?;
    loop {
        let wanted: Vec<FetchPartition> = states
            .iter()
            .filter(|(_, state)| state.end.is_none_or(|end| state.next < end))
            .map(|(&partition, state)| {
                FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(state.next)
                    .with_partition_max_bytes(state.max_bytes)
                    .with_current_leader_epoch(-1)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
            })
            .collect();
        if wanted.is_empty() {
            return Ok(states);
        }
        let wanted_partitions = wanted.iter().map(|p| p.partition).collect();
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(FETCH_MAX_WAIT_MS)
            .with_min_bytes(1)
            .with_max_bytes(FETCH_MAX_BYTES)
            .with_isolation_level(READ_UNCOMMITTED)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(wanted)]);
        let response = leader.request(version, &request).await?;
        WireError::check(leader.addr(), ApiKey::Fetch, response.error_code, None)?;
        let answered = response.responses.into_iter().filter(|t| t.topic.0.as_str() == topic);
        let mut unanswered: BTreeSet<i32> = wanted_partitions;
        for data in answered.flat_map(|t| t.partitions) {
            let partition = data.partition_index;
            let Some(state) = states.get_mut(&partition) else {
                continue;
            };
            unanswered.remove(&partition);
            if data.error_code == ResponseError::OffsetOutOfRange.code() && !state.rewound {
                // The log no longer starts at 0: continue from its start.
                state.rewound = true;
                let start = list_offsets(leader, topic, partition, EARLIEST).await?;
                if start > state.next {
                    state.next = start;
                    continue;
                }
            }
            let context = format!("{topic}/{partition} at offset {}", state.next);
            WireError::check(leader.addr(), ApiKey::Fetch, data.error_code, Some(&context))?;
            let end = *state.end.get_or_insert(data.high_watermark);
            let mut raw = data.records.unwrap_or_default();
            let batches = decode_batches(&mut raw).map_err(|message| WireError::Protocol {
                addr: leader.addr().to_string(),
                message,
            })?;
            let before = state.next;
            for batch in batches {
                if batch.last_offset < state.next || batch.base_offset >= end {
                    continue;
                }
                state.next = batch.last_offset + 1;
                state.filter.push(batch);
            }
            if state.next == before && state.next < end {
                stalled(leader.addr(), topic, partition, state)?;
            } else {
                state.empty_fetches = 0;
            }
        }
        for partition in unanswered {
            let state = states.get_mut(&partition).expect("asked for known partitions only");
            stalled(leader.addr(), topic, partition, state)?;
        }
    }
}

/// Notes a Fetch that brought nothing for a partition below its end (or no
/// answer for it at all): the next Fetch allows more bytes; too many in a
/// row are an error.
fn stalled(addr: &str, topic: &str, partition: i32, state: &mut PartitionState) -> Result<(), WireError> {
    state.empty_fetches += 1;
    state.max_bytes = state.max_bytes.saturating_mul(2).min(FETCH_MAX_BYTES);
    if state.empty_fetches < MAX_EMPTY_FETCHES {
        return Ok(());
    }
    Err(WireError::Stalled {
        addr: addr.to_string(),
        topic: topic.to_string(),
        partition,
        offset: state.next,
        high_watermark: state.end,
    })
}

/// The offset at `timestamp` (e.g. EARLIEST) of `topic`/`partition`.
async fn list_offsets(
    leader: &mut KafkaConnection,
    topic: &str,
    partition: i32,
    timestamp: i64,
) -> Result<i64, WireError> {
    let wanted = ListOffsetsPartition::default()
        .with_partition_index(partition)
        .with_timestamp(timestamp)
        .with_current_leader_epoch(-1);
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(READ_UNCOMMITTED)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![wanted])]);
    let (_, response) = leader.negotiated_request(LIST_OFFSETS, &request).await?;
    let answer = response
        .topics
        .into_iter()
        .filter(|t| t.name.0.as_str() == topic)
        .flat_map(|t| t.partitions)
        .find(|p| p.partition_index == partition);
    let Some(answer) = answer else {
        return Err(WireError::Protocol {
            addr: leader.addr().to_string(),
            message: format!("ListOffsets answer does not mention {topic}/{partition}"),
        });
    };
    let context = format!("{topic}/{partition}");
    WireError::check(leader.addr(), ApiKey::ListOffsets, answer.error_code, Some(&context))?;
    Ok(answer.offset)
}

fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}
