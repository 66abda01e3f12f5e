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

use common::orders::*;
use common::*;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_testkit::{KafkaBroker, PostgresServer};

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
/// Creates `topic` with [`ORDER_PARTITIONS`] partitions.
fn create_topic(bootstrap: &str, topic: &str) {
    current_thread_runtime().block_on(async {
        KafkaAdmin::new(bootstrap)
            .create_topic(topic, ORDER_PARTITIONS)
            .await
            .expect("creating the topic")
    });
}

/// Creates `topic` and produces `records` into it.
fn produce(bootstrap: &str, topic: &str, records: Vec<ProduceRecord>) {
    create_topic(bootstrap, topic);
    current_thread_runtime().block_on(async {
        KafkaAdmin::new(bootstrap)
            .produce(topic, records)
            .await
            .expect("producing");
    });
}

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
        ),
    )
    .unwrap();
    file
}

/// A copy of the pipeline file `bounded` (`<name>.toml`) that reads the
/// topic as it grows (`stop_at_end = false`), in the same folder, so both
/// share the checkpoints: `<name>-unbounded.toml`.
fn unbounded(bounded: &Path) -> PathBuf {
    let text = std::fs::read_to_string(bounded).unwrap();
    assert!(text.contains("stop_at_end = true"), "{text}");
    let stem = bounded.file_stem().unwrap().to_string_lossy();
    let file = bounded.with_file_name(format!("{stem}-unbounded.toml"));
    std::fs::write(&file, text.replace("stop_at_end = true", "stop_at_end = false")).unwrap();
    file
}

/// Kills a pipeline reading the [`Feed`] of `topic` (ORDERS orders) at each
/// of `points` in turn, then, once every order is produced, runs it to the
/// end of the topic.
fn crash_while_fed(s: &Services, dir: &Path, name: &str, guarantee: &str, table: &str, points: &[&str]) {
    let topic = fresh(name);
    let bounded = pipeline_file(dir, name, guarantee, s, &topic, table);
    let fed = unbounded(&bounded);
    let feed = Feed::start(s.bootstrap(), &topic, ORDERS);
    for point in points {
        run_killed_at(&fed, point);
        assert!(
            feed.is_running(),
            "{name}: the feed ended before the crash at {point}; the crash did not hit a run in progress"
        );
    }
    feed.finish();
    run_to_completion(&bounded);
}

struct TableState {
    rows: i64,
    distinct_positions: i64,
    ids: BTreeSet<i64>,
    dead_letters: i64,
}

fn table_state(url: &str, table: &str) -> TableState {
    current_thread_runtime().block_on(async {
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
    let dir = tempfile::tempdir().unwrap();
    for (i, (name, points)) in TWO_PHASE_CRASH_CASES.iter().enumerate() {
        let table = fresh(&format!("matrix{i}"));
        crash_while_fed(&s, dir.path(), name, "exactly-once", &table, points);
        assert_exactly_once(&table_state(s.postgres.url(), &table), ORDERS, name);
    }
}

/// The negative control: in at-least-once mode the same crash replays
/// committed rows, and the check sees the duplicates.
#[test]
fn at_least_once_shows_duplicates_after_the_same_crash() {
    let s = Services::start(Disturbs::Nothing);
    let dir = tempfile::tempdir().unwrap();
    let table = fresh("alo");
    crash_while_fed(
        &s,
        dir.path(),
        "alo",
        "at-least-once",
        &table,
        // At-least-once commits at the barrier; this point comes right after
        // such a commit of an interval with records, before the checkpoint
        // is acknowledged (so never persisted): its records are replayed.
        &["sink.after_pre_commit:3"],
    );
    let state = table_state(s.postgres.url(), &table);
    let expected: BTreeSet<i64> = (0..ORDERS).collect();
    assert_eq!(state.ids, expected, "no loss");
    assert_eq!(state.distinct_positions, ORDERS);
    assert!(state.rows > ORDERS, "duplicates expected, found {} rows", state.rows);
}

/// Orders of the outage tests: a [`Feed`] of at least 5 s.
const OUTAGE_ORDERS: i64 = 10_000;

/// Runs a pipeline on a [`Feed`] of [`OUTAGE_ORDERS`] orders and starts
/// `outage` as soon as its first rows are committed, while orders are still
/// being produced; the run must ride it out, and once every order is
/// committed, SIGTERM must end it cleanly with every order exactly once.
fn run_with_outage(name: &str, disturbs: Disturbs, outage: impl FnOnce(&mut Services)) {
    let mut s = Services::start(disturbs);
    let topic = fresh(name);
    let dir = tempfile::tempdir().unwrap();
    let table = fresh(name);
    let fed = unbounded(&pipeline_file(dir.path(), name, "exactly-once", &s, &topic, &table));
    let feed = Feed::start(s.bootstrap(), &topic, OUTAGE_ORDERS);
    let mut child = spawn(&fed);
    let started = Instant::now();
    let Some(before) = wait_for_orders(s.postgres.url(), &table, &mut child, 1, Duration::from_secs(120)) else {
        let (status, _, log) = wait(child, Duration::from_secs(10));
        panic!("{name}: the pipeline ended before the outage ({status}):\n{log}");
    };
    // The outage must hit a run in progress, or the test proves nothing.
    assert!(
        feed.is_running() && before < OUTAGE_ORDERS,
        "{name}: the input was complete before the outage ({before} rows committed)"
    );
    println!(
        "{name}: outage after {:?}, {before} of {OUTAGE_ORDERS} rows committed",
        started.elapsed()
    );
    outage(&mut s);
    feed.finish();
    if wait_for_orders(
        s.postgres.url(),
        &table,
        &mut child,
        OUTAGE_ORDERS,
        Duration::from_secs(120),
    )
    .is_none()
    {
        let (status, _, log) = wait(child, Duration::from_secs(10));
        panic!("{name}: the pipeline ended ({status}) before every order was committed:\n{log}");
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (status, _, log) = wait(child, Duration::from_secs(60));
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
    let topic = fresh("orders_bad");
    let mut records: Vec<ProduceRecord> = (0..200).map(order).collect();
    records.push(ProduceRecord::new("not json at all").to_partition(0));
    records.push(ProduceRecord::new(r#"{"customer":"no id"}"#).to_partition(1));
    records.push(ProduceRecord::new(r#"{"id":"abc"}"#).to_partition(2));
    produce(s.bootstrap(), &topic, records);
    let dir = tempfile::tempdir().unwrap();
    let table = fresh("bad");
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
    current_thread_runtime().block_on(async {
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
    let topic = fresh("orders_mpt");
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
    let topic = fresh("orders_sigterm");
    let orders = 10_000;
    produce(s.bootstrap(), &topic, (0..orders).map(order).collect());
    let dir = tempfile::tempdir().unwrap();
    let table = fresh("sigterm");
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
