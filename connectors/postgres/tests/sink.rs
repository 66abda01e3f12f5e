//! The PostgreSQL sink against a real PostgreSQL (exactly-testkit, or
//! `EXACTLY_DATABASE_URL`; tests that create roles use a server of their
//! own). Every test writes tables and a pipeline of unique names.

mod common;

use std::time::Duration;

use common::*;
use exactly_core::{
    CheckpointId, ConnectorError, Record, ReplayCheck, RestorableCheckpoints, SinkFactory, TwoPhaseCommitSink,
};
use exactly_postgres::{PostgresCommittable, PostgresSinkFactory};
use serde_json::json;

const ID_NAME: &str = r#"
create_table = true
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
name = { from = "/name", type = "text" }
"#;

fn people(partition: i32, from: i64, n: i64) -> Vec<Record> {
    (from..from + n)
        .map(|i| record(partition, i, &format!(r#"{{"id":{i},"name":"n{i}"}}"#)))
        .collect()
}

#[tokio::test]
async fn rows_are_invisible_until_commit_and_commit_is_idempotent() {
    let f = Fixture::new("people", ID_NAME).await;
    let (db, table, pipeline) = (&f.db, &f.table, &f.pipeline);
    let (mut sink, _) = f.recovered(0, &[]).await;

    let mut txn = sink.begin(CheckpointId(1)).await.unwrap();
    sink.write(&mut txn, &people(0, 0, 2)).await.unwrap();
    sink.write(&mut txn, &people(0, 2, 1)).await.unwrap();
    assert_eq!(f.count().await, 0, "open transaction is invisible");
    let c = sink.pre_commit(txn).await.unwrap();
    assert_eq!(c.gid, format!("exactly:{pipeline}:{table}:0:1"));
    assert_eq!((c.checkpoint, c.subtask), (CheckpointId(1), 0));
    assert_eq!(f.count().await, 0, "prepared transaction is invisible");
    assert_eq!(prepared(db, sink.gid_prefix()).await, vec![c.gid.clone()]);

    sink.commit(&c).await.unwrap();
    assert_eq!(f.count().await, 3);
    sink.commit(&c).await.unwrap();
    assert_eq!(f.count().await, 3, "a second commit changes nothing");
    assert!(prepared(db, sink.gid_prefix()).await.is_empty());

    let marker = db
        .query_one(
            "SELECT pipeline, sink_table, subtask, checkpoint, prepared_at <= now() FROM exactly_commit_log \
             WHERE gid = $1",
            &[&c.gid],
        )
        .await
        .unwrap();
    assert_eq!(marker.get::<_, String>(0), *pipeline);
    assert_eq!(marker.get::<_, String>(1), *table);
    assert_eq!(marker.get::<_, i32>(2), 0);
    assert_eq!(marker.get::<_, i64>(3), 1);
    assert!(marker.get::<_, bool>(4));
}

#[tokio::test]
async fn aborted_transactions_leave_nothing() {
    let f = Fixture::new("people", ID_NAME).await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let mut txn = sink.begin(CheckpointId(1)).await.unwrap();
    sink.write(&mut txn, &people(0, 0, 5)).await.unwrap();
    sink.abort(txn).await.unwrap();
    let c = prepare(&mut sink, 2, &[people(0, 5, 1)]).await;
    sink.commit(&c).await.unwrap();
    let ids: Vec<i64> = column(&f.db, &format!("SELECT id FROM \"{}\"", f.table)).await;
    assert_eq!(ids, [5]);
}

#[tokio::test]
async fn a_new_sink_commits_the_listed_transaction_in_recover() {
    let f = Fixture::new("people", ID_NAME).await;
    let (mut first, _) = f.recovered(0, &[]).await;
    let c = prepare(&mut first, 1, &[people(0, 0, 4)]).await;
    drop(first); // the process "crashes" after pre_commit
    assert_eq!(f.count().await, 0);

    let (mut second, _) = f.recovered(0, std::slice::from_ref(&c)).await;
    assert_eq!(f.count().await, 4);
    second.recover(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(f.count().await, 4, "recovery is idempotent");
    assert!(prepared(&f.db, second.gid_prefix()).await.is_empty());

    let next = prepare(&mut second, 2, &[people(0, 4, 1)]).await;
    second.commit(&next).await.unwrap();
    assert_eq!(f.count().await, 5);
}

#[tokio::test]
async fn recover_rolls_back_unlisted_prepared_transactions_of_its_own_subtask_only() {
    let f = Fixture::new("people", ID_NAME).await;
    let db = &f.db;
    let (mut s0, _) = f.recovered(0, &[]).await;
    let (mut s1, _) = f.recovered(1, &[]).await;
    let listed = prepare(&mut s0, 1, &[people(0, 0, 2)]).await;
    let orphan = prepare(&mut s0, 2, &[people(0, 2, 3)]).await;
    let other = prepare(&mut s1, 2, &[people(1, 0, 7)]).await;
    let (prefix0, prefix1) = (s0.gid_prefix().to_string(), s1.gid_prefix().to_string());
    assert_eq!(prepared(db, &prefix0).await, [listed.gid.clone(), orphan.gid.clone()]);
    drop((s0, s1));

    f.recovered(0, std::slice::from_ref(&listed)).await;
    assert_eq!(f.count().await, 2, "only the listed transaction is committed");
    assert!(prepared(db, &prefix0).await.is_empty(), "the orphan is rolled back");
    assert_eq!(
        prepared(db, &prefix1).await,
        vec![other.gid],
        "subtask 1's is not touched"
    );

    f.recovered(1, &[]).await;
    assert!(prepared(db, &prefix1).await.is_empty());
    assert_eq!(f.count().await, 2);
}

#[tokio::test]
async fn a_vanished_gid_is_success_with_its_marker_and_data_loss_without() {
    let f = Fixture::new("people", ID_NAME).await;
    let db = &f.db;
    let (mut sink, _) = f.recovered(0, &[]).await;

    // Committed behind the sink's back: the marker proves it.
    let committed = prepare(&mut sink, 7, &[people(0, 0, 1)]).await;
    db.batch_execute(&format!("COMMIT PREPARED '{}'", committed.gid))
        .await
        .unwrap();
    sink.commit(&committed).await.unwrap();
    assert_eq!(f.count().await, 1);

    // Rolled back behind the sink's back: nothing proves it was written.
    let lost = prepare(&mut sink, 8, &[people(0, 1, 1)]).await;
    db.batch_execute(&format!("ROLLBACK PREPARED '{}'", lost.gid))
        .await
        .unwrap();
    for result in [
        sink.commit(&lost).await,
        sink.recover(std::slice::from_ref(&lost)).await,
    ] {
        match result {
            Err(ConnectorError::DataLoss {
                checkpoint, message, ..
            }) => {
                assert_eq!(checkpoint, CheckpointId(8));
                assert!(message.contains(&lost.gid), "{message}");
                assert!(message.contains("checkpoint 8"), "{message}");
            }
            other => panic!("expected DataLoss, got {other:?}"),
        }
    }
    let never = PostgresCommittable {
        gid: format!("{}99", sink.gid_prefix()),
        checkpoint: CheckpointId(99),
        subtask: 0,
        tables: Vec::new(),
    };
    assert!(matches!(
        sink.commit(&never).await,
        Err(ConnectorError::DataLoss { .. })
    ));
    assert_eq!(f.count().await, 1);
}

#[tokio::test]
async fn upsert_mode_keeps_the_last_value_per_key_and_never_blocks_on_a_prepared_transaction() {
    let f = Fixture::new("kv", KV_UPSERT).await;
    let (db, table) = (&f.db, &f.table);
    let staging = format!("{table}_exactly_staging");
    let (mut sink, _) = f.recovered(0, &[]).await;

    // Repeated keys inside one batch and across batches of a transaction.
    let c1 = prepare(
        &mut sink,
        1,
        &[
            vec![kv(0, 0, 1, "a"), kv(0, 1, 2, "b"), kv(0, 2, 1, "c")],
            vec![kv(0, 3, 2, "d")],
        ],
    )
    .await;
    assert!(pairs(db, table).await.is_empty(), "nothing visible before commit");
    // The next interval upserts key 1 again while checkpoint 1 is still
    // prepared: it must not wait for checkpoint 1's commit.
    let c2 = tokio::time::timeout(
        Duration::from_secs(20),
        prepare(&mut sink, 2, &[vec![kv(0, 4, 1, "e")]]),
    )
    .await
    .expect("writing a key held by a prepared transaction must not block");
    sink.commit(&c1).await.unwrap();
    assert_eq!(pairs(db, table).await, expect_pairs(&[(1, "c"), (2, "d")]));
    sink.commit(&c2).await.unwrap();
    assert_eq!(pairs(db, table).await, expect_pairs(&[(1, "e"), (2, "d")]));
    sink.commit(&c1).await.unwrap();
    assert_eq!(
        pairs(db, table).await,
        expect_pairs(&[(1, "e"), (2, "d")]),
        "re-committing an old checkpoint does not re-apply it"
    );
    assert_eq!(count(db, &staging).await, 0, "staged rows are moved, not copied");

    // A crash between COMMIT PREPARED and the merge: recovery finishes it,
    // whether the checkpoint lists the transaction or not.
    let c3 = prepare(&mut sink, 3, &[vec![kv(0, 5, 2, "f")]]).await;
    let c4 = prepare(&mut sink, 4, &[vec![kv(0, 6, 3, "g")]]).await;
    for c in [&c3, &c4] {
        db.batch_execute(&format!("COMMIT PREPARED '{}'", c.gid)).await.unwrap();
    }
    drop(sink);
    assert_eq!(pairs(db, table).await, expect_pairs(&[(1, "e"), (2, "d")]));
    let (restarted, _) = f.recovered(0, std::slice::from_ref(&c3)).await;
    assert_eq!(pairs(db, table).await, expect_pairs(&[(1, "e"), (2, "f"), (3, "g")]));
    assert_eq!(count(db, &staging).await, 0);
    assert!(prepared(db, restarted.gid_prefix()).await.is_empty());
}

#[tokio::test]
async fn columns_map_record_fields_json_pointers_headers_and_timestamps() {
    let f = Fixture::new(
        "mapped",
        r#"
create_table = true
[sink.postgres.columns]
topic = { from = "topic", type = "text" }
part = { from = "partition", type = "int" }
off = { from = "offset", type = "bigint" }
k = { from = "key", type = "bytea" }
ts = { from = "timestamp", type = "timestamptz" }
hdrs = { from = "headers", type = "jsonb" }
raw = { from = "value", type = "bytea" }
doc = { from = "value", type = "json" }
id = { from = "/id", type = "bigint" }
customer = { from = "/customer/name", type = "text" }
amount = { from = "/amount", type = "numeric" }
paid = { from = "/paid", type = "boolean" }
score = { from = "/score", type = "double" }
ratio = { from = "/ratio", type = "real" }
small = { from = "/small", type = "smallint" }
created = { from = "/created", type = "timestamptz" }
tags = { from = "/tags", type = "jsonb" }
note = { from = "/note", type = "text", required = false }
"#,
    )
    .await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let value = r#"{"id":7,"customer":{"name":"Ada"},"amount":"12345.6789","paid":true,"score":0.5,"ratio":1.5,
        "small":-3,"created":"2024-05-01T12:30:00+02:00","tags":["a",{"b":1}]}"#;
    let mut first = record(3, 42, value).with_key("k1");
    first.timestamp_ms = Some(1_700_000_000_123);
    first.headers = vec![
        ("trace".into(), Some(b"abc".to_vec())),
        ("bin".into(), Some(vec![0, 255])),
    ];
    let c = prepare(&mut sink, 1, &[vec![first]]).await;
    sink.commit(&c).await.unwrap();

    let row =
        f.db.query_one(
            &format!(
                "SELECT topic, part, off, k, (extract(epoch FROM ts) * 1000)::bigint, hdrs, raw, doc::text, id, \
                 customer, amount::text, paid, score, ratio, small, created = '2024-05-01T10:30:00Z'::timestamptz, \
                 tags, note IS NULL FROM \"{}\"",
                f.table
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "orders");
    assert_eq!(row.get::<_, i32>(1), 3);
    assert_eq!(row.get::<_, i64>(2), 42);
    assert_eq!(row.get::<_, Vec<u8>>(3), b"k1");
    assert_eq!(row.get::<_, i64>(4), 1_700_000_000_123);
    assert_eq!(
        row.get::<_, serde_json::Value>(5),
        json!({"trace": "abc", "bin": "\\x00ff"})
    );
    assert_eq!(row.get::<_, Vec<u8>>(6), value.as_bytes());
    assert_eq!(row.get::<_, String>(7), value, "json keeps the text as is");
    assert_eq!(row.get::<_, i64>(8), 7);
    assert_eq!(row.get::<_, String>(9), "Ada");
    assert_eq!(row.get::<_, String>(10), "12345.6789");
    assert!(row.get::<_, bool>(11));
    assert_eq!(row.get::<_, f64>(12), 0.5);
    assert_eq!(row.get::<_, f32>(13), 1.5);
    assert_eq!(row.get::<_, i16>(14), -3);
    assert!(row.get::<_, bool>(15), "the offset +02:00 is honoured");
    assert_eq!(row.get::<_, serde_json::Value>(16), json!(["a", {"b": 1}]));
    assert!(row.get::<_, bool>(17), "a missing optional field is NULL");
}

#[tokio::test]
async fn numerics_reach_the_server_exactly() {
    let f = Fixture::new(
        "numbers",
        r#"
create_table = true
[sink.postgres.columns]
id = { from = "offset", type = "bigint" }
n = { from = "/n", type = "numeric" }
"#,
    )
    .await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let cases = [
        (r#""12345.6789""#, "12345.6789"),
        (r#""-0.5""#, "-0.5"),
        (r#""0""#, "0"),
        (r#""0.00001""#, "0.00001"),
        (r#""-0.000""#, "0.000"),
        (
            r#""123456789012345678901234567890.123456789""#,
            "123456789012345678901234567890.123456789",
        ),
        (r#""1e3""#, "1000"),
        (r#""1.50""#, "1.50"),
        (r#""NaN""#, "NaN"),
        ("12.25", "12.25"),
        ("-7", "-7"),
        (r#""100000000""#, "100000000"),
    ];
    let records: Vec<Record> = cases
        .iter()
        .enumerate()
        .map(|(i, (n, _))| record(0, i as i64, &format!(r#"{{"n":{n}}}"#)))
        .collect();
    let c = prepare(&mut sink, 1, &[records]).await;
    sink.commit(&c).await.unwrap();
    let stored: Vec<String> = column(&f.db, &format!("SELECT n::text FROM \"{}\" ORDER BY id", f.table)).await;
    let expected: Vec<&str> = cases.iter().map(|(_, e)| *e).collect();
    assert_eq!(stored, expected);
}

#[tokio::test]
async fn bad_records_go_to_the_dead_letter_table_and_are_counted() {
    let f = Fixture::new(
        "orders",
        r#"
create_table = true
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
qty = { from = "/qty", type = "int" }
name = { from = "/name", type = "text" }
"#,
    )
    .await;
    let (db, table, pipeline) = (&f.db, &f.table, &f.pipeline);
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let bad_values = [
        (r#"not json{"#, "not valid JSON"),
        (r#"{"id":2,"qty":1}"#, "no such value"),
        (r#"{"id":"abc","qty":1,"name":"x"}"#, "\"abc\" is not an integer"),
        (r#"{"id":4,"qty":3000000000,"name":"y"}"#, "out of range for int"),
    ];
    let mut batch = vec![record(2, 10, r#"{"id":1,"qty":2,"name":"a"}"#)];
    for (i, (value, _)) in bad_values.iter().enumerate() {
        batch.push(record(2, 11 + i as i64, value).with_key(format!("key{i}")));
    }
    batch.push(record(2, 15, r#"{"id":5,"qty":1,"name":"e"}"#));
    let c = prepare(&mut sink, 1, &[batch]).await;
    let dead_letters = format!("{table}_dead_letters");
    assert_eq!(
        count(db, &dead_letters).await,
        0,
        "dead letters are part of the transaction"
    );
    sink.commit(&c).await.unwrap();

    let ids: Vec<i64> = column(db, &format!("SELECT id FROM \"{table}\" ORDER BY id")).await;
    assert_eq!(ids, [1, 5]);
    let rows = db
        .query(
            &format!(
                "SELECT pipeline, sink_table, split, topic, \"partition\", \"offset\", \"key\", \"value\", error, \
                 checkpoint, dead_lettered_at <= now() FROM \"{dead_letters}\" ORDER BY \"offset\""
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), bad_values.len());
    for (i, (row, (value, reason))) in rows.iter().zip(bad_values).enumerate() {
        assert_eq!(row.get::<_, String>(0), *pipeline);
        assert_eq!(row.get::<_, String>(1), *table);
        assert_eq!(row.get::<_, String>(2), "orders-2");
        assert_eq!(row.get::<_, String>(3), "orders");
        assert_eq!(row.get::<_, i32>(4), 2);
        assert_eq!(row.get::<_, i64>(5), 11 + i as i64);
        assert_eq!(row.get::<_, Vec<u8>>(6), format!("key{i}").into_bytes());
        assert_eq!(row.get::<_, Vec<u8>>(7), value.as_bytes(), "raw bytes are kept");
        let error: String = row.get(8);
        assert!(error.contains(reason), "{error:?} should mention {reason:?}");
        assert_eq!(row.get::<_, i64>(9), 1);
        assert!(row.get::<_, bool>(10));
    }
    assert_eq!(metrics.snapshot().dead_letters, 4);
}

#[tokio::test]
async fn a_varchar_n_array_element_past_its_limit_is_a_dead_letter_not_a_failed_copy() {
    let f = Fixture::new(
        "vararr",
        r#"
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
codes = { from = "/codes", type = "varchar[]" }
"#,
    )
    .await;
    f.db.batch_execute(&format!("CREATE TABLE \"{}\" (id bigint, codes varchar(3)[])", f.table))
        .await
        .unwrap();
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let records = vec![
        record(0, 0, r#"{"id":1,"codes":["abc","x",null]}"#),
        record(0, 1, r#"{"id":2,"codes":["ab","abcd"]}"#),
        record(0, 2, r#"{"id":3,"codes":[]}"#),
    ];
    let c = prepare(&mut sink, 1, &[records]).await;
    sink.commit(&c).await.unwrap();
    let ids: Vec<i64> = column(&f.db, &format!("SELECT id FROM \"{}\" ORDER BY id", f.table)).await;
    assert_eq!(
        ids,
        [1, 3],
        "the record whose element is too long is a dead letter; the others land"
    );
    let error: String = column(&f.db, &format!("SELECT error FROM \"{}_dead_letters\"", f.table))
        .await
        .remove(0);
    assert!(
        error.contains("codes") && error.contains("an element of 4 characters") && error.contains("limit of 3"),
        "{error}"
    );
    assert_eq!(metrics.snapshot().dead_letters, 1);
}
#[tokio::test]
async fn uuid_date_array_and_header_columns_round_trip_and_a_bad_element_is_a_dead_letter() {
    let f = Fixture::new(
        "typed",
        r#"
create_table = true
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
ref = { from = "/ref", type = "uuid" }
day = { from = "/day", type = "date" }
epoch_day = { from = "/epoch_day", type = "date" }
tags = { from = "/tags", type = "text[]", required = false }
counts = { from = "/counts", type = "bigint[]", required = false }
trace = { from = "header/trace", type = "text", required = false }
attempt = { from = "header/attempt", type = "int", required = false }
"#,
    )
    .await;
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let good = r#"{"id":1,"ref":"8F0C4A52-1A3B-4C5D-9E6F-0A1B2C3D4E5F","day":"2024-02-29","epoch_day":19782,
        "tags":["a","b \"quoted\" , {x}",null,"\\"],"counts":[1,null,-9223372036854775808]}"#;
    let empty = r#"{"id":2,"ref":"00000000000000000000000000000000","day":"1970-01-01","epoch_day":0,"tags":[]}"#;
    let bad =
        r#"{"id":3,"ref":"8f0c4a52-1a3b-4c5d-9e6f-0a1b2c3d4e5f","day":"2024-01-01","epoch_day":1,"counts":[1,"x"]}"#;
    let mut good = record(0, 0, good);
    // Kafka allows a header name twice: the last one counts.
    good.headers = vec![
        ("trace".into(), Some(b"first".to_vec())),
        ("attempt".into(), Some(b"2".to_vec())),
        ("trace".into(), Some(b"abc".to_vec())),
    ];
    let mut empty = record(0, 1, empty);
    empty.headers = vec![("trace".into(), None)];
    let c = prepare(&mut sink, 1, &[vec![good, empty, record(0, 2, bad)]]).await;
    sink.commit(&c).await.unwrap();

    let rows = f
        .db
        .query(
            &format!(
                "SELECT id, ref::text, day::text, epoch_day::text, tags, counts, trace, attempt FROM \"{}\" ORDER BY id",
                f.table
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "the record with a bad array element is a dead letter");
    let row = &rows[0];
    assert_eq!(row.get::<_, String>(1), "8f0c4a52-1a3b-4c5d-9e6f-0a1b2c3d4e5f");
    assert_eq!(row.get::<_, String>(2), "2024-02-29");
    assert_eq!(row.get::<_, String>(3), "2024-02-29", "19782 days after 1970-01-01");
    assert_eq!(
        row.get::<_, Vec<Option<String>>>(4),
        [
            Some("a".into()),
            Some("b \"quoted\" , {x}".into()),
            None,
            Some("\\".into())
        ]
    );
    assert_eq!(row.get::<_, Vec<Option<i64>>>(5), [Some(1), None, Some(i64::MIN)]);
    assert_eq!(row.get::<_, String>(6), "abc");
    assert_eq!(row.get::<_, i32>(7), 2);
    let row = &rows[1];
    assert_eq!(row.get::<_, String>(1), "00000000-0000-0000-0000-000000000000");
    assert_eq!(row.get::<_, String>(2), "1970-01-01");
    assert_eq!(row.get::<_, String>(3), "1970-01-01");
    assert_eq!(row.get::<_, Vec<Option<String>>>(4), Vec::<Option<String>>::new());
    assert_eq!(row.get::<_, Option<Vec<Option<i64>>>>(5), None);
    assert_eq!(row.get::<_, Option<String>>(6), None, "a null header is NULL");
    assert_eq!(row.get::<_, Option<i32>>(7), None, "a missing header is NULL");
    let types: Vec<String> = column(
        &f.db,
        &format!(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = '\"{}\"'::regclass \
             AND attnum > 0 ORDER BY attnum",
            f.table
        ),
    )
    .await;
    assert_eq!(
        types,
        ["bigint", "uuid", "date", "date", "text[]", "bigint[]", "text", "integer"]
    );
    let error: String = column(&f.db, &format!("SELECT error FROM \"{}_dead_letters\"", f.table))
        .await
        .remove(0);
    assert!(
        error.contains("element 1") && error.contains("\"x\" is not an integer"),
        "{error}"
    );
    assert_eq!(metrics.snapshot().dead_letters, 1);
}

#[tokio::test]
async fn values_that_break_column_limits_are_dead_letters_not_copy_failures() {
    let f = Fixture::new(
        "limits",
        r#"
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
price = { from = "/price", type = "numeric", required = false }
code = { from = "/code", type = "text", required = false }
"#,
    )
    .await;
    let (db, table) = (&f.db, &f.table);
    db.batch_execute(&format!(
        "CREATE TABLE \"{table}\" (id bigint PRIMARY KEY, price numeric(6,2) NOT NULL, code varchar(5), \
         created_at timestamptz NOT NULL DEFAULT now())"
    ))
    .await
    .unwrap();
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let batch = vec![
        record(0, 0, r#"{"id":1,"price":"1234.567","code":"abc"}"#),
        record(0, 1, r#"{"id":2,"price":"12345.6","code":"x"}"#),
        record(0, 2, r#"{"id":3,"price":1,"code":"toolong"}"#),
        record(0, 3, r#"{"id":4,"code":"x"}"#),
        record(0, 4, r#"{"id":5,"price":0.5}"#),
    ];
    let c = prepare(&mut sink, 1, &[batch]).await;
    sink.commit(&c).await.unwrap();
    let rows: Vec<(i64, String, Option<String>)> = db
        .query(
            &format!("SELECT id, price::text, code FROM \"{table}\" ORDER BY id"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        [
            (1, "1234.57".to_string(), Some("abc".to_string())),
            (5, "0.50".to_string(), None)
        ]
    );
    let errors: Vec<String> = column(
        db,
        &format!("SELECT error FROM \"{table}_dead_letters\" ORDER BY \"offset\""),
    )
    .await;
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].contains("numeric(6, 2)"), "{}", errors[0]);
    assert!(errors[1].contains("limit of 5"), "{}", errors[1]);
    assert!(errors[2].contains("NOT NULL"), "{}", errors[2]);
    assert_eq!(metrics.snapshot().dead_letters, 3);
}

#[tokio::test]
async fn table_problems_are_fatal_errors_that_name_the_fix() {
    let pg = shared_server();
    let db = client(pg.url()).await;
    let pipeline = unique("pipe");
    let recover = |config: exactly_postgres::PostgresSinkConfig| {
        let pipeline = pipeline.clone();
        async move {
            let (mut sink, _) = new_sink(&config, &pipeline, 0);
            sink.recover(&[]).await
        }
    };
    let columns = "[sink.postgres.columns]\nid = { from = \"/id\", type = \"bigint\" }\n";

    let missing = unique("missing");
    let message = fatal_message(recover(config(pg.url(), &missing, columns)).await);
    assert!(
        message.contains(&missing) && message.contains("create_table = true"),
        "{message}"
    );

    let table = unique("typed");
    db.batch_execute(&format!("CREATE TABLE \"{table}\" (id integer, other text NOT NULL)"))
        .await
        .unwrap();
    let message = fatal_message(recover(config(pg.url(), &table, columns)).await);
    assert!(
        message.contains("\"id\"") && message.contains("integer") && message.contains("type = \"int\""),
        "{message}"
    );

    let int_columns = columns.replace("bigint", "int");
    let message = fatal_message(recover(config(pg.url(), &table, &int_columns)).await);
    assert!(message.contains("other") && message.contains("NOT NULL"), "{message}");

    let extra = format!(
        "{int_columns}other = {{ from = \"/o\", type = \"text\" }}\nnope = {{ from = \"/n\", type = \"text\" }}\n"
    );
    let message = fatal_message(recover(config(pg.url(), &table, &extra)).await);
    assert!(
        message.contains("\"nope\"") && message.contains("ADD COLUMN"),
        "{message}"
    );

    let upsert = format!("upsert_key = [\"id\"]\n{int_columns}other = {{ from = \"/o\", type = \"text\" }}\n");
    let message = fatal_message(recover(config(pg.url(), &table, &upsert)).await);
    assert!(
        message.contains("unique index") && message.contains("PRIMARY KEY"),
        "{message}"
    );

    let other_db = pg
        .url()
        .rsplit_once('/')
        .map(|(base, _)| format!("{base}/{}", unique("nodb")))
        .unwrap();
    let message = fatal_message(recover(config(&other_db, &table, columns)).await);
    assert!(
        message.contains("3D000") && message.contains("CREATE DATABASE"),
        "{message}"
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_transient_error_naming_it() {
    let port = exactly_testkit::free_port().unwrap();
    let url = format!("postgres://app:hunter2@127.0.0.1:{port}/shop");
    let config = config(
        &url,
        "orders",
        "[sink.postgres.columns]\nid = { from = \"/id\", type = \"bigint\" }\n",
    );
    let (mut sink, _) = new_sink(&config, "pipe", 0);
    let message = transient_message(sink.recover(&[]).await);
    assert!(
        message.contains(&format!("postgres://app@127.0.0.1:{port}/shop")),
        "{message}"
    );
    assert!(
        message.contains("cannot connect") && message.contains("running"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "the password must not leak: {message}");
    let c = PostgresCommittable {
        gid: "exactly:pipe:orders:0:1".into(),
        checkpoint: CheckpointId(1),
        subtask: 0,
        tables: Vec::new(),
    };
    assert!(matches!(sink.commit(&c).await, Err(ConnectorError::Transient { .. })));
}

#[tokio::test]
async fn the_factory_builds_erased_sinks_whose_committables_round_trip() {
    let f = Fixture::new("people", ID_NAME).await;
    let (table, pipeline) = (&f.table, &f.pipeline);
    let factory = PostgresSinkFactory::new(f.config.clone()).unwrap();
    assert_eq!(
        factory.identity(),
        format!(
            "postgres:table={table},columns=[id=/id:bigint;name=/name:text],mode=two-phase,\
             commit_log=exactly_commit_log"
        )
    );
    let mut erased = factory.create(context(pipeline, 1)).unwrap();
    erased.recover(&[]).await.unwrap();
    assert_eq!(erased.pre_commit().await.unwrap(), None, "no records, no transaction");
    erased.write(CheckpointId(3), &people(1, 0, 2)).await.unwrap();
    erased.write(CheckpointId(3), &people(1, 2, 2)).await.unwrap();
    let committable = erased.pre_commit().await.unwrap().expect("a committable");
    assert_eq!(
        committable,
        json!({"gid": format!("exactly:{pipeline}:{table}:1:3"), "checkpoint": 3, "subtask": 1})
    );
    assert_eq!(f.count().await, 0);
    drop(erased); // the process ends
    let mut restarted = factory.create(context(pipeline, 1)).unwrap();
    restarted.recover(std::slice::from_ref(&committable)).await.unwrap();
    assert_eq!(f.count().await, 4);
    restarted.commit(&committable).await.unwrap();
    assert_eq!(f.count().await, 4);
}

#[tokio::test]
async fn long_names_get_a_shortened_gid_that_the_server_accepts_and_recovery_finds() {
    let f = Fixture::new(&"t".repeat(50), ID_NAME).await;
    let pipeline = format!("{}-{}", "p".repeat(300), f.pipeline);
    let (mut sink, _) = new_sink(&f.config, &pipeline, 0);
    sink.recover(&[]).await.unwrap();
    let listed = prepare(&mut sink, u64::MAX >> 1, &[people(0, 0, 2)]).await;
    let orphan = prepare(&mut sink, u64::MAX, &[people(0, 2, 2)]).await;
    assert!(listed.gid.len() <= exactly_postgres::MAX_GID_BYTES && orphan.gid.len() <= 199);
    assert!(listed.gid.starts_with(sink.gid_prefix()) && sink.gid_prefix().contains('~'));
    let prefix = sink.gid_prefix().to_string();
    drop(sink);
    let (mut restarted, _) = new_sink(&f.config, &pipeline, 0);
    restarted.recover(std::slice::from_ref(&listed)).await.unwrap();
    assert_eq!(f.count().await, 2);
    assert!(prepared(&f.db, &prefix).await.is_empty());
}

#[tokio::test]
async fn missing_privileges_are_fatal_errors_naming_the_grant() {
    // A role that logs in without a password needs the testkit's trust
    // authentication, and no role may be left on an external server.
    let f = Fixture::own("guarded", ID_NAME).await;
    let role = unique("limited");
    let mut config = f.config.clone();
    config.commit_log_table = Some(unique("log"));
    config.url = format!("postgres://{role}@127.0.0.1:{}/postgres", f.pg.port());
    // The tables exist (created by the administrator) ...
    let mut admin_config = config.clone();
    admin_config.url = f.pg.url().to_string();
    new_sink(&admin_config, &f.pipeline, 0).0.recover(&[]).await.unwrap();
    f.db.batch_execute(&format!("CREATE ROLE \"{role}\" LOGIN"))
        .await
        .unwrap();
    let recover = || async { new_sink(&config, &f.pipeline, 0).0.recover(&[]).await };

    // ... but the sink's user may not write them.
    let message = fatal_message(recover().await);
    assert!(
        message.contains(&format!("lacks INSERT on table {}", f.table)) && message.contains("GRANT INSERT ON"),
        "{message}"
    );
    f.db.batch_execute(&format!("GRANT INSERT ON \"{}\" TO \"{role}\"", f.table))
        .await
        .unwrap();
    let message = fatal_message(recover().await);
    assert!(message.contains("GRANT INSERT, SELECT, UPDATE, DELETE ON"), "{message}");
    f.db.batch_execute(&format!(
        "GRANT INSERT, SELECT, UPDATE, DELETE ON \"{}\" TO \"{role}\"; GRANT INSERT ON \"{}_dead_letters\" TO \"{role}\"",
        config.commit_log_table.as_deref().unwrap(),
        f.table
    ))
    .await
    .unwrap();
    recover().await.unwrap();
    f.db.batch_execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""))
        .await
        .unwrap();
}

/// Rows stream into one COPY across writes; a batch with dead letters ends it
/// (the dead-letter COPY needs the connection) and the next write starts
/// another, and so does every 512 KiB of record data. Every row and dead
/// letter must land exactly once, in the transaction.
#[tokio::test]
async fn rows_stream_across_writes_around_dead_letters_and_copy_segments() {
    let f = Fixture::new("stream", ID_NAME).await;
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let padding = "p".repeat(300);
    let batch = |from: i64, n: i64| -> Vec<Record> {
        (from..from + n)
            .map(|i| record(0, i, &format!(r#"{{"id":{i},"name":"n{i}{padding}"}}"#)))
            .collect()
    };
    let mut txn = sink.begin(CheckpointId(1)).await.unwrap();
    // 2,000 rows of ~330 bytes: more than one COPY segment.
    for from in (0..2000).step_by(500) {
        sink.write(&mut txn, &batch(from, 500)).await.unwrap();
    }
    let mut with_bad = batch(2000, 3);
    with_bad.insert(1, record(0, 5000, "not json"));
    sink.write(&mut txn, &with_bad).await.unwrap();
    sink.write(&mut txn, &batch(2003, 7)).await.unwrap();
    assert_eq!(f.count().await, 0, "nothing is visible before commit");
    let c = sink.pre_commit(txn).await.unwrap();
    sink.commit(&c).await.unwrap();

    let ids: Vec<i64> = column(&f.db, &format!("SELECT id FROM \"{}\" ORDER BY id", f.table)).await;
    assert_eq!(ids, (0..2010).collect::<Vec<i64>>());
    assert_eq!(count(&f.db, &format!("{}_dead_letters", f.table)).await, 1);
    assert_eq!(metrics.snapshot().dead_letters, 1);
}

/// A row that converts fine but that the server refuses (a CHECK constraint)
/// fails the streamed COPY: the error surfaces at the latest in pre-commit,
/// names the constraint problem, leaves nothing behind after the abort, and
/// the sink's next transaction works.
#[tokio::test]
async fn a_row_the_server_refuses_fails_the_transaction_and_leaves_nothing() {
    let f = Fixture::new("refused", &ID_NAME.replace("create_table = true\n", "")).await;
    f.db.batch_execute(&format!(
        "CREATE TABLE \"{}\" (id bigint, name text CHECK (name <> 'refused'))",
        f.table
    ))
    .await
    .unwrap();
    let (mut sink, _) = f.recovered(0, &[]).await;
    let mut txn = sink.begin(CheckpointId(1)).await.unwrap();
    let mut rows = people(0, 0, 3);
    rows.push(record(0, 3, r#"{"id":3,"name":"refused"}"#));
    // The refusal may be seen by this write or only when the COPY ends.
    let failure = match sink.write(&mut txn, &rows).await {
        Err(e) => {
            sink.abort(txn).await.unwrap();
            Err(e)
        }
        Ok(()) => sink.pre_commit(txn).await.map(drop),
    };
    let message = fatal_message(failure);
    assert!(
        message.contains("23514") && message.contains("breaks a constraint"),
        "{message}"
    );
    assert_eq!(f.count().await, 0);
    assert!(prepared(&f.db, sink.gid_prefix()).await.is_empty());

    let c = prepare(&mut sink, 3, &[people(0, 10, 2)]).await;
    sink.commit(&c).await.unwrap();
    let ids: Vec<i64> = column(&f.db, &format!("SELECT id FROM \"{}\" ORDER BY id", f.table)).await;
    assert_eq!(ids, [10, 11]);
}

/// A role with a short `statement_timeout` (common on managed servers) must
/// not cancel the COPY that stays open across the writes of a transaction.
#[tokio::test]
async fn a_short_statement_timeout_does_not_cancel_the_open_copy() {
    // A new superuser role without a password: on a server of its own.
    let f = Fixture::own("timeout", ID_NAME).await;
    let role = unique("short_timeout");
    f.db.batch_execute(&format!(
        "CREATE ROLE \"{role}\" LOGIN SUPERUSER; ALTER ROLE \"{role}\" SET statement_timeout = '200ms'"
    ))
    .await
    .unwrap();
    let url = f.pg.url().replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(
        url,
        f.pg.url(),
        "this test needs a URL of the form postgres://postgres@HOST/DB"
    );
    let config = config(&url, &f.table, ID_NAME);
    let (mut sink, _) = new_sink(&config, &f.pipeline, 0);
    sink.recover(&[]).await.unwrap();
    let mut txn = sink.begin(CheckpointId(1)).await.unwrap();
    sink.write(&mut txn, &people(0, 0, 2)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    sink.write(&mut txn, &people(0, 2, 2)).await.unwrap();
    let c = sink.pre_commit(txn).await.unwrap();
    sink.commit(&c).await.unwrap();
    assert_eq!(f.count().await, 4);
}

/// Commit markers older than `commit_log_retention` are deleted after a
/// commit, only the subtask's own; a transaction committed again after that
/// finds no marker and reports data loss, as documented.
#[tokio::test]
async fn old_commit_markers_are_pruned_after_commits_and_only_the_subtasks_own() {
    let f = Fixture::new("prune", &format!("commit_log_retention = \"1s\"\n{ID_NAME}")).await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let (mut other, _) = f.recovered(1, &[]).await;
    let old = prepare(&mut sink, 1, &[people(0, 0, 1)]).await;
    sink.commit(&old).await.unwrap();
    let others = prepare(&mut other, 1, &[people(1, 0, 1)]).await;
    other.commit(&others).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let new = prepare(&mut sink, 2, &[people(0, 1, 1)]).await;
    sink.commit(&new).await.unwrap();

    let gids = [old.gid.clone(), new.gid.clone(), others.gid.clone()];
    let kept: Vec<String> =
        f.db.query(
            "SELECT gid FROM exactly_commit_log WHERE gid = ANY($1) ORDER BY gid",
            &[&gids.to_vec()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut expected = vec![new.gid.clone(), others.gid.clone()];
    expected.sort();
    assert_eq!(kept, expected, "only subtask 0's marker older than 1 s is gone");
    assert_eq!(f.count().await, 3, "pruning touches markers, not rows");
    match sink.commit(&old).await {
        Err(ConnectorError::DataLoss { checkpoint, .. }) => assert_eq!(checkpoint, CheckpointId(1)),
        other => panic!("expected data loss for a pruned marker, got {other:?}"),
    }
}

/// Retention counts from a marker's commit, not its prepare: a transaction
/// prepared longer ago than the retention and committed just now keeps its
/// marker, so re-committing it after a crash is still "already committed".
#[tokio::test]
async fn a_late_commit_keeps_its_marker_for_the_retention_after_the_commit() {
    let f = Fixture::new("late", &format!("commit_log_retention = \"1s\"\n{ID_NAME}")).await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let c = prepare(&mut sink, 1, &[people(0, 0, 2)]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sink.commit(&c).await.unwrap();
    // A crash before the next checkpoint: a new sink re-commits the same one.
    drop(sink);
    let (mut again, _) = new_sink(&f.config, &f.pipeline, 0);
    again.recover(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(f.count().await, 2);
}

/// Recovery re-commits a checkpoint's whole list and never prunes in
/// between: after a downtime longer than the retention, the markers of
/// every listed transaction are still there.
#[tokio::test]
async fn recovery_after_a_long_downtime_finds_every_marker_it_needs() {
    let f = Fixture::new("downtime", &format!("commit_log_retention = \"1s\"\n{ID_NAME}")).await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let first = prepare(&mut sink, 1, &[people(0, 0, 1)]).await;
    let second = prepare(&mut sink, 2, &[people(0, 1, 1)]).await;
    sink.commit(&first).await.unwrap();
    sink.commit(&second).await.unwrap();
    drop(sink);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (mut restarted, _) = new_sink(&f.config, &f.pipeline, 0);
    restarted.recover(&[first, second]).await.unwrap();
    assert_eq!(f.count().await, 2);
}

/// A fixture whose commit log was created by an older release: the first
/// columns, then `more` (SQL, e.g. `, committed_at timestamptz`).
async fn with_older_commit_log(prefix: &str, more: &str) -> (Fixture, String) {
    let log = unique(&format!("{prefix}_log"));
    let f = Fixture::new(prefix, &format!("commit_log_table = \"{log}\"\n{ID_NAME}")).await;
    f.db.batch_execute(&format!(
        "CREATE TABLE \"{log}\" (gid text PRIMARY KEY, pipeline text NOT NULL, sink_table text NOT NULL, \
         subtask integer NOT NULL, checkpoint bigint NOT NULL, prepared_at timestamptz NOT NULL DEFAULT now(){more})"
    ))
    .await
    .unwrap();
    (f, log)
}

/// A commit log created before `committed_at` and `records` existed gets
/// the columns at start; commits stamp the time, markers count the records.
#[tokio::test]
async fn an_older_commit_log_gets_committed_at_and_records_added() {
    let (f, log) = with_older_commit_log("oldlog", "").await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let c = prepare(&mut sink, 1, &[people(0, 0, 2), people(0, 2, 1)]).await;
    sink.commit(&c).await.unwrap();
    let stamped: Vec<bool> = column(
        &f.db,
        &format!(
            "SELECT committed_at IS NOT NULL AND records = 3 FROM \"{log}\" WHERE gid = '{}'",
            c.gid
        ),
    )
    .await;
    assert_eq!(stamped, [true]);
}

/// A commit log from before markers counted records, while a prepared
/// transaction (here another pipeline's) holds a marker in it: adding the
/// column would wait for that transaction, so the sink starts without it
/// (markers go uncounted, the replay check says it cannot count) instead of
/// failing; the replay check also works before `recover` ran on it. Once
/// nothing holds the table, the next start adds the column.
#[tokio::test]
async fn an_older_commit_log_held_by_a_prepared_transaction_starts_without_record_counts() {
    let (f, log) = with_older_commit_log("heldlog", ", committed_at timestamptz").await;
    let holder = unique("other_pipeline_gid");
    let other = client(f.pg.url()).await;
    other
        .batch_execute(&format!(
            "BEGIN; INSERT INTO \"{log}\" (gid, pipeline, sink_table, subtask, checkpoint) \
             VALUES ('{holder}', 'another pipeline', 't', 0, 1); PREPARE TRANSACTION '{holder}'"
        ))
        .await
        .unwrap();

    let (mut sink, _) = f.recovered(0, &[]).await;
    let c = prepare(&mut sink, 4, &[people(0, 0, 2)]).await;
    sink.commit(&c).await.unwrap();
    let (mut fresh, _) = new_sink(&f.config, &f.pipeline, 0);
    assert_eq!(
        fresh.check_replay_after(CheckpointId(1)).await.unwrap(),
        ReplayCheck::CommittedLater {
            checkpoint: CheckpointId(4),
            records: None
        },
        "a later commit is found, its records cannot be counted"
    );
    assert_eq!(f.count().await, 2);

    f.db.batch_execute(&format!("ROLLBACK PREPARED '{holder}'"))
        .await
        .unwrap();
    drop((sink, fresh));
    let (mut restarted, _) = f.recovered(0, &[]).await;
    let d = prepare(&mut restarted, 5, &[people(0, 2, 3)]).await;
    restarted.commit(&d).await.unwrap();
    assert_eq!(
        restarted.check_replay_after(CheckpointId(4)).await.unwrap(),
        ReplayCheck::CommittedLater {
            checkpoint: CheckpointId(5),
            records: Some(3)
        },
        "the next start added the column"
    );
}

/// A checkpoint may list several transactions of a subtask (here checkpoint
/// 1 failed, so the latest one lists the transactions of 1 and 2). A
/// retention shorter than the time between their commits must not delete
/// the first one's marker while that checkpoint is still the latest: a
/// restore of it re-commits both, and a missing marker would be reported as
/// data loss. Markers go once a transaction begun after their commit is
/// committed (a newer checkpoint completed).
#[tokio::test]
async fn a_short_retention_never_deletes_a_marker_the_latest_checkpoint_lists() {
    let f = Fixture::new("retained", &format!("commit_log_retention = \"1s\"\n{ID_NAME}")).await;
    let (mut sink, _) = f.recovered(0, &[]).await;
    let first = prepare(&mut sink, 1, &[people(0, 0, 1)]).await;
    let second = prepare(&mut sink, 2, &[people(0, 1, 1)]).await;
    sink.commit(&first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sink.commit(&second).await.unwrap();
    // A crash before every subtask committed (or before the runtime
    // recorded it): the latest checkpoint is restored.
    drop(sink);
    let (mut restarted, _) = new_sink(&f.config, &f.pipeline, 0);
    restarted
        .recover(&[first.clone(), second.clone()])
        .await
        .expect("no false data loss");
    assert_eq!(f.count().await, 2);

    let markers = || async {
        let gids: Vec<String> = column(
            &f.db,
            &format!(
                "SELECT gid FROM exactly_commit_log WHERE pipeline = '{}' ORDER BY checkpoint",
                f.pipeline
            ),
        )
        .await;
        gids
    };
    // The first commit of a transaction begun after recovery releases the
    // markers recovery needed ...
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let third = prepare(&mut restarted, 3, &[people(0, 2, 1)]).await;
    restarted.commit(&third).await.unwrap();
    assert_eq!(
        markers().await,
        std::slice::from_ref(&third.gid),
        "markers of 1 and 2 are pruned"
    );
    // ... and each later one the markers before it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let fourth = prepare(&mut restarted, 4, &[people(0, 3, 1)]).await;
    restarted.commit(&fourth).await.unwrap();
    assert_eq!(markers().await, std::slice::from_ref(&fourth.gid));
    assert_eq!(f.count().await, 4);
}

/// Before falling back to an older checkpoint (the newer entries cannot be
/// read), the runtime asks whether replaying what came after it duplicates
/// anything. The commit markers tell: a later checkpoint of this subtask, or
/// of one that `j % parallelism` maps to it, was committed, and they count
/// the records those commits hold. Markers go only once the oldest
/// restorable checkpoint has passed the commit that released them, so no
/// marker after a checkpoint that may still be restored is ever missing
/// from the count, even with a short retention.
#[tokio::test]
async fn the_replay_check_finds_and_counts_commits_of_later_checkpoints_in_the_markers() {
    let log = unique("replay_log");
    let f = Fixture::new(
        "replay",
        &format!("commit_log_retention = \"1s\"\ncommit_log_table = \"{log}\"\n{ID_NAME}"),
    )
    .await;
    let (mut fresh, _) = new_sink(&f.config, &f.pipeline, 0);
    assert_eq!(
        fresh.check_replay_after(CheckpointId(1)).await.unwrap(),
        ReplayCheck::Unknown,
        "no commit log yet"
    );
    drop(fresh);
    let factory = PostgresSinkFactory::new(f.config.clone()).unwrap();
    let restorable = RestorableCheckpoints::default();
    restorable.set(Some(CheckpointId(2)));
    let mut s0 = factory.create_sink(context(&f.pipeline, 0).with_restorable(restorable.clone()));
    s0.recover(&[]).await.unwrap();
    // Checkpoint 3 holds one record, 5 two, 7 three.
    let mut from = 0;
    for (checkpoint, records) in [(3, 1), (5, 2), (7, 3)] {
        let c = prepare(&mut s0, checkpoint, &[people(0, from, records)]).await;
        s0.commit(&c).await.unwrap();
        from += records;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let markers = || async { column::<i64>(&f.db, &format!("SELECT checkpoint FROM \"{log}\" ORDER BY 1")).await };
    assert_eq!(
        markers().await,
        [3, 5, 7],
        "checkpoint 2 may be restored: nothing after it is pruned"
    );
    let later = |checkpoint, records| ReplayCheck::CommittedLater {
        checkpoint: CheckpointId(checkpoint),
        records: Some(records),
    };
    for (after, expected) in [
        (2, later(7, 6)),
        (4, later(7, 5)),
        (5, later(7, 3)),
        (7, ReplayCheck::Safe),
    ] {
        assert_eq!(
            s0.check_replay_after(CheckpointId(after)).await.unwrap(),
            expected,
            "after {after}"
        );
    }
    // The oldest restorable checkpoint rises to 5: the marker of 3 (released
    // by the commit of 5) goes at the next commit, the later ones stay.
    restorable.set(Some(CheckpointId(5)));
    let c = prepare(&mut s0, 8, &[people(0, from, 4)]).await;
    s0.commit(&c).await.unwrap();
    from += 4;
    assert_eq!(markers().await, [5, 7, 8]);
    assert_eq!(s0.check_replay_after(CheckpointId(5)).await.unwrap(), later(8, 7));
    // Checkpoint 9 only prepared: nothing committed after 8 (recovery rolls
    // 9 back), so the replay duplicates nothing.
    let _nine = prepare(&mut s0, 9, &[people(0, from, 1)]).await;
    assert_eq!(
        s0.check_replay_after(CheckpointId(8)).await.unwrap(),
        ReplayCheck::Safe,
        "prepared only"
    );
    s0.recover(&[]).await.unwrap();
    // Subtask 3 of a run at parallelism 4 committed checkpoint 10: at
    // parallelism 2 it maps to subtask 1.
    let metrics = std::sync::Arc::new(exactly_core::Metrics::default());
    let mut s3 = factory.create_sink(exactly_core::SinkContext::new(&f.pipeline, 3, 4, metrics));
    s3.recover(&[]).await.unwrap();
    let c = prepare(&mut s3, 10, &[people(3, 0, 2)]).await;
    s3.commit(&c).await.unwrap();
    let (mut s1, _) = new_sink(&f.config, &f.pipeline, 1);
    assert_eq!(s1.check_replay_after(CheckpointId(8)).await.unwrap(), later(10, 2));
    assert_eq!(s0.check_replay_after(CheckpointId(8)).await.unwrap(), ReplayCheck::Safe);
    // A marker written before markers counted records: the count is unknown.
    f.db.batch_execute(&format!("UPDATE \"{log}\" SET records = NULL WHERE checkpoint = 7"))
        .await
        .unwrap();
    assert_eq!(
        s0.check_replay_after(CheckpointId(5)).await.unwrap(),
        ReplayCheck::CommittedLater {
            checkpoint: CheckpointId(8),
            records: None
        }
    );
}

/// Raw values into `jsonb`: whatever PostgreSQL's own `jsonb` input refuses
/// is a dead letter (never a failed COPY), and what both accept is stored.
/// Each value's verdict is asked of the server itself (`$1::jsonb`).
#[tokio::test]
async fn raw_json_values_postgres_refuses_are_dead_letters_and_the_rest_is_stored() {
    let f = Fixture::new(
        "raw_json",
        r#"
create_table = true
[sink.postgres.columns]
off = { from = "offset", type = "bigint" }
doc = { from = "value", type = "jsonb" }
"#,
    )
    .await;
    let (db, table) = (&f.db, &f.table);
    let many_decimals = format!(r#"{{"x":0.{}1}}"#, "0".repeat(16_382));
    let too_many_decimals = format!(r#"{{"x":0.{}1}}"#, "0".repeat(16_383));
    let values: Vec<&str> = vec![
        r#"{"x":1}"#,
        r#"{"x":1.5e-3,"y":-0,"z":123456789012345678901234567890}"#,
        r#"{"a":"\ud83d\ude00 é"}"#,
        r#"{"x":1e-16383}"#,
        &many_decimals,
        r#"{"x":12e16384}"#,
        r#"{"x":1e-16384}"#,
        &too_many_decimals,
        r#"{"x":0e2000000000}"#,
        r#"{"a":"x\u0000"}"#,
        r#"{"\u0000":1}"#,
        r#"{"a":"\u0000","a":1}"#,
        r#"{"a":"\\u0000"}"#,
        r#"{"x":1e400}"#,
        r#"{"a":"\ud800"}"#,
    ];
    let mut postgres_accepts = Vec::new();
    for v in &values {
        postgres_accepts.push(db.query_one("SELECT $1::text::jsonb", &[v]).await.is_ok());
    }
    let (mut sink, metrics) = f.recovered(0, &[]).await;
    let batch: Vec<Record> = values.iter().enumerate().map(|(i, v)| record(0, i as i64, v)).collect();
    let c = prepare(&mut sink, 1, &[batch]).await;
    sink.commit(&c).await.unwrap();
    let stored: Vec<i64> = column(db, &format!("SELECT off FROM \"{table}\" ORDER BY off")).await;
    let refused: Vec<i64> = column(
        db,
        &format!("SELECT \"offset\" FROM \"{table}_dead_letters\" ORDER BY \"offset\""),
    )
    .await;
    for (i, v) in values.iter().enumerate() {
        let short: String = v.chars().take(60).collect();
        let i = i as i64;
        if stored.contains(&i) {
            assert!(
                postgres_accepts[i as usize],
                "stored although jsonb refuses it: {short}"
            );
        } else {
            assert!(refused.contains(&i), "neither stored nor a dead letter: {short}");
        }
    }
    // What both accept is stored; of what PostgreSQL accepts, only numbers
    // out of f64's range (serde_json's limit, which the pointer columns
    // share: 12e16384, 1e400) are refused.
    assert_eq!(stored, [0, 1, 2, 3, 4, 12], "refused: {refused:?}");
    assert_eq!(
        postgres_accepts,
        [true, true, true, true, true, true, false, false, false, false, false, false, true, true, false],
        "what the server accepts"
    );
    assert_eq!(metrics.snapshot().dead_letters, values.len() as u64 - 6);
    let errors: Vec<String> = column(
        db,
        &format!("SELECT error FROM \"{table}_dead_letters\" ORDER BY \"offset\""),
    )
    .await;
    assert!(errors[0].contains("out of range"), "{}", errors[0]);
    assert!(
        errors[1].contains("16383 digits after the decimal point"),
        "{}",
        errors[1]
    );
    assert!(errors[4].contains("\\u0000"), "{}", errors[4]);
}
