//! Keys, deletes and rows the sink cannot write: `pk.mode` / `pk.fields`
//! and `delete.enabled` (Kafka Connect's JDBC sink's names), `on_tombstone`
//! and `on_rejected_row`.
//!
//! ```toml
//! [sink.postgres]
//! mode = "upsert"
//! pk.mode = "record_key"       # none (default), kafka, record_key, record_value
//! pk.fields = ["id"]
//! delete.enabled = true        # a tombstone deletes the row of its key
//! on_rejected_row = "dead-letter"
//!
//! [sink.postgres.columns]
//! id = { type = "bigint" }     # from the record key: pk.mode says so
//! customer = { from = "/customer", type = "text" }
//! ```
//!
//! [`resolve`] turns them into the columns the sink writes (every source
//! known), the key columns and what a tombstone does.

use std::collections::HashSet;

use exactly_core::{ConnectorError, JsonPointer};
use serde::Deserialize;

use super::columns::{Column, ColumnConfig, ColumnType, FieldSource};
use super::{invalid, PostgresSinkConfig};

/// The key columns `pk.mode = "kafka"` writes when `pk.fields` does not
/// name them: Kafka Connect's names.
pub const KAFKA_PK_FIELDS: [&str; 3] = ["__connect_topic", "__connect_partition", "__connect_offset"];

/// `pk`: where the primary key comes from, written `pk.mode = "..."` and
/// `pk.fields = [...]` as in Kafka Connect's JDBC sink.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrimaryKey {
    /// Where the key's values come from.
    #[serde(default)]
    pub mode: PkMode,
    /// The key's columns, which are also the fields read from the record
    /// key (`record_key`) or value (`record_value`); for `kafka` the names
    /// of the topic, partition and offset columns.
    #[serde(default)]
    pub fields: Option<Vec<String>>,
}

/// `pk.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PkMode {
    /// `none`: no key from here (append, or `upsert_key`).
    #[default]
    None,
    /// `kafka`: the record's topic, partition and offset (an insert per
    /// record that a replay cannot repeat).
    Kafka,
    /// `record_key`: fields of the record key (a JSON object), or the whole
    /// key for a single field when it is not an object.
    RecordKey,
    /// `record_value`: fields of the record value (a JSON object).
    RecordValue,
}

impl PkMode {
    /// The name used in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            PkMode::None => "none",
            PkMode::Kafka => "kafka",
            PkMode::RecordKey => "record_key",
            PkMode::RecordValue => "record_value",
        }
    }
}

/// `delete`: what Kafka Connect calls `delete.enabled`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deletes {
    /// A tombstone (a record with a null value) deletes the row of its key.
    /// Needs a key read from the record key (`pk.mode = "record_key"`).
    #[serde(default)]
    pub enabled: bool,
}

/// `on_tombstone`: what a tombstone does when it does not delete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnTombstone {
    /// `dead-letter` (default): it goes to the dead-letter table, counted.
    #[default]
    DeadLetter,
    /// `write`: it is written like any record; value columns that allow it
    /// get NULL, required ones make it a dead letter.
    Write,
}

/// `on_rejected_row`: what happens to a row the server refuses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnRejectedRow {
    /// `fail` (default): the pipeline stops with the server's error, which
    /// names the constraint.
    #[default]
    Fail,
    /// `dead-letter`: a row that breaks a constraint or a type of the table
    /// (SQLSTATE classes 22 and 23) goes to the dead-letter table with the
    /// server's message, in the same transaction, counted; the other rows
    /// are written.
    DeadLetter,
}

impl OnRejectedRow {
    /// The name used in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            OnRejectedRow::Fail => "fail",
            OnRejectedRow::DeadLetter => "dead-letter",
        }
    }
}

/// What a tombstone (a record with a null value) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tombstones {
    /// It is a dead letter.
    DeadLetter,
    /// It is written like any record.
    Write,
    /// It deletes the row of its key.
    Delete,
}

/// The columns the sink writes, which of them are the key, and what a
/// tombstone does.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// Every column with its source, in order (`pk.mode = "kafka"` adds
    /// its columns at the end when they are not configured).
    pub columns: Vec<(String, Column)>,
    /// Indexes of the key columns in `columns`.
    pub key: Option<Vec<usize>>,
    pub tombstones: Tombstones,
}

/// Resolves `pk`, `upsert_key`, `delete` and `on_tombstone` against the
/// configured columns. Errors name the key and the fix.
pub(super) fn resolve(config: &PostgresSinkConfig) -> Result<Resolved, ConnectorError> {
    let pk = &config.pk;
    if pk.mode == PkMode::None && pk.fields.is_some() {
        return Err(invalid(
            "pk.fields",
            "is set while pk.mode is \"none\"",
            "set pk.mode = \"record_key\", \"record_value\" or \"kafka\", or remove pk.fields",
        ));
    }
    if pk.mode != PkMode::None && config.upsert_key.is_some() {
        return Err(invalid(
            "upsert_key",
            format!("and pk.mode = \"{}\" both name the key", pk.mode.as_str()),
            "keep one: pk.mode and pk.fields (Kafka Connect's names), or upsert_key",
        ));
    }
    let implied = implied_sources(pk)?;
    let mut columns = Vec::with_capacity(config.columns.0.len() + 3);
    for (name, column) in &config.columns.0 {
        let implied = implied.iter().find(|(field, _, _)| field == name);
        columns.push((
            name.clone(),
            resolved_column(name, column, implied.map(|(_, from, _)| from), pk)?,
        ));
    }
    let mut names = Vec::new();
    for (field, from, ty) in &implied {
        names.push(field.clone());
        if columns.iter().any(|(name, _)| name == field) {
            continue;
        }
        let Some(ty) = ty else {
            return Err(invalid(
                &format!("columns.{field}"),
                format!(
                    "pk.fields names `{field}`, which is not a column: its type is not known (a {} field has none)",
                    if pk.mode == PkMode::RecordKey {
                        "record key"
                    } else {
                        "record value"
                    }
                ),
                format!("add it with its type, such as `{field} = {{ type = \"bigint\" }}` in sink.postgres.columns"),
            ));
        };
        columns.push((
            field.clone(),
            Column {
                from: from.clone(),
                column_type: *ty,
                required: true,
            },
        ));
    }
    let key = match (pk.mode, &config.upsert_key) {
        (PkMode::None, None) => None,
        (PkMode::None, Some(key)) => Some(key_indexes("upsert_key", key, &columns)?),
        (_, _) => Some(key_indexes("pk.fields", &names, &columns)?),
    };
    let tombstones = tombstones(config, &columns, key.as_deref())?;
    Ok(Resolved {
        columns,
        key,
        tombstones,
    })
}

/// `(field, source, type when pk.mode knows it)` of every key column
/// `pk` implies.
fn implied_sources(pk: &PrimaryKey) -> Result<Vec<(String, FieldSource, Option<ColumnType>)>, ConnectorError> {
    let named = |mode: PkMode| -> Result<&Vec<String>, ConnectorError> {
        match &pk.fields {
            Some(fields) if !fields.is_empty() => Ok(fields),
            _ => Err(invalid(
                "pk.fields",
                format!(
                    "pk.mode = \"{}\" needs the key's fields, and none are named (without a schema the sink \
                     cannot list the {}'s fields)",
                    mode.as_str(),
                    if mode == PkMode::RecordKey { "key" } else { "value" }
                ),
                "name them, such as pk.fields = [\"id\"], and declare each in sink.postgres.columns with its type",
            )),
        }
    };
    let mut seen = HashSet::new();
    let implied = match pk.mode {
        PkMode::None => Vec::new(),
        PkMode::Kafka => {
            let fields: Vec<String> = match &pk.fields {
                None => KAFKA_PK_FIELDS.iter().map(|f| f.to_string()).collect(),
                Some(fields) if fields.len() == 3 => fields.clone(),
                Some(fields) => {
                    return Err(invalid(
                        "pk.fields",
                        format!("pk.mode = \"kafka\" takes three names (topic, partition, offset), not {fields:?}"),
                        format!("name three columns, or remove pk.fields for {KAFKA_PK_FIELDS:?}"),
                    ))
                }
            };
            let sources = [
                (FieldSource::Topic, ColumnType::Text),
                (FieldSource::Partition, ColumnType::Int),
                (FieldSource::Offset, ColumnType::BigInt),
            ];
            fields
                .into_iter()
                .zip(sources)
                .map(|(field, (from, ty))| (field, from, Some(ty)))
                .collect()
        }
        PkMode::RecordKey => {
            let fields = named(PkMode::RecordKey)?;
            let single = fields.len() == 1;
            fields
                .iter()
                .map(|field| {
                    let from = if single {
                        FieldSource::KeyField(field.clone())
                    } else {
                        FieldSource::KeyPointer(pointer_to(field))
                    };
                    (field.clone(), from, None)
                })
                .collect()
        }
        PkMode::RecordValue => named(PkMode::RecordValue)?
            .iter()
            .map(|field| (field.clone(), FieldSource::Pointer(pointer_to(field)), None))
            .collect(),
    };
    for (field, _, _) in &implied {
        if !seen.insert(field.clone()) {
            return Err(invalid(
                "pk.fields",
                format!("lists `{field}` twice"),
                "list each field once",
            ));
        }
    }
    Ok(implied)
}

/// The JSON pointer to the top-level field `name`.
fn pointer_to(name: &str) -> JsonPointer {
    let escaped = name.replace('~', "~0").replace('/', "~1");
    JsonPointer::parse(&format!("/{escaped}")).expect("an escaped field name is a valid pointer")
}

/// `column` with its source: given in `from`, or `implied` by `pk.mode`
/// for a key column (a given one must agree with the mode).
fn resolved_column(
    name: &str,
    column: &ColumnConfig,
    implied: Option<&FieldSource>,
    pk: &PrimaryKey,
) -> Result<Column, ConnectorError> {
    let from = match (&column.from, implied) {
        (Some(from), None) => from.clone(),
        (None, Some(implied)) => implied.clone(),
        (Some(from), Some(implied)) => {
            let agrees = match pk.mode {
                PkMode::Kafka => from == implied,
                PkMode::RecordKey => from.is_from_key(),
                PkMode::RecordValue => matches!(from, FieldSource::Pointer(_)),
                PkMode::None => true,
            };
            if !agrees {
                return Err(invalid(
                    &format!("columns.{name}.from"),
                    format!(
                        "`{from}` does not fit pk.mode = \"{}\", which reads this key column from {}",
                        pk.mode.as_str(),
                        match pk.mode {
                            PkMode::Kafka => "the record's topic, partition and offset",
                            PkMode::RecordKey => "the record key",
                            _ => "the record value",
                        }
                    ),
                    format!("remove `from` (pk.mode gives it: {implied}) or change pk.mode"),
                ));
            }
            from.clone()
        }
        (None, None) => {
            return Err(invalid(
                &format!("columns.{name}.from"),
                "is missing",
                format!(
                    "say where the value comes from, such as `{name} = {{ from = \"/{name}\", type = \"{}\" }}` \
                     (`from` may be left out only for a column of pk.fields)",
                    column.column_type.config_name()
                ),
            ))
        }
    };
    Ok(Column {
        from,
        column_type: column.column_type,
        required: column.required,
    })
}

/// Indexes of the key columns `names` (of setting `setting`) in `columns`.
fn key_indexes(setting: &str, names: &[String], columns: &[(String, Column)]) -> Result<Vec<usize>, ConnectorError> {
    if names.is_empty() {
        return Err(invalid(
            setting,
            "is empty",
            "name the key columns (e.g. upsert_key = [\"id\"]) or remove the key to append",
        ));
    }
    let mut seen = HashSet::new();
    let mut indexes = Vec::with_capacity(names.len());
    for name in names {
        if !seen.insert(name) {
            return Err(invalid(
                setting,
                format!("lists `{name}` twice"),
                "list each column once",
            ));
        }
        let Some(i) = columns.iter().position(|(n, _)| n == name) else {
            return Err(invalid(
                setting,
                format!("`{name}` is not a configured column"),
                format!("add `{name}` to sink.postgres.columns or remove it from the key"),
            ));
        };
        if !columns[i].1.required {
            return Err(invalid(
                &format!("columns.{name}.required"),
                "a key column must always have a value (NULL keys never match)",
                "remove `required = false` from the key column",
            ));
        }
        indexes.push(i);
    }
    Ok(indexes)
}

/// What a tombstone does: delete (`delete.enabled`, which needs a key read
/// from the record key), or `on_tombstone`.
fn tombstones(
    config: &PostgresSinkConfig,
    columns: &[(String, Column)],
    key: Option<&[usize]>,
) -> Result<Tombstones, ConnectorError> {
    if !config.delete.enabled {
        return Ok(match config.on_tombstone.unwrap_or_default() {
            OnTombstone::DeadLetter => Tombstones::DeadLetter,
            OnTombstone::Write => Tombstones::Write,
        });
    }
    if config.on_tombstone.is_some() {
        return Err(invalid(
            "on_tombstone",
            "is set while delete.enabled = true makes every tombstone a delete",
            "remove on_tombstone, or delete.enabled",
        ));
    }
    let Some(key) = key else {
        return Err(invalid(
            "delete.enabled",
            "a tombstone deletes the row of its key, and the table has no key",
            "set pk.mode = \"record_key\" and pk.fields, or remove delete.enabled",
        ));
    };
    if let Some(i) = key.iter().find(|i| !columns[**i].1.from.is_from_key()) {
        let (name, column) = &columns[*i];
        return Err(invalid(
            "delete.enabled",
            format!(
                "a tombstone has only its key, and key column `{name}` comes from `{}`",
                column.from
            ),
            "use pk.mode = \"record_key\" (or key columns from `key` / `key/...`), or remove delete.enabled",
        ));
    }
    Ok(Tombstones::Delete)
}
