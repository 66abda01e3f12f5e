//! Region and global failover through the `exactly` binary (sequence source
//! → file sink, parallelism 2):
//!
//! - a failure in one region restarts that region alone: the other region
//!   completes checkpoints while it is down (and in global failover, the
//!   control, nothing completes until everything restarted);
//! - a SIGKILL while the regions stand at different checkpoint ids resumes
//!   every region from its own checkpoint, exactly once;
//! - global failover still passes the whole crash matrix.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::*;

fn config(dir: &Path, failover: &str) -> PathBuf {
    let file = write_config(dir, "modes", "exactly-once", 2, "[sink.file]\ndir = \"out\"");
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text.replacen(
        "parallelism = 2\n",
        &format!("parallelism = 2\nfailover = \"{failover}\"\n"),
        1,
    );
    // Slower, so a restart delay falls in the middle of the run, and
    // restarts after 1.5 s.
    let text = text
        .replace("delay_per_poll = \"5ms\"", "delay_per_poll = \"20ms\"")
        .replace(
            "strategy = \"none\"",
            "strategy = \"fixed\"\ndelay = \"1500ms\"\nmax_attempts = 3",
        );
    std::fs::write(&file, text).unwrap();
    file
}

fn assert_exactly_once(dir: &Path, what: &str) {
    let lines = exactly::file::read_committed_lines(&dir.join("out")).unwrap();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for line in &lines {
        *counts.entry(line.as_str()).or_default() += 1;
    }
    let expected = expected_values();
    assert_eq!(lines.len(), expected.len(), "{what}: records in the output");
    assert!(
        expected.iter().all(|e| counts.get(e.as_str()) == Some(&1)),
        "{what}: every record exactly once"
    );
}

/// The timestamp (µs since midnight, UTC; the runs here do not span
/// midnight) of a log line.
fn micros(line: &str) -> Option<u64> {
    let plain = line.trim_start_matches(|c: char| !c.is_ascii_digit());
    let time = plain.get(11..26)?; // HH:MM:SS.ffffff
    let (hms, frac) = time.split_once('.')?;
    let mut parts = hms.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    Some(((h * 60 + m) * 60 + s) * 1_000_000 + frac.parse::<u64>().ok()?)
}

/// Checkpoints each region completed while region 0 was down: between the
/// injected failure and region 0's restore from its checkpoint.
fn completed_while_region_0_was_down(log: &str) -> (usize, usize) {
    let plain: Vec<String> = log.lines().map(strip_ansi).collect();
    let failed = plain
        .iter()
        .find(|l| l.contains("failure point reached"))
        .and_then(|l| micros(l))
        .expect("the failure was injected");
    let restored = plain
        .iter()
        .filter(|l| l.contains("restoring from checkpoint") && !l.contains("region=1"))
        .filter_map(|l| micros(l))
        .find(|t| *t > failed)
        .expect("the failed part restored from its checkpoint");
    let during = |region: &str| {
        plain
            .iter()
            .filter(|l| l.contains("checkpoint complete") && l.contains(region))
            .filter_map(|l| micros(l))
            .filter(|t| (failed..restored).contains(t))
            .count()
    };
    (during("region=0"), during("region=1"))
}

#[test]
fn a_failure_in_one_region_restarts_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "region");
    let fault = [(exactly::core::fault::FAIL_AT_ENV, "sink.pre_commit@0:4")];
    let (status, log) = run_with_env(&config, None, &[], &fault);
    assert!(status.success(), "{log}");
    let (region_0, region_1) = completed_while_region_0_was_down(&log);
    assert_eq!(region_0, 0, "region 0 was restarting:\n{log}");
    assert!(
        region_1 >= 3,
        "region 1 was to go on checkpointing while region 0 restarted (completed {region_1}):\n{log}"
    );
    assert_exactly_once(dir.path(), "region failover");
}

/// The control: the same failure in global failover restarts every subtask,
/// so nothing completes until the restart.
#[test]
fn a_failure_in_global_failover_restarts_everything() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "global");
    let fault = [(exactly::core::fault::FAIL_AT_ENV, "sink.pre_commit@0:4")];
    let (status, log) = run_with_env(&config, None, &[], &fault);
    assert!(status.success(), "{log}");
    let plain: Vec<String> = log.lines().map(strip_ansi).collect();
    let failed = plain
        .iter()
        .find(|l| l.contains("failure point reached"))
        .and_then(|l| micros(l))
        .expect("the failure was injected");
    let restored = plain
        .iter()
        .filter(|l| l.contains("restoring from checkpoint"))
        .filter_map(|l| micros(l))
        .find(|t| *t > failed)
        .expect("the pipeline restored from its checkpoint");
    let during = plain
        .iter()
        .filter(|l| l.contains("checkpoint complete"))
        .filter_map(|l| micros(l))
        .filter(|t| (failed..restored).contains(t))
        .count();
    assert_eq!(during, 0, "global failover restarts every subtask:\n{log}");
    assert_exactly_once(dir.path(), "global failover");
}

#[test]
fn a_kill_while_the_regions_stand_at_different_checkpoints_resumes_each() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "region");
    // Region 1 is held back at its second pre-commit while region 0 goes on
    // to its sixth checkpoint and dies there.
    run_killed_at(&config, "coordinator.after_persist@0:6+sink.after_pre_commit@1:2=2s");
    let ids: Vec<u64> = latest_entries(&dir.path().join("checkpoints"), "modes")
        .iter()
        .map(|e| e.checkpoint.id.0)
        .collect();
    assert_eq!(ids.len(), 2, "one checkpoint sequence per region: {ids:?}");
    assert_ne!(
        ids[0], ids[1],
        "the regions were killed at different checkpoints: {ids:?}"
    );
    run_to_completion(&config);
    assert_exactly_once(dir.path(), "regions at different checkpoints");
}

#[test]
fn global_failover_passes_the_crash_matrix() {
    for (name, points) in TWO_PHASE_CRASH_CASES {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), "global");
        for point in *points {
            run_killed_at(&config, point);
        }
        run_to_completion(&config);
        assert_exactly_once(dir.path(), name);
        assert!(
            !dir.path().join("checkpoints/modes/region-0").exists(),
            "global failover keeps one checkpoint sequence"
        );
    }
}
