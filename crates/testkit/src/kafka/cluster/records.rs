//! A few records written to and read from a partition's leader, and its
//! end offset: enough for a test to set a partition up (records acknowledged
//! by one broker only, before an unclean election) and to check what a log
//! holds afterwards. Tests of a client use that client.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{BrokerId, FetchRequest, ListOffsetsRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kafka_protocol::ResponseError;

use super::topics::missing;
use super::{kafka_error, KafkaCluster, Step, Versioned};
use crate::error::Result;
use crate::kafka::wire::{Connection, KafkaRequestError};

/// ListOffsets' timestamp asking for the end of the log (the high
/// watermark under READ_UNCOMMITTED).
const LATEST: i64 = -1;
/// Bound on what one fetch returns per partition.
const FETCH_MAX_BYTES: i32 = 8 << 20;
/// The size of a record batch's offset and length fields.
const BATCH_HEADER: usize = 12;

impl Versioned for ProduceRequest {
    const VERSION: i16 = 9;
}

impl Versioned for ListOffsetsRequest {
    const VERSION: i16 = 7;
}

impl Versioned for FetchRequest {
    // The last version that names topics (13 and later name topic ids).
    const VERSION: i16 = 12;
}

/// Which replicas must have a record before the leader acknowledges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acks {
    /// The leader alone (`acks=1`).
    Leader,
    /// Every in-sync replica, at least `min.insync.replicas` of them
    /// (`acks=all`).
    All,
}

/// A record read back by [`KafkaCluster::read`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedRecord {
    /// Its offset.
    pub offset: i64,
    /// The leader epoch of its batch (the epoch of the leader that wrote
    /// it).
    pub leader_epoch: i32,
    /// Its key.
    pub key: Option<Bytes>,
    /// Its value (`None`: a tombstone).
    pub value: Option<Bytes>,
}

impl KafkaCluster {
    /// Writes `values` (without keys, in one batch) to a partition's
    /// leader and returns the offset of the first once acknowledged as
    /// `acks` asks. While the partition has no leader that runs, or its
    /// leader moved, or too few replicas are in sync for `acks=all`, it
    /// tries again (the broker wrote nothing then). A connection lost after
    /// sending is an error: the records may or may not be in the log.
    pub fn produce(&self, topic: &str, partition: i32, values: &[&[u8]], acks: Acks) -> Result<i64> {
        let action = format!("writing {} records to {topic}/{partition}", values.len());
        let batch = encode_batch(values).map_err(|err| kafka_error(&action, err))?;
        let request = ProduceRequest::default()
            .with_acks(match acks {
                Acks::Leader => 1,
                Acks::All => -1,
            })
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(batch))])]);
        self.on_leader(&action, topic, partition, false, |connection| {
            let response = connection.send(ProduceRequest::VERSION, &request)?;
            let result = response
                .responses
                .first()
                .and_then(|topic| topic.partition_responses.first())
                .ok_or_else(|| missing("the partition's result"))?;
            match KafkaRequestError::from_code(result.error_code, result.error_message.as_ref()) {
                None => Ok(result.base_offset),
                Some(err) => Err(err),
            }
        })
    }

    /// The partition's end offset as its leader tells (ListOffsets, latest,
    /// read uncommitted): the high watermark, the offset the next record a
    /// consumer can read gets.
    pub fn end_offset(&self, topic: &str, partition: i32) -> Result<i64> {
        let action = format!("reading the end offset of {topic}/{partition}");
        let request = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_current_leader_epoch(-1)
                    .with_timestamp(LATEST)])]);
        self.on_leader(&action, topic, partition, true, |connection| {
            let response = connection.send(ListOffsetsRequest::VERSION, &request)?;
            let result = response
                .topics
                .first()
                .and_then(|topic| topic.partitions.first())
                .ok_or_else(|| missing("the partition's result"))?;
            match KafkaRequestError::from_code(result.error_code, None) {
                None => Ok(result.offset),
                Some(err) => Err(err),
            }
        })
    }

    /// Waits until the partition's end offset ([`end_offset`](Self::end_offset))
    /// is at least `offset`, and returns it: a leader just elected learns
    /// its high watermark from its followers' next fetches.
    pub fn wait_for_end_offset(&self, topic: &str, partition: i32, offset: i64) -> Result<i64> {
        self.wait_until(
            &format!("end offset of {topic}/{partition} at {offset} or more"),
            |cluster| {
                let end = cluster.end_offset(topic, partition)?;
                Ok(if end >= offset {
                    Step::Done(end)
                } else {
                    Step::NotYet(format!("end offset {end}"))
                })
            },
        )
    }

    /// Every record of the partition from offset `from` up to its high
    /// watermark when asked, read from its leader (read uncommitted;
    /// transaction markers left out).
    pub fn read(&self, topic: &str, partition: i32, from: i64) -> Result<Vec<FetchedRecord>> {
        let action = format!("reading {topic}/{partition} from offset {from}");
        let mut records = Vec::new();
        let mut next = from;
        loop {
            let request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(0)
                .with_min_bytes(0)
                .with_max_bytes(FETCH_MAX_BYTES)
                .with_session_epoch(-1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(topic_name(topic))
                    .with_partitions(vec![FetchPartition::default()
                        .with_partition(partition)
                        .with_current_leader_epoch(-1)
                        .with_fetch_offset(next)
                        .with_last_fetched_epoch(-1)
                        .with_log_start_offset(-1)
                        .with_partition_max_bytes(FETCH_MAX_BYTES)])]);
            let (high_watermark, batches) = self.on_leader(&action, topic, partition, true, |connection| {
                let response = connection.send(FetchRequest::VERSION, &request)?;
                if let Some(err) = KafkaRequestError::from_code(response.error_code, None) {
                    return Err(err);
                }
                let result = response
                    .responses
                    .first()
                    .and_then(|topic| topic.partitions.first())
                    .ok_or_else(|| missing("the partition's result"))?;
                match KafkaRequestError::from_code(result.error_code, None) {
                    None => Ok((result.high_watermark, result.records.clone().unwrap_or_default())),
                    Some(err) => Err(err),
                }
            })?;
            let fetched = decode_batches(batches).map_err(|err| kafka_error(&action, err))?;
            let before = next;
            for record in fetched {
                next = next.max(record.offset + 1);
                if record.offset >= from && record.offset < high_watermark && !record.control {
                    records.push(FetchedRecord {
                        offset: record.offset,
                        leader_epoch: record.partition_leader_epoch,
                        key: record.key,
                        value: record.value,
                    });
                }
            }
            if next >= high_watermark {
                return Ok(records);
            }
            if next == before {
                return Err(kafka_error(
                    &action,
                    missing(&format!(
                        "records between {next} and the high watermark {high_watermark}"
                    )),
                ));
            }
        }
    }

    /// Runs `request` on a connection to the partition's leader (as the
    /// first broker that answers names it), trying again while the
    /// partition has no leader that answers or the leader answers with an
    /// error that means the request did nothing (moved leadership, too few
    /// in-sync replicas, ...); and, when `reads_only`, after a lost
    /// connection too.
    fn on_leader<T>(
        &self,
        action: &str,
        topic: &str,
        partition: i32,
        reads_only: bool,
        mut request: impl FnMut(&mut Connection) -> Result<T, KafkaRequestError>,
    ) -> Result<T> {
        self.wait_until(action, |cluster| {
            let leader = match cluster.topic(topic) {
                Ok(state) => state.partitions.get(&partition).and_then(|p| p.leader),
                Err(err) => return Ok(Step::NotYet(err.to_string())),
            };
            let Some((leader, port)) = leader.and_then(|id| Some((id, cluster.answering_port(id)?))) else {
                return Ok(Step::NotYet(format!(
                    "partition {partition} has no leader that answers ({leader:?})"
                )));
            };
            let mut connection = match Connection::open(port, super::REQUEST_TIMEOUT) {
                Ok(connection) => connection,
                Err(err) => return Ok(Step::NotYet(format!("leader {leader}: {err}"))),
            };
            match request(&mut connection) {
                Ok(value) => Ok(Step::Done(value)),
                Err(err) if did_nothing(&err) || (reads_only && err.is_retriable()) => {
                    Ok(Step::NotYet(format!("leader {leader}: {err}")))
                }
                Err(err) => Err(kafka_error(action, err)),
            }
        })
    }
}

/// Whether a leader's error says it did nothing, so that asking again
/// (after a Metadata refresh) is safe.
fn did_nothing(err: &KafkaRequestError) -> bool {
    matches!(
        err.response_error(),
        Some(
            ResponseError::UnknownTopicOrPartition
                | ResponseError::LeaderNotAvailable
                | ResponseError::NotLeaderOrFollower
                | ResponseError::NotEnoughReplicas
                | ResponseError::FencedLeaderEpoch
                | ResponseError::UnknownLeaderEpoch
                | ResponseError::OffsetNotAvailable
        )
    )
}

/// One record batch (magic 2, uncompressed) of `values`.
fn encode_batch(values: &[&[u8]]) -> Result<Bytes, KafkaRequestError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, value)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i64::try_from(i).unwrap_or(i64::MAX),
            // kafka-protocol keeps records in one batch while offset minus
            // sequence stays the same, and writes the first record's
            // sequence as the batch's: -1 (none, as a producer without
            // idempotence sends), with one batch per request as Kafka wants.
            sequence: i32::try_from(i).unwrap_or(i32::MAX) - 1,
            timestamp: now,
            key: None,
            value: Some(Bytes::copy_from_slice(value)),
            headers: IndexMap::new(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|err| KafkaRequestError::Codec {
        what: "encode the records of",
        api_key: <ProduceRequest as kafka_protocol::protocol::Request>::KEY,
        version: ProduceRequest::VERSION,
        source: err.into(),
    })?;
    Ok(buf.freeze())
}

/// The records of the whole batches in `bytes` (a fetch may end with part
/// of a batch, left for the next fetch).
fn decode_batches(mut bytes: Bytes) -> Result<Vec<Record>, KafkaRequestError> {
    let mut whole = 0;
    while bytes.len() - whole >= BATCH_HEADER {
        let length = (&bytes[whole + 8..whole + BATCH_HEADER]).get_i32();
        let Some(size) = usize::try_from(length).ok().map(|l| l + BATCH_HEADER) else {
            break;
        };
        if bytes.len() - whole < size {
            break;
        }
        whole += size;
    }
    let mut whole = bytes.split_to(whole);
    let mut records = Vec::new();
    while whole.has_remaining() {
        let set = RecordBatchDecoder::decode(&mut whole).map_err(|err| KafkaRequestError::Codec {
            what: "decode the records of",
            api_key: <FetchRequest as kafka_protocol::protocol::Request>::KEY,
            version: FetchRequest::VERSION,
            source: err.into(),
        })?;
        records.extend(set.records);
    }
    Ok(records)
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_out_in_one_batch() {
        let batch = encode_batch(&[b"a", b"b", b"c"]).unwrap();
        let info = RecordBatchDecoder::decode_batch_info(&mut batch.clone()).unwrap();
        assert_eq!(info.len(), 1, "{info:?}");
        assert_eq!(
            (info[0].record_count, info[0].min_offset, info[0].base_sequence),
            (3, 0, -1)
        );
    }

    #[test]
    fn whole_batches_decode_and_a_partial_last_one_waits() {
        let first = encode_batch(&[b"a", b"b"]).unwrap();
        let second = encode_batch(&[b"c"]).unwrap();
        let mut bytes = BytesMut::new();
        bytes.extend_from_slice(&first);
        bytes.extend_from_slice(&second[..second.len() - 3]);
        let records = decode_batches(bytes.freeze()).unwrap();
        let values: Vec<_> = records.iter().map(|r| r.value.clone().unwrap()).collect();
        assert_eq!(records[0].sequence, -1, "no producer sequence");
        assert_eq!(values, vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        assert_eq!(records[1].offset, 1);
        assert!(decode_batches(Bytes::new()).unwrap().is_empty());
    }

    #[test]
    fn only_errors_that_wrote_nothing_are_tried_again() {
        let code = |code| KafkaRequestError::from_code(code, None).unwrap();
        assert!(did_nothing(&code(6)), "NOT_LEADER_OR_FOLLOWER");
        assert!(did_nothing(&code(19)), "NOT_ENOUGH_REPLICAS");
        assert!(!did_nothing(&code(20)), "NOT_ENOUGH_REPLICAS_AFTER_APPEND wrote");
        assert!(!did_nothing(&code(7)), "REQUEST_TIMED_OUT may have written");
    }
}
