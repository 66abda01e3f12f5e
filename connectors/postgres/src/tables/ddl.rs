//! Creating the tables the sink needs, and the columns older versions of
//! its own tables lack.

use exactly_core::ConnectorError;
use tokio_postgres::Client;

use super::catalog::fatal;
use crate::config::Settings;
use crate::conn::error::classify;
use crate::sql::{ident_list, quote_ident, QualifiedName};

/// Key of the advisory lock that serializes table creation between subtasks.
const DDL_LOCK_KEY: i64 = 0x6578_6163_746c_7964; // "exactlyd"

/// The commit-log column added after the first release that the sink needs;
/// tables created before get it at start.
pub(super) const COMMITTED_AT: (&str, &str) = ("committed_at", "timestamptz");

/// The commit-log column that counts a marker's records (what a fallback
/// past its checkpoint duplicates). Optional: an older commit log gets it
/// at start when that is possible at once; until then markers go without
/// a count and fallbacks are not counted.
pub(super) const RECORDS: (&str, &str) = ("records", "bigint");

/// Adds the column `name` of type `ty` to a commit log created before it
/// existed. Only when it is missing: `ALTER TABLE` waits for every prepared
/// transaction holding a marker, which only the sinks' recovery (after this
/// check) commits, so the wait is bounded by `lock_timeout`.
async fn add_commit_log_column(
    client: &Client,
    log: &QualifiedName,
    (name, ty): (&str, &str),
    lock_timeout: &str,
) -> Result<(), tokio_postgres::Error> {
    let sql = format!(
        "BEGIN; SET LOCAL lock_timeout = '{lock_timeout}'; ALTER TABLE {} ADD COLUMN IF NOT EXISTS {name} {ty}; \
         COMMIT",
        log.sql()
    );
    let added = client.batch_execute(&sql).await;
    if added.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    } else {
        tracing::info!(table = %log, "added the column {name} to the commit log");
    }
    added
}

/// Adds `committed_at` (needed) to an older commit log; an error names the
/// fix.
pub(super) async fn add_committed_at(client: &Client, url: &str, log: &QualifiedName) -> Result<(), ConnectorError> {
    let (name, ty) = COMMITTED_AT;
    add_commit_log_column(client, log, COMMITTED_AT, "5s")
        .await
        .map_err(|e| {
            fatal(format!(
                "the commit log {log} at {url} lacks the column {name} and adding it failed. Fix: run \
                 ALTER TABLE {} ADD COLUMN {name} {ty} as its owner, after committing or rolling back the prepared \
                 transactions that hold markers in it",
                log.sql()
            ))
            .caused_by(e)
        })
}

/// Adds `records` (optional) to an older commit log if that is possible at
/// once; otherwise warns and goes on without it (tried again at the next
/// start). Whether the commit log has it now.
pub(super) async fn try_add_records(client: &Client, url: &str, log: &QualifiedName) -> bool {
    let (name, ty) = RECORDS;
    match add_commit_log_column(client, log, RECORDS, "1s").await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(
                table = %log, %url, %error,
                "the commit log lacks the column {name}, and adding it now failed (prepared transactions hold \
                 markers in it, or this role does not own it): markers are written without their record count, \
                 so the duplicates of a fallback past them are not counted. Tried again at the next start; or run \
                 ALTER TABLE {} ADD COLUMN {name} {ty} as its owner",
                log.sql()
            );
            false
        }
    }
}

/// Lets the `value` column of a dead-letter table created before null
/// values existed take NULL, if that is possible at once (the `ALTER TABLE`
/// waits for prepared transactions holding dead letters, which only the
/// recovery after this check ends, so it gives up after a second); otherwise
/// warns (tried again at the next start). Whether it takes NULL now.
pub(super) async fn try_allow_null_values(client: &Client, url: &str, table: &QualifiedName) -> bool {
    let sql = format!(
        "BEGIN; SET LOCAL lock_timeout = '1s'; ALTER TABLE {} ALTER COLUMN \"value\" DROP NOT NULL; COMMIT",
        table.sql()
    );
    match client.batch_execute(&sql).await {
        Ok(()) => {
            tracing::info!(table = %table, "the dead-letter table's value column takes NULL now (null values)");
            true
        }
        Err(error) => {
            let _ = client.batch_execute("ROLLBACK").await;
            tracing::warn!(
                table = %table, %url, %error,
                "the dead-letter table's value column is NOT NULL and dropping that failed (prepared transactions \
                 hold dead letters in it, or this role does not own it): a dead letter of a null value is stored \
                 with empty bytes and its error says the value was null. Tried again at the next start; or run \
                 ALTER TABLE {} ALTER COLUMN \"value\" DROP NOT NULL as its owner",
                table.sql()
            );
            false
        }
    }
}

/// The DDL that creates the target table from the configuration.
pub(super) fn create_target_sql(settings: &Settings) -> String {
    let mut parts: Vec<String> = settings
        .columns
        .iter()
        .map(|(name, c)| {
            format!(
                "{} {}{}",
                quote_ident(name),
                c.column_type.sql_name(),
                if c.required { " NOT NULL" } else { "" }
            )
        })
        .collect();
    if let Some(key) = &settings.upsert_key {
        parts.push(format!(
            "PRIMARY KEY ({})",
            ident_list(key.iter().map(|i| settings.columns[*i].0.as_str()))
        ));
    }
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({})",
        settings.table.sql(),
        parts.join(", ")
    )
}

pub(super) fn create_commit_log_sql(name: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (gid text PRIMARY KEY, pipeline text NOT NULL, sink_table text NOT NULL, \
         subtask integer NOT NULL, checkpoint bigint NOT NULL, prepared_at timestamptz NOT NULL DEFAULT now(), \
         committed_at timestamptz, records bigint)",
        name.sql()
    )
}

/// The dead-letter table, indexed by record so that mode `upsert` finds a
/// dead letter it wrote before a crash quickly.
pub(super) fn create_dead_letters_sql(name: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (pipeline text NOT NULL, sink_table text NOT NULL, split text NOT NULL, \
         topic text, \"partition\" integer, \"offset\" bigint NOT NULL, \"key\" bytea, \"value\" bytea, \
         error text NOT NULL, checkpoint bigint NOT NULL, dead_lettered_at timestamptz NOT NULL DEFAULT now()); \
         CREATE INDEX IF NOT EXISTS {index} ON {table} (split, \"offset\")",
        table = name.sql(),
        index = name.index_name("_record"),
    )
}

pub(super) fn create_positions_sql(name: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (scope text NOT NULL, split text NOT NULL, \"offset\" bigint NOT NULL, \
         updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, split))",
        name.sql()
    )
}

pub(super) fn create_staging_sql(settings: &Settings) -> String {
    let staging = &settings.staging;
    format!(
        "CREATE TABLE IF NOT EXISTS {} AS SELECT ''::text AS exactly_gid, 0::bigint AS exactly_seq, {}, \
         false AS exactly_delete, NULL::text AS exactly_split, NULL::bigint AS exactly_offset, \
         NULL::bytea AS exactly_key, NULL::bytea AS exactly_value FROM {} \
         WITH NO DATA; CREATE INDEX IF NOT EXISTS {} ON {} (exactly_gid)",
        staging.sql(),
        ident_list(settings.columns.iter().map(|(n, _)| n.as_str())),
        settings.table.sql(),
        staging.index_name("_gid"),
        staging.sql()
    )
}

/// Adds to a staging table created by an older version the columns of the
/// delete flag and of a row's record (nullable: rows staged without them
/// are upserts whose record is not kept), waiting at most `lock_timeout`
/// for the transactions that hold rows of it.
pub(super) async fn try_add_staging_columns(
    client: &Client,
    staging: &QualifiedName,
    lock_timeout: &str,
) -> Result<(), tokio_postgres::Error> {
    let sql = format!(
        "BEGIN; SET LOCAL lock_timeout = '{lock_timeout}'; ALTER TABLE {} ADD COLUMN IF NOT EXISTS exactly_delete \
         boolean, ADD COLUMN IF NOT EXISTS exactly_split text, ADD COLUMN IF NOT EXISTS exactly_offset bigint, \
         ADD COLUMN IF NOT EXISTS exactly_key bytea, ADD COLUMN IF NOT EXISTS exactly_value bytea; COMMIT",
        staging.sql()
    );
    let added = client.batch_execute(&sql).await;
    match &added {
        Ok(()) => tracing::info!(table = %staging, "added the delete flag and record columns to the staging table"),
        Err(error) => {
            let _ = client.batch_execute("ROLLBACK").await;
            tracing::warn!(table = %staging, %error, "adding columns to the staging table must wait for recovery");
        }
    }
    added
}

/// Creates the tables of `wanted` that do not exist, in one transaction under
/// an advisory lock (subtasks recover concurrently).
pub(super) async fn create_missing(
    client: &Client,
    url: &str,
    wanted: &[(&QualifiedName, String)],
) -> Result<(), ConnectorError> {
    let err = |e: tokio_postgres::Error| classify("postgres sink: creating tables", url, e);
    let mut missing = Vec::new();
    for (name, sql) in wanted {
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name.sql()])
            .await
            .map_err(err)?
            .get(0);
        if !exists {
            missing.push((*name, sql));
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let result = async {
        client
            .batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({DDL_LOCK_KEY})"))
            .await?;
        for (name, sql) in &missing {
            tracing::info!(table = %name, "creating table");
            client.batch_execute(sql).await?;
        }
        client.batch_execute("COMMIT").await
    }
    .await;
    if let Err(e) = result {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(err(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::test_support::settings;

    #[test]
    fn ddl_follows_the_configuration() {
        assert_eq!(
            create_target_sql(&settings(true)),
            "CREATE TABLE IF NOT EXISTS \"s\".\"t\" (\"id\" bigint NOT NULL, \"v\" text, PRIMARY KEY (\"id\"))"
        );
        assert_eq!(
            create_target_sql(&settings(false)),
            "CREATE TABLE IF NOT EXISTS \"s\".\"t\" (\"id\" bigint NOT NULL, \"v\" text)"
        );
        assert!(create_staging_sql(&settings(true)).contains("\"s\".\"t_exactly_staging\" AS SELECT"));
    }
}
