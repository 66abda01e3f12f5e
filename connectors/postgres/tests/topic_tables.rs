//! A table per topic against a real PostgreSQL: `table = "<prefix>_${topic}"`
//! and a per-topic map; the rows of every table of an interval in one
//! prepared transaction; staged rows of several tables merged at commit and
//! by recovery; a table for a topic first seen mid-run; a topic whose table
//! is missing or whose name would be cut.

mod common;

use common::*;
use exactly_core::{CheckpointId, Record, TwoPhaseCommitSink};

/// Keyed by the record key, `v` from the value; tombstones delete.
const KEYED: &str = r#"
create_table = true
pk.mode = "record_key"
pk.fields = ["id"]
delete.enabled = true
[sink.postgres.columns]
id = { type = "bigint" }
v = { from = "/v", type = "text" }
"#;

/// `{"v": "<v>"}` keyed `<key>` in partition 0 of `topic`.
fn put(topic: &str, offset: i64, key: i64, v: &str) -> Record {
    Record::new(format!("{topic}-0"), offset, format!(r#"{{"v":"{v}"}}"#).into_bytes()).with_key(key.to_string())
}

fn delete(topic: &str, offset: i64, key: i64) -> Record {
    Record::tombstone(format!("{topic}-0"), offset).with_key(key.to_string())
}

async fn exists(db: &tokio_postgres::Client, table: &str) -> bool {
    db.query_one("SELECT to_regclass($1) IS NOT NULL", &[&format!("\"{table}\"")])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn every_topic_goes_to_its_table_in_one_prepared_transaction_per_interval() {
    let server = shared_server();
    let db = client(server.url()).await;
    let prefix = unique("tt");
    let config = config(server.url(), &format!("{prefix}_${{topic}}"), KEYED);
    let pipeline = unique("pipe");
    let (mut sink, _) = new_sink(&config, &pipeline, 0);
    sink.recover(&[]).await.unwrap();
    // Two topics interleaved in one batch, a key changed twice in each.
    let batch = vec![
        put("orders", 0, 1, "o1"),
        put("payments", 0, 1, "p1"),
        put("orders", 1, 1, "o1b"),
        delete("payments", 1, 1),
        put("payments", 2, 2, "p2"),
        put("orders-eu", 0, 7, "eu7"),
    ];
    let c = prepare(&mut sink, 1, &[batch]).await;
    assert_eq!(
        prepared(&db, sink.gid_prefix()).await,
        vec![c.gid.clone()],
        "one transaction"
    );
    let mut tables = c.tables.clone();
    tables.sort();
    assert_eq!(
        tables,
        vec![
            format!("{prefix}_orders"),
            format!("{prefix}_orders-eu"),
            format!("{prefix}_payments")
        ]
    );
    // Nothing visible before the commit.
    assert_eq!(count(&db, &format!("{prefix}_orders")).await, 0);
    sink.commit(&c).await.unwrap();
    assert_eq!(
        pairs(&db, &format!("{prefix}_orders")).await,
        expect_pairs(&[(1, "o1b")])
    );
    assert_eq!(
        pairs(&db, &format!("{prefix}_payments")).await,
        expect_pairs(&[(2, "p2")])
    );
    assert_eq!(
        pairs(&db, &format!("{prefix}_orders-eu")).await,
        expect_pairs(&[(7, "eu7")])
    );

    // Prepared, then the process dies: a new sink commits it from the
    // checkpoint's list, merging into both tables, and writes a topic it
    // has not seen yet.
    let c2 = prepare(
        &mut sink,
        2,
        &[vec![put("orders", 2, 1, "o1c"), put("payments", 3, 3, "p3")]],
    )
    .await;
    let serialized = serde_json::to_string(&c2).unwrap();
    drop(sink);
    let restored: exactly_postgres::PostgresCommittable = serde_json::from_str(&serialized).unwrap();
    let (mut sink, _) = new_sink(&config, &pipeline, 0);
    sink.recover(&[restored]).await.unwrap();
    assert_eq!(
        pairs(&db, &format!("{prefix}_orders")).await,
        expect_pairs(&[(1, "o1c")])
    );
    assert_eq!(
        pairs(&db, &format!("{prefix}_payments")).await,
        expect_pairs(&[(2, "p2"), (3, "p3")])
    );
    let c3 = prepare(&mut sink, 3, &[vec![put("refunds", 0, 9, "r9")]]).await;
    sink.commit(&c3).await.unwrap();
    assert_eq!(
        pairs(&db, &format!("{prefix}_refunds")).await,
        expect_pairs(&[(9, "r9")])
    );
    assert!(prepared(&db, sink.gid_prefix()).await.is_empty());
}

#[tokio::test]
async fn a_map_names_tables_and_a_missing_table_or_a_name_postgres_would_cut_is_a_clear_error() {
    let server = shared_server();
    let db = client(server.url()).await;
    let prefix = unique("tm");
    let mapped = format!("{prefix}_all_orders");
    db.batch_execute(&format!("CREATE TABLE \"{mapped}\" (id bigint, v text)"))
        .await
        .unwrap();
    let body = format!(
        "tables = {{ orders = \"{mapped}\" }}\n[sink.postgres.columns]\nid = {{ from = \"/id\", type = \"bigint\" }}\n\
         v = {{ from = \"/v\", type = \"text\" }}\n"
    );
    let config = config(server.url(), &format!("{prefix}_${{topic}}"), &body);
    let pipeline = unique("pipe");
    let (mut sink, _) = new_sink(&config, &pipeline, 0);
    sink.recover(&[]).await.unwrap();
    let row = |topic: &str, offset: i64| {
        Record::new(
            format!("{topic}-0"),
            offset,
            format!(r#"{{"id":{offset},"v":"{topic}"}}"#).into_bytes(),
        )
    };
    let c = prepare(&mut sink, 1, &[vec![row("orders", 0), row("orders", 1)]]).await;
    assert!(c.tables.is_empty(), "appends merge nothing: {:?}", c.tables);
    sink.commit(&c).await.unwrap();
    assert_eq!(count(&db, &mapped).await, 2);

    // A topic whose table does not exist (no create_table): the error names
    // the table and the fix; the transaction is rolled back.
    let mut txn = sink.begin(CheckpointId(2)).await.unwrap();
    let message = fatal_message(sink.write(&mut txn, &[row("payments", 0)]).await);
    assert!(
        message.contains(&format!("{prefix}_payments")) && message.contains("create_table"),
        "{message}"
    );
    sink.abort(txn).await.unwrap();
    assert!(!exists(&db, &format!("{prefix}_payments")).await);

    // A topic making a name PostgreSQL would cut.
    let mut txn = sink.begin(CheckpointId(3)).await.unwrap();
    let long = "x".repeat(60);
    let message = fatal_message(sink.write(&mut txn, &[row(&long, 0)]).await);
    assert!(message.contains("longer than PostgreSQL's 63 bytes"), "{message}");
    sink.abort(txn).await.unwrap();
}
