//! Starts every real service and proves it works, without client crates:
//! `psql` for PostgreSQL, hand-written RESP for Redis and hand-encoded Kafka
//! requests (ApiVersions, CreateTopics, Metadata) for the broker.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use exactly_testkit::{port_accepts, KafkaBroker, PostgresServer, RedisServer};

const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn init_tracing() {
    // Logs are only shown for failing tests (captured by the harness).
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("exactly_testkit=debug")
        .try_init();
}

/// Connects to a loopback port with a read timeout.
fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the service");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream
}

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
    let data_dir = pg.data_dir().expect("managed cluster").to_path_buf();
    let temp_dir = data_dir.parent().expect("temp dir").to_path_buf();
    let port = pg.port();
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

const API_METADATA: i16 = 3;
const API_API_VERSIONS: i16 = 18;
const API_CREATE_TOPICS: i16 = 19;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// Appends a Kafka (non-compact) string.
fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as i16).to_be_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// Sends one hand-encoded request (header v1: api key, version, correlation
/// id, client id) and returns the response's correlation id and the rest of
/// the response (header v0, so the body follows directly).
fn kafka_request(port: u16, api_key: i16, version: i16, correlation_id: i32, body: &[u8]) -> (i32, Vec<u8>) {
    let mut stream = connect(port);
    let mut message = Vec::new();
    message.extend_from_slice(&api_key.to_be_bytes());
    message.extend_from_slice(&version.to_be_bytes());
    message.extend_from_slice(&correlation_id.to_be_bytes());
    put_str(&mut message, "exactly-testkit");
    message.extend_from_slice(body);
    let mut request = (message.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&message);
    stream.write_all(&request).expect("send request");

    let mut size = [0; 4];
    stream.read_exact(&mut size).expect("response size");
    let size = i32::from_be_bytes(size);
    assert!(size >= 4, "response too short: {size} bytes");
    let mut response = vec![0; size as usize];
    stream.read_exact(&mut response).expect("response body");
    let correlation = i32::from_be_bytes(response[0..4].try_into().unwrap());
    (correlation, response.split_off(4))
}

/// Reads big-endian Kafka primitives from a response body.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        head.try_into().unwrap()
    }
    fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.take())
    }
    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.take())
    }
    /// A string or nullable string (length -1 is null).
    fn string(&mut self) -> Option<String> {
        let len = self.i16();
        let len = usize::try_from(len).ok()?;
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(String::from_utf8_lossy(text).into_owned())
    }
}

/// ApiVersions v0: returns the correlation id and error code.
fn api_versions(port: u16, correlation_id: i32) -> (i32, i16) {
    let (correlation, body) = kafka_request(port, API_API_VERSIONS, 0, correlation_id, &[]);
    (correlation, Reader(&body).i16())
}

/// CreateTopics v0 for one topic with one partition; returns its error code.
fn create_topic(port: u16, topic: &str) -> i16 {
    let mut body = 1i32.to_be_bytes().to_vec(); // one topic
    put_str(&mut body, topic);
    body.extend_from_slice(&1i32.to_be_bytes()); // partitions
    body.extend_from_slice(&1i16.to_be_bytes()); // replication factor
    body.extend_from_slice(&0i32.to_be_bytes()); // no assignments
    body.extend_from_slice(&0i32.to_be_bytes()); // no configs
    body.extend_from_slice(&10_000i32.to_be_bytes()); // timeout ms
    let (correlation, response) = kafka_request(port, API_CREATE_TOPICS, 0, 31, &body);
    assert_eq!(correlation, 31);
    let mut r = Reader(&response);
    assert_eq!(r.i32(), 1, "one topic in the CreateTopics response");
    assert_eq!(r.string().as_deref(), Some(topic));
    r.i16()
}

/// Metadata v4 for one topic without auto-creation; returns the topic's
/// error code (0 if it exists, 3 if unknown).
fn topic_error(port: u16, topic: &str) -> i16 {
    let mut body = 1i32.to_be_bytes().to_vec();
    put_str(&mut body, topic);
    body.push(0); // allow_auto_topic_creation = false
    let (correlation, response) = kafka_request(port, API_METADATA, 4, 32, &body);
    assert_eq!(correlation, 32);
    let mut r = Reader(&response);
    r.i32(); // throttle_time_ms
    for _ in 0..r.i32() {
        r.i32(); // node_id
        r.string(); // host
        r.i32(); // port
        r.string(); // rack
    }
    r.string(); // cluster_id
    r.i32(); // controller_id
    assert_eq!(r.i32(), 1, "one topic in the Metadata response");
    let error = r.i16();
    assert_eq!(r.string().as_deref(), Some(topic));
    error
}

#[test]
fn kafka_broker_answers_api_versions() {
    init_tracing();
    let broker = KafkaBroker::start().expect("start Kafka broker");
    if !broker.is_external() {
        assert_eq!(broker.bootstrap(), format!("127.0.0.1:{}", broker.port()));
    }
    assert!(port_accepts(broker.port()));
    let (correlation, error_code) = api_versions(broker.port(), 0x5eed_0001);
    assert_eq!(correlation, 0x5eed_0001);
    assert_eq!(error_code, 0);

    let (port, external) = (broker.port(), broker.is_external());
    drop_and_check_closed(broker, port, external);
}

#[test]
fn kafka_persistent_broker_keeps_topics_across_restart() {
    init_tracing();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut broker = KafkaBroker::start_persistent(dir.path()).expect("start broker");
    if broker.is_external() {
        assert!(broker.stop().is_err(), "an external Kafka cannot be stopped");
        return;
    }
    let port = broker.port();
    assert_eq!(topic_error(port, "testkit-never-created"), UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(create_topic(port, "testkit-kept"), 0);
    assert_eq!(topic_error(port, "testkit-kept"), 0);
    let db: PathBuf = dir.path().join(exactly_testkit::kafka::PERSISTENT_DB_FILE);
    assert!(db.exists(), "no SQLite file at {db:?}");

    broker.stop().expect("stop");
    assert!(!broker.is_running());
    assert!(!port_accepts(port), "port still open after stop");
    broker.restart().expect("restart");
    assert!(broker.is_running());
    assert_eq!(broker.port(), port);
    assert_eq!(api_versions(port, 8), (8, 0));
    assert_eq!(topic_error(port, "testkit-kept"), 0, "topic lost across restart");
    drop(broker);
    assert!(db.exists(), "the caller's directory must survive the drop");

    // A new broker on the same directory sees the topic too.
    let broker = KafkaBroker::start_persistent(dir.path()).expect("start again");
    assert_eq!(topic_error(broker.port(), "testkit-kept"), 0);
}

#[test]
fn kafka_in_memory_broker_restarts_empty_on_the_same_port() {
    init_tracing();
    let mut broker = KafkaBroker::start().expect("start broker");
    if broker.is_external() {
        return;
    }
    let port = broker.port();
    assert_eq!(create_topic(port, "testkit-lost"), 0);
    assert_eq!(topic_error(port, "testkit-lost"), 0);
    broker.restart().expect("restart");
    assert_eq!(broker.port(), port);
    assert_eq!(topic_error(port, "testkit-lost"), UNKNOWN_TOPIC_OR_PARTITION);
}
