//! `[sink.postgres]`: the configuration of the PostgreSQL sink and its checks.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use exactly_core::{ConnectorError, JsonPointer};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::sql::QualifiedName;

/// Default name of the commit-log table (mode `two-phase`).
pub const DEFAULT_COMMIT_LOG_TABLE: &str = "exactly_commit_log";
/// Default of `commit_log_retention`.
pub const DEFAULT_COMMIT_LOG_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default name of the positions table (mode `fenced`).
pub const DEFAULT_POSITIONS_TABLE: &str = "exactly_positions";
/// Suffix of the default dead-letter table name (`<table>_dead_letters`).
pub const DEAD_LETTER_SUFFIX: &str = "_dead_letters";
/// Suffix of the default upsert staging table name (`<table>_exactly_staging`).
pub const STAGING_SUFFIX: &str = "_exactly_staging";
/// Column names the staging table reserves for itself.
pub(crate) const RESERVED_COLUMNS: [&str; 2] = ["exactly_gid", "exactly_seq"];

/// The `[sink.postgres]` section.
///
/// ```toml
/// [sink.postgres]
/// url = "postgres://app:secret@db:5432/shop"
/// table = "sales.orders"
/// create_table = true
/// mode = "upsert"        # or "two-phase" (default) or "fenced"
/// upsert_key = ["id"]
///
/// [sink.postgres.columns]
/// id       = { from = "/id", type = "bigint" }
/// customer = { from = "/customer/name", type = "text", required = false }
/// raw      = { from = "value", type = "bytea" }
/// ```
///
/// Check it with [`PostgresSinkConfig::validate`] (the factory does).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkConfig {
    /// Connection string: `postgres://user:password@host:port/dbname` or the
    /// `key=value` form, with libpq's `sslmode` (`disable`, `prefer`,
    /// `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert` and
    /// `sslkey`; without a password, `PGPASSWORD` or the password file
    /// (`PGPASSFILE`, `~/.pgpass`) is used (see the crate's TLS docs).
    pub url: String,
    /// Target table, `name` or `schema.name`. Parts are used exactly as written
    /// (case-sensitive); put a part in double quotes if it contains a dot.
    pub table: String,
    /// Create the target table (with the configured columns, and the upsert
    /// key as primary key) when it does not exist. Default `false`.
    #[serde(default)]
    pub create_table: bool,
    /// Column name → where its value comes from and its type, in order.
    pub columns: Columns,
    /// How writes are made exactly-once: `"two-phase"` (default, needs
    /// prepared transactions), `"upsert"` or `"fenced"` (see [`SinkMode`]).
    #[serde(default)]
    pub mode: SinkMode,
    /// When set, rows are upserted on these columns (which need a unique index
    /// or primary key) instead of appended: the last record wins for a key.
    /// Required by mode `upsert`.
    #[serde(default)]
    pub upsert_key: Option<Vec<String>>,
    /// Where records that cannot be written go. Default `<table>_dead_letters`
    /// (in the target table's schema). Created when absent.
    #[serde(default)]
    pub dead_letter_table: Option<String>,
    /// Mode `two-phase` only: where every transaction leaves its commit
    /// marker. Default `exactly_commit_log`. Created when absent; shared by
    /// pipelines.
    #[serde(default)]
    pub commit_log_table: Option<String>,
    /// Mode `two-phase` only: how long a subtask's commit markers are kept
    /// after their transaction was committed (written like `"7days"`,
    /// `"12h"`). Default 7 days. A marker only matters when a checkpoint's
    /// transaction is committed again after a restore and is gone: present
    /// means it was committed. After the commits of a completed checkpoint
    /// (at most every 10 minutes, never during recovery) markers committed
    /// longer ago than this are deleted, so the table stays bounded. Restoring
    /// the latest checkpoint is always safe (recovery re-commits and renews its
    /// markers before anything is deleted); restoring by hand an older
    /// checkpoint whose transactions were committed longer ago than this
    /// reports data loss instead of "already committed".
    #[serde(default, deserialize_with = "de_some_duration")]
    pub commit_log_retention: Option<Duration>,
    /// Mode `two-phase` with `upsert_key` only: the table that holds a
    /// checkpoint's rows between pre-commit and commit. Default
    /// `<table>_exactly_staging` (in the target table's schema). Created when
    /// absent.
    #[serde(default)]
    pub staging_table: Option<String>,
    /// Mode `fenced` only: where the sink keeps, per pipeline, table and
    /// source split, the highest offset it has written. Default
    /// `exactly_positions`. Created when absent; shared by pipelines.
    #[serde(default)]
    pub positions_table: Option<String>,
}

impl fmt::Debug for PostgresSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSinkConfig")
            .field("url", &crate::error::redact_url(&self.url))
            .field("table", &self.table)
            .field("create_table", &self.create_table)
            .field("columns", &self.columns)
            .field("mode", &self.mode)
            .field("upsert_key", &self.upsert_key)
            .field("dead_letter_table", &self.dead_letter_table)
            .field("commit_log_table", &self.commit_log_table)
            .field("commit_log_retention", &self.commit_log_retention)
            .field("staging_table", &self.staging_table)
            .field("positions_table", &self.positions_table)
            .finish()
    }
}

/// How the sink makes its writes exactly-once (`mode = "..."`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SinkMode {
    /// `two-phase`: one transaction per checkpoint, `PREPARE TRANSACTION` at
    /// pre-commit, `COMMIT PREPARED` once the checkpoint is durable. Needs
    /// `max_prepared_transactions > 0`.
    #[default]
    TwoPhase,
    /// `upsert`: every batch is upserted at once (`INSERT ... ON CONFLICT
    /// (upsert_key) DO UPDATE`); a replay after a crash rewrites the same keys.
    /// Needs `upsert_key`; no prepared transactions.
    Upsert,
    /// `fenced`: rows and the source positions they cover commit in one local
    /// transaction; a replay at or below the stored position of its split is
    /// dropped. Works for append-only tables without a unique key; no
    /// prepared transactions.
    Fenced,
}

impl SinkMode {
    /// The name used in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkMode::TwoPhase => "two-phase",
            SinkMode::Upsert => "upsert",
            SinkMode::Fenced => "fenced",
        }
    }
}

/// The ordered `columns` map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Columns(pub Vec<(String, ColumnConfig)>);

impl<'de> Deserialize<'de> for Columns {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OrderedColumns;

        impl<'de> Visitor<'de> for OrderedColumns {
            type Value = Columns;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a table of column name = { from = \"...\", type = \"...\" }")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Columns, A::Error> {
                let mut columns: Vec<(String, ColumnConfig)> = Vec::new();
                while let Some((name, column)) = map.next_entry::<String, ColumnConfig>()? {
                    if columns.iter().any(|(n, _)| *n == name) {
                        return Err(serde::de::Error::custom(format!("column `{name}` is listed twice")));
                    }
                    columns.push((name, column));
                }
                Ok(Columns(columns))
            }
        }

        deserializer.deserialize_map(OrderedColumns)
    }
}

/// One entry of `columns`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnConfig {
    /// Where the value comes from.
    pub from: FieldSource,
    /// The column's PostgreSQL type.
    #[serde(rename = "type")]
    pub column_type: ColumnType,
    /// When `true` (default) a record without this value (or with JSON `null`)
    /// is a dead letter; when `false` the column gets `NULL`.
    #[serde(default = "yes")]
    pub required: bool,
}

fn yes() -> bool {
    true
}

impl ColumnConfig {
    /// A required column.
    pub fn new(from: FieldSource, column_type: ColumnType) -> Self {
        ColumnConfig {
            from,
            column_type,
            required: true,
        }
    }
}

/// Where a column's value comes from (`from = "..."`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum FieldSource {
    /// `topic`: the topic of a `<topic>-<partition>` split, else the split name.
    Topic,
    /// `partition`: the partition of a `<topic>-<partition>` split (missing otherwise).
    Partition,
    /// `offset`: the record's offset.
    Offset,
    /// `key`: the raw key bytes (missing when the record has none).
    Key,
    /// `timestamp`: the record's time, Unix milliseconds (missing when unknown).
    Timestamp,
    /// `headers`: a JSON object of the headers (see the crate documentation).
    Headers,
    /// `value`: the raw value bytes.
    Value,
    /// `/a/b`: a JSON pointer (RFC 6901) into the value parsed as JSON.
    Pointer(JsonPointer),
}

const SOURCE_NAMES: &str = "topic, partition, offset, key, timestamp, headers, value, or a JSON pointer such as /id";

impl FromStr for FieldSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "topic" => FieldSource::Topic,
            "partition" => FieldSource::Partition,
            "offset" => FieldSource::Offset,
            "key" => FieldSource::Key,
            "timestamp" => FieldSource::Timestamp,
            "headers" => FieldSource::Headers,
            "value" => FieldSource::Value,
            p if p.starts_with('/') => FieldSource::Pointer(JsonPointer::parse(p).map_err(|e| e.to_string())?),
            other => return Err(format!("unknown source `{other}`: use {SOURCE_NAMES}")),
        })
    }
}

impl TryFrom<String> for FieldSource {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl fmt::Display for FieldSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FieldSource::Topic => "topic",
            FieldSource::Partition => "partition",
            FieldSource::Offset => "offset",
            FieldSource::Key => "key",
            FieldSource::Timestamp => "timestamp",
            FieldSource::Headers => "headers",
            FieldSource::Value => "value",
            FieldSource::Pointer(p) => p.as_str(),
        })
    }
}

/// A column type (`type = "..."`). Aliases in parentheses are accepted too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
pub enum ColumnType {
    /// `smallint` (`int2`).
    #[serde(rename = "smallint", alias = "int2")]
    SmallInt,
    /// `int` (`integer`, `int4`).
    #[serde(rename = "int", alias = "integer", alias = "int4")]
    Int,
    /// `bigint` (`int8`).
    #[serde(rename = "bigint", alias = "int8")]
    BigInt,
    /// `real` (`float4`).
    #[serde(rename = "real", alias = "float4")]
    Real,
    /// `double` (`double precision`, `float8`).
    #[serde(rename = "double", alias = "double precision", alias = "float8")]
    Double,
    /// `numeric` (`decimal`), sent in PostgreSQL's binary numeric format with
    /// the column's precision and scale checked before the COPY.
    #[serde(rename = "numeric", alias = "decimal")]
    Numeric,
    /// `text`; the target column may also be `varchar(n)` or `char(n)`.
    #[serde(rename = "text", alias = "varchar")]
    Text,
    /// `boolean` (`bool`).
    #[serde(rename = "boolean", alias = "bool")]
    Boolean,
    /// `bytea`.
    #[serde(rename = "bytea")]
    Bytea,
    /// `json`.
    #[serde(rename = "json")]
    Json,
    /// `jsonb`.
    #[serde(rename = "jsonb")]
    Jsonb,
    /// `timestamptz` (`timestamp with time zone`).
    #[serde(rename = "timestamptz", alias = "timestamp with time zone")]
    Timestamptz,
}

impl ColumnType {
    /// The type as written in SQL.
    pub fn sql_name(self) -> &'static str {
        match self {
            ColumnType::SmallInt => "smallint",
            ColumnType::Int => "integer",
            ColumnType::BigInt => "bigint",
            ColumnType::Real => "real",
            ColumnType::Double => "double precision",
            ColumnType::Numeric => "numeric",
            ColumnType::Text => "text",
            ColumnType::Boolean => "boolean",
            ColumnType::Bytea => "bytea",
            ColumnType::Json => "json",
            ColumnType::Jsonb => "jsonb",
            ColumnType::Timestamptz => "timestamptz",
        }
    }

    /// The name used in the configuration.
    pub fn config_name(self) -> &'static str {
        match self {
            ColumnType::Int => "int",
            ColumnType::Double => "double",
            other => other.sql_name(),
        }
    }

    fn is_number(self) -> bool {
        matches!(
            self,
            ColumnType::SmallInt
                | ColumnType::Int
                | ColumnType::BigInt
                | ColumnType::Real
                | ColumnType::Double
                | ColumnType::Numeric
        )
    }
}

/// Why a source can never fill a column of a type, if it cannot.
fn impossible_pairing(from: &FieldSource, ty: ColumnType) -> Option<&'static str> {
    use ColumnType::*;
    match from {
        FieldSource::Headers if !matches!(ty, Json | Jsonb | Text) => {
            Some("headers are a JSON object: use json, jsonb or text")
        }
        FieldSource::Topic if ty.is_number() || matches!(ty, Boolean | Timestamptz) => {
            Some("the topic is text: use text, bytea, json or jsonb")
        }
        FieldSource::Partition | FieldSource::Offset if matches!(ty, Boolean | Bytea | Timestamptz) => {
            Some("partitions and offsets are integers: use an integer type, numeric, text, json or jsonb")
        }
        FieldSource::Timestamp if matches!(ty, Boolean | Bytea) => {
            Some("timestamps go to timestamptz (or bigint for Unix milliseconds)")
        }
        _ => None,
    }
}

/// A configuration error naming the key and the fix.
pub(crate) fn invalid(key: &str, problem: impl fmt::Display, fix: impl fmt::Display) -> ConnectorError {
    ConnectorError::fatal(
        "postgres sink configuration",
        format!("sink.postgres.{key}: {problem}. Fix: {fix}"),
    )
}

fn parse_name(key: &str, value: &str) -> Result<QualifiedName, ConnectorError> {
    QualifiedName::parse(value).map_err(|problem| {
        invalid(
            key,
            format!("`{value}` is not a table name ({problem})"),
            "write `name` or `schema.name`, with double quotes around a part that contains a dot",
        )
    })
}

/// The checked configuration, with defaults applied.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub pg: tokio_postgres::Config,
    /// TLS of every connection (`sslmode`, `sslrootcert`, ...).
    pub tls: crate::tls::TlsSettings,
    /// The URL without its password, for messages.
    pub url: String,
    /// The table as configured (used in gids, markers and messages).
    pub table_label: String,
    pub table: QualifiedName,
    pub create_table: bool,
    pub columns: Vec<(String, ColumnConfig)>,
    /// Indexes into `columns`.
    pub upsert_key: Option<Vec<usize>>,
    pub mode: SinkMode,
    pub dead_letters: QualifiedName,
    /// Mode `two-phase`.
    pub commit_log: QualifiedName,
    /// Mode `two-phase`: markers older than this are deleted.
    pub commit_log_retention: Duration,
    /// Mode `two-phase` with an upsert key.
    pub staging: QualifiedName,
    /// Mode `fenced`.
    pub positions: QualifiedName,
}

impl PostgresSinkConfig {
    /// A configuration with every optional key at its default and no columns.
    pub fn new(url: impl Into<String>, table: impl Into<String>) -> Self {
        PostgresSinkConfig {
            url: url.into(),
            table: table.into(),
            create_table: false,
            columns: Columns::default(),
            mode: SinkMode::default(),
            upsert_key: None,
            dead_letter_table: None,
            commit_log_table: None,
            commit_log_retention: None,
            staging_table: None,
            positions_table: None,
        }
    }

    /// Adds a column at the end.
    pub fn column(mut self, name: impl Into<String>, column: ColumnConfig) -> Self {
        self.columns.0.push((name.into(), column));
        self
    }

    /// Checks every key. The error names the key (`sink.postgres.<key>`) and
    /// how to fix it. Nothing is contacted.
    pub fn validate(&self) -> Result<(), ConnectorError> {
        self.settings().map(|_| ())
    }

    pub(crate) fn settings(&self) -> Result<Settings, ConnectorError> {
        let (mut pg, tls) = crate::tls::parse(&self.url).map_err(|e| {
            invalid(
                "url",
                format!("cannot parse the connection string: {e}"),
                "use postgres://USER@HOST:PORT/DATABASE?sslmode=verify-full&sslrootcert=CA.pem",
            )
        })?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(std::time::Duration::from_secs(10));
        }
        let table = parse_name("table", &self.table)?;
        let columns = self.checked_columns()?;
        let upsert_key = self.checked_upsert_key(&columns)?;
        self.check_mode_keys()?;
        let dead_letters = match &self.dead_letter_table {
            Some(name) => parse_name("dead_letter_table", name)?,
            None => table.with_suffix(DEAD_LETTER_SUFFIX),
        };
        let commit_log = parse_name(
            "commit_log_table",
            self.commit_log_table.as_deref().unwrap_or(DEFAULT_COMMIT_LOG_TABLE),
        )?;
        let staging = match &self.staging_table {
            Some(name) => parse_name("staging_table", name)?,
            None => table.with_suffix(STAGING_SUFFIX),
        };
        let positions = parse_name(
            "positions_table",
            self.positions_table.as_deref().unwrap_or(DEFAULT_POSITIONS_TABLE),
        )?;
        // The tables this mode uses must be distinct.
        let mut names = vec![("table", &table), ("dead_letter_table", &dead_letters)];
        match self.mode {
            SinkMode::TwoPhase => {
                names.push(("commit_log_table", &commit_log));
                if upsert_key.is_some() {
                    names.push(("staging_table", &staging));
                }
            }
            SinkMode::Fenced => names.push(("positions_table", &positions)),
            SinkMode::Upsert => {}
        }
        for (i, (key, a)) in names.iter().enumerate() {
            for (other, b) in &names[i + 1..] {
                if a == b {
                    return Err(invalid(
                        other,
                        format!("names the same table as `{key}` ({a})"),
                        "give each table its own name",
                    ));
                }
            }
        }
        Ok(Settings {
            url: crate::error::describe_url(&pg),
            pg,
            tls,
            table_label: self.table.clone(),
            table,
            create_table: self.create_table,
            columns,
            upsert_key,
            mode: self.mode,
            dead_letters,
            commit_log,
            commit_log_retention: self.checked_retention()?,
            staging,
            positions,
        })
    }

    fn checked_retention(&self) -> Result<Duration, ConnectorError> {
        let retention = self.commit_log_retention.unwrap_or(DEFAULT_COMMIT_LOG_RETENTION);
        if retention < Duration::from_secs(1) {
            return Err(invalid(
                "commit_log_retention",
                format!("{retention:?} is too short: markers must outlive the commits that may look for them"),
                "use at least \"1s\"; the default is \"7days\"",
            ));
        }
        Ok(retention)
    }

    /// Keys that only some modes use, and the key mode `upsert` needs.
    fn check_mode_keys(&self) -> Result<(), ConnectorError> {
        let mode = self.mode.as_str();
        if self.mode == SinkMode::Upsert && self.upsert_key.is_none() {
            return Err(invalid(
                "upsert_key",
                "mode \"upsert\" needs the columns to upsert on, and none are set",
                "set upsert_key = [\"id\"] (columns with a unique index or primary key); for an append-only table \
                 without a unique key use mode = \"fenced\"",
            ));
        }
        let only_in = [
            ("commit_log_table", self.commit_log_table.is_some(), SinkMode::TwoPhase),
            (
                "commit_log_retention",
                self.commit_log_retention.is_some(),
                SinkMode::TwoPhase,
            ),
            // Mode two-phase ignores it without an upsert key, as it always did.
            (
                "staging_table",
                self.staging_table.is_some() && (self.upsert_key.is_some() || self.mode != SinkMode::TwoPhase),
                SinkMode::TwoPhase,
            ),
            ("positions_table", self.positions_table.is_some(), SinkMode::Fenced),
        ];
        for (key, set, used_by) in only_in {
            if set && self.mode != used_by {
                return Err(invalid(
                    key,
                    format!("is used only by mode \"{}\", and mode is \"{mode}\"", used_by.as_str()),
                    format!("remove `{key}`, or set mode = \"{}\"", used_by.as_str()),
                ));
            }
        }
        Ok(())
    }

    fn checked_columns(&self) -> Result<Vec<(String, ColumnConfig)>, ConnectorError> {
        if self.columns.0.is_empty() {
            return Err(invalid(
                "columns",
                "no column is configured",
                "add a table such as `columns = { id = { from = \"/id\", type = \"bigint\" } }`",
            ));
        }
        for (name, column) in &self.columns.0 {
            let key = format!("columns.{name}");
            if name.is_empty() || name.contains('\0') {
                return Err(invalid(
                    "columns",
                    "a column name is empty or contains NUL",
                    "rename the column",
                ));
            }
            if RESERVED_COLUMNS.contains(&name.as_str()) {
                return Err(invalid(
                    &key,
                    format!("`{name}` is reserved for the sink's staging table"),
                    "rename the column",
                ));
            }
            if let Some(why) = impossible_pairing(&column.from, column.column_type) {
                return Err(invalid(
                    &format!("{key}.type"),
                    format!(
                        "`{}` cannot be filled from `{}`: {why}",
                        column.column_type.config_name(),
                        column.from
                    ),
                    "change `type` or `from`",
                ));
            }
        }
        Ok(self.columns.0.clone())
    }

    fn checked_upsert_key(&self, columns: &[(String, ColumnConfig)]) -> Result<Option<Vec<usize>>, ConnectorError> {
        let Some(key) = &self.upsert_key else {
            return Ok(None);
        };
        if key.is_empty() {
            return Err(invalid(
                "upsert_key",
                "is empty",
                "name the key columns (e.g. upsert_key = [\"id\"]) or remove the key to append",
            ));
        }
        let mut seen = HashSet::new();
        let mut indexes = Vec::with_capacity(key.len());
        for name in key {
            if !seen.insert(name) {
                return Err(invalid(
                    "upsert_key",
                    format!("lists `{name}` twice"),
                    "list each column once",
                ));
            }
            let Some(i) = columns.iter().position(|(n, _)| n == name) else {
                return Err(invalid(
                    "upsert_key",
                    format!("`{name}` is not a configured column"),
                    format!("add `{name}` to sink.postgres.columns or remove it from the key"),
                ));
            };
            if !columns[i].1.required {
                return Err(invalid(
                    &format!("columns.{name}.required"),
                    "an upsert key column must always have a value (NULL keys never match)",
                    "remove `required = false` from the key column",
                ));
            }
            indexes.push(i);
        }
        Ok(Some(indexes))
    }

    /// The settings that affect the sink's state, as part of the pipeline
    /// fingerprint: `postgres:table=...,columns=...,mode=...` plus the upsert
    /// key, and the commit-log table (mode `two-phase`) or the positions table
    /// (mode `fenced`).
    pub fn identity(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .0
            .iter()
            .map(|(name, c)| {
                format!(
                    "{name}={}:{}{}",
                    c.from,
                    c.column_type.config_name(),
                    if c.required { "" } else { "?" }
                )
            })
            .collect();
        let mut identity = format!(
            "postgres:table={},columns=[{}],mode={}",
            self.table,
            columns.join(";"),
            self.mode.as_str()
        );
        if let Some(key) = &self.upsert_key {
            identity.push_str(&format!(",upsert_key={}", key.join("+")));
        }
        match self.mode {
            SinkMode::TwoPhase => identity.push_str(&format!(
                ",commit_log={}",
                self.commit_log_table.as_deref().unwrap_or(DEFAULT_COMMIT_LOG_TABLE)
            )),
            SinkMode::Fenced => identity.push_str(&format!(
                ",positions={}",
                self.positions_table.as_deref().unwrap_or(DEFAULT_POSITIONS_TABLE)
            )),
            SinkMode::Upsert => {}
        }
        identity
    }
}

fn de_some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    exactly_core::duration::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        sink: SinkSection,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "snake_case", deny_unknown_fields)]
    enum SinkSection {
        Postgres(PostgresSinkConfig),
    }

    fn parse(text: &str) -> Result<PostgresSinkConfig, String> {
        toml::from_str::<File>(text)
            .map(|f| match f.sink {
                SinkSection::Postgres(c) => c,
            })
            .map_err(|e| e.to_string())
    }

    fn fatal_message(result: Result<(), ConnectorError>) -> String {
        match result {
            Err(ConnectorError::Fatal { message, .. }) => message,
            other => panic!("expected a fatal error, got {other:?}"),
        }
    }

    const BASE: &str = r#"
[sink.postgres]
url = "postgres://app:secret@db:5432/shop"
table = "sales.orders"

[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
name = { from = "/customer/name", type = "text", required = false }
topic = { from = "topic", type = "text" }
raw = { from = "value", type = "bytea" }
"#;

    #[test]
    fn a_toml_section_parses_with_defaults_and_keeps_column_order() {
        let config = parse(BASE).unwrap();
        config.validate().unwrap();
        let names: Vec<&str> = config.columns.0.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["id", "name", "topic", "raw"]);
        assert_eq!(
            config.columns.0[0].1.from,
            FieldSource::Pointer(JsonPointer::parse("/id").unwrap())
        );
        assert!(config.columns.0[0].1.required);
        assert!(!config.columns.0[1].1.required);
        assert_eq!(config.mode, SinkMode::TwoPhase);
        assert!(!config.create_table);
        let settings = config.settings().unwrap();
        assert_eq!(settings.dead_letters.to_string(), "sales.orders_dead_letters");
        assert_eq!(settings.commit_log.to_string(), "exactly_commit_log");
        assert_eq!(settings.staging.to_string(), "sales.orders_exactly_staging");
        assert_eq!(settings.url, "postgres://app@db:5432/shop");
        assert!(!format!("{config:?}").contains("secret"));
        assert_eq!(
            config.identity(),
            "postgres:table=sales.orders,columns=[id=/id:bigint;name=/customer/name:text?;topic=topic:text;\
             raw=value:bytea],mode=two-phase,commit_log=exactly_commit_log"
        );
    }

    #[test]
    fn unknown_keys_sources_types_and_modes_are_rejected_by_the_parser() {
        let unknown_key = BASE.replace("table = ", "tabel = \"x\"\ntable = ");
        assert!(parse(&unknown_key).unwrap_err().contains("tabel"));
        let bad_source = BASE.replace("\"/id\"", "\"idd\"");
        assert!(parse(&bad_source).unwrap_err().contains("unknown source `idd`"));
        let bad_type = BASE.replace("\"bigint\"", "\"long\"");
        assert!(parse(&bad_type).unwrap_err().contains("long"));
        let bad_mode = BASE.replace("table = ", "mode = \"upsrt\"\ntable = ");
        let message = parse(&bad_mode).unwrap_err();
        for mode in ["two-phase", "upsert", "fenced"] {
            assert!(message.contains(mode), "{message}");
        }
        let column_key = BASE.replace("required = false", "requried = false");
        assert!(parse(&column_key).unwrap_err().contains("requried"));
    }

    #[test]
    fn validation_names_the_key_and_the_fix() {
        let mut config = parse(BASE).unwrap();
        config.upsert_key = Some(vec!["nope".into()]);
        let message = fatal_message(config.validate());
        assert!(
            message.contains("sink.postgres.upsert_key") && message.contains("Fix:"),
            "{message}"
        );

        config.upsert_key = Some(vec!["name".into()]);
        let message = fatal_message(config.validate());
        assert!(message.contains("sink.postgres.columns.name.required"), "{message}");

        let mut config = parse(BASE).unwrap();
        config.columns.0[2].1.column_type = ColumnType::BigInt;
        let message = fatal_message(config.validate());
        assert!(message.contains("sink.postgres.columns.topic.type"), "{message}");

        let mut config = parse(BASE).unwrap();
        config.url = "postgres://host:notaport/db".into();
        let message = fatal_message(config.validate());
        assert!(message.contains("sink.postgres.url"), "{message}");
        config.url = "postgres://u:secret@host/db?sslmode=allow".into();
        let message = fatal_message(config.validate());
        assert!(message.contains("sslmode") && !message.contains("secret"), "{message}");

        let mut config = parse(BASE).unwrap();
        config.dead_letter_table = Some("sales.orders".into());
        let message = fatal_message(config.validate());
        assert!(message.contains("sink.postgres.dead_letter_table"), "{message}");

        let mut config = parse(BASE).unwrap();
        config.table = "a.b.c".into();
        let message = fatal_message(config.validate());
        assert!(message.contains("sink.postgres.table"), "{message}");

        let config = PostgresSinkConfig::new("postgres://h/db", "t");
        let message = fatal_message(config.validate());
        assert!(message.contains("sink.postgres.columns"), "{message}");
    }

    #[test]
    fn upsert_key_and_aliases_are_accepted() {
        let text = BASE
            .replace("table = ", "upsert_key = [\"id\"]\ntable = ")
            .replace("\"bigint\"", "\"int8\"");
        let config = parse(&text).unwrap();
        let settings = config.settings().unwrap();
        assert_eq!(settings.upsert_key, Some(vec![0]));
        assert_eq!(config.columns.0[0].1.column_type, ColumnType::BigInt);
        assert!(config.identity().contains(",upsert_key=id,"));
    }

    fn with(extra: &str) -> PostgresSinkConfig {
        parse(&BASE.replace("table = ", &format!("{extra}\ntable = "))).unwrap()
    }

    #[test]
    fn commit_log_retention_defaults_to_a_week_and_must_be_a_duration_of_a_second_or_more() {
        let settings = |extra: &str| with(extra).settings();
        assert_eq!(settings("").unwrap().commit_log_retention, DEFAULT_COMMIT_LOG_RETENTION);
        assert_eq!(
            settings("commit_log_retention = \"12h\"").unwrap().commit_log_retention,
            Duration::from_secs(12 * 3600)
        );
        let message = fatal_message(with("commit_log_retention = \"0s\"").validate());
        assert!(
            message.contains("sink.postgres.commit_log_retention") && message.contains("at least"),
            "{message}"
        );
        let error = parse(&BASE.replace("table = ", "commit_log_retention = \"often\"\ntable = ")).unwrap_err();
        assert!(error.contains("`often` is not a duration"), "{error}");
    }

    #[test]
    fn modes_parse_and_their_identity_names_mode_and_state_tables() {
        for (extra, mode, identity_end, positions) in [
            (
                "mode = \"upsert\"\nupsert_key = [\"id\"]",
                SinkMode::Upsert,
                "],mode=upsert,upsert_key=id",
                None,
            ),
            (
                "mode = \"fenced\"",
                SinkMode::Fenced,
                "],mode=fenced,positions=exactly_positions",
                Some("\"exactly_positions\""),
            ),
            (
                "mode = \"fenced\"\npositions_table = \"ops.fence\"\nupsert_key = [\"id\"]",
                SinkMode::Fenced,
                ",mode=fenced,upsert_key=id,positions=ops.fence",
                Some("\"ops\".\"fence\""),
            ),
        ] {
            let config = with(extra);
            let settings = config.settings().unwrap();
            assert_eq!(settings.mode, mode);
            assert!(config.identity().ends_with(identity_end), "{}", config.identity());
            if let Some(positions) = positions {
                assert_eq!(settings.positions.sql(), positions);
            }
        }
    }

    #[test]
    fn mode_specific_keys_are_checked_against_the_mode() {
        let message = fatal_message(with("mode = \"upsert\"").validate());
        assert!(
            message.contains("sink.postgres.upsert_key")
                && message.contains("mode \"upsert\" needs")
                && message.contains("mode = \"fenced\""),
            "{message}"
        );
        for (extra, key) in [
            ("mode = \"fenced\"\ncommit_log_table = \"log\"", "commit_log_table"),
            (
                "mode = \"fenced\"\ncommit_log_retention = \"1h\"",
                "commit_log_retention",
            ),
            (
                "mode = \"upsert\"\nupsert_key = [\"id\"]\nstaging_table = \"s\"",
                "staging_table",
            ),
            ("mode = \"fenced\"\nstaging_table = \"s\"", "staging_table"),
            ("positions_table = \"p\"", "positions_table"),
            (
                "mode = \"upsert\"\nupsert_key = [\"id\"]\npositions_table = \"p\"",
                "positions_table",
            ),
        ] {
            let message = fatal_message(with(extra).validate());
            assert!(
                message.contains(&format!("sink.postgres.{key}: is used only by mode"))
                    && message.contains(&format!("remove `{key}`")),
                "{extra}: {message}"
            );
        }
        let message = fatal_message(with("mode = \"fenced\"\npositions_table = \"sales.orders\"").validate());
        assert!(
            message.contains("sink.postgres.positions_table: names the same table as `table`"),
            "{message}"
        );
        // Tables a mode does not use may share names.
        with("mode = \"upsert\"\nupsert_key = [\"id\"]\ndead_letter_table = \"exactly_commit_log\"")
            .validate()
            .unwrap();
    }
}
