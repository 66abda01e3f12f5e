//! A Kafka → file pipeline pointed at another cluster through the `exactly`
//! binary: its checkpoint's offsets were read from the first cluster, so the
//! run on the second one is refused, naming both cluster ids and the fix,
//! before it writes anything; with `accept_cluster_id` naming the second
//! cluster it resumes the offsets there.

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
