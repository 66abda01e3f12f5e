//! What a librdkafka that speaks Kafka transactions v2 (KIP-890) would do to
//! the Kafka sink, shown on Apache Kafka with the protocol itself: a client
//! that produces with Produce v12 (the partition joins the transaction on
//! the broker's side) and commits with EndTxn v5 gets its epoch bumped at
//! every commit, and the epoch a checkpoint recorded at pre-commit no
//! longer names the producer. The sink's EndTxn recovery — which commits a
//! checkpoint's transactions again after a crash, "already committed"
//! being success — is then refused: a committed checkpoint reported as
//! lost. librdkafka 2.12 (rdkafka 0.39) speaks EndTxn v0-1 and Produce up
//! to v10, so it never does this; the sink refuses a newer librdkafka
//! against brokers that enable transactions v2 (see `src/sink/epoch.rs`).
//!
//! The broker is the one exactly-testkit shares among the tests of this
//! binary (this file is its own binary: the test may raise the cluster's
//! `transaction.version` feature, which no other test here depends on), or
//! the Kafka of `EXACTLY_KAFKA_BOOTSTRAP`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use exactly_kafka::admin::KafkaAdmin;
use exactly_kafka::wire::kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use exactly_kafka::wire::kafka_protocol::messages::update_features_request::FeatureUpdateKey;
use exactly_kafka::wire::kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, EndTxnRequest, InitProducerIdRequest, ProduceRequest, ProducerId, TopicName,
    TransactionalId, UpdateFeaturesRequest,
};
use exactly_kafka::wire::kafka_protocol::protocol::{StrBytes, VersionRange};
use exactly_kafka::wire::kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use exactly_kafka::wire::kafka_protocol::ResponseError;
use exactly_kafka::wire::{EndTxnOutcome, KafkaConnection, WireClient};
use exactly_testkit::KafkaBroker;

const FEATURE: &str = "transaction.version";

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("exactly_kafka=debug,exactly_kafka_wire=info")
        .try_init();
}

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// The finalized level of `transaction.version` a broker reports.
async fn finalized_transaction_version(connection: &mut KafkaConnection) -> Option<i16> {
    let request = ApiVersionsRequest::default()
        .with_client_software_name(text("exactly-test"))
        .with_client_software_version(text("0"));
    let response = connection.request(3, &request).await.expect("ApiVersions v3");
    response
        .finalized_features
        .iter()
        .find(|f| f.name.as_str() == FEATURE)
        .map(|f| f.max_version_level)
}

/// Transactions v2 on the cluster: raised with UpdateFeatures when it is
/// not finalized at level 2 yet (Apache Kafka 4.x formats new clusters
/// with it), then waited for.
async fn transactions_v2_enabled(bootstrap: &str) {
    let client = WireClient::new(bootstrap).unwrap();
    let mut connection = client.connect().await.expect("connect");
    let level = finalized_transaction_version(&mut connection).await;
    println!("finalized {FEATURE} before the test: {level:?}");
    if level >= Some(2) {
        return;
    }
    let update = FeatureUpdateKey::default()
        .with_feature(text(FEATURE))
        .with_max_version_level(2)
        .with_upgrade_type(1);
    let request = UpdateFeaturesRequest::default()
        .with_timeout_ms(30_000)
        .with_feature_updates(vec![update]);
    let version = connection
        .version(ApiKey::UpdateFeatures, VersionRange { min: 1, max: 1 })
        .unwrap_or(1);
    let response = connection.request(version, &request).await.expect("UpdateFeatures");
    assert_eq!(response.error_code, 0, "UpdateFeatures: {:?}", response.error_message);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut fresh = client.connect().await.expect("connect");
        if finalized_transaction_version(&mut fresh).await >= Some(2) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{FEATURE} never reached level 2");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A transactional producer speaking the protocol itself, on the
/// coordinator (the test's single broker leads every partition too).
struct Producer {
    connection: KafkaConnection,
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
    sequence: i32,
}

impl Producer {
    /// InitProducerId for a new transactional id.
    async fn init(bootstrap: &str, transactional_id: &str) -> Producer {
        let client = WireClient::new(bootstrap).unwrap();
        let coordinator = client
            .find_transaction_coordinator(transactional_id)
            .await
            .expect("FindCoordinator");
        let mut connection = KafkaConnection::connect(&coordinator).await.expect("connect");
        let request = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(text(transactional_id))))
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let version = connection
            .version(ApiKey::InitProducerId, VersionRange { min: 0, max: 5 })
            .expect("InitProducerId");
        let response = loop {
            let response = connection.request(version, &request).await.expect("InitProducerId");
            // A fresh coordinator may still load the transaction log.
            if ResponseError::try_from_code(response.error_code).is_none_or(|e| !e.is_retriable()) {
                break response;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(response.error_code, 0, "InitProducerId");
        Producer {
            connection,
            transactional_id: transactional_id.to_string(),
            producer_id: response.producer_id.0,
            epoch: response.producer_epoch,
            sequence: 0,
        }
    }

    /// Produce v12 of `values` to partition 0 of `topic` in the current
    /// transaction, without AddPartitionsToTxn: with transactions v2 the
    /// partition leader adds the partition to the transaction itself.
    async fn produce(&mut self, topic: &str, values: &[&str]) -> i16 {
        let records: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, value)| Record {
                transactional: true,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: self.producer_id,
                producer_epoch: self.epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: self.sequence + i as i32,
                timestamp: 0,
                key: None,
                value: Some(Bytes::copy_from_slice(value.as_bytes())),
                headers: Default::default(),
            })
            .collect();
        self.sequence += values.len() as i32;
        let mut batch = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut batch, &records, &options).expect("encode the batch");
        let request = ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(text(&self.transactional_id))))
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(text(topic)))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(batch.freeze()))])]);
        let response = self.connection.request(12, &request).await.expect("Produce v12");
        response.responses[0].partition_responses[0].error_code
    }

    /// EndTxn at `version` as `epoch`; the answer's error code and epoch.
    async fn end_txn(&mut self, version: i16, epoch: i16, commit: bool) -> (i16, i16) {
        let request = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(text(&self.transactional_id)))
            .with_producer_id(ProducerId(self.producer_id))
            .with_producer_epoch(epoch)
            .with_committed(commit);
        let response = self.connection.request(version, &request).await.expect("EndTxn");
        (response.error_code, response.producer_epoch)
    }
}

/// A commit with EndTxn v5 bumps the epoch; the sink's recovery, asking
/// EndTxn (v4) to commit the transaction as the epoch recorded at
/// pre-commit, is then refused with PRODUCER_FENCED — which the sink takes
/// for a lost transaction, although its records are committed. The next
/// transaction's records carry the bumped epoch, which is what the sink's
/// per-transaction check reads (a change with no abort in between stops
/// the pipeline). Only a client speaking EndTxn v5 has its retry of the
/// commit recognized, and a transaction not yet committed is still
/// committed by EndTxn v4 as its recorded epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_v2_bump_the_epoch_at_every_commit_and_strand_a_recorded_one() {
    init_tracing();
    let kafka = KafkaBroker::shared().expect("the shared Kafka broker");
    let bootstrap = kafka.bootstrap();
    transactions_v2_enabled(bootstrap).await;
    let topic = unique("txn-v2");
    KafkaAdmin::new(bootstrap)
        .create_topic(&topic, 1)
        .await
        .expect("create topic");
    let wire = WireClient::new(bootstrap).unwrap();

    // A transaction as a transactions-v2 client writes it: Produce v12,
    // no AddPartitionsToTxn.
    let mut producer = Producer::init(bootstrap, &unique("txn-v2-id")).await;
    let (producer_id, recorded) = (producer.producer_id, producer.epoch);
    assert_eq!(producer.produce(&topic, &["a-0", "a-1"]).await, 0, "Produce v12");
    let writer = wire.batch_writer(&topic, 0, 0).await.unwrap().expect("the batch");
    assert_eq!(
        (writer.producer_id, writer.producer_epoch),
        (producer_id, recorded),
        "what a pre-commit records"
    );

    // Its commit, EndTxn v5, bumps the epoch.
    let (code, bumped) = producer.end_txn(5, recorded, true).await;
    assert_eq!(code, 0, "EndTxn v5");
    assert_eq!(bumped, recorded + 1, "transactions v2 bump the epoch at the commit");

    // A crash before the next checkpoint completes: recovery commits the
    // checkpoint's transaction again as the recorded epoch, and is refused.
    let outcome = exactly_kafka::wire::end_txn(bootstrap, &producer.transactional_id, producer_id, recorded, true)
        .await
        .expect("EndTxn as the sink's recovery sends it");
    assert!(
        matches!(outcome, EndTxnOutcome::ProducerFenced(_)),
        "the sink would report this committed transaction as lost; the broker answered {outcome}"
    );
    let read = wire.read_topic_settled(&topic, Duration::from_secs(30)).await.unwrap();
    let values: Vec<String> = read
        .records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect();
    assert_eq!(values, ["a-0", "a-1"], "yet its records are committed");

    // Only a client speaking EndTxn v5 has its retry as the old epoch
    // recognized (after CONCURRENT_TRANSACTIONS while the markers go out).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (code, epoch) = loop {
        let (code, epoch) = producer.end_txn(5, recorded, true).await;
        if code != ResponseError::ConcurrentTransactions.code() || std::time::Instant::now() > deadline {
            break (code, epoch);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((code, epoch), (0, bumped), "a v5 retry of the commit");

    // The producer's next transaction carries the bumped epoch in its
    // records: what the sink's check sees as an epoch changed at a commit.
    producer.epoch = bumped;
    producer.sequence = 0;
    assert_eq!(
        producer.produce(&topic, &["b-0"]).await,
        0,
        "Produce v12 at the bumped epoch"
    );
    let writer = wire.batch_writer(&topic, 0, 3).await.unwrap().expect("the batch");
    assert_eq!((writer.producer_id, writer.producer_epoch), (producer_id, bumped));
    let (code, _) = producer.end_txn(5, bumped, false).await;
    assert_eq!(code, 0, "aborting it");

    // A transactions-v2 transaction not committed yet is still committed
    // by the sink's EndTxn as its recorded epoch.
    let mut pending = Producer::init(bootstrap, &unique("txn-v2-pending")).await;
    assert_eq!(pending.produce(&topic, &["c-0"]).await, 0, "Produce v12");
    let outcome = exactly_kafka::wire::end_txn(
        bootstrap,
        &pending.transactional_id,
        pending.producer_id,
        pending.epoch,
        true,
    )
    .await
    .expect("EndTxn as the sink's recovery sends it");
    assert_eq!(outcome, EndTxnOutcome::Ok);
    let read = wire.read_topic_settled(&topic, Duration::from_secs(30)).await.unwrap();
    let values: Vec<String> = read
        .records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect();
    assert_eq!(values, ["a-0", "a-1", "c-0"]);
    assert!(read.open_transactions.is_empty(), "{:?}", read.open_transactions);
}
