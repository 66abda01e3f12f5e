//! exactly-kafka-wire against Apache Kafka: the broker exactly-testkit
//! shares among the tests of this binary (or the Kafka named by
//! `EXACTLY_KAFKA_BOOTSTRAP`), and brokers of their own for the tests that
//! need a fresh cluster or a setting of their own. Records are produced with
//! librdkafka (rdkafka); the crash cases run the transactional producer in a
//! child process killed with SIGKILL.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{fresh, init_tracing, kafka, new_topic, producer, send, StatsContext, TXN_TIMEOUT};
use exactly_kafka_wire::kafka_protocol::messages::{ApiKey, MetadataRequest};
use exactly_kafka_wire::kafka_protocol::protocol::VersionRange;
use exactly_kafka_wire::kafka_protocol::ResponseError;
use exactly_kafka_wire::{
    describe_broker_config, end_txn, find_transaction_coordinator, read_committed, CommittedRead, CommittedRecord,
    EndTxnOutcome, KafkaConnection, WireClient, WireConfig, WireError,
};
use exactly_testkit::KafkaBroker;
use rdkafka::producer::{BaseProducer, Producer};

/// Environment variable that turns [`child_transactional_producer`] on.
const CHILD_ENV: &str = "EXACTLY_WIRE_CHILD";
/// How long a read waits for the markers of transactions that were just
/// ended: Kafka answers EndTxn before it writes them.
const SETTLE: Duration = Duration::from_secs(30);

/// The shared broker with a fresh topic.
struct Fixture {
    broker: &'static KafkaBroker,
    topic: String,
}

impl Fixture {
    async fn new(name: &str, partitions: i32) -> Fixture {
        let broker = kafka();
        let topic = new_topic(broker.bootstrap(), name, partitions).await;
        Fixture { broker, topic }
    }

    fn bootstrap(&self) -> &str {
        self.broker.bootstrap()
    }

    fn producer(&self, settings: &[(&str, &str)]) -> BaseProducer<StatsContext> {
        producer(self.bootstrap(), settings)
    }
}

fn values(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

fn set(values: &[&[String]]) -> BTreeSet<String> {
    values.iter().flat_map(|v| v.iter().cloned()).collect()
}

fn value_set(records: &[CommittedRecord]) -> BTreeSet<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect()
}

/// The producer id and epoch librdkafka reports in the `eos` object of its
/// statistics once InitProducerId has assigned them.
fn producer_identity(producer: &BaseProducer<StatsContext>) -> (i64, i16, serde_json::Value) {
    let deadline = Instant::now() + TXN_TIMEOUT;
    loop {
        producer.poll(Duration::from_millis(100));
        let eos = producer.context().eos.lock().unwrap().clone();
        if let Some(eos) = eos.filter(|eos| eos["idemp_state"] == "Assigned" && eos["producer_id"].as_i64() >= Some(0))
        {
            let id = eos["producer_id"].as_i64().unwrap();
            let epoch = eos["producer_epoch"].as_i64().unwrap() as i16;
            return (id, epoch, eos);
        }
        assert!(
            Instant::now() < deadline,
            "librdkafka reported no producer id in its statistics"
        );
    }
}

#[tokio::test]
async fn connection_negotiates_versions() {
    let broker = kafka();
    let mut connection = KafkaConnection::connect(broker.bootstrap()).await.unwrap();
    let apis: Vec<String> = connection
        .advertised_apis()
        .filter_map(|(key, range)| Some(format!("{:?} {range}", ApiKey::try_from(key).ok()?)))
        .collect();
    println!("broker advertises: {}", apis.join(", "));
    for api in [ApiKey::Metadata, ApiKey::FindCoordinator, ApiKey::Fetch, ApiKey::EndTxn] {
        assert!(connection.broker_versions(api).is_some(), "{api:?} not advertised");
    }

    // Flexible (v9+) and non-flexible versions both round-trip.
    let client = VersionRange { min: 1, max: 13 };
    let (version, metadata) = connection
        .negotiated_request(client, &MetadataRequest::default())
        .await
        .unwrap();
    assert!(version >= 9, "Metadata v{version}");
    assert!(!metadata.brokers.is_empty());
    let old = connection.request(1, &MetadataRequest::default()).await.unwrap();
    assert_eq!(old.brokers.len(), metadata.brokers.len());

    let none = VersionRange { min: 100, max: 101 };
    let err = connection.version(ApiKey::Fetch, none).unwrap_err();
    assert!(matches!(err, WireError::ApiNotSupported { .. }), "{err}");
}

#[tokio::test]
async fn unreachable_and_tls_configs_are_clear_errors() {
    let port = exactly_testkit::free_port().unwrap();
    let err = read_committed(&format!("127.0.0.1:{port}"), "t").await.unwrap_err();
    assert!(matches!(err, WireError::NoBrokerReachable { .. }), "{err}");
    assert!(err.is_retriable());

    // A scheme that is no security protocol, and a TLS setting the client
    // cannot honour, are refused before anything is sent.
    let err = end_txn("HTTPS://broker:9093", "t", 1, 0, true).await.unwrap_err();
    assert!(matches!(err, WireError::InvalidConfig { .. }), "{err}");
    assert!(!err.is_retriable(), "{err}");
    let err = exactly_kafka_wire::WireConfig::from_properties(
        "SSL://broker:9093",
        [("security.protocol", "SSL"), ("ssl.key.password", "secret-of-the-key")],
    )
    .unwrap_err();
    assert!(matches!(err, WireError::Unsupported { .. }), "{err}");
    assert!(!err.to_string().contains("secret-of-the-key"), "{err}");
}

#[tokio::test]
async fn read_committed_returns_plain_and_committed_records_only() {
    let fixture = Fixture::new("wire-read", 2).await;
    let topic = &fixture.topic;

    let plain = values("plain", 6);
    let committed = values("committed", 6);
    let aborted = values("aborted", 6);

    let producer = fixture.producer(&[("enable.idempotence", "false")]);
    send(&producer, topic, 2, &plain);

    let committer = fixture.producer(&[("transactional.id", &fresh("committer"))]);
    committer.init_transactions(TXN_TIMEOUT).unwrap();
    committer.begin_transaction().unwrap();
    send(&committer, topic, 2, &committed);
    committer.commit_transaction(TXN_TIMEOUT).unwrap();

    let aborter = fixture.producer(&[("transactional.id", &fresh("aborter"))]);
    aborter.init_transactions(TXN_TIMEOUT).unwrap();
    aborter.begin_transaction().unwrap();
    send(&aborter, topic, 2, &aborted);
    aborter.abort_transaction(TXN_TIMEOUT).unwrap();

    let (committer_id, _, _) = producer_identity(&committer);
    let read = WireClient::new(fixture.bootstrap())
        .unwrap()
        .read_topic(topic)
        .await
        .unwrap();
    assert_eq!(value_set(&read.records), set(&[&plain, &committed]));
    assert_eq!(read.records.len(), plain.len() + committed.len(), "no duplicates");
    assert_eq!(read.aborted_records, aborted.len());
    assert!(read.open_transactions.is_empty(), "{:?}", read.open_transactions);
    for record in &read.records {
        let value = String::from_utf8(record.value.clone().unwrap()).unwrap();
        assert_eq!(record.topic, *topic);
        assert_eq!(record.key.as_deref(), Some(format!("key-{value}").as_bytes()));
        if value.starts_with("plain") {
            assert_eq!(record.producer_id, -1, "{value}");
        } else {
            assert_eq!(record.producer_id, committer_id, "{value}");
        }
    }
    assert_eq!(
        read.records.iter().map(|r| r.partition).collect::<BTreeSet<_>>(),
        BTreeSet::from([0, 1])
    );
    let mut sorted = read.records.clone();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    assert_eq!(sorted, read.records, "ordered by partition, then offset");

    // The free function agrees.
    assert_eq!(read_committed(fixture.bootstrap(), topic).await.unwrap(), read.records);
}

/// A fresh cluster creates its transaction log on the first transactional
/// request and answers COORDINATOR_NOT_AVAILABLE until it is there: the
/// client asks again until the coordinator answers.
#[tokio::test]
async fn finds_the_transaction_coordinator_of_a_fresh_cluster() {
    init_tracing();
    let broker = KafkaBroker::start().expect("start a fresh Kafka broker");
    let mut impatient = WireConfig::new(broker.bootstrap()).unwrap();
    impatient.coordinator_wait = Duration::ZERO;
    let first = WireClient::with_config(impatient)
        .find_transaction_coordinator(&fresh("txn"))
        .await;
    assert!(
        matches!(
            first.as_ref().map_err(WireError::broker_error),
            Err(Some(
                ResponseError::CoordinatorNotAvailable | ResponseError::CoordinatorLoadInProgress
            ))
        ),
        "a fresh cluster has no transaction coordinator yet, so a client that does not wait must fail: {first:?}"
    );
    let coordinator = find_transaction_coordinator(broker.bootstrap(), &fresh("txn"))
        .await
        .expect("the coordinator, once the transaction log is there");
    assert_eq!(coordinator, broker.bootstrap());
}

/// On a fresh cluster, EndTxn waits for the coordinator too, and gets the
/// broker's real verdict instead of a retriable "not available".
#[tokio::test]
async fn end_txn_on_a_fresh_cluster_gets_the_coordinators_verdict() {
    init_tracing();
    let broker = KafkaBroker::start().expect("start a fresh Kafka broker");
    let outcome = end_txn(broker.bootstrap(), &fresh("never-initialised"), 4242, 0, true)
        .await
        .expect("EndTxn");
    assert_eq!(outcome, EndTxnOutcome::InvalidProducerIdMapping);
}

#[tokio::test]
async fn end_txn_of_an_unknown_transactional_id_is_refused() {
    let broker = kafka();
    let outcome = end_txn(broker.bootstrap(), &fresh("never-initialised"), 4242, 0, true)
        .await
        .expect("EndTxn");
    assert_eq!(outcome, EndTxnOutcome::InvalidProducerIdMapping);
}

/// A librdkafka transactional producer in a child process of this test
/// binary: it begins a transaction, produces, flushes, prints its producer
/// id and epoch from librdkafka's statistics, and waits to be killed.
struct CrashedProducer {
    child: Child,
    transactional_id: String,
    producer_id: i64,
    producer_epoch: i16,
}

impl CrashedProducer {
    /// Starts the child and waits for its producer id and epoch.
    fn start(bootstrap: &str, topic: &str, values: &[String]) -> CrashedProducer {
        let transactional_id = fresh("crashing");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_transactional_producer",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                format!("{bootstrap}\n{topic}\n{transactional_id}\n{}", values.join(",")),
            )
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the child producer");
        let stdout = child.stdout.take().unwrap();
        // Owned right away, so that a failure below kills the child too.
        let mut crashed = CrashedProducer {
            child,
            transactional_id,
            producer_id: -1,
            producer_epoch: -1,
        };
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let deadline = Instant::now() + TXN_TIMEOUT;
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            let line = received.recv_timeout(wait).expect("the child printed no producer id");
            println!("child: {line}");
            if let Some(rest) = line.strip_prefix("PRODUCER ") {
                let mut parts = rest.split_whitespace();
                crashed.producer_id = parts.next().unwrap().parse().unwrap();
                crashed.producer_epoch = parts.next().unwrap().parse().unwrap();
                return crashed;
            }
        }
    }

    /// SIGKILL, like a crash: no commit, no abort, no goodbye.
    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the child");
        self.child.wait().unwrap();
    }
}

impl Drop for CrashedProducer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Not a test: the body of [`CrashedProducer`]'s child process.
#[test]
#[ignore = "helper: run as a child process by the crash tests"]
fn child_transactional_producer() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let [bootstrap, topic, transactional_id, values]: [&str; 4] =
        spec.lines().collect::<Vec<_>>().try_into().expect("four lines");
    let values: Vec<String> = values.split(',').map(str::to_string).collect();
    let producer = producer(bootstrap, &[("transactional.id", transactional_id)]);
    producer.init_transactions(TXN_TIMEOUT).unwrap();
    producer.begin_transaction().unwrap();
    send(&producer, topic, 1, &values);
    let (id, epoch, eos) = producer_identity(&producer);
    println!("EOS {eos}");
    println!("PRODUCER {id} {epoch}");
    std::thread::sleep(Duration::from_secs(600));
    unreachable!("the parent kills this process");
}

impl Fixture {
    /// A transaction of `values` left open by a producer killed with SIGKILL.
    fn crashed_transaction(&self, values: &[String]) -> CrashedProducer {
        let mut crashed = CrashedProducer::start(self.bootstrap(), &self.topic, values);
        crashed.kill();
        crashed
    }

    /// EndTxn for `crashed`'s transaction with the id and epoch it reported.
    async fn end_txn(&self, crashed: &CrashedProducer, commit: bool) -> Result<EndTxnOutcome, WireError> {
        let (id, epoch) = (crashed.producer_id, crashed.producer_epoch);
        end_txn(self.bootstrap(), &crashed.transactional_id, id, epoch, commit).await
    }

    async fn read(&self) -> CommittedRead {
        WireClient::new(self.bootstrap())
            .unwrap()
            .read_topic(&self.topic)
            .await
            .unwrap()
    }

    /// The topic once the markers of ended transactions are written.
    async fn read_settled(&self) -> CommittedRead {
        WireClient::new(self.bootstrap())
            .unwrap()
            .read_topic_settled(&self.topic, SETTLE)
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn end_txn_commits_the_transaction_of_a_killed_producer() {
    let fixture = Fixture::new("wire-crash", 1).await;
    let before = values("before", 3);
    let pending = values("pending", 5);
    send(&fixture.producer(&[]), &fixture.topic, 1, &before);
    let crashed = fixture.crashed_transaction(&pending);

    let read = fixture.read().await;
    assert_eq!(
        value_set(&read.records),
        set(&[&before]),
        "the open transaction is invisible"
    );
    assert_eq!(read.open_transactions.len(), 1, "{:?}", read.open_transactions);
    let open = &read.open_transactions[0];
    assert_eq!((open.producer_id, open.records), (crashed.producer_id, pending.len()));
    assert_eq!(open.producer_epoch, crashed.producer_epoch);

    assert_eq!(fixture.end_txn(&crashed, true).await.unwrap(), EndTxnOutcome::Ok);
    // Kafka answers EndTxn once the decision is in its transaction log and
    // writes the COMMIT marker afterwards.
    let read = fixture.read_settled().await;
    assert_eq!(value_set(&read.records), set(&[&before, &pending]));
    assert!(read.open_transactions.is_empty(), "{:?}", read.open_transactions);
    let committed = read.records.iter().filter(|r| r.producer_id == crashed.producer_id);
    assert_eq!(committed.count(), pending.len());
    let [ended] = &read.ended_transactions[..] else {
        panic!("{:?}", read.ended_transactions)
    };
    assert!(ended.committed);
    assert_eq!(
        (ended.producer_id, ended.marker_epoch),
        (crashed.producer_id, crashed.producer_epoch)
    );
    assert_eq!(ended.records, pending.len());

    // A retried commit (after a lost answer) succeeds again and changes
    // nothing. The marker in the log does not mean the coordinator has
    // finished the commit: until it has, it answers CONCURRENT_TRANSACTIONS
    // (retriable), as the contract of `end_txn` says.
    let deadline = Instant::now() + SETTLE;
    let outcome = loop {
        match fixture.end_txn(&crashed, true).await.unwrap() {
            EndTxnOutcome::Retriable(ResponseError::ConcurrentTransactions) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            outcome => break outcome,
        }
    };
    assert_eq!(outcome, EndTxnOutcome::Ok);
    let again = fixture.read().await;
    assert_eq!(again.records, read.records);
    assert_eq!(again.ended_transactions, read.ended_transactions, "no second marker");
}

#[tokio::test]
async fn end_txn_with_a_fenced_epoch_is_producer_fenced() {
    let fixture = Fixture::new("wire-fenced", 1).await;
    let crashed = fixture.crashed_transaction(&values("pending", 4));

    // A new producer with the same transactional id: InitProducerId bumps
    // the epoch and aborts the open transaction.
    let successor = fixture.producer(&[("transactional.id", &crashed.transactional_id)]);
    successor.init_transactions(TXN_TIMEOUT).unwrap();
    let (successor_id, successor_epoch, _) = producer_identity(&successor);
    println!(
        "crashed producer {}/{}, successor {successor_id}/{successor_epoch}",
        crashed.producer_id, crashed.producer_epoch
    );

    let outcome = fixture.end_txn(&crashed, true).await.expect("EndTxn");
    assert_eq!(outcome, EndTxnOutcome::ProducerFenced(ResponseError::ProducerFenced));
    let read = fixture.read_settled().await;
    assert!(
        read.records.is_empty(),
        "the fenced transaction stays invisible: {:?}",
        read.records
    );
}

#[tokio::test]
async fn end_txn_aborts_the_transaction_of_a_killed_producer() {
    let fixture = Fixture::new("wire-abort", 1).await;
    let pending = values("pending", 3);
    let crashed = fixture.crashed_transaction(&pending);

    assert_eq!(fixture.end_txn(&crashed, false).await.unwrap(), EndTxnOutcome::Ok);
    let read = fixture.read_settled().await;
    assert!(read.records.is_empty(), "{:?}", read.records);
    assert!(read.open_transactions.is_empty(), "{:?}", read.open_transactions);
    assert_eq!(read.aborted_records, pending.len());
}

#[tokio::test]
async fn describe_broker_config_reads_the_key_asked_for() {
    init_tracing();
    let broker = KafkaBroker::builder()
        .setting("transaction.max.timeout.ms", 123_456)
        .start()
        .expect("start a Kafka broker with its own transaction.max.timeout.ms");
    let value = describe_broker_config(broker.bootstrap(), "transaction.max.timeout.ms")
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some("123456"));
    let unknown = describe_broker_config(broker.bootstrap(), "no.such.setting")
        .await
        .unwrap();
    assert_eq!(unknown, None);
}

/// The shared broker (the external one too) reports its limit.
#[tokio::test]
async fn describes_the_transaction_timeout_limit() {
    let broker = kafka();
    let value = describe_broker_config(broker.bootstrap(), "transaction.max.timeout.ms")
        .await
        .unwrap()
        .expect("the broker reports transaction.max.timeout.ms");
    let millis: u64 = value.parse().expect("a number of milliseconds");
    assert!(millis > 0);
}
