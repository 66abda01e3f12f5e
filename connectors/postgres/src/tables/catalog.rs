//! What the catalog says about a table: its columns, kind, privileges and
//! unique keys.

use exactly_core::ConnectorError;
use tokio_postgres::types::{Oid, Type};
use tokio_postgres::Client;

use crate::conn::error::classify;
use crate::sql::QualifiedName;

/// A column as the catalog describes it.
#[derive(Debug)]
pub(super) struct ColumnInfo {
    pub name: String,
    pub type_oid: Oid,
    pub typmod: i32,
    pub not_null: bool,
    pub has_default: bool,
    pub generated: bool,
    pub type_text: String,
}

/// A relation as the catalog describes it.
#[derive(Debug)]
pub(super) struct TableInfo {
    pub label: String,
    pub kind: String,
    pub columns: Vec<ColumnInfo>,
    pub can_insert: bool,
    pub can_update: bool,
    pub can_select: bool,
    pub can_delete: bool,
}

pub(super) fn fatal(message: String) -> ConnectorError {
    ConnectorError::fatal("postgres sink: checking tables", message)
}

impl TableInfo {
    pub(super) fn column(&self, name: &str) -> Option<&ColumnInfo> {
        self.columns.iter().find(|c| c.name == name)
    }

    pub(super) fn require_privileges(&self, needed: &[&str]) -> Result<(), ConnectorError> {
        let missing: Vec<&str> = needed
            .iter()
            .copied()
            .filter(|p| match *p {
                "INSERT" => !self.can_insert,
                "UPDATE" => !self.can_update,
                "SELECT" => !self.can_select,
                _ => !self.can_delete,
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(fatal(format!(
            "the sink's user lacks {} on table {}. Fix: GRANT {} ON {} TO <the user in sink.postgres.url>",
            missing.join(", "),
            self.label,
            needed.join(", "),
            self.label
        )))
    }

    /// Checks that the sink's own columns exist with the right types.
    pub(super) fn require_columns(&self, expected: &[(&str, Type)], fix: &str) -> Result<(), ConnectorError> {
        for (name, ty) in expected {
            match self.column(name) {
                Some(c) if c.type_oid == ty.oid() => {}
                found => {
                    let found = found.map_or("missing".to_string(), |c| format!("of type {}", c.type_text));
                    return Err(fatal(format!(
                        "table {} does not have the layout the sink needs: column \"{name}\" should be {} but is {found}. \
                         Fix: {fix}",
                        self.label,
                        ty.name()
                    )));
                }
            }
        }
        Ok(())
    }
}

pub(super) async fn describe(
    client: &Client,
    url: &str,
    name: &QualifiedName,
    label: String,
) -> Result<Option<TableInfo>, ConnectorError> {
    let err = |e: tokio_postgres::Error| classify("postgres sink: inspecting tables", url, e);
    let relation = client
        .query_opt(
            "SELECT c.oid, c.relkind::text, has_any_column_privilege(c.oid, 'INSERT'), \
                    has_any_column_privilege(c.oid, 'UPDATE'), has_any_column_privilege(c.oid, 'SELECT'), \
                    has_table_privilege(c.oid, 'DELETE') \
             FROM pg_class c WHERE c.oid = to_regclass($1)::oid",
            &[&name.sql()],
        )
        .await
        .map_err(err)?;
    let Some(relation) = relation else {
        return Ok(None);
    };
    let oid: Oid = relation.get(0);
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, a.atttypmod, a.attnotnull, \
                    (a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> ''), a.attgenerated <> '', \
                    format_type(a.atttypid, a.atttypmod) \
             FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&oid],
        )
        .await
        .map_err(err)?;
    Ok(Some(TableInfo {
        label,
        kind: relation.get(1),
        can_insert: relation.get(2),
        can_update: relation.get(3),
        can_select: relation.get(4),
        can_delete: relation.get(5),
        columns: rows
            .iter()
            .map(|r| ColumnInfo {
                name: r.get(0),
                type_oid: r.get(1),
                typmod: r.get(2),
                not_null: r.get(3),
                has_default: r.get(4),
                generated: r.get(5),
                type_text: r.get(6),
            })
            .collect(),
    }))
}

/// Describes a table that must exist.
pub(super) async fn existing(
    client: &Client,
    url: &str,
    name: &QualifiedName,
    fix: &str,
) -> Result<TableInfo, ConnectorError> {
    let info = describe(client, url, name, name.to_string()).await?.ok_or_else(|| {
        fatal(format!(
            "table {name} does not exist in the database at {url}. Fix: {fix}"
        ))
    })?;
    if !matches!(info.kind.as_str(), "r" | "p") {
        return Err(fatal(format!(
            "{name} is not a table (relkind {}): the sink writes with COPY, which needs a plain or partitioned \
             table. Fix: point the sink at a table",
            info.kind
        )));
    }
    Ok(info)
}

/// Whether `table` has a unique index (or primary key) on exactly `key`.
pub(super) async fn has_unique_key(
    client: &Client,
    url: &str,
    table: &QualifiedName,
    key: &[String],
) -> Result<bool, ConnectorError> {
    let found: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM ( \
                 SELECT (SELECT array_agg(a.attname::text) FROM generate_series(0, i.indnkeyatts - 1) k \
                         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[k]) AS cols \
                 FROM pg_index i \
                 WHERE i.indrelid = to_regclass($1)::oid AND i.indisunique AND i.indpred IS NULL \
                   AND i.indexprs IS NULL) u \
             WHERE u.cols @> $2::text[] AND u.cols <@ $2::text[])",
            &[&table.sql(), &key],
        )
        .await
        .map_err(|e| classify("postgres sink: inspecting indexes", url, e))?
        .get(0);
    Ok(found)
}
