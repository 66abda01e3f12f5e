//! The Docker fallback when no Docker engine answers: the errors must name
//! every way to get the service (environment variable, local install,
//! Docker) and say why Docker was not used.
//!
//! Environment variables are process-global, so this file is its own test
//! process and holds a single test function that sets them; nothing else
//! reads them concurrently.

use std::path::Path;

use exactly_testkit::kafka::{KAFKA_BOOTSTRAP_ENV, KAFKA_IMAGE, KAFKA_INSTALL, KAFKA_LIBS_ENV};
use exactly_testkit::postgres::{DATABASE_URL_ENV, POSTGRES_IMAGE};
use exactly_testkit::redis::{REDIS_IMAGE, REDIS_URL_ENV};
use exactly_testkit::{KafkaBroker, PostgresServer, RedisServer, TestkitError, DOCKER_MODE_ENV};

/// The error of a start that must fail, as text (`Display` and `Debug` are
/// the same for testkit errors).
fn failure<T: std::fmt::Debug>(what: &str, result: Result<T, TestkitError>) -> String {
    match result {
        Ok(handle) => panic!("{what} started although it must fail: {handle:?}"),
        Err(err) => {
            assert_eq!(format!("{err:?}"), err.to_string());
            err.to_string()
        }
    }
}

fn assert_mentions(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "`{part}` missing from the error:\n{text}");
    }
}

/// The error names where the engine was looked for (`DOCKER_HOST`, set to
/// a socket that does not exist).
fn assert_names_docker_failure(text: &str) {
    assert!(
        text.contains("DOCKER_HOST=unix:///nonexistent.sock"),
        "the error does not say where Docker was asked:\n{text}"
    );
}

#[test]
fn without_a_docker_engine_the_errors_name_every_option() {
    let empty = tempfile::tempdir().expect("temp dir");
    for var in [KAFKA_BOOTSTRAP_ENV, DATABASE_URL_ENV, REDIS_URL_ENV] {
        std::env::remove_var(var);
    }
    std::env::set_var("DOCKER_HOST", "unix:///nonexistent.sock");

    // `always` skips the local programs, so this fails here even though
    // Kafka's jars and PostgreSQL are installed.
    std::env::set_var(DOCKER_MODE_ENV, "always");
    let kafka = failure("Kafka", KafkaBroker::start());
    assert_mentions(
        &kafka,
        &[
            "EXACTLY_TESTKIT_DOCKER=always skips the local programs",
            "no Docker engine answered",
            "DOCKER_HOST",
            KAFKA_IMAGE,
            KAFKA_INSTALL,
            KAFKA_LIBS_ENV,
            KAFKA_BOOTSTRAP_ENV,
        ],
    );
    assert_names_docker_failure(&kafka);

    let persistent_dir = empty.path().join("broker");
    let persistent = failure("persistent Kafka", KafkaBroker::start_persistent(&persistent_dir));
    assert_mentions(&persistent, &["no Docker engine answered", KAFKA_INSTALL]);

    let pg = failure("PostgreSQL", PostgresServer::start());
    assert_mentions(
        &pg,
        &[
            "EXACTLY_TESTKIT_DOCKER=always skips the local programs",
            "no Docker engine answered",
            "DOCKER_HOST",
            POSTGRES_IMAGE,
            "apt-get install -y postgresql",
            DATABASE_URL_ENV,
        ],
    );
    assert_names_docker_failure(&pg);

    // Redis has a container path too: with `always` it asks Docker.
    let redis = failure("Redis", RedisServer::start());
    assert_mentions(
        &redis,
        &[
            "EXACTLY_TESTKIT_DOCKER=always skips the local programs",
            "no Docker engine answered",
            "apt-get install -y redis-server",
            REDIS_IMAGE,
            REDIS_URL_ENV,
        ],
    );
    assert_names_docker_failure(&redis);

    // An environment override wins for the shared broker, which then is
    // the external one; a broker of the test's own ignores it.
    std::env::set_var(KAFKA_BOOTSTRAP_ENV, "127.0.0.1:1");
    let external = KafkaBroker::shared().expect("the override needs no broker");
    assert!(external.is_external());
    assert_eq!(external.backend(), exactly_testkit::Backend::External);
    assert_eq!(external.bootstrap(), "127.0.0.1:1");
    let own = failure("an own Kafka despite the override", KafkaBroker::start());
    assert_mentions(&own, &["EXACTLY_TESTKIT_DOCKER=always skips the local programs"]);
    std::env::remove_var(KAFKA_BOOTSTRAP_ENV);

    // Without java and the jars, `auto` looks for them first, then asks
    // Docker.
    std::env::set_var("PATH", empty.path());
    std::env::remove_var("JAVA_HOME");
    std::env::set_var(KAFKA_LIBS_ENV, empty.path());
    std::env::set_var(DOCKER_MODE_ENV, "auto");
    let auto = failure("Kafka without java", KafkaBroker::start());
    assert_mentions(
        &auto,
        &[
            "cannot find `java`",
            &format!("PATH={}", empty.path().display()),
            "no Docker engine answered",
            KAFKA_INSTALL,
        ],
    );
    // A Java runtime, but no jars in the folder the variable names.
    let java_dir = tempfile::tempdir().expect("temp dir");
    let java = java_dir.path().join("java");
    std::fs::write(&java, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&java, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::env::set_var("PATH", java_dir.path());
    let no_jars = failure("Kafka without jars", KafkaBroker::start());
    assert_mentions(
        &no_jars,
        &[
            "cannot find `kafka_2.13-*.jar`",
            &empty.path().display().to_string(),
            KAFKA_LIBS_ENV,
        ],
    );

    // `never` does not even ask Docker.
    std::env::set_var(DOCKER_MODE_ENV, "never");
    let never = failure("Kafka without Docker", KafkaBroker::start());
    assert_mentions(
        &never,
        &[
            "Docker was not tried because EXACTLY_TESTKIT_DOCKER=never",
            KAFKA_INSTALL,
        ],
    );

    // Redis without `redis-server` (PATH holds only the fake java) and
    // without Docker names the other ways.
    let redis = failure("Redis without Docker", RedisServer::start());
    assert_mentions(
        &redis,
        &[
            "cannot find `redis-server`",
            "Docker was not tried because EXACTLY_TESTKIT_DOCKER=never",
            "apt-get install -y redis-server",
            REDIS_URL_ENV,
        ],
    );

    // A misspelt mode is an error, not a silent default.
    std::env::set_var(DOCKER_MODE_ENV, "sometimes");
    let invalid = failure("Kafka with a bad mode", KafkaBroker::start());
    assert_mentions(&invalid, &[DOCKER_MODE_ENV, "\"sometimes\"", "never", "auto", "always"]);
    let invalid = failure("PostgreSQL with a bad mode", PostgresServer::start());
    assert_mentions(&invalid, &[DOCKER_MODE_ENV]);

    assert!(
        !Path::new(&persistent_dir).join("kafka-data").exists(),
        "nothing is prepared for a container that cannot start"
    );
}
