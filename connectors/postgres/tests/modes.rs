//! Modes `upsert` and `fenced` against a real PostgreSQL: replays after a
//! simulated crash (a new sink instance gets the same records again) leave
//! the table exact.

mod common;

use common::*;
use exactly_core::{
    CheckpointId, ConnectorError, ErasedSink, FencedSink, Record, ReplayCheck, SinkFactory, TwoPhaseCommitSink,
};
use exactly_postgres::{PostgresSinkConfig, PostgresSinkFactory, SinkMode};

/// The sink the runtime would drive: the mode's adapter around the sink.
fn created(config: &PostgresSinkConfig, pipeline: &str) -> Box<dyn ErasedSink> {
    PostgresSinkFactory::new(config.clone())
        .expect("valid config")
        .create(context(pipeline, 0))
        .expect("create")
}

/// [`created`], after `recover`.
async fn erased(config: &PostgresSinkConfig, pipeline: &str) -> Box<dyn ErasedSink> {
    let mut sink = created(config, pipeline);
    sink.recover(&[]).await.expect("recover");
    sink
}

/// Writes the batches as one checkpoint interval and pre-commits it.
async fn interval(sink: &mut Box<dyn ErasedSink>, checkpoint: u64, batches: &[Vec<Record>]) {
    for batch in batches {
        sink.write(CheckpointId(checkpoint), batch).await.expect("write");
    }
    sink.pre_commit().await.expect("pre_commit");
}

/// What a sink of `config` answers before a fallback to checkpoint 1 (the
/// newer checkpoint entries unreadable): upserts and fenced writes are
/// replay-safe, whatever was committed after it.
async fn replay_check_after_one(config: &PostgresSinkConfig, pipeline: &str) -> ReplayCheck {
    created(config, pipeline)
        .check_replay_after(CheckpointId(1))
        .await
        .expect("check_replay_after")
}

/// [`KV_UPSERT`] in `mode`.
fn kv_in(mode: &str) -> String {
    format!("mode = \"{mode}\"\n{KV_UPSERT}")
}

#[tokio::test]
async fn upsert_mode_keeps_one_row_per_key_with_the_latest_value_across_replays() {
    let f = Fixture::new("kv", &kv_in("upsert")).await;
    let (db, table) = (&f.db, &f.table);
    let dead_letters = format!("{table}_dead_letters");
    let first = vec![kv(0, 0, 1, "a"), kv(0, 1, 2, "b"), kv(0, 2, 1, "c")];
    let second = vec![
        kv(0, 3, 2, "d"),
        record(0, 4, r#"{"id":"x","v":"bad"}"#),
        kv(0, 5, 3, "e"),
    ];
    let third = vec![kv(0, 6, 1, "f"), kv(0, 7, 1, "g")];

    let mut sink = erased(&f.config, &f.pipeline).await;
    sink.write(CheckpointId(1), &first).await.unwrap();
    assert_eq!(
        pairs(db, table).await,
        expect_pairs(&[(1, "c"), (2, "b")]),
        "visible at once; the last value per key in a batch wins"
    );
    sink.write(CheckpointId(1), &second).await.unwrap();
    assert_eq!(sink.pre_commit().await.unwrap(), Some(serde_json::Value::Null));
    sink.write(CheckpointId(2), &third).await.unwrap();
    let latest = expect_pairs(&[(1, "g"), (2, "d"), (3, "e")]);
    assert_eq!(pairs(db, table).await, latest);
    assert_eq!(count(db, &dead_letters).await, 1);
    drop(sink); // crash before checkpoint 2 completes
    assert_eq!(replay_check_after_one(&f.config, &f.pipeline).await, ReplayCheck::Safe);

    // The restarted pipeline replays from checkpoint 1 (and a later crash from
    // the start): every key ends with its latest value, no dead letter twice.
    for replay in [vec![third.clone()], vec![first, second, third]] {
        let mut restarted = erased(&f.config, &f.pipeline).await;
        interval(&mut restarted, 3, &replay).await;
        assert_eq!(pairs(db, table).await, latest);
        assert_eq!(
            count(db, &dead_letters).await,
            1,
            "a replay does not repeat a dead letter"
        );
    }
    let error: String = column(db, &format!("SELECT error FROM \"{dead_letters}\""))
        .await
        .remove(0);
    assert!(error.contains("\"x\" is not an integer"), "{error}");
    let checkpoint: Vec<i64> = column(db, &format!("SELECT checkpoint FROM \"{dead_letters}\"")).await;
    assert_eq!(
        checkpoint,
        [0],
        "modes without prepared transactions do not know the checkpoint"
    );
}

#[tokio::test]
async fn upsert_mode_keys_rows_by_a_uuid_and_writes_dates() {
    let f = Fixture::new(
        "uuid_keyed",
        r#"mode = "upsert"
upsert_key = ["ref"]
create_table = true
[sink.postgres.columns]
ref = { from = "/ref", type = "uuid" }
day = { from = "/day", type = "date" }
"#,
    )
    .await;
    let a = "0b5e4f1c-93a2-4f8e-b1c3-5d2e7f9a0c11";
    let b = "7d9c2e4a-1f3b-4a6c-8e5d-2b4f6a8c0e13";
    let change = |offset: i64, id: &str, day: &str| record(0, offset, &format!(r#"{{"ref":"{id}","day":"{day}"}}"#));
    let mut sink = erased(&f.config, &f.pipeline).await;
    let batch = vec![
        change(0, a, "2024-01-01"),
        change(1, b, "2024-01-02"),
        // The same key in upper case: one UUID, the later day wins.
        change(2, &a.to_uppercase(), "2024-03-31"),
    ];
    interval(&mut sink, 1, &[batch]).await;
    let rows: Vec<String> = column(
        &f.db,
        &format!("SELECT ref::text || ' ' || day::text FROM \"{}\" ORDER BY ref", f.table),
    )
    .await;
    assert_eq!(rows, [format!("{a} 2024-03-31"), format!("{b} 2024-01-02")]);
}

#[tokio::test]
async fn upsert_mode_counts_dead_letters_and_needs_a_unique_key() {
    let f = Fixture::new("kv", &kv_in("upsert")).await;
    let factory = PostgresSinkFactory::new(f.config.clone()).unwrap();
    assert_eq!(factory.mode(), SinkMode::Upsert);
    let ctx = context(&f.pipeline, 0);
    let metrics = ctx.metrics.clone();
    let mut sink = factory.create(ctx).unwrap();
    sink.recover(&[]).await.unwrap();
    let batch = vec![kv(1, 0, 1, "a"), record(1, 1, "not json"), record(1, 2, r#"{"id":2}"#)];
    sink.write(CheckpointId(1), &batch).await.unwrap();
    assert_eq!(metrics.snapshot().dead_letters, 2);
    assert_eq!(f.count().await, 1);

    // A table without a unique index on the key is refused with the fix.
    let plain = unique("plain");
    f.db.batch_execute(&format!("CREATE TABLE \"{plain}\" (id bigint, v text)"))
        .await
        .unwrap();
    let mut config = f.config.clone();
    config.table = plain.clone();
    let message = fatal_message(created(&config, &f.pipeline).recover(&[]).await);
    assert!(
        message.contains(&plain) && message.contains("unique index") && message.contains("ADD PRIMARY KEY"),
        "{message}"
    );

    // Without a key the mode is refused before anything connects.
    let mut keyless = f.config.clone();
    keyless.upsert_key = None;
    match PostgresSinkFactory::new(keyless) {
        Err(ConnectorError::Fatal { message, .. }) => {
            assert!(
                message.contains("sink.postgres.upsert_key") && message.contains("mode = \"fenced\""),
                "{message}"
            )
        }
        other => panic!("expected a fatal error, got {other:?}"),
    }
}

/// An append-only table without any unique key, filled from the record's
/// coordinates and value.
const EVENTS: &str = r#"
mode = "fenced"
[sink.postgres.columns]
part = { from = "partition", type = "int" }
off = { from = "offset", type = "bigint" }
v = { from = "/v", type = "text" }
"#;

async fn events_fixture() -> Fixture {
    let f = Fixture::new("events", EVENTS).await;
    f.db.batch_execute(&format!(
        "CREATE TABLE \"{}\" (part int NOT NULL, off bigint NOT NULL, v text NOT NULL)",
        f.table
    ))
    .await
    .unwrap();
    f
}

fn event(partition: i32, offset: i64) -> Record {
    record(partition, offset, &format!(r#"{{"v":"e{partition}.{offset}"}}"#))
}

fn events(partition: i32, offsets: std::ops::Range<i64>) -> Vec<Record> {
    offsets.map(|o| event(partition, o)).collect()
}

/// (partition, offset) of every row, sorted, duplicates kept.
async fn rows(f: &Fixture) -> Vec<(i32, i64)> {
    f.db.query(
        &format!("SELECT part, off FROM \"{}\" ORDER BY part, off", f.table),
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

fn each_once(ranges: &[(i32, std::ops::Range<i64>)]) -> Vec<(i32, i64)> {
    ranges.iter().flat_map(|(p, r)| r.clone().map(|o| (*p, o))).collect()
}

/// The stored positions of a scope: (split, offset), by split.
async fn positions(f: &Fixture, scope: &str) -> Vec<(String, i64)> {
    f.db.query(
        "SELECT split, \"offset\" FROM exactly_positions WHERE scope = $1 ORDER BY split",
        &[&scope],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

fn at(entries: &[(&str, i64)]) -> Vec<(String, i64)> {
    entries.iter().map(|(s, o)| (s.to_string(), *o)).collect()
}

#[tokio::test]
async fn fenced_mode_writes_each_record_exactly_once_into_a_table_without_a_key() {
    let f = events_fixture().await;
    let factory = PostgresSinkFactory::new(f.config.clone()).unwrap();
    let scope = factory.fence_scope(&f.pipeline);
    assert_eq!(scope, format!("{}/postgres:{}", f.pipeline, f.table));

    let mut sink = erased(&f.config, &f.pipeline).await;
    sink.write(CheckpointId(1), &events(0, 0..5)).await.unwrap();
    sink.write(CheckpointId(1), &events(1, 0..3)).await.unwrap();
    assert!(rows(&f).await.is_empty(), "the open transaction is invisible");
    assert!(positions(&f, &scope).await.is_empty());
    sink.pre_commit().await.unwrap();
    assert_eq!(rows(&f).await, each_once(&[(0, 0..5), (1, 0..3)]));
    assert_eq!(positions(&f, &scope).await, at(&[("orders-0", 4), ("orders-1", 2)]));

    // The next interval is written but the process dies before its pre-commit.
    sink.write(CheckpointId(2), &events(0, 5..9)).await.unwrap();
    drop(sink);
    assert_eq!(rows(&f).await, each_once(&[(0, 0..5), (1, 0..3)]));
    assert_eq!(
        positions(&f, &scope).await,
        at(&[("orders-0", 4), ("orders-1", 2)]),
        "positions advance only on commit"
    );

    assert_eq!(replay_check_after_one(&f.config, &f.pipeline).await, ReplayCheck::Safe);

    // The restart replays from the last checkpoint (offset 0 here), overlapping
    // what was committed, and continues.
    let mut restarted = erased(&f.config, &f.pipeline).await;
    interval(&mut restarted, 3, &[events(0, 0..9), events(1, 0..6)]).await;
    let expected = each_once(&[(0, 0..9), (1, 0..6)]);
    assert_eq!(rows(&f).await, expected);
    assert_eq!(positions(&f, &scope).await, at(&[("orders-0", 8), ("orders-1", 5)]));
    drop(restarted);

    // Replaying everything once more changes nothing.
    let mut again = erased(&f.config, &f.pipeline).await;
    interval(&mut again, 4, &[events(1, 0..6), events(0, 0..9)]).await;
    assert_eq!(rows(&f).await, expected);

    // Another pipeline writing the same table has its own positions.
    let other = unique("pipe");
    let mut sink = erased(&f.config, &other).await;
    interval(&mut sink, 1, &[events(0, 0..2)]).await;
    assert_eq!(rows(&f).await.len(), expected.len() + 2);
    assert_eq!(
        positions(&f, &factory.fence_scope(&other)).await,
        at(&[("orders-0", 1)])
    );
}

#[tokio::test]
async fn fenced_dead_letters_are_fenced_too() {
    let f = events_fixture().await;
    let dead_letters = format!("{}_dead_letters", f.table);
    let mut batch = events(2, 0..2);
    batch.push(record(2, 2, "not json"));
    batch.push(record(2, 3, r#"{"w":1}"#));
    batch.extend(events(2, 4..6));

    let ctx = context(&f.pipeline, 0);
    let metrics = ctx.metrics.clone();
    let mut sink = PostgresSinkFactory::new(f.config.clone()).unwrap().create(ctx).unwrap();
    sink.recover(&[]).await.unwrap();
    interval(&mut sink, 1, std::slice::from_ref(&batch)).await;
    assert_eq!(metrics.snapshot().dead_letters, 2);
    drop(sink);
    for _ in 0..2 {
        let mut restarted = erased(&f.config, &f.pipeline).await;
        interval(&mut restarted, 2, std::slice::from_ref(&batch)).await;
    }
    assert_eq!(rows(&f).await, [(2, 0), (2, 1), (2, 4), (2, 5)]);
    let dead: Vec<i64> = column(
        &f.db,
        &format!("SELECT \"offset\" FROM \"{dead_letters}\" ORDER BY \"offset\""),
    )
    .await;
    assert_eq!(dead, [2, 3], "a replay does not repeat a dead letter");
}

/// The subtask locks keep a second process of the pipeline out (see
/// `tests/locks.rs`); the compare-and-set of the positions is the second
/// line: a writer of the same scope and split whose lock is another one (a
/// different subtask number) still cannot duplicate rows.
#[tokio::test]
async fn a_second_writer_of_the_same_scope_fails_instead_of_duplicating() {
    let f = events_fixture().await;
    let factory = PostgresSinkFactory::new(f.config.clone()).unwrap();
    let scope = factory.fence_scope(&f.pipeline);
    let mut live = factory.create_fenced_sink(&context(&f.pipeline, 0)).unwrap();
    let mut zombie = factory.create_fenced_sink(&context(&f.pipeline, 1)).unwrap();
    assert_eq!(live.scope(), scope);
    live.open().await.unwrap();
    zombie.open().await.unwrap();

    // Both read no position; the live one commits first.
    let outcome = live.write_fenced(&scope, &events(0, 0..4)).await.unwrap();
    assert_eq!((outcome.applied, outcome.skipped), (4, 0));
    live.flush().await.unwrap();
    assert_eq!(live.position("orders-0"), Some(3));
    zombie.write_fenced(&scope, &events(0, 0..4)).await.unwrap();
    let message = transient_message(zombie.flush().await);
    assert!(
        message.contains("changed while this sink was writing") && message.contains("one instance"),
        "{message}"
    );
    assert_eq!(rows(&f).await, each_once(&[(0, 0..4)]));
    // Its transaction is gone: it refuses to go on until it is opened again.
    let message = transient_message(zombie.write_fenced(&scope, &events(0, 4..5)).await.map(|_| ()));
    assert!(message.contains("restart from its last checkpoint"), "{message}");
    zombie.open().await.unwrap();
    let outcome = zombie.write_fenced(&scope, &events(0, 2..6)).await.unwrap();
    assert_eq!((outcome.applied, outcome.skipped), (2, 2));
    zombie.flush().await.unwrap();
    assert_eq!(rows(&f).await, each_once(&[(0, 0..6)]));

    // The live sink's position is stale now: its next commit is refused too.
    live.write_fenced(&scope, &events(0, 6..7)).await.unwrap();
    transient_message(live.flush().await);
    assert_eq!(rows(&f).await, each_once(&[(0, 0..6)]));
}

#[tokio::test]
async fn fenced_mode_with_an_upsert_key_upserts_under_the_fence() {
    let f = Fixture::new("kv", &kv_in("fenced")).await;
    let mut sink = erased(&f.config, &f.pipeline).await;
    interval(
        &mut sink,
        1,
        &[
            vec![kv(0, 0, 1, "a"), kv(0, 1, 1, "b")],
            vec![kv(0, 2, 1, "c"), kv(0, 3, 2, "d")],
        ],
    )
    .await;
    assert_eq!(pairs(&f.db, &f.table).await, expect_pairs(&[(1, "c"), (2, "d")]));
    drop(sink); // the process ends
    let mut restarted = erased(&f.config, &f.pipeline).await;
    interval(&mut restarted, 2, &[vec![kv(0, 1, 1, "x"), kv(0, 4, 2, "e")]]).await;
    assert_eq!(
        pairs(&f.db, &f.table).await,
        expect_pairs(&[(1, "c"), (2, "e")]),
        "the replayed offset 1 is dropped, offset 4 applied"
    );
}

#[tokio::test]
async fn a_positions_table_that_does_not_fit_is_refused_with_the_fix() {
    let f = events_fixture().await;
    let positions = unique("positions");
    let mut config = f.config.clone();
    config.positions_table = Some(positions.clone());
    for (alter, expected) in [
        (
            format!("CREATE TABLE \"{positions}\" (scope text, split text, \"offset\" bigint)"),
            "column \"updated_at\" should be timestamptz but is missing",
        ),
        (
            format!("ALTER TABLE \"{positions}\" ADD COLUMN updated_at timestamptz"),
            "ADD PRIMARY KEY (scope, split)",
        ),
    ] {
        f.db.batch_execute(&alter).await.unwrap();
        let message = fatal_message(created(&config, &f.pipeline).recover(&[]).await);
        assert!(message.contains(&positions) && message.contains(expected), "{message}");
    }
}

#[tokio::test]
async fn the_typed_sink_of_another_mode_is_refused() {
    let config = config("postgres://u@127.0.0.1:1/db", "t", &kv_in("upsert"));
    let factory = PostgresSinkFactory::new(config).unwrap();
    let ctx = context("pipe", 0);
    for result in [
        factory.create_fenced_sink(&ctx).map(|_| ()),
        factory.create_sink(ctx.clone()).recover(&[]).await,
    ] {
        let message = fatal_message(result);
        assert!(message.contains("mode is \"upsert\""), "{message}");
        assert!(message.contains("PostgresSinkFactory::create"), "{message}");
    }
    assert!(factory.create_upsert_sink(&ctx).is_ok());
}
