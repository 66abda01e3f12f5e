//! `start = "latest"` is resolved once, at the first start, and pinned in
//! checkpoint 0 before any record flows: a crash before the first checkpoint
//! completes (or an in-process restart) must not resolve it again, which
//! would skip the records produced in between.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_testkit::KafkaBroker;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn produce(bootstrap: &str, topic: &str, values: impl IntoIterator<Item = String>) {
    runtime().block_on(async {
        let records: Vec<_> = values
            .into_iter()
            .enumerate()
            .map(|(i, v)| ProduceRecord::new(v).to_partition(i as i32 % 2))
            .collect();
        KafkaAdmin::new(bootstrap)
            .produce(topic, records)
            .await
            .expect("producing")
    });
}

fn batch(name: &str) -> Vec<String> {
    (0..100).map(|i| format!("{name}-{i}")).collect()
}

/// Checkpoint entries with an id of at least `min` in the pipeline's
/// checkpoint sequences.
fn entries_from(dir: &Path, min: u64) -> usize {
    checkpoint_entry_files(&dir.join("checkpoints").join("latest"))
        .iter()
        .filter_map(|p| exactly::core::EntryName::parse(&p.file_name().unwrap().to_string_lossy()))
        .filter(|n| n.id.0 >= min)
        .count()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "waited a minute for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn committed(dir: &Path) -> Vec<String> {
    exactly::file::read_committed_lines(&dir.join("out")).unwrap_or_default()
}

fn write_pipeline(dir: &Path, bootstrap: &str, topic: &str, interval: &str) -> PathBuf {
    let file = dir.join("pipeline.toml");
    std::fs::write(
        &file,
        format!(
            r#"name = "latest"
parallelism = 2
[checkpoint]
dir = "checkpoints"
interval = "{interval}"
[restart]
strategy = "none"
[source.kafka]
bootstrap = "{bootstrap}"
topic = "{topic}"
start = "latest"
[sink.file]
dir = "out"
"#
        ),
    )
    .unwrap();
    file
}

#[test]
fn a_crash_before_the_first_checkpoint_does_not_move_latest_forward() {
    let kafka = KafkaBroker::shared().expect("a Kafka broker");
    let topic = unique("latest");
    runtime().block_on(async {
        KafkaAdmin::new(kafka.bootstrap())
            .create_topic(&topic, 2)
            .await
            .unwrap()
    });
    produce(kafka.bootstrap(), &topic, batch("before"));
    let dir = tempfile::tempdir().unwrap();

    // First start, no checkpoint for an hour: it resolves `latest` (after
    // the "before" records), reads the "lost" ones and is killed on their
    // first batch, before any checkpoint completed.
    let config = write_pipeline(dir.path(), kafka.bootstrap(), &topic, "1h");
    let first = spawn_with_env(&config, &[("EXACTLY_CRASH_AT", "source.after_emit:1")]);
    // Past its start once checkpoint 0 exists; a runtime that does not pin
    // the start writes none, then ten seconds must do.
    let started = Instant::now();
    while entries_from(dir.path(), 0) == 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    produce(kafka.bootstrap(), &topic, batch("lost"));
    let (status, _, log) = wait(first, Duration::from_secs(60));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "the first run was to be killed on its first records:\n{log}"
    );
    assert_eq!(
        entries_from(dir.path(), 1),
        0,
        "no checkpoint completed before the crash"
    );

    // While it is down, more arrive.
    produce(kafka.bootstrap(), &topic, batch("while-down"));

    // The restart (now checkpointing) must read both, then the new ones.
    let config = write_pipeline(dir.path(), kafka.bootstrap(), &topic, "100ms");
    let second = spawn(&config);
    wait_for("a checkpoint of the restart", || entries_from(dir.path(), 1) > 0);
    produce(kafka.bootstrap(), &topic, batch("after"));
    wait_for("the last record in the output", || {
        committed(dir.path()).contains(&"after-99".to_string())
    });
    // SAFETY: kill only signals the child this test started.
    unsafe { libc::kill(second.id() as i32, libc::SIGTERM) };
    let (status, _, log) = wait(second, Duration::from_secs(60));
    assert!(status.success(), "{log}");

    let lines = committed(dir.path());
    let expected: BTreeSet<String> = ["lost", "while-down", "after"].iter().flat_map(|b| batch(b)).collect();
    let got: BTreeSet<String> = lines.iter().cloned().collect();
    assert_eq!(got, expected, "records produced after the first start, none before it");
    assert_eq!(lines.len(), expected.len(), "exactly once");
}
