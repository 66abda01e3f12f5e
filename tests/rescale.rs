//! Rescaling a Kafka → PostgreSQL pipeline through the `exactly` binary, on
//! Apache Kafka and a real PostgreSQL, while the topic is being fed: a run
//! at parallelism 3 is SIGKILLed after a checkpoint is persisted and before
//! its transactions are committed; resuming at 2 is refused without
//! `--allow-parallelism-change` and touches nothing; with it, subtask 0
//! takes over old subtask 2 (commits what the checkpoint lists for it, rolls
//! back the rest) and is killed the same way; resuming at 4 finishes. Every
//! order lands exactly once and no prepared transaction of the pipeline is
//! left. And an old subtask's transaction prepared after its last
//! checkpoint is rolled back by its heir.

mod common;

use std::time::Duration;

use common::orders::*;
use common::*;
use exactly_testkit::{KafkaBroker, PostgresServer};

/// A feed of at least 6 s (50 orders every 25 ms).
const ORDERS: i64 = 12_000;

/// Longest a run that should crash may take.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the bounded pipeline `file` at its new parallelism to the end of
/// the topic; it must succeed.
fn finish_rescaled(file: &std::path::Path, what: &str) {
    let (status, _, log) = wait(spawn_with(file, &["--allow-parallelism-change"], &[]), TIMEOUT);
    assert!(status.success(), "{what} failed:\n{log}");
}

/// The pipeline file of `name` at `parallelism` (checkpoints every 50 ms),
/// bounded or reading the growing topic.
fn pipeline_at(
    dir: &std::path::Path,
    name: &str,
    parallelism: usize,
    kafka: (&str, &str),
    postgres: (&str, &str),
    bounded: bool,
) -> std::path::PathBuf {
    orders_pipeline(
        dir,
        &format!("p{parallelism}-{bounded}.toml"),
        name,
        parallelism,
        "checkpoints",
        "50ms",
        kafka,
        postgres,
        bounded,
    )
}

#[test]
fn lowering_then_raising_the_parallelism_after_crashes_is_exactly_once() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let name = fresh("rescale");
    let table = fresh("rescale");
    // Every subtask has records (so transactions) at 3, 2 and 4.
    let topic = topic_reaching_every_subtask("rescale", &[3, 2, 4]);
    let file = |parallelism: usize, bounded: bool| {
        pipeline_at(
            dir.path(),
            &name,
            parallelism,
            (kafka.bootstrap(), &topic),
            (url, &table),
            bounded,
        )
    };
    let checkpoints = dir.path().join("checkpoints");
    let feed = Feed::start(kafka.bootstrap(), &topic, ORDERS);

    // At 3: killed right after region 2 (sink subtask 2) persisted its 20th
    // checkpoint that lists pre-committed transactions (at least 1 s of
    // records in; one whose interval brought no record, frequent on a loaded
    // machine, does not count), before they are committed.
    run_killed_within(&file(3, false), "coordinator.after_persist_pending@2:20", &[], TIMEOUT);
    assert!(feed.is_running(), "the input was complete before the first crash");
    let pending = prepared_of_pipeline(url, &name);
    let entry = newest_entries_text(&checkpoints, &name).expect("a checkpoint entry");
    let listed_of_2: Vec<&String> = pending
        .iter()
        .filter(|gid| subtask_of_gid(gid) == 2 && entry.contains(gid.as_str()))
        .collect();
    assert!(
        !listed_of_2.is_empty(),
        "old subtask 2 has prepared transactions the checkpoint lists: {pending:?}"
    );

    // At 2 without the flag: refused, naming it, before any sink recovers.
    // (An accepted run would read the growing topic: `wait` fails the test
    // after the timeout instead of hanging it.)
    let (status, _, log) = wait(spawn(&file(2, false)), TIMEOUT);
    assert!(!status.success(), "a lowering without the flag was accepted:\n{log}");
    for part in [
        "parallelism 3",
        "--allow-parallelism-change",
        "allow_parallelism_change",
    ] {
        assert!(log.contains(part), "`{part}` missing from:\n{log}");
    }
    assert_eq!(
        prepared_of_pipeline(url, &name),
        pending,
        "the refused run touched the prepared transactions"
    );

    // At 2 with the flag: subtask 0 adopts old subtask 2; killed the same way.
    let log = run_killed_within(
        &file(2, false),
        "coordinator.after_persist_pending@0:15",
        &["--allow-parallelism-change"],
        TIMEOUT,
    );
    assert!(
        log.contains("taking over the sink subtasks of the higher parallelism"),
        "subtask 0 did not adopt old subtask 2:\n{log}"
    );
    assert!(feed.is_running(), "the input was complete before the second crash");
    let pending = prepared_of_pipeline(url, &name);
    assert!(
        pending.iter().all(|gid| subtask_of_gid(gid) < 2),
        "a transaction of old subtask 2 outlived its adoption: {pending:?}"
    );
    let entry = newest_entries_text(&checkpoints, &name).expect("a checkpoint entry");
    assert!(
        pending.iter().any(|gid| entry.contains(gid.as_str())),
        "the run at 2 left prepared transactions its checkpoint lists: {pending:?}"
    );
    for committed in &listed_of_2 {
        assert!(
            !pending.contains(committed),
            "{committed}, listed for old subtask 2, was committed"
        );
    }

    // At 4, once every order is produced: to the end of the topic.
    feed.finish();
    finish_rescaled(&file(4, true), "the run at 4");
    assert_orders_exactly_once(url, &table, &name, ORDERS, "after 3 → 2 → 4");
    let entry = newest_entries_text(&checkpoints, &name).expect("a checkpoint entry");
    assert!(
        entry.contains("\"parallelism\": 4"),
        "the last checkpoint is at parallelism 4"
    );
}

/// The other half of a takeover: old subtask 2 is killed right after it
/// prepared a transaction that no checkpoint lists (the checkpoint was not
/// persisted); resumed at 2, subtask 0 must roll it back for subtask 2, or
/// it would stay prepared for ever (and its records would come again, from
/// the replay, in a transaction of subtask 0).
#[test]
fn a_lowering_rolls_back_what_an_old_subtask_prepared_after_its_last_checkpoint() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let name = fresh("takeover");
    let table = fresh("takeover");
    let topic = topic_reaching_every_subtask("takeover", &[3, 2]);
    let orders = 6000;
    let file = |parallelism: usize, bounded: bool| {
        pipeline_at(
            dir.path(),
            &name,
            parallelism,
            (kafka.bootstrap(), &topic),
            (url, &table),
            bounded,
        )
    };
    let feed = Feed::start(kafka.bootstrap(), &topic, orders);
    run_killed_within(&file(3, false), "sink.after_pre_commit@2:20", &[], TIMEOUT);
    assert!(feed.is_running(), "the input was complete before the crash");
    let entry = newest_entries_text(&dir.path().join("checkpoints"), &name).expect("a checkpoint entry");
    let unlisted_of_2: Vec<String> = prepared_of_pipeline(url, &name)
        .into_iter()
        .filter(|gid| subtask_of_gid(gid) == 2 && !entry.contains(gid.as_str()))
        .collect();
    assert!(
        !unlisted_of_2.is_empty(),
        "old subtask 2 has a prepared transaction no checkpoint lists"
    );
    feed.finish();
    finish_rescaled(&file(2, true), "the run at 2");
    // No prepared transaction is left (the unlisted one included), and the
    // records it held came once, from the replay.
    assert_orders_exactly_once(url, &table, &name, orders, "after 3 → 2");
}
