//! The Kafka source against Apache Kafka: the broker exactly-testkit shares
//! among the tests of this binary (or the Kafka named by
//! `EXACTLY_KAFKA_BOOTSTRAP`); the outage test stops and restarts a broker of
//! its own.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use exactly_core::{
    CheckpointId, FsCheckpointStore, Pipeline, PipelineConfig, Poll, Record, Source, SourceFactory, SplitPositions,
};
use exactly_file::FileSinkFactory;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_kafka::{KafkaSourceConfig, KafkaSourceFactory, StartPosition};
use exactly_testkit::KafkaBroker;

/// Longest wait for records that were produced.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a read keeps polling after the expected count, to catch extras.
const SETTLE: Duration = Duration::from_millis(500);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("exactly_kafka=debug,librdkafka=info,exactly_testkit=info")
        .try_init();
}

/// A topic name no other test (or earlier run against an external Kafka) uses.
fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// The shared broker, or one of the test's own.
enum Broker {
    Shared(&'static KafkaBroker),
    Own(Box<KafkaBroker>),
}

impl Broker {
    fn get(&self) -> &KafkaBroker {
        match self {
            Broker::Shared(broker) => broker,
            Broker::Own(broker) => broker,
        }
    }
}

/// A broker with a fresh topic of `partitions` partitions.
struct Fixture {
    broker: Broker,
    admin: KafkaAdmin,
    topic: String,
}

impl Fixture {
    /// On the shared broker.
    async fn new(name: &str, partitions: i32) -> Fixture {
        init_tracing();
        let broker = KafkaBroker::shared().expect("start the shared Kafka broker");
        Self::on(Broker::Shared(broker), name, partitions).await
    }

    /// On a broker of the test's own, which it may stop and restart.
    async fn own(name: &str, partitions: i32) -> Fixture {
        init_tracing();
        let broker = KafkaBroker::start().expect("start a Kafka broker");
        Self::on(Broker::Own(Box::new(broker)), name, partitions).await
    }

    async fn on(broker: Broker, name: &str, partitions: i32) -> Fixture {
        Self::with_topic(broker, unique(name), partitions).await
    }

    /// On `broker`, with the topic named `topic` (another cluster may have
    /// one of the same name).
    async fn with_topic(broker: Broker, topic: String, partitions: i32) -> Fixture {
        let admin = KafkaAdmin::new(broker.get().bootstrap());
        admin.create_topic(&topic, partitions).await.expect("create topic");
        Fixture { broker, admin, topic }
    }

    fn bootstrap(&self) -> &str {
        self.broker.get().bootstrap()
    }

    /// The broker of the test's own.
    fn own_broker(&mut self) -> &mut KafkaBroker {
        match &mut self.broker {
            Broker::Own(broker) => broker,
            Broker::Shared(_) => panic!("the shared broker cannot be stopped or restarted; use Fixture::own"),
        }
    }

    /// A source of this topic with short test timings, edited by `edit`.
    fn factory(&self, edit: impl FnOnce(&mut KafkaSourceConfig)) -> KafkaSourceFactory {
        let mut config = KafkaSourceConfig::new(self.bootstrap(), &self.topic);
        config.startup_timeout = Duration::from_secs(10);
        config.partition_discovery_interval = Duration::from_millis(200);
        edit(&mut config);
        KafkaSourceFactory::new("test", config).expect("valid config")
    }

    /// Produces values `v-<i>` (key `k-<i>`, header `i`) for every `i` in
    /// `range`, record `i` to partition `i % partitions`.
    async fn produce(&self, range: std::ops::Range<usize>, partitions: usize) -> Vec<(i32, i64)> {
        let records = range.map(|i| {
            ProduceRecord::new(format!("v-{i}"))
                .with_key(format!("k-{i}"))
                .with_header("i", i.to_string())
                .to_partition((i % partitions) as i32)
        });
        self.admin.produce(&self.topic, records).await.expect("produce")
    }
}

/// Creates and restores subtasks `0..parallelism`.
async fn subtasks(
    factory: &KafkaSourceFactory,
    parallelism: usize,
    positions: Option<&SplitPositions>,
) -> Vec<Box<dyn Source>> {
    let mut out = Vec::new();
    for i in 0..parallelism {
        let mut s = factory.create(i, parallelism).expect("create");
        s.restore(positions).await.expect("restore");
        out.push(s);
    }
    out
}

/// One poll of each subtask, collecting `(subtask, record)`.
async fn poll_all(sources: &mut [Box<dyn Source>], max: usize, into: &mut Vec<(usize, Record)>) {
    for (i, s) in sources.iter_mut().enumerate() {
        match s.poll(max).await.expect("poll") {
            Poll::Records(r) => into.extend(r.into_iter().map(|r| (i, r))),
            Poll::Finished => panic!("a Kafka source never finishes"),
        }
    }
}

/// Polls, `max` records per poll, until at least `n` records arrived.
async fn read_at_least(sources: &mut [Box<dyn Source>], n: usize, max: usize) -> Vec<(usize, Record)> {
    let mut out = Vec::new();
    let deadline = Instant::now() + READ_TIMEOUT;
    while out.len() < n {
        assert!(Instant::now() < deadline, "only {} of {n} records arrived", out.len());
        poll_all(sources, max, &mut out).await;
    }
    out
}

/// Polls until `n` records arrived, then a little longer; returns all of them
/// with the subtask that read each.
async fn read_from(sources: &mut [Box<dyn Source>], n: usize) -> Vec<(usize, Record)> {
    let mut out = read_at_least(sources, n, 50).await;
    let settle = Instant::now() + SETTLE;
    while Instant::now() < settle {
        poll_all(sources, 50, &mut out).await;
    }
    out
}

/// Retries `check` until it passes; fails with its last complaint after
/// [`READ_TIMEOUT`].
async fn eventually(mut check: impl AsyncFnMut() -> Result<(), String>) {
    let deadline = Instant::now() + READ_TIMEOUT;
    loop {
        match check().await {
            Ok(()) => return,
            Err(complaint) if Instant::now() > deadline => panic!("{complaint}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The offsets `group` committed for the fixture's topic, as positions.
async fn group_offsets(fx: &Fixture, group: &str) -> SplitPositions {
    let committed = fx.admin.committed(group, &fx.topic).await.expect("OffsetFetch");
    SplitPositions(
        committed
            .into_iter()
            .map(|(p, o)| (format!("{}-{p}", fx.topic), o))
            .collect(),
    )
}

async fn read(sources: &mut [Box<dyn Source>], n: usize) -> Vec<Record> {
    read_from(sources, n).await.into_iter().map(|(_, r)| r).collect()
}

fn positions(sources: &mut [Box<dyn Source>]) -> SplitPositions {
    let mut all = SplitPositions::default();
    for s in sources {
        all.merge(&s.position(exactly_core::CheckpointId(1)));
    }
    all
}

/// The entry of positions that names the cluster they were read from.
fn cluster_entry(topic: &str, cluster: &str) -> String {
    format!("{topic}@cluster:{cluster}")
}

/// The clusters `positions` name.
fn clusters_in(positions: &SplitPositions) -> BTreeSet<String> {
    positions
        .0
        .keys()
        .filter_map(|k| Some(k.split_once("@cluster:")?.1.to_string()))
        .collect()
}

/// `positions` without the facts recorded beside the offsets (the
/// cluster, the topic's id, leader epochs): the offsets.
fn offsets(positions: &SplitPositions) -> SplitPositions {
    let mut offsets = positions.clone();
    offsets.0.retain(|split, _| !split.contains('@'));
    offsets
}

/// The values of `records`, sorted; asserts no (split, offset) appears twice.
fn values(records: &[Record]) -> Vec<String> {
    let ids: BTreeSet<_> = records.iter().map(|r| (r.split.clone(), r.offset)).collect();
    assert_eq!(ids.len(), records.len(), "a record was delivered twice");
    let mut v: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().expect("a value")).into())
        .collect();
    v.sort();
    v
}

fn expected(range: std::ops::Range<usize>) -> Vec<String> {
    let mut v: Vec<String> = range.map(|i| format!("v-{i}")).collect();
    v.sort();
    v
}

/// `next` per split of `topic` after the given deliveries.
fn ends(topic: &str, deliveries: &[(i32, i64)]) -> SplitPositions {
    let mut p = SplitPositions::default();
    for (partition, offset) in deliveries {
        let split = format!("{topic}-{partition}");
        let next = (offset + 1).max(p.get(&split).unwrap_or(0));
        p.set(split, next);
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_subtasks_read_every_record_once_with_its_metadata() {
    let fx = Fixture::new("all", 3).await;
    let produced_at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let delivered = fx.produce(0..90, 3).await;
    let factory = fx.factory(|_| {});
    let mut sources = subtasks(&factory, 2, None).await;
    let read = read_from(&mut sources, 90).await;

    let records: Vec<Record> = read.iter().map(|(_, r)| r.clone()).collect();
    assert_eq!(values(&records), expected(0..90));
    for (subtask, r) in &read {
        let value = String::from_utf8_lossy(r.value.as_deref().expect("a value"));
        let i: usize = value.strip_prefix("v-").unwrap().parse().unwrap();
        let (topic, partition) = r.topic_partition().expect("split is <topic>-<partition>");
        assert_eq!(topic, fx.topic);
        assert_eq!((partition, r.offset), delivered[i], "split and offset of {value}");
        assert_eq!(
            partition as usize % 2,
            *subtask,
            "partition {partition} read by subtask {subtask}"
        );
        assert_eq!(r.key.as_deref(), Some(format!("k-{i}").as_bytes()));
        assert_eq!(r.headers, vec![("i".to_string(), Some(i.to_string().into_bytes()))]);
        let ts = r.timestamp_ms.expect("timestamp");
        assert!(
            (produced_at - 60_000..produced_at + 60_000).contains(&ts),
            "timestamp {ts}"
        );
    }
    let taken = positions(&mut sources);
    assert_eq!(offsets(&taken), ends(&fx.topic, &delivered));
    let cluster = fx.admin.cluster_id().await.expect("the cluster id");
    assert_eq!(
        clusters_in(&taken),
        [cluster.clone()].into(),
        "the positions name their cluster"
    );
    assert_eq!(taken.get(&cluster_entry(&fx.topic, &cluster)), Some(0));

    // A plain consumer sees the very same records.
    let mut sorted = records;
    sorted.sort_by(|a, b| (a.topic_partition(), a.offset).cmp(&(b.topic_partition(), b.offset)));
    assert_eq!(fx.admin.read_all(&fx.topic).await.expect("read_all"), sorted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_subtasks_continue_exactly_where_the_position_was_taken() {
    let fx = Fixture::new("resume", 3).await;
    fx.produce(0..60, 3).await;
    let factory = fx.factory(|_| {});
    let mut first = subtasks(&factory, 2, None).await;
    let before = read_at_least(&mut first, 20, 7).await;
    let taken = positions(&mut first);
    assert!(
        before.len() < 60,
        "read everything already; the test needs a mid-way position"
    );
    drop(first);

    fx.produce(60..90, 3).await;
    let mut second = subtasks(&factory, 2, Some(&taken)).await;
    let after = read(&mut second, 90 - before.len()).await;
    for r in &after {
        assert!(
            r.offset >= taken.get(&r.split).unwrap(),
            "{r:?} is before the restored position"
        );
    }
    let mut all: Vec<Record> = before.into_iter().map(|(_, r)| r).collect();
    all.extend(after);
    assert_eq!(values(&all), expected(0..90));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_reads_only_what_is_produced_after_the_start_even_after_a_restore() {
    let fx = Fixture::new("latest", 2).await;
    let old = fx.produce(0..20, 2).await;
    let factory = fx.factory(|c| c.start = StartPosition::Latest);
    let mut sources = subtasks(&factory, 1, None).await;
    // Resolved to numbers before any record arrived.
    let at_start = positions(&mut sources);
    assert_eq!(offsets(&at_start), ends(&fx.topic, &old));

    fx.produce(20..30, 2).await;
    assert_eq!(values(&read(&mut sources, 10).await), expected(20..30));
    // A restart from the position taken at the start reads the same records.
    let mut again = subtasks(&factory, 1, Some(&at_start)).await;
    assert_eq!(values(&read(&mut again, 10).await), expected(20..30));
}

/// `latest` is the end a read_committed consumer sees: a transaction still
/// open at the start is read whole once it commits, not from its middle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_starts_before_a_transaction_still_open() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let fx = Fixture::new("latest-open", 1).await;
    fx.produce(0..5, 1).await;
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", fx.bootstrap())
        .set("transactional.id", unique("latest-open"))
        .create()
        .unwrap();
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout).unwrap();
    producer.begin_transaction().unwrap();
    for i in 5..8 {
        let value = format!("v-{i}");
        producer
            .send(BaseRecord::<(), _>::to(&fx.topic).partition(0).payload(&value))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(timeout).unwrap();

    let factory = fx.factory(|c| c.start = StartPosition::Latest);
    let mut sources = subtasks(&factory, 1, None).await;
    let split = format!("{}-0", fx.topic);
    assert_eq!(
        positions(&mut sources).get(&split),
        Some(5),
        "the start is the last stable offset, below the open transaction (its high watermark is 8)"
    );
    producer.commit_transaction(timeout).unwrap();
    fx.produce(8..10, 1).await;
    assert_eq!(values(&read(&mut sources, 5).await), expected(5..10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamp_start_skips_older_records() {
    let fx = Fixture::new("timestamp", 3).await;
    let base = 1_700_000_000_000i64;
    let records = (0..30).map(|i| {
        ProduceRecord::new(format!("v-{i}"))
            .to_partition(i % 3)
            .at(base + i64::from(i) * 1000)
    });
    fx.admin.produce(&fx.topic, records).await.expect("produce");
    let factory = fx.factory(|c| c.start = StartPosition::Timestamp(base + 15_000));
    let mut sources = subtasks(&factory, 2, None).await;
    let records = read(&mut sources, 15).await;
    assert_eq!(values(&records), expected(15..30));
    assert!(records.iter().all(|r| r.timestamp_ms >= Some(base + 15_000)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_added_later_are_read_from_their_beginning() {
    let fx = Fixture::new("grow", 2).await;
    fx.produce(0..10, 2).await;
    let factory = fx.factory(|c| c.start = StartPosition::Latest);
    let mut sources = subtasks(&factory, 2, None).await;
    fx.produce(10..20, 2).await;
    let mut records = read(&mut sources, 10).await;

    fx.admin
        .create_partitions(&fx.topic, 4)
        .await
        .expect("CreatePartitions");
    // Produced before the source sees the new partitions: still read, since
    // new partitions start at their beginning whatever `start` says.
    fx.produce(20..40, 4).await;
    records.extend(read(&mut sources, 20).await);
    assert_eq!(values(&records), expected(10..40));
    let splits: BTreeSet<String> = offsets(&positions(&mut sources)).0.into_keys().collect();
    assert_eq!(splits, (0..4).map(|p| format!("{}-{p}", fx.topic)).collect());
    assert_eq!(factory.metrics().partitions_discovered, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_created_after_the_checkpoint_is_read_from_its_beginning_on_restore() {
    let fx = Fixture::new("grow-restore", 1).await;
    fx.produce(0..5, 1).await;
    let factory = fx.factory(|c| c.start = StartPosition::Latest);
    let mut sources = subtasks(&factory, 1, None).await;
    let checkpoint = positions(&mut sources);
    drop(sources);

    // While the pipeline is down, a partition appears and gets records.
    fx.admin
        .create_partitions(&fx.topic, 2)
        .await
        .expect("CreatePartitions");
    fx.produce(5..15, 2).await;
    let mut restored = subtasks(&factory, 1, Some(&checkpoint)).await;
    assert_eq!(values(&read(&mut restored, 10).await), expected(5..15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_missing_from_the_metadata_keeps_its_checkpointed_offset_until_it_is_back() {
    let fx = Fixture::new("missing", 2).await;
    fx.produce(0..20, 2).await;
    let factory = fx.factory(|_| {});
    let mut first = subtasks(&factory, 1, None).await;
    read(&mut first, 20).await;
    // The checkpoint also has partition 2, read up to offset 3 — but the
    // metadata does not show it when the source opens (as from a broker
    // that has not caught up with the topic's partitions yet).
    let mut checkpoint = positions(&mut first);
    drop(first);
    let missing = format!("{}-2", fx.topic);
    checkpoint.set(&missing, 3);
    let mut restored = subtasks(&factory, 2, Some(&checkpoint)).await;
    let while_missing = positions(&mut restored);
    assert_eq!(
        while_missing, checkpoint,
        "a checkpoint taken while partition 2 is missing forgets its offset"
    );
    // A restart from such a checkpoint keeps it too.
    let mut again = subtasks(&factory, 2, Some(&while_missing)).await;
    assert_eq!(positions(&mut again).get(&missing), Some(3));
    drop(again);

    fx.admin
        .create_partitions(&fx.topic, 3)
        .await
        .expect("CreatePartitions");
    let records = (100..110).map(|i| ProduceRecord::new(format!("v-{i}")).to_partition(2));
    let delivered = fx.admin.produce(&fx.topic, records).await.expect("produce");
    assert_eq!(delivered.first(), Some(&(2, 0)), "partition 2 starts at offset 0");
    let back = read(&mut restored, 7).await;
    assert_eq!(
        back.iter().map(|r| (r.split.to_string(), r.offset)).collect::<Vec<_>>(),
        (3..10).map(|o| (missing.clone(), o)).collect::<Vec<_>>(),
        "partition 2 resumes at its checkpointed offset 3, not at its beginning"
    );
    assert_eq!(values(&back), expected(103..110));
    assert_eq!(positions(&mut restored).get(&missing), Some(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_read_from_another_cluster_are_refused_unless_that_cluster_is_accepted() {
    let a = Fixture::new("cluster", 2).await;
    let other = KafkaBroker::start().expect("start a second Kafka broker");
    let b = Fixture::with_topic(Broker::Own(Box::new(other)), a.topic.clone(), 2).await;
    let (cluster_a, cluster_b) = (
        a.admin.cluster_id().await.expect("cluster a"),
        b.admin.cluster_id().await.expect("cluster b"),
    );
    assert_ne!(cluster_a, cluster_b, "two brokers of the test kit are two clusters");
    a.produce(0..20, 2).await;
    b.produce(0..40, 2).await;
    let mut on_a = subtasks(&a.factory(|_| {}), 1, None).await;
    read(&mut on_a, 20).await;
    let taken = positions(&mut on_a);
    assert_eq!(clusters_in(&taken), [cluster_a.clone()].into());

    // The same pipeline pointed at the other cluster, whose topic has the
    // same name.
    let mut refused = b.factory(|_| {}).create(0, 1).unwrap();
    let error = refused
        .restore(Some(&taken))
        .await
        .expect_err("offsets of cluster a on cluster b");
    assert!(!error.is_retriable(), "{error}");
    let message = error.to_string();
    for part in [
        format!("read from Kafka cluster `{cluster_a}`"),
        format!("`{}` is cluster `{cluster_b}`", b.bootstrap()),
        format!("accept_cluster_id = \"{cluster_b}\""),
        "Point `bootstrap` back".to_string(),
    ] {
        assert!(message.contains(&part), "`{part}` missing from {message}");
    }
    // The same positions on their own cluster are fine.
    let mut back_on_a = subtasks(&a.factory(|_| {}), 1, Some(&taken)).await;
    assert_eq!(positions(&mut back_on_a), taken);

    // Accepted by name: the offsets are resumed there, and the positions
    // name the new cluster from now on.
    let accepting = b.factory(|c| c.accept_cluster_id = Some(cluster_b.clone()));
    let mut moved = subtasks(&accepting, 1, Some(&taken)).await;
    assert_eq!(values(&read(&mut moved, 20).await), expected(20..40));
    assert_eq!(clusters_in(&positions(&mut moved)), [cluster_b.clone()].into());

    // Positions that name no cluster (written before they did) are taken
    // as they are, and name one from then on.
    let mut older = subtasks(&b.factory(|_| {}), 1, Some(&offsets(&taken))).await;
    assert_eq!(clusters_in(&positions(&mut older)), [cluster_b].into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpointed_offsets_are_committed_to_the_group_and_start_group_uses_them() {
    let fx = Fixture::new("group", 2).await;
    fx.produce(0..20, 2).await;
    let group = unique("group");
    let factory = fx.factory(|c| c.group_id = Some(group.clone()));
    let mut sources = subtasks(&factory, 1, None).await;
    read(&mut sources, 20).await;
    let checkpoint = offsets(&positions(&mut sources));
    sources[0].checkpoint_complete(CheckpointId(1)).await.unwrap();
    eventually(async || {
        let got = group_offsets(&fx, &group).await;
        let commits = factory.metrics().group_commits;
        if got == checkpoint && commits == 1 {
            Ok(())
        } else {
            Err(format!(
                "group offsets {got:?}, checkpoint {checkpoint:?}, {commits} commits"
            ))
        }
    })
    .await;

    fx.produce(20..30, 2).await;
    let from_group = fx.factory(|c| {
        c.group_id = Some(group.clone());
        c.start = StartPosition::Group;
    });
    let mut sources = subtasks(&from_group, 2, None).await;
    assert_eq!(values(&read(&mut sources, 10).await), expected(20..30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_rides_out_a_broker_restart() {
    let mut fx = Fixture::own("outage", 3).await;
    fx.produce(0..60, 3).await;
    let factory = fx.factory(|_| {});
    let mut sources = subtasks(&factory, 2, None).await;
    let mut records = read_at_least(&mut sources, 20, 5).await;

    fx.own_broker().stop().expect("stop the broker");
    let outage = Instant::now() + Duration::from_secs(3);
    while Instant::now() < outage {
        // Not an error: librdkafka reconnects by itself.
        poll_all(&mut sources, 5, &mut records).await;
    }
    assert!(factory.metrics().transient_errors > 0, "the outage was not counted");
    fx.own_broker().restart().expect("restart the broker");

    fx.produce(60..100, 3).await;
    let got = records.len();
    records.extend(read_from(&mut sources, 100 - got).await);
    let records: Vec<Record> = records.into_iter().map(|(_, r)| r).collect();
    assert_eq!(values(&records), expected(0..100));
}

/// Runs the pipeline `kafka-to-files` (parallelism 2) from `fx`'s topic into
/// `dir/out` until it has read `records`, then stops it (final checkpoint).
async fn run_pipeline(fx: &Fixture, dir: &Path, group: &str, records: u64) {
    let name = "kafka-to-files";
    let source = fx.factory(|c| c.group_id = Some(group.to_string()));
    let mut config = PipelineConfig::new(name);
    config.parallelism = 2;
    config.checkpoint.interval = Duration::from_millis(200);
    let sink = FileSinkFactory::new(dir.join("out"));
    let store = FsCheckpointStore::new(dir.join("checkpoints"), name, 3);
    let pipeline = Pipeline::new(config, Arc::new(source), Arc::new(sink), Arc::new(store)).unwrap();
    let metrics = pipeline.metrics();
    let read_all = async move {
        while metrics.snapshot().records_in < records {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let run = tokio::time::timeout(READ_TIMEOUT, pipeline.run(read_all));
    run.await.expect("the pipeline read everything in time").expect("run");
}

/// The values in the committed files of `dir`, sorted.
fn committed_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.file_name().unwrap().to_string_lossy().starts_with('.') {
            lines.extend(std::fs::read_to_string(path).unwrap().lines().map(String::from));
        }
    }
    lines.sort();
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_copies_the_topic_exactly_once_across_runs_and_publishes_its_offsets() {
    let fx = Fixture::new("pipeline", 3).await;
    let dir = tempfile::tempdir().unwrap();
    let group = unique("pipeline");
    let mut delivered = fx.produce(0..50, 3).await;
    run_pipeline(&fx, dir.path(), &group, 50).await;
    delivered.extend(fx.produce(50..80, 3).await);
    // The second run resumes from the first run's final checkpoint.
    run_pipeline(&fx, dir.path(), &group, 30).await;
    assert_eq!(committed_lines(&dir.path().join("out")), expected(0..80));

    // The group ends at the last checkpoint: the end of every partition.
    let end = ends(&fx.topic, &delivered);
    eventually(async || {
        let got = group_offsets(&fx, &group).await;
        if got == end {
            Ok(())
        } else {
            Err(format!("group offsets {got:?}, end of the topic {end:?}"))
        }
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_bootstrap_is_a_clear_transient_error() {
    init_tracing();
    let port = exactly_testkit::free_port().unwrap();
    let bootstrap = format!("127.0.0.1:{port}");
    let mut config = KafkaSourceConfig::new(&bootstrap, "orders");
    config.startup_timeout = Duration::from_secs(2);
    let factory = KafkaSourceFactory::new("test", config).unwrap();
    let mut source = factory.create(0, 1).unwrap();
    let started = Instant::now();
    let error = source.restore(None).await.expect_err("nothing listens there");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(error.is_retriable(), "{error}");
    let message = error.to_string();
    assert!(
        message.contains(&bootstrap) && message.contains("did not answer within 2s"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_is_a_fatal_error_naming_it() {
    init_tracing();
    let broker = KafkaBroker::shared().expect("start the shared Kafka broker");
    let topic = unique("missing");
    let mut config = KafkaSourceConfig::new(broker.bootstrap(), &topic);
    config.startup_timeout = Duration::from_secs(2);
    let factory = KafkaSourceFactory::new("test", config).unwrap();
    let mut source = factory.create(0, 1).unwrap();
    let error = source.restore(None).await.expect_err("no such topic");
    assert!(!error.is_retriable(), "{error}");
    assert!(
        error.to_string().contains(&format!("topic `{topic}` does not exist")),
        "{error}"
    );
}

/// The id the brokers give `topic` now.
async fn topic_id(fx: &Fixture) -> exactly_kafka_wire::TopicId {
    let config = exactly_kafka_wire::WireConfig::new(fx.bootstrap()).expect("bootstrap");
    let mut client = exactly_kafka_wire::ConsumerClient::new(config);
    let metadata = client.topic_metadata(&fx.topic).await.expect("the topic's metadata");
    metadata.topic_id.expect("Kafka 4 names topic ids")
}

/// Polls the subtasks until one fails; the error, or a panic after `within`.
async fn first_error(sources: &mut [Box<dyn Source>], within: Duration) -> exactly_core::ConnectorError {
    let deadline = Instant::now() + within;
    loop {
        assert!(Instant::now() < deadline, "no error within {within:?}");
        for s in sources.iter_mut() {
            if let Err(error) = s.poll(50).await {
                return error;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_record_leader_epochs_and_the_topic_id_and_a_restore_checks_and_resumes_them() {
    let fx = Fixture::new("epochs", 2).await;
    fx.produce(0..20, 2).await;
    let factory = fx.factory(|_| {});
    let mut sources = subtasks(&factory, 1, None).await;
    assert_eq!(values(&read(&mut sources, 20).await), expected(0..20));
    let taken = positions(&mut sources);
    for p in 0..2 {
        let epoch = taken.get(&format!("{}-{p}@leader-epoch", fx.topic));
        assert!(
            epoch.is_some_and(|e| e >= 0),
            "partition {p}'s position names the epoch of its last record: {taken:?}"
        );
    }
    let id = topic_id(&fx).await;
    assert_eq!(
        taken.get(&format!("{}@topic-id:{id}", fx.topic)),
        Some(0),
        "the positions name the topic's id: {taken:?}"
    );
    drop(sources);

    fx.produce(20..30, 2).await;
    let mut again = subtasks(&factory, 1, Some(&taken)).await;
    assert_eq!(
        values(&read(&mut again, 10).await),
        expected(20..30),
        "the checked positions resume where they were"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_recreated_while_stopped_is_refused_naming_both_ids_unless_the_new_one_is_accepted() {
    let fx = Fixture::new("recreated", 2).await;
    fx.produce(0..10, 2).await;
    let factory = fx.factory(|_| {});
    let mut sources = subtasks(&factory, 1, None).await;
    read(&mut sources, 10).await;
    let taken = positions(&mut sources);
    drop(sources);
    let old = topic_id(&fx).await;

    fx.admin.delete_topic(&fx.topic).await.expect("delete the topic");
    fx.admin.create_topic(&fx.topic, 2).await.expect("create it again");
    let records = (100..105).map(|i| ProduceRecord::new(format!("v-{i}")).to_partition(i % 2));
    fx.admin.produce(&fx.topic, records).await.expect("produce");
    let new = topic_id(&fx).await;
    assert_ne!(old, new);

    let error = factory
        .create(0, 1)
        .unwrap()
        .restore(Some(&taken))
        .await
        .expect_err("offsets of the old topic");
    assert!(!error.is_retriable(), "{error}");
    let message = error.to_string();
    for part in [old.to_string(), new.to_string(), format!("accept_topic_id = \"{new}\"")] {
        assert!(message.contains(&part), "`{part}` missing from {message}");
    }

    let accepting = fx.factory(|c| c.accept_topic_id = Some(new.to_string()));
    let mut sources = subtasks(&accepting, 1, Some(&taken)).await;
    assert_eq!(
        values(&read(&mut sources, 5).await),
        expected(100..105),
        "the new topic is read from its beginning"
    );
    let now = positions(&mut sources);
    assert!(now.get(&format!("{}@topic-id:{new}", fx.topic)).is_some(), "{now:?}");
    assert!(now.get(&format!("{}@topic-id:{old}", fx.topic)).is_none(), "{now:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_recreated_while_read_stops_the_source_naming_both_ids() {
    let fx = Fixture::new("recreated-live", 2).await;
    fx.produce(0..10, 2).await;
    let factory = fx.factory(|_| {});
    let mut sources = subtasks(&factory, 1, None).await;
    read(&mut sources, 10).await;
    let old = topic_id(&fx).await;
    fx.admin.delete_topic(&fx.topic).await.expect("delete the topic");
    fx.admin.create_topic(&fx.topic, 2).await.expect("create it again");
    let new = topic_id(&fx).await;
    let error = first_error(&mut sources, Duration::from_secs(60)).await;
    assert!(!error.is_retriable(), "{error}");
    let message = error.to_string();
    for part in [
        old.to_string(),
        new.to_string(),
        "deleted and created again".to_string(),
        format!("accept_topic_id = \"{new}\""),
    ] {
        assert!(message.contains(&part), "`{part}` missing from {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_while_read_stops_the_source_after_the_missing_topic_timeout() {
    let fx = Fixture::new("deleted", 2).await;
    fx.produce(0..10, 2).await;
    let factory = fx.factory(|c| c.missing_topic_timeout = Duration::from_secs(3));
    let mut sources = subtasks(&factory, 1, None).await;
    read(&mut sources, 10).await;
    // The topic may go missing from the metadata before the deletion is
    // confirmed: the timeout runs from the request on.
    let deleted = Instant::now();
    fx.admin.delete_topic(&fx.topic).await.expect("delete the topic");
    let mut seen_missing = false;
    let deadline = deleted + Duration::from_secs(60);
    let error = loop {
        assert!(
            Instant::now() < deadline,
            "the source kept waiting for the deleted topic"
        );
        seen_missing |= !factory.metrics().missing_topics.is_empty();
        if let Err(error) = sources[0].poll(50).await {
            break error;
        }
    };
    assert!(
        deleted.elapsed() >= Duration::from_secs(3),
        "not before the timeout: {:?}",
        deleted.elapsed()
    );
    assert!(seen_missing, "the metric said the topic was missing while it waited");
    assert!(!error.is_retriable(), "{error}");
    let message = error.to_string();
    for part in ["missing", "missing_topic_timeout", fx.topic.as_str()] {
        assert!(message.contains(part), "`{part}` missing from {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_time_past_the_end_passes_over_older_records_until_one_at_or_after_it_even_across_a_restore() {
    let fx = Fixture::new("time-past-end", 1).await;
    let base = 1_700_000_000_000i64;
    let at = |i: usize, ts: i64| ProduceRecord::new(format!("v-{i}")).to_partition(0).at(ts);
    fx.admin
        .produce(&fx.topic, (0..5).map(|i| at(i, base + i as i64)))
        .await
        .expect("produce");
    let start = base + 100_000;
    let factory = fx.factory(|c| c.start = StartPosition::Timestamp(start));
    let mut sources = subtasks(&factory, 1, None).await;
    // Older records written after the start: passed over.
    fx.admin
        .produce(&fx.topic, (5..8).map(|i| at(i, base + 50_000)))
        .await
        .expect("produce");
    let nothing = read_until_quiet(&mut sources).await;
    assert!(nothing.is_empty(), "records older than the start time: {nothing:?}");
    let taken = positions(&mut sources);
    assert_eq!(
        taken.get(&format!("{}-0@from-ms", fx.topic)),
        Some(start),
        "the start time still waited for is in the positions: {taken:?}"
    );
    drop(sources);

    // A restore from those positions keeps waiting for it.
    let mut sources = subtasks(&factory, 1, Some(&taken)).await;
    fx.admin
        .produce(
            &fx.topic,
            [at(8, base + 60_000), at(9, start + 1), at(10, base + 70_000)],
        )
        .await
        .expect("produce");
    let read = read(&mut sources, 2).await;
    assert_eq!(
        values(&read),
        ["v-10", "v-9"],
        "from the first record at or after the time on, everything (offsets-for-times)"
    );
    let now = positions(&mut sources);
    assert!(now.get(&format!("{}-0@from-ms", fx.topic)).is_none(), "{now:?}");
}

/// Polls for a while and returns what came.
async fn read_until_quiet(sources: &mut [Box<dyn Source>]) -> Vec<Record> {
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let mut round = Vec::new();
        poll_all(sources, 50, &mut round).await;
        out.extend(round.into_iter().map(|(_, r)| r));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_and_null_header_values_stay_null_and_empty_ones_stay_empty() {
    let fx = Fixture::new("nulls", 1).await;
    let records = [
        ProduceRecord::tombstone().with_key("gone").to_partition(0),
        ProduceRecord::new("")
            .with_key("empty")
            .with_null_header("n")
            .with_header("e", "")
            .to_partition(0),
    ];
    fx.admin.produce(&fx.topic, records).await.expect("produce");
    let mut sources = subtasks(&fx.factory(|_| {}), 1, None).await;
    let read = read(&mut sources, 2).await;
    let by_key = |k: &str| read.iter().find(|r| r.key.as_deref() == Some(k.as_bytes())).expect(k);
    assert_eq!(by_key("gone").value, None, "a tombstone's value is null");
    let empty = by_key("empty");
    assert_eq!(empty.value.as_deref(), Some(&b""[..]), "an empty value is not null");
    assert_eq!(
        empty.headers,
        vec![("n".to_string(), None), ("e".to_string(), Some(Vec::new()))]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_topics_are_read_each_once_spread_over_the_subtasks_and_resumed_where_they_were() {
    init_tracing();
    let broker = KafkaBroker::shared().expect("the shared Kafka broker");
    let admin = KafkaAdmin::new(broker.bootstrap());
    let base = unique("many");
    let topics: Vec<String> = (0..3).map(|i| format!("{base}-t{i}")).collect();
    for (i, topic) in topics.iter().enumerate() {
        admin.create_topic(topic, i as i32 + 1).await.expect("create");
        let records = (0..30).map(|n| ProduceRecord::new(format!("{topic}:{n}")).to_partition(n % (i as i32 + 1)));
        admin.produce(topic, records).await.expect("produce");
    }
    let mut config = KafkaSourceConfig::new(broker.bootstrap(), "");
    config.topics = topics.clone();
    config.startup_timeout = Duration::from_secs(10);
    let factory = KafkaSourceFactory::new("test", config).expect("valid");
    let mut sources = subtasks(&factory, 2, None).await;
    let taken_by = read_from(&mut sources, 90).await;
    let by_subtask: BTreeSet<usize> = taken_by.iter().map(|(s, _)| *s).collect();
    assert_eq!(by_subtask, [0, 1].into(), "both subtasks read");
    let records: Vec<Record> = taken_by.into_iter().map(|(_, r)| r).collect();
    let mut expected: Vec<String> = topics
        .iter()
        .flat_map(|t| (0..30).map(move |n| format!("{t}:{n}")))
        .collect();
    expected.sort();
    assert_eq!(values(&records), expected, "every record of every topic, once");
    let taken = positions(&mut sources);
    for topic in &topics {
        assert!(
            taken.0.keys().any(|k| k.starts_with(&format!("{topic}@topic-id:"))),
            "{topic}'s id recorded: {taken:?}"
        );
    }
    drop(sources);

    for topic in &topics {
        admin
            .produce(
                topic,
                (30..35).map(|n| ProduceRecord::new(format!("{topic}:{n}")).to_partition(0)),
            )
            .await
            .expect("produce");
    }
    let mut again = subtasks(&factory, 2, Some(&taken)).await;
    let mut expected: Vec<String> = topics
        .iter()
        .flat_map(|t| (30..35).map(move |n| format!("{t}:{n}")))
        .collect();
    expected.sort();
    assert_eq!(values(&read(&mut again, 15).await), expected, "resumed where each was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_regex_reads_matching_topics_and_picks_up_one_created_while_running_from_its_beginning() {
    init_tracing();
    let broker = KafkaBroker::shared().expect("the shared Kafka broker");
    let admin = KafkaAdmin::new(broker.bootstrap());
    let base = unique("rx");
    for topic in [format!("{base}-a"), format!("{base}-b"), format!("{base}x-other")] {
        admin.create_topic(&topic, 2).await.expect("create");
        let records = (0..10).map(|n| ProduceRecord::new(format!("{topic}:{n}")).to_partition(n % 2));
        admin.produce(&topic, records).await.expect("produce");
    }
    let mut config = KafkaSourceConfig::new(broker.bootstrap(), "");
    config.topic_regex = Some(format!("{base}-.*"));
    config.startup_timeout = Duration::from_secs(10);
    config.partition_discovery_interval = Duration::from_millis(300);
    let factory = KafkaSourceFactory::new("test", config).expect("valid");
    let mut sources = subtasks(&factory, 2, None).await;
    let first = read(&mut sources, 20).await;
    let mut expected: Vec<String> = ["a", "b"]
        .iter()
        .flat_map(|t| {
            let base = base.clone();
            (0..10).map(move |n| format!("{base}-{t}:{n}"))
        })
        .collect();
    expected.sort();
    assert_eq!(values(&first), expected, "the matching topics only");

    // Created and written while the pipeline runs: read from its beginning.
    let late = format!("{base}-c");
    admin.create_topic(&late, 3).await.expect("create");
    admin
        .produce(
            &late,
            (0..12).map(|n| ProduceRecord::new(format!("{late}:{n}")).to_partition(n % 3)),
        )
        .await
        .expect("produce");
    let later = read(&mut sources, 12).await;
    let mut expected: Vec<String> = (0..12).map(|n| format!("{late}:{n}")).collect();
    expected.sort();
    assert_eq!(values(&later), expected, "the new topic, whole, once");
    let taken = positions(&mut sources);
    assert!(taken.get(&format!("{late}-2")).is_some(), "{taken:?}");
}
