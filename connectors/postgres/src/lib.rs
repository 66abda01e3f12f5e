//! # exactly-postgres
//!
//! A PostgreSQL sink with three modes (`mode = "..."` in `[sink.postgres]`):
//!
//! | mode | how | table | visible | needs |
//! |---|---|---|---|---|
//! | `two-phase` (default) | one transaction per checkpoint interval, `PREPARE TRANSACTION` at pre-commit, `COMMIT PREPARED` after the checkpoint | any | at commit | `max_prepared_transactions > 0` |
//! | `upsert` | each batch upserted at once; replays rewrite the same keys ([`PostgresUpsertSink`]) | unique key (`upsert_key`) | at once | nothing special |
//! | `fenced` | rows and the source positions they cover commit in one local transaction; replays at or below the stored positions are dropped ([`PostgresFencedSink`]) | any, also append-only without a unique key | at the checkpoint | nothing special |
//!
//! Modes `upsert` and `fenced` are for servers without prepared transactions
//! (many managed PostgreSQL services have `max_prepared_transactions = 0`);
//! [`PostgresSinkFactory`] drives them through the core's
//! [`ReplaySafe`] and [`Fenced`] adapters. All modes share the column
//! mapping, the conversions and the dead-letter table described below.
//!
//! ## Mode `two-phase`
//!
//! Every checkpoint interval of a sink subtask is one PostgreSQL transaction.
//!
//! ```text
//! begin    BEGIN on the subtask's write connection
//! write    records → rows in Rust (bad ones → dead-letter rows), then binary COPY
//! pre_commit  INSERT marker INTO exactly_commit_log; PREPARE TRANSACTION '<gid>'
//! commit   COMMIT PREPARED '<gid>' on a second connection (any process can)
//! abort    ROLLBACK
//! recover  ROLLBACK PREPARED what the checkpoint does not list, commit what it lists
//! ```
//!
//! The gid is `exactly:<pipeline>:<table>:<subtask>:<checkpoint>` (shortened
//! with a hash past PostgreSQL's 199 bytes, see [`gid_prefix`]). `commit` is
//! idempotent: when the gid is no longer prepared, the marker row written
//! inside the transaction tells whether it was committed (success) or rolled
//! back behind the pipeline's back ([`ConnectorError::DataLoss`]). Markers
//! older than `commit_log_retention` are deleted once no checkpoint the
//! pipeline may restore lists them any more (the rule and its limits are in
//! the source's `markers.rs`).
//!
//! After a lowering of the parallelism a subtask also recovers the old
//! subtasks it adopts ([`SinkContext::adopted`]): their listed transactions
//! are committed, the rest rolled back, their staged rows merged; and so are
//! the prepared transactions of subtasks above the parallelism that no
//! restorable checkpoint lists (left by an attempt at a higher parallelism
//! that crashed before its first checkpoint), by subtask `j % parallelism`.
//!
//! ## One process per pipeline
//!
//! In every mode, the connection that writes (and, in mode `two-phase`,
//! prepares) holds a session-level advisory lock per owned subtask, keyed by
//! the pipeline name, the table as configured and the subtask number, taken
//! before recovery touches anything. A second process of the pipeline — even
//! with another checkpoint folder, on another machine — is refused with a
//! fatal error naming the session that holds the lock (backend pid, client
//! address, `application_name`, since when). After a lost connection the new
//! one takes the locks again before it writes, prepares or commits anything,
//! and fails (fatal) if another process has them. The sink's connections
//! have `application_name = "exactly <pipeline> pid=<pid>.<tag>"`, replacing
//! one set in the URL.
//!
//! ## Crash points
//!
//! Besides the runtime's (see [`exactly_core::fault`]): `postgres_sink.mid_copy`
//! (a COPY of rows is open and the server has received rows of it) and
//! `postgres_sink.before_prepare_answer` (the server has prepared the
//! transaction, the sink has not read the answer).
//!
//! ## Rows
//!
//! Each configured column takes its value from the record (`topic`,
//! `partition`, `offset`, `key`, `timestamp`, `headers`, `value`) or from a
//! JSON pointer into the value (`/customer/name`), converted to the column
//! type in Rust before the COPY: a record that does not fit (invalid JSON, a
//! missing required field, `"abc"` for a bigint, a number too large for the
//! column's `numeric(p, s)` or `varchar(n)`) goes to the dead-letter table,
//! inside the same transaction, with its raw key and value and the reason,
//! and is counted in [`exactly_core::Metrics`] — it never fails the COPY of
//! the others.
//!
//! Conversions: integers from JSON numbers or decimal text (range-checked);
//! `real`/`double` from numbers or text; `numeric` from numbers or decimal
//! text, sent in the binary numeric format (keep exact decimals as JSON
//! strings: JSON numbers pass through a double); `text` from strings (other
//! JSON as its JSON text, bytes as UTF-8); `bytea` from raw bytes or text;
//! `json`/`jsonb` from JSON (raw `key`/`value` bytes are checked
//! and stored as written; pointed-to values are re-serialized, keys sorted); `boolean` from JSON
//! booleans or `true`/`false`/`t`/`f`/`yes`/`no`/`on`/`off`/`1`/`0`;
//! `timestamptz` from Unix milliseconds (numbers, the record timestamp) or
//! RFC 3339 text with an offset. `headers` become a JSON object: UTF-8 values
//! as strings, others as bytea hex text (`"\\x00ff"`), repeated names as an
//! array of their values.
//!
//! ## Upsert in mode `two-phase`
//!
//! With `upsert_key`, a transaction COPYs its rows into a staging table
//! (`<table>_exactly_staging`, tagged with the gid) and, after `COMMIT
//! PREPARED`, one statement moves them into the table with `INSERT ... ON
//! CONFLICT (key) DO UPDATE`, the last row per key winning. PostgreSQL cannot
//! prepare a transaction that used a temporary table, and a prepared
//! transaction keeps its row locks until it commits — an upsert of the same
//! key in the next interval would wait for a commit that only this sink's
//! own task can run. Staging the rows first avoids both; the merge is
//! idempotent and also runs in `recover` for rows a crash left behind.
//!
//! ## Modes `upsert` and `fenced`
//!
//! Mode `upsert` needs `upsert_key`; each batch is one statement that takes
//! the rows as one array per column and keeps the last row per key.
//! Dead letters are written unless the table already holds the same record.
//!
//! Mode `fenced` keeps, in the positions table (`exactly_positions` by
//! default: `scope`, `split`, `offset`, `updated_at`; created when absent),
//! the highest offset written per source split under the scope
//! `<pipeline>/postgres:<table>`. Rows (COPY, or the upsert statement with
//! `upsert_key`), dead letters and the advanced positions commit in one local
//! transaction per checkpoint interval; see [`PostgresFencedSink`].
//!
//! In both modes the dead-letter rows have `checkpoint` 0: the records are
//! written before the checkpoint's id is known.
//!
//! ## Server requirements
//!
//! PostgreSQL 12 or newer; mode `two-phase` needs `max_prepared_transactions
//! > 0` (checked in `recover`).
//!
//! ## TLS and passwords
//!
//! Every connection (writing, committing, recovery, `exactly status`)
//! takes libpq's `sslmode` (`disable`, `prefer` — the default —,
//! `require`, `verify-ca`, `verify-full`), `sslrootcert` (a PEM file, or
//! `system`), `sslcert` and `sslkey` from the connection string or from
//! `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, with libpq's
//! meaning (`require` checks the CA when a root certificate is given,
//! `verify-full` also the host name), over rustls. Without a password in
//! the URL, `PGPASSWORD` and then the password file (`PGPASSFILE`,
//! `~/.pgpass`) are used. An untrusted or misnamed certificate, a server
//! that requires TLS reached without it, and a wrong or missing password
//! are fatal errors naming the setting to fix.

#![warn(missing_docs)]

mod config;
mod convert;
pub mod copy;
mod error;
mod gid;
mod idempotent;
mod io_faults;
mod lock;
mod markers;
mod numeric;
mod recover;
mod schema;
mod sink;
mod sql;
mod status;
mod tls;
mod write;

use std::sync::Arc;

use exactly_core::{
    erase, ConnectorError, ErasedSink, Fenced, FencedSinkFactory, IdempotentSinkFactory, ReplaySafe, SinkContext,
    SinkFactory,
};

pub use config::{
    ColumnConfig, ColumnType, Columns, FieldSource, PostgresSinkConfig, SinkMode, DEAD_LETTER_SUFFIX,
    DEFAULT_COMMIT_LOG_TABLE, DEFAULT_POSITIONS_TABLE, STAGING_SUFFIX,
};
pub use gid::{gid, gid_prefix, MAX_GID_BYTES};
pub use idempotent::{PostgresFencedSink, PostgresUpsertSink};
pub use sink::{PostgresCommittable, PostgresSink, PostgresTransaction};

/// Creates the sink subtasks of the configured mode from a checked
/// [`PostgresSinkConfig`].
#[derive(Clone, Debug)]
pub struct PostgresSinkFactory {
    config: PostgresSinkConfig,
    settings: Arc<config::Settings>,
}

impl PostgresSinkFactory {
    /// Checks the configuration (without connecting).
    ///
    /// Errors: [`ConnectorError::Fatal`] naming the key (`sink.postgres.<key>`)
    /// and the fix.
    pub fn new(config: PostgresSinkConfig) -> Result<Self, ConnectorError> {
        let settings = Arc::new(config.settings()?);
        Ok(PostgresSinkFactory { config, settings })
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresSinkConfig {
        &self.config
    }

    /// The configured mode.
    pub fn mode(&self) -> SinkMode {
        self.settings.mode
    }

    /// Mode `two-phase`: the typed sink of one subtask (what
    /// [`SinkFactory::create`] erases). It connects in
    /// [`recover`](exactly_core::TwoPhaseCommitSink::recover), which refuses
    /// other modes.
    pub fn create_sink(&self, context: SinkContext) -> PostgresSink {
        PostgresSink::new(self.settings.clone(), context)
    }

    /// Mode `upsert`: the typed sink of one subtask (what
    /// [`SinkFactory::create`] wraps in [`ReplaySafe`]). It connects in
    /// [`open`](exactly_core::IdempotentSink::open).
    pub fn create_upsert_sink(&self, context: &SinkContext) -> Result<PostgresUpsertSink, ConnectorError> {
        self.require_mode(SinkMode::Upsert)?;
        Ok(PostgresUpsertSink::new(self.subtask(context)))
    }

    /// Mode `fenced`: the typed sink of one subtask (what
    /// [`SinkFactory::create`] wraps in [`Fenced`]), with the scope
    /// [`fence_scope`](Self::fence_scope). It connects and reads its positions
    /// in [`open`](exactly_core::FencedSink::open).
    pub fn create_fenced_sink(&self, context: &SinkContext) -> Result<PostgresFencedSink, ConnectorError> {
        self.require_mode(SinkMode::Fenced)?;
        Ok(PostgresFencedSink::new(
            self.subtask(context),
            self.fence_scope(&context.pipeline),
        ))
    }

    /// Mode `fenced`: the scope of the pipeline's rows in the positions
    /// table, `<pipeline>/postgres:<table>` — what [`Fenced`] passes to
    /// [`write_fenced`](exactly_core::FencedSink::write_fenced).
    pub fn fence_scope(&self, pipeline: &str) -> String {
        format!("{pipeline}/{}", self.fence_identity())
    }

    /// `postgres:<table>`: the fence scope is about what the table holds, so
    /// it leaves out the column mapping and the other settings in
    /// [`identity`](SinkFactory::identity).
    fn fence_identity(&self) -> String {
        format!("postgres:{}", self.settings.table_label)
    }

    fn subtask(&self, context: &SinkContext) -> write::Subtask {
        write::Subtask {
            settings: self.settings.clone(),
            context: context.clone(),
        }
    }

    fn require_mode(&self, mode: SinkMode) -> Result<(), ConnectorError> {
        if self.settings.mode == mode {
            return Ok(());
        }
        Err(ConnectorError::fatal(
            "postgres sink",
            format!(
                "the sink of mode \"{}\" was asked for, but sink.postgres.mode is \"{}\". Fix: use \
                 PostgresSinkFactory::create, which picks the mode's sink",
                mode.as_str(),
                self.settings.mode.as_str()
            ),
        ))
    }
}

/// Mode `upsert` as the core's [`ReplaySafe`] adapter sees it.
struct UpsertMode(PostgresSinkFactory);

impl IdempotentSinkFactory for UpsertMode {
    type Sink = PostgresUpsertSink;
    fn identity(&self) -> String {
        self.0.identity()
    }
    fn create(&self, context: SinkContext) -> Result<PostgresUpsertSink, ConnectorError> {
        self.0.create_upsert_sink(&context)
    }
}

/// Mode `fenced` as the core's [`Fenced`] adapter sees it: its identity is
/// the fence scope's (see [`PostgresSinkFactory::fence_scope`]).
struct FencedMode(PostgresSinkFactory);

impl FencedSinkFactory for FencedMode {
    type Sink = PostgresFencedSink;
    fn identity(&self) -> String {
        self.0.fence_identity()
    }
    fn create(&self, context: SinkContext) -> Result<PostgresFencedSink, ConnectorError> {
        self.0.create_fenced_sink(&context)
    }
}

impl SinkFactory for PostgresSinkFactory {
    /// `postgres:table=...,columns=[...],mode=...` plus the upsert key and
    /// the commit-log or positions table: the settings that affect what the
    /// sink has written and where its markers are. The URL is not part of it.
    fn identity(&self) -> String {
        self.config.identity()
    }

    /// The sink of the configured mode: [`PostgresSink`] (`two-phase`),
    /// [`PostgresUpsertSink`] through [`ReplaySafe`] (`upsert`) or
    /// [`PostgresFencedSink`] through [`Fenced`] (`fenced`).
    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        match self.settings.mode {
            SinkMode::TwoPhase => Ok(erase(self.create_sink(context))),
            SinkMode::Upsert => ReplaySafe(UpsertMode(self.clone())).create(context),
            SinkMode::Fenced => Fenced(FencedMode(self.clone())).create(context),
        }
    }

    /// The pipeline's prepared transactions of the table, from
    /// `pg_prepared_xacts` (none in modes `upsert` and `fenced`).
    fn prepared_transactions<'a>(&'a self, pipeline: &'a str) -> exactly_core::PreparedTransactionsFuture<'a> {
        Box::pin(async move { self.prepared_transactions_of(pipeline).await.map(Some) })
    }
}
