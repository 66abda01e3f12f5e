//! `schema_evolution = "add-columns"` on the tables: the columns a row's
//! schema adds, created with `ALTER TABLE … ADD COLUMN` (nullable) in the
//! open transaction of the rows, on the write connection (so they commit,
//! or vanish, with the rows); the layout then writes them. With a key the
//! staging table gets them too, and the merge moves them.
//!
//! A sink that restarts finds the columns it added in the table: a record
//! whose schema has the field takes the column again without DDL, and,
//! with a key, recovery's merge of staged rows moves every column the
//! staging table shares with the target ([`with_added_columns`]).

use exactly_core::{ConnectorError, JsonPointer};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::catalog::{describe, existing, TableInfo};
use super::check::{column_type_for, target_types};
use super::statements::merge_sql;
use super::{staging_extras, Layout};
use crate::config::{Column, ColumnType, FieldSource, Settings};
use crate::conn::connect::LOCK_TIMEOUT;
use crate::conn::error::classify;
use crate::rows::evolve::NewColumn;
use crate::rows::{ColumnSpec, NumericTypmod};
use crate::sql::{ident_list, quote_ident};

/// How long an `ALTER TABLE` of the sink waits for the table's lock
/// (held by other transactions that write or read it).
const DDL_LOCK_TIMEOUT: &str = "10s";

/// The JSON pointer of the field `name` at the top of a row.
fn pointer_to(name: &str) -> JsonPointer {
    let escaped = name.replace('~', "~0").replace('/', "~1");
    JsonPointer::parse(&format!("/{escaped}")).expect("a pointer of one token parses")
}

fn column(name: &str, ty: ColumnType) -> (String, Column) {
    (
        name.to_string(),
        Column {
            from: FieldSource::Pointer(pointer_to(name)),
            column_type: ty,
            required: false,
        },
    )
}

/// `settings` with, after the configured columns, those the sink added
/// earlier that a staging table still carries (mode `two-phase` with a
/// key): the columns of the staging table, other than the sink's own,
/// that the target has too. So a merge after a restart moves them.
pub(super) async fn with_added_columns(client: &Client, settings: &Settings) -> Result<Settings, ConnectorError> {
    let mut out = settings.clone();
    if settings.upsert_key.is_none() {
        return Ok(out);
    }
    let url = &settings.url;
    let (Some(staging), Some(target)) = (
        describe(client, url, &settings.staging, settings.staging.to_string()).await?,
        describe(client, url, &settings.table, settings.table.to_string()).await?,
    ) else {
        return Ok(out);
    };
    for staged in &staging.columns {
        if staged.name.starts_with("exactly_") || settings.columns.iter().any(|(n, _)| *n == staged.name) {
            continue;
        }
        let Some(in_target) = target.column(&staged.name) else {
            continue;
        };
        if let Some(ty) = column_type_for(in_target.type_oid) {
            tracing::info!(table = %settings.table, column = %staged.name,
                "writing a column added for a schema's field");
            out.columns.push(column(&staged.name, ty));
        }
    }
    Ok(out)
}

/// Adds `added` to the table of `layout` (and its staging table) in the
/// open transaction of `client`, and returns the layout that writes them.
/// `settings`: the settings of the table (configured columns only).
pub(crate) async fn add_columns(
    client: &Client,
    settings: &Settings,
    layout: &Layout,
    added: &[NewColumn],
) -> Result<Layout, ConnectorError> {
    let url = &settings.url;
    let context = "postgres sink: adding columns for a schema's new fields";
    let target = existing(client, url, &layout.table, "").await?;
    let mut statements = Vec::new();
    let mut missing = Vec::new();
    for new in added {
        if target.column(&new.name).is_none() {
            missing.push(format!("ADD COLUMN {} {}", quote_ident(&new.name), new.ty.sql_name()));
        }
    }
    if !missing.is_empty() {
        statements.push(format!("ALTER TABLE {} {}", layout.table.sql(), missing.join(", ")));
    }
    if layout.staged.is_some() {
        let staging = existing(client, url, &layout.staging, "").await?;
        let missing: Vec<String> = added
            .iter()
            .filter(|new| staging.column(&new.name).is_none())
            .map(|new| {
                let ty = target
                    .column(&new.name)
                    .map_or_else(|| new.ty.sql_name().to_string(), |c| c.type_text.clone());
                format!("ADD COLUMN {} {ty}", quote_ident(&new.name))
            })
            .collect();
        if !missing.is_empty() {
            statements.push(format!("ALTER TABLE {} {}", layout.staging.sql(), missing.join(", ")));
        }
    }
    if !statements.is_empty() {
        let sql = format!(
            "SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'; {}; SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'",
            statements.join("; ")
        );
        client.batch_execute(&sql).await.map_err(|e| {
            if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
                ConnectorError::transient(
                    context,
                    format!(
                        "adding columns {} to {} waited {DDL_LOCK_TIMEOUT} for the table's lock, which other \
                         transactions hold (the pipeline's other subtasks, or other sessions); the pipeline restarts \
                         and tries again. Fix, if it keeps failing: add them while the pipeline is stopped ({})",
                        names(added),
                        layout.table,
                        statements.join("; ")
                    ),
                )
                .caused_by(e)
            } else {
                classify(context, url, e)
            }
        })?;
        tracing::info!(table = %layout.table, columns = %names(added),
            "added columns for new fields of the records' schema (committed with the rows)");
    }
    let target = existing(client, url, &layout.table, "").await?;
    let mut specs = layout.shape.columns.clone();
    let mut all = settings.columns.clone();
    for spec in &specs[settings.columns.len().min(specs.len())..] {
        all.push(column(&spec.name, spec.ty));
    }
    for new in added {
        let info = target.column(&new.name).ok_or_else(|| {
            ConnectorError::fatal(
                context,
                format!("column \"{}\" is not in {} after adding it", new.name, layout.table),
            )
        })?;
        let ty = column_type_for(info.type_oid).ok_or_else(|| {
            ConnectorError::fatal(
                context,
                format!(
                    "column \"{}\" of {} is {}, a type the sink does not write. Fix: drop or rename the column, or \
                     rename the field",
                    new.name, layout.table, info.type_text
                ),
            )
        })?;
        let (name, column_config) = column(&new.name, ty);
        specs.push(ColumnSpec {
            name: name.clone(),
            from: column_config.from.clone(),
            ty,
            required: false,
            max_chars: (matches!(ty, ColumnType::Text | ColumnType::TextArray) && info.typmod >= 4)
                .then(|| (info.typmod - 4) as usize),
            numeric: if ty == ColumnType::Numeric {
                NumericTypmod::from_atttypmod(info.typmod)
            } else {
                None
            },
            not_null: info.not_null,
        });
        all.push((name, column_config));
    }
    let mut with_columns = settings.clone();
    with_columns.columns = all;
    Ok(rebuild(&with_columns, layout, &target, specs))
}

fn names(added: &[NewColumn]) -> String {
    added.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
}

/// `layout` writing the columns `specs` (the configured ones, then those
/// added); `settings` has them all.
fn rebuild(settings: &Settings, layout: &Layout, target: &TableInfo, specs: Vec<ColumnSpec>) -> Layout {
    let mut out = layout.clone();
    let names: Vec<&str> = specs.iter().map(|c| c.name.as_str()).collect();
    let types = target_types(target, &specs);
    let deletes = layout.shape.deletes();
    match (layout.staged, &layout.shape.key) {
        (Some(staged), Some(key)) => {
            let (deletes, records) = if staged.upgrade_pending {
                (false, false)
            } else {
                (deletes, staged.records)
            };
            let extras = staging_extras(deletes, records);
            let mut columns = vec!["exactly_gid", "exactly_seq"];
            columns.extend(names.iter().copied());
            columns.extend(extras.iter().map(|(name, _)| *name));
            out.copy_rows = format!(
                "COPY {} ({}) FROM STDIN (FORMAT binary)",
                layout.staging.sql(),
                ident_list(columns)
            );
            out.row_types = [Type::TEXT, Type::INT8]
                .into_iter()
                .chain(types)
                .chain(extras.into_iter().map(|(_, ty)| ty))
                .collect();
            out.merge = Some(merge_sql(settings, key, deletes, false));
            if records {
                out.merge_range = Some(merge_sql(settings, key, deletes, true));
            }
        }
        _ => {
            out.copy_rows = format!(
                "COPY {} ({}) FROM STDIN (FORMAT binary)",
                layout.table.sql(),
                ident_list(names.iter().copied())
            );
            out.row_types = types;
            if deletes {
                out.row_types.push(Type::BOOL);
            }
        }
    }
    out.shape.columns = specs;
    out
}
