//! The Kafka sink's timeout and recovery edges, through the `exactly` binary
//! on a real Apache Kafka broker of each test's own (each needs broker
//! settings of its own, or stops the broker):
//!
//! 1. a transaction held up past most of the broker's transaction timeout is
//!    aborted and replayed, never committed after the broker aborted it;
//! 2. a pipeline stopped for longer than the broker's
//!    `transactional.id.expiration.ms` restarts cleanly;
//! 3. connections closed or refused during recovery (the broker restarting)
//!    are retried, never taken for a refusal of the commit;
//! 4. (in `connectors/kafka/tests/late_init.rs`) a producer initialization
//!    of a failed attempt never fences the next attempt's producer.
//!
//! Plus the start-up guardrail: checkpoint settings that could outlive the
//! sink's transactions are refused, naming both keys.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use exactly_kafka::admin::KafkaAdmin;
use exactly_kafka::wire::kafka_protocol::messages::api_versions_response::ApiVersion;
use exactly_kafka::wire::kafka_protocol::messages::{ApiKey, ApiVersionsResponse, RequestHeader, ResponseHeader};
use exactly_kafka::wire::kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};
use exactly_kafka::wire::{EndTxnOutcome, WireClient};
use exactly_kafka::KafkaCommittable;
use exactly_testkit::KafkaBroker;

const PARTITIONS: i32 = 4;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A name no other test or earlier run uses.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// Creates `topic` with [`PARTITIONS`] partitions.
fn create_topic(bootstrap: &str, topic: &str) {
    runtime().block_on(async {
        KafkaAdmin::new(bootstrap)
            .create_topic(topic, PARTITIONS)
            .await
            .expect("creating a topic")
    });
}

/// Records of a [`Feed`] per chunk, and the pause after each chunk: 2,000
/// records a second at most.
const FEED_CHUNK: usize = 50;
const FEED_PAUSE: Duration = Duration::from_millis(25);

/// Produces `v-<i>` (key `k-<i>`, partition `i % PARTITIONS`) for `range`
/// from a background thread at a steady pace,
/// so a pipeline reading them as they come spans many checkpoints however
/// fast the machine (read at full speed, records produced beforehand reach
/// the sink within the first checkpoint intervals).
struct Feed(std::thread::JoinHandle<()>);

impl Feed {
    fn start(bootstrap: &str, topic: &str, range: std::ops::Range<usize>) -> Feed {
        let (bootstrap, topic) = (bootstrap.to_string(), topic.to_string());
        Feed(std::thread::spawn(move || {
            use rdkafka::producer::{FutureProducer, FutureRecord};
            // One producer for the whole feed: creating one per chunk costs
            // more than the pause.
            let producer: FutureProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("enable.idempotence", "true")
                .set("linger.ms", "1")
                .create()
                .expect("a producer for the feed");
            runtime().block_on(async {
                for start in range.clone().step_by(FEED_CHUNK) {
                    let sent: Vec<_> = (start..(start + FEED_CHUNK).min(range.end))
                        .map(|i| {
                            let (key, value) = (format!("k-{i}"), format!("v-{i}"));
                            let record = FutureRecord::to(&topic)
                                .key(&key)
                                .payload(&value)
                                .partition(i as i32 % PARTITIONS);
                            producer
                                .send_result(record)
                                .map_err(|(e, _)| e)
                                .expect("queueing a record")
                        })
                        .collect();
                    for delivery in sent {
                        delivery
                            .await
                            .expect("delivery")
                            .map_err(|(e, _)| e)
                            .expect("delivering a record");
                    }
                    tokio::time::sleep(FEED_PAUSE).await;
                }
            })
        }))
    }

    /// Waits until every record is produced.
    fn finish(self) {
        self.0.join().expect("the feed thread panicked");
    }
}

/// A Kafka → Kafka pipeline file in `dir`: `input` copied to a new output
/// topic, bounded (`stop_at_end`), parallelism 2. `checkpoint` and
/// `restart` are the bodies of those sections, `sink` is added to
/// `[sink.kafka]`. Returns the file and the output topic. It runs until
/// SIGTERM ([`stop_after`]); [`Copy::bounded`] makes it stop at the end
/// the input has when it starts.
struct Copy {
    config: PathBuf,
    bootstrap: String,
    output: String,
}

fn copy_pipeline(dir: &Path, bootstrap: &str, input: &str, checkpoint: &str, restart: &str, sink: &str) -> Copy {
    let name = unique("edge");
    let output = unique("edge-out");
    create_topic(bootstrap, &output);
    let config = dir.join("pipeline.toml");
    std::fs::write(
        &config,
        format!(
            r#"name = "{name}"
guarantee = "exactly-once"
parallelism = 2
batch_size = 10

[checkpoint]
dir = "checkpoints"
{checkpoint}

[restart]
{restart}

[source.kafka]
bootstrap = "{bootstrap}"
topic = "{input}"
properties = {{ "fetch.max.bytes" = "2048", "max.partition.fetch.bytes" = "1024" }}

[sink.kafka]
bootstrap = "{bootstrap}"
topic = "{output}"
transactional_id_prefix = "{name}"
{sink}
"#
        ),
    )
    .unwrap();
    Copy {
        config,
        bootstrap: bootstrap.to_string(),
        output,
    }
}

impl Copy {
    /// Adds `stop_at_end = true` to the source.
    fn bounded(&self) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        let text = text.replace("[source.kafka]\n", "[source.kafka]\nstop_at_end = true\n");
        std::fs::write(&self.config, text).unwrap();
    }

    /// Every `v-<i>` of `0..records` exactly once in the output, as both a
    /// plain read_committed consumer and the log-level committed reader see
    /// it, with no transaction left open.
    fn assert_exactly_once(&self, records: usize, what: &str) {
        let (consumed, read) = runtime().block_on(async {
            let consumed = KafkaAdmin::new(&self.bootstrap)
                .read_all(&self.output)
                .await
                .expect("consuming the output");
            let read = WireClient::new(&self.bootstrap)
                .unwrap()
                .read_topic(&self.output)
                .await
                .expect("reading the output's log");
            (consumed, read)
        });
        let mut consumed: Vec<String> = consumed
            .into_iter()
            .map(|r| String::from_utf8(r.value.expect("a value").to_vec()).unwrap())
            .collect();
        let mut committed: Vec<String> = read
            .records
            .iter()
            .map(|r| String::from_utf8(r.value.clone().unwrap_or_default()).unwrap())
            .collect();
        consumed.sort();
        committed.sort();
        assert_eq!(
            consumed, committed,
            "{what}: a read_committed consumer and the log disagree"
        );
        let expected: BTreeSet<String> = (0..records).map(|i| format!("v-{i}")).collect();
        let set: BTreeSet<String> = committed.iter().cloned().collect();
        assert_eq!(
            committed.len(),
            records,
            "{what}: committed records (duplicates or loss)"
        );
        assert_eq!(set, expected, "{what}: the set of committed values");
        assert!(
            read.open_transactions.is_empty(),
            "{what}: transactions left open: {:?}",
            read.open_transactions
        );
    }

    /// The latest checkpoint entry of every checkpoint sequence (one per
    /// region).
    fn latest_entries(&self) -> Vec<exactly::core::CheckpointEntry> {
        let file = exactly::config::PipelineFile::load(&self.config).expect("the pipeline file");
        let store = file.store();
        let folders = checkpoint_sequences(store.dir());
        folders
            .iter()
            .map(|folder| {
                let region = folder.file_name().unwrap().to_string_lossy().into_owned();
                let sequence = exactly::core::FsCheckpointStore::new(store.dir(), &region, 3);
                sequence
                    .latest()
                    .expect("reading the checkpoints")
                    .unwrap_or_else(|| panic!("no checkpoint in {}", folder.display()))
            })
            .collect()
    }

    /// The committables the latest checkpoint entries list, for every sink
    /// subtask.
    fn listed_committables(&self) -> Vec<KafkaCommittable> {
        self.latest_entries()
            .iter()
            .flat_map(|entry| entry.checkpoint.pending.values().flatten().cloned().collect::<Vec<_>>())
            .map(|p| serde_json::from_value(p.committable.clone()).expect("a Kafka committable"))
            .collect()
    }
}

/// Edge 1. A checkpoint is held up: one sink subtask stalls for 14 s after a
/// pre-commit (`EXACTLY_DELAY_AT`), so every checkpoint times out meanwhile
/// and the other subtask's pre-committed transaction waits past the broker's
/// 10 s `transaction.max.timeout.ms`, which aborts it. The sink fails the
/// attempt once a transaction is 80 % through its timeout, so recovery
/// aborts and replays it instead of a later checkpoint listing a transaction
/// the broker already aborted (a DataLoss stop).
#[test]
fn a_transaction_held_up_past_its_timeout_is_replayed_not_lost() {
    let kafka = KafkaBroker::builder()
        .setting("transaction.max.timeout.ms", 10_000)
        .setting("transaction.abort.timed.out.transaction.cleanup.interval.ms", 500)
        .start()
        .expect("a broker with a 10 s transaction limit");
    let input = unique("held-in");
    create_topic(kafka.bootstrap(), &input);
    const RECORDS: usize = 6_000;
    let feed = Feed::start(kafka.bootstrap(), &input, 0..RECORDS);
    let dir = tempfile::tempdir().unwrap();
    let copy = copy_pipeline(
        dir.path(),
        kafka.bootstrap(),
        &input,
        "interval = \"200ms\"\ntimeout = \"1s\"\ntolerable_failures = 1000",
        "strategy = \"fixed\"\ndelay = \"200ms\"\nmax_attempts = 5",
        "transaction_timeout = \"10s\"",
    );
    let run = spawn_with_env(&copy.config, &[("EXACTLY_DELAY_AT", "sink.after_pre_commit:3=14s")]);
    feed.finish();
    let log = stop_after(run, &copy.bootstrap, &copy.output, RECORDS);
    assert!(
        log.contains("delay point reached"),
        "the checkpoint was never held up:\n{log}"
    );
    assert!(
        log.contains("80 % of transaction_timeout"),
        "the attempt was supposed to fail before the broker's timeout:\n{log}"
    );
    copy.assert_exactly_once(RECORDS, "held-up checkpoint");
}

/// Stops a background run with SIGTERM once `output` has at least
/// `at_least` committed records; it takes a last checkpoint and commits it.
fn stop_after(mut run: Background, bootstrap: &str, output: &str, at_least: usize) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if !run.is_running() {
            let (status, _, log) = wait(run, Duration::from_secs(1));
            panic!("the pipeline ended on its own ({status}) before {at_least} records were in {output}:\n{log}");
        }
        let read = runtime().block_on(async { WireClient::new(bootstrap).unwrap().read_topic(output).await });
        // A fresh output topic may answer NOT_LEADER_OR_FOLLOWER (or the
        // like) until its leader is known: what Kafka calls retriable is
        // read again.
        match read {
            Ok(read) if read.records.len() >= at_least => break,
            Ok(_) => {}
            Err(e) if e.is_retriable() => eprintln!("reading {output} again after a retriable error: {e}"),
            Err(e) => panic!("reading the output {output}: {e}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {at_least} records in {output} within 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // SAFETY: kill only sends a signal to the child this test started.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let (status, _, log) = wait(run, Duration::from_secs(120));
    assert!(status.success(), "the pipeline did not stop cleanly on SIGTERM:\n{log}");
    log
}

/// Edge 2. The pipeline is stopped gracefully mid-stream (its last
/// checkpoint lists the transactions of its interval, committed right after
/// it was persisted), then stays stopped until the broker expired its
/// transactional ids (`transactional.id.expiration.ms` = 10 s): EndTxn on
/// them now answers INVALID_PRODUCER_ID_MAPPING. The restart must know they
/// were committed and not report them lost.
#[test]
fn a_pipeline_stopped_past_the_id_expiration_restarts_cleanly() {
    let kafka = KafkaBroker::builder()
        .setting("transactional.id.expiration.ms", 10_000)
        .setting("transaction.remove.expired.transaction.cleanup.interval.ms", 500)
        .start()
        .expect("a broker that expires transactional ids after 10 s");
    let input = unique("expire-in");
    create_topic(kafka.bootstrap(), &input);
    const RECORDS: usize = 10_000;
    let feed = Feed::start(kafka.bootstrap(), &input, 0..RECORDS);
    let dir = tempfile::tempdir().unwrap();
    let copy = copy_pipeline(
        dir.path(),
        kafka.bootstrap(),
        &input,
        // Each of the 5 pooled ids of a subtask is used every 5 intervals,
        // well within the expiration while the pipeline runs.
        "interval = \"500ms\"",
        "strategy = \"none\"",
        "",
    );
    // Stopped while the feed still produces: the last interval has records.
    let log = stop_after(spawn(&copy.config), &copy.bootstrap, &copy.output, 2_000);
    let listed = copy.listed_committables();
    assert!(
        !listed.is_empty(),
        "the last checkpoint lists the transactions of its interval: {:?}\n{log}",
        copy.latest_entries()
    );

    // Wait until the broker forgot the listed ids.
    let wire = WireClient::new(kafka.bootstrap()).unwrap();
    let expired = runtime().block_on(async {
        for _ in 0..120 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let c = &listed[0];
            let answer = wire.end_txn(&c.transactional_id, c.producer_id, c.epoch, true).await;
            if matches!(answer, Ok(EndTxnOutcome::InvalidProducerIdMapping)) {
                return true;
            }
        }
        false
    });
    assert!(
        expired,
        "the broker never expired transactional id {}",
        listed[0].transactional_id
    );

    feed.finish();
    let log = stop_after(spawn(&copy.config), &copy.bootstrap, &copy.output, RECORDS);
    assert!(
        log.contains("every transaction the checkpoint lists was committed before the stop"),
        "{log}"
    );
    copy.assert_exactly_once(RECORDS, "after the ids expired");
}

/// A broker going down, on `port`: it accepts connections and answers the
/// ApiVersions handshake, then closes the connection on the next request
/// without answering — the client's request meets a closed connection.
struct Closer {
    stop: Arc<AtomicBool>,
    closed: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Closer {
    fn bind(port: u16) -> Closer {
        let listener = (0..100)
            .find_map(|_| {
                TcpListener::bind(("127.0.0.1", port)).ok().or_else(|| {
                    std::thread::sleep(Duration::from_millis(100));
                    None
                })
            })
            .expect("binding the broker's port after it stopped");
        listener.set_nonblocking(true).unwrap();
        let (stop, closed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (s, c) = (stop.clone(), closed.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if handshake_then_close(stream) {
                            c.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Closer {
            stop,
            closed,
            thread: Some(thread),
        }
    }

    /// Stops accepting and frees the port; returns how many requests after
    /// a handshake it closed the connection on.
    fn release(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        self.closed.load(Ordering::SeqCst)
    }
}

/// One length-prefixed request: its header and the bytes after it.
fn read_request(stream: &mut std::net::TcpStream) -> Option<(RequestHeader, i16)> {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).ok()?;
    let mut body = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
    stream.read_exact(&mut body).ok()?;
    let mut body = bytes::Bytes::from(body);
    let api_key = i16::from_be_bytes([body[0], body[1]]);
    let version = i16::from_be_bytes([body[2], body[3]]);
    let header_version = ApiKey::try_from(api_key).ok()?.request_header_version(version);
    Some((RequestHeader::decode(&mut body, header_version).ok()?, api_key))
}

/// Answers ApiVersions requests (every API at the versions this test's
/// clients use) until another request comes, then closes the connection;
/// returns whether it closed one that way.
fn handshake_then_close(mut stream: std::net::TcpStream) -> bool {
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    loop {
        let Some((header, api_key)) = read_request(&mut stream) else {
            return false;
        };
        if api_key != ApiKey::ApiVersions as i16 {
            return true;
        }
        let version = header.request_api_version.min(3);
        let keys = [
            ApiKey::ApiVersions,
            ApiKey::Metadata,
            ApiKey::FindCoordinator,
            ApiKey::EndTxn,
            ApiKey::DescribeConfigs,
        ]
        .into_iter()
        .map(|key| {
            let range = key.valid_versions();
            ApiVersion::default()
                .with_api_key(key as i16)
                .with_min_version(range.min)
                .with_max_version(range.max)
        })
        .collect();
        let response = ApiVersionsResponse::default().with_api_keys(keys);
        let mut frame = bytes::BytesMut::new();
        frame.extend_from_slice(&[0; 4]);
        ResponseHeader::default()
            .with_correlation_id(header.correlation_id)
            .encode(&mut frame, ApiVersionsResponse::header_version(version))
            .unwrap();
        response.encode(&mut frame, version).unwrap();
        let length = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&length.to_be_bytes());
        if std::io::Write::write_all(&mut stream, &frame).is_err() {
            return false;
        }
    }
}

/// Edge 3. A crash after the checkpoint was persisted leaves pre-committed
/// transactions for recovery to commit with EndTxn. Recovery pauses before
/// its first EndTxn (`EXACTLY_DELAY_AT`) while the broker goes down: its
/// port first answers handshakes and closes the connection on every request,
/// then refuses connections, then the broker comes back. Recovery must
/// retry through all of it and commit, never take a closed connection for
/// the broker refusing the commit.
#[test]
fn closed_and_refused_connections_during_recovery_are_retried() {
    let mut kafka = KafkaBroker::start().expect("a broker of this test's own");
    let input = unique("restart-in");
    create_topic(kafka.bootstrap(), &input);
    const RECORDS: usize = 4_000;
    let feed = Feed::start(kafka.bootstrap(), &input, 0..RECORDS);
    let dir = tempfile::tempdir().unwrap();
    let copy = copy_pipeline(
        dir.path(),
        kafka.bootstrap(),
        &input,
        "interval = \"100ms\"",
        "strategy = \"none\"",
        "",
    );
    run_killed_at(&copy.config, "coordinator.after_persist:3");
    feed.finish();
    copy.bounded();
    assert!(
        !copy.listed_committables().is_empty(),
        "the crash left transactions to commit: {:?}",
        copy.latest_entries()
    );

    let recovery = spawn_with_env(&copy.config, &[("EXACTLY_DELAY_AT", "kafka_sink.before_end_txn=6s")]);
    // The recovery connects, checks the broker, and pauses before EndTxn.
    std::thread::sleep(Duration::from_millis(2_500));
    kafka.stop().expect("stopping the broker");
    let closer = Closer::bind(kafka.port());
    std::thread::sleep(Duration::from_secs(8));
    let closed = closer.release();
    std::thread::sleep(Duration::from_secs(1));
    kafka.restart().expect("restarting the broker");
    let (status, _, log) = wait(recovery, Duration::from_secs(180));
    assert!(status.success(), "recovery did not ride out the broker restart:\n{log}");
    assert!(log.contains("delay point reached"), "recovery never paused:\n{log}");
    assert!(
        closed >= 3,
        "the pipeline was supposed to meet connections closed on its requests (closed {closed}):\n{log}"
    );
    assert!(log.contains("transaction committed with EndTxn"), "{log}");
    copy.assert_exactly_once(RECORDS, "broker restart during recovery");
}

/// The start-up guardrail: a checkpoint timeout plus interval above half of
/// the sink's transaction timeout is refused before anything runs, naming
/// both keys and values that would fit.
#[test]
fn a_checkpoint_timeout_too_close_to_the_transaction_timeout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens here: the check comes before any connection.
    let copy_file = dir.path().join("pipeline.toml");
    std::fs::write(
        &copy_file,
        r#"name = "guardrail"
[checkpoint]
dir = "checkpoints"
interval = "1s"
timeout = "60s"
[source.kafka]
bootstrap = "127.0.0.1:1"
topic = "in"
[sink.kafka]
bootstrap = "127.0.0.1:1"
topic = "out"
transaction_timeout = "60s"
"#,
    )
    .unwrap();
    let (status, log) = run(&copy_file, None, &[]);
    assert!(!status.success(), "{log}");
    for part in [
        "[checkpoint] timeout (1m)",
        "transaction_timeout (1m)",
        "at most 29s",
        "at least 2m 2s",
    ] {
        assert!(log.contains(part), "`{part}` missing from:\n{log}");
    }
    assert!(
        !dir.path().join("checkpoints").exists(),
        "nothing ran before the settings were refused"
    );
}
