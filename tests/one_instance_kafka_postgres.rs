//! One process per pipeline, Kafka → PostgreSQL, through the `exactly`
//! binary on Apache Kafka and a real PostgreSQL: while a run reads a topic
//! that is still being fed, a second `exactly run` of the same pipeline is
//! refused before it touches anything — by the checkpoint folder's lock when
//! it uses the same folder (also when the first one is frozen with SIGSTOP),
//! by the PostgreSQL sink's subtask lock when it uses another folder (as on
//! another machine) — and the first one ends with every order exactly once.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::orders::*;
use common::*;
use exactly_testkit::{KafkaBroker, PostgresServer};

const ORDERS: i64 = 4000;

struct World {
    dir: tempfile::TempDir,
    bootstrap: String,
    postgres: PostgresServer,
    name: String,
    topic: String,
    table: String,
}

impl World {
    fn new(prefix: &str) -> World {
        let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
        World {
            dir: tempfile::tempdir().unwrap(),
            bootstrap: kafka.bootstrap().to_string(),
            postgres: PostgresServer::start().expect("starting PostgreSQL"),
            name: fresh(prefix),
            topic: fresh(prefix),
            table: fresh(prefix),
        }
    }

    /// The pipeline file `file`, its checkpoints in `checkpoints`.
    fn pipeline(&self, file: &str, checkpoints: &str) -> PathBuf {
        orders_pipeline(
            self.dir.path(),
            file,
            &self.name,
            2,
            checkpoints,
            "50ms",
            (&self.bootstrap, &self.topic),
            (self.postgres.url(), &self.table),
            false,
        )
    }

    fn url(&self) -> &str {
        self.postgres.url()
    }
}

/// Starts the feed and the first run, and waits until it has committed
/// rows (it is running, and the topic is still being fed).
fn first_run(w: &World, config: &Path) -> (Feed, Background) {
    // Held at half way until finish_first_run: the second run always
    // comes while the topic is still being fed.
    let feed = Feed::start_held(&w.bootstrap, &w.topic, ORDERS);
    let mut first = spawn(config);
    let committed = wait_for_orders(w.url(), &w.table, &mut first, 1, Duration::from_secs(120));
    if committed.is_none() {
        let (status, _, log) = wait(first, Duration::from_secs(10));
        panic!("the first run ended ({status}) before committing anything:\n{log}");
    }
    (feed, first)
}

/// Lets the feed finish, waits for every order to be committed, stops the
/// first run with SIGTERM, and checks that it ended cleanly and exactly
/// once.
fn finish_first_run(w: &World, feed: Feed, mut first: Background) {
    feed.finish();
    if wait_for_orders(w.url(), &w.table, &mut first, ORDERS, Duration::from_secs(120)).is_none() {
        let (status, _, log) = wait(first, Duration::from_secs(10));
        panic!("the first run ended ({status}) before every order was committed:\n{log}");
    }
    // SAFETY: kill only signals the child this test started.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    let (status, _, log) = wait(first, Duration::from_secs(60));
    assert!(status.success(), "the first run failed:\n{log}");
    assert_orders_exactly_once(w.url(), &w.table, &w.name, ORDERS, "the first run");
}

/// Runs the pipeline file `config` a second time; a run that is not
/// refused (it would read the growing topic forever) fails the test after
/// a minute instead of hanging it.
fn second_run(config: &Path) -> (std::process::ExitStatus, String) {
    let (status, _, log) = wait(spawn(config), Duration::from_secs(60));
    (status, log)
}

/// The second run was refused by the checkpoint folder's lock, naming the
/// first, before any sink recovered.
fn assert_refused_by_the_folder(w: &World, log: &str, first: u32) {
    for part in [
        format!("pipeline {} is already running", w.name),
        format!("process {first} on host"),
        "Stop that process first".to_string(),
    ] {
        assert!(log.contains(&part), "`{part}` missing from:\n{log}");
    }
    assert!(!log.contains("recover"), "the refused run touched the sinks:\n{log}");
}

#[test]
fn a_second_run_is_refused_while_the_first_runs_and_the_first_ends_exactly_once() {
    let w = World::new("twice");
    let config = w.pipeline("pipeline.toml", "checkpoints");
    let (feed, first) = first_run(&w, &config);
    let (status, log) = second_run(&config);
    assert!(!status.success(), "a second run was not refused:\n{log}");
    assert_refused_by_the_folder(&w, &log, first.id());
    assert!(feed.is_running(), "the second run came after the input was complete");
    finish_first_run(&w, feed, first);
}

#[test]
fn a_second_run_is_refused_while_the_first_is_frozen_and_the_first_ends_exactly_once() {
    let w = World::new("frozen");
    let config = w.pipeline("pipeline.toml", "checkpoints");
    let (feed, first) = first_run(&w, &config);
    let pid = first.id() as i32;
    // SAFETY: kill only signals the child this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let (status, log) = second_run(&config);
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(!status.success(), "a second run was not refused:\n{log}");
    assert_refused_by_the_folder(&w, &log, first.id());
    finish_first_run(&w, feed, first);
}

/// Another checkpoint folder (as on another machine): the folder lock cannot
/// see the first run, PostgreSQL's subtask lock does. The second run stops
/// at its first sink subtask's recovery, before it rolls back anything.
#[test]
fn a_second_run_with_another_checkpoint_folder_is_refused_by_postgres() {
    let w = World::new("elsewhere");
    let config = w.pipeline("pipeline.toml", "checkpoints");
    let elsewhere = w.pipeline("elsewhere.toml", "other-checkpoints");
    let (feed, first) = first_run(&w, &config);
    let (status, log) = second_run(&elsewhere);
    assert!(!status.success(), "a second run was not refused:\n{log}");
    for part in [
        format!("pipeline {:?} is already writing table {}", w.name, w.table),
        "as sink subtask 0".to_string(),
        format!("application_name \"exactly {} pid={}.", w.name, first.id()),
        "connected since 20".to_string(),
        "Another process runs this pipeline".to_string(),
        "pg_terminate_backend".to_string(),
    ] {
        assert!(log.contains(&part), "`{part}` missing from:\n{log}");
    }
    assert!(
        !log.contains("rolling back a prepared transaction"),
        "the refused run touched the first one's transactions:\n{log}"
    );
    assert!(feed.is_running(), "the second run came after the input was complete");
    finish_first_run(&w, feed, first);
}
