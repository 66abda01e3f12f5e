//! The SQLite sink under the crash kit: exact after SIGKILLs at every crash
//! point of the runtime and at random moments, with both negative controls
//! — and the kit's own proof that it fails a sink that commits at
//! pre-commit, one that aborts on recover and one that leaks staged rows.

use std::process::Command;
use std::time::Duration;

use exactly_core::SequenceSourceFactory;
use exactly_crash_kit::{plan, Case, CrashMatrix};

fn inputs() -> Vec<String> {
    SequenceSourceFactory {
        splits: 4,
        records_per_split: 1500,
        batch: 20,
        delay_per_poll: Duration::from_millis(5),
    }
    .expected_values()
}

/// The example pipeline in `mode`, under the kit.
fn matrix(mode: &'static str) -> CrashMatrix {
    CrashMatrix::new(
        inputs(),
        move |case: &Case| {
            let mut run = Command::new(env!("CARGO_BIN_EXE_sqlite-pipeline"));
            run.arg(case.dir.join("out.db"))
                .arg(&case.checkpoints)
                .arg(case.guarantee.as_str())
                .arg(mode);
            run
        },
        |case: &Case| exactly_example_sqlite_sink::read_records(&case.dir.join("out.db")).map_err(|e| e.to_string()),
    )
    .leftovers(|case: &Case| {
        exactly_example_sqlite_sink::staged_transactions(&case.dir.join("out.db")).map_err(|e| e.to_string())
    })
    .random_kills(3, Duration::from_millis(200)..Duration::from_millis(1500))
}

#[test]
fn the_sqlite_sink_is_exactly_once_under_the_crash_matrix() {
    matrix("correct").run();
}

/// A sink that commits at pre-commit duplicates after a crash between its
/// commit and the persist: the kit must fail it.
#[test]
fn the_kit_fails_a_sink_that_commits_at_pre_commit() {
    let broken = matrix("commit-at-pre-commit");
    let failures: Vec<_> = plan::exactly_once_cases()
        .iter()
        .filter_map(|case| broken.check_case(case).err())
        .collect();
    for failure in &failures {
        eprintln!("{failure}\n");
        let _ = std::fs::remove_dir_all(&failure.dir);
    }
    assert!(
        failures
            .iter()
            .any(|f| f.problem.contains("exactly-once violated") && f.problem.contains("duplicated (first: `")),
        "the kit passed a sink that commits at pre-commit"
    );
}

/// A sink whose recovery aborts what the checkpoint lists loses its
/// records after a crash past the persist: the kit must fail it.
#[test]
fn the_kit_fails_a_sink_that_aborts_on_recover() {
    let broken = matrix("abort-on-recover");
    let case = plan::exactly_once_cases()
        .into_iter()
        .find(|c| c.name == "after_persist_before_commit")
        .unwrap();
    let failure = broken
        .check_case(&case)
        .expect_err("the kit passed a sink that aborts on recover");
    eprintln!("{failure}");
    assert!(
        failure.problem.contains("exactly-once violated") && failure.problem.contains("missing (first: `"),
        "{failure}"
    );
    let _ = std::fs::remove_dir_all(&failure.dir);
}

/// A sink whose recovery never deletes unlisted staged rows has exact
/// output but leaks: the kit's leftovers check must fail it.
#[test]
fn the_kit_fails_a_sink_that_leaks_staged_rows() {
    let broken = matrix("leak-staging");
    let case = plan::exactly_once_cases()
        .into_iter()
        .find(|c| c.name == "after_pre_commit_before_persist")
        .expect("the plan has the case");
    let failure = broken
        .check_case(&case)
        .expect_err("the kit passed a sink that leaks staged rows");
    eprintln!("{failure}");
    assert!(
        failure.problem.contains("the output is exact") && failure.problem.contains("still holds"),
        "{failure}"
    );
    let _ = std::fs::remove_dir_all(&failure.dir);
}

/// A second process of the pipeline writing the same database (another
/// checkpoint folder) is refused before it touches the database, naming
/// the holder: here the test holds the lock as the first process would.
#[test]
fn a_second_process_of_the_pipeline_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("out.db");
    let lock = exactly_example_sqlite_sink::instance_lock_file(&db, "sqlite-example");
    exactly_core::hold_instance_lock(&lock, "sqlite-example", "the test's database", "another path")
        .expect("the test takes the lock first");
    let out = Command::new(env!("CARGO_BIN_EXE_sqlite-pipeline"))
        .arg(&db)
        .arg(dir.path().join("checkpoints"))
        .arg("exactly-once")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second process ran:\n{log}");
    assert!(
        log.contains("pipeline `sqlite-example` already writes into the SQLite database")
            && log.contains(&format!("process {} on host", std::process::id())),
        "{log}"
    );
    assert!(
        exactly_example_sqlite_sink::read_records(&db).map_or(true, |r| r.is_empty()),
        "the refused process wrote records"
    );
}
