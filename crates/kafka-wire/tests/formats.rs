//! [`Fetcher`] against Apache Kafka reads every record format a topic can
//! hold, whole and in order, and agrees with the log-level reader:
//!
//! - message formats v0 and v1 (old segments of long-retention topics),
//!   uncompressed and with each of their codecs: Kafka 4.x no longer
//!   writes them, but serves them from disk, so the test crafts such a
//!   segment in a stopped broker's log folder, below the v2 records it
//!   wrote, and starts the broker again;
//! - v2 batches written by librdkafka with each codec (gzip, snappy, lz4,
//!   zstd).

mod common;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::message_set::{message, plain, wrapper, Codec};
use common::{fresh, kafka, new_topic, producer, send};
use exactly_kafka_wire::kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use exactly_kafka_wire::kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use exactly_kafka_wire::kafka_protocol::protocol::StrBytes;
use exactly_kafka_wire::{
    CommittedRecord, FetchSettings, FetchedRecord, Fetcher, KafkaConnection, WireClient, WireConfig,
};
use exactly_testkit::kafka::DATA_DIR;
use exactly_testkit::KafkaBroker;

/// How long a test waits for what it expects.
const PATIENCE: Duration = Duration::from_secs(60);

/// A record as compared: offset, timestamp, key, value.
type Row = (i64, i64, Option<Vec<u8>>, Option<Vec<u8>>);
/// A record without its timestamp (the producer's clock's).
type Untimed = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

fn untimed(rows: &[Row]) -> Vec<Untimed> {
    rows.iter()
        .map(|(offset, _, key, value)| (*offset, key.clone(), value.clone()))
        .collect()
}

fn fetched_row(record: &FetchedRecord) -> Row {
    let bytes = |b: &Option<bytes::Bytes>| b.as_ref().map(|b| b.to_vec());
    (
        record.offset,
        record.timestamp,
        bytes(&record.key),
        bytes(&record.value),
    )
}

fn committed_row(record: &CommittedRecord) -> Row {
    (
        record.offset,
        record.timestamp,
        record.key.clone(),
        record.value.clone(),
    )
}

/// Every record of partition 0 of `topic` from offset 0 as a [`Fetcher`]
/// with `settings` delivers them, until `count` came; then checks that no
/// more come and that the position stands at the end.
async fn fetch_all(bootstrap: &str, topic: &str, count: usize, settings: FetchSettings) -> Vec<Row> {
    let config = WireConfig::new(bootstrap).expect("a bootstrap list");
    let mut fetcher = Fetcher::start(config, topic, [(0, 0)].into(), settings, Default::default());
    let mut rows = Vec::new();
    let mut next = 0;
    let deadline = Instant::now() + PATIENCE;
    while rows.len() < count {
        assert!(Instant::now() < deadline, "gave up; fetched so far: {rows:?}");
        let chunk = fetcher.next(Duration::from_millis(200)).await.expect("fetching");
        if let Some(chunk) = chunk {
            rows.extend(chunk.records.iter().map(fetched_row));
            next = chunk.next_offset;
        }
    }
    let quiet = Instant::now() + Duration::from_millis(500);
    while Instant::now() < quiet {
        if let Some(chunk) = fetcher.next(Duration::from_millis(100)).await.expect("fetching") {
            assert!(chunk.records.is_empty(), "more than expected: {:?}", chunk.records);
            next = chunk.next_offset;
        }
    }
    assert_eq!(next, count as i64, "the position stands past the last record");
    rows
}

/// What the log-level reader says a read_committed consumer sees of
/// `topic`, once the partition answers (right after a broker start it may
/// have no leader yet: retriable errors are retried).
async fn judge(bootstrap: &str, topic: &str) -> Vec<Row> {
    let client = WireClient::new(bootstrap).expect("a bootstrap list");
    let deadline = Instant::now() + PATIENCE;
    loop {
        match client.read_topic_settled(topic, PATIENCE).await {
            Ok(read) => return read.records.iter().map(committed_row).collect(),
            Err(error) if error.is_retriable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("the log-level reader failed: {error}"),
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn bytes(text: &str) -> Option<Vec<u8>> {
    Some(text.as_bytes().to_vec())
}

/// A log segment of message formats v0 and v1 from offset 0 on: plain
/// messages (nulls among them) and compressed wrappers with every codec,
/// v1 timestamps from `t` on; and the records it is read as, one per
/// offset.
fn legacy_segment(t: i64) -> (Vec<u8>, Vec<Row>) {
    let mut segment = Vec::new();
    let mut rows = Vec::new();
    // v0: no timestamps; inner offsets absolute.
    segment.extend(plain(0, 0, 0, "k0", "v0"));
    segment.extend(message(1, 0, 0, 0, None, Some(b"v1")));
    segment.extend(message(2, 0, 0, 0, Some(b"k2"), None));
    rows.extend([
        (0, -1, bytes("k0"), bytes("v0")),
        (1, -1, None, bytes("v1")),
        (2, -1, bytes("k2"), None),
    ]);
    let mut offset = 3;
    for codec in [Codec::Gzip, Codec::SnappyXerial, Codec::Lz4] {
        let inner: Vec<u8> = (offset..offset + 2)
            .flat_map(|o| plain(o, 0, 0, &format!("k{o}"), &format!("v0 {codec:?} {o}")))
            .collect();
        segment.extend(wrapper(offset + 1, 0, codec, false, 0, &inner));
        rows.extend(
            (offset..offset + 2).map(|o| (o, -1, bytes(&format!("k{o}")), bytes(&format!("v0 {codec:?} {o}")))),
        );
        offset += 2;
    }
    // v1: timestamps; inner offsets relative to the wrapper's.
    segment.extend(plain(offset, 1, t, &format!("k{offset}"), "v1 plain"));
    segment.extend(message(offset + 1, 1, 0, t + 1, None, None));
    rows.extend([
        (offset, t, bytes(&format!("k{offset}")), bytes("v1 plain")),
        (offset + 1, t + 1, None, None),
    ]);
    offset += 2;
    for (codec, log_append_time) in [
        (Codec::Gzip, false),
        (Codec::SnappyXerial, false),
        (Codec::SnappyRaw, false),
        (Codec::Lz4, true),
    ] {
        let inner: Vec<u8> = (0..3)
            .flat_map(|i| plain(i, 1, t + i, &format!("k{}", offset + i), &format!("v1 {codec:?} {i}")))
            .collect();
        let wrapper_time = t + 100;
        segment.extend(wrapper(offset + 2, 1, codec, log_append_time, wrapper_time, &inner));
        rows.extend((0..3).map(|i| {
            let time = if log_append_time { wrapper_time } else { t + i };
            let o = offset + i;
            (o, time, bytes(&format!("k{o}")), bytes(&format!("v1 {codec:?} {i}")))
        }));
        offset += 3;
    }
    assert_eq!(rows.len() as i64, offset);
    (segment, rows)
}

/// `NAME.log` of a segment starting at `base`.
fn segment_name(base: i64) -> String {
    format!("{base:020}.log")
}

/// The v2 batches of `log` with every base offset moved up by `by` (the
/// batch CRC does not cover it).
fn shift_batches(mut log: Vec<u8>, by: i64) -> Vec<u8> {
    let mut at = 0;
    while at + 12 <= log.len() {
        let base = i64::from_be_bytes(log[at..at + 8].try_into().unwrap());
        let length = i32::from_be_bytes(log[at + 8..at + 12].try_into().unwrap()) as usize;
        assert_eq!(log[at + 16], 2, "v2 batches as the broker wrote them");
        log[at..at + 8].copy_from_slice(&(base + by).to_be_bytes());
        at += 12 + length;
    }
    assert_eq!(at, log.len(), "whole batches");
    log
}

/// Sets the offset of `topic`/0 in the checkpoint file `name` of the log
/// folder (`version`, `count`, then `topic partition offset` lines;
/// empty before the broker first wrote it).
fn set_checkpoint(data: &Path, name: &str, topic: &str, offset: i64) {
    let path = data.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        // Not written yet when the broker was killed.
        lines = vec!["0".into(), "0".into()];
    }
    let prefix = format!("{topic} 0 ");
    lines.retain(|line| !line.starts_with(&prefix));
    lines.push(format!("{prefix}{offset}"));
    let count = lines.len() - 2;
    lines[1] = count.to_string();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
}

/// Rewrites the log of `topic`/0 under `data` (the broker stopped): the
/// crafted `legacy` segment at offset 0 (`len` offsets), then the v2
/// batches the broker wrote, moved up to follow it in a segment of their
/// own. The indexes and the producer snapshots go, so the broker rebuilds
/// them and validates every batch on recovery; the checkpoints say the
/// whole log is to be recovered and is committed up to its new end.
fn put_legacy_segment_below(data: &Path, topic: &str, legacy: &[u8], len: i64, v2_records: i64) {
    let folder = data.join(format!("{topic}-0"));
    let v2 = std::fs::read(folder.join(segment_name(0))).expect("the broker's segment");
    for entry in std::fs::read_dir(&folder).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // partition.metadata (the topic id) and leader-epoch-checkpoint
        // stay: the v2 batches keep their leader epoch.
        if [".log", ".index", ".timeindex", ".snapshot", ".txnindex"]
            .iter()
            .any(|ext| name.ends_with(ext))
        {
            std::fs::remove_file(&path).unwrap();
        }
    }
    std::fs::write(folder.join(segment_name(0)), legacy).unwrap();
    std::fs::write(folder.join(segment_name(len)), shift_batches(v2, len)).unwrap();
    let _ = std::fs::remove_file(data.join(".kafka_cleanshutdown"));
    set_checkpoint(data, "recovery-point-offset-checkpoint", topic, 0);
    set_checkpoint(data, "replication-offset-checkpoint", topic, len + v2_records);
}

#[tokio::test]
async fn reads_segments_of_message_formats_v0_and_v1_as_the_broker_serves_them() {
    common::init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut broker = KafkaBroker::start_persistent(dir.path()).expect("a broker of this test's own");
    let bootstrap = broker.bootstrap().to_string();
    let topic = new_topic(&bootstrap, "legacy", 1).await;
    let before: Vec<String> = (0..5).map(|i| format!("v2-before-{i}")).collect();
    send(&producer(&bootstrap, &[]), &topic, 1, &before);
    broker.stop().expect("stop the broker");

    let (segment, legacy_rows) = legacy_segment(now_ms() - 60_000);
    let len = legacy_rows.len() as i64;
    put_legacy_segment_below(&dir.path().join(DATA_DIR), &topic, &segment, len, before.len() as i64);
    broker.restart().expect("start the broker on the rewritten log");
    // The broker appends after them as usual.
    let after: Vec<String> = (0..3).map(|i| format!("v2-after-{i}")).collect();
    send(&producer(&bootstrap, &[]), &topic, 1, &after);

    let judged = judge(&bootstrap, &topic).await;
    let total = legacy_rows.len() + before.len() + after.len();
    assert_eq!(
        judged.len(),
        total,
        "the log-level reader reads every record: {judged:?}"
    );
    assert_eq!(judged[..legacy_rows.len()], legacy_rows[..], "v0/v1 records whole");
    let v2 = untimed(&judged[legacy_rows.len()..]);
    let expected: Vec<_> = before
        .iter()
        .chain(&after)
        .enumerate()
        .map(|(i, v)| (len + i as i64, bytes(&format!("key-{v}")), bytes(v)))
        .collect();
    assert_eq!(v2, expected, "v2 records after them, in order");

    let fetched = fetch_all(&bootstrap, &topic, total, FetchSettings::default()).await;
    assert_eq!(fetched, judged, "the fetcher reads what the log-level reader reads");
    // Answers of 120 bytes: the broker cuts entries, the fetcher waits for
    // them whole.
    let small = FetchSettings {
        max_bytes: 120,
        partition_max_bytes: 120,
        ..FetchSettings::default()
    };
    let fetched = fetch_all(&bootstrap, &topic, total, small).await;
    assert_eq!(fetched, judged, "the same in small answers");
}

/// The codec (attributes & 7) of the first batch of `topic`/0, from a raw
/// Fetch.
async fn first_batch_codec(bootstrap: &str, topic: &str) -> u8 {
    let mut connection = KafkaConnection::connect(bootstrap).await.unwrap();
    let partition = FetchPartition::default()
        .with_partition(0)
        .with_fetch_offset(0)
        .with_partition_max_bytes(1024 * 1024)
        .with_current_leader_epoch(-1)
        .with_last_fetched_epoch(-1)
        .with_log_start_offset(-1);
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(100)
        .with_min_bytes(1)
        .with_max_bytes(1024 * 1024)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![partition])]);
    let response = connection.request(12, &request).await.unwrap();
    let records = response.responses[0].partitions[0].records.clone().expect("records");
    assert_eq!(records[16], 2, "a v2 batch");
    records[22] & 7
}

#[tokio::test]
async fn reads_v2_batches_librdkafka_compressed_with_each_codec() {
    let bootstrap = kafka().bootstrap();
    for (codec, number) in [("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4)] {
        let topic = new_topic(bootstrap, &format!("codec-{codec}"), 1).await;
        let values: Vec<String> = (0..300)
            .map(|i| format!("{codec} value {i} {}", "x".repeat(i % 50)))
            .collect();
        let settings = [
            ("compression.type", codec),
            ("linger.ms", "20"),
            ("client.id", &fresh(codec)),
        ];
        send(&producer(bootstrap, &settings), &topic, 1, &values);
        assert_eq!(first_batch_codec(bootstrap, &topic).await, number, "{codec} on disk");

        let judged = judge(bootstrap, &topic).await;
        let fetched = fetch_all(bootstrap, &topic, values.len(), FetchSettings::default()).await;
        assert_eq!(
            fetched, judged,
            "{codec}: the fetcher reads what the log-level reader reads"
        );
        let read = untimed(&fetched);
        let expected: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as i64, bytes(&format!("key-{v}")), bytes(v)))
            .collect();
        assert_eq!(read, expected, "{codec}: every record whole, in order");
    }
}
