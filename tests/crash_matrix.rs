//! Process-level crash matrix: the `exactly` binary runs a replayable source →
//! file sink pipeline (parallelism 2) and is killed with SIGKILL at each phase of
//! the protocol (see `exactly_core::fault`), then started again from nothing but
//! its checkpoint folder. In exactly-once mode the output must hold every input
//! exactly once. The cases are the crash kit's (`exactly_testkit::crash`,
//! the same a connector author runs on their own pipeline), one test each,
//! plus random kills and the kit's abort-on-recover control.
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

use std::time::Duration;

use exactly::core::fault;
use exactly_testkit::crash::{plan, Case, CrashCase, CrashMatrix, Step};

mod common;
use common::*;

fn write_file_config(dir: &Path, guarantee: &str, parallelism: usize) -> PathBuf {
    write_config(dir, "crash", guarantee, parallelism, "[sink.file]\ndir = \"out\"")
}

/// The file-sink pipeline under the crash kit: `exactly run` on a pipeline
/// file (parallelism 2) written into the case's folder, its checkpoints in
/// `<case>/checkpoints`; the verifier reads the committed files and refuses
/// pending files left after a clean finish.
fn kit() -> CrashMatrix {
    CrashMatrix::new(
        expected_values(),
        |case: &Case| {
            // A file per checkpoint folder: the kit's second process of the
            // pipeline has one of its own (and the same output folder).
            let written = write_file_config(&case.dir, case.guarantee.as_str(), 2);
            let text = std::fs::read_to_string(&written).unwrap().replace(
                "dir = \"checkpoints\"",
                &format!("dir = \"{}\"", case.checkpoints.display()),
            );
            let folder = case.checkpoints.file_name().unwrap().to_string_lossy();
            let config = case.dir.join(format!("pipeline-{folder}.toml"));
            std::fs::write(&config, text).unwrap();
            let mut run = Command::new(env!("CARGO_BIN_EXE_exactly"));
            run.arg("run").arg(config).env("RUST_LOG", "info");
            run
        },
        |case: &Case| {
            let out = case.dir.join("out");
            let pending = pending_files(&out);
            if !pending.is_empty() {
                return Err(format!("pending files left after a clean finish: {pending:?}"));
            }
            exactly::file::read_committed_lines(&out).map_err(|e| e.to_string())
        },
    )
}

/// The kit's case named `name` among `cases`.
fn case_named(cases: Vec<CrashCase>, name: &str) -> CrashCase {
    cases
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("the crash kit has no case `{name}`"))
}

fn assert_exactly_once(name: &str) {
    kit().assert_case(&case_named(plan::exactly_once_cases(), name));
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

/// A second process of the pipeline with another checkpoint folder, while
/// the first holds its first commit: the file sink's folder lock refuses
/// it, and the output stays exact.
#[test]
fn exactly_once_with_a_second_process_of_the_pipeline() {
    assert_exactly_once("second_process_other_checkpoint_folder");
}

#[test]
fn exactly_once_after_kill_while_writing() {
    assert_exactly_once("while_writing");
}

#[test]
fn exactly_once_after_kill_between_pre_commit_and_persist() {
    assert_exactly_once("after_pre_commit_before_persist");
}

#[test]
fn exactly_once_after_kill_with_all_acks_before_persist() {
    assert_exactly_once("all_acks_before_persist");
}

#[test]
fn exactly_once_after_kill_during_a_half_written_checkpoint() {
    assert_exactly_once("half_written_checkpoint");
}

#[test]
fn exactly_once_after_kill_between_persist_and_commit() {
    assert_exactly_once("after_persist_before_commit");
}

#[test]
fn exactly_once_after_kill_between_the_commits_of_two_subtasks() {
    assert_exactly_once("between_two_subtasks_commits");
}

#[test]
fn exactly_once_after_kill_during_recovery() {
    assert_exactly_once("during_recovery");
}

#[test]
fn exactly_once_after_repeated_kills() {
    assert_exactly_once("repeated_kills");
}

/// SIGKILLs at random moments (seeded, the seed printed), three in a row.
#[test]
fn exactly_once_after_random_kills() {
    let kit = kit().random_kills(3, Duration::from_millis(200)..Duration::from_millis(1500));
    kit.assert_case(&CrashCase::exactly_once("random_kills", vec![Step::KillAtRandom; 3]));
}

/// The abort-on-recover control: recovery aborting what the persisted
/// checkpoint lists loses its records, and the check sees it.
#[test]
fn aborting_instead_of_committing_on_recovery_loses_records() {
    let tally = kit().assert_case(&plan::abort_on_recover_control());
    assert_eq!(tally.duplicates, 0, "{tally}");
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

fn assert_at_least_once_duplicates(name: &str) {
    kit().assert_case(&case_named(plan::at_least_once_cases(), name));
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
    assert_at_least_once_duplicates("after_a_sinks_commit_at_the_barrier");
}

#[test]
fn at_least_once_duplicates_after_kill_with_all_acks_before_persist() {
    assert_at_least_once_duplicates("all_acks_before_persist");
}

#[test]
fn at_least_once_duplicates_after_kill_during_a_half_written_checkpoint() {
    assert_at_least_once_duplicates("half_written_checkpoint");
}

/// Recovery in at-least-once mode has nothing to commit (checkpoints list
/// no pending transactions), so a crash during it adds no duplicate; the
/// duplicates come from the crash before, which recovery must not lose.
#[test]
fn at_least_once_duplicates_after_kill_during_recovery() {
    assert_at_least_once_duplicates("during_recovery");
}

#[test]
fn at_least_once_duplicates_after_repeated_kills() {
    assert_at_least_once_duplicates("repeated_kills");
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
