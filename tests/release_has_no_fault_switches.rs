//! A release `exactly` has no fault switch: built the way it ships
//! (`cargo build --release --bin exactly`, without the `fault-injection`
//! feature the tests' own binary has), it recovers a crashed pipeline and
//! finishes it exactly once with every fault variable set — each of which
//! would have killed, held up, failed or emptied that recovery in a test
//! build — and says in a warning that each is ignored.
//!
//! The build shares `target/release` with the README's first command, so
//! after the demo it compiles only the workspace's own crates again (the
//! demo's binary has the feature, this one must not). A feature-less debug
//! binary would prove the same (the points are compiled in or out by the
//! feature, not by the profile) but would cost a cold debug build of every
//! dependency, in a target folder of its own: `target/debug/exactly` is the
//! test build's binary, with the feature, which the other end-to-end tests
//! run.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use exactly::core::fault;

/// Builds `exactly` as it ships and returns the binary's path (from
/// cargo's JSON messages).
fn release_binary() -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "build",
            "--release",
            "--bin",
            "exactly",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo build --release");
    assert!(out.status.success(), "cargo build --release --bin exactly failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "exactly")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo named no executable for the exactly binary")
}

/// Runs `binary run config` with `env` until it ends (at most `timeout`,
/// then kills it and fails); returns its status and stderr.
fn run_binary(
    binary: &Path,
    config: &Path,
    env: &[(&str, &str)],
    timeout: Duration,
) -> (std::process::ExitStatus, String) {
    let log = config.with_extension("log");
    let mut child = Command::new(binary)
        .arg("run")
        .arg(config)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("starting the release binary");
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the release binary did not finish within {timeout:?} (a delay point acting?):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

#[test]
fn a_release_binary_ignores_every_fault_switch() {
    let release = release_binary();
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    let config = write_config(root.path(), "no-switches", "exactly-once", 2, &file_sink_into(&out));

    // The test build's binary (with the feature) dies right after a
    // checkpoint listing pre-committed files was persisted: the restart
    // must commit them.
    run_killed_at(&config, "coordinator.after_persist_pending:1");
    assert!(!pending_files(&out).is_empty(), "the crash left nothing to recover");

    // In a test build each of these would act at once: the abort switch
    // would drop the listed files (records lost), the failure point would
    // fail the first pre-commit (with `strategy = "none"`, the run), the
    // delay would hold the first persist for ten minutes and the crash
    // point kill the process right after it.
    let env = [
        (fault::ABORT_PENDING_ON_RECOVER_ENV, "1"),
        (fault::FAIL_AT_ENV, "sink.pre_commit:1"),
        (fault::DELAY_AT_ENV, "coordinator.before_persist:1=10m"),
        (fault::CRASH_AT_ENV, "coordinator.after_persist:1"),
    ];
    let (status, log) = run_binary(&release, &config, &env, Duration::from_secs(300));
    assert!(
        status.success(),
        "the release binary ended with {status} (signal {:?}):\n{log}",
        status.signal()
    );
    assert!(
        !log.contains(fault::CRASH_MARKER),
        "a crash point acted in the release binary:\n{log}"
    );
    let lines = exactly::file::read_committed_lines_of(&out, "no-switches").unwrap();
    assert_eq!(
        outcome_of(&lines),
        Outcome {
            lines: TOTAL,
            duplicates: 0,
            missing: 0
        },
        "the release binary's recovery is not exactly once:\n{log}"
    );
    assert!(
        pending_files(&out).is_empty(),
        "pending files left: {:?}",
        pending_files(&out)
    );
    let plain = strip_ansi(&log);
    for (name, _) in env {
        assert!(
            plain
                .lines()
                .any(|l| l.contains("WARN") && l.contains(&format!("{name} is set but ignored"))),
            "no warning that {name} is ignored:\n{log}"
        );
    }
}
