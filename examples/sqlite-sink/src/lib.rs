//! An example connector: a two-phase-commit sink into SQLite, for connector
//! authors to read beside `docs/connectors.md`.
//!
//! SQLite has no prepared transactions, so the sink builds its own from two
//! tables next to the output table `records(value)`:
//!
//! - `exactly_staged(txn, value)`: an interval's rows, written and made
//!   durable by `pre_commit` (one SQLite transaction, `synchronous = FULL`)
//!   under the transaction's name, invisible to readers of `records`;
//! - `exactly_committed(txn)`: one marker per committed transaction.
//!
//! `commit` moves a transaction's staged rows into `records`, deletes them
//! and writes its marker, all in one SQLite transaction: a marker means
//! committed, staged rows mean pre-committed, neither means lost
//! (`DataLoss`). `recover` commits what the checkpoint lists and deletes the
//! staged rows of every other transaction of the subtasks it owns
//! ([`exactly_core::plan_recovery`]). Names come from
//! [`exactly_core::TransactionNames`]: `exactly:<pipeline>:<subtask>:<checkpoint>`.
//!
//! [`Mode`] has three deliberately broken variants for the crash kit's own
//! tests, which must catch them.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use exactly_core::{
    erase, plan_recovery, CheckpointId, ConnectorError, ErasedSink, Record, SinkContext, SinkFactory, TransactionNames,
    TwoPhaseCommitSink,
};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};

/// How the sink behaves: correctly, or broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Two-phase commit as described above.
    Correct,
    /// Broken: commits at `pre_commit`, before the checkpoint is persisted
    /// (a replay after a crash duplicates).
    CommitAtPreCommit,
    /// Broken: `recover` aborts the listed transactions instead of
    /// committing them (their records are lost).
    AbortOnRecover,
    /// Broken: `recover` commits what is listed but never deletes the
    /// staged rows of unlisted transactions (the output is right; the
    /// staging table grows with every crash).
    LeakStaging,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "correct" => Ok(Mode::Correct),
            "commit-at-pre-commit" => Ok(Mode::CommitAtPreCommit),
            "abort-on-recover" => Ok(Mode::AbortOnRecover),
            "leak-staging" => Ok(Mode::LeakStaging),
            other => Err(format!(
                "unknown mode `{other}`: correct, commit-at-pre-commit, abort-on-recover or leak-staging"
            )),
        }
    }
}

/// Creates the SQLite sink of every subtask, writing into the database file
/// `path`.
#[derive(Debug)]
pub struct SqliteSinkFactory {
    /// The database file.
    pub path: PathBuf,
    /// Correct, or broken for the kit's tests.
    pub mode: Mode,
}

impl SinkFactory for SqliteSinkFactory {
    fn identity(&self) -> String {
        format!("sqlite:path={}", self.path.display())
    }

    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        Ok(erase(SqliteSink {
            path: self.path.clone(),
            mode: self.mode,
            names: TransactionNames::new(&[&context.pipeline], None),
            context,
            db: None,
        }))
    }
}

/// One interval's rows, held until `pre_commit`.
#[derive(Debug)]
pub struct Staging {
    txn: String,
    values: Vec<String>,
}

/// The committable: the transaction's name.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SqliteCommittable {
    /// `exactly:<pipeline>:<subtask>:<checkpoint>`.
    pub txn: String,
}

struct SqliteSink {
    path: PathBuf,
    mode: Mode,
    names: TransactionNames,
    context: SinkContext,
    db: Option<Arc<Mutex<Connection>>>,
}

fn sqlite_error(what: &str, e: rusqlite::Error) -> ConnectorError {
    // A busy database or an I/O error may pass: the pipeline restarts from
    // the last checkpoint.
    ConnectorError::transient(format!("SQLite sink: {what}"), e)
}

/// The lock file of `pipeline` beside the database `path`:
/// `<path>.exactly-<pipeline>.lock`.
pub fn instance_lock_file(path: &std::path::Path, pipeline: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".exactly-{pipeline}.lock"));
    PathBuf::from(name)
}

/// Opens the database with durable commits and creates the tables. Two
/// subtasks opening a new database at once may find it busy while the other
/// switches it to WAL (SQLite does not wait there): that is retried.
fn open(path: &std::path::Path) -> Result<Connection, rusqlite::Error> {
    let mut attempts = 0;
    loop {
        match try_open(path) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && attempts < 200 =>
            {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            result => return result,
        }
    }
}

fn try_open(path: &std::path::Path) -> Result<Connection, rusqlite::Error> {
    let db = Connection::open(path)?;
    db.busy_timeout(std::time::Duration::from_secs(10))?;
    db.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         CREATE TABLE IF NOT EXISTS records (value TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS exactly_staged (txn TEXT NOT NULL, value TEXT NOT NULL);
         CREATE INDEX IF NOT EXISTS exactly_staged_txn ON exactly_staged (txn);
         CREATE TABLE IF NOT EXISTS exactly_committed (txn TEXT PRIMARY KEY);",
    )?;
    Ok(db)
}

/// Commits `txn` (see the module docs); `Ok(false)` when it is neither
/// staged nor committed. Write transactions begin IMMEDIATE: a deferred one
/// that reads first cannot wait for another subtask's write to end.
fn commit_staged(db: &mut Connection, txn: &str) -> Result<bool, rusqlite::Error> {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let done: Option<i64> = tx
        .query_row("SELECT 1 FROM exactly_committed WHERE txn = ?1", [txn], |r| r.get(0))
        .optional()?;
    if done.is_some() {
        return Ok(true);
    }
    let moved = tx.execute(
        "INSERT INTO records (value) SELECT value FROM exactly_staged WHERE txn = ?1",
        [txn],
    )?;
    let staged: i64 = tx.query_row("SELECT count(*) FROM exactly_staged WHERE txn = ?1", [txn], |r| {
        r.get(0)
    })?;
    if moved == 0 && staged == 0 {
        // A pre-committed transaction always has rows (the runtime opens
        // none for an empty interval): nothing staged and no marker is loss.
        return Ok(false);
    }
    tx.execute("DELETE FROM exactly_staged WHERE txn = ?1", [txn])?;
    tx.execute("INSERT INTO exactly_committed (txn) VALUES (?1)", [txn])?;
    tx.commit()?;
    Ok(true)
}

impl SqliteSink {
    /// Runs `call` on the connection, on a blocking thread.
    async fn with_db<T: Send + 'static>(
        &mut self,
        what: &'static str,
        call: impl FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    ) -> Result<T, ConnectorError> {
        let db = match &self.db {
            Some(db) => db.clone(),
            None => {
                let path = self.path.clone();
                // One process per pipeline and database: recovery deletes
                // the staged rows of every transaction of the pipeline the
                // checkpoint does not list, so a second process (started
                // with another checkpoint folder) must be refused before it
                // touches the database.
                let pipeline = self.context.pipeline.clone();
                let lock = instance_lock_file(&path, &pipeline);
                let store = format!("the SQLite database {}", path.display());
                tokio::task::spawn_blocking(move || {
                    exactly_core::hold_instance_lock(&lock, &pipeline, &store, "another `path`")
                })
                .await
                .expect("lock task panicked")?;
                let db = tokio::task::spawn_blocking(move || open(&path))
                    .await
                    .expect("SQLite task panicked")
                    .map_err(|e| sqlite_error("opening the database", e))?;
                self.db.insert(Arc::new(Mutex::new(db))).clone()
            }
        };
        tokio::task::spawn_blocking(move || call(&mut db.lock().expect("SQLite connection poisoned")))
            .await
            .expect("SQLite task panicked")
            .map_err(|e| sqlite_error(what, e))
    }
}

#[async_trait]
impl TwoPhaseCommitSink for SqliteSink {
    type Transaction = Staging;
    type Committable = SqliteCommittable;

    /// Holds nothing of its own: its lock is the process's instance lock,
    /// which the runtime lets go after a clean stop.
    async fn close(&mut self) -> Result<exactly_core::Closed, ConnectorError> {
        Ok(exactly_core::Closed::Released)
    }

    async fn recover(&mut self, pending: &[SqliteCommittable]) -> Result<(), ConnectorError> {
        let names = self.names.clone();
        let owned: Vec<usize> = self.context.owned_subtasks().collect();
        let staged: Vec<String> = self
            .with_db("listing staged transactions", move |db| {
                let mut query = db.prepare("SELECT DISTINCT txn FROM exactly_staged")?;
                let txns = query.query_map([], |r| r.get::<_, String>(0))?;
                txns.collect::<Result<Vec<String>, _>>()
            })
            .await?
            .into_iter()
            .filter(|txn| names.parse(txn).is_some_and(|(subtask, _)| owned.contains(&subtask)))
            .collect();
        let mut plan = plan_recovery(pending, |c| c.txn.clone(), staged);
        if self.mode == Mode::AbortOnRecover {
            plan.abort.extend(plan.commit.drain(..).map(|c| c.txn.clone()));
        }
        for c in plan.commit {
            self.commit(c).await?;
        }
        let mut abort = plan.abort;
        if self.mode == Mode::LeakStaging {
            abort.clear();
        }
        let aborted = abort.len();
        self.with_db("deleting unlisted staged transactions", move |db| {
            for txn in &abort {
                db.execute("DELETE FROM exactly_staged WHERE txn = ?1", [txn])?;
            }
            Ok(())
        })
        .await?;
        tracing::info!(
            subtask = self.context.subtask,
            committed = pending.len(),
            aborted,
            "SQLite sink recovered"
        );
        Ok(())
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<Staging, ConnectorError> {
        Ok(Staging {
            txn: self.names.name(self.context.subtask, checkpoint),
            values: Vec::new(),
        })
    }

    async fn write(&mut self, txn: &mut Staging, batch: &[Record]) -> Result<(), ConnectorError> {
        for r in batch {
            // This table stores text; a null value (a tombstone) has no text
            // and must not become an empty string: refuse it, naming it.
            let Some(value) = &r.value else {
                return Err(ConnectorError::fatal(
                    "sqlite sink",
                    format!(
                        "record {}@{} has a null value, which this sink cannot store",
                        r.split, r.offset
                    ),
                ));
            };
            txn.values.push(String::from_utf8_lossy(value).into_owned());
        }
        Ok(())
    }

    async fn pre_commit(&mut self, txn: Staging) -> Result<SqliteCommittable, ConnectorError> {
        let committable = SqliteCommittable { txn: txn.txn.clone() };
        self.with_db("staging an interval", move |db| {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut insert = tx.prepare("INSERT INTO exactly_staged (txn, value) VALUES (?1, ?2)")?;
                for value in &txn.values {
                    insert.execute(params![txn.txn, value])?;
                }
            }
            tx.commit()
        })
        .await?;
        if self.mode == Mode::CommitAtPreCommit {
            self.commit(&committable).await?;
        }
        Ok(committable)
    }

    async fn commit(&mut self, c: &SqliteCommittable) -> Result<(), ConnectorError> {
        let txn = c.txn.clone();
        if self.with_db("committing", move |db| commit_staged(db, &txn)).await? {
            return Ok(());
        }
        Err(ConnectorError::DataLoss {
            context: "SQLite sink commit".into(),
            checkpoint: self.names.parse(&c.txn).map(|(_, id)| id).unwrap_or_default(),
            message: format!(
                "transaction {} is neither staged nor committed in {}: was the database replaced?",
                c.txn,
                self.path.display()
            ),
        })
    }

    async fn abort(&mut self, _txn: Staging) -> Result<(), ConnectorError> {
        // Nothing of an open transaction is in the database yet.
        Ok(())
    }
}

/// Every value in `records` of the database at `path`, duplicates included.
pub fn read_records(path: &std::path::Path) -> Result<Vec<String>, rusqlite::Error> {
    let db = Connection::open(path)?;
    let mut query = db.prepare("SELECT value FROM records")?;
    let values = query.query_map([], |r| r.get(0))?;
    values.collect()
}

/// The transactions whose rows are still staged in the database at `path`
/// (pre-committed, neither committed nor aborted): after a pipeline ended
/// cleanly there must be none (the crash kit's leftovers check).
pub fn staged_transactions(path: &std::path::Path) -> Result<Vec<String>, rusqlite::Error> {
    let db = Connection::open(path)?;
    let mut query = db.prepare("SELECT DISTINCT txn FROM exactly_staged ORDER BY txn")?;
    let txns = query.query_map([], |r| r.get(0))?;
    txns.collect()
}

/// The connector guide, whose compiled examples run as doc tests here.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/connectors.md")]
pub struct ConnectorsGuide;
