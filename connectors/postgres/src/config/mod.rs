//! `[sink.postgres]`: the configuration of the PostgreSQL sink and its checks.

mod columns;
mod keys;
mod targets;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use exactly_core::ConnectorError;
use serde::{Deserialize, Deserializer};

use crate::sql::QualifiedName;

use self::columns::impossible_pairing;
pub(crate) use self::columns::Column;
pub use self::columns::{ColumnConfig, ColumnType, Columns, FieldSource};
pub(crate) use self::keys::Tombstones;
pub use self::keys::{Deletes, OnRejectedRow, OnTombstone, PkMode, PrimaryKey, KAFKA_PK_FIELDS};
pub(crate) use self::targets::{ByTopic, Targets};

/// Default name of the commit-log table (mode `two-phase`).
pub const DEFAULT_COMMIT_LOG_TABLE: &str = "exactly_commit_log";
/// Default of `commit_log_retention`.
pub(crate) const DEFAULT_COMMIT_LOG_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default name of the positions table (mode `fenced`).
pub const DEFAULT_POSITIONS_TABLE: &str = "exactly_positions";
/// Suffix of the default dead-letter table name (`<table>_dead_letters`).
pub const DEAD_LETTER_SUFFIX: &str = "_dead_letters";
/// Suffix of the default upsert staging table name (`<table>_exactly_staging`).
pub const STAGING_SUFFIX: &str = "_exactly_staging";
/// Column names the staging table reserves for itself.
pub(crate) const RESERVED_COLUMNS: [&str; 7] = [
    "exactly_gid",
    "exactly_seq",
    "exactly_delete",
    "exactly_split",
    "exactly_offset",
    "exactly_key",
    "exactly_value",
];

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
    /// `${topic}` in it is replaced by each record's topic (`"${topic}"`,
    /// `"raw_${topic}"`, `"sales.${topic}"`): one table per topic. May be
    /// left out when `tables` names the table of every topic.
    #[serde(default)]
    pub table: String,
    /// Topic → table, for topics whose table is not what `table` makes of
    /// them: `tables = { orders = "sales.orders" }`. Topics not in it go to
    /// `table`.
    #[serde(default)]
    pub tables: BTreeMap<String, String>,
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
    /// `pk.mode` and `pk.fields`: the primary key from the record key, the
    /// record value or the Kafka coordinates, as Kafka Connect's JDBC sink
    /// names it (rows are then upserted on it, as with `upsert_key`).
    #[serde(default)]
    pub pk: PrimaryKey,
    /// `delete.enabled`: a tombstone (a null value) deletes the row of its
    /// key. Needs the key from the record key.
    #[serde(default)]
    pub delete: Deletes,
    /// What a tombstone does when it does not delete: `"dead-letter"`
    /// (default) or `"write"` (a row with NULL value columns).
    #[serde(default)]
    pub on_tombstone: Option<OnTombstone>,
    /// What happens to a row the server refuses (a constraint or a type of
    /// the table): `"fail"` (default, the pipeline stops with the error) or
    /// `"dead-letter"`.
    #[serde(default)]
    pub on_rejected_row: OnRejectedRow,
    /// How record values are read: `"json"` (default: the columns' JSON
    /// pointers read the value) or `"debezium"` (Debezium change events:
    /// `c`/`r`/`u` upsert their `after` row, `d` deletes the row of the key,
    /// the tombstone after a delete is skipped; see [`Format`]).
    #[serde(default)]
    pub format: Format,
    /// `format = "avro"`: the Confluent-compatible schema registry the
    /// writer schemas come from (see [`RegistryConfig`]).
    #[serde(default)]
    pub registry: Option<RegistryConfig>,
    /// What a record whose schema (Connect JSON, Avro, Debezium with the
    /// schema wrapper) has fields no column takes does: `"none"` (default:
    /// they are not written) or `"add-columns"` (see [`SchemaEvolution`]).
    #[serde(default)]
    pub schema_evolution: SchemaEvolution,
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
            .field("url", &crate::url::redact_url(&self.url))
            .field("table", &self.table)
            .field("tables", &self.tables)
            .field("create_table", &self.create_table)
            .field("columns", &self.columns)
            .field("mode", &self.mode)
            .field("upsert_key", &self.upsert_key)
            .field("pk", &self.pk)
            .field("delete", &self.delete)
            .field("on_tombstone", &self.on_tombstone)
            .field("on_rejected_row", &self.on_rejected_row)
            .field("format", &self.format)
            .field("registry", &self.registry)
            .field("schema_evolution", &self.schema_evolution)
            .field("dead_letter_table", &self.dead_letter_table)
            .field("commit_log_table", &self.commit_log_table)
            .field("commit_log_retention", &self.commit_log_retention)
            .field("staging_table", &self.staging_table)
            .field("positions_table", &self.positions_table)
            .finish()
    }
}

/// How record values are read (`format = "..."`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// `json`: the columns' JSON pointers read the value as it is.
    #[default]
    Json,
    /// `debezium`: Debezium change events (JSON, with or without Kafka
    /// Connect's schema wrapper on key and value): `c`, `r` and `u` upsert
    /// the `after` row (the columns' pointers read it), `d` deletes the row
    /// of the event's key, the tombstone after a delete is skipped; an
    /// event of another `op` or a value that is no event is a dead letter.
    /// Needs mode `two-phase`, `pk.mode = "record_key"` and
    /// `delete.enabled = true`.
    Debezium,
    /// `connect-json`: Kafka Connect's JSON with schemas (`{"schema": …,
    /// "payload": …}`, the JsonConverter with `schemas.enable=true`): the
    /// columns' pointers read the payload, with values of logical types
    /// (Decimal, Date, Time, Timestamp) rendered as text PostgreSQL reads; a
    /// null payload is a tombstone; a value without the wrapper is a dead
    /// letter. Mode `two-phase`.
    ConnectJson,
    /// `avro`: Avro in the Confluent wire format (magic byte 0, the schema
    /// id, the datum), the writer schema fetched by id from `registry`
    /// (cached): the columns' pointers read the record, with logical types
    /// (decimal, uuid, date, time and timestamp millis/micros) rendered as
    /// text PostgreSQL reads, nested records, arrays and maps as JSON. A
    /// value of another framing is a dead letter. Mode `two-phase`.
    Avro,
}

/// `[sink.postgres.registry]`: a Confluent-compatible schema registry
/// (Confluent Schema Registry, Apicurio's `/apis/ccompat/v7`, Redpanda,
/// Karapace).
///
/// ```toml
/// [sink.postgres.registry]
/// url = "https://registry.example.com:8081"
/// username = "exactly"
/// password = { env = "REGISTRY_PASSWORD" }
/// ca_file = "/etc/exactly/registry-ca.pem"
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// The base URL of the Confluent-compatible API (`http://` or
    /// `https://`).
    pub url: String,
    /// HTTP basic auth user.
    #[serde(default)]
    pub username: Option<String>,
    /// HTTP basic auth password (shown nowhere).
    #[serde(default)]
    pub password: Option<String>,
    /// PEM file of the CAs that sign the registry's certificate (default:
    /// the system's roots).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
}

impl fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("url", &exactly_formats::registry::redact(&self.url))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// What the sink does with fields of a record's schema that no column
/// takes (`schema_evolution = "..."`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchemaEvolution {
    /// `none`: they are not written.
    #[default]
    None,
    /// `add-columns`: a new optional field (or one with a default) gets a
    /// nullable column of its type, added with `ALTER TABLE … ADD COLUMN`
    /// in the transaction of the rows, and is written from then on (also
    /// into the staging table, with a key). Any other change — a field whose
    /// type no longer fits its column, a field a required column reads
    /// gone, a new required field — stops the pipeline with an error naming
    /// the field and the fix. Needs mode `two-phase` and a format with
    /// schemas (`connect-json`, `avro`, or `debezium` with the schema
    /// wrapper).
    AddColumns,
}

impl SchemaEvolution {
    /// The name used in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            SchemaEvolution::None => "none",
            SchemaEvolution::AddColumns => "add-columns",
        }
    }
}

impl Format {
    /// The name used in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Debezium => "debezium",
            Format::ConnectJson => "connect-json",
            Format::Avro => "avro",
        }
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
    pub tls: crate::url::TlsSettings,
    /// The URL without its password, for messages.
    pub url: String,
    /// The table as configured (used in gids, markers and messages); with
    /// only `tables`, `tables`.
    pub table_label: String,
    /// The target table ([`Targets::One`]; a template otherwise, see
    /// [`Settings::for_table`]).
    pub table: QualifiedName,
    /// One table, or one per topic.
    pub targets: Targets,
    pub create_table: bool,
    /// Every column with its source (`pk.mode = "kafka"` may add some).
    pub columns: Vec<(String, Column)>,
    /// The key rows are upserted on (`upsert_key` or `pk`): indexes into
    /// `columns`.
    pub upsert_key: Option<Vec<usize>>,
    /// What a tombstone does.
    pub tombstones: Tombstones,
    /// What happens to a row the server refuses.
    pub on_rejected_row: OnRejectedRow,
    /// How record values are read.
    pub format: Format,
    /// `format = "avro"`: where writer schemas come from.
    pub registry: Option<std::sync::Arc<exactly_formats::registry::RegistryClient>>,
    /// `schema_evolution = "add-columns"`.
    pub add_columns: bool,
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

impl Settings {
    /// The settings of target `table` of a sink with a table per topic: its
    /// dead-letter table (`<table>_dead_letters` unless `dead_letter_table`
    /// names one) and staging table (`<table>_exactly_staging`).
    pub(crate) fn for_table(&self, table: QualifiedName) -> Settings {
        let mut settings = self.clone();
        let explicit = match &self.targets {
            Targets::ByTopic(targets) => targets.dead_letters.clone(),
            Targets::One => Some(self.dead_letters.clone()),
        };
        settings.dead_letters = explicit.unwrap_or_else(|| table.with_suffix(DEAD_LETTER_SUFFIX));
        settings.staging = table.with_suffix(STAGING_SUFFIX);
        settings.table = table;
        settings
    }
}

impl PostgresSinkConfig {
    /// A configuration with every optional key at its default and no columns.
    pub fn new(url: impl Into<String>, table: impl Into<String>) -> Self {
        PostgresSinkConfig {
            url: url.into(),
            table: table.into(),
            tables: BTreeMap::new(),
            create_table: false,
            columns: Columns::default(),
            mode: SinkMode::default(),
            upsert_key: None,
            pk: PrimaryKey::default(),
            delete: Deletes::default(),
            on_tombstone: None,
            on_rejected_row: OnRejectedRow::default(),
            format: Format::default(),
            registry: None,
            schema_evolution: SchemaEvolution::default(),
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
        let (mut pg, tls) = crate::url::parse(&self.url).map_err(|e| {
            invalid(
                "url",
                format!("cannot parse the connection string: {e}"),
                "use postgres://USER@HOST:PORT/DATABASE?sslmode=verify-full&sslrootcert=CA.pem",
            )
            .caused_by(e)
        })?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(std::time::Duration::from_secs(10));
        }
        let table = self.parse_table()?;
        self.check_column_names()?;
        let keys::Resolved {
            columns,
            key: upsert_key,
            tombstones,
        } = keys::resolve(self)?;
        check_pairings(&columns)?;
        self.check_mode_keys(upsert_key.is_some())?;
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
        let targets = self.targets(&table, &commit_log, upsert_key.is_some())?;
        // The tables this mode uses must be distinct.
        let mut names = vec![("table", &table), ("dead_letter_table", &dead_letters)];
        if targets != Targets::One {
            // The tables of topics are checked as they are resolved (see
            // `ByTopic::resolve`), and so is a default dead-letter table.
            names.retain(|(key, _)| *key == "dead_letter_table" && self.dead_letter_table.is_some());
        }
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
            url: crate::url::describe_url(&pg),
            pg,
            tls,
            table_label: if self.table.is_empty() {
                "tables".to_string()
            } else {
                self.table.clone()
            },
            table,
            targets,
            create_table: self.create_table,
            columns,
            upsert_key,
            tombstones,
            on_rejected_row: self.on_rejected_row,
            format: self.checked_format(tombstones)?,
            registry: self.registry_client()?,
            add_columns: self.checked_evolution()?,
            mode: self.mode,
            dead_letters,
            commit_log,
            commit_log_retention: self.checked_retention()?,
            staging,
            positions,
        })
    }

    /// `table`, a name or a template with `${topic}`; with only `tables`, a
    /// stand-in never written to.
    fn parse_table(&self) -> Result<QualifiedName, ConnectorError> {
        if self.table.is_empty() && !self.tables.is_empty() {
            return Ok(QualifiedName {
                schema: None,
                name: "tables".into(),
            });
        }
        if let Some(placeholder) = targets::unknown_placeholder(&self.table) {
            return Err(invalid(
                "table",
                format!(
                    "`{placeholder}` in `{}` is not a placeholder the sink knows",
                    self.table
                ),
                "write `${topic}` for the record's topic",
            ));
        }
        parse_name("table", &self.table)
    }

    /// One table, or one per topic (`${topic}` in `table`, or `tables`).
    /// Per topic: only in mode `two-phase`, without `staging_table`, and
    /// no table of the map is one of the sink's own.
    fn targets(
        &self,
        table: &QualifiedName,
        commit_log: &QualifiedName,
        keyed: bool,
    ) -> Result<Targets, ConnectorError> {
        let templated = self.table.contains(targets::TOPIC_PLACEHOLDER);
        if !templated && self.tables.is_empty() {
            return Ok(Targets::One);
        }
        let key = if templated { "table" } else { "tables" };
        if self.mode != SinkMode::TwoPhase {
            return Err(invalid(
                key,
                format!(
                    "a table per topic needs mode \"two-phase\" (all tables of an interval in one prepared \
                     transaction), and mode is \"{}\"",
                    self.mode.as_str()
                ),
                "set mode = \"two-phase\", or one fixed table",
            ));
        }
        if self.staging_table.is_some() {
            return Err(invalid(
                "staging_table",
                "one staging table cannot serve a table per topic",
                "remove it: each table gets `<table>_exactly_staging`",
            ));
        }
        let mut reserved = vec![commit_log.clone()];
        let dead_letters = match &self.dead_letter_table {
            Some(name) => Some(parse_name("dead_letter_table", name)?),
            None => None,
        };
        reserved.extend(dead_letters.clone());
        let mut map = BTreeMap::new();
        for (topic, name) in &self.tables {
            let key = format!("tables.{topic}");
            if name.contains("${") {
                return Err(invalid(
                    &key,
                    "a table of the map is a name, not a template",
                    "write the table's name",
                ));
            }
            let parsed = parse_name(&key, name)?;
            if reserved.contains(&parsed) {
                return Err(invalid(
                    &key,
                    format!("names the sink's own table {parsed}"),
                    "give it another table",
                ));
            }
            map.insert(topic.clone(), parsed);
        }
        let mut suffixes = Vec::new();
        if self.dead_letter_table.is_none() {
            suffixes.push(DEAD_LETTER_SUFFIX);
        }
        if keyed {
            suffixes.push(STAGING_SUFFIX);
        }
        Ok(Targets::ByTopic(ByTopic {
            map,
            template: (!self.table.is_empty()).then(|| table.clone()),
            reserved,
            dead_letters,
            suffixes,
        }))
    }

    /// `format = "avro"` needs `registry`, which no other format takes.
    fn registry_client(
        &self,
    ) -> Result<Option<std::sync::Arc<exactly_formats::registry::RegistryClient>>, ConnectorError> {
        match (&self.registry, self.format) {
            (None, Format::Avro) => Err(invalid(
                "registry",
                "format \"avro\" fetches writer schemas from a schema registry, and none is set",
                "add [sink.postgres.registry] with url = \"http://HOST:PORT\" (the Confluent-compatible API)",
            )),
            (Some(_), format) if format != Format::Avro => Err(invalid(
                "registry",
                format!(
                    "only format \"avro\" uses a schema registry, and format is \"{}\"",
                    format.as_str()
                ),
                "remove [sink.postgres.registry], or set format = \"avro\"",
            )),
            (Some(registry), _) => {
                let settings = exactly_formats::registry::RegistrySettings {
                    url: registry.url.clone(),
                    username: registry.username.clone(),
                    password: registry.password.clone(),
                    ca_file: registry.ca_file.clone(),
                };
                let client = exactly_formats::registry::RegistryClient::new(&settings)
                    .map_err(|e| ConnectorError::fatal("postgres sink configuration", format!("sink.postgres.{e}")))?;
                Ok(Some(std::sync::Arc::new(client)))
            }
            (None, _) => Ok(None),
        }
    }

    /// `schema_evolution = "add-columns"` needs mode `two-phase` and a
    /// format with schemas.
    fn checked_evolution(&self) -> Result<bool, ConnectorError> {
        if self.schema_evolution == SchemaEvolution::None {
            return Ok(false);
        }
        if self.format == Format::Json {
            return Err(invalid(
                "schema_evolution",
                "format \"json\" has no schemas to follow",
                "set format = \"connect-json\", \"avro\" or \"debezium\", or remove schema_evolution",
            ));
        }
        if self.mode != SinkMode::TwoPhase {
            return Err(invalid(
                "schema_evolution",
                format!(
                    "\"add-columns\" needs mode \"two-phase\" (the columns are added in the transaction of the \
                     rows), and mode is \"{}\"",
                    self.mode.as_str()
                ),
                "set mode = \"two-phase\"",
            ));
        }
        Ok(true)
    }

    /// `format = "debezium"` needs mode `two-phase` and deletes by the
    /// record key (`pk.mode = "record_key"`, `delete.enabled = true`);
    /// `connect-json` and `avro` need mode `two-phase`.
    fn checked_format(&self, tombstones: Tombstones) -> Result<Format, ConnectorError> {
        if matches!(self.format, Format::ConnectJson | Format::Avro) && self.mode != SinkMode::TwoPhase {
            return Err(invalid(
                "format",
                format!(
                    "\"{}\" needs mode \"two-phase\", and mode is \"{}\"",
                    self.format.as_str(),
                    self.mode.as_str()
                ),
                "set mode = \"two-phase\"",
            ));
        }
        if self.format != Format::Debezium {
            return Ok(self.format);
        }
        if self.mode != SinkMode::TwoPhase {
            return Err(invalid(
                "format",
                format!(
                    "\"debezium\" needs mode \"two-phase\", and mode is \"{}\"",
                    self.mode.as_str()
                ),
                "set mode = \"two-phase\"",
            ));
        }
        if tombstones != Tombstones::Delete {
            return Err(invalid(
                "format",
                "\"debezium\" applies deletes by the event's key, and tombstones do not delete",
                "set pk.mode = \"record_key\", pk.fields = [the table's key columns] and delete.enabled = true",
            ));
        }
        Ok(self.format)
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

    /// Keys that only some modes use, and the key mode `upsert` needs
    /// (`keyed`: `upsert_key` or `pk` gives one).
    fn check_mode_keys(&self, keyed: bool) -> Result<(), ConnectorError> {
        let mode = self.mode.as_str();
        if self.mode == SinkMode::Upsert && !keyed {
            return Err(invalid(
                "upsert_key",
                "mode \"upsert\" needs the columns to upsert on, and none are set",
                "set upsert_key = [\"id\"] or pk.mode and pk.fields (columns with a unique index or primary key); \
                 for an append-only table without a unique key use mode = \"fenced\"",
            ));
        }
        if self.mode != SinkMode::TwoPhase {
            let arrays = self
                .columns
                .0
                .iter()
                .find(|(_, c)| matches!(c.column_type, ColumnType::TextArray | ColumnType::BigIntArray));
            if let Some((name, column)) = arrays {
                return Err(invalid(
                    "columns",
                    format!(
                        "column `{name}` is of type {}, which mode \"{mode}\" cannot write: it sends a batch as one \
                         array per column, and an array of arrays is not one",
                        column.column_type.config_name()
                    ),
                    "use mode = \"two-phase\" (it writes by COPY), or type = \"jsonb\" for the array",
                ));
            }
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
                self.staging_table.is_some() && (keyed || self.mode != SinkMode::TwoPhase),
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

    /// Column names: at least one, none empty or reserved.
    fn check_column_names(&self) -> Result<(), ConnectorError> {
        if self.columns.0.is_empty() {
            return Err(invalid(
                "columns",
                "no column is configured",
                "add a table such as `columns = { id = { from = \"/id\", type = \"bigint\" } }`",
            ));
        }
        for (name, _) in &self.columns.0 {
            if name.is_empty() || name.contains('\0') {
                return Err(invalid(
                    "columns",
                    "a column name is empty or contains NUL",
                    "rename the column",
                ));
            }
            if RESERVED_COLUMNS.contains(&name.as_str()) {
                return Err(invalid(
                    &format!("columns.{name}"),
                    format!("`{name}` is reserved for the sink's staging table"),
                    "rename the column",
                ));
            }
        }
        Ok(())
    }

    /// The settings that affect the sink's state, as part of the pipeline
    /// fingerprint: `postgres:table=...,columns=...,mode=...` plus the upsert
    /// key (or `pk` and `delete`, when set), and the commit-log table (mode
    /// `two-phase`) or the positions table (mode `fenced`).
    pub fn identity(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .0
            .iter()
            .map(|(name, c)| {
                format!(
                    "{name}={}:{}{}",
                    c.from
                        .as_ref()
                        .map_or_else(|| "pk".to_string(), |from| from.to_string()),
                    c.column_type.config_name(),
                    if c.required { "" } else { "?" }
                )
            })
            .collect();
        let mut identity = format!("postgres:table={}", self.table);
        if !self.tables.is_empty() {
            let map: Vec<String> = self
                .tables
                .iter()
                .map(|(topic, table)| format!("{topic}={table}"))
                .collect();
            identity.push_str(&format!(",tables={{{}}}", map.join(";")));
        }
        identity.push_str(&format!(",columns=[{}],mode={}", columns.join(";"), self.mode.as_str()));
        if let Some(key) = &self.upsert_key {
            identity.push_str(&format!(",upsert_key={}", key.join("+")));
        }
        if self.pk.mode != PkMode::None {
            identity.push_str(&format!(",pk={}", self.pk.mode.as_str()));
            if let Some(fields) = &self.pk.fields {
                identity.push_str(&format!(":{}", fields.join("+")));
            }
        }
        if self.delete.enabled {
            identity.push_str(",delete");
        }
        if self.format != Format::Json {
            identity.push_str(&format!(",format={}", self.format.as_str()));
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

/// Checks that every column's source can fill its type.
fn check_pairings(columns: &[(String, Column)]) -> Result<(), ConnectorError> {
    for (name, column) in columns {
        if let Some(why) = impossible_pairing(&column.from, column.column_type) {
            return Err(invalid(
                &format!("columns.{name}.type"),
                format!(
                    "`{}` cannot be filled from `{}`: {why}",
                    column.column_type.config_name(),
                    column.from
                ),
                "change `type` or `from`",
            ));
        }
    }
    Ok(())
}

fn de_some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    exactly_core::duration::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use exactly_core::JsonPointer;

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
            Some(FieldSource::Pointer(JsonPointer::parse("/id").unwrap()))
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
        let no_header = BASE.replace("\"/id\"", "\"header/\"");
        assert!(parse(&no_header).unwrap_err().contains("write header/<name>"));
        let header = parse(&BASE.replace("\"/id\"", "\"header/trace-id\"")).unwrap();
        assert!(
            header.identity().contains("id=header/trace-id:bigint"),
            "{}",
            header.identity()
        );
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
    fn array_columns_are_for_mode_two_phase_and_the_error_says_why_and_what_to_use() {
        let with_tags = |mode: &str| {
            parse(&format!(
                "{BASE}tags = {{ from = \"/tags\", type = \"text[]\" }}\n",
                BASE = BASE.replace("table = ", &format!("{mode}\ntable = "))
            ))
            .unwrap()
        };
        with_tags("").validate().expect("two-phase writes arrays by COPY");
        for mode in ["mode = \"upsert\"\nupsert_key = [\"id\"]", "mode = \"fenced\""] {
            let message = fatal_message(with_tags(mode).validate());
            assert!(
                message.contains("column `tags` is of type text[]")
                    && message.contains("mode = \"two-phase\"")
                    && message.contains("jsonb"),
                "{message}"
            );
        }
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
    fn a_table_per_topic_from_a_template_or_a_map() {
        let config = with("").clone();
        assert_eq!(config.settings().unwrap().targets, Targets::One);
        let mut config = parse(&BASE.replace("table = \"sales.orders\"", "table = \"sales.${topic}\"")).unwrap();
        let settings = config.settings().unwrap();
        let Targets::ByTopic(targets) = &settings.targets else {
            panic!("{:?}", settings.targets)
        };
        let orders = targets.resolve("orders").unwrap();
        assert_eq!(orders.sql(), "\"sales\".\"orders\"");
        let one = settings.for_table(orders);
        assert_eq!(one.dead_letters.to_string(), "sales.orders_dead_letters");
        assert_eq!(one.staging.to_string(), "sales.orders_exactly_staging");
        assert_eq!(one.table_label, "sales.${topic}");
        config.tables.insert("payments".into(), "billing.payments".into());
        assert!(
            config
                .identity()
                .starts_with("postgres:table=sales.${topic},tables={payments=billing.payments},columns="),
            "{}",
            config.identity()
        );
        let Targets::ByTopic(targets) = config.settings().unwrap().targets else {
            panic!()
        };
        assert_eq!(targets.resolve("payments").unwrap().to_string(), "billing.payments");

        // Only a map: the topics outside it have no table.
        config.table = String::new();
        let settings = config.settings().unwrap();
        assert_eq!(settings.table_label, "tables");
        let Targets::ByTopic(targets) = &settings.targets else {
            panic!()
        };
        assert!(targets.resolve("orders").is_err());
        assert!(config
            .identity()
            .starts_with("postgres:table=,tables={payments=billing.payments},"));
    }

    #[test]
    fn format_debezium_needs_two_phase_and_deletes_by_the_record_key() {
        let keyed = "pk.mode = \"record_key\"\npk.fields = [\"id\"]\ndelete.enabled = true\nformat = \"debezium\"";
        let text = BASE
            .replace(
                "table = \"sales.orders\"",
                &format!("table = \"sales.orders\"\n{keyed}"),
            )
            .replace(
                "id = { from = \"/id\", type = \"bigint\" }",
                "id = { type = \"bigint\" }",
            );
        let config = parse(&text).unwrap();
        assert_eq!(config.settings().unwrap().format, Format::Debezium);
        assert!(
            config.identity().contains(",delete,format=debezium,"),
            "{}",
            config.identity()
        );
        let message = fatal_message(parse(&text.replace("delete.enabled = true\n", "")).unwrap().validate());
        assert!(
            message.contains("sink.postgres.format") && message.contains("delete.enabled = true"),
            "{message}"
        );
        let fenced = parse(&text.replace("format = ", "mode = \"fenced\"\nformat = ")).unwrap();
        let message = fatal_message(fenced.validate());
        assert!(
            message.contains("sink.postgres.format") && message.contains("two-phase"),
            "{message}"
        );
        assert!(parse(&text.replace("\"debezium\"", "\"protobuf\"")).is_err());
    }

    #[test]
    fn avro_needs_a_registry_and_evolution_a_format_with_schemas() {
        let base = "[sink.postgres]\nurl = \"postgres://u@h/db\"\ntable = \"t\"\n\
                    columns = { id = { from = \"/id\", type = \"bigint\" } }\n";
        let avro = parse(&format!("{base}format = \"avro\"")).unwrap();
        let message = fatal_message(avro.validate());
        assert!(message.contains("sink.postgres.registry"), "{message}");
        let with_registry = format!(
            "{base}format = \"avro\"\nschema_evolution = \"add-columns\"\n[sink.postgres.registry]\nurl = \
             \"https://reader:pw-in-url@registry:8081\"\nusername = \"u\"\npassword = \"registry-secret\""
        );
        let config = parse(&with_registry).unwrap();
        config.validate().unwrap();
        let settings = config.settings().unwrap();
        assert!(settings.add_columns && settings.registry.is_some());
        let shown = format!("{config:?} {settings:?}");
        assert!(
            !shown.contains("registry-secret") && !shown.contains("pw-in-url"),
            "{shown}"
        );
        assert!(!config.identity().contains("schema_evolution"), "{}", config.identity());
        let json_registry = parse(&with_registry.replace("\"avro\"", "\"connect-json\"")).unwrap();
        assert!(fatal_message(json_registry.validate()).contains("only format \"avro\""));
        let plain = parse(&format!("{base}schema_evolution = \"add-columns\"")).unwrap();
        assert!(fatal_message(plain.validate()).contains("sink.postgres.schema_evolution"));
        let fenced = parse(&format!(
            "{base}mode = \"fenced\"\nformat = \"connect-json\"\nschema_evolution = \"add-columns\""
        ))
        .unwrap();
        assert!(fatal_message(fenced.validate()).contains("two-phase"));
        let bad_ca = parse(&format!(
            "{base}format = \"avro\"\n[sink.postgres.registry]\nurl = \"https://r:1\"\nca_file = \"/nonexistent/ca.pem\""
        ))
        .unwrap();
        assert!(fatal_message(bad_ca.validate()).contains("sink.postgres.registry.ca_file"));
    }

    #[test]
    fn a_table_per_topic_is_checked() {
        let templated = |extra: &str| {
            let text = BASE.replace("table = \"sales.orders\"", &format!("table = \"${{topic}}\"\n{extra}"));
            parse(&text).unwrap()
        };
        templated("").validate().unwrap();
        for (extra, key, words) in [
            (
                "mode = \"upsert\"\nupsert_key = [\"id\"]",
                "table",
                "needs mode \"two-phase\"",
            ),
            ("mode = \"fenced\"", "table", "needs mode \"two-phase\""),
            (
                "upsert_key = [\"id\"]\nstaging_table = \"s\"",
                "staging_table",
                "one staging table",
            ),
            ("tables = { a = \"x_${topic}\" }", "tables.a", "not a template"),
            (
                "tables = { a = \"exactly_commit_log\" }",
                "tables.a",
                "the sink's own table",
            ),
            ("tables = { a = \"a.b.c\" }", "tables.a", "is not a table name"),
        ] {
            let message = fatal_message(templated(extra).validate());
            assert!(
                message.contains(&format!("sink.postgres.{key}:")) && message.contains(words),
                "{extra}: {message}"
            );
        }
        let typo = parse(&BASE.replace("table = \"sales.orders\"", "table = \"${topics}\"")).unwrap();
        let message = fatal_message(typo.validate());
        assert!(message.contains("`${topics}`"), "{message}");
        // No table and no map.
        let mut config = parse(BASE).unwrap();
        config.table = String::new();
        assert!(fatal_message(config.validate()).contains("sink.postgres.table"));
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
