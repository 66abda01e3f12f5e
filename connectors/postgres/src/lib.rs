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
//! [`ReplaySafe`](exactly_core::ReplaySafe) and [`Fenced`](exactly_core::Fenced) adapters. All modes share the column
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
//! back behind the pipeline's back ([`ConnectorError::DataLoss`](exactly_core::ConnectorError::DataLoss)). Markers
//! older than `commit_log_retention` are deleted once no checkpoint the
//! pipeline may restore lists them any more (the rule and its limits are in
//! the source's `two_phase/markers.rs`).
//!
//! After a lowering of the parallelism a subtask also recovers the old
//! subtasks it adopts ([`SinkContext::adopted`](exactly_core::SinkContext::adopted)): their listed transactions
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
//! `partition`, `offset`, `key`, `timestamp`, `headers`, `value`), from a
//! JSON pointer into the value (`/customer/name`) or into the key
//! (`key/id`), converted to the column
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
//! ## A table per topic
//!
//! In mode `two-phase`, `table` may hold `${topic}` (replaced by each
//! record's topic, as one identifier part) and `tables` maps topics to
//! tables. Each table is prepared (created with `create_table`, checked)
//! when its first record comes, with its own dead-letter and staging
//! tables; all tables of a subtask's interval are in its one prepared
//! transaction, and the committable lists the tables whose staged rows its
//! commit merges. Topics that would make names PostgreSQL cuts, or names of
//! the sink's own tables, are fatal errors naming the fix.
//!
//! ## Keys and deletes
//!
//! `pk.mode` and `pk.fields` name the primary key as Kafka Connect's JDBC
//! sink does ([`PrimaryKey`]): `record_key` (fields of a JSON-object key, or
//! the whole key for one field when it is not an object), `record_value`
//! (fields of the value) or `kafka` (topic, partition, offset; columns
//! `__connect_topic`, `__connect_partition`, `__connect_offset` unless named).
//! A key column's `from` is left out: the mode gives it. Rows are then
//! upserted on the key in every mode, as with `upsert_key`.
//!
//! `delete.enabled = true` (a key from the record key) makes a tombstone —
//! a record with a null value — delete the row of its key; several changes
//! to one key in one batch, or in mode `two-phase` one checkpoint interval,
//! apply in offset order (the last one per key wins, a delete too: one
//! statement deletes the keys whose last change is a delete and upserts the
//! others). Without it a tombstone is a dead letter (`on_tombstone =
//! "dead-letter"`, the default) or written as a row with NULL where the
//! value was (`on_tombstone = "write"`), never silently.
//!
//! ## Rows the server refuses
//!
//! By default a row that breaks a constraint of the table stops the
//! pipeline with the server's error, which names the constraint. With
//! `on_rejected_row = "dead-letter"`, a row refused with SQLSTATE class 22
//! (data exception) or 23 (integrity constraint violation) goes to the
//! dead-letter table with the server's message, in the same transaction,
//! counted, and the other rows are written once: the refused batch is
//! written again in parts, each in a savepoint (or a statement) of its own,
//! until the refused rows are found (see the source's `conn/reject.rs`; a
//! COPY's error names the row, which saves most of the attempts). In mode
//! `two-phase` the COPY of rows that stays open across batches starts in a
//! savepoint and the sink keeps the records of its rows until it ends; with
//! a key, the target's constraints are met at the merge after `COMMIT
//! PREPARED`, which then merges in ranges and moves a refused staged row
//! (the staging table keeps each row's record for this) to the dead-letter
//! table in one transaction. A row superseded by a later one of the same key
//! in the same batch or interval is not written, so not checked either.
//! Each savepoint with writes takes a subtransaction id; a transaction with
//! many isolated refusals may go past PostgreSQL's cache of 64, which slows
//! other sessions' snapshots while it is open.
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
//!
//! ## Source layout
//!
//! One folder per layer; each depends only on the ones above it:
//!
//! ```text
//! sql.rs        quoting names
//! url.rs        the connection string as libpq reads it (TLS keys, passwords)
//! config.rs     [sink.postgres]: the settings and their checks
//! rows/         records → rows → binary COPY bytes, and dead-letter rows: pure, no connection
//! conn/         TLS, connecting, subtask locks, COPY and batch statements, and what the server's
//!               errors mean
//! tables/       creating and checking the tables; the statements every write runs
//! two_phase/    mode `two-phase`: the sink, its write and commit connections, recovery, gids
//! replay_safe/  modes `upsert` and `fenced`
//! factory.rs    the sink of the configured mode for each subtask
//! ```

#![warn(missing_docs)]

mod config;
mod conn;
mod factory;
mod replay_safe;
mod rows;
mod sql;
mod tables;
mod two_phase;
mod url;

pub use config::{
    ColumnConfig, ColumnType, Columns, Deletes, FieldSource, Format, OnRejectedRow, OnTombstone, PkMode,
    PostgresSinkConfig, PrimaryKey, RegistryConfig, SchemaEvolution, SinkMode, DEAD_LETTER_SUFFIX,
    DEFAULT_COMMIT_LOG_TABLE, DEFAULT_POSITIONS_TABLE, KAFKA_PK_FIELDS, STAGING_SUFFIX,
};
pub use factory::PostgresSinkFactory;

/// A record carrying this header goes to the table its value resolves to
/// (through `tables`, then the `${topic}` template of `table`) instead of
/// its topic's: what the `exactly` command's `route` transform sets from
/// a field of the value. Without a table per topic the header is ignored.
pub const ROUTE_HEADER: &str = "exactly.route";
pub use replay_safe::{PostgresFencedSink, PostgresUpsertSink};
pub use two_phase::gid::{gid, gid_prefix, MAX_GID_BYTES};
pub use two_phase::{PostgresCommittable, PostgresSink, PostgresTransaction};

/// Binary `COPY ... FROM STDIN` in large messages (see [`BinaryCopy`](copy::BinaryCopy)).
pub mod copy {
    pub use crate::conn::copy::{BinaryCopy, CopyError, CHUNK_BYTES};
}
