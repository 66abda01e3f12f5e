//! Rows the server refuses, with `on_rejected_row = "dead-letter"`, in every
//! mode against a real PostgreSQL: a row that breaks a CHECK constraint of
//! the user's table (SQLSTATE 23514) or makes a trigger fail with a data
//! exception (class 22) goes to the dead-letter table with the server's
//! message, counted; every other row is written once, in order (the last
//! value per key wins).

mod common;

use std::sync::Arc;

use common::*;
use exactly_core::{CheckpointId, ErasedSink, Metrics, Record, SinkContext, SinkFactory, TwoPhaseCommitSink};
use exactly_postgres::{PostgresSinkConfig, PostgresSinkFactory};
use tokio_postgres::Client;

/// Columns `id` and `v` of a table the test creates with `CHECK (v <> 'bad')`.
const KV: &str = r#"
on_rejected_row = "dead-letter"
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
v = { from = "/v", type = "text" }
"#;

/// Creates `table` (id, v) refusing `v = 'bad'`, with `id` the primary key
/// when `keyed`.
async fn create_checked_table(db: &Client, table: &str, keyed: bool) {
    let key = if keyed { " PRIMARY KEY" } else { "" };
    db.batch_execute(&format!(
        "CREATE TABLE \"{table}\" (id bigint{key}, v text CONSTRAINT no_bad CHECK (v <> 'bad'))"
    ))
    .await
    .unwrap();
}

/// `(offset, error)` of the dead letters of `table`, by offset.
async fn dead_letters(db: &Client, table: &str) -> Vec<(i64, String)> {
    db.query(
        &format!("SELECT \"offset\", error FROM \"{table}_dead_letters\" ORDER BY \"offset\""),
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// Asserts that the dead letters are the records at `offsets`, each with
/// the server's message naming the CHECK constraint.
async fn assert_refused(db: &Client, table: &str, offsets: &[i64]) {
    let dead = dead_letters(db, table).await;
    assert_eq!(dead.iter().map(|(o, _)| *o).collect::<Vec<_>>(), offsets, "{dead:?}");
    for (_, error) in &dead {
        assert!(
            error.contains("PostgreSQL refused the row: 23514") && error.contains("\"no_bad\""),
            "{error}"
        );
    }
}

/// The sink of `config` in its mode, as the runtime would drive it, with
/// its metrics.
async fn erased(config: &PostgresSinkConfig, pipeline: &str) -> (Box<dyn ErasedSink>, Arc<Metrics>) {
    let context = SinkContext::new(pipeline, 0, 1, Arc::new(Metrics::default()));
    let metrics = context.metrics.clone();
    let factory = PostgresSinkFactory::new(config.clone()).expect("valid config");
    let mut sink = factory.create(context).expect("create");
    sink.recover(&[]).await.expect("recover");
    (sink, metrics)
}

/// Records `(offset, id, v)` of partition 0.
fn kvs(rows: &[(i64, i64, &str)]) -> Vec<Record> {
    rows.iter().map(|(offset, id, v)| kv(0, *offset, *id, v)).collect()
}

#[tokio::test]
async fn two_phase_append_sends_exactly_the_refused_rows_to_the_dead_letters_and_commits_the_rest() {
    let f = Fixture::new("refused_append", KV).await;
    create_checked_table(&f.db, &f.table, false).await;
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    // 600 rows over three batches of one COPY, every 50th refused; and a
    // batch whose refused row is its first.
    let records: Vec<Record> = (0..600)
        .map(|i| kv(0, i, i, if i % 50 == 7 { "bad" } else { "ok" }))
        .collect();
    let batches: Vec<Vec<Record>> = records.chunks(200).map(<[Record]>::to_vec).collect();
    let mut txn = sink.begin(CheckpointId(1)).await.unwrap();
    for batch in &batches {
        sink.write(&mut txn, batch).await.unwrap();
    }
    sink.write(&mut txn, &kvs(&[(600, 600, "bad"), (601, 601, "ok")]))
        .await
        .unwrap();
    let c = sink.pre_commit(txn).await.unwrap();
    sink.commit(&c).await.unwrap();

    let refused: Vec<i64> = (0..602).filter(|i| *i % 50 == 7 || *i == 600).collect();
    assert_refused(&f.db, &f.table, &refused).await;
    let ids: Vec<i64> = column(&f.db, &format!("SELECT id FROM \"{}\" ORDER BY id", f.table)).await;
    let written: Vec<i64> = (0..602).filter(|i| !refused.contains(i)).collect();
    assert_eq!(ids, written, "every other row once");
    assert_eq!(metrics.snapshot().dead_letters, refused.len() as u64);

    // The transaction goes on after the isolation: a later checkpoint too.
    let c = prepare(&mut sink, 2, &[kvs(&[(602, 602, "bad"), (603, 603, "ok")])]).await;
    sink.commit(&c).await.unwrap();
    assert_eq!(f.count().await, written.len() as i64 + 1);
    assert_eq!(dead_letters(&f.db, &f.table).await.len(), refused.len() + 1);
}

#[tokio::test]
async fn a_data_exception_of_a_trigger_is_refused_like_a_constraint() {
    let f = Fixture::new("refused_trigger", KV).await;
    f.db.batch_execute(&format!(
        "CREATE TABLE \"{t}\" (id bigint, v text); \
         CREATE FUNCTION \"{t}_check\"() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN PERFORM 1 / (NEW.id - 13); RETURN NEW; END $$; \
         CREATE TRIGGER \"{t}_check\" BEFORE INSERT ON \"{t}\" FOR EACH ROW EXECUTE FUNCTION \"{t}_check\"()",
        t = f.table
    ))
    .await
    .unwrap();
    let (mut sink, _) = f.recovered(0, &[]).await;
    let records: Vec<Record> = (10..20).map(|i| kv(0, i, i, "x")).collect();
    let c = prepare(&mut sink, 1, &[records]).await;
    sink.commit(&c).await.unwrap();
    let dead = dead_letters(&f.db, &f.table).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, 13);
    assert!(
        dead[0].1.contains("22012") && dead[0].1.contains("division by zero"),
        "{}",
        dead[0].1
    );
    assert_eq!(f.count().await, 9);
}

#[tokio::test]
async fn two_phase_with_a_key_isolates_refused_rows_at_the_merge_and_keeps_the_last_good_value() {
    let body = format!("upsert_key = [\"id\"]\n{KV}");
    let f = Fixture::new("refused_merge", &body).await;
    create_checked_table(&f.db, &f.table, true).await;
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let c = prepare(
        &mut sink,
        1,
        &[
            kvs(&[(0, 1, "a"), (1, 2, "b"), (2, 1, "bad")]),
            kvs(&[(3, 3, "c"), (4, 3, "bad"), (5, 4, "d")]),
        ],
    )
    .await;
    sink.commit(&c).await.unwrap();
    assert_eq!(
        pairs(&f.db, &f.table).await,
        expect_pairs(&[(1, "a"), (2, "b"), (3, "c"), (4, "d")]),
        "a refused last value leaves the key's last good one"
    );
    assert_refused(&f.db, &f.table, &[2, 4]).await;
    let raw: Vec<Vec<u8>> = column(
        &f.db,
        &format!("SELECT value FROM \"{}_dead_letters\" ORDER BY \"offset\"", f.table),
    )
    .await;
    assert_eq!(raw[0], br#"{"id":1,"v":"bad"}"#, "the record's value is kept");
    assert_eq!(metrics.snapshot().dead_letters, 2);
    let staged: i64 = column(&f.db, &format!("SELECT count(*) FROM \"{}_exactly_staging\"", f.table)).await[0];
    assert_eq!(staged, 0, "nothing left staged");
}

#[tokio::test]
async fn upsert_mode_isolates_refused_rows_and_a_replay_repeats_nothing() {
    let body = format!("mode = \"upsert\"\nupsert_key = [\"id\"]\n{KV}");
    let f = Fixture::new("refused_upsert", &body).await;
    create_checked_table(&f.db, &f.table, true).await;
    let batch = kvs(&[(0, 1, "a"), (1, 2, "bad"), (2, 1, "bad"), (3, 3, "c")]);
    let (mut sink, metrics) = erased(&f.config, &f.pipeline).await;
    sink.write(CheckpointId(1), &batch).await.unwrap();
    assert_eq!(metrics.snapshot().dead_letters, 2);
    drop(sink);
    // A replay after a crash writes the same batch again.
    let (mut sink, _) = erased(&f.config, &f.pipeline).await;
    sink.write(CheckpointId(1), &batch).await.unwrap();
    assert_eq!(pairs(&f.db, &f.table).await, expect_pairs(&[(1, "a"), (3, "c")]));
    assert_refused(&f.db, &f.table, &[1, 2]).await;
}

#[tokio::test]
async fn fenced_mode_isolates_refused_rows_inside_its_transaction() {
    let body = format!("mode = \"fenced\"\n{KV}");
    let f = Fixture::new("refused_fenced", &body).await;
    create_checked_table(&f.db, &f.table, false).await;
    let (mut sink, metrics) = erased(&f.config, &f.pipeline).await;
    sink.write(CheckpointId(1), &kvs(&[(0, 1, "a"), (1, 2, "bad")]))
        .await
        .unwrap();
    sink.write(CheckpointId(1), &kvs(&[(2, 3, "bad"), (3, 4, "d")]))
        .await
        .unwrap();
    assert_eq!(f.count().await, 0, "nothing visible before the checkpoint");
    sink.pre_commit().await.unwrap();
    assert_eq!(pairs(&f.db, &f.table).await, expect_pairs(&[(1, "a"), (4, "d")]));
    assert_refused(&f.db, &f.table, &[1, 2]).await;
    assert_eq!(metrics.snapshot().dead_letters, 2);
}

/// Without `on_rejected_row`, a refused row still stops the pipeline with
/// the server's error naming the constraint.
#[tokio::test]
async fn by_default_a_refused_row_fails_the_write_naming_the_constraint() {
    let f = Fixture::new(
        "refused_default",
        &KV.replace("on_rejected_row = \"dead-letter\"\n", ""),
    )
    .await;
    create_checked_table(&f.db, &f.table, false).await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let mut txn = sink.begin(CheckpointId(1)).await.unwrap();
    sink.write(&mut txn, &kvs(&[(0, 1, "a"), (1, 2, "bad")])).await.unwrap();
    let message = fatal_message(sink.pre_commit(txn).await.map(drop));
    assert!(message.contains("23514") && message.contains("no_bad"), "{message}");
}
