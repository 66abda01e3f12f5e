//! # exactly-postgres
//!
//! A PostgreSQL sink with two-phase commit: every checkpoint interval of a
//! sink subtask is one PostgreSQL transaction.
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
//! back behind the pipeline's back ([`ConnectorError::DataLoss`]).
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
//! ## Upsert
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
//! ## Server requirements
//!
//! PostgreSQL 12 or newer with `max_prepared_transactions > 0` (checked in
//! `recover`). TLS is not supported yet (the connection uses `NoTls`;
//! `sslmode=require` is refused by the configuration check).

#![warn(missing_docs)]

mod config;
mod convert;
mod error;
mod gid;
mod numeric;
mod schema;
mod sink;
mod sql;

use std::sync::Arc;

use exactly_core::{erase, ConnectorError, ErasedSink, SinkContext, SinkFactory};

pub use config::{
    ColumnConfig, ColumnType, Columns, FieldSource, PostgresSinkConfig, SinkMode, DEAD_LETTER_SUFFIX,
    DEFAULT_COMMIT_LOG_TABLE, STAGING_SUFFIX,
};
pub use gid::{gid, gid_prefix, MAX_GID_BYTES};
pub use sink::{PostgresCommittable, PostgresSink, PostgresTransaction};

/// Creates [`PostgresSink`] subtasks from a checked [`PostgresSinkConfig`].
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

    /// The typed sink of one subtask (what [`SinkFactory::create`] erases).
    /// It connects in [`recover`](exactly_core::TwoPhaseCommitSink::recover).
    pub fn create_sink(&self, context: SinkContext) -> PostgresSink {
        PostgresSink::new(self.settings.clone(), context)
    }
}

impl SinkFactory for PostgresSinkFactory {
    /// `postgres:table=...,columns=[...],mode=...` plus the upsert key and
    /// the commit-log table: the settings that affect what the sink has
    /// written and where its markers are. The URL is not part of it.
    fn identity(&self) -> String {
        self.config.identity()
    }

    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        Ok(erase(self.create_sink(context)))
    }
}
