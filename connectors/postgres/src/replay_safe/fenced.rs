//! Mode `fenced`: rows and the source positions they cover commit in one
//! local transaction per checkpoint interval; replays at or below the stored
//! positions are dropped.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use exactly_core::{ConnectorError, FencedSink, Record, WriteOutcome};

use super::session::Session;
use crate::conn::subtask::Subtask;
use crate::rows::{convert, BadRecord};
use crate::tables::{advance_positions_sql, read_positions_sql};

/// A subtask of mode `fenced`, driven by [`Fenced`](exactly_core::Fenced):
/// rows, dead letters and the source positions they cover commit together in
/// one local transaction.
///
/// ```text
/// open          fresh connection; read the positions of the scope (split → highest offset written)
/// write_fenced  drop records at or below their split's position; BEGIN if needed; COPY (or upsert)
///               the rest, dead letters too; advance the positions in memory
/// flush         compare-and-set the positions table to the advanced positions; COMMIT
/// ```
///
/// One transaction spans everything written between two checkpoints, and
/// `flush` (the checkpoint's pre-commit) commits it: one commit and one
/// positions update per checkpoint interval instead of per batch (fewer WAL
/// flushes, fewer dead versions of the positions rows), and readers see whole
/// intervals, as in mode `two-phase`. The costs: rows become visible at the
/// checkpoint, the transaction stays open for up to an interval (keep
/// `checkpoint.interval` well below the server's
/// `idle_in_transaction_session_timeout`, if set), and a crash loses the open
/// interval — which the source replays.
///
/// Exactly-once: a checkpoint completes only after every sink's `flush`
/// returned, so what a restored checkpoint covers is committed (in
/// at-least-once mode too); records the source replays after
/// a crash are either at or below the committed positions (dropped) or were in
/// a transaction that died with the process (written now, once). Positions
/// advance only on commit. The compare-and-set makes a second writer of the
/// same scope (a zombie process, or two runs of one pipeline) fail the
/// transaction instead of duplicating rows.
///
/// The scope is `<pipeline>/postgres:<table>`: the positions describe what
/// is in the table, so they survive changes of the column mapping. To load a
/// pipeline again from the start, delete its rows from the positions table
/// along with the table's rows.
pub struct PostgresFencedSink {
    session: Session,
    /// The scope read at open; the adapter passes the same one.
    scope: String,
    /// Committed positions: split → highest offset written.
    stored: HashMap<String, i64>,
    /// Positions the open transaction advances (ordered: locked in order).
    advanced: BTreeMap<String, i64>,
    /// A local transaction is open.
    in_transaction: bool,
    /// Why the open transaction was lost: no write until `open` runs again.
    failed: Option<String>,
}

impl std::fmt::Debug for PostgresFencedSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresFencedSink")
            .field("url", &self.session.subtask.settings.url)
            .field("table", &self.session.subtask.settings.table_label)
            .field("scope", &self.scope)
            .field("in_transaction", &self.in_transaction)
            .finish_non_exhaustive()
    }
}

impl PostgresFencedSink {
    pub(crate) fn new(subtask: Subtask, scope: String) -> Self {
        PostgresFencedSink {
            session: Session::new(subtask),
            scope,
            stored: HashMap::new(),
            advanced: BTreeMap::new(),
            in_transaction: false,
            failed: None,
        }
    }

    /// The fence scope of this sink's positions.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The committed position of `split`: the highest offset written (as read
    /// at open, then advanced by each commit).
    pub fn position(&self, split: &str) -> Option<i64> {
        self.stored.get(split).copied()
    }

    async fn load_positions(&mut self, scope: &str) -> Result<(), ConnectorError> {
        let sql = read_positions_sql(&self.session.subtask.settings.positions);
        let rows = self.session.client()?.query(&sql, &[&scope]).await;
        let rows = rows.map_err(|e| self.session.subtask.pg_error("reading the positions", e))?;
        self.stored = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        self.scope = scope.to_string();
        tracing::info!(scope, splits = self.stored.len(), "read the stored positions");
        Ok(())
    }

    /// After a lost transaction nothing may be written or committed: its
    /// records are gone and only a restart from the last checkpoint brings
    /// them back.
    fn check_not_failed(&self) -> Result<(), ConnectorError> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(ConnectorError::transient(
                self.session.subtask.label("writing"),
                format!(
                    "the transaction of this checkpoint interval was lost ({why}); the pipeline must restart from \
                     its last checkpoint"
                ),
            )),
        }
    }

    /// Forgets the open transaction: the connection is dropped, so the server
    /// rolls it back, and the sink refuses writes until it is opened again
    /// (the runtime restarts from the last checkpoint).
    fn fail(&mut self, error: &ConnectorError) {
        self.session.close();
        self.in_transaction = false;
        self.advanced.clear();
        self.failed = Some(error.to_string());
    }

    async fn write_in_transaction<'r>(
        &mut self,
        fresh: &[&'r Record],
    ) -> Result<(usize, Vec<BadRecord<'r>>), ConnectorError> {
        if !self.in_transaction {
            let begun = self.session.client()?.batch_execute("BEGIN").await;
            begun.map_err(|e| self.session.subtask.pg_error("BEGIN", e))?;
            self.in_transaction = true;
        }
        let (rows, mut bad) = convert(fresh.iter().copied(), &self.session.layout()?.shape);
        let mut applied = rows.len();
        if !rows.is_empty() {
            let refused = self.session.write_rows(rows, true).await?;
            applied -= refused.len();
            bad.extend(refused);
        }
        self.session.write_dead_letters(&bad, false).await?;
        Ok((applied, bad))
    }

    /// Compare-and-set of the advanced positions, then COMMIT.
    async fn commit(&self) -> Result<(), ConnectorError> {
        let subtask = &self.session.subtask;
        let client = self.session.client()?;
        let splits: Vec<&str> = self.advanced.keys().map(String::as_str).collect();
        let new: Vec<i64> = self.advanced.values().copied().collect();
        let old: Vec<Option<i64>> = splits.iter().map(|s| self.stored.get(*s).copied()).collect();
        let sql = advance_positions_sql(&subtask.settings.positions);
        let advanced = client.query_one(&sql, &[&self.scope, &splits, &new, &old]).await;
        let advanced: i64 = advanced
            .map_err(|e| subtask.pg_error("advancing the positions", e))?
            .get(0);
        if advanced != splits.len() as i64 {
            return Err(ConnectorError::transient(
                subtask.label("advancing the positions"),
                format!(
                    "the stored positions of scope {:?} in {} changed while this sink was writing: another \
                     process writes the same pipeline into the same table (a second `exactly run` of the pipeline, \
                     or one that has not stopped yet). The transaction was rolled back and the pipeline restarts \
                     from its last checkpoint. Fix: run one instance of each pipeline",
                    self.scope, subtask.settings.positions
                ),
            ));
        }
        let committed = client.batch_execute("COMMIT").await;
        committed.map_err(|e| subtask.pg_error("COMMIT", e))
    }
}

#[async_trait]
impl FencedSink for PostgresFencedSink {
    /// Connects (a fresh connection: whatever an earlier one had open is
    /// rolled back), creates the missing tables and checks them (no prepared
    /// transactions are needed), and reads the stored positions of the scope.
    async fn open(&mut self) -> Result<(), ConnectorError> {
        self.in_transaction = false;
        self.advanced.clear();
        self.failed = None;
        self.session.open().await?;
        let scope = self.scope.clone();
        self.load_positions(&scope).await
    }

    /// Lets the subtask locks go (see `Session::release`); the runtime calls
    /// it after the final flush, with no transaction open.
    async fn close(&mut self) -> Result<exactly_core::Closed, ConnectorError> {
        self.session.release().await
    }

    /// Drops the records at or below the position of their split (stored, or
    /// advanced by this transaction), writes the rest — rows, and dead letters
    /// for records that do not convert — into the open transaction, and
    /// advances the positions in memory.
    async fn write_fenced(&mut self, scope: &str, batch: &[Record]) -> Result<WriteOutcome, ConnectorError> {
        self.check_not_failed()?;
        if scope != self.scope {
            if self.in_transaction {
                return Err(ConnectorError::fatal(
                    self.session.subtask.label("writing"),
                    format!(
                        "the fence scope changed from {:?} to {scope:?} inside a transaction",
                        self.scope
                    ),
                ));
            }
            self.load_positions(scope).await?;
        }
        let mut fresh = Vec::with_capacity(batch.len());
        for record in batch {
            let split = record.split.as_str();
            let position = self.advanced.get(split).or(self.stored.get(split));
            if position.is_some_and(|p| record.offset <= *p) {
                continue;
            }
            match self.advanced.get_mut(split) {
                Some(advanced) => *advanced = record.offset,
                None => {
                    self.advanced.insert(split.to_string(), record.offset);
                }
            }
            fresh.push(record);
        }
        let skipped = batch.len() - fresh.len();
        if fresh.is_empty() {
            return Ok(WriteOutcome {
                skipped,
                ..WriteOutcome::default()
            });
        }
        match self.write_in_transaction(&fresh).await {
            Ok((applied, bad)) => Ok(self.session.outcome(applied, skipped, &bad)),
            Err(e) => {
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// Commits the open transaction with the advanced positions (nothing to do
    /// without one).
    async fn flush(&mut self) -> Result<(), ConnectorError> {
        self.check_not_failed()?;
        if !self.in_transaction {
            return Ok(());
        }
        if let Err(e) = self.commit().await {
            self.fail(&e);
            return Err(e);
        }
        self.in_transaction = false;
        self.stored.extend(std::mem::take(&mut self.advanced));
        Ok(())
    }
}
