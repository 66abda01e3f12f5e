//! `exactly_postgres::copy::BinaryCopy` against a real PostgreSQL: rows
//! that span many messages arrive whole and in order, NULLs and every cell
//! kind the sink writes round-trip, and a row that cannot be encoded is
//! left out whole while the COPY goes on.

mod common;

use std::sync::Arc;

use common::{client, shared_server, unique};
use exactly_postgres::copy::{BinaryCopy, CopyError, CHUNK_BYTES};
use exactly_testkit::PostgresServer;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

const TYPES: [Type; 4] = [Type::INT8, Type::TEXT, Type::JSONB, Type::INT4];

/// A fresh table (n bigint primary key, note text, doc jsonb, small
/// integer), a client to read it, and a binary COPY into it; the server
/// handle keeps the shared server up.
async fn copy_into_new_table() -> (Arc<PostgresServer>, Client, String, BinaryCopy) {
    let server = shared_server();
    let client = client(server.url()).await;
    let table = unique("binary_copy");
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (n bigint PRIMARY KEY, note text, doc jsonb, small integer)"
        ))
        .await
        .expect("create table");
    let statement = format!("COPY {table} (n, note, doc, small) FROM STDIN (FORMAT binary)");
    let copy = BinaryCopy::start(&client, &statement, &TYPES)
        .await
        .expect("start COPY");
    (server, client, table, copy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_across_many_chunks_arrive_whole_and_in_order() {
    let (_server, client, table, mut copy) = copy_into_new_table().await;
    // About 40 bytes a row: 20,000 rows are more than twelve chunks.
    let rows = 20_000i64;
    let mut sent = 0;
    for n in 0..rows {
        let note = format!("row {n}");
        let doc = serde_json::json!({ "n": n });
        let small = (n % 7 != 0).then_some(n as i32);
        let values: [&(dyn ToSql + Sync); 4] = [&n, &note, &doc, &small];
        copy.push_row(values).expect("encode");
        if copy.buffered() >= CHUNK_BYTES {
            sent += 1;
        }
        copy.send_full().await.expect("send");
        assert!(copy.buffered() < CHUNK_BYTES, "a full chunk is sent at once");
    }
    assert!(sent >= 10, "the rows went out in {sent} chunks");
    assert_eq!(copy.finish().await.expect("finish"), rows as u64);

    let row = client
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT n), min(n), max(n), count(small), \
                 bool_and(note = 'row ' || n AND (doc->>'n')::bigint = n), \
                 bool_and(small IS NULL OR small = n) FROM {table}"
            ),
            &[],
        )
        .await
        .expect("read back");
    assert_eq!(row.get::<_, i64>(0), rows);
    assert_eq!(row.get::<_, i64>(1), rows);
    assert_eq!(row.get::<_, i64>(2), 0);
    assert_eq!(row.get::<_, i64>(3), rows - 1);
    assert_eq!(row.get::<_, i64>(4), rows - (rows + 6) / 7, "every 7th small is NULL");
    assert!(row.get::<_, bool>(5), "every note and doc matches its row");
    assert!(row.get::<_, bool>(6), "every small matches its row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_cannot_be_encoded_is_left_out_whole_and_the_copy_goes_on() {
    let (_server, client, table, mut copy) = copy_into_new_table().await;
    let doc = serde_json::json!({});
    let first: [&(dyn ToSql + Sync); 4] = [&1i64, &"one", &doc, &1i32];
    copy.push_row(first).expect("encode");
    let before = copy.buffered();

    // A text where the last column wants an integer: refused after three
    // values were encoded.
    let wrong: [&(dyn ToSql + Sync); 4] = [&2i64, &"two", &doc, &"2"];
    match copy.push_row(wrong) {
        Err(CopyError::Encode { column, ty, .. }) => {
            assert_eq!(column, 3);
            assert_eq!(ty, Type::INT4);
        }
        other => panic!("expected an encoding error, got {other:?}"),
    }
    assert_eq!(copy.buffered(), before, "nothing of the refused row is kept");

    let short: [&(dyn ToSql + Sync); 2] = [&3i64, &"three"];
    match copy.push_row(short) {
        Err(CopyError::Width { got: 2, expected: 4 }) => {}
        other => panic!("expected a width error, got {other:?}"),
    }
    assert_eq!(copy.buffered(), before, "nothing of the short row is kept");

    let last: [&(dyn ToSql + Sync); 4] = [&4i64, &"four", &doc, &None::<i32>];
    copy.push_row(last).expect("encode");
    assert_eq!(copy.finish().await.expect("finish"), 2);
    let stored: Vec<i64> = client
        .query(&format!("SELECT n FROM {table} ORDER BY n"), &[])
        .await
        .expect("read back")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored, [1, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_dropped_before_finish_stores_nothing() {
    let (_server, client, table, mut copy) = copy_into_new_table().await;
    let doc = serde_json::json!([1, 2]);
    for n in 0..5_000i64 {
        let values: [&(dyn ToSql + Sync); 4] = [&n, &"x", &doc, &0i32];
        copy.push_row(values).expect("encode");
        copy.send_full().await.expect("send");
    }
    copy.send_all().await.expect("send the rest");
    drop(copy);
    // The connection is usable again once the server has failed the COPY;
    // without the client's CopyFail the server would wait for more rows and
    // the query would never be answered.
    let count = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.query_one(&format!("SELECT count(*) FROM {table}"), &[]),
    )
    .await
    .expect("the dropped COPY was failed, not left waiting for rows")
    .expect("the connection goes on after the failed COPY");
    let count: i64 = count.get(0);
    assert_eq!(count, 0);
}
