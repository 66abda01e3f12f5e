//! [`ConsumerClient`] against Apache Kafka: the broker exactly-testkit
//! shares among the tests of this binary (or the Kafka named by
//! `EXACTLY_KAFKA_BOOTSTRAP`), and one broker of its own for a fresh
//! cluster, a frozen broker and a restart. Topics are created, records
//! produced and offsets cross-checked with librdkafka (rdkafka).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{admin, delete_records_below, fresh, kafka, new_topic, producer, send, TXN_TIMEOUT};
use exactly_kafka_wire::kafka_protocol::ResponseError;
use exactly_kafka_wire::{ConsumerClient, OffsetSpec, WireConfig, WireError};
use exactly_testkit::KafkaBroker;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// Limit for librdkafka's blocking calls.
const RDKAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// Records produced per partition by [`produce_timed`].
const RECORDS: i64 = 5;
/// Milliseconds between the timestamps of two records of a partition.
const STEP_MS: i64 = 1_000;

fn client(bootstrap: &str) -> ConsumerClient {
    ConsumerClient::new(WireConfig::new(bootstrap).expect("a bootstrap list"))
}

/// An rdkafka consumer of `group`: what lag tools and librdkafka consumers
/// read committed offsets with.
fn group_consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("an rdkafka consumer")
}

/// Produces [`RECORDS`] records to each of `partitions` of `topic`, record
/// `i` with the timestamp `base + i * STEP_MS`.
fn produce_timed(bootstrap: &str, topic: &str, partitions: i32, base: i64) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("an rdkafka producer");
    for partition in 0..partitions {
        for i in 0..RECORDS {
            let payload = format!("{partition}-{i}");
            let record = BaseRecord::<(), _>::to(topic)
                .partition(partition)
                .payload(&payload)
                .timestamp(base + i * STEP_MS);
            producer.send(record).map_err(|(e, _)| e).expect("enqueue a record");
        }
    }
    producer.flush(RDKAFKA_TIMEOUT).expect("flush");
}

/// `offset` for every partition of `partitions`.
fn each(partitions: &[i32], offset: Option<i64>) -> BTreeMap<i32, Option<i64>> {
    partitions.iter().map(|&p| (p, offset)).collect()
}

/// The committed offsets of `group` for `partitions` of `topic`, as
/// librdkafka's `committed_offsets` reads them (`None` for none).
fn rdkafka_committed(bootstrap: &str, group: &str, topic: &str, partitions: &[i32]) -> BTreeMap<i32, Option<i64>> {
    let mut list = TopicPartitionList::new();
    for &partition in partitions {
        list.add_partition(topic, partition);
    }
    let committed = group_consumer(bootstrap, group)
        .committed_offsets(list, RDKAFKA_TIMEOUT)
        .expect("librdkafka's committed_offsets");
    committed
        .elements()
        .iter()
        .map(|element| match element.offset() {
            Offset::Offset(offset) => (element.partition(), Some(offset)),
            Offset::Invalid => (element.partition(), None),
            other => panic!("{topic}/{}: unexpected committed offset {other:?}", element.partition()),
        })
        .collect()
}

fn expect_broker_error<T: std::fmt::Debug>(result: Result<T, WireError>, expected: ResponseError, mention: &str) {
    match result {
        Err(error @ WireError::Broker { .. }) => {
            assert_eq!(error.broker_error(), Some(expected), "{error}");
            assert!(error.to_string().contains(mention), "`{mention}` missing from: {error}");
        }
        other => panic!("expected {expected:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn topic_metadata_agrees_with_librdkafka() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "wire-meta", 3).await;
    let mut client = client(bootstrap);
    let metadata = client.topic_metadata(&topic).await.expect("Metadata");

    let admin = admin(bootstrap);
    let theirs = admin
        .inner()
        .fetch_metadata(Some(&topic), RDKAFKA_TIMEOUT)
        .expect("librdkafka's Metadata");
    let their_topic = &theirs.topics()[0];
    let their_leaders: BTreeMap<i32, Option<i32>> = their_topic
        .partitions()
        .iter()
        .map(|p| (p.id(), Some(p.leader())))
        .collect();
    let their_brokers: BTreeMap<i32, String> = theirs
        .brokers()
        .iter()
        .map(|b| (b.id(), format!("{}:{}", b.host(), b.port())))
        .collect();
    assert_eq!(metadata.leaders.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(metadata.leaders, their_leaders);
    assert_eq!(metadata.brokers, their_brokers);
    for partition in 0..3 {
        let address = metadata
            .leader_address(partition)
            .expect("every partition has a leader");
        assert!(metadata.brokers.values().any(|b| b == address), "{address}");
    }
    assert_eq!(metadata.leader_address(3), None);
    let cluster_id = admin.inner().fetch_cluster_id(RDKAFKA_TIMEOUT);
    assert!(cluster_id.is_some(), "librdkafka reports a cluster id");
    assert_eq!(metadata.cluster_id, cluster_id);
}

#[tokio::test]
async fn unknown_topics_are_unknown_and_stay_so() {
    let bootstrap = kafka().bootstrap();
    let topic = fresh("wire-never-created");
    let mut client = client(bootstrap);
    let first = client.topic_metadata(&topic).await;
    expect_broker_error(first, ResponseError::UnknownTopicOrPartition, &topic);
    // Not auto-created by the first call (the broker would allow it).
    let second = client.topic_metadata(&topic).await;
    expect_broker_error(second, ResponseError::UnknownTopicOrPartition, &topic);
    let listed = client.list_offsets(&topic, &[0], OffsetSpec::Latest).await;
    expect_broker_error(listed, ResponseError::UnknownTopicOrPartition, &topic);
}

#[tokio::test]
async fn list_offsets_finds_ends_and_times() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "wire-offsets", 2).await;
    let all = [0, 1];
    let mut client = client(bootstrap);

    // An empty partition: both ends 0, no record at any time.
    assert_eq!(
        client.list_offsets(&topic, &all, OffsetSpec::Earliest).await.unwrap(),
        each(&all, Some(0))
    );
    assert_eq!(
        client.list_offsets(&topic, &all, OffsetSpec::Latest).await.unwrap(),
        each(&all, Some(0))
    );
    assert_eq!(
        client
            .list_offsets(&topic, &all, OffsetSpec::Timestamp(0))
            .await
            .unwrap(),
        each(&all, None)
    );

    // A day ago: within any broker's limits for timestamps in the past.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let base = now - 86_400_000;
    produce_timed(bootstrap, &topic, 2, base);
    assert_eq!(
        client.list_offsets(&topic, &all, OffsetSpec::Earliest).await.unwrap(),
        each(&all, Some(0))
    );
    assert_eq!(
        client
            .list_offsets(&topic, &[1, 0, 1], OffsetSpec::Latest)
            .await
            .unwrap(),
        each(&all, Some(RECORDS)),
        "duplicates asked once"
    );
    let at = |ms: i64| OffsetSpec::Timestamp(ms);
    let cases = [
        (at(0), Some(0)),
        (at(base - 1), Some(0)),
        (at(base), Some(0)),
        (at(base + 1), Some(1)),
        (at(base + 2 * STEP_MS), Some(2)),
        (at(base + 2 * STEP_MS + STEP_MS / 2), Some(3)),
        (at(base + (RECORDS - 1) * STEP_MS), Some(RECORDS - 1)),
        (at(base + (RECORDS - 1) * STEP_MS + 1), None),
        (at(now + 86_400_000), None),
    ];
    for (spec, expected) in cases {
        let found = client.list_offsets(&topic, &all, spec).await.unwrap();
        assert_eq!(found, each(&all, expected), "{spec:?} (records from {base})");
    }

    // Earliest is the log start offset, which DeleteRecords moves.
    delete_records_below(bootstrap, &topic, 0, 2).await;
    let earliest = client.list_offsets(&topic, &all, OffsetSpec::Earliest).await.unwrap();
    assert_eq!(earliest, BTreeMap::from([(0, Some(2)), (1, Some(0))]));
    let first = client.list_offsets(&topic, &[0], at(base)).await.unwrap();
    assert_eq!(
        first,
        BTreeMap::from([(0, Some(2))]),
        "deleted records are not found by time"
    );

    let missing = client.list_offsets(&topic, &[0, 7], OffsetSpec::Latest).await;
    expect_broker_error(missing, ResponseError::UnknownTopicOrPartition, &format!("{topic}/7"));
    assert!(client
        .list_offsets(&topic, &[], OffsetSpec::Latest)
        .await
        .unwrap()
        .is_empty());
    let negative = client.list_offsets(&topic, &all, at(-1)).await;
    assert!(matches!(negative, Err(WireError::InvalidConfig { .. })), "{negative:?}");
}

#[tokio::test]
async fn the_last_stable_offset_stops_at_an_open_transaction() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "wire-lso", 1).await;
    let plain: Vec<String> = (0..3).map(|i| format!("plain-{i}")).collect();
    send(&producer(bootstrap, &[]), &topic, 1, &plain);
    let open = producer(bootstrap, &[("transactional.id", &fresh("lso"))]);
    open.init_transactions(TXN_TIMEOUT).unwrap();
    open.begin_transaction().unwrap();
    send(&open, &topic, 1, &["inside".to_string()]);
    let mut client = client(bootstrap);
    let (latest, stable) = (
        client.list_offsets(&topic, &[0], OffsetSpec::Latest).await.unwrap(),
        client.list_offsets(&topic, &[0], OffsetSpec::LastStable).await.unwrap(),
    );
    assert_eq!(
        (latest[&0], stable[&0]),
        (Some(4), Some(3)),
        "the high watermark counts the open transaction's record, the last stable offset stops before it"
    );
    open.commit_transaction(TXN_TIMEOUT).unwrap();
    // The COMMIT marker takes an offset too; both ends meet past it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let latest = client.list_offsets(&topic, &[0], OffsetSpec::Latest).await.unwrap();
        let stable = client.list_offsets(&topic, &[0], OffsetSpec::LastStable).await.unwrap();
        if latest == stable && latest[&0] == Some(5) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ends {latest:?} and {stable:?} never met at 5"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_fresh_group_has_no_committed_offsets() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "wire-fresh-group", 3).await;
    let group = fresh("wire-group");
    let committed = client(bootstrap)
        .committed_offsets(&group, &topic, &[0, 1, 2])
        .await
        .expect("OffsetFetch");
    assert_eq!(committed, each(&[0, 1, 2], None));
    assert_eq!(rdkafka_committed(bootstrap, &group, &topic, &[0, 1, 2]), committed);
}

#[tokio::test]
async fn committed_offsets_are_what_lag_tools_read() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "wire-commit", 3).await;
    let group = fresh("wire-group");
    let all = [0, 1, 2];
    let mut client = client(bootstrap);

    client
        .commit_offsets(&group, &topic, &BTreeMap::from([(0, 3), (1, 5)]))
        .await
        .expect("OffsetCommit");
    let expected = BTreeMap::from([(0, Some(3)), (1, Some(5)), (2, None)]);
    assert_eq!(client.committed_offsets(&group, &topic, &all).await.unwrap(), expected);
    assert_eq!(rdkafka_committed(bootstrap, &group, &topic, &all), expected);

    // A later commit replaces the offsets it names and keeps the others.
    client
        .commit_offsets(&group, &topic, &BTreeMap::from([(0, 40), (2, 1)]))
        .await
        .expect("OffsetCommit");
    let expected = BTreeMap::from([(0, Some(40)), (1, Some(5)), (2, Some(1))]);
    assert_eq!(client.committed_offsets(&group, &topic, &all).await.unwrap(), expected);
    assert_eq!(rdkafka_committed(bootstrap, &group, &topic, &all), expected);

    // And what librdkafka commits, this client reads.
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(&topic, 1, Offset::Offset(9)).unwrap();
    group_consumer(bootstrap, &group)
        .commit(&list, CommitMode::Sync)
        .expect("librdkafka's commit");
    let expected = BTreeMap::from([(0, Some(40)), (1, Some(9)), (2, Some(1))]);
    assert_eq!(client.committed_offsets(&group, &topic, &all).await.unwrap(), expected);

    // Another group sees none of it.
    let other = client
        .committed_offsets(&fresh("wire-group"), &topic, &all)
        .await
        .unwrap();
    assert_eq!(other, each(&all, None));
}

/// A fresh cluster has no `__consumer_offsets` until the first group
/// request: a client that does not wait fails, one that does gets the
/// answer. Then the kept connection breaks twice (a frozen broker, a
/// restarted one): each call on it fails once, retriably, and the next call
/// reconnects.
#[tokio::test]
async fn waits_for_a_fresh_coordinator_and_reconnects_after_failures() {
    let mut broker = KafkaBroker::start().expect("a Kafka broker of this test");
    let bootstrap = broker.bootstrap().to_string();
    let topic = new_topic(&bootstrap, "wire-fresh", 2).await;
    let group = fresh("wire-group");

    let mut impatient = WireConfig::new(&bootstrap).unwrap();
    impatient.coordinator_wait = Duration::ZERO;
    let first = ConsumerClient::new(impatient)
        .committed_offsets(&group, &topic, &[0, 1])
        .await;
    let error = first.expect_err("a fresh cluster has no group coordinator yet");
    assert!(
        matches!(
            error.broker_error(),
            Some(
                ResponseError::CoordinatorNotAvailable
                    | ResponseError::CoordinatorLoadInProgress
                    | ResponseError::NotCoordinator
            )
        ),
        "{error}"
    );
    assert!(error.is_retriable(), "{error}");

    let mut config = WireConfig::new(&bootstrap).unwrap();
    config.options.request_timeout = Duration::from_secs(2);
    let mut client = ConsumerClient::new(config);
    assert_eq!(client.config().options.request_timeout, Duration::from_secs(2));
    let committed = client.committed_offsets(&group, &topic, &[0, 1]).await;
    assert_eq!(
        committed.expect("OffsetFetch, once the coordinator is there"),
        each(&[0, 1], None)
    );
    client
        .commit_offsets(&group, &topic, &BTreeMap::from([(0, 1), (1, 2)]))
        .await
        .expect("OffsetCommit");

    broker.freeze().expect("SIGSTOP the broker");
    let frozen = client.topic_metadata(&topic).await;
    broker.thaw().expect("SIGCONT the broker");
    let error = frozen.expect_err("a frozen broker does not answer");
    assert!(matches!(error, WireError::Timeout { .. }), "{error}");
    assert!(error.is_retriable(), "{error}");
    let metadata = client
        .topic_metadata(&topic)
        .await
        .expect("Metadata on a new connection");
    assert_eq!(metadata.leaders.len(), 2);

    broker.restart().expect("restart the broker");
    let restarted = client.committed_offsets(&group, &topic, &[0, 1]).await;
    let error = restarted.expect_err("the kept connection died with the broker");
    assert!(
        matches!(error, WireError::Closed { .. } | WireError::Io { .. }),
        "{error}"
    );
    assert!(error.is_retriable(), "{error}");
    let committed = client.committed_offsets(&group, &topic, &[0, 1]).await;
    let expected = BTreeMap::from([(0, Some(1)), (1, Some(2))]);
    assert_eq!(committed.expect("OffsetFetch on a new connection"), expected);
}

/// A bootstrap server that accepts connections and never answers (a frozen
/// or blackholed broker) holds up the others by a fraction of a second, not
/// by the connection set-up timeout (`socket.connection.setup.timeout.ms`,
/// 10 s): the next server is tried beside it.
#[tokio::test]
async fn a_silent_bootstrap_server_does_not_hold_up_the_next_one() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "wire-silent", 1).await;
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let silent_address = silent.local_addr().unwrap();
    // Accepts and keeps every connection open without a byte of answer.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming().flatten() {
            held.push(stream);
        }
    });
    let mut client = client(&format!("{silent_address},{bootstrap}"));
    let started = std::time::Instant::now();
    let metadata = client
        .topic_metadata(&topic)
        .await
        .expect("Metadata through the second server");
    let took = started.elapsed();
    assert_eq!(metadata.leaders.len(), 1);
    assert!(
        took < Duration::from_secs(5),
        "the silent first server held up the second for {took:?}: they are tried one after the other"
    );
}
