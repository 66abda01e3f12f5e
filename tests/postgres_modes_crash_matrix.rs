//! The crash matrix over the PostgreSQL sink's modes without prepared
//! transactions, through the `exactly` binary: the sequence source (4 splits
//! of 1500 records, values `seq-<split>:<offset>`) into a table, SIGKILL at
//! every phase, restart, and the table must hold every record exactly once.
//!
//! - mode `fenced` into an append-only table WITHOUT any unique key: `count(*)`
//!   is the number of records and no (partition, offset) repeats;
//! - mode `upsert` keyed on (partition, offset).
//!
//! Both run on a server of their own with `max_prepared_transactions = 0`,
//! even when `EXACTLY_DATABASE_URL` names one. Negative controls (on the
//! `EXACTLY_DATABASE_URL` server when set): removing the fence's positions
//! after a crash makes the replay duplicate rows (so the fence is what keeps
//! the table exact, and the check sees duplicates), and in at-least-once mode
//! the same append table duplicates rows in mode `two-phase` but not in mode
//! `fenced`.

mod common;

use std::collections::BTreeMap;

use common::*;
use exactly_testkit::PostgresServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `f` with a client of `url`.
fn with_client<T>(url: &str, f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connecting to PostgreSQL");
        tokio::spawn(connection);
        f(&client).await
    })
}

fn execute(url: &str, sql: &str) {
    with_client(url, async |db| {
        db.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
    });
}

/// A server of this test's own (whatever `EXACTLY_DATABASE_URL` says: a test
/// never reconfigures an external server) with `max_prepared_transactions =
/// 0`, as on many managed services.
fn server_without_prepared_transactions() -> PostgresServer {
    let mut pg = PostgresServer::start_own().expect("starting PostgreSQL");
    execute(pg.url(), "ALTER SYSTEM SET max_prepared_transactions = 0");
    pg.restart().expect("restarting PostgreSQL");
    let setting: String = with_client(pg.url(), async |db| {
        db.query_one("SHOW max_prepared_transactions", &[])
            .await
            .unwrap()
            .get(0)
    });
    assert_eq!(setting, "0");
    pg
}

/// A table and pipeline name no other test, or earlier run against the same
/// server, used.
fn fresh_name(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}_{}_{n}_{nanos:08x}", std::process::id())
}

/// `[sink.postgres]` for `table` in `mode`: the record's coordinates and value.
fn postgres_section(url: &str, table: &str, mode: &str, extra: &str) -> String {
    format!(
        r#"[sink.postgres]
url = "{url}"
table = "{table}"
mode = "{mode}"
create_table = true
{extra}
[sink.postgres.columns]
topic = {{ from = "topic", type = "text" }}
part = {{ from = "partition", type = "int" }}
off = {{ from = "offset", type = "bigint" }}
v = {{ from = "value", type = "text" }}
"#
    )
}

/// What the table holds, against the source's records.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    rows: usize,
    /// Rows beyond the first of their (partition, offset).
    duplicates: usize,
    /// The first few (partition, offset) pairs written more than once.
    duplicated: Vec<(i32, i64)>,
    /// Records of the source with no row.
    missing: usize,
    /// Rows whose topic or value do not match their partition and offset.
    mismatched: usize,
}

impl Outcome {
    fn exact() -> Outcome {
        Outcome {
            rows: TOTAL,
            duplicates: 0,
            duplicated: Vec::new(),
            missing: 0,
            mismatched: 0,
        }
    }
}

fn outcome(url: &str, table: &str) -> Outcome {
    let rows: Vec<(String, i32, i64, String)> = with_client(url, async |db| {
        db.query(&format!("SELECT topic, part, off, v FROM \"{table}\""), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    });
    let mut seen: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    let mut mismatched = 0;
    for (topic, part, off, v) in &rows {
        *seen.entry((*part, *off)).or_default() += 1;
        if topic != "seq" || *v != format!("seq-{part}:{off}") {
            mismatched += 1;
        }
    }
    let missing = (0..SPLITS as i32)
        .flat_map(|p| (0..PER_SPLIT).map(move |o| (p, o)))
        .filter(|k| !seen.contains_key(k))
        .count();
    Outcome {
        rows: rows.len(),
        duplicates: seen.values().map(|n| n - 1).sum(),
        duplicated: seen.iter().filter(|(_, n)| **n > 1).map(|(k, _)| *k).take(5).collect(),
        missing,
        mismatched,
    }
}

/// The stored positions of a fenced pipeline: (splits, lowest offset,
/// highest offset).
fn positions(url: &str, pipeline: &str, table: &str) -> (i64, Option<i64>, Option<i64>) {
    let scope = format!("{pipeline}/postgres:{table}");
    with_client(url, async |db| {
        let sql = "SELECT count(*), min(\"offset\"), max(\"offset\") FROM exactly_positions WHERE scope = $1";
        let row = db.query_one(sql, &[&scope]).await.unwrap();
        (row.get(0), row.get(1), row.get(2))
    })
}

/// Crash cases: each list of crash points is one pipeline, killed at each
/// point in turn (every run restarted after the previous crash), then run to
/// completion.
const CRASHES: &[(&str, &[&str])] = &[
    ("while writing", &["source.after_emit:40"]),
    ("after pre-commit, before persist", &["sink.after_pre_commit:3"]),
    (
        "around persist",
        &["coordinator.before_persist:3", "coordinator.after_persist:4"],
    ),
    ("between two subtasks' commits", &["sink.after_commit:3"]),
    (
        "during recovery, twice",
        &[
            "sink.after_pre_commit:5",
            "recovery.after_commit:1",
            "recovery.after_commit:2",
        ],
    ),
];

/// Runs every crash case into its own table (named like its pipeline) in
/// `mode`, checks every table and fails naming each inexact case; returns
/// the server and the names.
fn crash_matrix(mode: &str, extra: &str) -> (PostgresServer, Vec<String>) {
    let pg = server_without_prepared_transactions();
    let mut names = Vec::new();
    let mut failures = Vec::new();
    for (case, points) in CRASHES {
        let dir = tempfile::tempdir().unwrap();
        let name = fresh_name(mode);
        let sink = postgres_section(pg.url(), &name, mode, extra);
        let config = write_config(dir.path(), &name, "exactly-once", 2, &sink);
        crash_then_finish(&config, points);
        let result = outcome(pg.url(), &name);
        if result != Outcome::exact() {
            failures.push(format!("{case} ({points:?}): {result:?}"));
        }
        names.push(name);
    }
    assert!(
        failures.is_empty(),
        "mode {mode} is not exactly-once after:\n{}",
        failures.join("\n")
    );
    (pg, names)
}

#[test]
fn fenced_append_table_without_a_key_is_exact_after_kills_at_every_phase() {
    let (pg, names) = crash_matrix("fenced", "");
    let last = Some(PER_SPLIT - 1);
    for name in names {
        assert_eq!(
            positions(pg.url(), &name, &name),
            (SPLITS as i64, last, last),
            "{name}: every split's position is its last offset"
        );
    }
}

#[test]
fn upsert_table_keyed_on_partition_and_offset_is_exact_after_kills_at_every_phase() {
    crash_matrix("upsert", "upsert_key = [\"part\", \"off\"]");
}

/// Negative control for the fence: the crash leaves rows committed past the
/// last checkpoint (with their positions); deleting the positions before the
/// restart lets the replay write those rows again — and the check sees it.
#[test]
fn without_its_positions_the_fenced_replay_duplicates_rows() {
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let name = fresh_name("unfenced");
    let config = write_config(
        dir.path(),
        &name,
        "exactly-once",
        2,
        &postgres_section(pg.url(), &name, "fenced", ""),
    );
    run_killed_at(&config, "sink.after_pre_commit:3");
    execute(
        pg.url(),
        &format!("DELETE FROM exactly_positions WHERE scope = '{name}/postgres:{name}'"),
    );
    run_to_completion(&config);
    let result = outcome(pg.url(), &name);
    assert!(
        result.duplicates > 0 && result.rows == TOTAL + result.duplicates,
        "the replay of committed rows must show up without the fence: {result:?}"
    );
    assert_eq!((result.missing, result.mismatched), (0, 0), "{result:?}");
}

/// Negative control for the guarantee: at-least-once commits before the
/// checkpoint is persisted, so the crash replays committed records. Into the
/// same append-only table, mode `two-phase` (default server settings) writes
/// them twice; mode `fenced` drops them.
#[test]
fn at_least_once_duplicates_into_an_append_table_unless_fenced() {
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let mut results = BTreeMap::new();
    for mode in ["two-phase", "fenced"] {
        let dir = tempfile::tempdir().unwrap();
        let name = fresh_name("alo");
        let sink = postgres_section(pg.url(), &name, mode, "");
        let config = write_config(dir.path(), &name, "at-least-once", 2, &sink);
        crash_then_finish(&config, &["sink.after_pre_commit:3", "source.after_emit:60"]);
        results.insert(mode, outcome(pg.url(), &name));
    }
    let two_phase = &results["two-phase"];
    assert!(
        two_phase.duplicates > 0 && two_phase.rows == TOTAL + two_phase.duplicates,
        "at-least-once without the fence must duplicate: {two_phase:?}"
    );
    assert_eq!(two_phase.missing, 0, "at-least-once loses nothing: {two_phase:?}");
    assert_eq!(results["fenced"], Outcome::exact(), "the fence absorbs the replay");
}
