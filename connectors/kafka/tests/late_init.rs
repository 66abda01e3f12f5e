//! A producer initialization (InitProducerId) that a failed attempt left
//! running must end before the next attempt's recovery touches the
//! transactional ids: landing later, it would bump the epoch of an id the
//! new attempt already initialized, fence the new producer, and lose the
//! transaction it pre-committed.
//!
//! The initialization is made slow with a delay point
//! (`EXACTLY_DELAY_AT=kafka_sink.before_init_producer:<n>=<duration>`),
//! which is read once per process: this file is its own test binary with a
//! single test.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use exactly_core::{CheckpointId, ErasedSink, Metrics, Record, SinkContext, SinkFactory};
use exactly_kafka::admin::KafkaAdmin;
use exactly_kafka::{KafkaSinkConfig, KafkaSinkFactory};
use exactly_testkit::KafkaBroker;

/// How long the failed attempt's background initialization takes.
const SLOW_INIT: Duration = Duration::from_secs(5);

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn subtask(factory: &KafkaSinkFactory) -> Box<dyn ErasedSink> {
    let context = SinkContext::new("late-init", 0, 1, Arc::new(Metrics::default()));
    factory.create(context).expect("create")
}

fn records(range: std::ops::Range<usize>) -> Vec<Record> {
    range
        .map(|i| Record::new("in-0", i as i64, format!("v-{i}")).with_key(format!("k-{i}")))
        .collect()
}

async fn pre_committed(
    sink: &mut Box<dyn ErasedSink>,
    checkpoint: u64,
    range: std::ops::Range<usize>,
) -> serde_json::Value {
    sink.write(CheckpointId(checkpoint), &records(range))
        .await
        .expect("write");
    sink.pre_commit()
        .await
        .expect("pre_commit")
        .expect("a transaction was open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initialization_left_by_a_failed_attempt_cannot_fence_the_next_one() {
    // Initializations, in order: 1–3 by the first sink's recovery (a first
    // start initializes every slot), 4–5 by the second's (its listed slot
    // is not initialized), 6 in the background when that slot is freed.
    std::env::set_var(
        "EXACTLY_DELAY_AT",
        format!("kafka_sink.before_init_producer:6={}s", SLOW_INIT.as_secs()),
    );
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("exactly_kafka=debug,exactly_core=info,librdkafka=warn")
        .try_init();
    let broker = KafkaBroker::shared().expect("a Kafka broker");
    let topic = unique("late-init");
    KafkaAdmin::new(broker.bootstrap())
        .create_topic(&topic, 1)
        .await
        .expect("creating the topic");
    let mut config = KafkaSinkConfig::new(broker.bootstrap(), &topic);
    config.transactional_id_prefix = Some(unique("late-init"));
    config.pool_size = 3;
    let factory = KafkaSinkFactory::new("late-init", config).expect("valid settings");

    // A first attempt pre-commits checkpoint 1 on slot 0, then crashes.
    let mut first = subtask(&factory);
    first.recover(&[]).await.expect("recover");
    let c1 = pre_committed(&mut first, 1, 0..10).await;
    drop(first);

    // A second attempt recovers from checkpoint 1: it commits slot 0's
    // transaction with EndTxn, which leaves slot 0 without a producer. It
    // then writes checkpoint 2 on slot 1 and commits it, which frees slot 0
    // and starts initializing it in the background (slowly) — and fails
    // right then: it is dropped with the initialization running.
    let mut second = subtask(&factory);
    second
        .recover(std::slice::from_ref(&c1))
        .await
        .expect("recover from checkpoint 1");
    let c2 = pre_committed(&mut second, 2, 10..20).await;
    second.commit(&c2).await.expect("commit checkpoint 2");
    let failed_at = Instant::now();
    drop(second);

    // A third attempt recovers from checkpoint 2 and writes checkpoint 3 on
    // slot 0 (the free slot the rotation reaches first).
    let mut third = subtask(&factory);
    third
        .recover(std::slice::from_ref(&c2))
        .await
        .expect("recover from checkpoint 2");
    assert!(
        failed_at.elapsed() >= SLOW_INIT - Duration::from_millis(500),
        "recovery did not wait for the failed attempt's initialization ({:?} after the failure)",
        failed_at.elapsed()
    );
    let c3 = pre_committed(&mut third, 3, 20..30).await;
    assert!(
        c3["transactional_id"].as_str().is_some_and(|id| id.ends_with("-0-0")),
        "checkpoint 3 was meant for slot 0, whose initialization was left running: {c3}"
    );
    // Past the point where the left-over initialization would have landed.
    tokio::time::sleep(SLOW_INIT.saturating_sub(failed_at.elapsed()) + Duration::from_secs(1)).await;
    third
        .commit(&c3)
        .await
        .expect("commit checkpoint 3: the new producer was not fenced");

    let committed: BTreeSet<String> = KafkaAdmin::new(broker.bootstrap())
        .read_all(&topic)
        .await
        .expect("reading the topic")
        .into_iter()
        .map(|r| String::from_utf8(r.value.expect("a value").to_vec()).unwrap())
        .collect();
    let expected: BTreeSet<String> = (0..30).map(|i| format!("v-{i}")).collect();
    assert_eq!(committed, expected, "every checkpoint committed once");
}
