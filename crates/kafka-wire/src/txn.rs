//! Finishing a transaction that its producer can no longer finish: EndTxn
//! sent directly to the transaction coordinator; and which producer (id and
//! epoch) wrote a transaction's records, read from their batch.

use std::fmt;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, EndTxnRequest, FetchRequest, ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use kafka_protocol::ResponseError;
use tracing::{debug, info};

use crate::batch::{take_batch, BatchHeader};
use crate::connection::{versions, KafkaConnection};
use crate::error::WireError;
use crate::reader::FETCH;

/// EndTxn versions spoken. v3 is the flexible encoding, v4 may answer
/// TRANSACTION_ABORTABLE. v5 is left out on purpose: it switches the
/// coordinator to transactions version 2 (KIP-890, an epoch bump after
/// every transaction), which the librdkafka producer that began the
/// transaction does not use.
pub(crate) const END_TXN: VersionRange = versions(0, 4);

/// How the coordinator answered an EndTxn (commit or abort) request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndTxnOutcome {
    /// The transaction is committed (or aborted) — also the answer when it
    /// already was, with the same producer id and epoch.
    Ok,
    /// INVALID_TXN_STATE: no transaction is open for this producer (none was
    /// begun, or it was already ended the other way).
    InvalidTxnState,
    /// PRODUCER_FENCED or INVALID_PRODUCER_EPOCH: the epoch is stale. A newer
    /// producer initialised the transactional id, or the coordinator aborted
    /// the transaction on timeout (which bumps the epoch).
    ProducerFenced(ResponseError),
    /// INVALID_PRODUCER_ID_MAPPING: the transactional id maps to another
    /// producer id, or to none (expired).
    InvalidProducerIdMapping,
    /// CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR
    /// or COORDINATOR_NOT_AVAILABLE: call again after a short pause.
    Retriable(ResponseError),
    /// Any other error code.
    Other(i16),
}

impl EndTxnOutcome {
    /// Maps an EndTxn (or FindCoordinator) error code.
    pub fn from_code(code: i16) -> EndTxnOutcome {
        match ResponseError::try_from_code(code) {
            None => EndTxnOutcome::Ok,
            Some(ResponseError::InvalidTxnState) => EndTxnOutcome::InvalidTxnState,
            Some(error @ (ResponseError::ProducerFenced | ResponseError::InvalidProducerEpoch)) => {
                EndTxnOutcome::ProducerFenced(error)
            }
            Some(ResponseError::InvalidProducerIdMapping) => EndTxnOutcome::InvalidProducerIdMapping,
            Some(
                error @ (ResponseError::ConcurrentTransactions
                | ResponseError::CoordinatorLoadInProgress
                | ResponseError::NotCoordinator
                | ResponseError::CoordinatorNotAvailable),
            ) => EndTxnOutcome::Retriable(error),
            Some(error) => EndTxnOutcome::Other(error.code()),
        }
    }

    /// The Kafka error code (0 for [`Ok`](Self::Ok)).
    pub fn code(&self) -> i16 {
        match self {
            EndTxnOutcome::Ok => 0,
            EndTxnOutcome::InvalidTxnState => ResponseError::InvalidTxnState.code(),
            EndTxnOutcome::ProducerFenced(error) | EndTxnOutcome::Retriable(error) => error.code(),
            EndTxnOutcome::InvalidProducerIdMapping => ResponseError::InvalidProducerIdMapping.code(),
            EndTxnOutcome::Other(code) => *code,
        }
    }

    /// Whether the same call may succeed later.
    pub fn is_retriable(&self) -> bool {
        matches!(self, EndTxnOutcome::Retriable(_))
    }
}

impl fmt::Display for EndTxnOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match ResponseError::try_from_code(self.code()) {
            None => f.write_str("Ok"),
            Some(error) => write!(f, "{error} (error code {})", self.code()),
        }
    }
}

/// Sends EndTxn on `coordinator` (a connection to the transaction
/// coordinator of `transactional_id`).
pub(crate) async fn end_txn_on(
    coordinator: &mut KafkaConnection,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
) -> Result<EndTxnOutcome, WireError> {
    let request = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_string(transactional_id.to_string())))
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(producer_epoch)
        .with_committed(commit);
    let (version, response) = coordinator.negotiated_request(END_TXN, &request).await?;
    let outcome = EndTxnOutcome::from_code(response.error_code);
    info!(
        coordinator = %coordinator.addr(),
        transactional_id,
        producer_id,
        producer_epoch,
        commit,
        version,
        %outcome,
        "EndTxn"
    );
    Ok(outcome)
}

/// Who wrote a record batch, from its header: the producer id and epoch a
/// transaction's records carry are the ones EndTxn must name to end it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchWriter {
    /// Offset of the batch's first record.
    pub base_offset: i64,
    /// Offset of its last record as written.
    pub last_offset: i64,
    /// The producer id (-1: neither idempotent nor transactional).
    pub producer_id: i64,
    /// The producer epoch.
    pub producer_epoch: i16,
    /// Whether the batch belongs to a transaction.
    pub transactional: bool,
}

/// Byte limit of the Fetch that reads one batch: the broker sends the
/// first batch whole even when it is larger.
const BATCH_FETCH_BYTES: i32 = 64 * 1024;

/// The header of the batch holding `offset` of `topic`/`partition`, read
/// with one read_uncommitted Fetch from `leader` (the partition's leader).
/// `None` when the answer holds no batch covering `offset` (it is at or
/// past the high watermark, or below the log start).
pub(crate) async fn batch_writer_on(
    leader: &mut KafkaConnection,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<Option<BatchWriter>, WireError> {
    let version = leader.version(ApiKey::Fetch, FETCH)?;
    let wanted = FetchPartition::default()
        .with_partition(partition)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(BATCH_FETCH_BYTES)
        .with_current_leader_epoch(-1)
        .with_last_fetched_epoch(-1)
        .with_log_start_offset(-1);
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(BATCH_FETCH_BYTES)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![wanted])]);
    let response = leader.request(version, &request).await?;
    WireError::check(leader.addr(), ApiKey::Fetch, response.error_code, None)?;
    let answer = response
        .responses
        .into_iter()
        .filter(|t| t.topic.0.as_str() == topic)
        .flat_map(|t| t.partitions)
        .find(|p| p.partition_index == partition);
    let Some(answer) = answer else {
        return Err(WireError::Protocol {
            addr: leader.addr().to_string(),
            message: format!("the Fetch answer does not mention {topic}/{partition}"),
        });
    };
    let context = format!("{topic}/{partition} at offset {offset}");
    WireError::check(leader.addr(), ApiKey::Fetch, answer.error_code, Some(&context))?;
    let mut raw = answer.records.unwrap_or_default();
    let protocol = |message: String| WireError::Protocol {
        addr: leader.addr().to_string(),
        message: format!("{context}: {message}"),
    };
    while let Some(batch) = take_batch(&mut raw).map_err(protocol)? {
        let header = BatchHeader::read(&batch).map_err(protocol)?;
        if header.base_offset <= offset && offset <= header.last_offset {
            let writer = BatchWriter {
                base_offset: header.base_offset,
                last_offset: header.last_offset,
                producer_id: header.producer_id,
                producer_epoch: header.producer_epoch,
                transactional: header.transactional,
            };
            debug!(topic, partition, offset, ?writer, "batch writer");
            return Ok(Some(writer));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_error_codes() {
        let cases = [
            (0, EndTxnOutcome::Ok),
            (48, EndTxnOutcome::InvalidTxnState),
            (90, EndTxnOutcome::ProducerFenced(ResponseError::ProducerFenced)),
            (47, EndTxnOutcome::ProducerFenced(ResponseError::InvalidProducerEpoch)),
            (49, EndTxnOutcome::InvalidProducerIdMapping),
            (51, EndTxnOutcome::Retriable(ResponseError::ConcurrentTransactions)),
            (14, EndTxnOutcome::Retriable(ResponseError::CoordinatorLoadInProgress)),
            (15, EndTxnOutcome::Retriable(ResponseError::CoordinatorNotAvailable)),
            (16, EndTxnOutcome::Retriable(ResponseError::NotCoordinator)),
            (53, EndTxnOutcome::Other(53)),
            (-1, EndTxnOutcome::Other(-1)),
            (9999, EndTxnOutcome::Other(9999)),
        ];
        for (code, outcome) in cases {
            assert_eq!(EndTxnOutcome::from_code(code), outcome, "code {code}");
            assert_eq!(outcome.code(), code);
            assert_eq!(outcome.is_retriable(), matches!(outcome, EndTxnOutcome::Retriable(_)));
        }
        assert_eq!(
            EndTxnOutcome::ProducerFenced(ResponseError::ProducerFenced).to_string(),
            "ProducerFenced (error code 90)"
        );
        assert_eq!(EndTxnOutcome::Ok.to_string(), "Ok");
    }
}
