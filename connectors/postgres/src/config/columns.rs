//! `[sink.postgres.columns]`: each column's source in the record and its
//! type.

use std::fmt;
use std::str::FromStr;

use exactly_core::JsonPointer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

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
    /// Where the value comes from. Left out only for a column of
    /// `pk.fields`, whose source `pk.mode` gives.
    #[serde(default)]
    pub from: Option<FieldSource>,
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
            from: Some(from),
            column_type,
            required: true,
        }
    }
}

/// A column as the sink writes it: [`ColumnConfig`] with its source known
/// (given, or implied by `pk.mode`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Column {
    /// Where the value comes from.
    pub from: FieldSource,
    /// The column's PostgreSQL type.
    pub column_type: ColumnType,
    /// See [`ColumnConfig::required`].
    pub required: bool,
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
    /// `key/a/b`: a JSON pointer (RFC 6901) into the key parsed as JSON.
    KeyPointer(JsonPointer),
    /// The key column `<name>` of `pk.mode = "record_key"` with one field
    /// (not written in `from`): the field of that name when the key is a
    /// JSON object, else the whole key (a JSON number or string as its
    /// value, other bytes as they are), as Kafka Connect takes a primitive
    /// key.
    KeyField(String),
    /// `timestamp`: the record's time, Unix milliseconds (missing when unknown).
    Timestamp,
    /// `headers`: a JSON object of the headers (see the crate documentation).
    Headers,
    /// `header/<name>`: the bytes of the record's last header named
    /// `<name>` (Kafka allows several), read like a key or value: text, an
    /// integer, JSON, … as the column's type says; NULL for a null header,
    /// missing when there is none of that name.
    Header(String),
    /// `value`: the raw value bytes.
    Value,
    /// `/a/b`: a JSON pointer (RFC 6901) into the value parsed as JSON.
    Pointer(JsonPointer),
}

const SOURCE_NAMES: &str =
    "topic, partition, offset, key, timestamp, headers, header/<name>, value, a JSON pointer such as /id, or one into \
     the key such as key/id";

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
            p if p.starts_with("header/") => match &p["header/".len()..] {
                "" => return Err("`header/` names no header: write header/<name>, e.g. header/trace-id".into()),
                name => FieldSource::Header(name.to_string()),
            },
            p if p.starts_with("key/") => {
                FieldSource::KeyPointer(JsonPointer::parse(&p["key".len()..]).map_err(|e| e.to_string())?)
            }
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
        match self {
            FieldSource::KeyPointer(p) => return write!(f, "key{}", p.as_str()),
            FieldSource::KeyField(name) => return write!(f, "key (field {name:?} of a JSON object, or the whole key)"),
            FieldSource::Header(name) => return write!(f, "header/{name}"),
            _ => {}
        }
        f.write_str(match self {
            FieldSource::Topic => "topic",
            FieldSource::Partition => "partition",
            FieldSource::Offset => "offset",
            FieldSource::Key => "key",
            FieldSource::Timestamp => "timestamp",
            FieldSource::Headers => "headers",
            FieldSource::Value => "value",
            FieldSource::Pointer(p) => p.as_str(),
            FieldSource::KeyPointer(_) | FieldSource::KeyField(_) | FieldSource::Header(_) => {
                unreachable!("written above")
            }
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
    /// `uuid`: from text in the usual 8-4-4-4-12 hex form (any case, with
    /// or without hyphens or braces).
    #[serde(rename = "uuid")]
    Uuid,
    /// `date`: from `YYYY-MM-DD` text (as Avro's and Connect's `date` are
    /// rendered) or a whole number of days since 1970-01-01.
    #[serde(rename = "date")]
    Date,
    /// `text[]` (`varchar[]`): from a JSON array of strings (numbers and
    /// booleans as their JSON text), `null` elements kept.
    #[serde(rename = "text[]", alias = "varchar[]")]
    TextArray,
    /// `bigint[]` (`int8[]`): from a JSON array of integers (or integer
    /// strings), `null` elements kept.
    #[serde(rename = "bigint[]", alias = "int8[]")]
    BigIntArray,
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
            ColumnType::Uuid => "uuid",
            ColumnType::Date => "date",
            ColumnType::TextArray => "text[]",
            ColumnType::BigIntArray => "bigint[]",
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

    pub(crate) fn is_number(self) -> bool {
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
pub(super) fn impossible_pairing(from: &FieldSource, ty: ColumnType) -> Option<&'static str> {
    use ColumnType::*;
    match from {
        FieldSource::Headers if !matches!(ty, Json | Jsonb | Text) => {
            Some("headers are a JSON object: use json, jsonb or text")
        }
        FieldSource::Topic if ty.is_number() || matches!(ty, Boolean | Timestamptz | Uuid | Date | BigIntArray) => {
            Some("the topic is text: use text, bytea, json or jsonb")
        }
        FieldSource::Partition | FieldSource::Offset
            if matches!(
                ty,
                Boolean | Bytea | Timestamptz | Uuid | Date | TextArray | BigIntArray
            ) =>
        {
            Some("partitions and offsets are integers: use an integer type, numeric, text, json or jsonb")
        }
        FieldSource::Timestamp if matches!(ty, Boolean | Bytea | Uuid | TextArray | BigIntArray) => {
            Some("timestamps go to timestamptz (or bigint for Unix milliseconds)")
        }
        _ => None,
    }
}

impl FieldSource {
    /// The value comes from the record's key (what a tombstone has).
    pub(crate) fn is_from_key(&self) -> bool {
        matches!(
            self,
            FieldSource::Key | FieldSource::KeyPointer(_) | FieldSource::KeyField(_)
        )
    }
}
