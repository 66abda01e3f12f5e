//! The tables the sink uses: creating the missing ones and checking that the
//! existing ones fit the configuration, before any data flows.
//!
//! ```text
//! prepare_tables ─► ddl (create what is missing) ─► catalog (describe) ─► check (fits the configuration)
//!                └─► statements (the SQL every write runs) ─► Layout
//! ```

mod catalog;
mod check;
mod ddl;
mod evolve;
mod statements;

pub(crate) use self::evolve::add_columns;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use exactly_core::ConnectorError;

use self::catalog::{existing, fatal, TableInfo};
use self::check::{
    check_positions, check_target, check_unique_key, target_types, COMMIT_LOG_COLUMNS, STAGING_COLUMNS, STAGING_DELETE,
    STAGING_RECORD,
};
use self::ddl::{
    add_committed_at, create_commit_log_sql, create_dead_letters_sql, create_missing, create_positions_sql,
    create_staging_sql, create_target_sql, try_add_records, try_add_staging_columns, try_allow_null_values,
    COMMITTED_AT,
};
use self::statements::{insert_dead_letters_once_sql, merge_sql, take_staged_sql, upsert_batch_sql};
use crate::config::{OnRejectedRow, Settings, SinkMode, Tombstones};
use crate::rows::{RowShape, DEAD_LETTER_COLUMNS};
use crate::sql::{ident_list, QualifiedName};

use self::ddl::RECORDS;
pub(crate) use self::statements::{advance_positions_sql, marker_sql, read_positions_sql};

/// What the sink learned about its tables; everything a write needs.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    /// The target table.
    pub table: QualifiedName,
    /// Its dead-letter table.
    pub dead_letters: QualifiedName,
    /// Its staging table (mode `two-phase` with a key).
    pub staging: QualifiedName,
    /// How records become rows: the configured columns with the table's
    /// constraints, the key, what a tombstone does.
    pub shape: RowShape,
    /// `COPY` of rows: into the target (append) or the staging table (upsert,
    /// where every row starts with gid and sequence number, see `staged`).
    pub copy_rows: String,
    /// The types of the rows the sink sends: in `copy_rows`, or to `upsert`.
    pub row_types: Vec<Type>,
    /// Mode `two-phase` with a key: how rows are staged.
    pub staged: Option<Staged>,
    /// Rows the server refuses go to the dead-letter table
    /// (`on_rejected_row = "dead-letter"`).
    pub isolate_rejected: bool,
    pub copy_dead_letters: String,
    pub dead_letter_types: Vec<Type>,
    /// Mode `two-phase` with an upsert key: moves one gid's staged rows into
    /// the target (`$1` = gid).
    pub merge: Option<String>,
    /// Mode `two-phase` with an upsert key and `isolate_rejected`: moves the
    /// staged rows of one gid (`$1`) with sequence numbers from `$2` to
    /// below `$3`.
    pub merge_range: Option<String>,
    /// Mode `two-phase` with an upsert key and `isolate_rejected`: deletes
    /// the staged row of gid `$1` and sequence number `$2`, returning its
    /// record (split, offset, key, value).
    pub take_staged: Option<String>,
    /// Modes `upsert` and `fenced` with an upsert key: upserts a batch given
    /// as one array per column (`$1`... in column order, types `row_types`),
    /// the last row per key winning.
    pub upsert: Option<String>,
    /// Inserts dead letters given as one array per column (types
    /// `dead_letter_types`) unless the table already holds the same record
    /// (pipeline, table, split, offset): mode `upsert`, whose replays repeat.
    pub insert_dead_letters_once: String,
    /// Mode `two-phase`: the commit log has the column `records` (see
    /// [`RECORDS`]), so markers count their records.
    pub marker_counts_records: bool,
    /// The dead-letter table's `value` column takes NULL (the null value of
    /// a tombstone). A table created before null values existed has it
    /// `NOT NULL` until a start can drop that (see
    /// [`try_allow_null_values`]); until then a null value is stored as
    /// empty bytes with the error saying it was null.
    pub dead_letter_null_values: bool,
}

/// How mode `two-phase` with a key stages its rows: every row starts with
/// the gid and a sequence number, then the columns, then (when tombstones
/// delete) the delete flag and (when refused rows are isolated) the
/// record's split, offset, key and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Staged {
    /// Rows end with their record's split, offset, key and value, which a
    /// dead letter of a row the merge refuses needs.
    pub records: bool,
    /// The staging table lacks columns the configuration needs, and adding
    /// them had to wait: [`upgrade_staging`] runs once the prepared
    /// transactions holding staged rows are committed.
    pub upgrade_pending: bool,
}

/// Creates what is missing and checks every table the mode uses against the
/// configuration.
pub(crate) async fn prepare_tables(client: &Client, settings: &Settings) -> Result<Layout, ConnectorError> {
    let adopted;
    let settings = if settings.add_columns {
        adopted = evolve::with_added_columns(client, settings).await?;
        &adopted
    } else {
        settings
    };
    let url = &settings.url;
    let mut wanted = vec![(&settings.dead_letters, create_dead_letters_sql(&settings.dead_letters))];
    match settings.mode {
        SinkMode::TwoPhase => wanted.push((&settings.commit_log, create_commit_log_sql(&settings.commit_log))),
        SinkMode::Fenced => wanted.push((&settings.positions, create_positions_sql(&settings.positions))),
        SinkMode::Upsert => {}
    }
    if settings.create_table {
        wanted.push((&settings.table, create_target_sql(settings)));
    }
    create_missing(client, url, &wanted).await?;

    let target = existing(
        client,
        url,
        &settings.table,
        "create it, or set sink.postgres.create_table = true to let the sink create it",
    )
    .await?;
    let columns = check_target(&target, settings)?;
    let upsert = settings.upsert_key.is_some();
    let deletes = settings.tombstones == Tombstones::Delete;
    target.require_privileges(match (upsert, deletes) {
        (true, true) => &["INSERT", "UPDATE", "SELECT", "DELETE"],
        (true, false) => &["INSERT", "UPDATE", "SELECT"],
        (false, _) => &["INSERT"],
    })?;
    if upsert {
        check_unique_key(client, settings).await?;
    }

    let table_fix =
        |key: &str| format!("drop or rename it so the sink can create it, or set sink.postgres.{key} to another table");
    let mut marker_counts_records = false;
    match settings.mode {
        SinkMode::TwoPhase => marker_counts_records = check_commit_log(client, settings).await?,
        SinkMode::Fenced => check_positions(client, settings, &table_fix("positions_table")).await?,
        SinkMode::Upsert => {}
    }
    let dead = existing(client, url, &settings.dead_letters, "").await?;
    dead.require_columns(&DEAD_LETTER_COLUMNS, &table_fix("dead_letter_table"))?;
    let dead_letter_null_values = match dead.column("value") {
        Some(column) if column.not_null => try_allow_null_values(client, url, &settings.dead_letters).await,
        _ => true,
    };
    // Mode upsert looks for a dead letter before writing it again.
    dead.require_privileges(if settings.mode == SinkMode::Upsert {
        &["INSERT", "SELECT"]
    } else {
        &["INSERT"]
    })?;

    let names: Vec<&str> = settings.columns.iter().map(|(n, _)| n.as_str()).collect();
    let dead_letter_names = DEAD_LETTER_COLUMNS.iter().map(|(n, _)| *n);
    let isolate_rejected = settings.on_rejected_row == OnRejectedRow::DeadLetter;
    let mut row_types = target_types(&target, &columns);
    if deletes {
        row_types.push(Type::BOOL);
    }
    let mut layout = Layout {
        table: settings.table.clone(),
        dead_letters: settings.dead_letters.clone(),
        staging: settings.staging.clone(),
        copy_rows: format!(
            "COPY {} ({}) FROM STDIN (FORMAT binary)",
            settings.table.sql(),
            ident_list(names.iter().copied())
        ),
        row_types,
        staged: None,
        isolate_rejected,
        copy_dead_letters: format!(
            "COPY {} ({}) FROM STDIN (FORMAT binary)",
            settings.dead_letters.sql(),
            ident_list(dead_letter_names)
        ),
        dead_letter_types: DEAD_LETTER_COLUMNS.iter().map(|(_, t)| t.clone()).collect(),
        merge: None,
        merge_range: None,
        take_staged: None,
        upsert: None,
        insert_dead_letters_once: insert_dead_letters_once_sql(&settings.dead_letters),
        marker_counts_records,
        dead_letter_null_values,
        shape: RowShape {
            columns,
            key: settings.upsert_key.clone(),
            tombstones: settings.tombstones,
        },
    };
    if let (Some(key), SinkMode::Upsert | SinkMode::Fenced) = (&settings.upsert_key, settings.mode) {
        layout.upsert = Some(upsert_batch_sql(settings, key, &layout.row_types, deletes));
    }
    if let (Some(key), SinkMode::TwoPhase) = (&settings.upsert_key, settings.mode) {
        stage(client, settings, key, &target, &mut layout).await?;
    }
    Ok(layout)
}

/// Mode `two-phase`: creates the commit log when absent and checks it
/// (before any target table is known, with a table per topic). Returns
/// whether markers count their records (the column `records`, see
/// [`RECORDS`]).
pub(crate) async fn prepare_commit_log(client: &Client, settings: &Settings) -> Result<bool, ConnectorError> {
    let wanted = [(&settings.commit_log, create_commit_log_sql(&settings.commit_log))];
    create_missing(client, &settings.url, &wanted).await?;
    check_commit_log(client, settings).await
}

/// Checks the commit log, adding the columns an older one lacks; whether
/// markers count their records.
async fn check_commit_log(client: &Client, settings: &Settings) -> Result<bool, ConnectorError> {
    let url = &settings.url;
    let fix = "drop or rename it so the sink can create it, or set sink.postgres.commit_log_table to another table";
    let mut log = existing(client, url, &settings.commit_log, "").await?;
    if log.column(COMMITTED_AT.0).is_none() {
        add_committed_at(client, url, &settings.commit_log).await?;
        log = existing(client, url, &settings.commit_log, "").await?;
    }
    if log.column(RECORDS.0).is_none() && try_add_records(client, url, &settings.commit_log).await {
        log = existing(client, url, &settings.commit_log, "").await?;
    }
    let counts_records = log.column(RECORDS.0).is_some();
    if counts_records {
        log.require_columns(&[(RECORDS.0, Type::INT8)], fix)?;
    }
    log.require_columns(&COMMIT_LOG_COLUMNS, fix)?;
    // DELETE: old markers are pruned (`commit_log_retention`).
    log.require_privileges(&["INSERT", "SELECT", "UPDATE", "DELETE"])?;
    Ok(counts_records)
}

/// Mode `two-phase` with a key: creates or checks the staging table and
/// sets how rows are staged and merged.
async fn stage(
    client: &Client,
    settings: &Settings,
    key: &[usize],
    target: &TableInfo,
    layout: &mut Layout,
) -> Result<(), ConnectorError> {
    let url = &settings.url;
    create_missing(client, url, &[(&settings.staging, create_staging_sql(settings))]).await?;
    let mut staging = existing(client, url, &settings.staging, "").await?;
    let fix = "drop it while no pipeline runs (it only holds rows between pre-commit and commit); the sink \
               creates it again";
    staging.require_columns(&STAGING_COLUMNS, fix)?;
    for column in &layout.shape.columns {
        let (want, have) = (target.column(&column.name), staging.column(&column.name));
        if want.map(|c| &c.type_text) != have.map(|c| &c.type_text) {
            return Err(fatal(format!(
                "staging table {} does not match {}: column \"{}\" differs. Fix: {fix}",
                settings.staging, settings.table, column.name
            )));
        }
    }
    staging.require_privileges(&["INSERT", "SELECT", "DELETE"])?;
    let (deletes, records) = (layout.shape.deletes(), layout.isolate_rejected);
    let needed = staging_extras(deletes, records);
    let mut upgrade_pending = false;
    if needed.iter().any(|(name, _)| staging.column(name).is_none()) {
        // Created by an older version: prepared transactions may hold rows
        // of it, which only recovery commits; then it is added for sure.
        if try_add_staging_columns(client, &settings.staging, "1s").await.is_ok() {
            staging = existing(client, url, &settings.staging, "").await?;
        } else {
            upgrade_pending = true;
        }
    }
    let (deletes, records) = if upgrade_pending {
        (false, false)
    } else {
        staging.require_columns(&needed, fix)?;
        (deletes, records)
    };
    let mut staged = vec!["exactly_gid", "exactly_seq"];
    staged.extend(layout.shape.columns.iter().map(|c| c.name.as_str()));
    staged.extend(staging_extras(deletes, records).iter().map(|(name, _)| *name));
    layout.copy_rows = format!(
        "COPY {} ({}) FROM STDIN (FORMAT binary)",
        settings.staging.sql(),
        ident_list(staged)
    );
    layout.row_types = [Type::TEXT, Type::INT8]
        .into_iter()
        .chain(target_types(target, &layout.shape.columns))
        .chain(staging_extras(deletes, records).into_iter().map(|(_, ty)| ty))
        .collect();
    layout.merge = Some(merge_sql(settings, key, deletes, false));
    if records {
        layout.merge_range = Some(merge_sql(settings, key, deletes, true));
        layout.take_staged = Some(take_staged_sql(&settings.staging));
    }
    layout.staged = Some(Staged {
        records,
        upgrade_pending,
    });
    Ok(())
}

/// The staging columns after the configured ones: the delete flag, and the
/// record's split, offset, key and value.
pub(super) fn staging_extras(deletes: bool, records: bool) -> Vec<(&'static str, Type)> {
    let mut extras = Vec::new();
    if deletes {
        extras.push(STAGING_DELETE);
    }
    if records {
        extras.extend(STAGING_RECORD);
    }
    extras
}

/// Adds the staging columns an older staging table lacks, now that no
/// prepared transaction of the pipeline holds rows of it (after recovery).
/// Fails when that is still impossible, naming the fix.
pub(crate) async fn upgrade_staging(client: &Client, settings: &Settings) -> Result<(), ConnectorError> {
    try_add_staging_columns(client, &settings.staging, "10s")
        .await
        .map_err(|e| {
            fatal(format!(
            "the staging table {} lacks columns that delete.enabled or on_rejected_row = \"dead-letter\" need, and \
             adding them failed. Fix: drop the staging table while no pipeline runs (it only holds rows between \
             pre-commit and commit; the sink creates it again), or run ALTER TABLE ... ADD COLUMN for them as its \
             owner",
            settings.staging
        ))
            .caused_by(e)
        })
}

#[cfg(test)]
pub(crate) mod test_support {
    use crate::config::{ColumnConfig, ColumnType, FieldSource, PostgresSinkConfig, Settings};

    pub(crate) fn settings(upsert: bool) -> Settings {
        let mut config = PostgresSinkConfig::new("postgres://u@h/db", "s.t")
            .column(
                "id",
                ColumnConfig::new(
                    FieldSource::Pointer(exactly_core::JsonPointer::parse("/id").unwrap()),
                    ColumnType::BigInt,
                ),
            )
            .column("v", ColumnConfig::new(FieldSource::Value, ColumnType::Text));
        config.columns.0[1].1.required = false;
        if upsert {
            config.upsert_key = Some(vec!["id".into()]);
        }
        config.settings().unwrap()
    }
}
