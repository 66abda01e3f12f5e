//! Process-level crash matrix: the `exactly` binary runs a replayable source →
//! file sink pipeline (parallelism 2) and is killed with SIGKILL at each phase of
//! the protocol (see `exactly_core::fault`), then started again from nothing but
//! its checkpoint folder. In exactly-once mode the output must hold every input
//! exactly once; in at-least-once mode the same crashes must show duplicates and
//! no loss — the proof that the check can fail.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::*;

fn write_file_config(dir: &Path, guarantee: &str, parallelism: usize) -> PathBuf {
    write_config(dir, "crash", guarantee, parallelism, "[sink.file]\ndir = \"out\"")
}

struct Outcome {
    lines: usize,
    duplicates: usize,
    missing: usize,
}

fn outcome(dir: &Path) -> Outcome {
    let lines = exactly::file::read_committed_lines(&dir.join("out")).unwrap();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for l in &lines {
        *counts.entry(l.as_str()).or_default() += 1;
    }
    let expected = expected_values();
    let unexpected = counts.keys().filter(|k| !expected.iter().any(|e| e == *k)).count();
    assert_eq!(unexpected, 0, "output holds values the source never produced");
    Outcome {
        lines: lines.len(),
        duplicates: counts.values().map(|c| c - 1).sum(),
        missing: expected.iter().filter(|e| !counts.contains_key(e.as_str())).count(),
    }
}

fn crash_file_pipeline(guarantee: &str, points: &[&str]) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file_config(dir.path(), guarantee, 2);
    crash_then_finish(&config, points);
    let o = outcome(dir.path());
    let pending = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pending"))
        .count();
    assert_eq!(pending, 0, "pending files left after a clean finish");
    o
}

fn assert_exactly_once(points: &[&str]) {
    let o = crash_file_pipeline("exactly-once", points);
    let expected = TOTAL;
    assert_eq!(
        (o.lines, o.duplicates, o.missing),
        (expected, 0, 0),
        "exactly-once violated after crashes at {points:?}"
    );
}

#[test]
fn exactly_once_after_kill_while_writing() {
    assert_exactly_once(&["source.after_emit:40"]);
}

#[test]
fn exactly_once_after_kill_between_pre_commit_and_persist() {
    assert_exactly_once(&["sink.after_pre_commit:3"]);
}

#[test]
fn exactly_once_after_kill_with_all_acks_before_persist() {
    assert_exactly_once(&["coordinator.before_persist:3"]);
}

#[test]
fn exactly_once_after_kill_during_a_half_written_checkpoint() {
    // Hit 1 is the id watermark, hit 3 the second checkpoint entry.
    assert_exactly_once(&["store.before_fsync:3"]);
}

#[test]
fn exactly_once_after_kill_between_persist_and_commit() {
    assert_exactly_once(&["coordinator.after_persist:3"]);
}

#[test]
fn exactly_once_after_kill_between_the_commits_of_two_subtasks() {
    assert_exactly_once(&["sink.after_commit:3"]);
}

#[test]
fn exactly_once_after_kill_during_recovery() {
    assert_exactly_once(&["coordinator.after_persist:3", "recovery.after_commit:1"]);
}

#[test]
fn exactly_once_after_repeated_kills() {
    assert_exactly_once(&[
        "coordinator.after_persist:2",
        "sink.after_pre_commit:4",
        "source.after_emit:30",
        "sink.after_commit:2",
    ]);
}

/// The negative control: in at-least-once mode sinks commit before the
/// checkpoint is persisted, so a crash there replays committed records.
#[test]
fn at_least_once_shows_duplicates_but_no_loss() {
    let expected = TOTAL;
    let mut duplicates = 0;
    for point in [
        "source.after_emit:40",
        "sink.after_pre_commit:3",
        "coordinator.before_persist:3",
        "coordinator.after_persist:3",
    ] {
        let o = crash_file_pipeline("at-least-once", &[point]);
        assert_eq!(o.missing, 0, "at-least-once lost records after a crash at {point}");
        assert_eq!(o.lines, expected + o.duplicates);
        if point == "coordinator.before_persist:3" {
            assert!(
                o.duplicates > 0,
                "a commit before the persisted checkpoint must replay records"
            );
        }
        duplicates += o.duplicates;
    }
    assert!(duplicates > 0);
}

#[test]
fn resuming_with_a_changed_definition_is_refused_with_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file_config(dir.path(), "exactly-once", 2);
    run_killed_at(&config, "coordinator.after_persist:2");
    // Another parallelism alone has a flag of its own.
    let config = write_file_config(dir.path(), "exactly-once", 3);
    let (status, log) = run(&config, None, &[]);
    assert!(!status.success());
    assert!(
        log.contains("taken with parallelism 2, this pipeline runs with 3"),
        "{log}"
    );
    assert!(log.contains("--allow-parallelism-change"), "{log}");
    // Any other change needs the general one, and is described.
    let config = write_config(
        dir.path(),
        "crash",
        "exactly-once",
        3,
        "[sink.file]\ndir = \"out\"\nformat = \"json-lines\"",
    );
    let (status, log) = run(&config, None, &["--allow-parallelism-change"]);
    assert!(!status.success());
    assert!(log.contains("parallelism was `2`, is now `3`"), "{log}");
    assert!(log.contains("sink was `file:dir="), "{log}");
    assert!(log.contains("--allow-fingerprint-change"), "{log}");
}

#[test]
fn checkpoints_are_listed_with_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file_config(dir.path(), "exactly-once", 2);
    run_to_completion(&config);
    let out = Command::new(env!("CARGO_BIN_EXE_exactly"))
        .args(["checkpoints", "list"])
        .arg(&config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    let name = first.split_whitespace().next().unwrap_or_default();
    let parts: Vec<&str> = name.split('-').collect();
    assert_eq!(
        parts.len(),
        3,
        "entry `{name}` is not <fingerprint>-<unix-ms>-<id>:\n{text}"
    );
    assert!(parts[0].len() == 16 && parts[1].parse::<u64>().is_ok() && parts[2].parse::<u64>().is_ok());
    assert!(first.contains("pending_transactions="), "{text}");
}
