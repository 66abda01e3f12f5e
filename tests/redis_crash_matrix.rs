//! The crash matrix over the Redis sink (real `redis-server` from the test kit,
//! or `EXACTLY_REDIS_URL`; every test uses keys and a pipeline of its own):
//! counters through the position fence and upserts through the replay-safe and
//! write-ahead strategies end in exactly-once state after SIGKILLs at every
//! phase; the same counters without the fence over-count (negative control).

mod common;

use std::collections::HashMap;

use common::*;
use exactly_testkit::RedisServer;

fn redis_section(url: &str, body: &str) -> String {
    format!("[sink.redis]\nurl = \"{url}\"\n{body}")
}

fn connection(url: &str) -> redis::Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

/// A pipeline or key name no other test, or earlier run against the same
/// (external) server, uses: the tests of this file run at the same time, and
/// a shared `EXACTLY_REDIS_URL` server keeps what earlier runs wrote (fence
/// positions included, keyed by pipeline name).
fn unique(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}-{}-{n}-{nanos:x}", std::process::id())
}

/// The `hincrby` sink body counting records per split into hash `key`.
fn counter(key: &str) -> String {
    format!("command = \"hincrby\"\nkey = \"={key}\"\nfield = \"split\"")
}

/// Runs the counting pipeline (sink body `counter(key)` plus `extra`)
/// through the crashes and returns the counts it left.
fn crashed_counters(points: &[&str], extra: &str) -> (RedisServer, HashMap<String, i64>) {
    let redis = RedisServer::start().expect("starting redis-server");
    let dir = tempfile::tempdir().unwrap();
    let name = unique("redis-counters");
    let key = format!("{name}:counts");
    let config = write_config(
        dir.path(),
        &name,
        "exactly-once",
        2,
        &redis_section(redis.url(), &format!("{}\n{extra}", counter(&key))),
    );
    crash_then_finish(&config, points);
    let c = redis::cmd("HGETALL")
        .arg(&key)
        .query(&mut connection(redis.url()))
        .unwrap();
    (redis, c)
}

fn assert_exact_counts(points: &[&str]) {
    let (_redis, counts) = crashed_counters(points, "");
    assert_eq!(counts.len(), SPLITS, "{counts:?}");
    for (split, n) in &counts {
        assert_eq!(
            *n, PER_SPLIT,
            "split {split} counted {n} of {PER_SPLIT} after crashes at {points:?}"
        );
    }
}

#[test]
fn fenced_counters_are_exact_after_kill_while_writing() {
    assert_exact_counts(&["source.after_emit:40"]);
}

#[test]
fn fenced_counters_are_exact_after_kill_at_pre_commit() {
    assert_exact_counts(&["sink.after_pre_commit:3"]);
}

#[test]
fn fenced_counters_are_exact_after_kill_around_persist() {
    assert_exact_counts(&["coordinator.before_persist:3", "coordinator.after_persist:4"]);
}

#[test]
fn fenced_counters_are_exact_after_kill_during_recovery() {
    assert_exact_counts(&["sink.after_commit:3", "recovery.after_commit:1"]);
}

#[test]
fn counters_without_the_fence_over_count() {
    let extra = "strategy = \"replay-safe\"\nallow_duplicate_effects = true";
    let (_redis, counts) = crashed_counters(&["sink.after_pre_commit:3", "source.after_emit:60"], extra);
    let total: i64 = counts.values().sum();
    assert!(
        total > TOTAL as i64,
        "without the fence a replay must count twice; counted {total} of {TOTAL}"
    );
}

fn upserts(strategy: &str, points: &[&str]) {
    let redis = RedisServer::start().expect("starting redis-server");
    let dir = tempfile::tempdir().unwrap();
    let name = unique("redis-upserts");
    let body = format!(
        "command = \"set\"\nkey = \"value\"\nkey_prefix = \"{name}:\"\nvalue = \"offset\"\n\
         strategy = \"{strategy}\"\nspill_dir = \"spill\""
    );
    let config = write_config(dir.path(), &name, "exactly-once", 2, &redis_section(redis.url(), &body));
    crash_then_finish(&config, points);
    let mut con = connection(redis.url());
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{name}:*")).query(&mut con).unwrap();
    assert_eq!(keys.len(), TOTAL, "{strategy}: every record upserted once");
    let sample: String = redis::cmd("GET")
        .arg(format!("{name}:seq-3:1499"))
        .query(&mut con)
        .unwrap();
    assert_eq!(sample, "1499");
}

#[test]
fn replay_safe_upserts_end_exact_after_crashes() {
    upserts("replay-safe", &["sink.after_pre_commit:3", "source.after_emit:50"]);
}

#[test]
fn write_ahead_upserts_end_exact_after_crashes() {
    upserts(
        "write-ahead",
        &[
            "coordinator.after_persist:3",
            "sink.after_commit:2",
            "recovery.after_commit:1",
        ],
    );
}
