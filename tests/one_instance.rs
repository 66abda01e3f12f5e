//! One process per pipeline: a second `exactly run` of a pipeline that is
//! running (or frozen) is refused before it touches anything, naming the
//! holder, and the first one finishes with every record exactly once.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::*;

/// A sequence → file pipeline slow enough to be running while the test
/// starts a second copy: 4 splits of 1,500 records, 20 records per 40 ms
/// and split (3 s), checkpoints every 50 ms.
fn config(dir: &Path) -> std::path::PathBuf {
    let file = write_config(dir, "single", "exactly-once", 2, "[sink.file]\ndir = \"out\"");
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("delay_per_poll = \"5ms\"", "delay_per_poll = \"40ms\"");
    assert!(text.contains("40ms"), "the pace of the source is set: {text}");
    std::fs::write(&file, text).unwrap();
    file
}

fn assert_exactly_once(dir: &Path) {
    let lines = exactly::file::read_committed_lines(&dir.join("out")).unwrap();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for line in &lines {
        *counts.entry(line.as_str()).or_default() += 1;
    }
    let expected = expected_values();
    assert_eq!(lines.len(), expected.len(), "records in the output");
    assert!(
        expected.iter().all(|e| counts.get(e.as_str()) == Some(&1)),
        "every record exactly once"
    );
}

/// Waits until the background run has written its first checkpoint.
fn wait_until_running(dir: &Path) {
    let checkpoints = dir.join("checkpoints").join("single");
    for _ in 0..200 {
        if !checkpoint_entry_files(&checkpoints).is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the first run never wrote a checkpoint");
}

fn assert_refused(config: &Path, first: u32) {
    let (status, log) = run(config, None, &[]);
    assert!(!status.success(), "a second run was not refused:\n{log}");
    for part in [
        "pipeline single is already running",
        &format!("process {first} on host"),
        "Stop that process first",
    ] {
        assert!(log.contains(part), "`{part}` missing from:\n{log}");
    }
    assert!(!log.contains("recover"), "the refused run touched the sinks:\n{log}");
}

#[test]
fn a_second_run_is_refused_while_the_first_runs() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let first = spawn(&config);
    wait_until_running(dir.path());
    assert_refused(&config, first.id());
    let (status, _, log) = wait(first, Duration::from_secs(120));
    assert!(status.success(), "{log}");
    assert_exactly_once(dir.path());
}

#[test]
fn a_second_run_is_refused_while_the_first_is_frozen() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let first = spawn(&config);
    wait_until_running(dir.path());
    let pid = first.id() as i32;
    // SAFETY: kill only signals the child this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    assert_refused(&config, first.id());
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let (status, _, log) = wait(first, Duration::from_secs(120));
    assert!(status.success(), "{log}");
    assert_exactly_once(dir.path());
}

#[test]
fn a_killed_holder_leaves_no_lock_behind() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    run_killed_at(&config, "coordinator.after_persist:2");
    run_to_completion(&config);
    assert_exactly_once(dir.path());
}
