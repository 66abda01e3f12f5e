//! One writer per pipeline, table and sink subtask: a session-level advisory
//! lock on the connection that writes.
//!
//! Two processes of one pipeline (a deploy that overlaps the old process, a
//! second `exactly run` with another checkpoint folder, two machines) would
//! use the same gids, roll back each other's prepared transactions at
//! recovery and write every record twice. The checkpoint folder's lock only
//! helps when both use the same folder; this lock lives in the database
//! itself. Every sink subtask takes `pg_try_advisory_lock(<key>)` for each
//! subtask it owns (its own and the ones it adopts, see
//! [`SinkContext::owned_subtasks`](exactly_core::SinkContext::owned_subtasks))
//! on its write connection before it touches anything, and holds it for as
//! long as that session lives. The key is 64 bits of SHA-256 over the pipeline
//! name, the table as configured and the subtask number; the lock belongs to
//! the database the sink connects to.
//!
//! - Held by a session of another process: a fatal error naming the holder
//!   (backend pid, client address, `application_name`, since when) and what
//!   to do. Nothing else happens on the server. A process killed a moment
//!   ago (a crash, a restart by a supervisor) leaves its session until the
//!   server notices the closed connection, so unless the holder's
//!   `application_name` names a process that runs on this machine, the
//!   lock is waited for up to [`FOREIGN_SESSION_GRACE`] first.
//! - Held by a session of this process (its `application_name`, see
//!   [`application_name`](super::connect::application_name), carries this process's id and a random tag): the
//!   session of a sink that was just dropped (an in-process restart), whose
//!   backend ends a moment later. It is waited for up to [`OWN_SESSION_GRACE`];
//!   a session still there after that belonged to a connection this process
//!   lost (the server has not noticed yet) and is ended with
//!   `pg_terminate_backend` — unless another live sink of this process holds
//!   the lock (the same pipeline run twice in one process), which is fatal.
//! - A holder that died leaves nothing behind: the server releases session
//!   locks when the session ends, however the process ended.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use exactly_core::ConnectorError;
use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::connect::application_name;
use super::subtask::Subtask;

/// How long a lock held by a session of this process is waited for before
/// that session is taken for lost and ended.
pub(crate) const OWN_SESSION_GRACE: Duration = Duration::from_secs(5);
/// How long a lock held by a session of another process is waited for
/// before the sink gives up: the session of a process that was just killed
/// ends once the server sees its connection closed.
pub(crate) const FOREIGN_SESSION_GRACE: Duration = Duration::from_secs(5);
/// Pause between two attempts while waiting.
const POLL: Duration = Duration::from_millis(50);

/// The advisory-lock key of `subtask` of `pipeline` writing `table`.
pub(crate) fn lock_key(pipeline: &str, table: &str, subtask: usize) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update(b"exactly sink subtask lock\0");
    hasher.update(pipeline.as_bytes());
    hasher.update([0u8]);
    hasher.update(table.as_bytes());
    hasher.update([0u8]);
    hasher.update((subtask as u64).to_be_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// Identifies one sink among the sinks of this process.
pub(crate) fn new_instance() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The locks this process holds: (server, key) → the sink holding it.
static HELD: Mutex<BTreeMap<(String, i64), u64>> = Mutex::new(BTreeMap::new());

fn held() -> std::sync::MutexGuard<'static, BTreeMap<(String, i64), u64>> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// A subtask lock held by a sink's session. The server releases it when the
/// session ends; dropping this only forgets, in this process, which sink
/// holds it.
#[derive(Debug)]
pub(crate) struct SubtaskLock {
    server: String,
    key: i64,
    instance: u64,
}

impl Drop for SubtaskLock {
    fn drop(&mut self) {
        let mut held = held();
        let slot = (std::mem::take(&mut self.server), self.key);
        if held.get(&slot) == Some(&self.instance) {
            held.remove(&slot);
        }
    }
}

/// Who holds a lock, as `pg_locks` and `pg_stat_activity` tell.
struct Holder {
    pid: i32,
    client: Option<String>,
    application_name: Option<String>,
    since: Option<String>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unknown = "not visible to this user";
        write!(
            f,
            "the PostgreSQL session of backend pid {}, client {}, application_name {}, connected since {}",
            self.pid,
            self.client
                .as_deref()
                .unwrap_or("local (Unix socket) or not visible to this user"),
            self.application_name
                .as_deref()
                .map_or_else(|| unknown.to_string(), |n| format!("{n:?}")),
            self.since.as_deref().unwrap_or(unknown),
        )
    }
}

/// Takes the lock of every subtask in `subtasks` on `client` (the write
/// connection of `sink`, whose sink instance is `instance`). On an error the
/// caller drops `client`, which releases what was taken.
pub(crate) async fn lock_subtasks(
    client: &Client,
    sink: &Subtask,
    subtasks: &[usize],
    instance: u64,
) -> Result<Vec<SubtaskLock>, ConnectorError> {
    let mut locks = Vec::with_capacity(subtasks.len());
    for &subtask in subtasks {
        locks.push(lock_subtask(client, sink, subtask, instance).await?);
    }
    Ok(locks)
}

async fn lock_subtask(
    client: &Client,
    sink: &Subtask,
    subtask: usize,
    instance: u64,
) -> Result<SubtaskLock, ConnectorError> {
    let action = "taking the pipeline's lock";
    let pipeline = &sink.context.pipeline;
    let key = lock_key(pipeline, &sink.settings.table_label, subtask);
    let ours = application_name(pipeline);
    let slot = (sink.settings.url.clone(), key);
    let mut waiting_since = Instant::now();
    let started = Instant::now();
    let mut ended: Option<i32> = None;
    let mut vanished = 0;
    loop {
        let taken = client.query_one("SELECT pg_try_advisory_lock($1)", &[&key]).await;
        if taken.map_err(|e| sink.pg_error(action, e))?.get::<_, bool>(0) {
            held().insert(slot.clone(), instance);
            tracing::debug!(subtask, key, "took the subtask lock");
            return Ok(SubtaskLock {
                server: slot.0,
                key,
                instance,
            });
        }
        let Some(holder) = holder(client, sink, key).await? else {
            // Released between the two statements: try again.
            vanished += 1;
            if vanished > 100 {
                return Err(ConnectorError::transient(
                    sink.label(action),
                    format!(
                        "the lock of pipeline {pipeline:?}, table {}, subtask {subtask} on {} is taken and released \
                         again and again by sessions this user cannot see",
                        sink.settings.table_label, sink.settings.url
                    ),
                ));
            }
            continue;
        };
        if holder.application_name.as_deref() != Some(ours.as_str()) {
            let alive_here = holder_process(&holder).and_then(runs_here) == Some(true);
            if !alive_here && started.elapsed() < FOREIGN_SESSION_GRACE {
                tokio::time::sleep(POLL).await;
                continue;
            }
            return Err(refused(sink, subtask, &holder));
        }
        if waiting_since.elapsed() < OWN_SESSION_GRACE {
            tokio::time::sleep(POLL).await;
            continue;
        }
        let other_sink = held().get(&slot).is_some_and(|holder| *holder != instance);
        if other_sink {
            return Err(ConnectorError::fatal(
                sink.label(action),
                format!(
                    "another sink of this process writes pipeline {pipeline:?} into table {} as subtask {subtask} \
                     ({holder}): the same pipeline runs twice in one process. Fix: run each pipeline once",
                    sink.settings.table_label
                ),
            ));
        }
        if ended == Some(holder.pid) {
            return Err(ConnectorError::fatal(
                sink.label(action),
                format!(
                    "the lock of pipeline {pipeline:?}, table {}, subtask {subtask} is still held by a lost \
                     session of this process ({holder}) after ending it with pg_terminate_backend. Fix: end it by \
                     hand (SELECT pg_terminate_backend({})) and start again",
                    sink.settings.table_label, holder.pid
                ),
            ));
        }
        tracing::warn!(%holder, subtask, "a lost session of this process still holds the subtask lock: ending it");
        let terminated = client
            .query_one("SELECT pg_terminate_backend($1)", &[&holder.pid])
            .await;
        terminated.map_err(|e| sink.pg_error("ending a lost session of this process", e))?;
        ended = Some(holder.pid);
        waiting_since = Instant::now();
    }
}

/// The process id in a holder's `application_name` (`exactly <pipeline>
/// pid=<pid>.<tag>`, see [`application_name`]), if it is one of a sink's.
fn holder_process(holder: &Holder) -> Option<u32> {
    let name = holder.application_name.as_deref()?;
    let (_, tag) = name.rsplit_once(" pid=")?;
    tag.split_once('.')?.0.parse().ok()
}

/// Whether process `pid` runs on this machine, when that can be told
/// (`/proc` on Linux). The holder may run on another machine with the same
/// process id; then its session is waited for in vain, and refused after
/// the grace as it would have been at once.
fn runs_here(pid: u32) -> Option<bool> {
    let proc = std::path::Path::new("/proc");
    if !proc.join("self").exists() {
        return None;
    }
    // `<pid> (<name>) <state> ...`; a zombie (Z) or dead (X) one has ended.
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok();
    let state = stat.and_then(|stat| stat.rsplit_once(") ")?.1.chars().next());
    Some(state.is_some_and(|state| !matches!(state, 'Z' | 'X')))
}

/// The session holding `key` in this database, if any.
async fn holder(client: &Client, sink: &Subtask, key: i64) -> Result<Option<Holder>, ConnectorError> {
    // A bigint key shows as classid (high half), objid (low half), objsubid 1.
    let row = client
        .query_opt(
            "SELECT l.pid, host(a.client_addr), a.application_name, \
             to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') \
             FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid IS NOT NULL \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.classid::bigint = ($1::bigint >> 32) & 4294967295 \
             AND l.objid::bigint = $1::bigint & 4294967295 \
             LIMIT 1",
            &[&key],
        )
        .await
        .map_err(|e| sink.pg_error("looking up who holds the pipeline's lock", e))?;
    Ok(row.map(|r| Holder {
        pid: r.get(0),
        client: r.get(1),
        application_name: r.get(2),
        since: r.get(3),
    }))
}

fn refused(sink: &Subtask, subtask: usize, holder: &Holder) -> ConnectorError {
    ConnectorError::fatal(
        sink.label("taking the pipeline's lock"),
        format!(
            "pipeline {pipeline:?} is already writing table {table} as sink subtask {subtask} on {url}: the lock \
             of that subtask is held by {holder}. Another process runs this pipeline (a second `exactly run`, \
             perhaps with another [checkpoint] dir or on another machine); two would roll back and duplicate each \
             other's transactions, so this one stops without touching anything. Fix: stop the other process \
             first, or run this pipeline under another name; if that process is gone but its session lingers (a \
             lost network connection), end the session with SELECT pg_terminate_backend({pid}) and start again",
            pipeline = sink.context.pipeline,
            table = sink.settings.table_label,
            url = sink.settings.url,
            pid = holder.pid,
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_pipeline_table_and_subtask() {
        let key = lock_key("orders", "public.orders", 0);
        assert_eq!(key, lock_key("orders", "public.orders", 0), "deterministic");
        for other in [
            lock_key("orders", "public.orders", 1),
            lock_key("orders2", "public.orders", 0),
            lock_key("orders", "public.orders2", 0),
            // The separator keeps the parts apart.
            lock_key("ordersp", "ublic.orders", 0),
        ] {
            assert_ne!(key, other);
        }
    }

    #[test]
    fn a_holder_names_its_process_and_this_machine_tells_whether_it_runs() {
        let holder = |name: &str| Holder {
            pid: 1,
            client: None,
            application_name: Some(name.to_string()),
            since: None,
        };
        let ours = application_name("orders to pg");
        assert_eq!(holder_process(&holder(&ours)), Some(std::process::id()));
        assert_eq!(holder_process(&holder("psql")), None);
        if std::path::Path::new("/proc/self").exists() {
            assert_eq!(runs_here(std::process::id()), Some(true));
            assert_eq!(runs_here(u32::MAX), Some(false));
        }
    }

    #[test]
    fn a_dropped_lock_forgets_only_its_own_holder() {
        let slot = ("postgres://test/db".to_string(), 42);
        let first = SubtaskLock {
            server: slot.0.clone(),
            key: 42,
            instance: 1,
        };
        held().insert(slot.clone(), 1);
        // Another sink took over the slot (after the first one's session ended).
        held().insert(slot.clone(), 2);
        drop(first);
        assert_eq!(
            held().get(&slot),
            Some(&2),
            "the first sink's drop leaves the second's entry"
        );
        let second = SubtaskLock {
            server: slot.0.clone(),
            key: 42,
            instance: 2,
        };
        drop(second);
        assert_eq!(held().get(&slot), None);
    }
}
