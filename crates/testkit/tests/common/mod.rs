//! Helpers shared by the integration tests: tracing, loopback connections
//! and hand-encoded Kafka requests (ApiVersions, CreateTopics, Metadata).

// Each test crate uses a different subset.
// `pub` is how the test files that share these helpers reach them.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::sleep;
use std::time::{Duration, Instant};

pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

pub fn init_tracing() {
    // Logs are only shown for failing tests (captured by the harness).
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("exactly_testkit=debug")
        .try_init();
}

/// Connects to a loopback port with a read timeout.
pub fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the service");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream
}

pub const API_METADATA: i16 = 3;
pub const API_API_VERSIONS: i16 = 18;
pub const API_CREATE_TOPICS: i16 = 19;
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// Appends a Kafka (non-compact) string.
pub fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as i16).to_be_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// Sends one hand-encoded request (header v1: api key, version, correlation
/// id, client id) and returns the response's correlation id and the rest of
/// the response (header v0, so the body follows directly).
pub fn kafka_request(port: u16, api_key: i16, version: i16, correlation_id: i32, body: &[u8]) -> (i32, Vec<u8>) {
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
pub struct Reader<'a>(pub &'a [u8]);

impl Reader<'_> {
    pub fn take<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        head.try_into().unwrap()
    }
    pub fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.take())
    }
    pub fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.take())
    }
    /// A string or nullable string (length -1 is null).
    pub fn string(&mut self) -> Option<String> {
        let len = self.i16();
        let len = usize::try_from(len).ok()?;
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(String::from_utf8_lossy(text).into_owned())
    }
}

/// ApiVersions v0: returns the correlation id and error code.
pub fn api_versions(port: u16, correlation_id: i32) -> (i32, i16) {
    let (correlation, body) = kafka_request(port, API_API_VERSIONS, 0, correlation_id, &[]);
    (correlation, Reader(&body).i16())
}

/// CreateTopics v2 (Kafka 4 serves v2 and later) for one topic with one
/// partition; returns its error code.
pub fn create_topic(port: u16, topic: &str) -> i16 {
    let mut body = 1i32.to_be_bytes().to_vec(); // one topic
    put_str(&mut body, topic);
    body.extend_from_slice(&1i32.to_be_bytes()); // partitions
    body.extend_from_slice(&1i16.to_be_bytes()); // replication factor
    body.extend_from_slice(&0i32.to_be_bytes()); // no assignments
    body.extend_from_slice(&0i32.to_be_bytes()); // no configs
    body.extend_from_slice(&10_000i32.to_be_bytes()); // timeout ms
    body.push(0); // validate_only = false
    let (correlation, response) = kafka_request(port, API_CREATE_TOPICS, 2, 31, &body);
    assert_eq!(correlation, 31);
    let mut r = Reader(&response);
    r.i32(); // throttle_time_ms
    assert_eq!(r.i32(), 1, "one topic in the CreateTopics response");
    assert_eq!(r.string().as_deref(), Some(topic));
    r.i16()
}

/// Metadata v4 for one topic without auto-creation; returns the topic's
/// error code (0 if it exists, 3 if unknown).
pub fn topic_error(port: u16, topic: &str) -> i16 {
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

/// Polls [`topic_error`] until the topic exists (a real Kafka may answer
/// Metadata from a cache that lags behind CreateTopics for a moment);
/// returns the last error code (0 once it exists).
pub fn wait_topic(port: u16, topic: &str) -> i16 {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let error = topic_error(port, topic);
        if error == 0 || Instant::now() >= deadline {
            return error;
        }
        sleep(Duration::from_millis(100));
    }
}
