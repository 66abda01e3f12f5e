//! Keys and deletes against a real PostgreSQL: the primary key from the
//! record key, the record value or the Kafka coordinates (`pk.mode`,
//! `pk.fields`), tombstones that delete the row of their key
//! (`delete.enabled`) in every mode — several changes to one key in one
//! checkpoint interval apply in offset order — and tombstones of a table
//! that does not delete (`on_tombstone`).

mod common;

use std::sync::Arc;

use common::*;
use exactly_core::{
    CheckpointId, ConnectorError, ErasedSink, Metrics, Record, SinkContext, SinkFactory, TwoPhaseCommitSink,
};
use exactly_postgres::{PostgresSinkConfig, PostgresSinkFactory};

/// A table keyed by the record key, `v` from the value; tombstones delete.
const BY_RECORD_KEY: &str = r#"
create_table = true
pk.mode = "record_key"
pk.fields = ["id"]
delete.enabled = true
[sink.postgres.columns]
id = { type = "bigint" }
v = { from = "/v", type = "text" }
"#;

/// `{"v": "<v>"}` keyed `<key>` (a JSON number, or any key bytes).
fn put(offset: i64, key: &str, v: &str) -> Record {
    record(0, offset, &format!(r#"{{"v":"{v}"}}"#)).with_key(key.to_string())
}

/// A tombstone keyed `<key>`.
fn delete(offset: i64, key: &str) -> Record {
    Record::tombstone("orders-0", offset).with_key(key.to_string())
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

/// Changes of one interval: insert then delete (ends deleted), delete then
/// insert (ends inserted), delete of a key written before, updates; keys
/// as JSON numbers and as objects.
fn one_interval() -> Vec<Vec<Record>> {
    vec![
        vec![put(10, "1", "a"), delete(11, "1"), delete(12, "2"), put(13, "2", "b2")],
        vec![
            put(14, r#"{"id":3}"#, "c"),
            put(15, "4", "d"),
            put(16, "4", "d2"),
            delete(17, r#"{"id":5}"#),
        ],
    ]
}

/// What the table holds after [`before`] and [`one_interval`].
fn expected_after() -> Vec<(i64, String)> {
    expect_pairs(&[(2, "b2"), (3, "c"), (4, "d2"), (6, "f")])
}

/// Keys 1, 2, 5 and 6, written in an earlier interval.
fn before() -> Vec<Record> {
    vec![put(0, "1", "x"), put(1, "2", "y"), put(2, "5", "z"), put(3, "6", "f")]
}

#[tokio::test]
async fn two_phase_deletes_by_record_key_in_offset_order_within_a_checkpoint() {
    let f = Fixture::new("del_two_phase", BY_RECORD_KEY).await;
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let c = prepare(&mut sink, 1, &[before()]).await;
    sink.commit(&c).await.unwrap();
    let c = prepare(&mut sink, 2, &one_interval()).await;
    assert_eq!(
        pairs(&f.db, &f.table).await.len(),
        4,
        "nothing of interval 2 before its commit"
    );
    sink.commit(&c).await.unwrap();
    assert_eq!(pairs(&f.db, &f.table).await, expected_after());
    assert_eq!(metrics.snapshot().dead_letters, 0);
}

#[tokio::test]
async fn upsert_and_fenced_modes_delete_by_record_key_and_replays_end_the_same() {
    for mode in ["upsert", "fenced"] {
        let f = Fixture::new(&format!("del_{mode}"), &format!("mode = \"{mode}\"\n{BY_RECORD_KEY}")).await;
        let (mut sink, _) = erased(&f.config, &f.pipeline).await;
        sink.write(CheckpointId(1), &before()).await.unwrap();
        sink.pre_commit().await.unwrap();
        for batch in one_interval() {
            sink.write(CheckpointId(2), &batch).await.unwrap();
        }
        sink.pre_commit().await.unwrap();
        assert_eq!(pairs(&f.db, &f.table).await, expected_after(), "{mode}");
        drop(sink);
        // A crash before checkpoint 2 completed: the interval is replayed.
        let (mut sink, _) = erased(&f.config, &f.pipeline).await;
        for batch in one_interval() {
            sink.write(CheckpointId(2), &batch).await.unwrap();
        }
        sink.pre_commit().await.unwrap();
        assert_eq!(
            pairs(&f.db, &f.table).await,
            expected_after(),
            "{mode}, after the replay"
        );
    }
}

#[tokio::test]
async fn a_tombstone_without_a_key_is_a_dead_letter_not_a_delete() {
    let f = Fixture::new("del_no_key", BY_RECORD_KEY).await;
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let c = prepare(
        &mut sink,
        1,
        &[vec![put(0, "1", "a"), Record::tombstone("orders-0", 1)]],
    )
    .await;
    sink.commit(&c).await.unwrap();
    assert_eq!(pairs(&f.db, &f.table).await, expect_pairs(&[(1, "a")]));
    assert_eq!(metrics.snapshot().dead_letters, 1);
}

#[tokio::test]
async fn an_append_table_sends_tombstones_to_the_dead_letters_unless_told_to_write_them() {
    let body = r#"
create_table = true
[sink.postgres.columns]
off = { from = "offset", type = "bigint" }
v = { from = "/v", type = "text", required = false }
"#;
    let f = Fixture::new("tomb_append", body).await;
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let c = prepare(&mut sink, 1, &[vec![put(0, "1", "a"), delete(1, "1")]]).await;
    sink.commit(&c).await.unwrap();
    assert_eq!(f.count().await, 1, "no empty row for the tombstone");
    assert_eq!(metrics.snapshot().dead_letters, 1);
    let error: Vec<String> = column(&f.db, &format!("SELECT error FROM \"{}_dead_letters\"", f.table)).await;
    assert!(
        error[0].contains("tombstone") && error[0].contains("delete.enabled") && error[0].contains("on_tombstone"),
        "{}",
        error[0]
    );
    let value: Vec<Option<Vec<u8>>> = column(&f.db, &format!("SELECT value FROM \"{}_dead_letters\"", f.table)).await;
    assert_eq!(value, [None], "the null value is kept");

    drop(sink);
    let mut config = f.config.clone();
    config.on_tombstone = Some(exactly_postgres::OnTombstone::Write);
    let (mut sink, _) = new_sink(&config, &f.pipeline, 0);
    sink.recover(&[]).await.unwrap();
    let c = prepare(&mut sink, 2, &[vec![delete(2, "1")]]).await;
    sink.commit(&c).await.unwrap();
    let rows: Vec<Option<String>> = column(&f.db, &format!("SELECT v FROM \"{}\" WHERE off = 2", f.table)).await;
    assert_eq!(
        rows,
        [None],
        "on_tombstone = \"write\": a row, NULL where the value was"
    );
}

#[tokio::test]
async fn kafka_coordinates_as_the_key_add_their_columns_and_make_replays_harmless() {
    let body = r#"
mode = "upsert"
create_table = true
pk.mode = "kafka"
[sink.postgres.columns]
v = { from = "/v", type = "text" }
"#;
    let f = Fixture::new("pk_kafka", body).await;
    let batch = vec![put(0, "k", "a"), put(1, "k", "b")];
    for _ in 0..2 {
        let (mut sink, _) = erased(&f.config, &f.pipeline).await;
        sink.write(CheckpointId(1), &batch).await.unwrap();
    }
    let rows =
        f.db.query(
            &format!(
                "SELECT __connect_topic, __connect_partition, __connect_offset, v FROM \"{}\" ORDER BY 3",
                f.table
            ),
            &[],
        )
        .await
        .unwrap();
    let rows: Vec<(String, i32, i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    assert_eq!(
        rows,
        [
            ("orders".to_string(), 0, 0, "a".to_string()),
            ("orders".to_string(), 0, 1, "b".to_string())
        ]
    );
}

#[tokio::test]
async fn a_key_from_value_fields_upserts_on_them() {
    let body = r#"
create_table = true
pk.mode = "record_value"
pk.fields = ["region", "id"]
[sink.postgres.columns]
region = { type = "text" }
id = { type = "bigint" }
v = { from = "/v", type = "text" }
"#;
    let f = Fixture::new("pk_value", body).await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let value = |offset: i64, region: &str, id: i64, v: &str| {
        record(0, offset, &format!(r#"{{"region":"{region}","id":{id},"v":"{v}"}}"#))
    };
    let c = prepare(
        &mut sink,
        1,
        &[vec![
            value(0, "eu", 1, "a"),
            value(1, "us", 1, "b"),
            value(2, "eu", 1, "c"),
        ]],
    )
    .await;
    sink.commit(&c).await.unwrap();
    let rows: Vec<String> = column(
        &f.db,
        &format!("SELECT region || ':' || id || '=' || v FROM \"{}\" ORDER BY 1", f.table),
    )
    .await;
    assert_eq!(rows, ["eu:1=c", "us:1=b"]);
}

#[test]
fn key_settings_are_checked_naming_the_key_and_the_fix() {
    let fatal = |body: &str| match PostgresSinkFactory::new(config("postgres://h/db", "t", body)) {
        Err(ConnectorError::Fatal { message, .. }) => message,
        other => panic!("expected a fatal error for {body}, got {other:?}"),
    };
    let columns = "[sink.postgres.columns]\nid = { type = \"bigint\" }\nv = { from = \"/v\", type = \"text\" }\n";
    for (keys, expected) in [
        ("pk.mode = \"record_key\"", "sink.postgres.pk.fields"),
        (
            "pk.fields = [\"id\"]",
            "sink.postgres.pk.fields: is set while pk.mode is \"none\"",
        ),
        (
            "pk.mode = \"record_key\"\npk.fields = [\"id\"]\nupsert_key = [\"id\"]",
            "sink.postgres.upsert_key",
        ),
        (
            "delete.enabled = true\nupsert_key = [\"v\"]",
            "sink.postgres.columns.id.from: is missing",
        ),
        (
            "pk.mode = \"record_value\"\npk.fields = [\"v\"]\ndelete.enabled = true\n[x]",
            "sink.postgres.delete.enabled",
        ),
        (
            "pk.mode = \"record_key\"\npk.fields = [\"id\"]\ndelete.enabled = true\non_tombstone = \"write\"",
            "sink.postgres.on_tombstone",
        ),
        (
            "pk.mode = \"record_key\"\npk.fields = [\"nope\"]\n[sink.postgres.columns]\nv = { from = \"/v\", type = \
             \"text\" }\n[x]",
            "sink.postgres.columns.nope",
        ),
        ("pk.mode = \"kafka\"\npk.fields = [\"a\"]", "three names"),
    ] {
        // A case ending in `[x]` brings its own columns (or, with none, a
        // value field of pk.fields as the only one).
        let body = match keys.strip_suffix("\n[x]") {
            Some(keys) if keys.contains("[sink.postgres.columns]") => format!("{keys}\n"),
            Some(keys) => format!("{keys}\n[sink.postgres.columns]\nv = {{ type = \"text\" }}\n"),
            None => format!("{keys}\n{columns}"),
        };
        let message = fatal(&body);
        assert!(
            message.contains(expected) && message.contains("Fix:"),
            "{keys}: {message}"
        );
    }
    let message = fatal(
        "pk.mode = \"record_key\"\npk.fields = [\"id\"]\n[sink.postgres.columns]\nid = { from = \"/id\", type = \
         \"bigint\" }\n",
    );
    assert!(
        message.contains("sink.postgres.columns.id.from") && message.contains("record key"),
        "{message}"
    );
    let fine = config(
        "postgres://h/db",
        "t",
        &format!("pk.mode = \"record_key\"\npk.fields = [\"id\"]\ndelete.enabled = true\n{columns}"),
    );
    let identity = PostgresSinkFactory::new(fine).unwrap().identity();
    assert!(
        identity.ends_with(",pk=record_key:id,delete,commit_log=exactly_commit_log"),
        "{identity}"
    );
}

/// A staging table of an older version (no delete flag) holding rows of a
/// prepared transaction: turning deletes on waits for recovery to commit
/// that transaction, then adds the column, and deletes work.
#[tokio::test]
async fn an_older_staging_table_gets_the_delete_flag_once_recovery_committed_its_rows() {
    let f = Fixture::new("del_upgrade", BY_RECORD_KEY).await;
    f.db.batch_execute(&format!(
        "CREATE TABLE \"{t}\" (id bigint PRIMARY KEY, v text NOT NULL); \
         CREATE TABLE \"{t}_exactly_staging\" AS SELECT ''::text AS exactly_gid, 0::bigint AS exactly_seq, id, v \
         FROM \"{t}\" WITH NO DATA",
        t = f.table
    ))
    .await
    .unwrap();
    let mut without_deletes = f.config.clone();
    without_deletes.delete = Default::default();
    let (mut old, _) = new_sink(&without_deletes, &f.pipeline, 0);
    old.recover(&[]).await.unwrap();
    let pending = prepare(&mut old, 1, &[vec![put(0, "1", "a"), put(1, "2", "b")]]).await;
    drop(old);

    let (mut sink, _) = f.recovered(0, std::slice::from_ref(&pending)).await;
    assert_eq!(pairs(&f.db, &f.table).await, expect_pairs(&[(1, "a"), (2, "b")]));
    let c = prepare(&mut sink, 2, &[vec![delete(2, "1"), put(3, "3", "c")]]).await;
    sink.commit(&c).await.unwrap();
    assert_eq!(pairs(&f.db, &f.table).await, expect_pairs(&[(2, "b"), (3, "c")]));
}
