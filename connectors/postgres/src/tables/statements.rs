//! The statements that write: upserts of a batch sent as one array per
//! column, the merge of staged rows, dead letters written once, the fence's
//! positions. Pure text, built once when the tables are checked.

use tokio_postgres::types::Type;

use crate::config::Settings;
use crate::rows::DEAD_LETTER_COLUMNS;
use crate::sql::{ident_list, quote_ident, QualifiedName};

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

/// Upsert of a batch sent as one array per column (of `types`, the delete
/// flag last when `deletes`); `WITH ORDINALITY` numbers the rows so the last
/// one per key wins.
pub(super) fn upsert_batch_sql(settings: &Settings, key: &[usize], types: &[Type], deletes: bool) -> String {
    let all = ident_list(settings.columns.iter().map(|(n, _)| n.as_str()));
    let flag = if deletes { ", exactly_delete" } else { "" };
    let unnest = format!(
        "unnest({}) WITH ORDINALITY AS batch({all}{flag}, exactly_seq)",
        array_params(types)
    );
    if !deletes {
        return upsert_from(settings, key, Vec::new(), &unnest, false);
    }
    let batch = format!("batch AS (SELECT * FROM {unnest})");
    upsert_from(settings, key, vec![batch], "batch", true)
}

/// Dead letters sent as one array per column, minus those already stored.
pub(super) fn insert_dead_letters_once_sql(name: &QualifiedName) -> String {
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

/// Upsert of one gid's staged rows (`$1`), deleting them: the last row per
/// key wins (a delete, when `deletes`, removes the key's row). With `range`,
/// only the rows with sequence numbers from `$2` to below `$3`. Idempotent:
/// a second run finds nothing left to move.
pub(super) fn merge_sql(settings: &Settings, key: &[usize], deletes: bool, range: bool) -> String {
    let filter = if range {
        "exactly_gid = $1 AND exactly_seq >= $2 AND exactly_seq < $3"
    } else {
        "exactly_gid = $1"
    };
    let batch = format!(
        "batch AS (DELETE FROM {} WHERE {filter} RETURNING *)",
        settings.staging.sql()
    );
    upsert_from(settings, key, vec![batch], "batch", deletes)
}

/// Deletes the staged row of gid `$1` and sequence number `$2`, returning
/// its record: split, offset, key, value.
pub(super) fn take_staged_sql(staging: &QualifiedName) -> String {
    format!(
        "DELETE FROM {} WHERE exactly_gid = $1 AND exactly_seq = $2 \
         RETURNING exactly_split, exactly_offset, exactly_key, exactly_value",
        staging.sql()
    )
}

/// `INSERT INTO <table> ... SELECT` from `source` (which has the configured
/// columns and `exactly_seq`, and `exactly_delete` when `deletes`; defined
/// by the common table expressions `ctes`) `ON CONFLICT (<key>) DO UPDATE`,
/// keeping the row with the highest `exactly_seq` per key. With `deletes`,
/// a key whose last row is a delete has its row deleted instead (in the
/// same statement: each key is either deleted or upserted).
fn upsert_from(settings: &Settings, key: &[usize], mut ctes: Vec<String>, source: &str, deletes: bool) -> String {
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
    let target = settings.table.sql();
    let insert = if deletes {
        let matches: Vec<String> = key
            .iter()
            .map(|i| format!("t.{0} = last.{0}", quote_ident(&settings.columns[*i].0)))
            .collect();
        ctes.push(format!(
            "last AS (SELECT DISTINCT ON ({key_list}) * FROM {source} ORDER BY {key_list}, exactly_seq DESC)"
        ));
        ctes.push(format!(
            "removed AS (DELETE FROM {target} t USING last WHERE last.exactly_delete AND {})",
            matches.join(" AND ")
        ));
        format!(
            "INSERT INTO {target} ({all}) SELECT {all} FROM last WHERE NOT coalesce(last.exactly_delete, false) \
             ON CONFLICT ({key_list}) {action}"
        )
    } else {
        format!(
            "INSERT INTO {target} ({all}) \
             SELECT DISTINCT ON ({key_list}) {all} FROM {source} ORDER BY {key_list}, exactly_seq DESC \
             ON CONFLICT ({key_list}) {action}"
        )
    };
    if ctes.is_empty() {
        insert
    } else {
        format!("WITH {} {insert}", ctes.join(", "))
    }
}

/// The statement that writes a transaction's commit marker (`$1`..`$5`:
/// gid, pipeline, table, subtask, checkpoint; `$6` the record count when
/// the commit log has the column, see [`RECORDS`](super::ddl::RECORDS)). A marker
/// left by an earlier attempt under the same gid is replaced.
pub(crate) fn marker_sql(log: &QualifiedName, counts_records: bool) -> String {
    let (column, value, update) = if counts_records {
        (", records", ", $6", ", records = EXCLUDED.records")
    } else {
        ("", "", "")
    };
    format!(
        "INSERT INTO {} (gid, pipeline, sink_table, subtask, checkpoint{column}) VALUES ($1, $2, $3, $4, $5{value}) \
         ON CONFLICT (gid) DO UPDATE SET pipeline = EXCLUDED.pipeline, sink_table = EXCLUDED.sink_table, \
         subtask = EXCLUDED.subtask, checkpoint = EXCLUDED.checkpoint{update}, prepared_at = now()",
        log.sql()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::test_support::settings;

    #[test]
    fn merge_keeps_the_last_row_per_key() {
        let sql = merge_sql(&settings(true), &[0], false, false);
        assert!(sql.contains("DISTINCT ON (\"id\")"), "{sql}");
        assert!(sql.contains("ORDER BY \"id\", exactly_seq DESC"), "{sql}");
        assert!(
            sql.contains("ON CONFLICT (\"id\") DO UPDATE SET \"v\" = EXCLUDED.\"v\""),
            "{sql}"
        );
        let only_key = merge_sql(&settings(true), &[0, 1], false, false);
        assert!(only_key.ends_with("DO NOTHING"), "{only_key}");
    }

    #[test]
    fn batches_travel_as_one_array_per_column() {
        let sql = upsert_batch_sql(&settings(true), &[0], &[Type::INT8, Type::VARCHAR], false);
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
}
