//! The write connection of a two-phase sink subtask: the session that holds
//! the subtask locks, the open transaction, and the COPY of rows that stays
//! open across the writes of one transaction.
//!
//! ```text
//! lock ─► begin ─► stream rows ─► stream rows ─► … ─► finish COPY ─► marker + PREPARE TRANSACTION
//!                        └─ dead letters: finish COPY, COPY them, the next rows start a new COPY
//! ```
//!
//! With `on_rejected_row = "dead-letter"` every COPY of rows starts in a
//! savepoint (`exactly_rows`, released when the next one starts), and the
//! writer keeps the records whose rows the open COPY holds: when the server
//! refuses a row, finishing the COPY rolls back to the savepoint and hands
//! the records back, so the caller can write them again in parts (see
//! [`crate::conn::reject`]) without losing the transaction's other rows.
//!
//! A transaction belongs to the connection it began on (its `generation`):
//! when the connection is lost, a new one takes the locks again before
//! anything else, and the lost transaction's later writes and pre-commit
//! fail instead of running outside any transaction.

use std::future::Future;

use exactly_core::{CheckpointId, ConnectorError, Record};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use super::io_faults;
use crate::conn::batch::{copy_in, push_rows};
use crate::conn::connect::{connect, LOCK_TIMEOUT};
use crate::conn::copy::BinaryCopy;
use crate::conn::lock::{lock_subtasks, new_instance, SubtaskLock};
use crate::conn::reject::{copy_refusal, Refusal};
use crate::conn::subtask::Subtask;
use crate::rows::Rows;
use crate::sql::quote_literal;

/// How much record data (values and keys) one COPY of rows takes before it
/// is finished and the next write starts another. Finishing waits until
/// PostgreSQL has stored everything sent, so this bounds the backlog a
/// pre-commit has to wait for (about 40 ms of one backend's work for 100-byte
/// JSON rows), while rows stream without a round trip per batch in between.
pub(super) const COPY_SEGMENT_BYTES: usize = 512 * 1024;

/// The write connection and what is open on it.
pub(super) struct Writer {
    subtask: Subtask,
    /// This sink among the sinks of the process (see [`crate::conn::lock`]).
    instance: u64,
    /// The connection that holds the open write transaction and the locks.
    client: Option<Client>,
    /// The locks `client`'s session holds, one per owned subtask.
    locks: Vec<SubtaskLock>,
    /// `pg_backend_pid()` of `client`.
    pid: Option<i32>,
    /// Counts the write connections: a transaction belongs to the one it
    /// began on, and dies with it.
    generation: u64,
    /// A transaction is open on `client`.
    open: bool,
    /// The COPY of rows left open between the writes of one transaction, so
    /// rows stream to PostgreSQL while the next batch is converted; finished
    /// before any other statement on `client`. Dropping it unfinished makes
    /// the client send `CopyFail`, which fails the COPY (and so its
    /// transaction).
    copy: Option<BinaryCopy>,
    /// Bytes of record values and keys streamed into `copy` so far.
    copy_bytes: usize,
    /// Rows the server refuses are isolated: each COPY of rows starts in a
    /// savepoint and `retained` keeps its records.
    isolating: bool,
    /// The savepoint of the last COPY of rows is open.
    savepoint: bool,
    /// The records of the rows in `copy`, with their staging sequence
    /// numbers (when `isolating`).
    retained: Vec<(Record, i64)>,
}

/// How a COPY of rows ended.
#[derive(Debug)]
pub(super) enum Finished {
    /// The server stored its rows (or none was open).
    Stored,
    /// The server refused a row (only when isolating): the transaction is
    /// back at the savepoint before the COPY, and these are the records of
    /// its rows, with their staging sequence numbers.
    Refused {
        refusal: Refusal,
        records: Vec<(Record, i64)>,
    },
}

impl Writer {
    /// The writer of `subtask`; `isolating`: rows the server refuses are
    /// isolated (see the module documentation).
    pub(super) fn new(subtask: Subtask, isolating: bool) -> Self {
        Writer {
            isolating,
            savepoint: false,
            retained: Vec::new(),
            subtask,
            instance: new_instance(),
            client: None,
            locks: Vec::new(),
            pid: None,
            generation: 0,
            open: false,
            copy: None,
            copy_bytes: 0,
        }
    }

    /// The current write connection's number (see [`Writer::check`]).
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// A transaction is open.
    pub(super) fn is_open(&self) -> bool {
        self.open
    }

    /// The backend pid of the write connection.
    pub(super) fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// Makes sure the write connection is up and its session holds the lock
    /// of every subtask in `owned` (see [`crate::conn::lock`]): when the
    /// connection was lost (a server restart), a new one takes them again
    /// before anything else is written, prepared or committed, and a failure
    /// to take them is fatal. A transaction that was open on the lost
    /// connection is gone: its later writes and its pre-commit fail.
    pub(super) async fn lock(&mut self, owned: &[usize]) -> Result<(), ConnectorError> {
        let up = self.client.as_ref().is_some_and(|c| !c.is_closed());
        // A worker's subtask is guarded by its epoch fence instead (see
        // `fence`): a frozen earlier owner's session may hold the lock.
        let fenced = self.subtask.context.ownership.is_some();
        let owned = if fenced { &[][..] } else { owned };
        if up && self.locks.len() == owned.len() {
            return Ok(());
        }
        // A new session: the old one (and whatever it had open) is gone, and
        // it must not hold the locks while the new one asks for them.
        self.drop_copy();
        self.open = false;
        self.client = None;
        self.locks.clear();
        self.pid = None;
        self.generation += 1;
        let name = self.subtask.application_name();
        let client = connect(&self.subtask.settings, &name).await?;
        let pid = client.query_one("SELECT pg_backend_pid()", &[]).await;
        let pid: i32 = pid.map_err(|e| self.subtask.pg_error("connecting", e))?.get(0);
        self.locks = lock_subtasks(&client, &self.subtask, owned, self.instance).await?;
        tracing::debug!(subtasks = ?owned, backend = pid, "write connection holds the subtask locks");
        self.pid = Some(pid);
        self.client = Some(client);
        Ok(())
    }

    /// Also takes the locks of `subtasks` on the write connection (orphans
    /// found by `recover`).
    pub(super) async fn lock_more(&mut self, subtasks: &[usize]) -> Result<(), ConnectorError> {
        if self.subtask.context.ownership.is_some() {
            return Ok(());
        }
        let locks = lock_subtasks(self.client()?, &self.subtask, subtasks, self.instance).await?;
        self.locks.extend(locks);
        Ok(())
    }

    /// The write connection, if it is up.
    pub(super) fn client(&self) -> Result<&Client, ConnectorError> {
        match &self.client {
            Some(client) if !client.is_closed() => Ok(client),
            _ => Err(self.subtask.lost_connection("writing")),
        }
    }

    /// A transaction of connection `generation` can still go on: it is the
    /// current connection.
    pub(super) fn check(&self, generation: u64, action: &str) -> Result<(), ConnectorError> {
        if generation == self.generation {
            return Ok(());
        }
        Err(self.subtask.lost_connection(action))
    }

    /// Releases the subtask locks at the server (see
    /// [`TwoPhaseCommitSink::close`](exactly_core::TwoPhaseCommitSink::close));
    /// the session itself ends when the sink drops. A connection already
    /// lost is an error: its session may hold the locks until the server
    /// notices.
    pub(super) async fn close(&mut self) -> Result<(), ConnectorError> {
        self.discard_open().await;
        let released = match &self.client {
            None => Ok(()),
            Some(client) if client.is_closed() => Err(self.subtask.lost_connection("releasing the subtask locks")),
            Some(client) => (client.batch_execute("SELECT pg_advisory_unlock_all()").await)
                .map_err(|e| self.subtask.pg_error("releasing the subtask locks", e)),
        };
        self.locks.clear();
        released
    }

    /// Rolls back a transaction left open (the runtime aborts failed
    /// transactions, so this is only a safety net).
    pub(super) async fn discard_open(&mut self) {
        self.drop_copy();
        if !std::mem::take(&mut self.open) {
            return;
        }
        tracing::warn!("a transaction was still open: rolling it back");
        if let Some(client) = &self.client {
            let _ = client.batch_execute("ROLLBACK").await;
        }
    }

    /// Opens a transaction (`BEGIN`) on the write connection, which
    /// [`lock`](Self::lock) brought up. Inside it, lock waits end after
    /// [`LOCK_TIMEOUT`] and `statement_timeout` is off: the COPY of rows
    /// stays open across writes, up to a whole checkpoint interval when data
    /// is slow, and a server's or role's `statement_timeout` would cancel it
    /// every interval.
    pub(super) async fn begin(&mut self) -> Result<(), ConnectorError> {
        self.discard_open().await;
        let begun = self
            .client()?
            .batch_execute(&format!(
                "BEGIN; SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; SET LOCAL statement_timeout = 0"
            ))
            .await;
        begun.map_err(|e| self.subtask.pg_error("BEGIN", e))?;
        self.open = true;
        self.savepoint = false;
        Ok(())
    }

    /// Streams rows into the transaction's open COPY `statement` (columns of
    /// `types`), starting it if needed, and counts `bytes` of record data
    /// into the segment. Returns once the rows are handed to the
    /// connection; an error PostgreSQL finds in them surfaces when the COPY
    /// is finished.
    pub(super) async fn stream(
        &mut self,
        statement: &str,
        types: &[Type],
        rows: &Rows<'_>,
        bytes: usize,
    ) -> Result<(), ConnectorError> {
        if self.copy.is_none() {
            if self.isolating {
                let savepoint = if self.savepoint {
                    "RELEASE SAVEPOINT exactly_rows; SAVEPOINT exactly_rows"
                } else {
                    "SAVEPOINT exactly_rows"
                };
                let set = self.client()?.batch_execute(savepoint).await;
                set.map_err(|e| self.subtask.pg_error("SAVEPOINT", e))?;
                self.savepoint = true;
            }
            let copy = BinaryCopy::start(self.client()?, statement, types).await;
            self.copy = Some(copy.map_err(|e| self.subtask.copy_error("COPY of rows", e))?);
        }
        let copy = self.copy.as_mut().expect("started above");
        if let Err(e) = push_rows(copy, rows).await {
            self.drop_copy();
            return Err(self.subtask.copy_error("COPY of rows", e));
        }
        self.copy_bytes += bytes;
        Ok(())
    }

    /// Keeps the records of rows just streamed, with their staging sequence
    /// numbers, until the COPY ends (only when isolating).
    pub(super) fn retain(&mut self, records: impl IntoIterator<Item = (Record, i64)>) {
        if self.isolating {
            self.retained.extend(records);
        }
    }

    /// Record data streamed into the open COPY of rows.
    pub(super) fn copy_bytes(&self) -> usize {
        self.copy_bytes
    }

    /// The open COPY of rows, if any.
    pub(super) fn open_copy(&mut self) -> Option<&mut BinaryCopy> {
        self.copy.as_mut()
    }

    /// Drops the open COPY of rows, if any, which fails it (and with it the
    /// transaction, which must then be rolled back).
    fn drop_copy(&mut self) {
        self.copy = None;
        self.copy_bytes = 0;
        self.retained.clear();
    }

    /// Ends the open COPY of rows, if any, and waits for PostgreSQL's answer.
    /// When isolating, a refused row rolls the transaction back to the
    /// COPY's savepoint and is [`Finished::Refused`]; otherwise it is an
    /// error, as every other failure is.
    pub(super) async fn finish_copy(&mut self, checkpoint: CheckpointId) -> Result<Finished, ConnectorError> {
        self.copy_bytes = 0;
        let records = std::mem::take(&mut self.retained);
        let Some(copy) = self.copy.take() else {
            return Ok(Finished::Stored);
        };
        let error = match copy.finish().await {
            Ok(written) => {
                tracing::debug!(rows = written, %checkpoint, "rows written");
                return Ok(Finished::Stored);
            }
            Err(error) => error,
        };
        let Some(refusal) = copy_refusal(&error).filter(|_| self.isolating) else {
            return Err(self.subtask.copy_error("COPY of rows", error));
        };
        let back = self.client()?.batch_execute("ROLLBACK TO SAVEPOINT exactly_rows").await;
        back.map_err(|e| self.subtask.pg_error("ROLLBACK TO SAVEPOINT", e))?;
        tracing::info!(rows = records.len(), %checkpoint, refusal = %refusal.message,
            "the server refused a row of a COPY: writing its rows again in parts to find the refused ones");
        Ok(Finished::Refused { refusal, records })
    }

    /// Writes `rows` with `statement` (a COPY of columns of `types`) in a
    /// savepoint of their own: `Ok(None)` when the server takes them,
    /// `Ok(Some(refusal))` (and nothing of them written) when it refuses a
    /// row; any other failure is an error.
    pub(super) async fn try_rows(
        &mut self,
        statement: &str,
        types: &[Type],
        rows: &Rows<'_>,
    ) -> Result<Option<Refusal>, ConnectorError> {
        let client = self.client()?;
        let set = client.batch_execute("SAVEPOINT exactly_part").await;
        set.map_err(|e| self.subtask.pg_error("SAVEPOINT", e))?;
        let (end, refusal) = match copy_in(client, statement, types, rows).await {
            Ok(_) => ("RELEASE SAVEPOINT exactly_part", None),
            Err(error) => match copy_refusal(&error) {
                Some(refusal) => (
                    "ROLLBACK TO SAVEPOINT exactly_part; RELEASE SAVEPOINT exactly_part",
                    Some(refusal),
                ),
                None => return Err(self.subtask.copy_error("COPY of rows", error)),
            },
        };
        let ended = client.batch_execute(end).await;
        ended.map_err(|e| self.subtask.pg_error("RELEASE SAVEPOINT", e))?;
        Ok(refusal)
    }

    /// Ends the open COPY of rows, if any, where a refused row is an error
    /// (callers that isolate refused rows end the COPY first).
    async fn finish_unrefused(&mut self, checkpoint: CheckpointId) -> Result<(), ConnectorError> {
        match self.finish_copy(checkpoint).await? {
            Finished::Stored => Ok(()),
            Finished::Refused { refusal, .. } => Err(ConnectorError::fatal(
                self.subtask.label("COPY of rows"),
                format!(
                    "{} (a refused row was not isolated: a bug in exactly-postgres)",
                    refusal.message
                ),
            )),
        }
    }

    /// COPYs rows in one COPY that ends before this returns (the open COPY
    /// of rows is finished first): dead letters.
    pub(super) async fn copy_once(
        &mut self,
        checkpoint: CheckpointId,
        statement: &str,
        types: &[Type],
        rows: &Rows<'_>,
        what: &str,
    ) -> Result<u64, ConnectorError> {
        self.finish_unrefused(checkpoint).await?;
        let copied = copy_in(self.client()?, statement, types, rows).await;
        copied.map_err(|e| self.subtask.copy_error(what, e))
    }

    /// Ends the COPY of rows, writes the commit marker (`marker` with
    /// `params`) and runs `PREPARE TRANSACTION '<gid>'`, then checks that the
    /// transaction really is prepared. `between` runs after `PREPARE` was
    /// sent and before its answer is read when the crash point
    /// [`BEFORE_PREPARE_ANSWER`](io_faults::BEFORE_PREPARE_ANSWER) is planned.
    pub(super) async fn prepare(
        &mut self,
        checkpoint: CheckpointId,
        gid: &str,
        (marker, params): (&str, &[&(dyn ToSql + Sync)]),
        between: impl Future<Output = ()>,
    ) -> Result<(), ConnectorError> {
        self.finish_unrefused(checkpoint).await?;
        let client = self.client()?;
        if let Some(owned) = &self.subtask.context.ownership {
            // Refused: the transaction stays open; `begin` or `recover`
            // rolls it back.
            if !owned.acting.holds() {
                return Err(super::fence::past_deadline(&self.subtask));
            }
            super::fence::check(client, &self.subtask, owned.epoch.0).await?;
        }
        let result = async {
            client.execute(marker, params).await?;
            let prepare = format!("PREPARE TRANSACTION {}", quote_literal(gid));
            io_faults::after_sending(
                client.batch_execute(&prepare),
                io_faults::BEFORE_PREPARE_ANSWER,
                between,
            )
            .await?;
            client
                .query_one(
                    "SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1 AND database = current_database()",
                    &[&gid],
                )
                .await
        }
        .await;
        // Prepared: the connection has no transaction any more. Failed: the
        // transaction is aborted but still open, and the next `begin` (or
        // `recover`) rolls it back.
        self.open = result.is_err();
        let prepared: i64 = result
            .map_err(|e| self.subtask.pg_error("PREPARE TRANSACTION", e))?
            .get(0);
        if prepared != 1 {
            return Err(ConnectorError::transient(
                self.subtask.label("PREPARE TRANSACTION"),
                format!("transaction '{gid}' was rolled back instead of prepared (an earlier statement of it failed)"),
            ));
        }
        Ok(())
    }

    /// `ROLLBACK` of the open transaction of connection `generation`. A
    /// transaction of a lost connection, or a lost connection now, is
    /// success: the server rolled it back already.
    pub(super) async fn rollback(&mut self, generation: u64, gid: &str) -> Result<(), ConnectorError> {
        // An unfinished COPY is failed by dropping it; ROLLBACK follows.
        if generation != self.generation {
            // It died with its connection.
            return Ok(());
        }
        self.drop_copy();
        if !std::mem::take(&mut self.open) {
            return Ok(());
        }
        let Some(client) = self.client.as_ref().filter(|c| !c.is_closed()) else {
            return Ok(());
        };
        match client.batch_execute("ROLLBACK").await {
            Ok(()) => {
                tracing::debug!(gid, "rolled back");
                Ok(())
            }
            Err(e) if e.is_closed() => Ok(()),
            Err(e) => Err(self.subtask.pg_error("ROLLBACK", e)),
        }
    }
}
