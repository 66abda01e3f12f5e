//! [`Fetcher`] against Apache Kafka: what it delivers is what the
//! log-level reader says a read_committed consumer may see — committed and
//! plain records, never aborted ones, nothing past an open transaction —
//! and it rides out a broker restart. Records are produced with librdkafka.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{delete_records_below, fresh, kafka, new_topic, producer, send, TXN_TIMEOUT};
use exactly_kafka_wire::{FetchSettings, FetchedChunk, Fetcher, OffsetReset, WireClient, WireConfig, WireError};
use exactly_testkit::KafkaBroker;
use rdkafka::producer::Producer;

/// How long a test waits for records it expects.
const PATIENCE: Duration = Duration::from_secs(30);

fn start(bootstrap: &str, topic: &str, partitions: &[(i32, i64)], settings: FetchSettings) -> Fetcher {
    let config = WireConfig::new(bootstrap).expect("a bootstrap list");
    Fetcher::start(
        config,
        topic,
        partitions.iter().copied().collect(),
        settings,
        Default::default(),
    )
}

/// What a fetcher delivered: values by partition, in order, and each
/// partition's latest `next_offset`.
#[derive(Debug, Default)]
struct Delivered {
    values: BTreeMap<i32, Vec<(i64, String)>>,
    next: BTreeMap<i32, i64>,
    chunks: usize,
}

impl Delivered {
    fn take(&mut self, chunk: FetchedChunk) {
        let values = self.values.entry(chunk.partition).or_default();
        for record in &chunk.records {
            let value = String::from_utf8(record.value.as_deref().unwrap_or_default().to_vec()).unwrap();
            values.push((record.offset, value));
        }
        self.next.insert(chunk.partition, chunk.next_offset);
        self.chunks += 1;
    }

    fn count(&self) -> usize {
        self.values.values().map(Vec::len).sum()
    }

    fn all_values(&self) -> BTreeSet<String> {
        self.values.values().flatten().map(|(_, v)| v.clone()).collect()
    }
}

/// Takes chunks until `done` says so; fails after [`PATIENCE`].
async fn fetch_until(fetcher: &mut Fetcher, delivered: &mut Delivered, done: impl Fn(&Delivered) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done(delivered) {
        assert!(
            Instant::now() < deadline,
            "gave up waiting; delivered so far: {delivered:?}"
        );
        if let Some(chunk) = fetcher.next(Duration::from_millis(200)).await.expect("fetching") {
            delivered.take(chunk);
        }
    }
}

fn values(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test]
async fn delivers_what_the_log_level_reader_says_read_committed_sees() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "fetch-txn", 3).await;
    let plain = values("plain", 30);
    let committed = values("committed", 30);
    let aborted = values("aborted", 30);
    let later = values("later", 30);

    send(&producer(bootstrap, &[]), &topic, 3, &plain);
    let committer = producer(bootstrap, &[("transactional.id", &fresh("committer"))]);
    committer.init_transactions(TXN_TIMEOUT).unwrap();
    committer.begin_transaction().unwrap();
    send(&committer, &topic, 3, &committed);
    committer.commit_transaction(TXN_TIMEOUT).unwrap();
    let aborter = producer(bootstrap, &[("transactional.id", &fresh("aborter"))]);
    aborter.init_transactions(TXN_TIMEOUT).unwrap();
    aborter.begin_transaction().unwrap();
    send(&aborter, &topic, 3, &aborted);
    aborter.abort_transaction(TXN_TIMEOUT).unwrap();
    send(&producer(bootstrap, &[]), &topic, 3, &later);

    let judge = WireClient::new(bootstrap)
        .unwrap()
        .read_topic_settled(&topic, PATIENCE)
        .await
        .unwrap();
    let expected: BTreeMap<i32, Vec<(i64, String)>> = judge.records.iter().fold(BTreeMap::new(), |mut map, r| {
        let value = String::from_utf8(r.value.clone().unwrap()).unwrap();
        map.entry(r.partition).or_insert_with(Vec::new).push((r.offset, value));
        map
    });
    assert_eq!(
        judge.records.len(),
        90,
        "the judge sees plain, committed and later records"
    );

    let mut fetcher = start(bootstrap, &topic, &[(0, 0), (1, 0), (2, 0)], FetchSettings::default());
    let mut delivered = Delivered::default();
    fetch_until(&mut fetcher, &mut delivered, |d| d.count() >= 90).await;
    assert_eq!(delivered.values, expected, "exactly the judge's records, in order");
    let values = delivered.all_values();
    assert!(aborted.iter().all(|v| !values.contains(v)), "no aborted record");

    // Every partition is read past its last record: its end offset, the
    // markers included, is where the fetcher stands.
    let ends = exactly_kafka_wire::ConsumerClient::new(WireConfig::new(bootstrap).unwrap())
        .list_offsets(&topic, &[0, 1, 2], exactly_kafka_wire::OffsetSpec::Latest)
        .await
        .unwrap();
    fetch_until(&mut fetcher, &mut delivered, |d| {
        ends.iter().all(|(p, end)| d.next.get(p).copied() == *end)
    })
    .await;
    assert_eq!(delivered.count(), 90, "nothing more");
}

#[tokio::test]
async fn records_after_an_open_transaction_wait_for_its_end() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "fetch-open", 1).await;
    send(&producer(bootstrap, &[]), &topic, 1, &values("before", 5));
    let open = producer(bootstrap, &[("transactional.id", &fresh("open"))]);
    open.init_transactions(TXN_TIMEOUT).unwrap();
    open.begin_transaction().unwrap();
    send(&open, &topic, 1, &values("inside", 5));
    send(&producer(bootstrap, &[]), &topic, 1, &values("after", 5));

    let mut fetcher = start(bootstrap, &topic, &[(0, 0)], FetchSettings::default());
    let mut delivered = Delivered::default();
    fetch_until(&mut fetcher, &mut delivered, |d| d.count() >= 5).await;
    // Nothing past the last stable offset comes while the transaction is open.
    let quiet = Instant::now() + Duration::from_secs(2);
    while Instant::now() < quiet {
        if let Some(chunk) = fetcher.next(Duration::from_millis(200)).await.unwrap() {
            delivered.take(chunk);
        }
    }
    assert_eq!(delivered.all_values(), values("before", 5).into_iter().collect());

    open.commit_transaction(TXN_TIMEOUT).unwrap();
    fetch_until(&mut fetcher, &mut delivered, |d| d.count() >= 15).await;
    let order: Vec<String> = delivered.values[&0].iter().map(|(_, v)| v.clone()).collect();
    let expected: Vec<String> = ["before", "inside", "after"]
        .iter()
        .flat_map(|p| values(p, 5))
        .collect();
    assert_eq!(order, expected);
}

#[tokio::test]
async fn starts_at_the_given_offsets_and_takes_partitions_added_later() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "fetch-add", 2).await;
    send(&producer(bootstrap, &[]), &topic, 2, &values("v", 20));
    let mut fetcher = start(bootstrap, &topic, &[(0, 4)], FetchSettings::default());
    let mut delivered = Delivered::default();
    fetch_until(&mut fetcher, &mut delivered, |d| d.count() >= 6).await;
    assert_eq!(
        delivered.values[&0].iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        (4..10).collect::<Vec<_>>()
    );
    assert!(!delivered.values.contains_key(&1));
    fetcher.add(1, 7);
    fetch_until(&mut fetcher, &mut delivered, |d| d.count() >= 9).await;
    assert_eq!(
        delivered.values[&1].iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        [7, 8, 9]
    );
}

/// The error a fetcher stops with, waiting up to [`PATIENCE`] for it;
/// a chunk before it fails the test.
async fn stops_with(fetcher: &mut Fetcher) -> WireError {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match fetcher.next(Duration::from_millis(200)).await {
            Err(error) => return error,
            Ok(chunk) => {
                assert!(chunk.is_none(), "a record from an out-of-range position: {chunk:?}");
                assert!(Instant::now() < deadline, "no error for an out-of-range position");
            }
        }
    }
}

#[tokio::test]
async fn records_deleted_before_they_were_read_are_skipped_as_auto_offset_reset_says() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "fetch-retention", 1).await;
    send(&producer(bootstrap, &[]), &topic, 1, &values("v", 5));
    delete_records_below(bootstrap, &topic, 0, 3).await;

    let mut earliest = start(bootstrap, &topic, &[(0, 1)], FetchSettings::default());
    let mut delivered = Delivered::default();
    fetch_until(&mut earliest, &mut delivered, |d| d.count() >= 2).await;
    assert_eq!(delivered.values[&0], [(3, "v-3".to_string()), (4, "v-4".to_string())]);
    assert_eq!(earliest.counters().positions_reset(), 1, "the skip is counted");

    let settings = FetchSettings {
        offset_reset: OffsetReset::Error,
        ..FetchSettings::default()
    };
    let error = stops_with(&mut start(bootstrap, &topic, &[(0, 1)], settings)).await;
    let message = error.to_string();
    assert!(
        message.contains("retention deleted offsets 1 to 2")
            && message.contains("auto.offset.reset")
            && !error.is_retriable(),
        "{message}"
    );
}

#[tokio::test]
async fn a_position_past_the_logs_end_stops_the_fetcher_whatever_auto_offset_reset_says() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "fetch-past-end", 1).await;
    send(&producer(bootstrap, &[]), &topic, 1, &values("v", 5));
    let mut fetcher = start(bootstrap, &topic, &[(0, 1_000)], FetchSettings::default());
    let error = stops_with(&mut fetcher).await;
    let message = error.to_string();
    assert!(
        message.contains("ends at offset 5, below the position 1000") && message.contains("recreated"),
        "{message}"
    );
    assert!(!error.is_retriable());
}

#[tokio::test]
async fn bounds_what_it_holds_when_nobody_takes_it() {
    let bootstrap = kafka().bootstrap();
    let topic = new_topic(bootstrap, "fetch-bound", 1).await;
    let big: Vec<String> = (0..2_000).map(|i| format!("{i:0>200}")).collect();
    // Batches of about 4 KB, so the byte limits below decide.
    send(&producer(bootstrap, &[("batch.size", "4096")]), &topic, 1, &big);
    let settings = FetchSettings {
        queued_max_bytes: 16 * 1024,
        max_bytes: 8 * 1024,
        partition_max_bytes: 8 * 1024,
        ..FetchSettings::default()
    };
    let mut fetcher = start(bootstrap, &topic, &[(0, 0)], settings);
    // Let it fetch ahead as far as it will.
    let first = fetcher.next(PATIENCE).await.unwrap().expect("a first chunk");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut queued = Vec::new();
    while let Some(chunk) = fetcher.try_next().unwrap() {
        queued.push(chunk);
    }
    let bytes: usize = queued
        .iter()
        .flat_map(|c| &c.records)
        .map(|r| r.value.as_ref().map_or(0, |v| v.len()))
        .sum();
    // What was queued (the first chunk still held) plus one answer in
    // flight: far below the 400 KB of the topic.
    assert!(bytes <= 16 * 1024 + 8 * 1024, "{bytes} bytes queued");
    let mut delivered = Delivered::default();
    for chunk in std::iter::once(first).chain(queued) {
        delivered.take(chunk);
    }
    fetch_until(&mut fetcher, &mut delivered, |d| d.next.get(&0) == Some(&2_000)).await;
}

#[tokio::test]
async fn rides_out_a_broker_restart() {
    let _ = kafka();
    let mut broker = KafkaBroker::start().expect("a broker of this test's own");
    let bootstrap = broker.bootstrap().to_string();
    let topic = new_topic(&bootstrap, "fetch-restart", 2).await;
    send(&producer(&bootstrap, &[]), &topic, 2, &values("before", 20));
    let settings = FetchSettings {
        max_backoff: Duration::from_millis(300),
        ..FetchSettings::default()
    };
    let mut fetcher = start(&bootstrap, &topic, &[(0, 0), (1, 0)], settings);
    let mut delivered = Delivered::default();
    fetch_until(&mut fetcher, &mut delivered, |d| d.count() >= 20).await;

    broker.stop().expect("stop the broker");
    let outage = Instant::now() + Duration::from_secs(2);
    while Instant::now() < outage {
        match fetcher.next(Duration::from_millis(200)).await {
            Ok(chunk) => assert!(chunk.is_none(), "records while the broker is down"),
            Err(error) => panic!("an outage is not an error: {error}"),
        }
    }
    assert!(fetcher.counters().transient_errors() > 0, "the outage was not counted");
    broker.restart().expect("restart the broker");
    send(&producer(&bootstrap, &[]), &topic, 2, &values("after", 20));
    fetch_until(&mut fetcher, &mut delivered, |d| d.count() >= 40).await;
    let all = delivered.all_values();
    assert_eq!(all.len(), 40, "nothing twice, nothing lost");
    assert!(values("after", 20).iter().all(|v| all.contains(v)));
}

#[tokio::test]
async fn an_unreachable_cluster_is_ridden_out_not_an_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let mut fetcher = start(&addr, "nowhere", &[(0, 0)], FetchSettings::default());
    let chunk: Result<_, WireError> = fetcher.next(Duration::from_secs(1)).await;
    assert!(chunk.unwrap().is_none());
    assert!(fetcher.counters().transient_errors() > 0);
}
