//! Starts every real service and proves it works, without client crates:
//! `psql` for PostgreSQL, hand-written RESP for Redis and hand-encoded Kafka
//! requests (ApiVersions, CreateTopics, Metadata) for the broker. Tests that
//! stop or restart a service start their own; the others run on the
//! `EXACTLY_*` services when set, with names of their own.

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

/// A table, key or transaction name of this run only: an external server
/// (`EXACTLY_DATABASE_URL`, `EXACTLY_REDIS_URL`) may be shared by other runs.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{nanos:x}", std::process::id())
}

/// `start()` gives whichever server the run names (an external one when
/// `EXACTLY_DATABASE_URL` is set), and it must support two-phase commit.
#[test]
fn postgres_supports_prepared_transactions() {
    init_tracing();
    let pg = PostgresServer::start().expect("start PostgreSQL");
    let url = pg.url().to_string();
    let max: u32 = psql(&url, &["SHOW max_prepared_transactions"])
        .expect("SHOW")
        .parse()
        .expect("a number");
    assert!(max > 0, "{pg:?} has max_prepared_transactions = 0");

    let (table, gid) = (unique("testkit_2pc"), unique("testkit_g"));
    psql(
        &url,
        &[
            "BEGIN",
            &format!("CREATE TABLE {table}(x int)"),
            &format!("INSERT INTO {table} VALUES (1)"),
            &format!("PREPARE TRANSACTION '{gid}'"),
        ],
    )
    .expect("prepare");
    let count = |sql: &str| psql(&url, &[sql]).expect(sql);
    let pending = format!("SELECT count(*) FROM pg_prepared_xacts WHERE gid = '{gid}'");
    assert_eq!(count(&pending), "1", "the prepared transaction is listed");
    psql(&url, &[&format!("COMMIT PREPARED '{gid}'")]).expect("commit prepared");
    assert_eq!(count(&format!("SELECT count(*) FROM {table}")), "1");
    assert_eq!(count(&pending), "0");
    psql(&url, &[&format!("DROP TABLE {table}")]).expect("clean up");
}

/// `start_own()` starts a cluster with the kit's settings even when
/// `EXACTLY_DATABASE_URL` is set, and removes it on drop.
#[test]
fn an_own_postgres_cluster_has_the_kits_settings_and_is_removed_on_drop() {
    init_tracing();
    let pg = PostgresServer::start_own().expect("start PostgreSQL");
    assert!(!pg.is_external(), "start_own never uses EXACTLY_DATABASE_URL");
    let url = pg.url().to_string();
    assert_eq!(url, format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port()));
    let max = psql(&url, &["SHOW max_prepared_transactions"]).expect("SHOW");
    assert_eq!(max, exactly_testkit::postgres::MAX_PREPARED_TRANSACTIONS.to_string());

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
    let mut pg = PostgresServer::start_own().expect("start PostgreSQL");
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
    let (key, absent) = (unique("testkit:k"), unique("testkit:none"));
    let mut conn = connect(redis.port());
    assert_eq!(resp(&mut conn, &["PING"]), "+PONG\r\n");
    assert_eq!(resp(&mut conn, &["SET", &key, "v1", "EX", "60"]), "+OK\r\n");
    assert_eq!(resp(&mut conn, &["GET", &key]), "$2\r\nv1\r\n");
    assert_eq!(resp(&mut conn, &["GET", &absent]), "$-1\r\n");
    drop(conn);

    let (port, external) = (redis.port(), redis.is_external());
    drop_and_check_closed(redis, port, external);
}

#[test]
fn redis_stop_and_restart_on_the_same_port() {
    init_tracing();
    let mut redis = RedisServer::start_own().expect("start Redis");
    assert!(!redis.is_external(), "start_own never uses EXACTLY_REDIS_URL");
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

// ------------------------------------------------------- external services

/// Set in the child process that [`external_servers_are_used_as_given_and_never_touched`]
/// runs with the variables pointing at its servers.
const CHILD_ENV: &str = "EXACTLY_TESTKIT_EXTERNAL_CHILD";

/// With `EXACTLY_DATABASE_URL` and `EXACTLY_REDIS_URL` set, `start()` only
/// carries those addresses: `stop`, `restart`, `freeze` and `thaw` are
/// refused naming the variable, dropping the handle leaves the server
/// running, and `start_own()` still starts a server of its own. The test
/// starts two servers of its own, runs itself again in a child process with
/// the variables naming them (the variables of a running test process must
/// not change under its other tests), and checks both servers still answer.
#[test]
fn external_servers_are_used_as_given_and_never_touched() {
    init_tracing();
    if std::env::var_os(CHILD_ENV).is_some() {
        as_child_with_external_servers();
        return;
    }
    let pg = PostgresServer::start_own().expect("start PostgreSQL");
    let redis = RedisServer::start_own().expect("start Redis");
    let name = "external_servers_are_used_as_given_and_never_touched";
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("EXACTLY_DATABASE_URL", pg.url())
        .env("EXACTLY_REDIS_URL", redis.url())
        .output()
        .expect("running the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the child run failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert_eq!(psql(pg.url(), &["SELECT 1"]).expect("PostgreSQL still answers"), "1");
    assert_eq!(resp(&mut connect(redis.port()), &["PING"]), "+PONG\r\n");
}

/// The child's half of [`external_servers_are_used_as_given_and_never_touched`].
fn as_child_with_external_servers() {
    let pg_url = std::env::var("EXACTLY_DATABASE_URL").expect("set by the parent");
    let redis_url = std::env::var("EXACTLY_REDIS_URL").expect("set by the parent");

    let mut pg = PostgresServer::start().expect("the external PostgreSQL");
    assert!(pg.is_external() && pg.backend() == Backend::External, "{pg:?}");
    assert_eq!(pg.url(), pg_url);
    assert!(pg.log_path().is_none() && pg.data_dir().is_none());
    for (action, result) in [
        ("stop", pg.stop()),
        ("restart", pg.restart()),
        ("freeze", pg.freeze()),
        ("thaw", pg.thaw()),
    ] {
        let message = result.expect_err(action).to_string();
        assert!(
            message.contains("EXACTLY_DATABASE_URL") && message.contains(action) && message.contains("start_own"),
            "{message}"
        );
    }
    assert!(pg.is_running());
    assert_eq!(psql(pg.url(), &["SELECT 1"]).expect("still answers"), "1");
    let port = pg.port();
    drop(pg);
    assert!(port_accepts(port), "dropping an external handle stopped the server");

    let mut redis = RedisServer::start().expect("the external Redis");
    assert!(redis.is_external() && redis.backend() == Backend::External, "{redis:?}");
    assert_eq!(redis.url(), redis_url);
    for (action, result) in [
        ("stop", redis.stop()),
        ("restart", redis.restart()),
        ("freeze", redis.freeze()),
        ("thaw", redis.thaw()),
    ] {
        let message = result.expect_err(action).to_string();
        assert!(
            message.contains("EXACTLY_REDIS_URL") && message.contains(action),
            "{message}"
        );
    }
    let port = redis.port();
    drop(redis);
    assert_eq!(resp(&mut connect(port), &["PING"]), "+PONG\r\n");

    let own = PostgresServer::start_own().expect("start PostgreSQL");
    assert!(!own.is_external() && own.url() != pg_url, "{own:?}");
    let own = RedisServer::start_own().expect("start Redis");
    assert!(!own.is_external() && own.url() != redis_url, "{own:?}");
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

#[test]
fn a_frozen_postgres_answers_only_after_thaw() {
    init_tracing();
    let mut pg = PostgresServer::start_own().expect("start PostgreSQL");
    pg.freeze().expect("freeze: every process of the cluster stopped");
    let mut stream = connect(pg.port());
    stream
        .set_read_timeout(Some(std::time::Duration::from_millis(1500)))
        .unwrap();
    // A startup message (protocol 3.0, user postgres): the postmaster
    // answers it with an authentication request or an error.
    let mut body = 196_608i32.to_be_bytes().to_vec();
    body.extend_from_slice(b"user\0postgres\0\0");
    let mut message = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    message.extend_from_slice(&body);
    stream
        .write_all(&message)
        .expect("the frozen server's socket accepts bytes");
    let mut first = [0u8; 1];
    assert!(stream.read_exact(&mut first).is_err(), "a frozen PostgreSQL answered");
    pg.thaw().expect("thaw");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream
        .read_exact(&mut first)
        .expect("the thawed server answers the pending startup");
    assert!(matches!(first[0], b'R' | b'E'), "{}", first[0] as char);
}
