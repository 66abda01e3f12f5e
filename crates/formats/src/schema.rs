//! One schema model for every schema'd format: Kafka Connect's
//! ([`ConnectSchema`]), read from the JSON converter's `"schema"` or derived
//! from an Avro schema, with the meaning of named types (Connect's and
//! Debezium's semantic types, Avro's logical types) classified as a
//! [`Logical`]. A sink checks its columns against a struct schema's
//! [`fields`](ConnectSchema::fields), maps each field's type to its own,
//! and asks [`ConnectSchema::added_fields`] what changed between two
//! versions.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::FormatError;

/// Kafka Connect's schema types, plus [`Union`](Self::Union) for an Avro
/// union of several non-null types (Connect has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaType {
    /// `int8`.
    Int8,
    /// `int16`.
    Int16,
    /// `int32` (Avro `int`).
    Int32,
    /// `int64` (Avro `long`).
    Int64,
    /// `float` (Avro `float`).
    Float32,
    /// `double` (Avro `double`).
    Float64,
    /// `boolean`.
    Boolean,
    /// `string` (Avro `string` and `enum`).
    String,
    /// `bytes` (Avro `bytes` and `fixed`): base64 in decoded values.
    Bytes,
    /// `array`, with [`items`](ConnectSchema::items).
    Array,
    /// `map`, with [`keys`](ConnectSchema::keys) and
    /// [`values`](ConnectSchema::values).
    Map,
    /// `struct` (Avro `record`), with [`fields`](ConnectSchema::fields).
    Struct,
    /// An Avro union of several non-null types, with
    /// [`branches`](ConnectSchema::branches): a decoded value is the
    /// branch's value.
    Union,
}

impl SchemaType {
    /// The name the Connect JSON converter writes.
    pub fn as_str(self) -> &'static str {
        match self {
            SchemaType::Int8 => "int8",
            SchemaType::Int16 => "int16",
            SchemaType::Int32 => "int32",
            SchemaType::Int64 => "int64",
            SchemaType::Float32 => "float",
            SchemaType::Float64 => "double",
            SchemaType::Boolean => "boolean",
            SchemaType::String => "string",
            SchemaType::Bytes => "bytes",
            SchemaType::Array => "array",
            SchemaType::Map => "map",
            SchemaType::Struct => "struct",
            SchemaType::Union => "union",
        }
    }

    fn parse(name: &str) -> Option<SchemaType> {
        Some(match name.to_ascii_lowercase().as_str() {
            "int8" => SchemaType::Int8,
            "int16" => SchemaType::Int16,
            "int32" => SchemaType::Int32,
            "int64" => SchemaType::Int64,
            "float" | "float32" => SchemaType::Float32,
            "double" | "float64" => SchemaType::Float64,
            "boolean" => SchemaType::Boolean,
            "string" => SchemaType::String,
            "bytes" => SchemaType::Bytes,
            "array" => SchemaType::Array,
            "map" => SchemaType::Map,
            "struct" => SchemaType::Struct,
            _ => return None,
        })
    }
}

/// The unit of a time or timestamp counted in an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeUnit {
    /// Milliseconds.
    Millis,
    /// Microseconds.
    Micros,
    /// Nanoseconds.
    Nanos,
}

/// What a named or logical type means, whatever its encoding. Decoded
/// values of these types are rendered as a JSON or PostgreSQL consumer
/// expects them (see the crate documentation for the table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Logical {
    /// An exact decimal: Connect's `Decimal` (unscaled big-endian two's
    /// complement bytes, `scale` parameter), Avro's `decimal`, Debezium's
    /// `VariableScaleDecimal` (a struct of `scale` and `value`, so no fixed
    /// scale). Rendered as a string, e.g. `"-12.30"`.
    Decimal {
        /// Digits after the point, when fixed by the schema.
        scale: Option<u32>,
        /// Total digits, when the schema says.
        precision: Option<u32>,
    },
    /// Days since 1970-01-01 (Connect's `Date`, Debezium's `Date`, Avro's
    /// `date`). Rendered `"2024-02-29"`.
    Date,
    /// Time of day counted since midnight. Rendered `"13:45:00.123456"`.
    Time(TimeUnit),
    /// A point in time counted since the epoch. `utc`: an instant (Connect's
    /// `Timestamp`, Avro's `timestamp-*`), rendered with `Z`; otherwise a
    /// date and time without zone (Debezium's `Timestamp`, `MicroTimestamp`,
    /// `NanoTimestamp`, Avro's `local-timestamp-*`), rendered without one.
    Timestamp {
        /// The unit counted.
        unit: TimeUnit,
        /// Whether it is an instant (UTC).
        utc: bool,
    },
    /// Debezium's `ZonedTimestamp`: already an ISO 8601 string with zone.
    ZonedTimestamp,
    /// Debezium's `ZonedTime`: already an ISO 8601 time with zone.
    ZonedTime,
    /// A UUID, as a string.
    Uuid,
    /// JSON text in a string (Debezium's `Json`).
    Json,
    /// An enumeration's symbol, as a string (Avro `enum`, Debezium's `Enum`).
    Enum,
    /// Avro's `duration`: `{"months", "days", "millis"}`.
    Duration,
}

impl Logical {
    /// The logical type a Connect or Debezium schema name stands for.
    fn from_connect_name(name: &str, parameters: &BTreeMap<String, String>) -> Option<Logical> {
        let number = |key: &str| parameters.get(key).and_then(|v| v.parse::<u32>().ok());
        Some(match name {
            "org.apache.kafka.connect.data.Decimal" => Logical::Decimal {
                scale: number("scale"),
                precision: number("connect.decimal.precision"),
            },
            "io.debezium.data.VariableScaleDecimal" => Logical::Decimal {
                scale: None,
                precision: None,
            },
            "org.apache.kafka.connect.data.Date" | "io.debezium.time.Date" => Logical::Date,
            "org.apache.kafka.connect.data.Time" | "io.debezium.time.Time" => Logical::Time(TimeUnit::Millis),
            "io.debezium.time.MicroTime" => Logical::Time(TimeUnit::Micros),
            "io.debezium.time.NanoTime" => Logical::Time(TimeUnit::Nanos),
            "org.apache.kafka.connect.data.Timestamp" => Logical::Timestamp {
                unit: TimeUnit::Millis,
                utc: true,
            },
            "io.debezium.time.Timestamp" => Logical::Timestamp {
                unit: TimeUnit::Millis,
                utc: false,
            },
            "io.debezium.time.MicroTimestamp" => Logical::Timestamp {
                unit: TimeUnit::Micros,
                utc: false,
            },
            "io.debezium.time.NanoTimestamp" => Logical::Timestamp {
                unit: TimeUnit::Nanos,
                utc: false,
            },
            "io.debezium.time.ZonedTimestamp" => Logical::ZonedTimestamp,
            "io.debezium.time.ZonedTime" => Logical::ZonedTime,
            "io.debezium.data.Uuid" => Logical::Uuid,
            "io.debezium.data.Json" => Logical::Json,
            "io.debezium.data.Enum" => Logical::Enum,
            _ => return None,
        })
    }
}

/// A Kafka Connect schema: the `"schema"` of the JSON converter's
/// `{"schema": …, "payload": …}`, or one derived from an Avro schema.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectSchema {
    /// The type.
    pub kind: SchemaType,
    /// Whether the value may be null (an Avro union with `"null"`).
    pub optional: bool,
    /// The schema's name: Connect's or Debezium's semantic type
    /// (`io.debezium.time.MicroTimestamp`), a struct's name
    /// (`server.inventory.customers.Value`), an Avro named type's full name.
    pub name: Option<String>,
    /// What the type means beyond its encoding, when known.
    pub logical: Option<Logical>,
    /// Connect's schema parameters (`scale`, `connect.decimal.precision`,
    /// Debezium's `__debezium.source.column.type`, ...).
    pub parameters: BTreeMap<String, String>,
    /// The default value, as written in the schema.
    pub default: Option<Value>,
    /// A struct's fields, in order.
    pub fields: Vec<Field>,
    /// An array's element schema.
    pub items: Option<Box<ConnectSchema>>,
    /// A map's key schema.
    pub keys: Option<Box<ConnectSchema>>,
    /// A map's value schema.
    pub values: Option<Box<ConnectSchema>>,
    /// A union's branches, in the union's order.
    pub branches: Vec<ConnectSchema>,
}

/// One field of a struct schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// The field's name (a column name, for a table's row).
    pub name: String,
    /// Its schema (type, optional, logical type, default).
    pub schema: ConnectSchema,
}

/// What [`ConnectSchema::added_fields`] refuses: a change other than new
/// optional fields.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchemaChange {
    /// One of the schemas is not a struct.
    #[error("the schema is not a struct (it is {0}), so it has no fields to compare")]
    NotAStruct(&'static str),
    /// A field disappeared.
    #[error("field `{0}` was removed")]
    Removed(String),
    /// A field changed its type (or logical type).
    #[error("field `{name}` changed from {from} to {to}")]
    TypeChanged {
        /// The field.
        name: String,
        /// Its type before.
        from: String,
        /// Its type now.
        to: String,
    },
    /// A field that was required may now be null.
    #[error("field `{0}` became optional (it may now be null)")]
    BecameOptional(String),
    /// A new field that is neither optional nor has a default.
    #[error("new field `{0}` is required and has no default: rows already written have no value for it")]
    RequiredAdded(String),
}

impl ConnectSchema {
    /// A schema of `kind` with nothing else set (not optional).
    pub fn of(kind: SchemaType) -> ConnectSchema {
        ConnectSchema {
            kind,
            optional: false,
            name: None,
            logical: None,
            parameters: BTreeMap::new(),
            default: None,
            fields: Vec::new(),
            items: None,
            keys: None,
            values: None,
            branches: Vec::new(),
        }
    }

    /// The field called `name` of a struct schema.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|field| field.name == name)
    }

    /// A short description of the type for messages: `int64`,
    /// `int64 (io.debezium.time.MicroTimestamp)`, `optional string`.
    pub fn describe(&self) -> String {
        let mut text = String::new();
        if self.optional {
            text.push_str("optional ");
        }
        text.push_str(self.kind.as_str());
        if let Some(name) = &self.name {
            if self.kind != SchemaType::Struct {
                text.push_str(&format!(" ({name})"));
            }
        }
        text
    }

    /// The fields a struct schema `newer` adds to this one, when that is
    /// all that changed and each is optional or has a default (what a sink
    /// can follow with new nullable columns). Anything else — a field
    /// removed, retyped or made optional, a required field without default
    /// added — is a [`SchemaChange`] naming it.
    pub fn added_fields<'a>(&self, newer: &'a ConnectSchema) -> Result<Vec<&'a Field>, SchemaChange> {
        for schema in [self, newer] {
            if schema.kind != SchemaType::Struct {
                return Err(SchemaChange::NotAStruct(schema.kind.as_str()));
            }
        }
        for old in &self.fields {
            let Some(new) = newer.field(&old.name) else {
                return Err(SchemaChange::Removed(old.name.clone()));
            };
            if old.schema.kind != new.schema.kind || old.schema.logical != new.schema.logical {
                return Err(SchemaChange::TypeChanged {
                    name: old.name.clone(),
                    from: old.schema.describe(),
                    to: new.schema.describe(),
                });
            }
            if new.schema.optional && !old.schema.optional {
                return Err(SchemaChange::BecameOptional(old.name.clone()));
            }
        }
        let mut added = Vec::new();
        for new in &newer.fields {
            if self.field(&new.name).is_some() {
                continue;
            }
            if !new.schema.optional && new.schema.default.is_none() {
                return Err(SchemaChange::RequiredAdded(new.name.clone()));
            }
            added.push(new);
        }
        Ok(added)
    }

    /// Reads the Kafka Connect JSON converter's schema (`{"type": "struct",
    /// "fields": [{"field": "id", "type": "int32", "optional": false}, …],
    /// "name": …}`). `path` names where it is, for errors.
    pub fn from_connect_json(schema: &Value, path: &str) -> Result<ConnectSchema, FormatError> {
        const FIX: &str = "the value must be written by Kafka Connect's JsonConverter with schemas.enable=true";
        let node = schema
            .as_object()
            .ok_or_else(|| FormatError::schema(path, format!("the schema is {schema}, not an object"), FIX))?;
        let type_name = node
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| FormatError::schema(path, "the schema has no \"type\"", FIX))?;
        let kind = SchemaType::parse(type_name)
            .ok_or_else(|| FormatError::schema(path, format!("unknown schema type {type_name:?}"), FIX))?;
        let mut out = ConnectSchema::of(kind);
        out.optional = match node.get("optional") {
            Some(Value::Bool(optional)) => *optional,
            Some(Value::String(text)) => text == "true",
            _ => false,
        };
        out.name = node.get("name").and_then(Value::as_str).map(str::to_string);
        if let Some(Value::Object(parameters)) = node.get("parameters") {
            out.parameters = parameters
                .iter()
                .map(|(key, value)| {
                    (
                        key.clone(),
                        value.as_str().map_or_else(|| value.to_string(), str::to_string),
                    )
                })
                .collect();
        }
        out.default = node.get("default").cloned();
        out.logical = out
            .name
            .as_deref()
            .and_then(|name| Logical::from_connect_name(name, &out.parameters));
        let child = |key: &str| -> Result<Option<Box<ConnectSchema>>, FormatError> {
            node.get(key)
                .map(|child| ConnectSchema::from_connect_json(child, &format!("{path}.{key}")).map(Box::new))
                .transpose()
        };
        match kind {
            SchemaType::Struct => {
                let fields = node
                    .get("fields")
                    .and_then(Value::as_array)
                    .ok_or_else(|| FormatError::schema(path, "a struct schema without \"fields\"", FIX))?;
                for field in fields {
                    let name = field
                        .get("field")
                        .or_else(|| field.get("name"))
                        .and_then(Value::as_str)
                        .ok_or_else(|| FormatError::schema(path, format!("a field without a name: {field}"), FIX))?;
                    let field_path = format!("{path}.{name}");
                    // The converter writes a field's schema inline; Connect's
                    // `Schema.toString()` nests it under "schema".
                    let schema = match field.get("schema") {
                        Some(nested) => ConnectSchema::from_connect_json(nested, &field_path)?,
                        None => ConnectSchema::from_connect_json(field, &field_path)?,
                    };
                    out.fields.push(Field {
                        name: name.to_string(),
                        schema,
                    });
                }
            }
            SchemaType::Array => {
                out.items = Some(
                    child("items")?
                        .ok_or_else(|| FormatError::schema(path, "an array schema without \"items\"", FIX))?,
                );
            }
            SchemaType::Map => {
                out.keys = child("keys")?;
                out.values = Some(
                    child("values")?
                        .ok_or_else(|| FormatError::schema(path, "a map schema without \"values\"", FIX))?,
                );
            }
            _ => {}
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(fields: Value) -> ConnectSchema {
        ConnectSchema::from_connect_json(
            &json!({"type": "struct", "name": "s.public.t.Value", "optional": true, "fields": fields}),
            "schema",
        )
        .unwrap()
    }

    #[test]
    fn the_json_converters_schema_reads_with_types_and_semantic_names() {
        let schema = row(json!([
            {"type": "int32", "optional": false, "field": "id"},
            {"type": "string", "optional": true, "field": "note"},
            {"type": "bytes", "optional": false, "name": "org.apache.kafka.connect.data.Decimal",
             "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
            {"type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp", "version": 1,
             "field": "created"},
            {"type": "array", "items": {"type": "string", "optional": false}, "optional": true, "field": "tags"},
        ]));
        assert_eq!(schema.kind, SchemaType::Struct);
        assert!(schema.optional);
        let names: Vec<&str> = schema.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["id", "note", "price", "created", "tags"]);
        assert!(!schema.field("id").unwrap().schema.optional);
        assert!(schema.field("note").unwrap().schema.optional);
        assert_eq!(
            schema.field("price").unwrap().schema.logical,
            Some(Logical::Decimal {
                scale: Some(2),
                precision: Some(10)
            })
        );
        assert_eq!(
            schema.field("created").unwrap().schema.logical,
            Some(Logical::Timestamp {
                unit: TimeUnit::Micros,
                utc: false
            })
        );
        assert_eq!(
            schema.field("tags").unwrap().schema.items.as_ref().unwrap().kind,
            SchemaType::String
        );
        let unknown = ConnectSchema::from_connect_json(&json!({"type": "decimal128"}), "schema").unwrap_err();
        assert!(unknown.to_string().contains("decimal128"), "{unknown}");
    }

    #[test]
    fn only_new_optional_fields_are_a_change_a_sink_can_follow() {
        let v1 = row(json!([{"type": "int32", "optional": false, "field": "id"}]));
        let v2 = row(json!([
            {"type": "int32", "optional": false, "field": "id"},
            {"type": "string", "optional": true, "field": "note"},
            {"type": "int32", "optional": false, "default": 0, "field": "rank"},
        ]));
        let added: Vec<&str> = v1.added_fields(&v2).unwrap().iter().map(|f| f.name.as_str()).collect();
        assert_eq!(added, ["note", "rank"]);
        assert!(v1.added_fields(&v1).unwrap().is_empty());
        assert_eq!(v2.added_fields(&v1), Err(SchemaChange::Removed("note".into())));
        let retyped = row(json!([{"type": "string", "optional": false, "field": "id"}]));
        assert!(matches!(
            v1.added_fields(&retyped),
            Err(SchemaChange::TypeChanged { .. })
        ));
        let loosened = row(json!([{"type": "int32", "optional": true, "field": "id"}]));
        assert_eq!(
            v1.added_fields(&loosened),
            Err(SchemaChange::BecameOptional("id".into()))
        );
        let required = row(json!([
            {"type": "int32", "optional": false, "field": "id"},
            {"type": "string", "optional": false, "field": "must"},
        ]));
        assert_eq!(
            v1.added_fields(&required),
            Err(SchemaChange::RequiredAdded("must".into()))
        );
    }
}
