//! Process-level crash matrix: the `exactly` binary runs a replayable source →
//! file sink pipeline (parallelism 2) and is killed with SIGKILL at each phase of
//! the protocol (see `exactly_core::fault`), then started again from nothing but
//! its checkpoint folder. In exactly-once mode the output must hold every input
//! exactly once.
//!
//! The negative control runs the same phases in at-least-once mode, where a
//! sink commits at the barrier, before the checkpoint is persisted. A crash
//! replays what was committed after the last persisted checkpoint, so every
//! phase that can find such a commit must show duplicates (and no loss):
//! while writing with a barrier committed but not yet persisted, after a
//! sink's commit at the barrier, with every ack in, half-way through writing
//! the checkpoint, during a recovery that follows such a crash, and several in
//! a row. The others cannot duplicate, and their tests say why and check it:
//! right after the persist every commit is covered by the checkpoint, and
//! commits between two subtasks after the persist do not exist.

use std::path::{Path, PathBuf};
use std::process::Command;

use exactly::core::fault;
use tempfile::TempDir;

mod common;
use common::*;

fn write_file_config(dir: &Path, guarantee: &str, parallelism: usize) -> PathBuf {
    write_config(dir, "crash", guarantee, parallelism, "[sink.file]\ndir = \"out\"")
}

/// The id of the latest complete checkpoint of each checkpoint store of the
/// pipeline in `dir` (one, or one per failover region).
fn latest_checkpoints(dir: &Path) -> Vec<u64> {
    latest_entries(&dir.join("checkpoints"), "crash")
        .iter()
        .map(|e| e.checkpoint.id.0)
        .collect()
}

/// Lets the crashed pipeline of `dir` finish and reads its output; no
/// pending file may be left.
fn finish(dir: &Path, config: &Path) -> Outcome {
    run_to_completion(config);
    let out = dir.join("out");
    assert_eq!(
        pending_files(&out),
        Default::default(),
        "pending files left after a clean finish"
    );
    outcome_of(&exactly::file::read_committed_lines(&out).unwrap())
}

fn crash_file_pipeline(guarantee: &str, points: &[&str]) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file_config(dir.path(), guarantee, 2);
    for point in points {
        run_killed_at(&config, point);
    }
    finish(dir.path(), &config)
}

fn assert_exactly_once_after(o: Outcome, points: &[&str]) {
    assert_eq!(
        (o.lines, o.duplicates, o.missing),
        (TOTAL, 0, 0),
        "exactly-once violated after crashes at {points:?}"
    );
}

fn assert_exactly_once(points: &[&str]) {
    assert_exactly_once_after(crash_file_pipeline("exactly-once", points), points);
}

/// The id of the checkpoint entry named by the temporary file `name`
/// (`.tmp-<fingerprint>-<unix-ms>-<id>`), or `None` for another file.
fn entry_id_of_temp_file(name: &str) -> Option<u64> {
    let entry = name.strip_prefix(".tmp-")?;
    let fields: Vec<&str> = entry.split('-').collect();
    match fields[..] {
        [fingerprint, ms, id] if fingerprint.len() == 16 && ms.parse::<u64>().is_ok() => id.parse().ok(),
        _ => None,
    }
}

/// Kills a fresh pipeline half-way through writing a checkpoint entry with
/// an id of at least `min_id` (its bytes written, not yet fsynced) and
/// returns its folder and that id. `store.before_fsync` is reached by every
/// atomic write of the store — the pinned start (checkpoint 0), the id
/// watermark, entries and the committed-through record — whose order
/// depends on timing, so the hits are tried in turn, each on a fresh
/// folder, until the temporary file the kill left is such an entry.
fn killed_half_way_through_an_entry(guarantee: &str, min_id: u64) -> (TempDir, PathBuf, u64) {
    for nth in 1..=12 {
        let dir = tempfile::tempdir().unwrap();
        let config = write_file_config(dir.path(), guarantee, 2);
        run_killed_at(&config, &format!("store.before_fsync:{nth}"));
        let torn = checkpoint_store_folders(&dir.path().join("checkpoints"), "crash")
            .into_iter()
            .filter_map(|folder| std::fs::read_dir(folder).ok())
            .flat_map(|entries| entries.flatten())
            .find_map(|e| entry_id_of_temp_file(&e.file_name().to_string_lossy()));
        if let Some(id) = torn.filter(|id| *id >= min_id) {
            eprintln!("killed half-way through writing entry {id} (store.before_fsync:{nth})");
            return (dir, config, id);
        }
    }
    panic!("no hit of store.before_fsync among the first 12 was a write of checkpoint entry {min_id} or later");
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
    // Entry 2, so the restart has entry 1 to restore from.
    let (dir, config, _) = killed_half_way_through_an_entry("exactly-once", 2);
    assert_exactly_once_after(finish(dir.path(), &config), &["store.before_fsync (entry 2 or later)"]);
}

#[test]
fn exactly_once_after_kill_between_persist_and_commit() {
    assert_exactly_once(&["coordinator.after_persist:3"]);
}

#[test]
fn exactly_once_after_kill_between_the_commits_of_two_subtasks() {
    // Subtask 1 waits before its second commit while subtask 0 makes its
    // second and dies: one committed checkpoint 2, the other did not.
    assert_exactly_once(&["sink.after_commit@0:2+sink.before_commit@1:2=3s"]);
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

/// At-least-once after a crash that found records committed past the last
/// persisted checkpoint: they are replayed — duplicates, and no loss.
fn assert_duplicates_without_loss(o: Outcome, case: &str) {
    eprintln!("at-least-once after a crash {case}: {o:?}");
    assert_eq!(o.missing, 0, "at-least-once lost records after a crash {case}");
    assert_eq!(o.lines, TOTAL + o.duplicates, "after a crash {case}");
    assert!(
        o.duplicates > 0,
        "at-least-once showed no duplicate after a crash {case}, though its sinks committed past the persisted checkpoint: this control would not tell a broken exactly-once from a working one"
    );
}

fn assert_at_least_once_duplicates(points: &[&str]) {
    let o = crash_file_pipeline("at-least-once", points);
    assert_duplicates_without_loss(o, &format!("at {points:?}"));
}

/// While writing, at-least-once duplicates only what a sink committed at a
/// barrier whose checkpoint is not persisted yet (records after the last
/// barrier sit in pending files, which recovery deletes). The persist of
/// checkpoint 1 is held up for 20 s, so the kill while writing lands in
/// that window, after the sinks committed at barrier 1.
#[test]
fn at_least_once_duplicates_after_kill_while_writing() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file_config(dir.path(), "at-least-once", 2);
    let (status, log) = run_with_env(
        &config,
        Some("source.after_emit:100"),
        &[],
        &[(fault::DELAY_AT_ENV, "coordinator.before_persist:1=20s")],
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "not killed while writing: {status}\n{log}"
    );
    assert!(
        log.contains("delay point reached"),
        "the persist was not held up:\n{log}"
    );
    // The held-up checkpoint 1 is not persisted (only the pinned start,
    // checkpoint 0, may be) — in every failover region, the held-up one.
    let latest = latest_checkpoints(dir.path());
    assert!(
        latest.is_empty() || latest.contains(&0),
        "checkpoint 1 was persisted before the kill: {latest:?}"
    );
    assert_duplicates_without_loss(finish(dir.path(), &config), "while writing");
}

#[test]
fn at_least_once_duplicates_after_kill_after_a_sinks_commit_at_the_barrier() {
    // In at-least-once mode this point follows the sink's commit.
    assert_at_least_once_duplicates(&["sink.after_pre_commit:3"]);
}

#[test]
fn at_least_once_duplicates_after_kill_with_all_acks_before_persist() {
    assert_at_least_once_duplicates(&["coordinator.before_persist:3"]);
}

#[test]
fn at_least_once_duplicates_after_kill_during_a_half_written_checkpoint() {
    let (dir, config, _) = killed_half_way_through_an_entry("at-least-once", 1);
    assert_duplicates_without_loss(finish(dir.path(), &config), "half-way through writing a checkpoint");
}

/// Recovery in at-least-once mode has nothing to commit (checkpoints list
/// no pending transactions), so a crash during it adds no duplicate; the
/// duplicates come from the crash before, which recovery must not lose.
#[test]
fn at_least_once_duplicates_after_kill_during_recovery() {
    assert_at_least_once_duplicates(&["sink.after_pre_commit:3", "recovery.after_commit:1"]);
}

#[test]
fn at_least_once_duplicates_after_repeated_kills() {
    assert_at_least_once_duplicates(&[
        "coordinator.before_persist:2",
        "sink.after_pre_commit:4",
        "source.after_emit:30",
    ]);
}

/// Right after checkpoint N is persisted, everything at-least-once sinks
/// committed was committed at barriers up to N, whose positions the
/// checkpoint holds, and barrier N + 1 cannot have been injected yet (one
/// checkpoint at a time): records after barrier N are only in pending
/// files. So this crash cannot duplicate, and does not. With one subtask,
/// so that the whole pipeline is the one that just persisted (with several
/// failover regions, another region may be between its barrier's commit and
/// its own persist, which is the case of the tests above).
#[test]
fn at_least_once_cannot_duplicate_after_a_kill_right_after_the_persist() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file_config(dir.path(), "at-least-once", 1);
    run_killed_at(&config, "coordinator.after_persist:3");
    assert_eq!(
        latest_checkpoints(dir.path()),
        vec![3],
        "killed right after persisting checkpoint 3"
    );
    let o = finish(dir.path(), &config);
    assert_eq!((o.lines, o.duplicates, o.missing), (TOTAL, 0, 0));
}

/// At-least-once sinks commit at the barrier, never after the persist, so
/// `sink.after_commit` (between two subtasks' commits after the persist) is
/// never reached; one subtask committed at the barrier and the other not is
/// the `sink.after_pre_commit` case above.
#[test]
fn at_least_once_has_no_commits_after_the_persist() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file_config(dir.path(), "at-least-once", 2);
    let (status, log) = run(&config, Some("sink.after_commit:1"), &[]);
    assert!(
        status.success(),
        "sink.after_commit was reached in at-least-once mode: {status}\n{log}"
    );
    let o = outcome_of(&exactly::file::read_committed_lines(&dir.path().join("out")).unwrap());
    assert_eq!((o.lines, o.duplicates, o.missing), (TOTAL, 0, 0));
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
