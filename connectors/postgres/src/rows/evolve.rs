//! `schema_evolution = "add-columns"`: what a row's schema asks of the
//! table. Fields no column takes become new nullable columns when they are
//! optional (or have a default); any other change — a field's type no
//! longer fits its column, a field a required column reads is gone, a new
//! required field — is an error naming the field and the fix. Pure: the
//! sink runs the `ALTER TABLE` in the transaction of the rows.

use exactly_formats::schema::{ConnectSchema, Logical, SchemaType};

use super::convert::ColumnSpec;
use crate::config::{ColumnType, FieldSource};

/// A column to add for a field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NewColumn {
    /// The field's name, the column's.
    pub name: String,
    /// The type the field's values fit.
    pub ty: ColumnType,
}

/// The column type a field's decoded values fit. `rendered`: logical types
/// were rendered as text (Connect JSON, Avro); Debezium's rows keep their
/// encoded values.
pub(crate) fn column_type(schema: &ConnectSchema, rendered: bool) -> ColumnType {
    if let Some(logical) = &schema.logical {
        let by_logical = match logical {
            Logical::Decimal { .. } if rendered => Some(ColumnType::Numeric),
            Logical::Timestamp { utc: true, .. } if rendered => Some(ColumnType::Timestamptz),
            Logical::ZonedTimestamp => Some(ColumnType::Timestamptz),
            Logical::Duration => Some(ColumnType::Jsonb),
            // `YYYY-MM-DD` when rendered, else days since 1970: both fit.
            Logical::Date => Some(ColumnType::Date),
            Logical::Uuid if rendered || schema.kind == SchemaType::String => Some(ColumnType::Uuid),
            Logical::Decimal { .. }
            | Logical::Time(_)
            | Logical::Timestamp { .. }
            | Logical::ZonedTime
            | Logical::Uuid
            | Logical::Json
            | Logical::Enum
                if rendered || schema.kind == SchemaType::String || schema.kind == SchemaType::Bytes =>
            {
                Some(ColumnType::Text)
            }
            _ => None,
        };
        if let Some(ty) = by_logical {
            return ty;
        }
    }
    match schema.kind {
        SchemaType::Int8 | SchemaType::Int16 => ColumnType::SmallInt,
        SchemaType::Int32 => ColumnType::Int,
        SchemaType::Int64 => ColumnType::BigInt,
        SchemaType::Float32 => ColumnType::Real,
        SchemaType::Float64 => ColumnType::Double,
        SchemaType::Boolean => ColumnType::Boolean,
        // Bytes arrive as base64 text.
        SchemaType::String | SchemaType::Bytes => ColumnType::Text,
        SchemaType::Array | SchemaType::Map | SchemaType::Struct | SchemaType::Union => ColumnType::Jsonb,
    }
}

/// Whether values of type `field` go into a column of type `column`.
fn fits(field: ColumnType, column: ColumnType) -> bool {
    use ColumnType::*;
    field == column
        || matches!(column, Text | Json | Jsonb)
        || (column.is_number() && matches!(field, SmallInt | Int | BigInt | Real | Double | Numeric))
        || (column == Boolean && field == Boolean)
}

/// The field a column reads: its pointer's single token (`/note`), or its
/// name when it comes from the key (pk columns of Debezium's events).
fn field_of(column: &ColumnSpec) -> Option<&str> {
    match &column.from {
        FieldSource::Pointer(pointer) if pointer.tokens().len() == 1 => Some(pointer.tokens()[0].as_str()),
        _ => None,
    }
}

/// What `schema` (a row's struct schema) asks of a table whose columns are
/// `columns`: the columns to add, or an error naming the field and the fix.
/// `table` and `at` (the record) are for the message.
pub(crate) fn plan(
    schema: &ConnectSchema,
    columns: &[ColumnSpec],
    rendered: bool,
    table: &str,
    at: &str,
) -> Result<Vec<NewColumn>, String> {
    let fail = |problem: String, fix: String| {
        Err(format!(
            "sink.postgres.schema_evolution = \"add-columns\": the schema of {at} {problem}, a change the sink does \
             not follow for table {table}. Fix: {fix}"
        ))
    };
    let mut added = Vec::new();
    for field in &schema.fields {
        let ty = column_type(&field.schema, rendered);
        let reading: Vec<&ColumnSpec> = columns
            .iter()
            .filter(|c| field_of(c) == Some(field.name.as_str()))
            .collect();
        if let Some(column) = reading.iter().find(|c| !fits(ty, c.ty)) {
            return fail(
                format!(
                    "gives field `{}` the type {} (values of {}), which column \"{}\" of type {} does not take",
                    field.name,
                    field.schema.describe(),
                    ty.sql_name(),
                    column.name,
                    column.ty.sql_name()
                ),
                format!(
                    "change the column's type (ALTER TABLE {table} ALTER COLUMN \"{}\" TYPE {}) and its type in \
                     sink.postgres.columns while the pipeline is stopped, or keep the field's type in the producer's \
                     schema",
                    column.name,
                    ty.sql_name()
                ),
            );
        }
        if !reading.is_empty() || columns.iter().any(|c| c.name == field.name) {
            continue;
        }
        if !field.schema.optional && field.schema.default.is_none() {
            return fail(
                format!(
                    "adds field `{}`, which is required and has no default, so rows already written have no value \
                     for it",
                    field.name
                ),
                format!(
                    "make the field optional (or give it a default) in the producer's schema, or add the column \
                     yourself (ALTER TABLE {table} ADD COLUMN \"{}\" {}) and map it in sink.postgres.columns",
                    field.name,
                    ty.sql_name()
                ),
            );
        }
        added.push(NewColumn {
            name: field.name.clone(),
            ty,
        });
    }
    for column in columns.iter().filter(|c| c.required) {
        if let Some(name) = field_of(column) {
            if schema.field(name).is_none() {
                return fail(
                    format!("has no field `{name}`, which required column \"{}\" reads", column.name),
                    format!(
                        "keep the field in the producer's schema, or set sink.postgres.columns.{}.required = false \
                         (and drop the column's NOT NULL)",
                        column.name
                    ),
                );
            }
        }
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(fields: serde_json::Value) -> ConnectSchema {
        ConnectSchema::from_connect_json(&json!({"type": "struct", "fields": fields}), "schema").unwrap()
    }

    fn columns() -> Vec<ColumnSpec> {
        vec![
            ColumnSpec::plain("id", "/id", ColumnType::BigInt, true),
            ColumnSpec::plain("name", "/name", ColumnType::Text, false),
        ]
    }

    #[test]
    fn new_optional_fields_become_nullable_columns_of_their_type() {
        let v2 = schema(json!([
            {"field": "id", "type": "int64"},
            {"field": "name", "type": "string", "optional": true},
            {"field": "note", "type": "string", "optional": true},
            {"field": "rank", "type": "int32", "default": 0},
            {"field": "price", "type": "bytes", "optional": true, "name": "org.apache.kafka.connect.data.Decimal",
             "parameters": {"scale": "2"}},
            {"field": "at", "type": "int64", "optional": true, "name": "org.apache.kafka.connect.data.Timestamp"},
            {"field": "tags", "type": "array", "items": {"type": "string"}, "optional": true},
            {"field": "day", "type": "int32", "optional": true, "name": "org.apache.kafka.connect.data.Date"},
            {"field": "ref", "type": "string", "optional": true, "name": "io.debezium.data.Uuid"},
        ]));
        let added = plan(&v2, &columns(), true, "t", "record t-0@1").unwrap();
        let got: Vec<(&str, ColumnType)> = added.iter().map(|c| (c.name.as_str(), c.ty)).collect();
        assert_eq!(
            got,
            [
                ("note", ColumnType::Text),
                ("rank", ColumnType::Int),
                ("price", ColumnType::Numeric),
                ("at", ColumnType::Timestamptz),
                ("tags", ColumnType::Jsonb),
                ("day", ColumnType::Date),
                ("ref", ColumnType::Uuid),
            ]
        );
        let same = schema(json!([{"field": "id", "type": "int64"}]));
        assert!(plan(&same, &columns(), true, "t", "r").unwrap().is_empty());
        // Debezium's encoded values: a timestamp stays a number.
        let micro = schema(json!([{"field": "id", "type": "int64"},
            {"field": "ts", "type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp"}]));
        assert_eq!(
            plan(&micro, &columns(), false, "t", "r").unwrap()[0].ty,
            ColumnType::BigInt
        );
    }

    #[test]
    fn other_changes_are_errors_naming_the_field_and_the_fix() {
        let retyped = schema(json!([{"field": "id", "type": "string"}]));
        let error = plan(&retyped, &columns(), true, "t", "record t-0@1").unwrap_err();
        assert!(
            error.contains("`id`") && error.contains("ALTER TABLE t ALTER COLUMN"),
            "{error}"
        );
        let removed = schema(json!([{"field": "name", "type": "string", "optional": true}]));
        let error = plan(&removed, &columns(), true, "t", "r").unwrap_err();
        assert!(
            error.contains("no field `id`") && error.contains("required = false"),
            "{error}"
        );
        let required = schema(json!([{"field": "id", "type": "int64"}, {"field": "must", "type": "string"}]));
        let error = plan(&required, &columns(), true, "t", "r").unwrap_err();
        assert!(error.contains("`must`") && error.contains("Fix:"), "{error}");
        let widened = schema(json!([{"field": "id", "type": "int32"}]));
        assert!(plan(&widened, &columns(), true, "t", "r").unwrap().is_empty());
    }
}
