//! The subtask locks (session-level advisory locks on the write connection)
//! against a real PostgreSQL: another process holding one is refused before
//! anything is touched, in every mode; a sink of this process that was just
//! dropped is waited for; a lost session of this process is ended; the same
//! subtask twice in one process is refused; a closed sink lets its locks go
//! at once.

mod common;

use std::time::{Duration, Instant};

use common::*;
use exactly_core::{ErasedSink, SinkFactory, TwoPhaseCommitSink};
use exactly_postgres::{PostgresSinkConfig, PostgresSinkFactory};
use tokio_postgres::Client;

const ID_NAME: &str = r#"
create_table = true
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
name = { from = "/name", type = "text" }
"#;

fn people(partition: i32, from: i64, n: i64) -> Vec<exactly_core::Record> {
    (from..from + n)
        .map(|i| record(partition, i, &format!(r#"{{"id":{i},"name":"n{i}"}}"#)))
        .collect()
}

/// The keys of the advisory locks that sessions of `pipeline`'s sinks hold
/// (their `application_name` starts with `exactly <pipeline> pid=`).
async fn held_keys(db: &Client, pipeline: &str) -> Vec<i64> {
    db.query(
        "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l \
         JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted \
         AND starts_with(a.application_name, 'exactly ' || $1 || ' pid=') ORDER BY 1",
        &[&pipeline],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The `application_name` of the sessions of `pipeline`'s sinks.
async fn application_names(db: &Client, pipeline: &str) -> Vec<String> {
    column(
        db,
        &format!(
            "SELECT DISTINCT application_name FROM pg_stat_activity \
             WHERE starts_with(application_name, 'exactly {pipeline} pid=')"
        ),
    )
    .await
}

/// The sink `PostgresSinkFactory::create` makes for subtask 0, recovered.
async fn recovered(config: &PostgresSinkConfig, pipeline: &str) -> Result<Box<dyn ErasedSink>, String> {
    let mut sink = PostgresSinkFactory::new(config.clone())
        .unwrap()
        .create(context(pipeline, 0))
        .unwrap();
    match sink.recover(&[]).await {
        Ok(()) => Ok(sink),
        Err(exactly_core::ConnectorError::Fatal { message, .. }) => Err(message),
        Err(other) => panic!("expected success or a fatal error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_lock_held_by_another_process_is_fatal_names_the_holder_and_touches_nothing() {
    let f = Fixture::new("locked", ID_NAME).await;
    let (db, pipeline) = (&f.db, &f.pipeline);
    let (mut first, _) = f.recovered(0, &[]).await;
    let orphan = prepare(&mut first, 1, &[people(0, 0, 3)]).await;
    let keys = held_keys(db, pipeline).await;
    assert_eq!(keys.len(), 1, "one lock for subtask 0");
    let names = application_names(db, pipeline).await;
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(
        names[0].contains(&format!("pid={}.", std::process::id())),
        "the sessions name this process: {names:?}"
    );
    drop(first);

    // Another process takes the lock (and so runs the pipeline) now.
    let (other, other_pid) = foreign_holder(f.pg.url(), "exactly on another host", keys[0]).await;
    let (mut second, _) = new_sink(&f.config, pipeline, 0);
    let message = fatal_message(second.recover(&[]).await);
    for part in [
        format!("pipeline {pipeline:?}"),
        format!("table {}", f.table),
        "sink subtask 0".into(),
        format!("backend pid {other_pid}"),
        "application_name \"exactly on another host\"".into(),
        "connected since 20".into(),
        "Another process runs this pipeline".into(),
        format!("SELECT pg_terminate_backend({other_pid})"),
    ] {
        assert!(message.contains(&part), "`{part}` missing from: {message}");
    }
    assert_eq!(
        prepared(db, &orphan.gid).await,
        std::slice::from_ref(&orphan.gid),
        "the refused sink did not roll back the other process's transaction"
    );

    // The other process ends: its lock goes with its session.
    end_session(db, other, other_pid).await;
    let (third, _) = f.recovered(0, &[]).await;
    assert!(
        prepared(db, third.gid_prefix()).await.is_empty(),
        "now recovery rolls it back"
    );
    assert_eq!(f.count().await, 0);
}

#[tokio::test]
async fn modes_upsert_and_fenced_are_locked_too() {
    for mode in ["upsert", "fenced"] {
        let f = Fixture::new("locked_mode", &format!("mode = \"{mode}\"\n{KV_UPSERT}")).await;
        let mut first = recovered(&f.config, &f.pipeline).await.unwrap();
        let keys = held_keys(&f.db, &f.pipeline).await;
        assert_eq!(keys.len(), 1, "{mode}: one lock for subtask 0");
        // Closed after a clean stop, it lets them go at once.
        assert_eq!(first.close().await.unwrap(), exactly_core::Closed::Released, "{mode}");
        assert_eq!(held_keys(&f.db, &f.pipeline).await, Vec::<i64>::new(), "{mode}");
        drop(first);
        let (other, pid) = foreign_holder(f.pg.url(), "someone else", keys[0]).await;
        let message = recovered(&f.config, &f.pipeline).await.map(drop).unwrap_err();
        assert!(
            message.contains(&format!("backend pid {pid}")) && message.contains("sink subtask 0"),
            "{mode}: {message}"
        );
        end_session(&f.db, other, pid).await;
        recovered(&f.config, &f.pipeline).await.unwrap();
    }
}

#[tokio::test]
async fn an_adopting_subtask_locks_every_subtask_it_owns() {
    let f = Fixture::new("adopting", ID_NAME).await;
    let factory = PostgresSinkFactory::new(f.config.clone()).unwrap();
    let mut heir = factory.create_sink(context(&f.pipeline, 0).with_adopted(vec![2, 4]));
    heir.recover(&[]).await.unwrap();
    assert_eq!(held_keys(&f.db, &f.pipeline).await.len(), 3, "subtasks 0, 2 and 4");
    // An old process still running subtask 2 keeps the heir out.
    drop(heir);
    let (mut old, _) = new_sink(&f.config, &f.pipeline, 2);
    old.recover(&[]).await.unwrap();
    let mut heir = factory.create_sink(context(&f.pipeline, 0).with_adopted(vec![2]));
    let message = fatal_message(heir.recover(&[]).await);
    assert!(
        message.contains("as subtask 2") && message.contains("runs twice in one process"),
        "{message}"
    );
}

/// A sink that was just dropped (an in-process restart) still has its
/// session for a moment; a sink whose connection this process lost may keep
/// one much longer. Both hold the lock under this process's name: the new
/// sink waits, and ends a session that outlives the wait.
#[tokio::test]
async fn a_lost_session_of_this_process_is_waited_for_then_ended() {
    let f = Fixture::new("lingering", ID_NAME).await;
    let (first, _) = f.recovered(0, &[]).await;
    let key = held_keys(&f.db, &f.pipeline).await[0];
    let ours = application_names(&f.db, &f.pipeline).await.remove(0);
    drop(first);
    // The "lost" session: this process's name, the subtask's lock.
    let (lingering, pid) = foreign_holder(f.pg.url(), &ours, key).await;
    let started = Instant::now();
    let (second, _) = f.recovered(0, &[]).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4),
        "it waited for the session first ({waited:?})"
    );
    let ended = lingering.query_one("SELECT 1", &[]).await;
    assert!(ended.is_err(), "the lingering session (pid {pid}) was ended");
    assert_eq!(
        held_keys(&f.db, &f.pipeline).await,
        [key],
        "the new sink holds the lock"
    );
    drop(second);
}

#[tokio::test]
async fn the_same_subtask_twice_in_one_process_is_refused() {
    let f = Fixture::new("twice", ID_NAME).await;
    let (_first, _) = f.recovered(0, &[]).await;
    let (mut second, _) = new_sink(&f.config, &f.pipeline, 0);
    let message = fatal_message(second.recover(&[]).await);
    assert!(
        message.contains("another sink of this process") && message.contains("runs twice in one process"),
        "{message}"
    );
}

/// A sink closed after its subtask stopped cleanly lets its locks go at the
/// server while its session is still there, so a process taking the
/// pipeline over (on this machine too, where a live holder is refused at
/// once) takes them without waiting for that session to end.
#[tokio::test]
async fn a_closed_sink_lets_its_subtask_locks_go_while_its_session_lives() {
    let f = Fixture::new("closed", ID_NAME).await;
    let (mut first, _) = f.recovered(0, &[]).await;
    let key = held_keys(&f.db, &f.pipeline).await;
    assert_eq!(key.len(), 1, "subtask 0's lock");
    let sessions = || async {
        column::<String>(
            &f.db,
            &format!(
                "SELECT application_name FROM pg_stat_activity WHERE starts_with(application_name, 'exactly {} pid=')",
                f.pipeline
            ),
        )
        .await
        .len()
    };
    let open = sessions().await;
    assert_eq!(first.close().await.expect("closed"), exactly_core::Closed::Released);
    assert_eq!(
        held_keys(&f.db, &f.pipeline).await,
        Vec::<i64>::new(),
        "no lock held once close returned"
    );
    assert_eq!(sessions().await, open, "the sessions are still there");
    // Taken over at once by another sink of the subtask.
    let (mut second, _) = new_sink(&f.config, &f.pipeline, 0);
    second.recover(&[]).await.expect("the lock is free");
    assert_eq!(held_keys(&f.db, &f.pipeline).await, key);
    drop(first);
}
