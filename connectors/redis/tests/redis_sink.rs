//! The Redis sink against a real `redis-server` (test kit): outages are retried
//! and end in exact state; records without a derivable key become counted dead
//! letters, exactly once even when replayed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use exactly_core::{
    CheckpointConfig, CheckpointId, FsCheckpointStore, Pipeline, PipelineConfig, Record, RestartStrategy,
    SequenceSourceFactory, SinkContext,
};
use exactly_redis::{RedisSinkConfig, RedisSinkFactory};
use exactly_testkit::RedisServer;

fn factory(url: &str, body: &str) -> RedisSinkFactory {
    let config: RedisSinkConfig = toml::from_str(&format!("url = \"{url}\"\n{body}")).unwrap();
    RedisSinkFactory::new(config).unwrap()
}

/// A name no other test, or earlier run against the same (external) server,
/// uses: `prefix`, the process id and the clock's nanoseconds.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

fn connection(url: &str) -> redis::Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_run_is_retried_and_the_counts_stay_exact() {
    let mut redis = RedisServer::start_persistent().expect("starting redis-server");
    let url = redis.url().to_string();
    let dir = tempfile::tempdir().unwrap();
    let source = SequenceSourceFactory {
        splits: 3,
        records_per_split: 800,
        batch: 10,
        delay_per_poll: Duration::from_millis(5),
    };
    let mut config = PipelineConfig::new("redis-outage");
    config.parallelism = 2;
    config.checkpoint = CheckpointConfig {
        interval: Duration::from_millis(50),
        ..CheckpointConfig::default()
    };
    config.restart = RestartStrategy::FixedDelay {
        delay: Duration::from_millis(200),
        max_attempts: 50,
    };
    let sink = factory(&url, "command = \"hincrby\"\nkey = \"=counts\"\nfield = \"split\"").into_sink_factory();
    let pipeline = Pipeline::new(
        config,
        Arc::new(source),
        sink,
        Arc::new(FsCheckpointStore::new(dir.path(), "redis-outage", 3)),
    )
    .unwrap();
    let metrics = pipeline.metrics();
    let run = tokio::spawn(async move { pipeline.run(std::future::pending()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(metrics.snapshot().records_out > 0, "the pipeline is writing");
    redis.stop().unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.restart().unwrap();
    let summary = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the pipeline finishes after the outage")
        .unwrap()
        .expect("the pipeline retries through the outage");
    assert!(summary.metrics.restarts >= 1, "{:?}", summary.metrics);
    let counts: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg("counts")
        .query(&mut connection(&url))
        .unwrap();
    assert_eq!(counts.len(), 3);
    assert!(counts.values().all(|n| *n == 800), "{counts:?}");
}

#[tokio::test]
async fn records_without_a_key_are_counted_dead_letters_once() {
    let redis = RedisServer::start().expect("starting redis-server");
    // Names of this run only: an external server keeps earlier runs' keys
    // (and their fence would skip this run's records).
    let pipeline = unique("dlq");
    let prefix = format!("{}:", unique("n"));
    let f = factory(
        redis.url(),
        &format!("command = \"incrby\"\nkey = \"/customer\"\nkey_prefix = \"{prefix}\""),
    );
    let sink_factory = f.into_sink_factory();
    let context = SinkContext::new(pipeline.clone(), 0, 1, Arc::default());
    let metrics = context.metrics.clone();
    let batch = vec![
        Record::new("t-0", 0, r#"{"customer": "a"}"#),
        Record::new("t-0", 1, r#"{"name": "no customer"}"#),
        Record::new("t-0", 2, "not json"),
        Record::new("t-0", 3, r#"{"customer": "a"}"#),
    ];
    for attempt in 0..2 {
        // The second attempt replays the same records, as after a crash.
        let mut sink = sink_factory.create(context.clone()).unwrap();
        sink.recover(&[]).await.unwrap();
        sink.write(CheckpointId(1), &batch).await.unwrap();
        sink.pre_commit().await.unwrap();
        assert_eq!(metrics.snapshot().dead_letters, 2, "attempt {attempt}");
    }
    let mut con = connection(redis.url());
    let n: i64 = redis::cmd("GET").arg(format!("{prefix}a")).query(&mut con).unwrap();
    assert_eq!(n, 2);
    let dead: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("exactly:dead-letters:{pipeline}"))
        .query(&mut con)
        .unwrap();
    assert_eq!(dead.len(), 2);
    assert!(dead["t-0/1"].contains("field /customer is missing"), "{dead:?}");
    assert!(
        dead["t-0/2"].contains("not JSON") && dead["t-0/2"].contains("not json"),
        "{dead:?}"
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_retriable_error_naming_it() {
    let port = exactly_testkit::free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}/");
    let sink_factory = factory(&url, "command = \"set\"\nkey = \"key\"").into_sink_factory();
    let mut sink = sink_factory
        .create(SinkContext::new("down", 0, 1, Arc::default()))
        .unwrap();
    let err = sink.recover(&[]).await.unwrap_err();
    assert!(err.is_retriable(), "{err}");
    assert!(
        err.to_string().contains(&url) && err.to_string().contains("redis-server"),
        "{err}"
    );
}
