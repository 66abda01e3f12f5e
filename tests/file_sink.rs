//! The file sink through the `exactly` binary, where its output folder is
//! shared or its parallelism changes: two pipelines writing into one folder
//! recover without touching each other's files; a pipeline lowered from 3
//! to 2 subtasks after a crash commits and cleans up what the third subtask
//! left; a second process of one pipeline (with a checkpoint folder of its
//! own) is refused the output folder while the first one writes it; a
//! corrupt newest checkpoint entry falls back only when the committed files
//! show no later commit.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use exactly::file::read_committed_lines_of;

/// `<root>/<name>/pipeline.toml`: pipeline `name` (parallelism
/// `parallelism`, exactly-once) with its checkpoints in `<root>/<name>`,
/// writing into `out`.
fn pipeline_in(root: &Path, name: &str, parallelism: usize, out: &Path) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    write_config(&dir, name, "exactly-once", parallelism, &file_sink_into(out))
}

fn assert_exactly_once_in(out: &Path, pipeline: &str) {
    let lines = read_committed_lines_of(out, pipeline).unwrap();
    let o = outcome_of(&lines);
    assert_eq!(
        (o.lines, o.duplicates, o.missing),
        (TOTAL, 0, 0),
        "pipeline {pipeline}: (lines, duplicates, missing)"
    );
}

#[test]
fn two_pipelines_in_one_folder_recover_without_touching_each_others_files() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    let left = pipeline_in(root.path(), "left", 2, &out);
    let right = pipeline_in(root.path(), "right", 2, &out);

    // Left stops with pre-committed files its checkpoint lists (and open
    // ones it does not).
    run_killed_at(&left, "coordinator.after_persist:3");
    let lefts = pending_files(&out);
    assert!(!lefts.is_empty(), "the crash left no pending file of `left`");
    // Right crashes with leftovers of its own, then recovers and finishes:
    // neither run may touch left's files.
    let left_files_survive = |when: &str| {
        let gone: Vec<&String> = lefts.iter().filter(|f| !out.join(f).exists()).collect();
        assert!(gone.is_empty(), "{when} deleted left's pending files {gone:?}");
    };
    run_killed_at(&right, "coordinator.before_persist:3");
    left_files_survive("right's first run");
    assert!(
        pending_files(&out).len() > lefts.len(),
        "the crash left no pending file of `right`"
    );
    run_to_completion(&right);
    left_files_survive("right's recovery");

    run_to_completion(&left);
    assert_exactly_once_in(&out, "right");
    assert_exactly_once_in(&out, "left");
    assert_eq!(
        pending_files(&out),
        Default::default(),
        "pending files after both finished"
    );
}

/// Crashes pipeline `rescale` at parallelism 3 at `point` (a point of
/// region 2, which holds sink subtask 2 in region failover), checks with
/// `left_behind` what the crash left of subtask 2 (its pending files in
/// the output folder that the latest checkpoint lists, and those it does
/// not), then resumes it at parallelism 2 and lets it finish.
fn rescale_3_to_2_after(point: &str, left_behind: impl FnOnce(usize, usize)) {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    let at_3 = pipeline_in(root.path(), "rescale", 3, &out);
    run_killed_at(&at_3, point);
    // The pending files the latest checkpoints list (one, or one per
    // failover region), by name: file committables name their subtask.
    let latest = latest_entries(&root.path().join("rescale").join("checkpoints"), "rescale");
    assert!(!latest.is_empty(), "a checkpoint before the crash");
    let listed: BTreeSet<String> = latest
        .iter()
        .flat_map(|e| e.checkpoint.pending.values().flatten())
        .map(|c| {
            c.committable["pending"]
                .as_str()
                .expect("a file committable")
                .to_string()
        })
        .collect();
    let of_subtask_2: BTreeSet<String> = pending_files(&out)
        .into_iter()
        .filter(|f| f.starts_with(".part-rescale-2-"))
        .collect();
    left_behind(
        of_subtask_2.intersection(&listed).count(),
        of_subtask_2.difference(&listed).count(),
    );

    let at_2 = pipeline_in(root.path(), "rescale", 2, &out);
    let (status, log) = run(&at_2, None, &[]);
    assert!(
        !status.success(),
        "a parallelism change without the flag was accepted:\n{log}"
    );
    let (status, log) = run(&at_2, None, &["--allow-parallelism-change"]);
    assert!(
        status.success(),
        "the run at parallelism 2 failed with {status}:\n{log}"
    );
    assert!(
        log.contains("taking over the sink subtasks of the higher parallelism"),
        "subtask 2 was not adopted:\n{log}"
    );
    assert_exactly_once_in(&out, "rescale");
    assert_eq!(
        pending_files(&out),
        Default::default(),
        "pending files after the rescaled run"
    );
}

#[test]
fn lowering_the_parallelism_commits_what_the_checkpoint_lists_for_a_removed_subtask() {
    rescale_3_to_2_after("coordinator.after_persist@2:3", |listed, _| {
        assert!(listed > 0, "the checkpoint lists no pending file of subtask 2");
    });
}

#[test]
fn lowering_the_parallelism_deletes_what_a_removed_subtask_left_unlisted() {
    rescale_3_to_2_after("coordinator.before_persist@2:3", |_, unlisted| {
        assert!(unlisted > 0, "the crash left no unlisted pending file of subtask 2");
    });
}

/// Pipeline `single-writer` writing into `out`, its checkpoints in
/// `<root>/<copy>`, slowed to about 3 s so it is running while the test
/// starts another copy.
fn slow_copy(root: &Path, copy: &str, out: &Path) -> PathBuf {
    let dir = root.join(copy);
    std::fs::create_dir_all(&dir).unwrap();
    let file = write_config(&dir, "single-writer", "exactly-once", 2, &file_sink_into(out));
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("delay_per_poll = \"5ms\"", "delay_per_poll = \"40ms\"");
    assert!(text.contains("40ms"), "the pace of the source is set: {text}");
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn a_second_process_of_a_pipeline_is_refused_the_output_folder_even_with_other_checkpoints() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    let first = slow_copy(root.path(), "first", &out);
    let second = slow_copy(root.path(), "second", &out);
    let running = spawn(&first);
    let checkpoints = root.path().join("first").join("checkpoints");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while latest_entries(&checkpoints, "single-writer")
        .iter()
        .all(|e| e.checkpoint.id.0 == 0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the first run never completed a checkpoint"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let (status, log) = run(&second, None, &[]);
    assert!(!status.success(), "the second process was not refused:\n{log}");
    for part in [
        format!("pipeline `single-writer` already writes into {}", out.display()),
        format!("process {} on host ", running.id()),
        exactly::file::lock_file_name("single-writer"),
        "Stop that process first".to_string(),
        "another `name` or another `[sink.file] dir`".to_string(),
    ] {
        assert!(log.contains(&part), "`{part}` missing from:\n{log}");
    }
    let (status, _, log) = wait(running, Duration::from_secs(120));
    assert!(status.success(), "the first run failed:\n{log}");
    assert_exactly_once_in(&out, "single-writer");
    assert_eq!(pending_files(&out), Default::default());
}

/// The names of subtask 0's files (pending and committed) of pipeline
/// `pipeline` in `out`.
fn files_of_subtask_0(out: &Path, pipeline: &str) -> BTreeSet<String> {
    std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.trim_start_matches('.').starts_with(&format!("part-{pipeline}-0-")))
        .collect()
}

/// A corrupt newest checkpoint entry of region 0 (issue 16). When that
/// checkpoint was committed (by the recovery after a crash between persist
/// and commit, killed right after it), the sink finds its committed file:
/// the start is refused naming the commit and the flag, touching none of
/// subtask 0's files, and with `--allow-fallback` exactly that file's lines
/// are duplicated. When it was only pre-committed, the run falls back and
/// ends exactly once.
#[test]
fn a_corrupt_newest_entry_falls_back_only_when_the_committed_files_allow_it() {
    for committed in [true, false] {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        let name = "corrupt";
        let config = pipeline_in(root.path(), name, 2, &out);
        run_killed_at(&config, "coordinator.after_persist@0:3");
        if committed {
            run_killed_at(&config, "recovery.after_commit@0:1");
        }
        let newest = newest_entry_file(&root.path().join(name).join("checkpoints").join(name), 0);
        let entry = newest.file_name().unwrap().to_string_lossy().into_owned();
        let id = exactly::core::EntryName::parse(&entry).unwrap().id;
        flip_one_byte(&newest);
        let before = files_of_subtask_0(&out, name);
        let (status, log) = run(&config, None, &[]);
        if !committed {
            assert!(status.success(), "the fallback was refused:\n{log}");
            assert!(log.contains("falling back past unreadable checkpoint entries"), "{log}");
            assert_exactly_once_in(&out, name);
            continue;
        }
        assert!(!status.success(), "the fallback was accepted:\n{log}");
        for part in [
            entry.as_str(),
            &format!("sink subtask 0 committed transactions up to checkpoint {id} holding"),
            "--allow-fallback",
        ] {
            assert!(log.contains(part), "`{part}` missing from:\n{log}");
        }
        let files = files_of_subtask_0(&out, name);
        assert_eq!(files, before, "the refused run touched subtask 0's files");
        let (status, log) = run(&config, None, &["--allow-fallback"]);
        assert!(status.success(), "the run with --allow-fallback failed:\n{log}");
        let interval: Vec<&String> = files
            .iter()
            .filter(|f| f.starts_with(&format!("part-{name}-0-{:010}-", id.0)))
            .collect();
        assert_eq!(interval.len(), 1, "checkpoint {id}'s committed file: {files:?}");
        let duplicated = std::fs::read_to_string(out.join(interval[0])).unwrap().lines().count();
        let o = outcome_of(&read_committed_lines_of(&out, name).unwrap());
        assert_eq!(
            (o.duplicates, o.missing),
            (duplicated, 0),
            "the lines of checkpoint {id}'s file are written twice, nothing else"
        );
        assert!(duplicated > 0);
        let counted = format!("duplicates={duplicated} records");
        assert!(
            strip_ansi(&log).contains(&counted),
            "the log counts the duplicates (`{counted}`):\n{log}"
        );
    }
}
