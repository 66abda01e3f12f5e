//! Kafka → PostgreSQL end to end, on Apache Kafka and a real PostgreSQL,
//! through the `exactly` binary and a pipeline file: SIGKILL at every phase of
//! the two-phase commit, outages of both services, bad input and bad server
//! settings.
//!
//! Tests that leave the services alone use the broker exactly-testkit shares
//! among the tests of this binary (or the Kafka of `EXACTLY_KAFKA_BOOTSTRAP`)
//! and a throwaway PostgreSQL (or the server of `EXACTLY_DATABASE_URL`). A
//! test that stops, restarts, freezes or reconfigures a service starts its
//! own, whatever the variables say.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_testkit::{KafkaBroker, PostgresServer};

const PARTITIONS: i32 = 4;
const ORDERS: i64 = 4000;

/// The services of a test.
struct Services {
    kafka: Broker,
    postgres: PostgresServer,
}

/// The shared broker, or one of the test's own.
enum Broker {
    Shared(&'static KafkaBroker),
    Own(Box<KafkaBroker>),
}

/// Which service a test disturbs (stops, restarts, freezes, reconfigures),
/// and so starts of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Disturbs {
    Nothing,
    Kafka,
    Postgres,
}

impl Services {
    fn start(disturbs: Disturbs) -> Services {
        let kafka = if disturbs == Disturbs::Kafka {
            Broker::Own(Box::new(KafkaBroker::start().expect("starting a Kafka broker")))
        } else {
            Broker::Shared(KafkaBroker::shared().expect("starting the shared Kafka broker"))
        };
        let postgres = if disturbs == Disturbs::Postgres {
            PostgresServer::start_own()
        } else {
            PostgresServer::start()
        };
        Services {
            kafka,
            postgres: postgres.expect("starting PostgreSQL"),
        }
    }

    fn bootstrap(&self) -> &str {
        match &self.kafka {
            Broker::Shared(broker) => broker.bootstrap(),
            Broker::Own(broker) => broker.bootstrap(),
        }
    }

    /// The broker of the test's own.
    fn own_kafka(&mut self) -> &mut KafkaBroker {
        match &mut self.kafka {
            Broker::Own(broker) => broker,
            Broker::Shared(_) => panic!("the shared broker cannot be disturbed; start with Disturbs::Kafka"),
        }
    }
}

/// A topic or table name no other test (or earlier run against external
/// services) uses: lower case, a valid SQL identifier.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().subsec_nanos();
    format!("{name}_{}_{nanos}", std::process::id())
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

/// Records per batch of the input; see [`PACED_FETCHES`].
const INPUT_BATCH: &str = "10";

/// Creates `topic` and produces `values` into it, [`INPUT_BATCH`] records
/// per batch.
fn produce(bootstrap: &str, topic: &str, records: Vec<ProduceRecord>) {
    runtime().block_on(async {
        let admin = KafkaAdmin::new(bootstrap).with_property("batch.num.messages", INPUT_BATCH);
        admin.create_topic(topic, PARTITIONS).await.expect("creating the topic");
        admin.produce(topic, records).await.expect("producing");
    });
}

/// The source reads at a steady pace whatever the machine's speed, so a
/// run spans many checkpoints (the crash points that count checkpoints are
/// reached) and an outage hits a run in progress: a Fetch answer holds at
/// most 1 KiB, which is one input batch (Kafka sends a whole first batch
/// even when it is larger), and asks for more bytes than that
/// (`fetch.min.bytes`), so the broker holds every Fetch for
/// `fetch.wait.max.ms`: about ten records per 10 ms and subtask. Read at
/// full speed, all 4,000 orders of a test reach the sink within the first
/// checkpoint interval.
const PACED_FETCHES: &str = "\n[source.kafka.properties]\n\"fetch.max.bytes\" = \"1024\"\n\
                             \"max.partition.fetch.bytes\" = \"1024\"\n\"message.max.bytes\" = \"1000\"\n\
                             \"fetch.min.bytes\" = \"1048576\"\n\"fetch.wait.max.ms\" = \"10\"\n";

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
            sections = exactly::config::orders_sections(s.bootstrap(), topic, s.postgres.url(), table),
        ) + PACED_FETCHES,
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
/// 0 while the sink has not created the table yet.
fn committed_rows(url: &str, table: &str) -> i64 {
    runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        match client.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await {
            Ok(row) => row.get(0),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => 0,
            Err(e) => panic!("counting the rows of {table}: {e}"),
        }
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

#[test]
fn kafka_to_postgres_is_exactly_once_under_sigkill_at_every_phase() {
    let s = Services::start(Disturbs::Nothing);
    let topic = unique("orders_matrix");
    produce(s.bootstrap(), &topic, (0..ORDERS).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    for (i, (name, points)) in TWO_PHASE_CRASH_CASES.iter().enumerate() {
        let table = unique(&format!("matrix{i}"));
        let config = pipeline_file(dir.path(), name, "exactly-once", &s, &topic, &table);
        crash_then_finish(&config, points);
        assert_exactly_once(&table_state(s.postgres.url(), &table), ORDERS, name);
    }
}

/// The negative control: in at-least-once mode the same crash replays
/// committed rows, and the check sees the duplicates.
#[test]
fn at_least_once_shows_duplicates_after_the_same_crash() {
    let s = Services::start(Disturbs::Nothing);
    let topic = unique("orders_alo");
    produce(s.bootstrap(), &topic, (0..ORDERS).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    let table = unique("alo");
    let config = pipeline_file(dir.path(), "alo", "at-least-once", &s, &topic, &table);
    crash_then_finish(&config, &["coordinator.before_persist:3"]);
    let state = table_state(s.postgres.url(), &table);
    let expected: BTreeSet<i64> = (0..ORDERS).collect();
    assert_eq!(state.ids, expected, "no loss");
    assert_eq!(state.distinct_positions, ORDERS);
    assert!(state.rows > ORDERS, "duplicates expected, found {} rows", state.rows);
}

/// Orders of the outage tests: enough that the run is still writing when
/// the outage begins, right after its first rows are committed.
const OUTAGE_ORDERS: i64 = 10_000;

/// Runs a pipeline over [`OUTAGE_ORDERS`] orders and starts `outage` as soon
/// as its first rows are committed; the run must ride it out and end with
/// every order exactly once.
fn run_with_outage(name: &str, disturbs: Disturbs, outage: impl FnOnce(&mut Services)) {
    let mut s = Services::start(disturbs);
    let topic = unique(name);
    produce(s.bootstrap(), &topic, (0..OUTAGE_ORDERS).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    let table = unique(name);
    let config = pipeline_file(dir.path(), name, "exactly-once", &s, &topic, &table);
    let mut child = spawn(&config);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let before = loop {
        assert!(child.is_running(), "{name}: the pipeline ended before the outage");
        let rows = committed_rows(s.postgres.url(), &table);
        if rows > 0 {
            break rows;
        }
        assert!(Instant::now() < deadline, "{name}: no row committed within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    // The outage must hit a run in progress, or the test proves nothing.
    assert!(child.is_running(), "{name}: the pipeline ended before the outage");
    assert!(
        before < OUTAGE_ORDERS,
        "{name}: every row was committed before the outage"
    );
    println!(
        "{name}: outage after {:?}, {before} of {OUTAGE_ORDERS} rows committed",
        started.elapsed()
    );
    outage(&mut s);
    let (status, _, log) = wait(child, Duration::from_secs(240));
    assert!(status.success(), "{name}: the pipeline failed:\n{log}");
    assert_exactly_once(&table_state(s.postgres.url(), &table), OUTAGE_ORDERS, name);
}

#[test]
fn a_postgres_restart_mid_run_is_retried_and_ends_exactly_once() {
    run_with_outage("pg_restart", Disturbs::Postgres, |s| {
        s.postgres.stop().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        s.postgres.restart().unwrap();
    });
}

#[test]
fn a_frozen_broker_is_waited_for_and_ends_exactly_once() {
    run_with_outage("broker_frozen", Disturbs::Kafka, |s| {
        s.own_kafka().freeze().unwrap();
        std::thread::sleep(Duration::from_secs(4));
        s.own_kafka().thaw().unwrap();
    });
}

#[test]
fn a_broker_restart_is_retried_and_ends_exactly_once() {
    run_with_outage("broker_restart", Disturbs::Kafka, |s| {
        s.own_kafka().stop().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        s.own_kafka().restart().unwrap();
    });
}

#[test]
fn malformed_records_become_counted_dead_letters_and_the_rest_is_delivered() {
    let s = Services::start(Disturbs::Nothing);
    let topic = unique("orders_bad");
    let mut records: Vec<ProduceRecord> = (0..200).map(order).collect();
    records.push(ProduceRecord::new("not json at all").to_partition(0));
    records.push(ProduceRecord::new(r#"{"customer":"no id"}"#).to_partition(1));
    records.push(ProduceRecord::new(r#"{"id":"abc"}"#).to_partition(2));
    produce(s.bootstrap(), &topic, records);
    let dir = tempfile::tempdir().unwrap();
    let table = unique("bad");
    let config = pipeline_file(dir.path(), "bad", "exactly-once", &s, &topic, &table);
    let (status, stdout, log) = wait(spawn(&config), Duration::from_secs(120));
    assert!(status.success(), "{log}");
    let state = table_state(s.postgres.url(), &table);
    assert_exactly_once(&state, 200, "good records");
    assert_eq!(state.dead_letters, 3);
    assert!(
        stdout.contains("\"dead_letters\":3"),
        "the run reports its dead letters: {stdout}"
    );
}

#[test]
fn max_prepared_transactions_zero_is_refused_with_the_setting_named() {
    // ALTER SYSTEM: never on a server given by EXACTLY_DATABASE_URL.
    let mut s = Services::start(Disturbs::Postgres);
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
    let topic = unique("orders_mpt");
    produce(s.bootstrap(), &topic, (0..10).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    let config = pipeline_file(dir.path(), "mpt", "exactly-once", &s, &topic, "mpt");
    let (status, _, log) = wait(spawn(&config), Duration::from_secs(60));
    assert!(!status.success());
    assert!(log.contains("max_prepared_transactions"), "{log}");
    assert!(log.contains("ALTER SYSTEM SET max_prepared_transactions"), "{log}");
}

#[test]
fn sigterm_takes_a_last_checkpoint_commits_it_and_a_restart_continues_exactly() {
    let s = Services::start(Disturbs::Nothing);
    let topic = unique("orders_sigterm");
    let orders = 10_000;
    produce(s.bootstrap(), &topic, (0..orders).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    let table = unique("sigterm");
    let bounded = pipeline_file(dir.path(), "sigterm", "exactly-once", &s, &topic, &table);
    let text = std::fs::read_to_string(&bounded).unwrap();
    let unbounded = dir.path().join("unbounded.toml");
    std::fs::write(&unbounded, text.replace("stop_at_end = true", "stop_at_end = false")).unwrap();
    let child = spawn(&unbounded);
    std::thread::sleep(Duration::from_millis(1500));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (status, _, log) = wait(child, Duration::from_secs(60));
    assert!(status.success(), "SIGTERM must end the run cleanly:\n{log}");
    assert!(log.contains("shutdown requested"), "{log}");
    let state = table_state(s.postgres.url(), &table);
    assert!(state.rows > 0, "the last checkpoint was committed");
    assert_eq!(state.rows, state.distinct_positions);
    let (status, _, log) = wait(spawn(&bounded), Duration::from_secs(120));
    assert!(status.success(), "{log}");
    assert_exactly_once(
        &table_state(s.postgres.url(), &table),
        orders,
        "after SIGTERM and restart",
    );
}
