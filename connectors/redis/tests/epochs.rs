//! The Redis sink's epoch fence when several workers share a pipeline,
//! against a real `redis-server` from the test kit: once a newer owner of a
//! subtask opened it, an older owner's batches are refused whole (nothing
//! applied) and its late recovery is refused, while the newer owner's
//! batches apply; without ownership (one process) nothing changes.

use std::collections::HashMap;
use std::sync::Arc;

use exactly_core::membership::Epoch;
use exactly_core::{CheckpointId, Metrics, Ownership, Record, SinkContext, SinkFactory};
use exactly_redis::{RedisSinkConfig, RedisSinkFactory};
use exactly_testkit::RedisServer;

fn factory(url: &str, key: &str) -> Arc<dyn SinkFactory> {
    let text = format!("url = \"{url}\"\ncommand = \"hincrby\"\nkey = \"={key}\"\nfield = \"split\"");
    let config: RedisSinkConfig = toml::from_str(&text).unwrap();
    RedisSinkFactory::new(config).unwrap().into_sink_factory()
}

fn owned_by(pipeline: &str, epoch: u64) -> SinkContext {
    SinkContext::new(pipeline, 0, 1, Arc::new(Metrics::default())).with_ownership(Ownership {
        epoch: Epoch(epoch),
        first_checkpoint: CheckpointId(1),
        acting: exactly_core::acting::ActingGate::unlimited(),
    })
}

fn counts(url: &str, key: &str) -> HashMap<String, i64> {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("HGETALL").arg(key).query(&mut con).unwrap()
}

fn record(offset: i64) -> Record {
    Record::new("orders-0", offset, "{}")
}

#[tokio::test]
async fn an_older_owners_batches_and_recovery_are_refused_once_a_newer_one_opened_the_subtask() {
    let redis = RedisServer::start().expect("starting redis-server");
    let (pipeline, key) = ("redis-epochs", "redis-epochs:counts");
    let factory = factory(redis.url(), key);
    assert!(factory.fences_zombies(), "the fenced strategy fences zombies");

    let mut old = factory.create(owned_by(pipeline, 1)).unwrap();
    old.recover(&[]).await.unwrap();
    old.write(CheckpointId(1), &[record(0)]).await.unwrap();
    assert_eq!(counts(redis.url(), key)["orders-0"], 1);

    // A newer owner recovers the subtask: the old one is a zombie now.
    let mut new = factory.create(owned_by(pipeline, 2)).unwrap();
    new.recover(&[]).await.unwrap();
    let refused = old.write(CheckpointId(1), &[record(1), record(2)]).await.unwrap_err();
    assert!(refused.to_string().contains("newer owner"), "{refused}");
    assert!(refused.is_retriable(), "{refused}");
    assert_eq!(
        counts(redis.url(), key)["orders-0"],
        1,
        "nothing of the zombie's batch applied"
    );

    new.write(CheckpointId(2), &[record(1), record(2)]).await.unwrap();
    assert_eq!(counts(redis.url(), key)["orders-0"], 3);

    // A zombie's late recovery is refused too, and lowers nothing.
    let mut late = factory.create(owned_by(pipeline, 1)).unwrap();
    let refused = late.recover(&[]).await.unwrap_err();
    assert!(refused.to_string().contains("epoch 2"), "{refused}");
    new.write(CheckpointId(2), &[record(3)]).await.unwrap();
    assert_eq!(counts(redis.url(), key)["orders-0"], 4);
}

#[tokio::test]
async fn one_process_without_ownership_writes_as_before() {
    let redis = RedisServer::start().expect("starting redis-server");
    let key = "redis-single:counts";
    let factory = factory(redis.url(), key);
    let mut sink = factory
        .create(SinkContext::new("redis-single", 0, 1, Arc::new(Metrics::default())))
        .unwrap();
    sink.recover(&[]).await.unwrap();
    sink.write(CheckpointId(1), &[record(0), record(1)]).await.unwrap();
    sink.write(CheckpointId(1), &[record(1)]).await.unwrap();
    assert_eq!(counts(redis.url(), key)["orders-0"], 2, "a replayed offset is skipped");
}
