//! The PostgreSQL checkpoint store against a real server from the test kit:
//! the store contract (the same checks the folder store passes), two
//! handles racing (two processes), entries byte for byte as the folder
//! store writes them, the audit that no entry of an older epoch was written
//! after a newer epoch was taken, writes whose outcome is unknown — one cut
//! off by `pg_terminate_backend` that did not land, one whose answer never
//! came (its backend frozen with SIGSTOP) that did — settled by the next
//! fence, and the one-process lock.

use std::time::Duration;

use exactly_core::store::{conformance, AccessError};
use exactly_core::{CheckpointId, CheckpointStore, Checkpoints, Scope, StoreError};
use exactly_store_postgres::PgCheckpointStore;
use exactly_testkit::PostgresServer;

mod common;
use common::{client, entry, unique};

/// Waits (at most 30 s) until `query` returns a row, and returns its first
/// column.
async fn eventually_pid(db: &tokio_postgres::Client, application_name: &str) -> i32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let row = db
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&application_name],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            return row.get(0);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no session {application_name} waiting on a lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_keeps_the_contract_and_two_handles_race_safely() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let pipeline = unique("contract");
    let store = PgCheckpointStore::new(pg.url(), &pipeline, 3).unwrap();
    conformance::sequence_contract(&store, Scope::Region(0)).await;
    conformance::sequence_contract(&store, Scope::Global).await;
    conformance::pipeline_contract(&store).await;
    // Two handles: two processes on two machines.
    let other = PgCheckpointStore::new(pg.url(), &pipeline, 3).unwrap();
    conformance::racing_handles(&store, &other, Scope::Region(1)).await;

    // The audit the multi-process tests make: no entry written under an
    // epoch after a newer epoch of its sequence was taken.
    let db = client(pg.url()).await;
    let late: i64 = db
        .query_one(
            "SELECT count(*) FROM exactly_checkpoints c JOIN exactly_epochs e
               ON e.pipeline = c.pipeline AND e.scope = c.scope AND e.epoch > c.epoch AND e.taken_at < c.written_at
             WHERE c.pipeline = $1",
            &[&pipeline],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        late, 0,
        "an entry of an older epoch was written after a newer one was taken"
    );
    let taken: i64 = db
        .query_one(
            "SELECT count(*) FROM exactly_epochs WHERE pipeline = $1 AND scope = 'region-1'",
            &[&pipeline],
        )
        .await
        .unwrap()
        .get(0);
    assert!(taken >= 2, "every fence is logged ({taken})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_keep_their_names_json_and_checksum() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let pipeline = unique("entries");
    let store = PgCheckpointStore::new(pg.url(), &pipeline, 2).unwrap();
    let checkpoints = Checkpoints::new(store.sequence(Scope::Region(3)), store.retain());
    let epoch = checkpoints.take("test").await.unwrap().epoch;
    for id in 1..=3 {
        checkpoints.save(epoch, &entry(&pipeline, id)).await.unwrap();
    }
    checkpoints.prune(epoch).await.unwrap();
    let names: Vec<u64> = checkpoints.list().await.unwrap().iter().map(|n| n.id.0).collect();
    assert_eq!(names, vec![2, 3], "retention keeps the newest two");
    let latest = checkpoints.latest().await.unwrap().expect("an entry");
    assert_eq!(latest.checkpoint.id, CheckpointId(3));

    let db = client(pg.url()).await;
    let row = db
        .query_one(
            "SELECT name, checkpoint_id, epoch, convert_from(body, 'UTF8') FROM exactly_checkpoints
             WHERE pipeline = $1 AND scope = 'region-3' AND checkpoint_id = 3",
            &[&pipeline],
        )
        .await
        .unwrap();
    let (name, id, written_under, body): (String, i64, i64, String) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(name, latest.file_name(), "<fingerprint>-<unix-ms>-<checkpoint-id>");
    assert_eq!((id, written_under as u64), (3, epoch.0));
    assert_eq!(
        body.as_bytes(),
        &latest.encode().unwrap()[..],
        "the envelope byte for byte as a folder entry holds it"
    );
    assert!(body.contains("\"sha256\""), "{body}");

    // A flipped byte fails its checksum, and the newest readable one wins.
    db.execute(
        "UPDATE exactly_checkpoints SET body = convert_to(replace(convert_from(body, 'UTF8'), '\"id\": 3', '\"id\": 4'), 'UTF8')
         WHERE pipeline = $1 AND scope = 'region-3' AND checkpoint_id = 3",
        &[&pipeline],
    )
    .await
    .unwrap();
    let why = checkpoints.read(&latest.file_name()).await.unwrap_err().to_string();
    assert!(why.contains("fails its checksum"), "{why}");
    assert_eq!(
        checkpoints.latest().await.unwrap().unwrap().checkpoint.id,
        CheckpointId(2)
    );
    checkpoints.set_aside(epoch, &latest.file_name()).await.unwrap();
    assert_eq!(checkpoints.set_aside_entries().await.unwrap()[0].id, CheckpointId(3));
    assert_eq!(store.regions().await.unwrap(), vec![3]);
}

/// The write's backend is ended while it waits on a lock, after the
/// statement was sent: the store cannot know what happened (indeterminate);
/// the next fence settles it — here it did not land — and nothing of the
/// old epoch is accepted afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_off_after_it_was_sent_is_indeterminate_and_the_next_fence_settles_it() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let pipeline = unique("terminated");
    let store = PgCheckpointStore::new(pg.url(), &pipeline, 3).unwrap();
    let checkpoints = Checkpoints::new(store.sequence(Scope::Region(0)), 3);
    let epoch = checkpoints.take("zombie").await.unwrap().epoch;

    // The test holds the sequence's row, so the write waits on it.
    let mut db = client(pg.url()).await;
    let tx = db.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM exactly_sequences WHERE pipeline = $1 AND scope = 'region-0' FOR UPDATE",
        &[&pipeline],
    )
    .await
    .unwrap();
    let e = entry(&pipeline, 1);
    let write = {
        let (checkpoints, e) = (checkpoints.clone(), e.clone());
        tokio::spawn(async move { checkpoints.save(epoch, &e).await })
    };
    let admin = client(pg.url()).await;
    let pid = eventually_pid(&admin, &store.session_name(Scope::Region(0))).await;
    let ended: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(ended);
    let outcome = tokio::time::timeout(Duration::from_secs(30), write)
        .await
        .expect("the write returns")
        .unwrap();
    assert!(
        matches!(outcome, Err(StoreError::Access(AccessError::Indeterminate { .. }))),
        "{outcome:?}"
    );
    tx.rollback().await.unwrap();

    // A new owner fences: the write is settled, and it did not land.
    let other = PgCheckpointStore::new(pg.url(), &pipeline, 3).unwrap();
    let theirs = Checkpoints::new(other.sequence(Scope::Region(0)), 3);
    let newer = theirs.take("new owner").await.unwrap().epoch;
    assert!(newer > epoch);
    assert!(
        theirs.latest().await.unwrap().is_none(),
        "the cut-off write did not land"
    );
    // The old owner's connection is back, its epoch is not.
    let again = checkpoints.save(epoch, &e).await;
    assert!(matches!(again, Err(StoreError::Fenced { .. })), "{again:?}");
    assert!(theirs.latest().await.unwrap().is_none());
}

/// The write is sent while its backend is frozen (SIGSTOP: PostgreSQL's
/// backends run in sessions of their own, so the test kit's freeze of the
/// postmaster's group does not reach them); its answer does not come within
/// the call time-out (indeterminate), the connection is dropped, the backend
/// thaws, reads the statement and commits it: an unknown outcome may be a
/// landed write. The next fence makes it visible, so a new owner restores
/// it — which is why the runtime neither commits nor aborts on an unknown
/// outcome but restarts and reads the store again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_never_came_may_have_landed_and_the_next_fence_shows_it() {
    let pg = PostgresServer::start_own().expect("PostgreSQL");
    let url = pg.url().to_string();
    let pipeline = unique("frozen");
    let store = PgCheckpointStore::new(&url, &pipeline, 3)
        .unwrap()
        .with_call_timeout(Duration::from_secs(2));
    let checkpoints = Checkpoints::new(store.sequence(Scope::Region(0)), 3);
    let epoch = checkpoints.take("zombie").await.unwrap().epoch;
    // Connected, and the write's statement prepared: what is sent while the
    // backend is frozen is the write itself.
    checkpoints.save(epoch, &entry(&pipeline, 1)).await.unwrap();
    let admin = client(&url).await;
    let backend: i32 = admin
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&store.session_name(Scope::Region(0))],
        )
        .await
        .unwrap()
        .get(0);
    let signal = |sig| {
        assert_eq!(
            unsafe { libc::kill(backend, sig) },
            0,
            "signal {sig} to backend {backend}"
        )
    };
    signal(libc::SIGSTOP);
    let e = entry(&pipeline, 2);
    let outcome = checkpoints.save(epoch, &e).await;
    signal(libc::SIGCONT);
    assert!(
        matches!(outcome, Err(StoreError::Access(AccessError::Indeterminate { .. }))),
        "{outcome:?}"
    );

    let other = PgCheckpointStore::new(&url, &pipeline, 3).unwrap();
    let theirs = Checkpoints::new(other.sequence(Scope::Region(0)), 3);
    let newer = theirs.take("new owner").await.unwrap().epoch;
    assert!(newer > epoch);
    let latest = theirs.latest().await.unwrap().expect("an entry");
    assert_eq!(
        latest.checkpoint.id,
        CheckpointId(2),
        "the write whose answer never came landed, before the fence"
    );
    let late = checkpoints.save(epoch, &entry(&pipeline, 3)).await;
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_holds_the_lock_and_the_refusal_names_it() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let pipeline = unique("locked");
    let store = PgCheckpointStore::new(pg.url(), &pipeline, 3).unwrap();
    let held = store.lock().await.expect("the first lock");
    let other = PgCheckpointStore::new(pg.url(), &pipeline, 3).unwrap();
    let err = other.lock().await.unwrap_err().to_string();
    assert!(
        err.contains(&format!("pipeline {pipeline} is already running")),
        "{err}"
    );
    assert!(err.contains(&format!("process {}", std::process::id())), "{err}");
    assert!(
        err.contains("postgres://") && !err.contains("password"),
        "names the store: {err}"
    );
    assert!(
        PgCheckpointStore::new(pg.url(), &unique("another"), 3)
            .unwrap()
            .lock()
            .await
            .is_ok(),
        "another pipeline"
    );
    drop(held);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match other.lock().await {
            Ok(_) => break,
            // The server ends the session a moment after the client closed it.
            Err(_) if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(error) => panic!("still locked after the holder dropped it: {error}"),
        }
    }
}

/// A holder that releases cleanly tells the next one (which then needs no
/// grace); one that just goes away, or that never existed, does not. The
/// record is read once: the holder after the next one starts from a
/// release that was not clean again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_release_is_told_to_the_next_holder_once_and_a_dropped_lock_is_not() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let pipeline = unique("handover");
    let store = PgCheckpointStore::new(pg.url(), &pipeline, 3).unwrap();
    let lock_when_free = || async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match store.lock().await {
                Ok(lock) => return lock,
                // A dropped lock's session ends a moment after its client.
                Err(_) if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(error) => panic!("still locked: {error}"),
            }
        }
    };
    let first = lock_when_free().await;
    assert!(!first.previous_released_cleanly(), "nobody held it before");
    first.release_cleanly().await.expect("recorded");
    // Let go at once by the release itself, not when the session ends.
    let second = store.lock().await.expect("free as soon as the release returned");
    assert!(second.previous_released_cleanly());
    drop(second);
    let third = lock_when_free().await;
    assert!(
        !third.previous_released_cleanly(),
        "the holder before it dropped the lock without a clean release"
    );
    // A record that is not recent cannot be the release of the holder just
    // before (one that never cleared it held the lock in between).
    third.release_cleanly().await.unwrap();
    client(pg.url())
        .await
        .execute(
            "UPDATE exactly_releases SET released_at = released_at - interval '1 hour' WHERE pipeline = $1",
            &[&pipeline],
        )
        .await
        .unwrap();
    let fourth = lock_when_free().await;
    assert!(!fourth.previous_released_cleanly(), "a stale record does not count");
}
