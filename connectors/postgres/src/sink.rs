//! The sink subtask: one PostgreSQL transaction per checkpoint.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use exactly_core::{CheckpointId, ConnectorError, Record, ReplayCheck, SinkContext, TwoPhaseCommitSink};
use serde::{Deserialize, Serialize};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::config::{Settings, SinkMode};
use crate::convert::Cell;
use crate::copy::BinaryCopy;
use crate::error::classify;
use crate::gid::{gid, gid_prefix};
use crate::io_faults;
use crate::lock::{lock_subtasks, new_instance, SubtaskLock};
use crate::markers::MarkerFloor;
use crate::schema::{prepare_tables, Layout};
use crate::sql::quote_literal;
use crate::write::{connect, convert, copy_in, push_rows, Rows, Subtask};

/// How long a write waits for a row or table lock before the checkpoint
/// fails (instead of waiting forever behind a lock the sink itself must
/// release later).
pub(crate) const LOCK_TIMEOUT: &str = "60s";

/// One subtask of the PostgreSQL sink. Created by
/// [`PostgresSinkFactory`](crate::PostgresSinkFactory); see the crate
/// documentation for the protocol.
pub struct PostgresSink {
    pub(crate) subtask: Subtask,
    /// Prefix of every gid of this subtask.
    prefix: String,
    /// This sink among the sinks of the process (see [`crate::lock`]).
    instance: u64,
    /// The subtasks whose transactions this sink owns and whose locks its
    /// write connection holds: its own, the adopted ones, and orphaned ones
    /// found by `recover`.
    pub(crate) owned: Vec<usize>,
    /// The connection that holds the open write transaction and the locks.
    writer: Option<Client>,
    /// The locks `writer`'s session holds, one per subtask in `owned`.
    writer_locks: Vec<SubtaskLock>,
    /// `pg_backend_pid()` of `writer`.
    writer_pid: Option<i32>,
    /// Counts the write connections: a transaction belongs to the one it
    /// began on, and dies with it.
    writer_generation: u64,
    /// The connection for `COMMIT PREPARED`, recovery and table checks.
    committer: Option<Client>,
    /// Set by `recover`.
    pub(crate) layout: Option<Arc<Layout>>,
    /// A transaction is open on `writer`.
    open: bool,
    /// The COPY of rows left open on `writer` between the writes of one
    /// transaction, so rows stream to PostgreSQL while the next batch is
    /// converted; finished before any other statement on `writer`.
    /// The open COPY of rows. Dropping it unfinished makes the client send
    /// `CopyFail`, which fails the COPY (and so its transaction).
    copy: Option<BinaryCopy>,
    /// Bytes of record values and keys streamed into `copy` so far.
    copy_bytes: usize,
    /// When this sink last deleted its old commit markers.
    last_prune: Option<Instant>,
    /// Which commit markers may be deleted (see [`crate::markers`]).
    pub(crate) markers: MarkerFloor,
}

/// How often a sink deletes its commit markers older than
/// `commit_log_retention` (or every retention, when that is shorter).
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// How much record data (values and keys) one COPY of rows takes before it
/// is finished and the next write starts another. Finishing waits until
/// PostgreSQL has stored everything sent, so this bounds the backlog a
/// pre-commit has to wait for (about 40 ms of one backend's work for 100-byte
/// JSON rows), while rows stream without a round trip per batch in between.
const COPY_SEGMENT_BYTES: usize = 512 * 1024;

impl std::fmt::Debug for PostgresSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSink")
            .field("url", &self.subtask.settings.url)
            .field("table", &self.subtask.settings.table_label)
            .field("prefix", &self.prefix)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

/// An open write transaction: the interval that ends with `checkpoint`.
#[derive(Debug)]
pub struct PostgresTransaction {
    checkpoint: CheckpointId,
    gid: String,
    /// Next staging sequence number (upsert mode: the last row per key wins).
    next_seq: i64,
    /// The write connection it is open on (see `writer_generation`).
    generation: u64,
    /// Records a replay of it would write a second time (rows and dead
    /// letters; with an upsert key, whose rows merge, the dead letters),
    /// kept on its commit marker: the duplicates of a fallback past it.
    records: i64,
}

impl PostgresTransaction {
    /// The checkpoint whose interval this transaction holds.
    pub fn checkpoint(&self) -> CheckpointId {
        self.checkpoint
    }

    /// The gid it will be prepared under.
    pub fn gid(&self) -> &str {
        &self.gid
    }
}

/// A prepared transaction: enough to commit it from any process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostgresCommittable {
    /// The `PREPARE TRANSACTION` identifier.
    pub gid: String,
    /// The checkpoint whose interval it holds.
    pub checkpoint: CheckpointId,
    /// The sink subtask that wrote it.
    pub subtask: usize,
}

impl PostgresSink {
    pub(crate) fn new(settings: Arc<Settings>, context: SinkContext) -> Self {
        let prefix = gid_prefix(&context.pipeline, &settings.table_label, context.subtask);
        let owned = context.owned_subtasks().collect();
        PostgresSink {
            subtask: Subtask { settings, context },
            prefix,
            instance: new_instance(),
            owned,
            writer: None,
            writer_locks: Vec::new(),
            writer_pid: None,
            writer_generation: 0,
            committer: None,
            layout: None,
            open: false,
            copy: None,
            copy_bytes: 0,
            last_prune: None,
            markers: MarkerFloor::default(),
        }
    }

    /// The prefix shared by the gids of this subtask's transactions
    /// (`exactly:<pipeline>:<table>:<subtask>:`).
    pub fn gid_prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.subtask.settings
    }

    pub(crate) fn context(&self, action: &str) -> String {
        self.subtask.label(action)
    }

    pub(crate) fn pg_error(&self, action: &str, e: &tokio_postgres::Error) -> ConnectorError {
        self.subtask.pg_error(action, e)
    }

    /// (Re)connects the commit connection if needed.
    pub(crate) async fn connect_committer(&mut self) -> Result<(), ConnectorError> {
        if self.committer.as_ref().is_none_or(Client::is_closed) {
            let name = self.subtask.application_name();
            self.committer = Some(connect(self.settings(), &name).await?);
        }
        Ok(())
    }

    /// The commit connection, if it is up.
    pub(crate) fn committer_if_up(&self) -> Option<&Client> {
        self.committer.as_ref().filter(|c| !c.is_closed())
    }

    /// The open COPY of rows, if any.
    pub(crate) fn open_copy(&mut self) -> Option<&mut BinaryCopy> {
        self.copy.as_mut()
    }

    /// The backend pid of the write connection.
    pub(crate) fn writer_pid(&self) -> Option<i32> {
        self.writer_pid
    }

    /// The commit connection; call [`connect_committer`](Self::connect_committer) first.
    pub(crate) fn committer(&self) -> &Client {
        self.committer.as_ref().expect("connect_committer() ran")
    }

    /// Makes sure the write connection is up and its session holds the lock
    /// of every owned subtask (see [`crate::lock`]): when the connection was
    /// lost (a server restart), a new one takes them again before anything
    /// else is written, prepared or committed, and a failure to take them is
    /// fatal. A transaction that was open on the lost connection is gone:
    /// its later writes and its pre-commit fail.
    pub(crate) async fn lock_writer(&mut self) -> Result<(), ConnectorError> {
        let up = self.writer.as_ref().is_some_and(|c| !c.is_closed());
        if up && self.writer_locks.len() == self.owned.len() {
            return Ok(());
        }
        // A new session: the old one (and whatever it had open) is gone, and
        // it must not hold the locks while the new one asks for them.
        self.drop_copy();
        self.open = false;
        self.writer = None;
        self.writer_locks.clear();
        self.writer_pid = None;
        self.writer_generation += 1;
        let name = self.subtask.application_name();
        let client = connect(self.settings(), &name).await?;
        let pid = client.query_one("SELECT pg_backend_pid()", &[]).await;
        let pid: i32 = pid.map_err(|e| self.pg_error("connecting", &e))?.get(0);
        self.writer_locks = lock_subtasks(&client, &self.subtask, &self.owned, self.instance).await?;
        tracing::debug!(subtasks = ?self.owned, backend = pid, "write connection holds the subtask locks");
        self.writer_pid = Some(pid);
        self.writer = Some(client);
        Ok(())
    }

    /// Also takes the locks of `subtasks` on the write connection and owns
    /// them from now on (orphans found by `recover`).
    pub(crate) async fn lock_more(&mut self, subtasks: &[usize]) -> Result<(), ConnectorError> {
        let writer = self.writer()?;
        let locks = lock_subtasks(writer, &self.subtask, subtasks, self.instance).await?;
        self.writer_locks.extend(locks);
        self.owned.extend_from_slice(subtasks);
        Ok(())
    }

    /// A transaction's write connection is still the current one.
    fn check_transaction(&self, txn: &PostgresTransaction, action: &str) -> Result<(), ConnectorError> {
        if txn.generation == self.writer_generation {
            return Ok(());
        }
        Err(self.subtask.lost_connection(action))
    }

    /// Rolls back a transaction left open on the write connection (the
    /// runtime aborts failed transactions, so this is only a safety net).
    async fn discard_open(&mut self) {
        self.drop_copy();
        if !std::mem::take(&mut self.open) {
            return;
        }
        tracing::warn!("a transaction was still open: rolling it back");
        if let Some(writer) = &self.writer {
            let _ = writer.batch_execute("ROLLBACK").await;
        }
    }

    /// The write connection of the open transaction.
    pub(crate) fn writer(&self) -> Result<&Client, ConnectorError> {
        match &self.writer {
            Some(client) if !client.is_closed() => Ok(client),
            _ => Err(self.subtask.lost_connection("writing")),
        }
    }

    pub(crate) fn layout(&self) -> Result<Arc<Layout>, ConnectorError> {
        self.layout.clone().ok_or_else(|| self.subtask.not_opened("recover()"))
    }

    /// Checks that the server can prepare transactions at all.
    pub(crate) async fn check_prepared_transactions(&mut self) -> Result<(), ConnectorError> {
        self.connect_committer().await?;
        let url = &self.subtask.settings.url;
        let rows = self
            .committer()
            .simple_query("SHOW max_prepared_transactions")
            .await
            .map_err(|e| classify("postgres sink: reading server settings", url, &e))?;
        let value = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        });
        match value.as_deref().map(str::parse::<u64>) {
            Some(Ok(n)) if n > 0 => Ok(()),
            Some(Ok(_)) => Err(ConnectorError::fatal(
                "postgres sink: checking server settings",
                format!(
                    "PostgreSQL at {url} has max_prepared_transactions = 0, which disables PREPARE TRANSACTION: the \
                     exactly-once sink cannot work. Fix: set max_prepared_transactions = 64 in postgresql.conf (or run \
                     ALTER SYSTEM SET max_prepared_transactions = 64) and restart the server; it must be at least the \
                     number of sink subtasks times the checkpoints that can wait for their commit"
                ),
            )),
            _ => Err(ConnectorError::fatal(
                "postgres sink: checking server settings",
                format!("PostgreSQL at {url} returned no usable max_prepared_transactions ({value:?})"),
            )),
        }
    }

    /// Upsert mode: moves the committed rows of `gid` from the staging table
    /// into the target. Idempotent.
    pub(crate) async fn merge(&mut self, gid: &str) -> Result<(), ConnectorError> {
        let Some(merge) = self.layout.as_ref().and_then(|l| l.merge.clone()) else {
            return Ok(());
        };
        self.connect_committer().await?;
        let result = self.committer().execute(&merge, &[&gid]).await;
        let rows = result.map_err(|e| self.pg_error("merging staged rows into the table", &e))?;
        tracing::debug!(gid, rows, "merged staged rows");
        Ok(())
    }

    /// COPYs rows in binary format through the write connection, in one
    /// COPY that ends before this returns.
    async fn copy(&self, sql: &str, types: &[Type], rows: &Rows<'_>, what: &str) -> Result<u64, ConnectorError> {
        let result = copy_in(self.writer()?, sql, types, rows).await;
        result.map_err(|e| self.subtask.copy_error(what, &e))
    }

    /// Streams rows into the transaction's open COPY of rows, starting it
    /// if needed. Returns once the rows are handed to the connection; an
    /// error PostgreSQL finds in them surfaces when the COPY is finished.
    async fn stream_rows(&mut self, layout: &Layout, rows: &Rows<'_>) -> Result<(), ConnectorError> {
        if self.copy.is_none() {
            let copy = BinaryCopy::start(self.writer()?, &layout.copy_rows, &layout.row_types).await;
            self.copy = Some(copy.map_err(|e| self.subtask.copy_error("COPY of rows", &e))?);
        }
        let copy = self.copy.as_mut().expect("started above");
        push_rows(copy, rows).await.map_err(|e| {
            self.drop_copy();
            self.subtask.copy_error("COPY of rows", &e)
        })
    }

    /// Drops the open COPY of rows, if any, which fails it (and with it the
    /// transaction, which must then be rolled back).
    fn drop_copy(&mut self) {
        self.copy = None;
        self.copy_bytes = 0;
    }

    /// Ends the open COPY of rows, if any, and waits for PostgreSQL's answer.
    async fn finish_copy(&mut self, checkpoint: CheckpointId) -> Result<(), ConnectorError> {
        self.copy_bytes = 0;
        let Some(copy) = self.copy.take() else {
            return Ok(());
        };
        let written = copy
            .finish()
            .await
            .map_err(|e| self.subtask.copy_error("COPY of rows", &e))?;
        tracing::debug!(rows = written, %checkpoint, "rows written");
        Ok(())
    }

    /// `COMMIT PREPARED`, or, when the gid is no longer prepared, success if
    /// its marker says it was committed.
    async fn commit_prepared(&mut self, c: &PostgresCommittable) -> Result<(), ConnectorError> {
        self.connect_committer().await?;
        let (url, log) = (&self.subtask.settings.url, &self.subtask.settings.commit_log);
        let client = self.committer();
        let committed = client
            .batch_execute(&format!("COMMIT PREPARED {}", quote_literal(&c.gid)))
            .await;
        let error = match committed {
            Ok(()) => None,
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => Some(e),
            Err(e) => return Err(self.pg_error("COMMIT PREPARED", &e)),
        };
        if let Some(error) = &error {
            tracing::debug!(gid = %c.gid, %error, "not prepared; looking for its commit marker");
        }
        // The marker's commit time, which retention counts from (each commit
        // of the same gid renews it); no marker after a gid-not-found means
        // the transaction is gone.
        let marker = client
            .query_opt(
                &format!(
                    "UPDATE {} SET committed_at = now() WHERE gid = $1 RETURNING 1",
                    log.sql()
                ),
                &[&c.gid],
            )
            .await
            .map_err(|e| self.pg_error("stamping the commit marker", &e))?;
        if error.is_none() || marker.is_some() {
            let how = if error.is_none() {
                "committed prepared transaction"
            } else {
                "already committed"
            };
            tracing::debug!(gid = %c.gid, checkpoint = %c.checkpoint, "{how}");
            return Ok(());
        }
        Err(ConnectorError::DataLoss {
            context: self.context("commit"),
            checkpoint: c.checkpoint,
            message: format!(
                "prepared transaction '{}' (checkpoint {}) does not exist on {url} and its marker is not in {log}: \
                 it was rolled back outside the pipeline (ROLLBACK PREPARED, a restored backup, or a different \
                 database in sink.postgres.url), and its records were not written; or the checkpoint being \
                 committed is older than sink.postgres.commit_log_retention, whose markers are deleted, and it was \
                 committed long ago",
                c.gid, c.checkpoint
            ),
        })
    }

    /// `COMMIT PREPARED` (see [`commit_prepared`](Self::commit_prepared)),
    /// then the merge of staged rows in upsert mode.
    pub(crate) async fn commit_and_merge(&mut self, c: &PostgresCommittable) -> Result<(), ConnectorError> {
        self.commit_prepared(c).await?;
        self.merge(&c.gid).await
    }

    /// Deletes the commit markers of the owned subtasks that are older than
    /// `commit_log_retention` (counted from their commit) and that no
    /// checkpoint the pipeline may restore lists any more: those at or below
    /// the floor of [`MarkerFloor`] (see [`crate::markers`] for the rule and
    /// why it is safe). At most every [`PRUNE_EVERY`] (or every retention,
    /// when that is shorter); only after a commit, never during recovery.
    /// Rows another transaction holds are skipped. Best effort: a failure is
    /// logged and tried again at a later commit.
    async fn prune_markers(&mut self) {
        let restorable = self.subtask.context.restorable.oldest().map(|c| c.0);
        let Some(floor) = self.markers.floor(restorable) else {
            return;
        };
        let retention = self.settings().commit_log_retention;
        if self
            .last_prune
            .is_some_and(|at| at.elapsed() < retention.min(PRUNE_EVERY))
        {
            return;
        }
        self.last_prune = Some(Instant::now());
        let log = self.settings().commit_log.sql();
        let sql = format!(
            "DELETE FROM {log} WHERE gid IN (SELECT gid FROM {log} WHERE pipeline = $1 AND sink_table = $2 \
             AND subtask = ANY($3) AND checkpoint <= $4 \
             AND coalesce(committed_at, prepared_at) < now() - make_interval(secs => $5) FOR UPDATE SKIP LOCKED)"
        );
        let floor = i64::try_from(floor).unwrap_or(i64::MAX);
        let pruned = self
            .committer()
            .execute(
                &sql,
                &[
                    &self.subtask.context.pipeline,
                    &self.subtask.settings.table_label,
                    &self.owned_i32(),
                    &floor,
                    &retention.as_secs_f64(),
                ],
            )
            .await;
        match pruned {
            Ok(0) => {}
            Ok(deleted) => tracing::debug!(
                deleted,
                floor,
                "deleted commit markers older than commit_log_retention that no restorable checkpoint lists"
            ),
            Err(error) => {
                tracing::warn!(%error, "deleting old commit markers failed; trying again after a later commit")
            }
        }
    }
}

fn checkpoint_i64(checkpoint: CheckpointId) -> i64 {
    i64::try_from(checkpoint.0).unwrap_or(i64::MAX)
}

#[async_trait]
impl TwoPhaseCommitSink for PostgresSink {
    type Transaction = PostgresTransaction;
    type Committable = PostgresCommittable;

    /// Connects and takes the lock of every owned subtask on the write
    /// connection (a fatal error naming the holder when another process has
    /// one, see [`crate::lock`]), checks `max_prepared_transactions`, creates
    /// the commit-log and dead-letter tables (and the target with
    /// `create_table`, and the staging table in upsert mode) when absent,
    /// checks every table against the configuration, then rolls back the
    /// prepared transactions of the owned subtasks (its own, adopted ones and
    /// orphans above the parallelism, see [`crate::recover`]) that `pending`
    /// does not list and commits the listed ones (oldest first, as
    /// [`commit`](Self::commit) does). Idempotent.
    async fn recover(&mut self, pending: &[PostgresCommittable]) -> Result<(), ConnectorError> {
        if self.settings().mode != SinkMode::TwoPhase {
            return Err(ConnectorError::fatal(
                self.context("recover"),
                format!(
                    "PostgresSink is the sink of mode \"two-phase\", but the mode is \"{}\": create the sink with \
                     PostgresSinkFactory::create, which picks the mode's sink",
                    self.settings().mode.as_str()
                ),
            ));
        }
        self.discard_open().await;
        // Before anything else: the locks, so that a second process of this
        // pipeline touches nothing of the first one's.
        self.lock_writer().await?;
        self.check_prepared_transactions().await?;
        self.connect_committer().await?;
        let layout = prepare_tables(self.committer(), &self.subtask.settings).await?;
        self.layout = Some(Arc::new(layout));
        self.recover_owned(pending).await
    }

    /// Opens the transaction (`BEGIN`) on the write connection, reconnecting
    /// (and taking the subtask locks again) if it was lost. Inside it, lock
    /// waits end after [`LOCK_TIMEOUT`] and
    /// `statement_timeout` is off: the COPY of rows stays open across writes,
    /// up to a whole checkpoint interval when data is slow, and a server's or
    /// role's `statement_timeout` would cancel it every interval.
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<PostgresTransaction, ConnectorError> {
        self.layout()?;
        self.discard_open().await;
        self.lock_writer().await?;
        let result = self
            .writer()?
            .batch_execute(&format!(
                "BEGIN; SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; SET LOCAL statement_timeout = 0"
            ))
            .await;
        result.map_err(|e| self.pg_error("BEGIN", &e))?;
        self.open = true;
        self.markers.began(checkpoint.0);
        Ok(PostgresTransaction {
            checkpoint,
            gid: gid(&self.prefix, checkpoint.0),
            next_seq: 0,
            generation: self.writer_generation,
            records: 0,
        })
    }

    /// Converts every record first; good rows stream into the
    /// transaction's COPY into the table (append) or the staging table
    /// (upsert), which stays open across writes and ends at pre-commit;
    /// bad ones go into the dead-letter table with the reason (ending the
    /// open COPY first), all inside the transaction. Dead letters are
    /// counted in the pipeline metrics.
    async fn write(&mut self, txn: &mut PostgresTransaction, batch: &[Record]) -> Result<(), ConnectorError> {
        self.check_transaction(txn, "writing")?;
        let layout = self.layout()?;
        let (mut rows, dead) = convert(batch, &layout.columns);
        // What a replay would write a second time: every record, or with an
        // upsert key (rows merge by key) only the dead letters.
        let rewritten = if layout.merge.is_some() {
            dead.len()
        } else {
            batch.len()
        };
        txn.records += i64::try_from(rewritten).unwrap_or(i64::MAX);
        if layout.merge.is_some() {
            rows = rows.prefixed(|| {
                txn.next_seq += 1;
                [Cell::Text(txn.gid.as_str().into()), Cell::BigInt(txn.next_seq - 1)]
            });
        }
        if !rows.is_empty() {
            self.stream_rows(&layout, &rows).await?;
            self.copy_bytes += batch
                .iter()
                .map(|r| r.value.len() + r.key.as_ref().map_or(0, |k| k.len()))
                .sum::<usize>();
            if self.copy_bytes >= COPY_SEGMENT_BYTES {
                self.finish_copy(txn.checkpoint).await?;
            } else if self.copy_bytes >= io_faults::MID_COPY_BYTES {
                self.mid_copy_point().await;
            }
        }
        if !dead.is_empty() {
            self.finish_copy(txn.checkpoint).await?;
            let checkpoint = checkpoint_i64(txn.checkpoint);
            let dead_rows: Rows<'_> = dead
                .iter()
                .map(|d| self.subtask.dead_letter_row(d, checkpoint))
                .collect();
            self.copy(
                &layout.copy_dead_letters,
                &layout.dead_letter_types,
                &dead_rows,
                "COPY of dead letters",
            )
            .await?;
            for d in &dead {
                tracing::warn!(split = %d.record.split, offset = d.record.offset, error = %d.error,
                    "record sent to the dead-letter table {}", self.settings().dead_letters);
            }
            self.subtask.context.metrics.add_dead_letters(dead.len() as u64);
        }
        Ok(())
    }

    /// Writes the commit marker (pipeline, table, subtask, checkpoint, gid,
    /// records, time) into the commit-log table and runs `PREPARE TRANSACTION`, then
    /// checks the transaction really is prepared.
    async fn pre_commit(&mut self, txn: PostgresTransaction) -> Result<PostgresCommittable, ConnectorError> {
        // On a newer connection than the transaction's, the statements below
        // would run outside any transaction.
        self.check_transaction(&txn, "PREPARE TRANSACTION")?;
        self.finish_copy(txn.checkpoint).await?;
        let counts_records = self.layout()?.marker_counts_records;
        let client = self.writer()?;
        let marker = marker_sql(&self.settings().commit_log, counts_records);
        let subtask = i32::try_from(self.subtask.context.subtask).unwrap_or(i32::MAX);
        let checkpoint = checkpoint_i64(txn.checkpoint);
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
            &txn.gid,
            &self.subtask.context.pipeline,
            &self.subtask.settings.table_label,
            &subtask,
            &checkpoint,
        ];
        if counts_records {
            params.push(&txn.records);
        }
        let result = async {
            client.execute(&marker, &params).await?;
            let prepare = format!("PREPARE TRANSACTION {}", quote_literal(&txn.gid));
            io_faults::after_sending(
                client.batch_execute(&prepare),
                io_faults::BEFORE_PREPARE_ANSWER,
                self.before_prepare_answer(&txn.gid),
            )
            .await?;
            client
                .query_one(
                    "SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1 AND database = current_database()",
                    &[&txn.gid],
                )
                .await
        }
        .await;
        // Prepared: the connection has no transaction any more. Failed: the
        // transaction is aborted but still open, and the next `begin` (or
        // `recover`) rolls it back.
        self.open = result.is_err();
        let prepared: i64 = result.map_err(|e| self.pg_error("PREPARE TRANSACTION", &e))?.get(0);
        if prepared != 1 {
            return Err(ConnectorError::transient(
                self.context("PREPARE TRANSACTION"),
                format!(
                    "transaction '{}' was rolled back instead of prepared (an earlier statement of it failed)",
                    txn.gid
                ),
            ));
        }
        tracing::debug!(gid = %txn.gid, checkpoint = %txn.checkpoint, "prepared");
        Ok(PostgresCommittable {
            gid: txn.gid,
            checkpoint: txn.checkpoint,
            subtask: self.subtask.context.subtask,
        })
    }

    /// `COMMIT PREPARED` on the commit connection. When the gid is no longer
    /// prepared, its marker in the commit-log table decides: present →
    /// already committed (success); absent → [`ConnectorError::DataLoss`]. In
    /// upsert mode the staged rows are then merged into the table. Lost
    /// connections are transient errors. Only while the write connection's
    /// session holds the subtask locks: after a lost write connection, a new
    /// one takes them first (fatal when another process has them).
    async fn commit(&mut self, c: &PostgresCommittable) -> Result<(), ConnectorError> {
        self.lock_writer().await?;
        self.commit_and_merge(c).await?;
        self.markers.committed(c.checkpoint.0);
        self.prune_markers().await;
        Ok(())
    }

    /// A fallback to `checkpoint` (the newer checkpoint entries cannot be
    /// read) replays everything after it. [`ReplayCheck::CommittedLater`]
    /// when the commit log holds a marker of a later checkpoint of this
    /// subtask or of any subtask `j` with `j % parallelism` equal to it (the
    /// ones it adopts, and those of a higher parallelism the pipeline may
    /// have run at since), with the records those markers count (`None` when
    /// one predates the count); `Safe` when none does. Sound although markers are
    /// pruned: the marker of the pipeline's highest committed checkpoint is
    /// never deleted (see the rule in `markers.rs`). A transaction only
    /// prepared is no commit (its marker is invisible until `COMMIT
    /// PREPARED`; recovery rolls it back). With `upsert_key` the rows of a
    /// replay merge idempotently, but its dead letters would be written
    /// again, so a later commit is reported there too. Modes `upsert` and
    /// `fenced` answer `Safe` through their adapters (upserts by key;
    /// replays at or below the stored positions are dropped). Reads only.
    async fn check_replay_after(&mut self, checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError> {
        self.connect_committer().await?;
        let log = self.settings().commit_log.sql();
        let filter =
            format!("FROM {log} WHERE pipeline = $1 AND sink_table = $2 AND subtask % $3 = $4 AND checkpoint > $5");
        let counted = format!("SELECT max(checkpoint), sum(records)::bigint, count(*) = count(records) {filter}");
        let uncounted = format!("SELECT max(checkpoint), NULL::bigint, false {filter}");
        let parallelism = i32::try_from(self.subtask.context.parallelism.max(1)).unwrap_or(i32::MAX);
        let subtask = i32::try_from(self.subtask.context.subtask).unwrap_or(i32::MAX);
        let after = checkpoint_i64(checkpoint);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &self.subtask.context.pipeline,
            &self.settings().table_label,
            &parallelism,
            &subtask,
            &after,
        ];
        let mut later = self.committer().query_one(&counted, &params).await;
        if matches!(&later, Err(e) if e.code() == Some(&SqlState::UNDEFINED_COLUMN)) {
            // A commit log from before markers counted records.
            later = self.committer().query_one(&uncounted, &params).await;
        }
        match later {
            Ok(row) => Ok(match row.get::<_, Option<i64>>(0) {
                Some(later) => ReplayCheck::CommittedLater {
                    checkpoint: CheckpointId(u64::try_from(later).unwrap_or(0)),
                    records: row
                        .get::<_, bool>(2)
                        .then(|| row.get::<_, Option<i64>>(1))
                        .flatten()
                        .map(|n| u64::try_from(n).unwrap_or(0)),
                },
                None => ReplayCheck::Safe,
            }),
            // No commit log: nothing to tell from.
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(ReplayCheck::Unknown),
            Err(e) => Err(self.pg_error("reading the commit markers", &e)),
        }
    }

    /// `ROLLBACK` of the open transaction. A lost connection is success: the
    /// server rolled it back already.
    async fn abort(&mut self, txn: PostgresTransaction) -> Result<(), ConnectorError> {
        // An unfinished COPY is failed by dropping it; ROLLBACK follows.
        if txn.generation != self.writer_generation {
            // It died with its connection.
            return Ok(());
        }
        self.drop_copy();
        if !self.open {
            return Ok(());
        }
        self.open = false;
        let Some(client) = self.writer.as_ref().filter(|c| !c.is_closed()) else {
            return Ok(());
        };
        match client.batch_execute("ROLLBACK").await {
            Ok(()) => {
                tracing::debug!(gid = %txn.gid, "rolled back");
                Ok(())
            }
            Err(e) if e.is_closed() => Ok(()),
            Err(e) => Err(self.pg_error("ROLLBACK", &e)),
        }
    }
}

/// The statement that writes a transaction's commit marker (`$1`..`$5`:
/// gid, pipeline, table, subtask, checkpoint; `$6` the record count when
/// the commit log has the column, see [`crate::schema::RECORDS`]). A marker
/// left by an earlier attempt under the same gid is replaced.
fn marker_sql(log: &crate::sql::QualifiedName, counts_records: bool) -> String {
    let (column, value, update) = if counts_records {
        (", records", ", $6", ", records = EXCLUDED.records")
    } else {
        ("", "", "")
    };
    format!(
        "INSERT INTO {} (gid, pipeline, sink_table, subtask, checkpoint{column}) VALUES ($1, $2, $3, $4, $5{value}) \
         ON CONFLICT (gid) DO UPDATE SET pipeline = EXCLUDED.pipeline, sink_table = EXCLUDED.sink_table, \
         subtask = EXCLUDED.subtask, checkpoint = EXCLUDED.checkpoint{update}, prepared_at = now()",
        log.sql()
    )
}
