//! Kafka → PostgreSQL exactly-once on a three-broker Apache Kafka cluster
//! (KRaft, the test kit's `KafkaCluster`), through the `exactly` binary:
//! what production clusters do to a source — rolling restarts (controlled
//! shutdowns, SIGTERM), preferred and unclean leader elections, a frozen
//! broker, broker crashes, a topic deleted and created again — while a
//! producer keeps writing.
//!
//! The tests share one cluster, lent to one test at a time (each heals it
//! first). Topics have 6 partitions, replication factor 3 and
//! `min.insync.replicas` 2 unless a test needs otherwise. What counts as
//! "exactly once" is judged against what the topic holds, read back with
//! the log-level reader after the run: every record of the topic is one
//! row, with its partition, offset and id, and no row is anything else.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::orders::*;
use common::scrape::{self, Scrape};
use common::*;
use exactly_kafka::wire::WireClient;
use exactly_testkit::kafka::Acks;
use exactly_testkit::{free_port, KafkaCluster, PostgresServer};

/// Partitions of the cluster tests' topics.
const PARTITIONS: i32 = 6;

/// A topic of the cluster tests: [`PARTITIONS`] partitions, 3 replicas,
/// `min.insync.replicas` 2.
fn replicated_topic(cluster: &KafkaCluster, prefix: &str) -> String {
    let topic = fresh(prefix);
    cluster
        .create_topic(&topic, PARTITIONS, 3, &[("min.insync.replicas", "2")])
        .expect("creating a replicated topic");
    topic
}

/// Order `id` as a JSON value.
fn order_value(id: i64) -> Vec<u8> {
    format!(r#"{{"id":{id},"customer":"c{}","amount":{}}}"#, id % 97, id % 500).into_bytes()
}

/// Writes orders into every partition of a topic from a thread and a
/// producer per partition (librdkafka, idempotent, `acks=all`), about
/// `per_second` orders a second in all: a partition whose leader is frozen
/// or gone holds up only its own writer. Order ids are
/// `n * PARTITIONS + partition`. The topic, read back afterwards, is the
/// truth of what was written.
struct PacedFeed {
    stop: Arc<AtomicBool>,
    written: Arc<Vec<AtomicU64>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl PacedFeed {
    fn start(bootstrap: &str, topic: &str, per_second: u64) -> PacedFeed {
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let stop = Arc::new(AtomicBool::new(false));
        let written: Arc<Vec<AtomicU64>> = Arc::new((0..PARTITIONS).map(|_| AtomicU64::new(0)).collect());
        let pause = Duration::from_secs_f64(PARTITIONS as f64 * 10.0 / per_second as f64);
        let threads = (0..PARTITIONS)
            .map(|partition| {
                let (stop, written, topic) = (stop.clone(), written.clone(), topic.to_string());
                let producer: FutureProducer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", bootstrap)
                    .set("enable.idempotence", "true")
                    .set("acks", "all")
                    .set("linger.ms", "5")
                    .set("message.timeout.ms", "300000")
                    .create()
                    .expect("a producer of the feed");
                std::thread::spawn(move || {
                    current_thread_runtime().block_on(async {
                        let mut n: i64 = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let mut deliveries = Vec::new();
                            for k in 0..10 {
                                let value = order_value((n + k) * PARTITIONS as i64 + partition as i64);
                                let record = FutureRecord::<(), _>::to(&topic).payload(&value).partition(partition);
                                let queued = producer.send_result(record).map_err(|(e, _)| e);
                                deliveries.push(queued.expect("queueing an order of the feed"));
                            }
                            for delivery in deliveries {
                                match delivery.await.expect("the feed's producer is alive") {
                                    Ok(_) => {
                                        written[partition as usize].fetch_add(1, Ordering::Relaxed);
                                    }
                                    Err((error, _)) => eprintln!("feed {topic}/{partition}: {error}"),
                                }
                            }
                            n += 10;
                            tokio::time::sleep(pause).await;
                        }
                    })
                })
            })
            .collect();
        PacedFeed { stop, written, threads }
    }

    /// Orders acknowledged so far, by partition.
    fn written(&self) -> Vec<u64> {
        self.written.iter().map(|w| w.load(Ordering::Relaxed)).collect()
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("a feed thread");
        }
    }
}

/// Every record of `topic`, read back with the log-level reader: partition
/// and offset → order id.
fn topic_contents(bootstrap: &str, topic: &str) -> BTreeMap<(i32, i64), i64> {
    current_thread_runtime().block_on(async {
        let read = WireClient::new(bootstrap)
            .expect("bootstrap")
            .read_topic_settled(topic, Duration::from_secs(30))
            .await
            .expect("reading the topic back");
        read.records
            .iter()
            .map(|r| {
                let value: serde_json::Value =
                    serde_json::from_slice(r.value.as_deref().expect("orders have values")).expect("JSON");
                ((r.partition, r.offset), value["id"].as_i64().expect("an id"))
            })
            .collect()
    })
}

/// The rows of `table`: (partition, offset, id), in no order.
fn table_rows(url: &str, table: &str) -> Vec<(i32, i64, i64)> {
    with_postgres(url, async |db| {
        db.query(&format!("SELECT part, off, id FROM {table}"), &[])
            .await
            .expect("reading the table")
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    })
}

/// Asserts that `table` holds every record of `topic` exactly once, and
/// nothing else, and that `pipeline` left no prepared transaction.
fn assert_exactly_the_topic(url: &str, table: &str, pipeline: &str, expected: &BTreeMap<(i32, i64), i64>, what: &str) {
    let rows = table_rows(url, table);
    let mut seen: BTreeMap<(i32, i64), i64> = BTreeMap::new();
    let mut duplicates = Vec::new();
    for (part, off, id) in &rows {
        if seen.insert((*part, *off), *id).is_some() {
            duplicates.push((*part, *off));
        }
    }
    let missing: Vec<_> = expected.keys().filter(|k| !seen.contains_key(k)).take(10).collect();
    let extra: Vec<_> = seen.keys().filter(|k| !expected.contains_key(k)).take(10).collect();
    assert!(
        duplicates.is_empty() && missing.is_empty() && extra.is_empty(),
        "{what}: {} rows for {} records; duplicates {:?}, missing {missing:?}, not in the topic {extra:?}",
        rows.len(),
        expected.len(),
        &duplicates[..duplicates.len().min(10)]
    );
    let wrong: Vec<_> = seen
        .iter()
        .filter(|(k, id)| expected.get(k) != Some(id))
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: rows whose id differs from the record's: {wrong:?}"
    );
    assert_eq!(
        prepared_of_pipeline(url, pipeline),
        Vec::<String>::new(),
        "{what}: prepared transactions left behind"
    );
}

/// Ends a run with SIGTERM (a last checkpoint, its commits) and checks it
/// ended cleanly.
fn stop_run(run: Background) -> String {
    // SAFETY: signalling a child of this process by its pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let (status, _, log) = wait(run, Duration::from_secs(120));
    assert!(
        status.success(),
        "SIGTERM must end the run cleanly; it ended with {status}:\n{log}"
    );
    log
}

/// Waits (at most `timeout`) until the table holds every record of the
/// topic: the rows counted reach what the topic holds, read back.
fn wait_for_the_topic(url: &str, table: &str, bootstrap: &str, topic: &str, run: &mut Background, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let expected = topic_contents(bootstrap, topic).len() as i64;
        let committed = committed_orders(url, table);
        if committed >= expected {
            return;
        }
        assert!(run.is_running(), "the pipeline stopped before reading the topic");
        assert!(
            Instant::now() < deadline,
            "{table}: {committed} of {expected} records committed after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A pipeline of `topic` into `table` at parallelism 2, reading the topic
/// as it grows, checkpoints every 200 ms.
fn cluster_pipeline(
    dir: &Path,
    name: &str,
    bootstrap: &str,
    topic: &str,
    url: &str,
    table: &str,
) -> std::path::PathBuf {
    orders_pipeline(
        dir,
        &format!("{name}.toml"),
        name,
        2,
        "checkpoints",
        "200ms",
        (bootstrap, topic),
        (url, table),
        false,
    )
}

/// Starts the pipeline of `config` with its metrics served on a free
/// port; the run and the endpoint's base URL.
fn spawn_observed(config: &Path) -> (Background, String) {
    let port = free_port().expect("a free port");
    let listen = format!("127.0.0.1:{port}");
    let run = spawn_with(config, &["--metrics-listen", &listen], &[]);
    (run, format!("http://{listen}"))
}

/// The broker each partition of `topic` is fetched from now, as the
/// source's own metric says.
fn fetched_from(base: &str, topic: &str) -> BTreeMap<i32, i32> {
    let scrape = Scrape::take(base);
    scrape
        .series("exactly_kafka_source_fetch_broker")
        .into_iter()
        .filter(|s| s.labels.get("topic") == Some(topic))
        .filter_map(|s| {
            let partition = s.labels.get("partition")?.parse().ok()?;
            let node = match s.value {
                prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v as i32,
                _ => return None,
            };
            Some((partition, node))
        })
        .collect()
}

#[test]
fn a_rolling_restart_and_a_preferred_election_end_exact_and_every_partition_is_fetched_from_its_leader() {
    let mut cluster = KafkaCluster::shared().expect("the shared Kafka cluster");
    let postgres = PostgresServer::start().expect("PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let (name, table) = (fresh("rolling"), fresh("rolling_orders"));
    let topic = replicated_topic(&cluster, "rolling");
    let bootstrap = cluster.bootstrap();
    let config = cluster_pipeline(dir.path(), &name, &bootstrap, &topic, postgres.url(), &table);
    let feed = PacedFeed::start(&bootstrap, &topic, 400);
    let (mut run, base) = spawn_observed(&config);
    wait_for_orders(postgres.url(), &table, &mut run, 200, Duration::from_secs(120)).expect("the pipeline runs");

    for node in cluster.node_ids() {
        let before = committed_orders(postgres.url(), &table);
        cluster.roll_broker(node).expect("a controlled restart of a broker");
        // Orders keep flowing into the table before the next broker goes.
        wait_for_orders(postgres.url(), &table, &mut run, before + 100, Duration::from_secs(120))
            .unwrap_or_else(|| panic!("the pipeline stopped while broker {node} restarted"));
    }
    cluster
        .elect_preferred_leaders(&topic)
        .expect("a preferred-leader election");
    let leaders: BTreeMap<i32, i32> = cluster
        .leaders(&topic)
        .expect("the partitions' leaders")
        .into_iter()
        .map(|(p, l)| (p, l.expect("a leader after the election")))
        .collect();
    // The source follows the election: the old leaders refuse its Fetches
    // (a fenced leader epoch) and it reads the metadata again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let from = fetched_from(&base, &topic);
        if from == leaders {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "partitions still fetched from other brokers than their leaders 60 s after the election: fetched from \
             {from:?}, leaders {leaders:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let leader_changes = Scrape::take(&base).value("exactly_kafka_source_leader_changes_total");
    assert!(leader_changes >= 1.0, "the source counted the leaders it followed");

    feed.stop();
    wait_for_the_topic(
        postgres.url(),
        &table,
        &bootstrap,
        &topic,
        &mut run,
        Duration::from_secs(180),
    );
    stop_run(run);
    let expected = topic_contents(&bootstrap, &topic);
    assert!(expected.len() > 1000, "the feed wrote {} records", expected.len());
    assert_exactly_the_topic(postgres.url(), &table, &name, &expected, "after a rolling restart");
}

#[test]
fn a_frozen_broker_holds_up_only_its_own_partitions_and_all_is_exact_after_the_thaw() {
    let mut cluster = KafkaCluster::shared().expect("the shared Kafka cluster");
    let postgres = PostgresServer::start().expect("PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let (name, table) = (fresh("frozen"), fresh("frozen_orders"));
    let topic = replicated_topic(&cluster, "frozen");
    let bootstrap = cluster.bootstrap();
    let config = cluster_pipeline(dir.path(), &name, &bootstrap, &topic, postgres.url(), &table);
    let feed = PacedFeed::start(&bootstrap, &topic, 400);
    let (mut run, _base) = spawn_observed(&config);
    wait_for_orders(postgres.url(), &table, &mut run, 200, Duration::from_secs(120)).expect("the pipeline runs");

    // Freeze the broker that leads partition 0; the partitions the others
    // lead must keep flowing.
    let leaders = cluster.leaders(&topic).expect("leaders");
    let frozen = leaders[&0].expect("partition 0 has a leader");
    let healthy: BTreeSet<i32> = leaders
        .iter()
        .filter(|(_, l)| **l != Some(frozen))
        .map(|(p, _)| *p)
        .collect();
    assert!(
        !healthy.is_empty(),
        "some partition is led by another broker: {leaders:?}"
    );
    cluster.freeze_broker(frozen).expect("freezing a broker");
    let frozen_at = Instant::now();
    let per_partition = |url: &str| -> BTreeMap<i32, i64> {
        with_postgres(url, async |db| {
            db.query(&format!("SELECT part, count(*) FROM {table} GROUP BY part"), &[])
                .await
                .expect("counting per partition")
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()
        })
    };
    // The longest time a healthy partition had records written but nothing
    // new committed.
    let mut last: BTreeMap<i32, (i64, Instant)> = BTreeMap::new();
    let mut longest = Duration::ZERO;
    while frozen_at.elapsed() < Duration::from_secs(60) {
        let written = feed.written();
        let now = Instant::now();
        let counts = per_partition(postgres.url());
        for p in &healthy {
            let committed = counts.get(p).copied().unwrap_or(0);
            let entry = last.entry(*p).or_insert((committed, now));
            if committed > entry.0 || committed as u64 >= written[*p as usize] {
                *entry = (committed, now);
            } else {
                longest = longest.max(now.duration_since(entry.1));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("[frozen broker] the longest gap of a healthy partition while broker {frozen} was frozen: {longest:?}");
    assert!(
        longest < Duration::from_secs(5),
        "healthy partitions {healthy:?} stalled for {longest:?} while broker {frozen} was frozen"
    );
    cluster.thaw_broker(frozen).expect("thawing the broker");
    feed.stop();
    wait_for_the_topic(
        postgres.url(),
        &table,
        &bootstrap,
        &topic,
        &mut run,
        Duration::from_secs(180),
    );
    stop_run(run);
    let expected = topic_contents(&bootstrap, &topic);
    assert_exactly_the_topic(postgres.url(), &table, &name, &expected, "after a frozen broker");
}

#[test]
fn pipeline_kills_mixed_with_a_broker_crash_and_restart_end_exact() {
    let mut cluster = KafkaCluster::shared().expect("the shared Kafka cluster");
    let postgres = PostgresServer::start().expect("PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let (name, table) = (fresh("brokerkill"), fresh("brokerkill_orders"));
    let topic = replicated_topic(&cluster, "brokerkill");
    let bootstrap = cluster.bootstrap();
    let config = cluster_pipeline(dir.path(), &name, &bootstrap, &topic, postgres.url(), &table);
    let feed = PacedFeed::start(&bootstrap, &topic, 400);
    let timeout = Duration::from_secs(180);

    run_killed_within(&config, "sink.after_pre_commit:3", &[], timeout);
    let victim = cluster.leaders(&topic).expect("leaders")[&1].expect("a leader");
    cluster.kill_broker(victim);
    run_killed_within(&config, "coordinator.after_persist_pending:2", &[], timeout);
    cluster.start_broker(victim).expect("starting the broker again");
    run_killed_within(&config, "recovery.after_commit:1", &[], timeout);

    feed.stop();
    let (mut run, _) = spawn_observed(&config);
    wait_for_the_topic(postgres.url(), &table, &bootstrap, &topic, &mut run, timeout);
    stop_run(run);
    let expected = topic_contents(&bootstrap, &topic);
    assert_exactly_the_topic(
        postgres.url(),
        &table,
        &name,
        &expected,
        "after pipeline and broker kills",
    );
}

/// Writes order ids `ids` to partition 0 of `topic`.
fn write_orders(cluster: &KafkaCluster, topic: &str, ids: std::ops::Range<i64>, acks: Acks) {
    let values: Vec<Vec<u8>> = ids.map(order_value).collect();
    for chunk in values.chunks(50) {
        let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
        cluster.produce(topic, 0, &refs, acks).expect("writing orders");
    }
}

/// `table` holds exactly the ids `expected` (ascending), each in one row,
/// and the pipeline left no prepared transaction.
fn assert_ids_once(url: &str, table: &str, pipeline: &str, expected: impl IntoIterator<Item = i64>, what: &str) {
    let ids = ids_in(url, table);
    let expected: Vec<i64> = expected.into_iter().collect();
    assert_eq!(ids.keys().copied().collect::<Vec<_>>(), expected, "{what}");
    assert!(ids.values().all(|n| *n == 1), "{what}: each once: {ids:?}");
    assert!(
        prepared_of_pipeline(url, pipeline).is_empty(),
        "{what}: prepared transactions left behind"
    );
}

/// The ids in `table`, each with how many rows hold it.
fn ids_in(url: &str, table: &str) -> BTreeMap<i64, usize> {
    let mut ids = BTreeMap::new();
    for (_, _, id) in table_rows(url, table) {
        *ids.entry(id).or_default() += 1;
    }
    ids
}

#[test]
fn an_unclean_election_that_truncates_below_the_position_stops_the_pipeline_and_the_opt_in_resumes_and_counts() {
    let mut cluster = KafkaCluster::shared().expect("the shared Kafka cluster");
    let postgres = PostgresServer::start().expect("PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let (name, table) = (fresh("unclean"), fresh("unclean_orders"));
    let topic = fresh("unclean");
    cluster
        .create_topic_with_assignment(
            &topic,
            &[vec![1, 2]],
            &[("min.insync.replicas", "1"), ("unclean.leader.election.enable", "true")],
        )
        .expect("a topic of one partition on brokers 1 and 2");
    let bootstrap = cluster.bootstrap();
    let url = postgres.url();
    let config = cluster_pipeline(dir.path(), &name, &bootstrap, &topic, url, &table);
    write_orders(&cluster, &topic, 0..100, Acks::All);
    let mut live = spawn(&config);
    wait_for_orders(url, &table, &mut live, 100, Duration::from_secs(120)).expect("the pipeline runs");

    // Orders 100..200 reach broker 1 alone; the pipeline reads and commits
    // them: its position passes offset 200 at broker 1's leader epoch.
    let lone = cluster.isolate_leader(&topic, 0).expect("isolating the leader");
    let read_epoch = cluster.leader_epochs(&topic).expect("the leader epochs")[&0];
    write_orders(&cluster, &topic, 100..200, Acks::Leader);
    wait_for_orders(url, &table, &mut live, 200, Duration::from_secs(120)).expect("the pipeline read them");
    // The unclean election: broker 2, which never had them, leads; broker 1
    // truncates to it. The running pipeline must notice and stop.
    let election = cluster.replace_lone_leader(lone).expect("the unclean election");
    assert!(
        election.end_offset_after < 200,
        "the log was truncated below the position: {election:?}"
    );
    let (status, _, log) = wait(live, Duration::from_secs(120));
    let plain = strip_ansi(&log);
    assert!(
        !status.success(),
        "a truncation below the position must stop the pipeline:\n{log}"
    );
    for part in [
        format!("{topic}/0"),
        "truncated below the position".to_string(),
        format!("the position is offset 200 after a record of leader epoch {read_epoch}"),
        format!("diverges at offset {}", election.end_offset_after),
        "on_log_truncation".to_string(),
    ] {
        assert!(plain.contains(&part), "`{part}` missing from the error:\n{plain}");
    }

    // New orders pass the old position: they take the offsets the lost ones
    // had. A restart still refuses — nothing is skipped silently.
    write_orders(&cluster, &topic, 1000..1200, Acks::All);
    let (status, log) = run(&config, None, &[]);
    assert!(!status.success(), "a restart must refuse the truncated log too:\n{log}");
    assert!(strip_ansi(&log).contains("truncated below the position"), "{log}");
    let before = ids_in(url, &table);
    assert!(
        before.keys().all(|id| *id < 1000),
        "no new record was written while refusing: {before:?}"
    );

    // The opt-in reads on at the divergence and counts what is gone.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("[source.kafka]\n", "[source.kafka]\non_log_truncation = \"resume\"\n"),
    )
    .unwrap();
    let (mut resumed, base) = spawn_observed(&config);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ids_in(url, &table).contains_key(&1199) {
        assert!(resumed.is_running(), "the resumed pipeline stopped");
        assert!(Instant::now() < deadline, "the new orders never arrived");
        std::thread::sleep(Duration::from_millis(250));
    }
    let lost = Scrape::take(&base).value("exactly_kafka_source_truncated_offsets_total");
    assert_eq!(
        lost,
        (200 - election.end_offset_after) as f64,
        "the offsets read that no longer exist are counted"
    );
    let resumed_log = strip_ansi(&stop_run(resumed));
    assert!(
        resumed_log.contains("reading on at the divergence"),
        "the opt-in says in its log that it read on at the divergence:\n{resumed_log}"
    );
    assert_ids_once(url, &table, &name, (0..200).chain(1000..1200), "every order read");
}

/// `config` with `keys` added to its `[source.kafka]` section, as a new
/// file beside it named `<stem>-<tag>.toml`.
fn with_source_keys(config: &Path, tag: &str, keys: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(config).unwrap();
    assert!(text.contains("[source.kafka]\n"), "{text}");
    let stem = config.file_stem().unwrap().to_string_lossy();
    let file = config.with_file_name(format!("{stem}-{tag}.toml"));
    std::fs::write(
        &file,
        text.replace("[source.kafka]\n", &format!("[source.kafka]\n{keys}\n")),
    )
    .unwrap();
    file
}

/// The topic's id on the cluster.
fn topic_id(cluster: &KafkaCluster, topic: &str) -> String {
    cluster.topic(topic).expect("the topic's metadata").topic_id
}

/// How long after `missing_topic_timeout` a run without its topic may take
/// to stop: the source sees the topic gone at its next Fetch or metadata
/// refresh, then the runtime stops (aborting the open interval). Generous
/// for two loaded cores; what matters is that the stop comes, not a silent
/// endless retry.
const MISSING_TOPIC_MARGIN: Duration = Duration::from_secs(30);

#[test]
fn a_topic_deleted_or_recreated_on_the_cluster_stops_the_pipeline_within_its_bound_and_is_never_read_silently() {
    let mut cluster = KafkaCluster::shared().expect("the shared Kafka cluster");
    let postgres = PostgresServer::start().expect("PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let (name, table) = (fresh("recreated"), fresh("recreated_orders"));
    let topic = replicated_topic(&cluster, "recreated");
    let bootstrap = cluster.bootstrap();
    let url = postgres.url();
    let timeout = Duration::from_secs(10);
    let config = with_source_keys(
        &cluster_pipeline(dir.path(), &name, &bootstrap, &topic, url, &table),
        "missing",
        &format!("missing_topic_timeout = \"{}s\"", timeout.as_secs()),
    );
    write_orders(&cluster, &topic, 0..300, Acks::All);
    let old_id = topic_id(&cluster, &topic);
    let (mut live, base) = spawn_observed(&config);
    wait_for_orders(url, &table, &mut live, 300, Duration::from_secs(120)).expect("the pipeline runs");

    // Deleted while the pipeline runs: while it waits for the topic,
    // readiness fails naming it and the gauge says so; it stops once
    // missing_topic_timeout has passed, within the margin.
    // The clock starts before the deletion is asked for: the source may see
    // the topic gone before every broker's Metadata has dropped it.
    let deleted = Instant::now();
    cluster.delete_topic(&topic).expect("deleting the topic");
    let mut seen_unready = None;
    while live.is_running() {
        if seen_unready.is_none() {
            if let Some((503, body)) = scrape::get(&format!("{base}/health/ready")) {
                // The run may end between the two answers: then try again
                // (it waits missing_topic_timeout in this state).
                let gauge = scrape::get(&format!("{base}/metrics")).and_then(|(_, text)| {
                    text.lines()
                        .find(|l| l.starts_with("exactly_kafka_source_topic_missing"))
                        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                });
                if let (true, Some(gauge)) = (body.contains(&topic) && body.contains("missing"), gauge) {
                    seen_unready = Some((deleted.elapsed(), body, gauge));
                }
            }
        }
        assert!(
            deleted.elapsed() < timeout + MISSING_TOPIC_MARGIN,
            "the run without its topic still runs {:?} after the deletion (missing_topic_timeout {timeout:?})",
            deleted.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let stopped_after = deleted.elapsed();
    let (status, _, log) = wait(live, Duration::from_secs(30));
    let plain = strip_ansi(&log);
    assert!(!status.success(), "the run went on without its topic:\n{log}");
    assert!(
        stopped_after >= timeout,
        "it stopped before missing_topic_timeout: after {stopped_after:?}"
    );
    let (unready_at, body, gauge) =
        seen_unready.expect("/health/ready never failed naming the missing topic while the run waited for it");
    assert_eq!(
        gauge, 1.0,
        "exactly_kafka_source_topic_missing while the topic is missing"
    );
    println!("[deleted topic] unready {unready_at:?} after the deletion ({body}); stopped after {stopped_after:?}");
    for part in ["missing from the metadata", "missing_topic_timeout", topic.as_str()] {
        assert!(plain.contains(part), "`{part}` missing from:\n{plain}");
    }
    assert_ids_once(url, &table, &name, 0..300, "what was read before the deletion");

    // Created again while the pipeline is stopped: refused, naming both
    // ids and the opt-in; nothing of the new topic is written.
    cluster
        .create_topic(&topic, PARTITIONS, 3, &[("min.insync.replicas", "2")])
        .expect("creating the topic again");
    write_orders(&cluster, &topic, 1000..1100, Acks::All);
    let new_id = topic_id(&cluster, &topic);
    assert_ne!(old_id, new_id);
    let (status, log) = run(&config, None, &[]);
    let plain = strip_ansi(&log);
    assert!(
        !status.success(),
        "a run on the recreated topic was not refused:\n{log}"
    );
    for part in [
        old_id.as_str(),
        new_id.as_str(),
        "deleted and created again",
        &format!("accept_topic_id = \"{new_id}\""),
    ] {
        assert!(plain.contains(part), "`{part}` missing from:\n{plain}");
    }
    assert!(
        ids_in(url, &table).keys().all(|id| *id < 1000),
        "the refused run wrote nothing"
    );

    // With the opt-in the new topic is read from its beginning, once; then
    // it is recreated again while that run reads it: the run stops naming
    // both ids, within the margin.
    let accepted = with_source_keys(&config, "accepted", &format!("accept_topic_id = \"{new_id}\""));
    let mut live = spawn(&accepted);
    wait_for_orders(url, &table, &mut live, 400, Duration::from_secs(120)).expect("the new topic is read");
    cluster.delete_topic(&topic).expect("deleting the topic again");
    cluster
        .create_topic(&topic, PARTITIONS, 3, &[("min.insync.replicas", "2")])
        .expect("creating the topic a third time");
    let recreated = Instant::now();
    write_orders(&cluster, &topic, 2000..2100, Acks::All);
    let third_id = topic_id(&cluster, &topic);
    let (status, _, log) = wait(live, timeout + MISSING_TOPIC_MARGIN);
    let plain = strip_ansi(&log);
    assert!(!status.success(), "the run went on reading a recreated topic:\n{log}");
    println!(
        "[recreated topic] stopped {:?} after the topic was created again",
        recreated.elapsed()
    );
    for part in [
        new_id.as_str(),
        third_id.as_str(),
        "deleted and created again",
        "accept_topic_id",
    ] {
        assert!(plain.contains(part), "`{part}` missing from:\n{plain}");
    }
    assert_ids_once(
        url,
        &table,
        &name,
        (0..300).chain(1000..1100),
        "nothing of the third topic is written",
    );
    cluster.heal().expect("healing the cluster");
}
