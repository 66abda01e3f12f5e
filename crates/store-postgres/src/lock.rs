//! The pipeline's lock on the PostgreSQL store: a session-level advisory
//! lock held on a connection of its own for as long as the run lasts. The
//! server releases it when the session ends, however the process ended.
//! While one process runs the pipeline, another is refused naming the
//! holder's `application_name` (host and pid), backend and since when (or
//! waits for it, as a standby). The holder asks its session every second
//! whether it is still there: a session the server ended (or that stopped
//! answering) may mean the lock is someone else's now, and the runtime
//! stops acting at once.
//!
//! A holder that stops cleanly (after its last commits, with its sinks
//! closed) records it in `exactly_releases` through the lock's session and
//! lets the lock go; the next holder reads and deletes that row in the
//! session that took the lock, and starts at once instead of waiting for
//! a holder that may still be acting (see
//! [`StoreLock::release_cleanly`](exactly_core::store::StoreLock::release_cleanly)).
//!
//! (Several workers of one pipeline — the next step — give this lock up for
//! leases on each region; see `docs/design/several-processes.md`.)

use std::sync::Arc;
use std::time::Duration;

use exactly_core::store::{AccessError, StoreLock};
use exactly_core::StoreError;
use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use crate::session::{Session, Target};

/// The advisory-lock key of `pipeline`'s checkpoints: 64 bits of SHA-256.
pub(crate) fn key(pipeline: &str) -> i64 {
    let digest = Sha256::digest(format!("exactly-checkpoint-store:{pipeline}").as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Holds the lock: the session it was taken on (shared with its watcher),
/// and the watcher's stop (dropped with the guard, which ends the watcher
/// and so the session).
struct Held {
    #[allow(dead_code)]
    client: Arc<Client>,
    #[allow(dead_code)]
    stop: tokio::sync::oneshot::Sender<()>,
}

/// How recent a clean-release record must be to count: a standby takes
/// the lock within a poll of its release, well inside this.
const RELEASE_FRESH: Duration = Duration::from_secs(30);

/// How often the lock's session is asked whether it still holds: a holder
/// that lost it stops acting within about this (plus the query's time);
/// a standby waits [`exactly_core::STANDBY_TAKEOVER_GRACE`] after taking
/// the lock, well above it.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Watches the lock's session: a failed or unanswered `SELECT 1` (the
/// server ended the session — `pg_terminate_backend`, a restart, a timeout
/// — or the network is gone) means the lock may be held by someone else
/// now, and is reported on `lost` for the runtime to stop acting.
fn watch(
    client: Arc<Client>,
    answer_within: Duration,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    lost: tokio::sync::watch::Sender<Option<String>>,
) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(WATCH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = every.tick() => {}
            }
            let why = match tokio::time::timeout(answer_within, client.simple_query("SELECT 1")).await {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => format!("the session holding the pipeline's lock failed: {e}"),
                Err(_) => format!("the session holding the pipeline's lock did not answer within {answer_within:?}"),
            };
            let _ = lost.send(Some(why));
            return;
        }
    });
}

/// Takes `pipeline`'s lock on a session named `name`: the one a refused
/// call left in `spare` while it is open, else a new one. Refused, the
/// session goes back to `spare` for the next try (a standby's).
pub(crate) async fn take(
    target: &Target,
    pipeline: &str,
    name: &str,
    location: &str,
    spare: &tokio::sync::Mutex<Option<Client>>,
) -> Result<StoreLock, StoreError> {
    let failed = |operation: &str, e: exactly_core::BoxError| {
        StoreError::Access(AccessError::determinate(location, operation, e))
    };
    let mut spare = spare.lock().await;
    let client = match spare.take() {
        Some(client) if !client.is_closed() => client,
        _ => Session::connect(target, name)
            .await
            .map_err(|e| failed("locking the pipeline (connecting)", e))?,
    };
    let key = key(pipeline);
    let taken: bool = client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .await
        .map_err(|e| failed("locking the pipeline", e.into()))?
        .get(0);
    if taken {
        // Workers of this pipeline share it without this lock: a process
        // running it alone beside them would neither claim nor fence as
        // they do. (A worker starting meanwhile asks for this lock's
        // holder before it claims anything.)
        let worker: Option<String> = client
            .query_opt(
                "SELECT worker FROM exactly_workers WHERE pipeline = $1 AND expires > now() LIMIT 1",
                &[&pipeline],
            )
            .await
            .map_err(|e| failed("looking for the pipeline's workers", e.into()))?
            .map(|row| row.get(0));
        if let Some(worker) = worker {
            return Err(StoreError::Locked {
                pipeline: pipeline.to_string(),
                dir: location.to_string(),
                holder: format!(
                    "worker {worker} and the others of this pipeline's [workers]: run this process with the same \
                     [workers] section to join them, or stop them first"
                ),
            });
        }
        // Read and cleared under the lock: a row is the clean release of
        // the holder just before this one. On an error the session (and
        // the lock) ends with `client`.
        // A record older than RELEASE_FRESH cannot be the release of the
        // holder just before: one that never cleared it (a binary of before
        // the record) held the lock in between.
        let previous_clean = client
            .query(
                "DELETE FROM exactly_releases WHERE pipeline = $1 \
                 RETURNING clock_timestamp() - released_at < $2::bigint * interval '1 millisecond'",
                &[&pipeline, &(RELEASE_FRESH.as_millis() as i64)],
            )
            .await
            .map_err(|e| failed("reading how the previous holder released the pipeline", e.into()))?
            .first()
            .is_some_and(|row| row.get::<_, Option<bool>>(0) == Some(true));
        let client = Arc::new(client);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (lost, on_loss) = tokio::sync::watch::channel(None);
        watch(client.clone(), target.call_timeout, stopped, lost);
        let release = Release {
            client: client.clone(),
            pipeline: pipeline.to_string(),
            holder: name.to_string(),
            key,
            location: location.to_string(),
            answer_within: target.call_timeout,
        };
        return Ok(StoreLock::losable(Held { client, stop }, on_loss).handing_over(release, previous_clean));
    }
    let holder = holder(&client, key)
        .await
        .unwrap_or_else(|| "another session (it ended a moment ago, or cannot be seen by this user)".into());
    *spare = Some(client);
    Err(StoreError::Locked {
        pipeline: pipeline.to_string(),
        dir: location.to_string(),
        holder,
    })
}

/// Records a clean release through the lock's own session, then lets the
/// lock go at once (rather than when the session ends).
struct Release {
    client: Arc<Client>,
    pipeline: String,
    holder: String,
    key: i64,
    location: String,
    answer_within: Duration,
}

#[async_trait::async_trait]
impl exactly_core::store::HandOver for Release {
    async fn record_clean_release(&self) -> Result<(), AccessError> {
        let operation = "recording the clean release of the pipeline's lock";
        let record = async {
            self.client
                .execute(
                    "INSERT INTO exactly_releases (pipeline, holder) VALUES ($1, $2) \
                     ON CONFLICT (pipeline) DO UPDATE SET holder = excluded.holder, released_at = clock_timestamp()",
                    &[&self.pipeline, &self.holder],
                )
                .await?;
            self.client.execute("SELECT pg_advisory_unlock($1)", &[&self.key]).await
        };
        match tokio::time::timeout(self.answer_within, record).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(AccessError::indeterminate(&self.location, operation, e)),
            Err(_) => Err(AccessError::indeterminate(
                &self.location,
                operation,
                format!("no answer within {:?}", self.answer_within),
            )),
        }
    }
}

/// The session holding the advisory lock of a key (`$1`, `$2`: its high and
/// low halves) in this database: its `application_name`, backend, client
/// address and since when.
pub(crate) const HOLDER: &str = "SELECT a.application_name, a.pid, coalesce(host(a.client_addr), 'local socket'), \
     a.backend_start::text FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1 \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// The parameters of [`HOLDER`] for `key`.
pub(crate) fn halves(key: &i64) -> (u32, u32) {
    ((*key >> 32) as u32, *key as u32)
}

/// A row of [`HOLDER`], for people.
pub(crate) fn describe(row: &tokio_postgres::Row) -> String {
    let (name, pid, from, since): (String, i32, String, String) = (row.get(0), row.get(1), row.get(2), row.get(3));
    format!("{name} (backend {pid} from {from}, since {since})")
}

/// Who holds the lock of `key` (see [`HOLDER`]); `None` when nobody does
/// (or the holder cannot be seen).
pub(crate) async fn holder(client: &Client, key: i64) -> Option<String> {
    let (high, low) = halves(&key);
    client
        .query_opt(HOLDER, &[&high, &low])
        .await
        .ok()
        .flatten()
        .map(|row| describe(&row))
}
