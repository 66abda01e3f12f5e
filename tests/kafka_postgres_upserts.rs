//! Kafka → PostgreSQL through the `exactly` binary, upserting by the record
//! key with tombstones that delete (`pk.mode = "record_key"`,
//! `delete.enabled = true`), on Apache Kafka and a real PostgreSQL, under
//! SIGKILL at every phase of the two-phase commit: the final table equals
//! the last state of every key, computed from the records the test produced
//! (not from anything the sink wrote).
//!
//! The records change 100 keys in pairs of two changes to the same key in a
//! row — upsert then upsert, upsert then delete, delete then upsert, delete
//! then delete — so that many pairs land in one checkpoint interval, where
//! they must apply in offset order.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::orders::*;
use common::*;
use exactly_kafka::admin::ProduceRecord;
use exactly_testkit::{KafkaBroker, PostgresServer};

/// Records fed to each case.
const CHANGES: i64 = 4000;
/// Keys the changes touch.
const KEYS: i64 = 100;

/// The key of change `i`: two changes in a row per key.
fn key_of(i: i64) -> i64 {
    (i / 2) % KEYS
}

/// Change `i` deletes its key (else it upserts `v = i`): by pair, upsert
/// then upsert, upsert then delete, delete then upsert, delete then delete.
fn deletes(i: i64) -> bool {
    match (i / 2 / KEYS + i / 2) % 4 {
        0 => false,
        1 => i % 2 == 1,
        2 => i % 2 == 0,
        _ => true,
    }
}

/// Change `i` as a Kafka record keyed by its key (a JSON number), in
/// partition `key % ORDER_PARTITIONS`: every change of a key in one
/// partition, in order.
fn change(i: i64) -> ProduceRecord {
    let key = key_of(i);
    let record = if deletes(i) {
        ProduceRecord::tombstone()
    } else {
        ProduceRecord::new(format!(r#"{{"v":"{i}","note":"change {i} of key {key}"}}"#))
    };
    record
        .with_key(key.to_string())
        .to_partition((key % ORDER_PARTITIONS as i64) as i32)
}

/// What the table must hold: for every key, the value of its last change,
/// unless that deletes it.
fn expected_state() -> BTreeMap<i64, String> {
    let mut state = BTreeMap::new();
    for i in 0..CHANGES {
        let record = change(i);
        let key: i64 = String::from_utf8(record.key.unwrap()).unwrap().parse().unwrap();
        match record.value {
            None => state.remove(&key),
            Some(_) => state.insert(key, i.to_string()),
        };
    }
    state
}

/// The pipeline file `<dir>/<name>-<bounded>.toml`: the topic upserted by
/// its key into `table` (created by the sink), tombstones deleting.
fn pipeline(
    dir: &Path,
    name: &str,
    (bootstrap, topic): (&str, &str),
    (url, table): (&str, &str),
    bounded: bool,
) -> PathBuf {
    postgres_pipeline_file(dir, name, (bootstrap, topic), (url, table), bounded, SINK)
}

/// The rest of the pipeline's `[sink.postgres]` section.
const SINK: &str = r#"create_table = true
pk.mode = "record_key"
pk.fields = ["id"]
delete.enabled = true

[sink.postgres.columns]
id = { type = "bigint" }
v = { from = "/v", type = "text" }
note = { from = "/note", type = "text" }
"#;

/// `id → v` of the table.
fn table_state(url: &str, table: &str) -> BTreeMap<i64, String> {
    with_postgres(url, async |db| {
        db.query(&format!("SELECT id, v FROM {table}"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    })
}

#[test]
fn the_table_ends_at_the_last_state_of_every_key_under_sigkill_at_every_phase() {
    let expected = expected_state();
    assert!(
        expected.len() > 10 && expected.len() < KEYS as usize,
        "the changes leave some keys and delete others: {}",
        expected.len()
    );
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let mut failures = Vec::new();
    for (case, points) in TWO_PHASE_CRASH_CASES {
        let dir = tempfile::tempdir().unwrap();
        let name = fresh(&format!("upserts_{case}"));
        let table = fresh("upserts");
        let topic = topic_reaching_every_subtask("upserts", &[2]);
        let feed = Feed::start_with(kafka.bootstrap(), &topic, CHANGES, change);
        let fed = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &table), false);
        for point in *points {
            run_killed_at(&fed, point);
            assert!(
                feed.is_running(),
                "{case}: the feed ended before the crash at {point}; the crash did not hit a run in progress"
            );
        }
        feed.finish();
        let bounded = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &table), true);
        let (status, _, log) = wait(spawn(&bounded), std::time::Duration::from_secs(180));
        assert!(status.success(), "{case}: the last run failed:\n{log}");
        let state = table_state(url, &table);
        if state != expected {
            let wrong: Vec<_> = expected
                .iter()
                .filter(|(k, v)| state.get(k) != Some(v))
                .map(|(k, v)| format!("key {k}: {v} expected, {:?} found", state.get(k)))
                .chain(
                    state
                        .iter()
                        .filter(|(k, _)| !expected.contains_key(k))
                        .map(|(k, v)| format!("key {k}: deleted expected, {v} found")),
                )
                .take(5)
                .collect();
            failures.push(format!("{case} ({points:?}): {}", wrong.join("; ")));
        }
        let prepared = prepared_of_pipeline(url, &name);
        if !prepared.is_empty() {
            failures.push(format!("{case}: prepared transactions left: {prepared:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "not the last state per key:\n{}",
        failures.join("\n")
    );
}

/// The negative control: the same changes without `delete.enabled` leave
/// rows the tombstones should have deleted (they become dead letters), and
/// the comparison sees it.
#[test]
fn without_deletes_the_comparison_sees_the_rows_tombstones_should_have_removed() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let (name, table) = (fresh("upserts_control"), fresh("upserts"));
    let topic = topic_reaching_every_subtask("upserts", &[2]);
    Feed::start_with(kafka.bootstrap(), &topic, CHANGES, change).finish();
    let file = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (pg.url(), &table), true);
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("delete.enabled = true\n", "")).unwrap();
    let (status, stdout, log) = wait(spawn(&file), std::time::Duration::from_secs(180));
    assert!(status.success(), "{log}");
    let state = table_state(pg.url(), &table);
    let expected = expected_state();
    assert_ne!(state, expected, "the comparison must fail without deletes");
    assert!(
        state.len() > expected.len(),
        "{} rows, {} expected",
        state.len(),
        expected.len()
    );
    let tombstones = (0..CHANGES).filter(|i| deletes(*i)).count();
    assert!(
        stdout.contains(&format!("\"dead_letters\":{tombstones}")),
        "every tombstone is a counted dead letter ({tombstones}): {stdout}"
    );
}

/// Modes without prepared transactions, killed while writing, after a
/// pre-commit and around a persisted checkpoint: mode `upsert` replays the
/// changes since the last checkpoint (in the same order per key, so each
/// key ends the same), mode `fenced` drops what its positions cover.
#[test]
fn modes_upsert_and_fenced_end_at_the_last_state_of_every_key_after_kills() {
    let expected = expected_state();
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let points = [
        "source.after_emit:40",
        "sink.after_pre_commit:3",
        "coordinator.after_persist:4",
    ];
    let mut failures = Vec::new();
    for mode in ["upsert", "fenced"] {
        let dir = tempfile::tempdir().unwrap();
        let (name, table) = (fresh(&format!("upserts_{mode}")), fresh("upserts"));
        let topic = topic_reaching_every_subtask("upserts", &[2]);
        let feed = Feed::start_with(kafka.bootstrap(), &topic, CHANGES, change);
        let in_mode = |bounded: bool| {
            let file = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &table), bounded);
            let text = std::fs::read_to_string(&file).unwrap();
            std::fs::write(
                &file,
                text.replace(
                    "create_table = true\n",
                    &format!("create_table = true\nmode = \"{mode}\"\n"),
                ),
            )
            .unwrap();
            file
        };
        for point in points {
            run_killed_at(&in_mode(false), point);
            assert!(feed.is_running(), "{mode}: the feed ended before the crash at {point}");
        }
        feed.finish();
        let (status, _, log) = wait(spawn(&in_mode(true)), std::time::Duration::from_secs(180));
        assert!(status.success(), "{mode}: the last run failed:\n{log}");
        let state = table_state(url, &table);
        if state != expected {
            let wrong = expected.iter().filter(|(k, v)| state.get(k) != Some(v)).count()
                + state.keys().filter(|k| !expected.contains_key(k)).count();
            failures.push(format!("mode {mode}: {wrong} keys differ"));
        }
    }
    assert!(
        failures.is_empty(),
        "not the last state per key:\n{}",
        failures.join("\n")
    );
}
