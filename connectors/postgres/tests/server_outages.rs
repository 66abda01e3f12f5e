//! Tests that stop, restart and reconfigure (`ALTER SYSTEM`) a PostgreSQL
//! server: always one of their own, even when `EXACTLY_DATABASE_URL` names
//! an external server (whose settings a test must never change).

mod common;

use common::*;
use exactly_core::{CheckpointId, ConnectorError, Record, SinkFactory, TwoPhaseCommitSink};
use exactly_postgres::PostgresSinkFactory;
use exactly_testkit::PostgresServer;

/// A server of this test's own, whatever `EXACTLY_DATABASE_URL` says.
fn own_server() -> PostgresServer {
    let pg = PostgresServer::start_own().expect("start PostgreSQL");
    assert!(!pg.is_external(), "start_own never uses EXACTLY_DATABASE_URL: {pg:?}");
    pg
}

#[tokio::test]
async fn prepared_transactions_survive_an_outage_and_max_prepared_transactions_zero_is_named() {
    let mut pg = own_server();
    let url = pg.url().to_string();
    let table = unique("people");
    let config = config(
        &url,
        &table,
        "create_table = true\n[sink.postgres.columns]\nid = { from = \"/id\", type = \"bigint\" }\n",
    );
    let (mut sink, _) = new_sink(&config, "outage", 0);
    sink.recover(&[]).await.unwrap();
    let c = prepare(
        &mut sink,
        1,
        &[vec![record(0, 0, r#"{"id":1}"#), record(0, 1, r#"{"id":2}"#)]],
    )
    .await;

    // The server goes away between pre-commit and commit: a transient error
    // that names the server.
    pg.stop().unwrap();
    let message = transient_message(sink.commit(&c).await);
    assert!(message.contains(&url), "{message}");

    // It comes back: the prepared transaction survived and the same sink
    // reconnects and commits it.
    pg.restart().unwrap();
    sink.commit(&c).await.unwrap();
    let db = client(&url).await;
    assert_eq!(count(&db, &table).await, 2);
    // And writes again on a new connection.
    let next = prepare(&mut sink, 2, &[vec![record(0, 2, r#"{"id":3}"#)]]).await;
    sink.commit(&next).await.unwrap();
    assert_eq!(count(&db, &table).await, 3);
    drop((db, sink));

    // A server without prepared transactions is refused with the fix.
    let set = |n: u32| format!("ALTER SYSTEM SET max_prepared_transactions = {n}");
    // The testkit's restart is a crash: a CHECKPOINT first, or the redo of
    // the PREPARE records above would need prepared-transaction slots.
    let admin = client(&url).await;
    admin.batch_execute("CHECKPOINT").await.unwrap();
    admin.batch_execute(&set(0)).await.unwrap();
    drop(admin);
    pg.restart().unwrap();
    let (mut refused, _) = new_sink(&config, "outage", 0);
    match refused.recover(&[]).await {
        Err(ConnectorError::Fatal { message, .. }) => {
            for part in [
                "max_prepared_transactions = 0",
                "max_prepared_transactions = 64 in postgresql.conf",
                "ALTER SYSTEM SET max_prepared_transactions = 64",
                "restart the server",
            ] {
                assert!(message.contains(part), "{message:?} should contain {part:?}");
            }
        }
        other => panic!("expected a fatal error, got {other:?}"),
    }
    client(&url).await.batch_execute(&set(64)).await.unwrap();
    pg.restart().unwrap();
    let (mut accepted, _) = new_sink(&config, "outage", 0);
    accepted.recover(&[]).await.unwrap();
}

#[tokio::test]
async fn modes_upsert_and_fenced_work_with_max_prepared_transactions_zero() {
    let mut pg = own_server();
    let url = pg.url().to_string();
    client(&url)
        .await
        .batch_execute("ALTER SYSTEM SET max_prepared_transactions = 0")
        .await
        .unwrap();
    pg.restart().unwrap();
    let db = client(&url).await;
    let setting: String = db
        .query_one("SHOW max_prepared_transactions", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(setting, "0");

    let columns = "[sink.postgres.columns]\nid = { from = \"/id\", type = \"bigint\" }\n";
    let upsert = config(
        &url,
        "kv",
        &format!("mode = \"upsert\"\nupsert_key = [\"id\"]\ncreate_table = true\n{columns}"),
    );
    let fenced = config(
        &url,
        "events",
        &format!("mode = \"fenced\"\ncreate_table = true\n{columns}"),
    );
    let records: Vec<Record> = (0..3)
        .map(|i| record(0, i, &format!(r#"{{"id":{}}}"#, i % 2)))
        .collect();
    for (config, table, rows) in [(&upsert, "kv", 2), (&fenced, "events", 3)] {
        let factory = PostgresSinkFactory::new(config.clone()).unwrap();
        let mut sink = factory.create(context("no-2pc", 0)).unwrap();
        sink.recover(&[]).await.unwrap();
        sink.write(CheckpointId(1), &records).await.unwrap();
        if let Some(committable) = sink.pre_commit().await.unwrap() {
            sink.commit(&committable).await.unwrap();
        }
        assert_eq!(count(&db, table).await, rows, "{table}");
    }

    // Mode two-phase is still refused, naming the setting.
    let two_phase = config(&url, "people", &format!("create_table = true\n{columns}"));
    let (mut refused, _) = new_sink(&two_phase, "no-2pc", 0);
    let message = fatal_message(refused.recover(&[]).await);
    assert!(message.contains("max_prepared_transactions = 0"), "{message}");
}

/// The keys of the advisory locks held by the sessions of `pipeline`'s
/// sinks.
async fn held_keys(db: &tokio_postgres::Client, pipeline: &str) -> Vec<i64> {
    db.query(
        "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l \
         JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted \
         AND starts_with(a.application_name, 'exactly ' || $1 || ' pid=')",
        &[&pipeline],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// After a server restart the sink's sessions are gone, and with them its
/// subtask lock. It must take the lock again before its next commit, never
/// commit while another process holds it, and the transaction that was open
/// on the lost connection must not continue on the new one (its rows would
/// be written outside any transaction).
#[tokio::test]
async fn after_a_restart_the_lock_is_taken_again_before_a_commit_and_the_open_transaction_is_gone() {
    let mut pg = own_server();
    let url = pg.url().to_string();
    let table = unique("relock");
    let pipeline = unique("relock");
    let config = config(
        &url,
        &table,
        "create_table = true\n[sink.postgres.columns]\nid = { from = \"/id\", type = \"bigint\" }\n",
    );
    let (mut sink, _) = new_sink(&config, &pipeline, 0);
    sink.recover(&[]).await.unwrap();
    let c = prepare(&mut sink, 1, &[vec![record(0, 0, r#"{"id":1}"#)]]).await;
    let mut open = sink.begin(CheckpointId(2)).await.unwrap();
    sink.write(&mut open, &[record(0, 1, r#"{"id":2}"#)]).await.unwrap();
    let key = held_keys(&client(&url).await, &pipeline).await[0];

    pg.restart().unwrap();
    // Another process is quicker and takes the lock.
    let (other, other_pid) = foreign_holder(&url, "the other process", key).await;
    let message = fatal_message(sink.commit(&c).await);
    assert!(
        message.contains("the other process") && message.contains("sink subtask 0"),
        "{message}"
    );
    let db = client(&url).await;
    assert_eq!(
        prepared(&db, &c.gid).await,
        std::slice::from_ref(&c.gid),
        "not committed without the lock"
    );

    // It goes away: the commit takes the lock and goes through.
    end_session(&db, other, other_pid).await;
    sink.commit(&c).await.unwrap();
    assert_eq!(count(&db, &table).await, 1);
    assert_eq!(held_keys(&db, &pipeline).await, [key]);
    // The transaction of the lost connection cannot go on.
    let lost = sink.write(&mut open, &[record(0, 2, r#"{"id":3}"#)]).await;
    assert!(matches!(lost, Err(ConnectorError::Transient { .. })), "{lost:?}");
    let lost = sink.pre_commit(open).await;
    assert!(matches!(lost, Err(ConnectorError::Transient { .. })), "{lost:?}");
    assert_eq!(count(&db, &table).await, 1, "nothing of it was written");
    assert!(prepared(&db, sink.gid_prefix()).await.is_empty());
    let next = prepare(&mut sink, 3, &[vec![record(0, 1, r#"{"id":2}"#)]]).await;
    sink.commit(&next).await.unwrap();
    assert_eq!(count(&db, &table).await, 2);
}
