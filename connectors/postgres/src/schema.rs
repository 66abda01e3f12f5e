//! The tables the sink uses: creating the missing ones and checking that the
//! existing ones fit the configuration, before any data flows.

use tokio_postgres::types::{Oid, Type};
use tokio_postgres::Client;

use exactly_core::ConnectorError;

use crate::config::{ColumnType, Settings, SinkMode};
use crate::convert::ColumnSpec;
use crate::error::classify;
use crate::numeric::NumericTypmod;
use crate::sql::{ident_list, quote_ident, QualifiedName};

/// Key of the advisory lock that serializes table creation between subtasks.
const DDL_LOCK_KEY: i64 = 0x6578_6163_746c_7964; // "exactlyd"

/// Columns of the commit-log table.
const COMMIT_LOG_COLUMNS: [(&str, Type); 7] = [
    ("gid", Type::TEXT),
    ("pipeline", Type::TEXT),
    ("sink_table", Type::TEXT),
    ("subtask", Type::INT4),
    ("checkpoint", Type::INT8),
    ("prepared_at", Type::TIMESTAMPTZ),
    ("committed_at", Type::TIMESTAMPTZ),
];

/// The commit-log column added after the first release that the sink needs;
/// tables created before get it at start.
const COMMITTED_AT: (&str, &str) = ("committed_at", "timestamptz");

/// The commit-log column that counts a marker's records (what a fallback
/// past its checkpoint duplicates). Optional: an older commit log gets it
/// at start when that is possible at once; until then markers go without
/// a count and fallbacks are not counted.
pub(crate) const RECORDS: (&str, &str) = ("records", "bigint");

/// Columns of the dead-letter table the sink fills, in COPY order (then
/// `dead_lettered_at`, which defaults to `now()`). `checkpoint` is the
/// checkpoint of the transaction in mode `two-phase`, and 0 in modes `upsert`
/// and `fenced`, which write before the checkpoint's id is known.
pub(crate) const DEAD_LETTER_COLUMNS: [(&str, Type); 10] = [
    ("pipeline", Type::TEXT),
    ("sink_table", Type::TEXT),
    ("split", Type::TEXT),
    ("topic", Type::TEXT),
    ("partition", Type::INT4),
    ("offset", Type::INT8),
    ("key", Type::BYTEA),
    ("value", Type::BYTEA),
    ("error", Type::TEXT),
    ("checkpoint", Type::INT8),
];

/// The staging table's own columns, before the mapped ones.
const STAGING_COLUMNS: [(&str, Type); 2] = [("exactly_gid", Type::TEXT), ("exactly_seq", Type::INT8)];

/// Columns of the positions table (mode `fenced`), whose primary key is
/// (`scope`, `split`).
const POSITIONS_COLUMNS: [(&str, Type); 4] = [
    ("scope", Type::TEXT),
    ("split", Type::TEXT),
    ("offset", Type::INT8),
    ("updated_at", Type::TIMESTAMPTZ),
];

/// What the sink learned about its tables; everything a write needs.
#[derive(Debug)]
pub(crate) struct Layout {
    /// The configured columns with the table's constraints.
    pub columns: Vec<ColumnSpec>,
    /// `COPY` of rows: into the target (append) or the staging table (upsert,
    /// where every row starts with gid and sequence number).
    pub copy_rows: String,
    pub row_types: Vec<Type>,
    pub copy_dead_letters: String,
    pub dead_letter_types: Vec<Type>,
    /// Mode `two-phase` with an upsert key: moves one gid's staged rows into
    /// the target (`$1` = gid).
    pub merge: Option<String>,
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
}

/// A column as the catalog describes it.
#[derive(Debug)]
struct ColumnInfo {
    name: String,
    type_oid: Oid,
    typmod: i32,
    not_null: bool,
    has_default: bool,
    generated: bool,
    type_text: String,
}

/// A relation as the catalog describes it.
#[derive(Debug)]
struct TableInfo {
    label: String,
    kind: String,
    columns: Vec<ColumnInfo>,
    can_insert: bool,
    can_update: bool,
    can_select: bool,
    can_delete: bool,
}

fn fatal(message: String) -> ConnectorError {
    ConnectorError::fatal("postgres sink: checking tables", message)
}

impl TableInfo {
    fn column(&self, name: &str) -> Option<&ColumnInfo> {
        self.columns.iter().find(|c| c.name == name)
    }

    fn require_privileges(&self, needed: &[&str]) -> Result<(), ConnectorError> {
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
    fn require_columns(&self, expected: &[(&str, Type)], fix: &str) -> Result<(), ConnectorError> {
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

async fn describe(
    client: &Client,
    url: &str,
    name: &QualifiedName,
    label: String,
) -> Result<Option<TableInfo>, ConnectorError> {
    let err = |e: tokio_postgres::Error| classify("postgres sink: inspecting tables", url, &e);
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
async fn existing(client: &Client, url: &str, name: &QualifiedName, fix: &str) -> Result<TableInfo, ConnectorError> {
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
async fn add_committed_at(client: &Client, url: &str, log: &QualifiedName) -> Result<(), ConnectorError> {
    let (name, ty) = COMMITTED_AT;
    add_commit_log_column(client, log, COMMITTED_AT, "5s")
        .await
        .map_err(|e| {
            fatal(format!(
                "the commit log {log} at {url} lacks the column {name} and adding it failed ({e}). Fix: run \
             ALTER TABLE {} ADD COLUMN {name} {ty} as its owner, after committing or rolling back the prepared \
             transactions that hold markers in it",
                log.sql()
            ))
        })
}

/// Adds `records` (optional) to an older commit log if that is possible at
/// once; otherwise warns and goes on without it (tried again at the next
/// start). Whether the commit log has it now.
async fn try_add_records(client: &Client, url: &str, log: &QualifiedName) -> bool {
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
    }
}

fn config_type_for(oid: Oid) -> Option<&'static str> {
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
    ]
    .into_iter()
    .find(|t| accepted_types(*t).iter().any(|a| a.oid() == oid))
    .map(ColumnType::config_name)
}

/// The DDL that creates the target table from the configuration.
fn create_target_sql(settings: &Settings) -> String {
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

fn create_commit_log_sql(name: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (gid text PRIMARY KEY, pipeline text NOT NULL, sink_table text NOT NULL, \
         subtask integer NOT NULL, checkpoint bigint NOT NULL, prepared_at timestamptz NOT NULL DEFAULT now(), \
         committed_at timestamptz, records bigint)",
        name.sql()
    )
}

/// The dead-letter table, indexed by record so that mode `upsert` finds a
/// dead letter it wrote before a crash quickly.
fn create_dead_letters_sql(name: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (pipeline text NOT NULL, sink_table text NOT NULL, split text NOT NULL, \
         topic text, \"partition\" integer, \"offset\" bigint NOT NULL, \"key\" bytea, \"value\" bytea NOT NULL, \
         error text NOT NULL, checkpoint bigint NOT NULL, dead_lettered_at timestamptz NOT NULL DEFAULT now()); \
         CREATE INDEX IF NOT EXISTS {index} ON {table} (split, \"offset\")",
        table = name.sql(),
        index = name.index_name("_record"),
    )
}

fn create_positions_sql(name: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (scope text NOT NULL, split text NOT NULL, \"offset\" bigint NOT NULL, \
         updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, split))",
        name.sql()
    )
}

/// The stored positions of one scope (`$1`): rows of (split, offset).
pub(crate) fn read_positions_sql(name: &QualifiedName) -> String {
    format!("SELECT split, \"offset\" FROM {} WHERE scope = $1", name.sql())
}

/// Advances the positions of scope `$1`: splits `$2`, new offsets `$3`, and
/// the offsets this sink read before (`$4`, NULL for a split it saw no
/// position for). A split is advanced only while its stored offset is still
/// the one read (compare-and-set; an absent row is inserted), so the returned
/// count is below the number of splits exactly when another writer moved a
/// position in the meantime.
pub(crate) fn advance_positions_sql(name: &QualifiedName) -> String {
    format!(
        "WITH input AS (SELECT * FROM unnest($2::pg_catalog.text[], $3::pg_catalog.int8[], $4::pg_catalog.int8[]) \
                        AS i(split, new_offset, old_offset)), \
              advanced AS (INSERT INTO {table} AS p (scope, split, \"offset\") \
                           SELECT $1, split, new_offset FROM input \
                           ON CONFLICT (scope, split) DO UPDATE SET \"offset\" = EXCLUDED.\"offset\", updated_at = now() \
                           WHERE p.\"offset\" = (SELECT old_offset FROM input WHERE input.split = EXCLUDED.split) \
                           RETURNING 1) \
         SELECT count(*) FROM advanced",
        table = name.sql()
    )
}

fn create_staging_sql(settings: &Settings) -> String {
    let staging = &settings.staging;
    format!(
        "CREATE TABLE IF NOT EXISTS {} AS SELECT ''::text AS exactly_gid, 0::bigint AS exactly_seq, {} FROM {} \
         WITH NO DATA; CREATE INDEX IF NOT EXISTS {} ON {} (exactly_gid)",
        staging.sql(),
        ident_list(settings.columns.iter().map(|(n, _)| n.as_str())),
        settings.table.sql(),
        staging.index_name("_gid"),
        staging.sql()
    )
}

/// Creates the tables of `wanted` that do not exist, in one transaction under
/// an advisory lock (subtasks recover concurrently).
async fn create_missing(client: &Client, url: &str, wanted: &[(&QualifiedName, String)]) -> Result<(), ConnectorError> {
    let err = |e: tokio_postgres::Error| classify("postgres sink: creating tables", url, &e);
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

/// Creates what is missing and checks every table the mode uses against the
/// configuration.
pub(crate) async fn prepare_tables(client: &Client, settings: &Settings) -> Result<Layout, ConnectorError> {
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
    target.require_privileges(if upsert {
        &["INSERT", "UPDATE", "SELECT"]
    } else {
        &["INSERT"]
    })?;
    if upsert {
        check_unique_key(client, settings).await?;
    }

    let table_fix =
        |key: &str| format!("drop or rename it so the sink can create it, or set sink.postgres.{key} to another table");
    let mut marker_counts_records = false;
    match settings.mode {
        SinkMode::TwoPhase => {
            let mut log = existing(client, url, &settings.commit_log, "").await?;
            if log.column(COMMITTED_AT.0).is_none() {
                add_committed_at(client, url, &settings.commit_log).await?;
                log = existing(client, url, &settings.commit_log, "").await?;
            }
            if log.column(RECORDS.0).is_none() && try_add_records(client, url, &settings.commit_log).await {
                log = existing(client, url, &settings.commit_log, "").await?;
            }
            if log.column(RECORDS.0).is_some() {
                log.require_columns(&[(RECORDS.0, Type::INT8)], &table_fix("commit_log_table"))?;
                marker_counts_records = true;
            }
            log.require_columns(&COMMIT_LOG_COLUMNS, &table_fix("commit_log_table"))?;
            // DELETE: old markers are pruned (`commit_log_retention`).
            log.require_privileges(&["INSERT", "SELECT", "UPDATE", "DELETE"])?;
        }
        SinkMode::Fenced => check_positions(client, settings, &table_fix("positions_table")).await?,
        SinkMode::Upsert => {}
    }
    let dead = existing(client, url, &settings.dead_letters, "").await?;
    dead.require_columns(&DEAD_LETTER_COLUMNS, &table_fix("dead_letter_table"))?;
    // Mode upsert looks for a dead letter before writing it again.
    dead.require_privileges(if settings.mode == SinkMode::Upsert {
        &["INSERT", "SELECT"]
    } else {
        &["INSERT"]
    })?;

    let names: Vec<&str> = settings.columns.iter().map(|(n, _)| n.as_str()).collect();
    let dead_letter_names = DEAD_LETTER_COLUMNS.iter().map(|(n, _)| *n);
    let mut layout = Layout {
        copy_rows: format!(
            "COPY {} ({}) FROM STDIN (FORMAT binary)",
            settings.table.sql(),
            ident_list(names.iter().copied())
        ),
        row_types: target_types(&target, &columns),
        copy_dead_letters: format!(
            "COPY {} ({}) FROM STDIN (FORMAT binary)",
            settings.dead_letters.sql(),
            ident_list(dead_letter_names)
        ),
        dead_letter_types: DEAD_LETTER_COLUMNS.iter().map(|(_, t)| t.clone()).collect(),
        merge: None,
        upsert: None,
        insert_dead_letters_once: insert_dead_letters_once_sql(&settings.dead_letters),
        marker_counts_records,
        columns,
    };
    if let (Some(key), SinkMode::Upsert | SinkMode::Fenced) = (&settings.upsert_key, settings.mode) {
        layout.upsert = Some(upsert_batch_sql(settings, key, &layout.row_types));
    }
    if let (Some(key), SinkMode::TwoPhase) = (&settings.upsert_key, settings.mode) {
        create_missing(client, url, &[(&settings.staging, create_staging_sql(settings))]).await?;
        let staging = existing(client, url, &settings.staging, "").await?;
        let fix = "drop it while no pipeline runs (it only holds rows between pre-commit and commit); the sink \
                   creates it again";
        staging.require_columns(&STAGING_COLUMNS, fix)?;
        for column in &layout.columns {
            let (want, have) = (target.column(&column.name), staging.column(&column.name));
            if want.map(|c| &c.type_text) != have.map(|c| &c.type_text) {
                return Err(fatal(format!(
                    "staging table {} does not match {}: column \"{}\" differs. Fix: {fix}",
                    settings.staging, settings.table, column.name
                )));
            }
        }
        staging.require_privileges(&["INSERT", "SELECT", "DELETE"])?;
        let mut staged = vec!["exactly_gid", "exactly_seq"];
        staged.extend(names.iter().copied());
        layout.copy_rows = format!(
            "COPY {} ({}) FROM STDIN (FORMAT binary)",
            settings.staging.sql(),
            ident_list(staged)
        );
        layout.row_types.splice(0..0, [Type::TEXT, Type::INT8]);
        layout.merge = Some(merge_sql(settings, key));
    }
    Ok(layout)
}

fn target_types(target: &TableInfo, columns: &[ColumnSpec]) -> Vec<Type> {
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
fn check_target(target: &TableInfo, settings: &Settings) -> Result<Vec<ColumnSpec>, ConnectorError> {
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
        let text_limit = (ty == ColumnType::Text && column.typmod >= 4).then(|| (column.typmod - 4) as usize);
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

/// Whether `table` has a unique index (or primary key) on exactly `key`.
async fn has_unique_key(
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
        .map_err(|e| classify("postgres sink: inspecting indexes", url, &e))?
        .get(0);
    Ok(found)
}

async fn check_unique_key(client: &Client, settings: &Settings) -> Result<(), ConnectorError> {
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
async fn check_positions(client: &Client, settings: &Settings, fix: &str) -> Result<(), ConnectorError> {
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

/// `$n::pg_catalog.<type>[]` for each type, comma-separated: the parameters
/// of a statement that takes a batch as one array per column.
fn array_params(types: &[Type]) -> String {
    types
        .iter()
        .enumerate()
        .map(|(i, t)| format!("${}::pg_catalog.{}[]", i + 1, t.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Upsert of a batch sent as one array per column; `WITH ORDINALITY` numbers
/// the rows so the last one per key wins.
fn upsert_batch_sql(settings: &Settings, key: &[usize], types: &[Type]) -> String {
    let all = ident_list(settings.columns.iter().map(|(n, _)| n.as_str()));
    let source = format!(
        "unnest({}) WITH ORDINALITY AS batch({all}, exactly_seq)",
        array_params(types)
    );
    upsert_from(settings, key, &source)
}

/// Dead letters sent as one array per column, minus those already stored.
fn insert_dead_letters_once_sql(name: &QualifiedName) -> String {
    let names = || DEAD_LETTER_COLUMNS.iter().map(|(n, _)| *n);
    let types: Vec<Type> = DEAD_LETTER_COLUMNS.iter().map(|(_, t)| t.clone()).collect();
    format!(
        "INSERT INTO {table} ({columns}) SELECT * FROM unnest({params}) AS d({columns}) \
         WHERE NOT EXISTS (SELECT 1 FROM {table} x WHERE x.split = d.split AND x.\"offset\" = d.\"offset\" \
                           AND x.pipeline = d.pipeline AND x.sink_table = d.sink_table)",
        table = name.sql(),
        columns = ident_list(names()),
        params = array_params(&types),
    )
}

/// Upsert of one gid's staged rows, deleting them: the last row per key wins.
/// Idempotent: a second run finds nothing left to move.
fn merge_sql(settings: &Settings, key: &[usize]) -> String {
    format!(
        "WITH batch AS (DELETE FROM {} WHERE exactly_gid = $1 RETURNING *) {}",
        settings.staging.sql(),
        upsert_from(settings, key, "batch")
    )
}

/// `INSERT INTO <table> ... SELECT` from `source` (which has the configured
/// columns and `exactly_seq`) `ON CONFLICT (<key>) DO UPDATE`, keeping the row
/// with the highest `exactly_seq` per key.
fn upsert_from(settings: &Settings, key: &[usize], source: &str) -> String {
    let all = ident_list(settings.columns.iter().map(|(n, _)| n.as_str()));
    let key_list = ident_list(key.iter().map(|i| settings.columns[*i].0.as_str()));
    let updates: Vec<String> = settings
        .columns
        .iter()
        .enumerate()
        .filter(|(i, _)| !key.contains(i))
        .map(|(_, (n, _))| format!("{0} = EXCLUDED.{0}", quote_ident(n)))
        .collect();
    let action = if updates.is_empty() {
        "DO NOTHING".to_string()
    } else {
        format!("DO UPDATE SET {}", updates.join(", "))
    };
    format!(
        "INSERT INTO {target} ({all}) \
         SELECT DISTINCT ON ({key_list}) {all} FROM {source} ORDER BY {key_list}, exactly_seq DESC \
         ON CONFLICT ({key_list}) {action}",
        target = settings.table.sql(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ColumnConfig, FieldSource, PostgresSinkConfig};

    fn settings(upsert: bool) -> Settings {
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

    #[test]
    fn merge_keeps_the_last_row_per_key() {
        let sql = merge_sql(&settings(true), &[0]);
        assert!(sql.contains("DISTINCT ON (\"id\")"), "{sql}");
        assert!(sql.contains("ORDER BY \"id\", exactly_seq DESC"), "{sql}");
        assert!(
            sql.contains("ON CONFLICT (\"id\") DO UPDATE SET \"v\" = EXCLUDED.\"v\""),
            "{sql}"
        );
        let only_key = merge_sql(&settings(true), &[0, 1]);
        assert!(only_key.ends_with("DO NOTHING"), "{only_key}");
    }

    #[test]
    fn batches_travel_as_one_array_per_column() {
        let sql = upsert_batch_sql(&settings(true), &[0], &[Type::INT8, Type::VARCHAR]);
        assert!(
            sql.contains(
                "FROM unnest($1::pg_catalog.int8[], $2::pg_catalog.varchar[]) WITH ORDINALITY AS batch(\"id\", \"v\", \
                 exactly_seq) ORDER BY \"id\", exactly_seq DESC ON CONFLICT (\"id\") DO UPDATE SET \"v\" = EXCLUDED.\"v\""
            ),
            "{sql}"
        );
        let dead = insert_dead_letters_once_sql(&settings(false).dead_letters);
        assert!(dead.contains("$10::pg_catalog.int8[]) AS d(\"pipeline\""), "{dead}");
        assert!(dead.contains("WHERE NOT EXISTS"), "{dead}");
        let advance = advance_positions_sql(&QualifiedName::parse("exactly_positions").unwrap());
        assert!(advance.contains("WHERE p.\"offset\" = (SELECT old_offset"), "{advance}");
    }

    #[test]
    fn every_config_type_maps_to_its_postgres_types() {
        assert_eq!(config_type_for(Type::VARCHAR.oid()), Some("text"));
        assert_eq!(config_type_for(Type::INT4.oid()), Some("int"));
        assert_eq!(config_type_for(Type::FLOAT8.oid()), Some("double"));
        assert_eq!(config_type_for(Type::UUID.oid()), None);
    }
}
