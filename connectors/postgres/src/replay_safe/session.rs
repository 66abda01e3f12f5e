//! The connection of a subtask in mode `upsert` or `fenced`: the subtask
//! locks, the checked tables, the prepared upsert, and writing rows and
//! dead letters.

use std::ops::Range;

use exactly_core::{ConnectorError, DeadLetter, WriteOutcome};
use tokio_postgres::{Client, Statement};

use crate::conn::batch::{copy_in, execute_columns};
use crate::conn::connect::{connect, LOCK_TIMEOUT};
use crate::conn::copy::CopyError;
use crate::conn::lock::{lock_subtasks, new_instance, SubtaskLock};
use crate::conn::reject::{copy_refusal, Isolation, Refusal};
use crate::conn::subtask::Subtask;
use crate::rows::{BadRecord, DeadLetters, Rows};
use crate::tables::{prepare_tables, Layout};

/// One connection of a subtask in mode `upsert` or `fenced`, with the
/// checked tables and the prepared upsert statement. Its session holds the
/// lock of every subtask the sink owns (see [`crate::conn::lock`]): these modes
/// must not run twice either (two upserting processes interleave older and
/// newer values of a key; the fence would make the second writer fail its
/// checkpoints one after the other).
pub(super) struct Session {
    pub subtask: Subtask,
    /// This sink among the sinks of the process.
    instance: u64,
    client: Option<Client>,
    /// The locks `client`'s session holds.
    locks: Vec<SubtaskLock>,
    layout: Option<Layout>,
    /// `layout.upsert`, prepared on `client`.
    upsert: Option<Statement>,
}

impl Session {
    pub(super) fn new(subtask: Subtask) -> Self {
        Session {
            subtask,
            instance: new_instance(),
            client: None,
            locks: Vec::new(),
            layout: None,
            upsert: None,
        }
    }

    /// A fresh connection (whatever the previous one had open is rolled back
    /// by the server) holding the subtask locks (taken before anything else;
    /// fatal when another process holds one), with a lock timeout, checked
    /// tables and prepared statements.
    pub(super) async fn open(&mut self) -> Result<(), ConnectorError> {
        self.close();
        let client = connect(&self.subtask.settings, &self.subtask.application_name()).await?;
        let owned: Vec<usize> = self.subtask.context.owned_subtasks().collect();
        self.locks = lock_subtasks(&client, &self.subtask, &owned, self.instance).await?;
        let set = client
            .batch_execute(&format!("SET lock_timeout = '{LOCK_TIMEOUT}'"))
            .await;
        set.map_err(|e| self.subtask.pg_error("configuring the session", e))?;
        let layout = prepare_tables(&client, &self.subtask.settings).await?;
        if let Some(sql) = &layout.upsert {
            let prepared = client.prepare(sql).await;
            self.upsert = Some(prepared.map_err(|e| self.subtask.pg_error("preparing the upsert", e))?);
        }
        self.layout = Some(layout);
        self.client = Some(client);
        Ok(())
    }

    /// Lets the subtask locks go at the server (`pg_advisory_unlock_all`)
    /// while the session lives on until the sink drops: a process taking
    /// the pipeline over takes them at once (see
    /// [`TwoPhaseCommitSink::close`](exactly_core::TwoPhaseCommitSink::close)).
    /// A connection already lost is an error: its session may hold the
    /// locks until the server notices.
    pub(super) async fn release(&mut self) -> Result<exactly_core::Closed, ConnectorError> {
        let released = match &self.client {
            None => Ok(exactly_core::Closed::Released),
            Some(client) if client.is_closed() => Err(self.subtask.lost_connection("releasing the subtask locks")),
            Some(client) => (client.batch_execute("SELECT pg_advisory_unlock_all()").await)
                .map(|()| exactly_core::Closed::Released)
                .map_err(|e| self.subtask.pg_error("releasing the subtask locks", e)),
        };
        self.locks.clear();
        released
    }

    /// Drops the connection; the server rolls back what it had open and
    /// releases its locks.
    pub(super) fn close(&mut self) {
        self.client = None;
        self.upsert = None;
        self.locks.clear();
    }

    pub(super) fn client(&self) -> Result<&Client, ConnectorError> {
        match &self.client {
            Some(client) if !client.is_closed() => Ok(client),
            Some(_) => Err(self.subtask.lost_connection("writing")),
            None => Err(self.subtask.not_opened("open()")),
        }
    }

    pub(super) fn layout(&self) -> Result<&Layout, ConnectorError> {
        self.layout.as_ref().ok_or_else(|| self.subtask.not_opened("open()"))
    }

    /// Writes converted rows: upserted with the prepared statement when there
    /// is an upsert key, else appended with binary COPY. With
    /// `on_rejected_row = "dead-letter"`, the rows the server refuses are
    /// found by writing parts again (see [`crate::conn::reject`]), each part
    /// a statement of its own or, `in_transaction`, in a savepoint of its
    /// own, and returned with the server's message; the others are written
    /// once. Otherwise a refusal is an error, as every failure is.
    pub(super) async fn write_rows<'a>(
        &self,
        rows: Rows<'a>,
        in_transaction: bool,
    ) -> Result<Vec<BadRecord<'a>>, ConnectorError> {
        let (client, layout) = (self.client()?, self.layout()?);
        if !layout.isolate_rejected {
            let written = self.send(client, rows).await;
            let written = written.map_err(|e| self.subtask.copy_error("writing rows", e))?;
            tracing::debug!(rows = written, "rows written");
            return Ok(Vec::new());
        }
        let Some(first) = self.try_part(&rows, 0..rows.len(), in_transaction).await? else {
            return Ok(Vec::new());
        };
        tracing::info!(rows = rows.len(), refusal = %first.message,
            "the server refused a row: writing the batch again in parts to find the refused ones");
        let mut isolation = Isolation::new(rows.len(), first);
        while let Some(part) = isolation.next() {
            let answer = self.try_part(&rows, part, in_transaction).await?;
            isolation.answer(answer);
        }
        Ok(isolation
            .refused()
            .into_iter()
            .map(|(i, refusal)| BadRecord {
                record: rows.source(i),
                error: refusal.message,
            })
            .collect())
    }

    /// Sends rows on `client`: the upsert statement, or a COPY.
    async fn send(&self, client: &Client, rows: Rows<'_>) -> Result<u64, CopyError> {
        match (&self.upsert, &self.layout) {
            (Some(statement), _) => Ok(execute_columns(client, statement, rows).await?),
            (None, Some(layout)) => copy_in(client, &layout.copy_rows, &layout.row_types, &rows).await,
            (None, None) => unreachable!("the callers checked the layout"),
        }
    }

    /// Writes rows `part` (in a savepoint when `in_transaction`): `None`
    /// when the server takes them, the refusal (and nothing of them
    /// written) when it refuses a row.
    async fn try_part(
        &self,
        rows: &Rows<'_>,
        part: Range<usize>,
        in_transaction: bool,
    ) -> Result<Option<Refusal>, ConnectorError> {
        let client = self.client()?;
        if in_transaction {
            let set = client.batch_execute("SAVEPOINT exactly_part").await;
            set.map_err(|e| self.subtask.pg_error("SAVEPOINT", e))?;
        }
        let refusal = match self.send(client, rows.slice(part)).await {
            Ok(_) => None,
            Err(error) => match copy_refusal(&error) {
                Some(refusal) => Some(refusal),
                None => return Err(self.subtask.copy_error("writing rows", error)),
            },
        };
        if in_transaction {
            let end = match refusal {
                Some(_) => "ROLLBACK TO SAVEPOINT exactly_part; RELEASE SAVEPOINT exactly_part",
                None => "RELEASE SAVEPOINT exactly_part",
            };
            let ended = client.batch_execute(end).await;
            ended.map_err(|e| self.subtask.pg_error("RELEASE SAVEPOINT", e))?;
        }
        Ok(refusal)
    }

    /// Writes dead-letter rows: `once` skips records the table already holds.
    pub(super) async fn write_dead_letters(&self, bad: &[BadRecord<'_>], once: bool) -> Result<(), ConnectorError> {
        if bad.is_empty() {
            return Ok(());
        }
        let (client, layout) = (self.client()?, self.layout()?);
        let dead_letters = DeadLetters {
            pipeline: &self.subtask.context.pipeline,
            table: &self.subtask.settings.table_label,
            null_values: layout.dead_letter_null_values,
        };
        // The adapters do not pass the checkpoint id: 0 (see DEAD_LETTER_COLUMNS).
        let rows = dead_letters.rows(bad, 0);
        let action = "writing dead letters";
        if once {
            execute_columns(client, layout.insert_dead_letters_once.as_str(), rows)
                .await
                .map_err(|e| self.subtask.pg_error(action, e))?;
        } else {
            copy_in(client, &layout.copy_dead_letters, &layout.dead_letter_types, &rows)
                .await
                .map_err(|e| self.subtask.copy_error(action, e))?;
        }
        Ok(())
    }

    /// The outcome the adapters log and count.
    pub(super) fn outcome(&self, applied: usize, skipped: usize, bad: &[BadRecord<'_>]) -> WriteOutcome {
        let table = &self.subtask.settings.dead_letters;
        WriteOutcome {
            applied,
            skipped,
            dead_letters: bad
                .iter()
                .map(|b| DeadLetter {
                    split: b.record.split.to_string(),
                    offset: b.record.offset,
                    reason: format!("{} (stored in {table})", b.error),
                })
                .collect(),
        }
    }
}
