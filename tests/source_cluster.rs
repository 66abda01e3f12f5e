//! Which cluster and which topic a Kafka → file pipeline's offsets belong
//! to, through the `exactly` binary.
//!
//! - Pointed at another cluster: its checkpoint's offsets were read from the
//!   first cluster, so the run on the second one is refused, naming both
//!   cluster ids and the fix, before it writes anything; with
//!   `accept_cluster_id` naming the second cluster it resumes the offsets
//!   there.
//! - The topic deleted and created again under the same name, while the
//!   pipeline is stopped (refused naming both topic ids and the fix;
//!   `accept_topic_id` reads the new topic from its beginning) and while it
//!   runs (it stops, naming both ids); deleted while it runs (it stops once
//!   `missing_topic_timeout` has passed).

mod common;

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use common::*;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_testkit::KafkaBroker;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Creates `topic` (2 partitions) on `admin`'s cluster with `count` records
/// `<tag>-<i>`, alternating partitions; returns the cluster id.
async fn topic_with(admin: &KafkaAdmin, topic: &str, tag: &str, count: usize) -> String {
    admin.create_topic(topic, 2).await.expect("create the topic");
    let records = (0..count).map(|i| ProduceRecord::new(format!("{tag}-{i}")).to_partition((i % 2) as i32));
    admin.produce(topic, records).await.expect("produce");
    admin.cluster_id().await.expect("the cluster id")
}

/// `<dir>/pipeline.toml`: the topic on `bootstrap`, read to its end, into
/// `<dir>/out`; `extra` goes into `[source.kafka]`.
fn write_pipeline(dir: &Path, bootstrap: &str, topic: &str, extra: &str) -> std::path::PathBuf {
    let file = dir.join("pipeline.toml");
    let text = format!(
        "{}\n[source.kafka]\nbootstrap = \"{bootstrap}\"\ntopic = \"{topic}\"\nstop_at_end = true\n\
         startup_timeout = \"20s\"\n{extra}\n\n[sink.file]\ndir = \"out\"\n",
        pipeline_header("moved", "exactly-once", "strategy = \"none\"")
    );
    std::fs::write(&file, text).unwrap();
    file
}

fn output(dir: &Path) -> Vec<String> {
    let mut lines = exactly::file::read_committed_lines(&dir.join("out")).unwrap();
    lines.sort();
    lines
}

#[test]
fn a_pipeline_pointed_at_another_cluster_is_refused_unless_that_cluster_is_accepted() {
    let rt = runtime();
    let first = KafkaBroker::shared().expect("the shared Kafka broker");
    let second = KafkaBroker::start().expect("a Kafka broker of the test's own");
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos();
    let topic = format!("moved-{}-{nanos}", std::process::id());
    let (a, b) = (KafkaAdmin::new(first.bootstrap()), KafkaAdmin::new(second.bootstrap()));
    let cluster_a = rt.block_on(topic_with(&a, &topic, "a", 30));
    let cluster_b = rt.block_on(topic_with(&b, &topic, "b", 50));
    assert_ne!(cluster_a, cluster_b, "the test kit's brokers are two clusters");

    let dir = tempfile::tempdir().unwrap();
    run_to_completion(&write_pipeline(dir.path(), first.bootstrap(), &topic, ""));
    let mut read_on_a: Vec<String> = (0..30).map(|i| format!("a-{i}")).collect();
    read_on_a.sort();
    assert_eq!(output(dir.path()), read_on_a);

    let moved = write_pipeline(dir.path(), second.bootstrap(), &topic, "");
    let (status, log) = run(&moved, None, &[]);
    assert!(!status.success(), "the run on another cluster was not refused:\n{log}");
    for part in [
        format!("read from Kafka cluster `{cluster_a}`"),
        format!("`{}` is cluster `{cluster_b}`", second.bootstrap()),
        format!("accept_cluster_id = \"{cluster_b}\""),
    ] {
        assert!(log.contains(&part), "`{part}` missing from:\n{log}");
    }
    assert_eq!(output(dir.path()), read_on_a, "the refused run wrote something");

    // Accepted: the offsets (15 per partition) are resumed on the second
    // cluster, whose partitions hold 25 records each.
    let accepted = write_pipeline(
        dir.path(),
        second.bootstrap(),
        &topic,
        &format!("accept_cluster_id = \"{cluster_b}\""),
    );
    run_to_completion(&accepted);
    let mut expected = read_on_a;
    expected.extend((30..50).map(|i| format!("b-{i}")));
    expected.sort();
    assert_eq!(output(dir.path()), expected);
}

/// The id the brokers give `topic` now.
fn topic_id(rt: &tokio::runtime::Runtime, bootstrap: &str, topic: &str) -> String {
    rt.block_on(async {
        let config = exactly::kafka::wire::WireConfig::new(bootstrap).expect("bootstrap");
        let mut client = exactly::kafka::wire::ConsumerClient::new(config);
        let metadata = client.topic_metadata(topic).await.expect("the topic's metadata");
        metadata.topic_id.expect("Kafka 4 names topic ids").to_string()
    })
}

/// A fresh topic name.
fn fresh_topic(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// Values `<tag>-<i>` for `range`, sorted.
fn tagged(tag: &str, range: std::ops::Range<usize>) -> Vec<String> {
    let mut values: Vec<String> = range.map(|i| format!("{tag}-{i}")).collect();
    values.sort();
    values
}

/// A copy of the pipeline file that reads the topic as it grows.
fn unbounded(file: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(file).unwrap();
    let copy = file.with_file_name("unbounded.toml");
    std::fs::write(&copy, text.replace("stop_at_end = true", "stop_at_end = false")).unwrap();
    copy
}

/// Waits until the output holds `lines` lines.
fn wait_for_output(dir: &Path, run: &mut Background, lines: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while output(dir).len() < lines {
        assert!(run.is_running(), "the pipeline ended early");
        assert!(
            std::time::Instant::now() < deadline,
            "the output never reached {lines} lines"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_topic_recreated_while_the_pipeline_was_stopped_is_refused_unless_its_new_id_is_accepted() {
    let rt = runtime();
    let broker = KafkaBroker::shared().expect("the shared Kafka broker");
    let admin = KafkaAdmin::new(broker.bootstrap());
    let topic = fresh_topic("recreated");
    rt.block_on(topic_with(&admin, &topic, "a", 30));
    let old = topic_id(&rt, broker.bootstrap(), &topic);
    let dir = tempfile::tempdir().unwrap();
    let file = write_pipeline(dir.path(), broker.bootstrap(), &topic, "");
    run_to_completion(&file);
    assert_eq!(output(dir.path()), tagged("a", 0..30));

    rt.block_on(admin.delete_topic(&topic)).expect("deleting the topic");
    rt.block_on(topic_with(&admin, &topic, "b", 20));
    let new = topic_id(&rt, broker.bootstrap(), &topic);
    let (status, log) = run(&file, None, &[]);
    assert!(
        !status.success(),
        "a run on the recreated topic was not refused:\n{log}"
    );
    for part in [
        format!("`{old}`"),
        format!("`{new}`"),
        "deleted and created again".to_string(),
        format!("accept_topic_id = \"{new}\""),
    ] {
        assert!(log.contains(&part), "`{part}` missing from:\n{log}");
    }
    assert_eq!(
        output(dir.path()),
        tagged("a", 0..30),
        "the refused run wrote something"
    );

    let accepted = write_pipeline(
        dir.path(),
        broker.bootstrap(),
        &topic,
        &format!("accept_topic_id = \"{new}\""),
    );
    run_to_completion(&accepted);
    let mut expected = tagged("a", 0..30);
    expected.extend(tagged("b", 0..20));
    expected.sort();
    assert_eq!(
        output(dir.path()),
        expected,
        "the new topic is read from its beginning, once"
    );
}

#[test]
fn a_topic_recreated_while_the_pipeline_runs_stops_it_naming_both_ids() {
    let rt = runtime();
    let broker = KafkaBroker::shared().expect("the shared Kafka broker");
    let admin = KafkaAdmin::new(broker.bootstrap());
    let topic = fresh_topic("recreated-live");
    rt.block_on(topic_with(&admin, &topic, "a", 30));
    let old = topic_id(&rt, broker.bootstrap(), &topic);
    let dir = tempfile::tempdir().unwrap();
    let file = unbounded(&write_pipeline(dir.path(), broker.bootstrap(), &topic, ""));
    let mut live = spawn(&file);
    wait_for_output(dir.path(), &mut live, 30);

    rt.block_on(admin.delete_topic(&topic)).expect("deleting the topic");
    rt.block_on(topic_with(&admin, &topic, "b", 20));
    let new = topic_id(&rt, broker.bootstrap(), &topic);
    let (status, _, log) = wait(live, std::time::Duration::from_secs(120));
    assert!(!status.success(), "the run went on reading a recreated topic:\n{log}");
    let plain = strip_ansi(&log);
    for part in [
        old.as_str(),
        new.as_str(),
        "deleted and created again",
        "accept_topic_id",
    ] {
        assert!(plain.contains(part), "`{part}` missing from:\n{plain}");
    }
    assert_eq!(
        output(dir.path()),
        tagged("a", 0..30),
        "nothing of the new topic was written"
    );
}

#[test]
fn a_topic_deleted_while_the_pipeline_runs_stops_it_once_missing_topic_timeout_has_passed() {
    let rt = runtime();
    let broker = KafkaBroker::shared().expect("the shared Kafka broker");
    let admin = KafkaAdmin::new(broker.bootstrap());
    let topic = fresh_topic("deleted-live");
    rt.block_on(topic_with(&admin, &topic, "a", 30));
    let dir = tempfile::tempdir().unwrap();
    let file = unbounded(&write_pipeline(
        dir.path(),
        broker.bootstrap(),
        &topic,
        "missing_topic_timeout = \"5s\"",
    ));
    let mut live = spawn(&file);
    wait_for_output(dir.path(), &mut live, 30);

    let deleted = std::time::Instant::now();
    rt.block_on(admin.delete_topic(&topic)).expect("deleting the topic");
    let (status, _, log) = wait(live, std::time::Duration::from_secs(120));
    let waited = deleted.elapsed();
    assert!(!status.success(), "the run went on without its topic:\n{log}");
    assert!(
        waited >= std::time::Duration::from_secs(5),
        "it stopped before missing_topic_timeout: after {waited:?}"
    );
    let plain = strip_ansi(&log);
    for part in ["missing from the metadata", "missing_topic_timeout", topic.as_str()] {
        assert!(plain.contains(part), "`{part}` missing from:\n{plain}");
    }
    assert_eq!(output(dir.path()), tagged("a", 0..30));
}
