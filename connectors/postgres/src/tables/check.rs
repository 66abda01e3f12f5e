//! Checking the tables against the configuration: the target's columns and
//! types, the unique key of upserts, the sink's own tables' layout.

use exactly_core::ConnectorError;
use tokio_postgres::types::{Oid, Type};
use tokio_postgres::Client;

use super::catalog::{existing, fatal, has_unique_key, TableInfo};
use crate::config::{ColumnType, Settings};
use crate::rows::{ColumnSpec, NumericTypmod};
use crate::sql::{ident_list, quote_ident};

/// Columns of the commit-log table.
pub(super) const COMMIT_LOG_COLUMNS: [(&str, Type); 7] = [
    ("gid", Type::TEXT),
    ("pipeline", Type::TEXT),
    ("sink_table", Type::TEXT),
    ("subtask", Type::INT4),
    ("checkpoint", Type::INT8),
    ("prepared_at", Type::TIMESTAMPTZ),
    ("committed_at", Type::TIMESTAMPTZ),
];

/// The staging table's own columns, before the mapped ones.
pub(super) const STAGING_COLUMNS: [(&str, Type); 2] = [("exactly_gid", Type::TEXT), ("exactly_seq", Type::INT8)];

/// The staging column of the delete flag (when tombstones delete).
pub(super) const STAGING_DELETE: (&str, Type) = ("exactly_delete", Type::BOOL);

/// The staging columns of a row's record (when refused rows are isolated:
/// a dead letter of a row the merge refuses needs them).
pub(super) const STAGING_RECORD: [(&str, Type); 4] = [
    ("exactly_split", Type::TEXT),
    ("exactly_offset", Type::INT8),
    ("exactly_key", Type::BYTEA),
    ("exactly_value", Type::BYTEA),
];

/// Columns of the positions table (mode `fenced`), whose primary key is
/// (`scope`, `split`).
pub(super) const POSITIONS_COLUMNS: [(&str, Type); 4] = [
    ("scope", Type::TEXT),
    ("split", Type::TEXT),
    ("offset", Type::INT8),
    ("updated_at", Type::TIMESTAMPTZ),
];

/// The PostgreSQL types a configured type may be written to.
fn accepted_types(ty: ColumnType) -> &'static [Type] {
    match ty {
        ColumnType::SmallInt => &[Type::INT2],
        ColumnType::Int => &[Type::INT4],
        ColumnType::BigInt => &[Type::INT8],
        ColumnType::Real => &[Type::FLOAT4],
        ColumnType::Double => &[Type::FLOAT8],
        ColumnType::Numeric => &[Type::NUMERIC],
        ColumnType::Text => &[Type::TEXT, Type::VARCHAR, Type::BPCHAR],
        ColumnType::Boolean => &[Type::BOOL],
        ColumnType::Bytea => &[Type::BYTEA],
        ColumnType::Json => &[Type::JSON],
        ColumnType::Jsonb => &[Type::JSONB],
        ColumnType::Timestamptz => &[Type::TIMESTAMPTZ],
        ColumnType::Uuid => &[Type::UUID],
        ColumnType::Date => &[Type::DATE],
        ColumnType::TextArray => &[Type::TEXT_ARRAY, Type::VARCHAR_ARRAY],
        ColumnType::BigIntArray => &[Type::INT8_ARRAY],
    }
}

fn config_type_for(oid: Oid) -> Option<&'static str> {
    column_type_for(oid).map(ColumnType::config_name)
}

/// The configured type that writes a column of type `oid`.
pub(super) fn column_type_for(oid: Oid) -> Option<ColumnType> {
    use ColumnType::*;
    [
        SmallInt,
        Int,
        BigInt,
        Real,
        Double,
        Numeric,
        Text,
        Boolean,
        Bytea,
        Json,
        Jsonb,
        Timestamptz,
        Uuid,
        Date,
        TextArray,
        BigIntArray,
    ]
    .into_iter()
    .find(|t| accepted_types(*t).iter().any(|a| a.oid() == oid))
}

pub(super) fn target_types(target: &TableInfo, columns: &[ColumnSpec]) -> Vec<Type> {
    columns
        .iter()
        .map(|c| {
            let oid = target.column(&c.name).expect("checked").type_oid;
            Type::from_oid(oid).expect("checked to be a built-in type")
        })
        .collect()
}

/// Checks the configured columns against the target table and returns them
/// with the table's constraints.
pub(super) fn check_target(target: &TableInfo, settings: &Settings) -> Result<Vec<ColumnSpec>, ConnectorError> {
    let table = &settings.table;
    let mut specs = Vec::with_capacity(settings.columns.len());
    for (name, config) in &settings.columns {
        let Some(column) = target.column(name) else {
            return Err(fatal(format!(
                "column \"{name}\" of sink.postgres.columns does not exist in table {table} (it has: {}). Fix: add it \
                 (ALTER TABLE {table} ADD COLUMN {} {}) or remove it from sink.postgres.columns",
                target
                    .columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                quote_ident(name),
                config.column_type.sql_name()
            )));
        };
        if column.generated {
            return Err(fatal(format!(
                "column \"{name}\" of table {table} is generated and cannot be written. Fix: remove it from \
                 sink.postgres.columns"
            )));
        }
        let ty = config.column_type;
        if !accepted_types(ty).iter().any(|t| t.oid() == column.type_oid) {
            let suggestion = config_type_for(column.type_oid)
                .map(|t| format!("set sink.postgres.columns.{name}.type = \"{t}\""))
                .unwrap_or_else(|| "change the column's type to one the sink supports".into());
            return Err(fatal(format!(
                "column \"{name}\" of table {table} is {} but sink.postgres.columns.{name}.type is \"{}\". Fix: \
                 {suggestion}, or ALTER the column to {}",
                column.type_text,
                ty.config_name(),
                ty.sql_name()
            )));
        }
        let text_limit = (matches!(ty, ColumnType::Text | ColumnType::TextArray) && column.typmod >= 4)
            .then(|| (column.typmod - 4) as usize);
        specs.push(ColumnSpec {
            name: name.clone(),
            from: config.from.clone(),
            ty,
            required: config.required,
            max_chars: text_limit,
            numeric: if ty == ColumnType::Numeric {
                NumericTypmod::from_atttypmod(column.typmod)
            } else {
                None
            },
            not_null: column.not_null,
        });
    }
    let unmapped: Vec<&str> = target
        .columns
        .iter()
        .filter(|c| c.not_null && !c.has_default && !settings.columns.iter().any(|(n, _)| *n == c.name))
        .map(|c| c.name.as_str())
        .collect();
    if !unmapped.is_empty() {
        return Err(fatal(format!(
            "table {table} has NOT NULL columns without a default that the sink does not fill: {}. Fix: add them \
             to sink.postgres.columns, or give them a default",
            unmapped.join(", ")
        )));
    }
    Ok(specs)
}

pub(super) async fn check_unique_key(client: &Client, settings: &Settings) -> Result<(), ConnectorError> {
    let key: Vec<String> = settings
        .upsert_key
        .iter()
        .flatten()
        .map(|i| settings.columns[*i].0.clone())
        .collect();
    if has_unique_key(client, &settings.url, &settings.table, &key).await? {
        return Ok(());
    }
    Err(fatal(format!(
        "table {} has no unique index or primary key on exactly the upsert key ({}), which INSERT ... ON CONFLICT \
         needs. Fix: ALTER TABLE {} ADD PRIMARY KEY ({}) (or CREATE UNIQUE INDEX), or change sink.postgres.upsert_key",
        settings.table,
        key.join(", "),
        settings.table,
        ident_list(key.iter().map(String::as_str))
    )))
}

/// Checks the positions table: its columns, privileges and the unique key
/// the compare-and-set upsert needs.
pub(super) async fn check_positions(client: &Client, settings: &Settings, fix: &str) -> Result<(), ConnectorError> {
    let positions = existing(client, &settings.url, &settings.positions, "").await?;
    positions.require_columns(&POSITIONS_COLUMNS, fix)?;
    positions.require_privileges(&["SELECT", "INSERT", "UPDATE"])?;
    let key = ["scope".to_string(), "split".to_string()];
    if has_unique_key(client, &settings.url, &settings.positions, &key).await? {
        return Ok(());
    }
    Err(fatal(format!(
        "positions table {} has no primary key or unique index on (scope, split). Fix: ALTER TABLE {} ADD PRIMARY \
         KEY (scope, split), or {fix}",
        settings.positions, settings.positions
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_config_type_maps_to_its_postgres_types() {
        assert_eq!(config_type_for(Type::VARCHAR.oid()), Some("text"));
        assert_eq!(config_type_for(Type::INT4.oid()), Some("int"));
        assert_eq!(config_type_for(Type::FLOAT8.oid()), Some("double"));
        assert_eq!(config_type_for(Type::UUID.oid()), Some("uuid"));
        assert_eq!(config_type_for(Type::DATE.oid()), Some("date"));
        assert_eq!(config_type_for(Type::VARCHAR_ARRAY.oid()), Some("text[]"));
        assert_eq!(config_type_for(Type::INT8_ARRAY.oid()), Some("bigint[]"));
        assert_eq!(config_type_for(Type::INET.oid()), None);
    }
}
