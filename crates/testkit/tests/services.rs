//! Starts every real service and proves it works, without client crates:
//! `psql` for PostgreSQL, hand-written RESP for Redis and hand-encoded Kafka
//! requests (ApiVersions, CreateTopics, Metadata) for the broker.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;

use exactly_testkit::{port_accepts, Backend, KafkaBroker, PostgresServer, RedisServer};

mod common;
use common::*;

/// Drops a service handle; a service the testkit started must have closed
/// its port by then.
fn drop_and_check_closed<T>(handle: T, port: u16, external: bool) {
    drop(handle);
    if !external {
        assert!(!port_accepts(port), "port {port} still open after drop");
    }
}

// ---------------------------------------------------------------- PostgreSQL

/// Runs `psql` against `url` with each of `commands` as a separate `-c`, in
/// one session; returns stdout, or stderr on failure.
fn psql(url: &str, commands: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("psql");
    cmd.arg(url)
        .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
        .env("PGCONNECT_TIMEOUT", "5");
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run psql (apt-get install -y postgresql-client): {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn postgres_supports_prepared_transactions_and_cleans_up() {
    init_tracing();
    let pg = PostgresServer::start().expect("start PostgreSQL");
    let url = pg.url().to_string();
    if !pg.is_external() {
        assert_eq!(url, format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port()));
    }

    let max = psql(&url, &["SHOW max_prepared_transactions"]).expect("SHOW");
    if !pg.is_external() {
        assert_eq!(max, "64");
    }

    psql(
        &url,
        &[
            "DROP TABLE IF EXISTS testkit_2pc",
            "BEGIN",
            "CREATE TABLE testkit_2pc(x int)",
            "INSERT INTO testkit_2pc VALUES (1)",
            "PREPARE TRANSACTION 'testkit_g1'",
            "COMMIT PREPARED 'testkit_g1'",
        ],
    )
    .expect("two-phase commit");
    let rows = psql(&url, &["SELECT count(*) FROM testkit_2pc"]).expect("select");
    assert_eq!(rows, "1");
    let pending = psql(
        &url,
        &["SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'testkit_g1'"],
    )
    .expect("pg_prepared_xacts");
    assert_eq!(pending, "0");

    if pg.is_external() {
        psql(&url, &["DROP TABLE testkit_2pc"]).expect("clean up");
        return;
    }
    let port = pg.port();
    let Some(data_dir) = pg.data_dir().map(PathBuf::from) else {
        // A container keeps its data in a Docker volume, removed with it.
        assert_eq!(pg.backend(), Backend::Container, "{pg:?} has no data dir");
        drop_and_check_closed(pg, port, false);
        return;
    };
    let temp_dir = data_dir.parent().expect("temp dir").to_path_buf();
    assert!(data_dir.join("PG_VERSION").exists());
    drop_and_check_closed(pg, port, false);
    assert!(!data_dir.exists(), "data dir {data_dir:?} survived the drop");
    assert!(!temp_dir.exists(), "temp dir {temp_dir:?} survived the drop");
}

#[test]
fn postgres_stop_and_restart_on_the_same_port() {
    init_tracing();
    let mut pg = PostgresServer::start().expect("start PostgreSQL");
    if pg.is_external() {
        assert!(pg.stop().is_err(), "an external server cannot be stopped");
        return;
    }
    let url = pg.url().to_string();
    let port = pg.port();
    psql(&url, &["CREATE TABLE kept(x int)", "INSERT INTO kept VALUES (42)"]).expect("write before the outage");

    pg.stop().expect("stop");
    assert!(!pg.is_running());
    assert!(!port_accepts(port), "port still open after stop");
    assert!(psql(&url, &["SELECT 1"]).is_err(), "query during outage");
    pg.stop().expect("stopping twice is harmless");

    pg.restart().expect("restart");
    assert!(pg.is_running());
    assert_eq!(pg.port(), port);
    assert_eq!(pg.url(), url);
    assert_eq!(psql(&url, &["SELECT x FROM kept"]).expect("read"), "42");

    // restart() also works on a running server.
    pg.restart().expect("restart while running");
    assert_eq!(psql(&url, &["SELECT x FROM kept"]).expect("read"), "42");
}

// --------------------------------------------------------------------- Redis

/// Sends one RESP command and returns the raw reply (one line, plus the
/// payload for a bulk string).
fn resp(stream: &mut TcpStream, args: &[&str]) -> String {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes()).expect("send");
    let mut reader = BufReader::new(stream);
    let mut reply = String::new();
    reader.read_line(&mut reply).expect("reply");
    if let Some(len) = reply.strip_prefix('$') {
        let len: i64 = len.trim().parse().expect("bulk length");
        if len >= 0 {
            let mut payload = vec![0; len as usize + 2];
            reader.read_exact(&mut payload).expect("bulk payload");
            reply.push_str(&String::from_utf8_lossy(&payload));
        }
    }
    reply
}

#[test]
fn redis_answers_ping_set_get() {
    init_tracing();
    let redis = RedisServer::start().expect("start Redis");
    if !redis.is_external() {
        assert_eq!(redis.url(), format!("redis://127.0.0.1:{}/", redis.port()));
    }
    let mut conn = connect(redis.port());
    assert_eq!(resp(&mut conn, &["PING"]), "+PONG\r\n");
    assert_eq!(resp(&mut conn, &["SET", "testkit:k", "v1"]), "+OK\r\n");
    assert_eq!(resp(&mut conn, &["GET", "testkit:k"]), "$2\r\nv1\r\n");
    assert_eq!(resp(&mut conn, &["GET", "testkit:none"]), "$-1\r\n");
    drop(conn);

    let (port, external) = (redis.port(), redis.is_external());
    drop_and_check_closed(redis, port, external);
}

#[test]
fn redis_stop_and_restart_on_the_same_port() {
    init_tracing();
    let mut redis = RedisServer::start().expect("start Redis");
    if redis.is_external() {
        assert!(redis.restart().is_err(), "an external server cannot restart");
        return;
    }
    let port = redis.port();
    redis.stop().expect("stop");
    assert!(!redis.is_running());
    assert!(!port_accepts(port), "port still open after stop");
    redis.restart().expect("restart");
    assert!(redis.is_running());
    assert_eq!(redis.port(), port);
    let mut conn = connect(port);
    assert_eq!(resp(&mut conn, &["PING"]), "+PONG\r\n");
}

// --------------------------------------------------------------------- Kafka

#[test]
fn the_shared_kafka_broker_answers_and_creates_topics() {
    init_tracing();
    let broker = KafkaBroker::shared().expect("the shared Kafka broker");
    if !broker.is_external() {
        assert_eq!(broker.bootstrap(), format!("127.0.0.1:{}", broker.port()));
        assert!(broker.pid().is_some(), "a broker the kit started has a JVM");
    }
    let (correlation, error_code) = api_versions(broker.port(), 0x5eed_0001);
    assert_eq!(correlation, 0x5eed_0001);
    assert_eq!(error_code, 0);
    let topic = format!("testkit-shared-{}", std::process::id());
    assert_eq!(create_topic(broker.port(), &topic), 0);
    assert_eq!(wait_topic(broker.port(), &topic), 0);
}

#[test]
fn an_own_kafka_broker_is_gone_after_drop() {
    init_tracing();
    let broker = KafkaBroker::start().expect("start a Kafka broker");
    assert!(
        !broker.is_external(),
        "KafkaBroker::start never uses EXACTLY_KAFKA_BOOTSTRAP"
    );
    let port = broker.port();
    let pid = broker.pid();
    assert_eq!(api_versions(port, 5), (5, 0));
    drop_and_check_closed(broker, port, false);
    if let Some(pid) = pid {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z ")),
            "the broker JVM {pid} outlived its handle"
        );
    }
}

#[test]
fn kafka_persistent_broker_keeps_topics_across_restart() {
    init_tracing();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut broker = KafkaBroker::start_persistent(dir.path()).expect("start broker");
    let port = broker.port();
    assert_eq!(topic_error(port, "testkit-never-created"), UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(create_topic(port, "testkit-kept"), 0);
    assert_eq!(wait_topic(port, "testkit-kept"), 0);
    let data: PathBuf = match broker.backend() {
        // The kit creates the folder itself; Kafka's own file proves the mount.
        Backend::Container => dir.path().join(exactly_testkit::kafka::CONTAINER_DATA_DIR),
        _ => dir.path().join(exactly_testkit::kafka::DATA_DIR),
    }
    .join("meta.properties");
    assert!(data.exists(), "no broker data at {data:?}");

    broker.stop().expect("stop");
    assert!(!broker.is_running());
    assert!(!port_accepts(port), "port still open after stop");
    broker.stop().expect("stopping twice is harmless");
    broker.restart().expect("restart");
    assert!(broker.is_running());
    assert_eq!(broker.port(), port);
    assert_eq!(api_versions(port, 8), (8, 0));
    assert_eq!(wait_topic(port, "testkit-kept"), 0, "topic lost across restart");
    drop(broker);
    assert!(data.exists(), "the caller's directory must survive the drop");

    // A new broker on the same directory sees the topic too.
    let broker = KafkaBroker::start_persistent(dir.path()).expect("start again");
    assert_eq!(wait_topic(broker.port(), "testkit-kept"), 0);
}

#[test]
fn a_frozen_kafka_broker_answers_only_after_thaw() {
    init_tracing();
    let mut broker = KafkaBroker::builder()
        .setting("transaction.max.timeout.ms", 5000)
        .start()
        .expect("start a broker with a setting");
    if broker.backend() == Backend::Local {
        let log = broker.log_path().expect("a local broker has a log");
        let properties = std::fs::read_to_string(log.with_file_name("server.properties")).expect("server.properties");
        assert!(
            properties.lines().any(|line| line == "transaction.max.timeout.ms=5000"),
            "{properties}"
        );
    }
    let port = broker.port();
    broker.freeze().expect("freeze");
    let mut stream = connect(port);
    stream
        .set_read_timeout(Some(std::time::Duration::from_millis(1500)))
        .unwrap();
    let mut request = Vec::new();
    request.extend_from_slice(&API_API_VERSIONS.to_be_bytes());
    request.extend_from_slice(&0i16.to_be_bytes());
    request.extend_from_slice(&77i32.to_be_bytes());
    put_str(&mut request, "exactly-testkit");
    let mut frame = (request.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&request);
    stream
        .write_all(&frame)
        .expect("the frozen broker's socket accepts bytes");
    let mut size = [0u8; 4];
    let answer = stream.read_exact(&mut size);
    assert!(answer.is_err(), "a frozen broker answered");
    broker.thaw().expect("thaw");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream
        .read_exact(&mut size)
        .expect("the thawed broker answers the pending request");
    assert_eq!(api_versions(port, 9), (9, 0));
}
