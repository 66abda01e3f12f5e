//! Services started in Docker containers. These need a Docker engine and
//! `EXACTLY_TESTKIT_DOCKER=always` (so that installed programs do not win):
//!
//! ```text
//! EXACTLY_TESTKIT_DOCKER=always cargo test -p exactly-testkit -- --ignored docker
//! ```
//!
//! The first run pulls the images (`apache/kafka:4.1.1`, `postgres:15`,
//! `redis:7`). The testkit drives the containers through `testcontainers`;
//! these tests look at them from the outside with the `docker` client.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use exactly_testkit::postgres::MAX_PREPARED_TRANSACTIONS;
use exactly_testkit::{port_accepts, Backend, KafkaBroker, PostgresServer, RedisServer};

mod common;
use common::*;

/// Fails the test, with the way to run it, when the testkit did not use
/// Docker.
fn assert_in_container(backend: Backend, container: Option<&str>, prefix: &str) -> String {
    assert_eq!(
        backend,
        Backend::Container,
        "run these tests with EXACTLY_TESTKIT_DOCKER=always and a Docker engine (and without \
         EXACTLY_KAFKA_BOOTSTRAP / EXACTLY_DATABASE_URL)"
    );
    let name = container.expect("a container name").to_string();
    assert!(name.starts_with(prefix), "{name}");
    name
}

/// `docker ARGS...`: stdout on success, stderr on failure.
fn docker(args: &[&str]) -> Result<String, String> {
    let out = Command::new("docker").args(args).output().expect("run docker");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The container exists and carries the testkit's label.
fn assert_labelled(name: &str) {
    let label = docker(&["inspect", "-f", "{{index .Config.Labels \"exactly.testkit\"}}", name]);
    assert_eq!(label.as_deref(), Ok("1"), "label of {name}");
}

fn assert_removed(name: &str) {
    assert!(
        docker(&["inspect", name]).is_err(),
        "container {name} survived the drop"
    );
}

/// Whether the log file shows `text` within a few seconds (it is copied
/// from `docker logs --follow`, which may lag a little).
fn log_contains(log: &Path, text: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::fs::read_to_string(log).unwrap_or_default().contains(text) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

// --------------------------------------------------------------------- Kafka

#[test]
#[ignore = "needs a Docker engine: run `EXACTLY_TESTKIT_DOCKER=always cargo test -p exactly-testkit -- --ignored docker`"]
fn docker_kafka_answers_and_restarts_empty_on_the_same_port() {
    init_tracing();
    let mut broker = KafkaBroker::start().expect("start a Kafka container");
    let name = assert_in_container(broker.backend(), broker.container_name(), "exactly-testkit-kafka-");
    assert_labelled(&name);
    let port = broker.port();
    assert_eq!(broker.bootstrap(), format!("127.0.0.1:{port}"));
    assert_eq!(api_versions(port, 0x5eed_0002), (0x5eed_0002, 0));
    assert_eq!(create_topic(port, "testkit-docker-lost"), 0);
    assert_eq!(wait_topic(port, "testkit-docker-lost"), 0);
    let log = broker.log_path().expect("a log file").to_path_buf();
    assert!(
        log_contains(&log, "Kafka Server started"),
        "log {log:?} lacks the start line"
    );

    broker.stop().expect("stop");
    assert!(!broker.is_running());
    assert!(!port_accepts(port), "port still open after stop");
    broker.stop().expect("stopping twice is harmless");

    broker.restart().expect("restart");
    assert!(broker.is_running());
    assert_eq!(broker.port(), port);
    assert_eq!(api_versions(port, 9), (9, 0));
    assert_eq!(
        topic_error(port, "testkit-docker-lost"),
        UNKNOWN_TOPIC_OR_PARTITION,
        "an in-memory broker restarts empty"
    );

    drop(broker);
    assert!(!port_accepts(port), "port still open after drop");
    assert_removed(&name);
}

#[test]
#[ignore = "needs a Docker engine: run `EXACTLY_TESTKIT_DOCKER=always cargo test -p exactly-testkit -- --ignored docker`"]
fn docker_kafka_persistent_broker_keeps_topics() {
    init_tracing();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut broker = KafkaBroker::start_persistent(dir.path()).expect("start a Kafka container");
    let name = assert_in_container(broker.backend(), broker.container_name(), "exactly-testkit-kafka-");
    let port = broker.port();
    assert_eq!(create_topic(port, "testkit-docker-kept"), 0);
    assert_eq!(wait_topic(port, "testkit-docker-kept"), 0);
    let data = dir.path().join(exactly_testkit::kafka::CONTAINER_DATA_DIR);
    assert!(data.join("meta.properties").exists(), "no Kafka data in {data:?}");
    assert_eq!(broker.log_path(), Some(dir.path().join("kafka.log").as_path()));

    broker.stop().expect("stop");
    assert!(!port_accepts(port), "port still open after stop");
    broker.restart().expect("restart");
    assert_eq!(broker.port(), port);
    assert_eq!(wait_topic(port, "testkit-docker-kept"), 0, "topic lost across restart");
    drop(broker);
    assert_removed(&name);

    // A new container on the same directory sees the topic too.
    let broker = KafkaBroker::start_persistent(dir.path()).expect("start again");
    assert_eq!(wait_topic(broker.port(), "testkit-docker-kept"), 0);
    drop(broker);

    // The files the container created can be deleted by the caller.
    dir.close().expect("delete the broker's directory");
}

// ---------------------------------------------------------------- PostgreSQL

/// Runs SQL through `psql` inside the container (TCP, as `postgres`).
fn psql_in(container: &str, commands: &[&str]) -> Result<String, String> {
    let mut args = vec!["exec", container, "psql", "-h", "127.0.0.1", "-U", "postgres"];
    args.extend(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"]);
    for c in commands {
        args.extend(["-c", c]);
    }
    docker(&args)
}

/// PostgreSQL's answer on the published port to an SSLRequest: `N` (the
/// image runs without SSL), proving the port reaches the server.
fn ssl_answer(port: u16) -> u8 {
    let mut stream = connect(port);
    stream
        .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .expect("send SSLRequest");
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).expect("SSLRequest answer");
    answer[0]
}

#[test]
#[ignore = "needs a Docker engine: run `EXACTLY_TESTKIT_DOCKER=always cargo test -p exactly-testkit -- --ignored docker`"]
fn docker_postgres_runs_two_phase_commit_and_restarts_with_its_data() {
    init_tracing();
    let mut pg = PostgresServer::start().expect("start a PostgreSQL container");
    let name = assert_in_container(pg.backend(), pg.container_name(), "exactly-testkit-postgres-");
    assert_labelled(&name);
    let port = pg.port();
    assert_eq!(pg.url(), format!("postgres://postgres@127.0.0.1:{port}/postgres"));
    assert_eq!(pg.data_dir(), None, "a container has no host data dir");
    assert_eq!(ssl_answer(port), b'N');

    assert_eq!(psql_in(&name, &["SELECT 1"]).as_deref(), Ok("1"));
    assert_eq!(
        psql_in(&name, &["SHOW max_prepared_transactions"]),
        Ok(MAX_PREPARED_TRANSACTIONS.to_string())
    );
    psql_in(
        &name,
        &[
            "BEGIN",
            "CREATE TABLE kept(x int)",
            "INSERT INTO kept VALUES (42)",
            "PREPARE TRANSACTION 'testkit_docker_g1'",
            "COMMIT PREPARED 'testkit_docker_g1'",
        ],
    )
    .expect("two-phase commit");
    let log = pg.log_path().expect("a log file").to_path_buf();
    assert!(
        log_contains(&log, "database system is ready to accept connections"),
        "log {log:?}"
    );

    pg.stop().expect("stop");
    assert!(!pg.is_running());
    assert!(!port_accepts(port), "port still open after stop");
    assert!(psql_in(&name, &["SELECT 1"]).is_err(), "query during the outage");

    pg.restart().expect("restart");
    assert!(pg.is_running());
    assert_eq!(pg.port(), port);
    assert_eq!(psql_in(&name, &["SELECT x FROM kept"]).as_deref(), Ok("42"));
    assert_eq!(ssl_answer(port), b'N');

    // restart() also works on a running server.
    pg.restart().expect("restart while running");
    assert_eq!(psql_in(&name, &["SELECT x FROM kept"]).as_deref(), Ok("42"));

    drop(pg);
    assert!(!port_accepts(port), "port still open after drop");
    assert_removed(&name);
}

// --------------------------------------------------------------------- Redis

/// Redis's answer to `PING` on the published port.
fn ping(port: u16) -> Vec<u8> {
    let mut stream = connect(port);
    stream.write_all(b"PING\r\n").expect("send PING");
    let mut answer = [0u8; 5];
    stream.read_exact(&mut answer).expect("PING answer");
    answer.to_vec()
}

#[test]
#[ignore = "needs a Docker engine: run `EXACTLY_TESTKIT_DOCKER=always cargo test -p exactly-testkit -- --ignored docker`"]
fn docker_redis_answers_restarts_and_is_removed() {
    init_tracing();
    let mut redis = RedisServer::start_own().expect("start a Redis container");
    let name = assert_in_container(redis.backend(), redis.container_name(), "exactly-testkit-redis-");
    assert_labelled(&name);
    let port = redis.port();
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{port}/"));
    assert_eq!(ping(port), b"+PONG");
    let log = redis.log_path().expect("a log file").to_path_buf();
    assert!(log_contains(&log, "Ready to accept connections"), "log {log:?}");

    redis.stop().expect("stop");
    assert!(!redis.is_running());
    assert!(!port_accepts(port), "port still open after stop");
    redis.restart().expect("restart");
    assert_eq!(redis.port(), port);
    assert_eq!(ping(port), b"+PONG");

    drop(redis);
    assert!(!port_accepts(port), "port still open after drop");
    assert_removed(&name);
}
