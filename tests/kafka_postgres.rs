//! Kafka → PostgreSQL end to end, on a real broker (Nisshi from the test kit, or
//! `EXACTLY_KAFKA_BOOTSTRAP`) and a real PostgreSQL (throwaway cluster, or
//! `EXACTLY_DATABASE_URL`), through the `exactly` binary and a pipeline file:
//! SIGKILL at every phase of the two-phase commit, outages of both services,
//! bad input and bad server settings.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_testkit::{KafkaBroker, PostgresServer};

const PARTITIONS: i32 = 4;
const ORDERS: i64 = 4000;

struct Services {
    kafka: KafkaBroker,
    postgres: PostgresServer,
    _broker_dir: tempfile::TempDir,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn order(id: i64) -> ProduceRecord {
    ProduceRecord::new(format!(
        r#"{{"id":{id},"customer":"c{}","amount":{}.{:02},"note":"order number {id}"}}"#,
        id % 97,
        id % 500,
        id % 100
    ))
    .with_key(format!("{id}"))
    .to_partition((id % PARTITIONS as i64) as i32)
}

/// Creates `topic` and produces `values` into it.
fn produce(bootstrap: &str, topic: &str, records: Vec<ProduceRecord>) {
    runtime().block_on(async {
        let admin = KafkaAdmin::new(bootstrap);
        admin.create_topic(topic, PARTITIONS).await.expect("creating the topic");
        admin.produce(topic, records).await.expect("producing");
    });
}

/// Fetches of about ten records: the source then reads the topic in many
/// round trips, so a run spans many checkpoints and the crash points that
/// count checkpoints are reached (with whole-megabyte fetches the sink
/// streams the 4,000 records within the first checkpoint).
const SMALL_FETCHES: &str = "\n[source.kafka.properties]\n\"fetch.max.bytes\" = \"1024\"\n\
                             \"max.partition.fetch.bytes\" = \"1024\"\n\"message.max.bytes\" = \"1000\"\n";

fn pipeline_file(dir: &Path, name: &str, guarantee: &str, s: &Services, topic: &str, table: &str) -> PathBuf {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(
        &file,
        format!(
            "{header}\n{sections}",
            header = pipeline_header(
                name,
                guarantee,
                "strategy = \"fixed\"\ndelay = \"200ms\"\nmax_attempts = 100"
            ),
            sections = exactly::config::orders_sections(s.kafka.bootstrap(), topic, s.postgres.url(), table),
        ) + SMALL_FETCHES,
    )
    .unwrap();
    file
}

struct TableState {
    rows: i64,
    distinct_positions: i64,
    ids: BTreeSet<i64>,
    dead_letters: i64,
}

fn table_state(url: &str, table: &str) -> TableState {
    runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let row = client
            .query_one(
                &format!("SELECT count(*), count(DISTINCT (part, off)) FROM {table}"),
                &[],
            )
            .await
            .unwrap();
        let ids = client
            .query(&format!("SELECT id FROM {table}"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i64>(0))
            .collect();
        let dead_letters = client
            .query_one(&format!("SELECT count(*) FROM {table}_dead_letters"), &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or(0);
        let prepared: i64 = client
            .query_one("SELECT count(*) FROM pg_prepared_xacts", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(prepared, 0, "prepared transactions left behind");
        TableState {
            rows: row.get(0),
            distinct_positions: row.get(1),
            ids,
            dead_letters,
        }
    })
}

/// Rows committed so far (mid-run: prepared transactions may be pending).
fn committed_rows(url: &str, table: &str) -> i64 {
    runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let row = client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap();
        row.get(0)
    })
}

fn assert_exactly_once(state: &TableState, produced: i64, what: &str) {
    let expected: BTreeSet<i64> = (0..produced).collect();
    assert_eq!(
        (state.rows, state.distinct_positions),
        (produced, produced),
        "{what}: rows / distinct (partition, offset)"
    );
    assert_eq!(state.ids, expected, "{what}: the set of ids");
}

/// A broker on Nisshi's SQLite storage: its memory storage answers ListOffsets
/// for the latest offset with the last batch's base offset + 1, which would end a
/// bounded run (`stop_at_end`) early.
fn services() -> Services {
    let broker_dir = tempfile::tempdir().unwrap();
    Services {
        kafka: KafkaBroker::start_persistent(broker_dir.path()).expect("starting the Kafka broker"),
        postgres: PostgresServer::start().expect("starting PostgreSQL"),
        _broker_dir: broker_dir,
    }
}

#[test]
fn kafka_to_postgres_is_exactly_once_under_sigkill_at_every_phase() {
    let s = services();
    let topic = "orders-matrix";
    produce(s.kafka.bootstrap(), topic, (0..ORDERS).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    for (name, points) in TWO_PHASE_CRASH_CASES {
        let config = pipeline_file(dir.path(), name, "exactly-once", &s, topic, name);
        crash_then_finish(&config, points);
        assert_exactly_once(&table_state(s.postgres.url(), name), ORDERS, name);
    }
}

/// The negative control: in at-least-once mode the same crash replays
/// committed rows, and the check sees the duplicates.
#[test]
fn at_least_once_shows_duplicates_after_the_same_crash() {
    let s = services();
    let topic = "orders-alo";
    produce(s.kafka.bootstrap(), topic, (0..ORDERS).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    let config = pipeline_file(dir.path(), "alo", "at-least-once", &s, topic, "alo");
    crash_then_finish(&config, &["coordinator.before_persist:3"]);
    let state = table_state(s.postgres.url(), "alo");
    let expected: BTreeSet<i64> = (0..ORDERS).collect();
    assert_eq!(state.ids, expected, "no loss");
    assert_eq!(state.distinct_positions, ORDERS);
    assert!(state.rows > ORDERS, "duplicates expected, found {} rows", state.rows);
}

fn run_with_outage(name: &str, outage: impl FnOnce(&mut Services)) {
    let mut s = services();
    let orders = 20_000;
    produce(s.kafka.bootstrap(), name, (0..orders).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    let config = pipeline_file(dir.path(), name, "exactly-once", &s, name, name);
    let mut child = spawn(&config);
    std::thread::sleep(Duration::from_millis(1500));
    // The outage must hit a run in progress, or the test proves nothing.
    assert!(child.is_running(), "{name}: the pipeline ended before the outage");
    let before = committed_rows(s.postgres.url(), name);
    assert!(before < orders, "{name}: every row was committed before the outage");
    outage(&mut s);
    let (status, _, log) = wait(child, Duration::from_secs(240));
    assert!(status.success(), "{name}: the pipeline failed:\n{log}");
    assert_exactly_once(&table_state(s.postgres.url(), name), orders, name);
}

#[test]
fn a_postgres_restart_mid_run_is_retried_and_ends_exactly_once() {
    run_with_outage("pg_restart", |s| {
        s.postgres.stop().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        s.postgres.restart().unwrap();
    });
}

#[test]
fn a_frozen_broker_is_waited_for_and_ends_exactly_once() {
    run_with_outage("broker_frozen", |s| {
        let pid = broker_pid(s.kafka.port());
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_secs(4));
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
}

#[test]
fn a_broker_restart_on_durable_storage_is_retried_and_ends_exactly_once() {
    run_with_outage("broker_restart", |s| {
        s.kafka.stop().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        s.kafka.restart().unwrap();
    });
}

/// The pid of the process listening on `port` (the broker), from /proc.
fn broker_pid(port: u16) -> i32 {
    let hex_port = format!(":{port:04X}");
    let inode = std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].ends_with(&hex_port) && f[3] == "0A").then(|| f[9].to_string())
        })
        .expect("the broker's listening socket");
    let needle = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) {
            for fd in fds.flatten() {
                if std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == needle) {
                    return pid;
                }
            }
        }
    }
    panic!("no process owns the broker's socket");
}

#[test]
fn malformed_records_become_counted_dead_letters_and_the_rest_is_delivered() {
    let s = services();
    let topic = "orders-bad";
    let mut records: Vec<ProduceRecord> = (0..200).map(order).collect();
    records.push(ProduceRecord::new("not json at all").to_partition(0));
    records.push(ProduceRecord::new(r#"{"customer":"no id"}"#).to_partition(1));
    records.push(ProduceRecord::new(r#"{"id":"abc"}"#).to_partition(2));
    produce(s.kafka.bootstrap(), topic, records);
    let dir = tempfile::tempdir().unwrap();
    let config = pipeline_file(dir.path(), "bad", "exactly-once", &s, topic, "bad");
    let (status, stdout, log) = wait(spawn(&config), Duration::from_secs(120));
    assert!(status.success(), "{log}");
    let state = table_state(s.postgres.url(), "bad");
    assert_exactly_once(&state, 200, "good records");
    assert_eq!(state.dead_letters, 3);
    assert!(
        stdout.contains("\"dead_letters\":3"),
        "the run reports its dead letters: {stdout}"
    );
}

#[test]
fn max_prepared_transactions_zero_is_refused_with_the_setting_named() {
    let mut s = services();
    runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(s.postgres.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute("ALTER SYSTEM SET max_prepared_transactions = 0")
            .await
            .unwrap();
        client.batch_execute("CHECKPOINT").await.unwrap();
    });
    s.postgres.stop().unwrap();
    s.postgres.restart().unwrap();
    produce(s.kafka.bootstrap(), "orders-mpt", (0..10).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    let config = pipeline_file(dir.path(), "mpt", "exactly-once", &s, "orders-mpt", "mpt");
    let (status, _, log) = wait(spawn(&config), Duration::from_secs(60));
    assert!(!status.success());
    assert!(log.contains("max_prepared_transactions"), "{log}");
    assert!(log.contains("ALTER SYSTEM SET max_prepared_transactions"), "{log}");
}

#[test]
fn sigterm_takes_a_last_checkpoint_commits_it_and_a_restart_continues_exactly() {
    let s = services();
    let topic = "orders-sigterm";
    let orders = 20_000;
    produce(s.kafka.bootstrap(), topic, (0..orders).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    let bounded = pipeline_file(dir.path(), "sigterm", "exactly-once", &s, topic, "sigterm");
    let text = std::fs::read_to_string(&bounded).unwrap();
    let unbounded = dir.path().join("unbounded.toml");
    std::fs::write(&unbounded, text.replace("stop_at_end = true", "stop_at_end = false")).unwrap();
    let child = spawn(&unbounded);
    std::thread::sleep(Duration::from_millis(1500));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (status, _, log) = wait(child, Duration::from_secs(60));
    assert!(status.success(), "SIGTERM must end the run cleanly:\n{log}");
    assert!(log.contains("shutdown requested"), "{log}");
    let state = table_state(s.postgres.url(), "sigterm");
    assert!(state.rows > 0, "the last checkpoint was committed");
    assert_eq!(state.rows, state.distinct_positions);
    let (status, _, log) = wait(spawn(&bounded), Duration::from_secs(120));
    assert!(status.success(), "{log}");
    assert_exactly_once(
        &table_state(s.postgres.url(), "sigterm"),
        orders,
        "after SIGTERM and restart",
    );
}
