//! The demo as a newcomer runs it: it ends with its exactly-once verdict,
//! and the terminal shows only its own lines — the header, the numbered
//! steps with their detail lines and the verdict — while every log line
//! (the services', the pipeline's, the kill's) is in the log file it
//! names, the crash marker of the deliberate kill included.

use std::process::Command;

#[test]
fn the_demo_tells_its_steps_and_verdict_and_logs_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_exactly-demo"))
        .arg("--dir")
        .arg(dir.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("running the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the demo failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "the demo wrote to stderr:\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("exactly demo: "), "{stdout}");
    let verdict = lines.last().copied().unwrap_or_default();
    assert!(verdict.starts_with("exactly once: OK"), "no verdict:\n{stdout}");
    for line in &lines[1..lines.len() - 1] {
        let step = line.split_once(". ").is_some_and(|(n, _)| n.parse::<u32>().is_ok());
        assert!(
            step || line.starts_with("   "),
            "not a step or a step's detail: {line:?}\n{stdout}"
        );
        for noise in [
            "INFO",
            "WARN",
            "ERROR",
            "DEBUG",
            "librdkafka",
            "EXACTLY_CRASH_POINT_REACHED",
        ] {
            assert!(!line.contains(noise), "a log line on the terminal: {line:?}");
        }
    }
    let steps: Vec<u32> = lines
        .iter()
        .filter_map(|l| l.split_once(". ")?.0.parse().ok())
        .collect();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>(), "{stdout}");
    assert!(
        stdout.contains("killing the pipeline with SIGKILL right after checkpoint"),
        "the kill is not a step:\n{stdout}"
    );
    for (name, row) in [
        ("produced", 50_000),
        ("rows in table", 50_000),
        ("duplicates", 0),
        ("missing", 0),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.trim_start().starts_with(name) && l.trim_end().ends_with(&format!(" {row}"))),
            "no `{name} {row}` line:\n{stdout}"
        );
    }
    let log_path = dir.path().join("demo.log");
    assert!(
        stdout.contains(&log_path.display().to_string()),
        "the log's path is not printed:\n{stdout}"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("EXACTLY_CRASH_POINT_REACHED point=coordinator.after_persist_pending"),
        "the log does not show the kill:\n{log}"
    );
}

#[test]
fn a_failing_demo_prints_the_error_and_where_the_log_is() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_exactly-demo"))
        .arg("--dir")
        .arg(dir.path())
        // No Kafka to start: no jars where the variable points, no container.
        .env(exactly_testkit::kafka::KAFKA_LIBS_ENV, dir.path().join("no-such-jars"))
        .env(exactly_testkit::DOCKER_MODE_ENV, "never")
        .output()
        .expect("running the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the demo passed without Kafka:\n{stdout}");
    assert!(
        stdout.contains("the demo failed: starting the Kafka broker: "),
        "the error is not printed:\n{stdout}"
    );
    let log = dir.path().join("demo.log");
    assert!(
        stdout.contains(&format!("full log: {}", log.display())),
        "the log's path is not printed:\n{stdout}"
    );
}
