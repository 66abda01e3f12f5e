//! A hot standby through the binary: two `exactly run --standby` of one
//! Kafka → PostgreSQL pipeline on the PostgreSQL checkpoint store. One
//! runs, the other waits (`/health/ready` says so, `exactly_standby` is 1,
//! nothing written); SIGKILL of the active one, and the standby takes over
//! from the store's checkpoints and goes on; every order lands exactly
//! once, no prepared transaction is left, and the standby's SIGTERM ends
//! it cleanly. Then the same with the roles swapped back: a new standby
//! waits for the one that took over, and takes over at once when that one
//! is stopped with SIGTERM (a clean hand-over needs no grace). And when the server ends the active
//! process's lock session, that process stops acting at once and the
//! standby takes over.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::orders::*;
use common::run::Worker;
use common::scrape::{get, Scrape};
use exactly_testkit::{KafkaBroker, PostgresServer};

const ORDERS: i64 = 3000;

/// The pipeline file: the orders into `table`, checkpoints in the
/// PostgreSQL store at `url`, standby on.
fn pipeline(dir: &Path, name: &str, (bootstrap, topic): (&str, &str), (url, table): (&str, &str)) -> PathBuf {
    let file = orders_pipeline(
        dir,
        "pipeline.toml",
        name,
        2,
        "unused",
        "100ms",
        (bootstrap, topic),
        (url, table),
        false,
    );
    let text = std::fs::read_to_string(&file).unwrap().replace(
        "dir = \"unused\"",
        &format!("store = {{ postgres = \"{url}\" }}\nstandby = true"),
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// A pipeline, its feed, an active process that has started and a second
/// one on standby.
struct Pair {
    dir: tempfile::TempDir,
    name: String,
    table: String,
    feed: Feed,
    file: PathBuf,
    first: Worker,
    second: Worker,
}

impl Pair {
    fn start(url: &str, prefix: &str) -> Pair {
        let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
        let dir = tempfile::tempdir().unwrap();
        let name = fresh(prefix);
        let topic = fresh(prefix);
        let table = fresh(&format!("{prefix}_orders"));
        let feed = Feed::start_held(kafka.bootstrap(), &topic, ORDERS);
        let file = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &table));
        let mut first = Worker::start(&file, dir.path(), "first");
        first.wait_for_log("no checkpoint found: first start", Duration::from_secs(120));
        let mut second = Worker::start(&file, dir.path(), "second");
        second.wait_for_log("standby: another process runs the pipeline", Duration::from_secs(120));
        Pair {
            dir,
            name,
            table,
            feed,
            file,
            first,
            second,
        }
    }
}

/// Waits until every order is committed while `worker` runs, then stops it
/// with SIGTERM, which must end it cleanly; its log.
fn run_to_all_orders_and_stop(url: &str, table: &str, mut worker: Worker) -> String {
    let deadline = Instant::now() + Duration::from_secs(240);
    while committed_orders(url, table) < ORDERS {
        assert!(
            worker.is_running() && Instant::now() < deadline,
            "the orders did not all arrive:\n{}",
            worker.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, log) = worker.stop(Duration::from_secs(60));
    assert!(ok, "the run that took over did not stop cleanly:\n{log}");
    log
}

/// The backends of process `pid`'s lock tries (their `application_name`
/// names the process).
fn lock_sessions(url: &str, pid: u32) -> Vec<i32> {
    with_postgres(url, async |db| {
        db.query(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1 ORDER BY pid",
            &[&format!("exactly process {pid} on host %")],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    })
}

/// Waits until the committed rows exceed `above`, while `worker` runs.
fn wait_for_more_rows(url: &str, table: &str, above: i64, worker: &mut Worker, timeout: Duration) -> i64 {
    let deadline = Instant::now() + timeout;
    loop {
        let rows = committed_orders(url, table);
        if rows > above {
            return rows;
        }
        assert!(
            worker.is_running() && Instant::now() < deadline,
            "no row committed beyond {above} while the worker ran:\n{}",
            worker.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_standby_takes_over_after_sigkill_of_the_active_process_exactly_once() {
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let Pair {
        dir,
        name,
        table,
        feed,
        file,
        mut first,
        mut second,
    } = Pair::start(url, "standby");
    // The standby says so and writes nothing.
    let (status, body) = get(&format!("{}/health/ready", second.base)).expect("the standby's endpoint");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("standby"), "{body}");
    assert_eq!(Scrape::take(&second.base).value("exactly_standby"), 1.0);
    assert_eq!(Scrape::take(&first.base).value("exactly_standby"), 0.0);
    // It tries the lock every 250 ms on one session, not a new connection
    // each time: the same backend over several tries.
    let probes = || lock_sessions(url, second.child.id());
    let before = probes();
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(before.len(), 1, "the standby's lock sessions: {before:?}");
    assert_eq!(probes(), before, "the standby reconnected to try the lock again");
    wait_for_more_rows(url, &table, 0, &mut first, Duration::from_secs(120));

    // The active one dies; the standby takes over and goes on (rows
    // counted once the active one is gone: what comes after is the
    // standby's).
    first.kill();
    let before = committed_orders(url, &table);
    second.wait_for_log("the pipeline's lock is free: taking over", Duration::from_secs(120));
    wait_for_more_rows(url, &table, before, &mut second, Duration::from_secs(120));
    let scrape = Scrape::take(&second.base);
    assert_eq!(scrape.value("exactly_standby"), 0.0);
    assert_eq!(scrape.value("exactly_takeovers_total"), 1.0);
    assert_eq!(
        scrape.value("exactly_clean_takeovers_total"),
        0.0,
        "the holder was killed"
    );

    // A new standby waits for the one that took over.
    let mut third = Worker::start(&file, dir.path(), "third");
    third.wait_for_log("standby: another process runs the pipeline", Duration::from_secs(120));

    feed.finish();
    let log = run_to_all_orders_and_stop(url, &table, second);
    // SIGTERM: the last checkpoint committed, the sinks closed (their
    // subtask locks let go), the clean release recorded — so the third
    // takes over at once, without the wait it makes after a kill, and its
    // sinks are not refused by the second's sessions.
    assert!(
        log.contains("stopped cleanly: the pipeline's lock is handed over"),
        "{log}"
    );
    third.wait_for_log(
        "the pipeline was handed over cleanly: taking over at once",
        Duration::from_secs(120),
    );
    assert!(
        !third.log().contains("the pipeline's lock is free: taking over"),
        "{}",
        third.log()
    );
    let scrape = Scrape::take(&third.base);
    assert_eq!(scrape.value("exactly_clean_takeovers_total"), 1.0);
    assert_eq!(scrape.value("exactly_takeovers_total"), 1.0);
    let (ok, log) = third.stop(Duration::from_secs(60));
    assert!(ok, "the last standby did not stop cleanly:\n{log}");
    assert_orders_exactly_once(url, &table, &name, ORDERS, "after a standby took over");
}

/// The server ends the active process's lock session (an operator's
/// `pg_terminate_backend`, a server-side timeout): the active process stops
/// acting at once — it may no longer hold the lock — and the standby takes
/// over; every order still lands exactly once.
#[test]
fn losing_the_lock_session_stops_the_active_process_and_the_standby_takes_over() {
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let Pair {
        dir: _dir,
        name,
        table,
        feed,
        file: _,
        mut first,
        mut second,
    } = Pair::start(url, "lost_lock");
    wait_for_more_rows(url, &table, 0, &mut first, Duration::from_secs(120));

    let sessions = lock_sessions(url, first.child.id());
    assert_eq!(sessions.len(), 1, "the active process's lock session: {sessions:?}");
    with_postgres(url, async |db| {
        db.execute("SELECT pg_terminate_backend($1)", &[&sessions[0]])
            .await
            .unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while first.is_running() {
        assert!(
            Instant::now() < deadline,
            "the active process went on without its lock:\n{}",
            first.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = first.log();
    assert!(log.contains("lost the pipeline's lock: stopping at once"), "{log}");
    second.wait_for_log("the pipeline's lock is free: taking over", Duration::from_secs(120));
    let before = committed_orders(url, &table);
    wait_for_more_rows(url, &table, before, &mut second, Duration::from_secs(120));

    feed.finish();
    run_to_all_orders_and_stop(url, &table, second);
    assert_orders_exactly_once(url, &table, &name, ORDERS, "after the active process lost its lock");
}
