//! The Kafka sink driven directly, subtask by subtask, the way the runtime
//! drives it: against librdkafka's mock cluster (which checks producer id and
//! epoch on EndTxn and can inject error answers) and against Apache Kafka
//! (the broker exactly-testkit shares among the tests of this binary, or the
//! one of `EXACTLY_KAFKA_BOOTSTRAP`), which commits and aborts for real. A
//! "crash" is dropping a sink: nothing is committed or aborted on drop.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use exactly_core::{CheckpointId, ConnectorError, ErasedSink, Metrics, Record, SinkContext, SinkFactory};
use exactly_kafka::wire::{CommittedRead, WireClient};
use exactly_kafka::{KafkaCommittable, KafkaSinkConfig, KafkaSinkFactory, OnLostTransaction};
use exactly_testkit::KafkaBroker;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("exactly_kafka=debug,exactly_kafka_wire=info,librdkafka=warn")
        .try_init();
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn config(bootstrap: &str, topic: &str, edit: impl FnOnce(&mut KafkaSinkConfig)) -> KafkaSinkFactory {
    let mut config = KafkaSinkConfig::new(bootstrap, topic);
    config.transactional_id_prefix = Some(unique("sink-test"));
    config.pool_size = 3;
    edit(&mut config);
    KafkaSinkFactory::new("test", config).expect("valid settings")
}

fn subtask(factory: &KafkaSinkFactory) -> Box<dyn ErasedSink> {
    let context = SinkContext::new("test", 0, 1, Arc::new(Metrics::default()));
    factory.create(context).expect("create")
}

fn records(range: std::ops::Range<usize>) -> Vec<Record> {
    range
        .map(|i| Record::new("in-0", i as i64, format!("v-{i}")).with_key(format!("k-{i}")))
        .collect()
}

/// Writes `range` as the transaction of `checkpoint` and pre-commits it.
async fn pre_committed(
    sink: &mut Box<dyn ErasedSink>,
    checkpoint: u64,
    range: std::ops::Range<usize>,
) -> serde_json::Value {
    sink.write(CheckpointId(checkpoint), &records(range))
        .await
        .expect("write");
    sink.pre_commit()
        .await
        .expect("pre_commit")
        .expect("a transaction was open")
}

/// A subtask of `factory` that recovered from a first start.
async fn recovered(factory: &KafkaSinkFactory) -> Box<dyn ErasedSink> {
    let mut sink = subtask(factory);
    sink.recover(&[]).await.expect("recover");
    sink
}

/// A subtask that pre-committed `range` as checkpoint `checkpoint`, then
/// "crashed" (was dropped); returns the committable.
async fn crashed_after_pre_commit(
    factory: &KafkaSinkFactory,
    checkpoint: u64,
    range: std::ops::Range<usize>,
) -> serde_json::Value {
    let mut crashed = recovered(factory).await;
    pre_committed(&mut crashed, checkpoint, range).await
}

/// A new subtask of `factory` recovering with `pending`.
async fn recover(factory: &KafkaSinkFactory, pending: &[serde_json::Value]) -> Result<(), ConnectorError> {
    subtask(factory).recover(pending).await
}

fn committable(value: &serde_json::Value) -> KafkaCommittable {
    serde_json::from_value(value.clone()).unwrap()
}

fn data_loss(result: Result<(), ConnectorError>) -> (CheckpointId, String) {
    match result {
        Err(ConnectorError::DataLoss {
            checkpoint, message, ..
        }) => (checkpoint, message),
        other => panic!("expected data loss, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// librdkafka's mock cluster

struct Mock {
    cluster: MockCluster<'static, DefaultProducerContext>,
    topic: String,
}

fn mock() -> Mock {
    init_tracing();
    let cluster = MockCluster::new(1).expect("mock cluster");
    let topic = unique("out");
    cluster.create_topic(&topic, 2, 1).expect("mock topic");
    Mock { cluster, topic }
}

impl Mock {
    fn factory(&self, edit: impl FnOnce(&mut KafkaSinkConfig)) -> KafkaSinkFactory {
        config(&self.cluster.bootstrap_servers(), &self.topic, edit)
    }
}

/// The mock cluster checks producer id and epoch on EndTxn: a committable
/// with a stale epoch or a wrong transactional id is refused, which the sink
/// reports as data loss naming the id and the checkpoint — or, with
/// `on_lost_transaction = "warn"`, counts and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_txn_refusals_on_the_mock_cluster_are_data_loss() {
    let mock = mock();
    let factory = mock.factory(|_| {});
    let value = crashed_after_pre_commit(&factory, 7, 0..10).await;
    let c = committable(&value);
    assert_eq!(c.checkpoint, CheckpointId(7));
    assert_eq!(c.topic, mock.topic);
    assert_eq!(c.records, 10);
    assert!(c.producer_id > 0 && c.epoch >= 0, "{c:?}");
    assert!(factory.transactional_ids(0).contains(&c.transactional_id));

    let stale = KafkaCommittable {
        epoch: c.epoch + 1,
        ..c.clone()
    };
    let (checkpoint, message) = data_loss(recover(&factory, &[serde_json::to_value(&stale).unwrap()]).await);
    assert_eq!(checkpoint, CheckpointId(7));
    assert!(
        message.contains(&c.transactional_id)
            && message.contains("InvalidProducerEpoch")
            && message.contains("data of checkpoint 7"),
        "{message}"
    );

    let other_id = factory
        .transactional_ids(0)
        .into_iter()
        .find(|id| *id != c.transactional_id)
        .unwrap();
    let wrong = KafkaCommittable {
        transactional_id: other_id,
        ..c.clone()
    };
    let (_, message) = data_loss(recover(&factory, &[serde_json::to_value(&wrong).unwrap()]).await);
    assert!(message.contains("InvalidProducerIdMapping"), "{message}");

    let warn = mock.factory(|config| {
        config.transactional_id_prefix = Some(factory.transactional_id_prefix().to_string());
        config.on_lost_transaction = OnLostTransaction::Warn;
    });
    recover(&warn, &[serde_json::to_value(&stale).unwrap()])
        .await
        .expect("with warn, recovery goes on");
    assert_eq!(warn.metrics().lost_transactions, 1);

    // The recorded producer id and epoch are the right ones: EndTxn passes
    // the mock's check.
    recover(&factory, &[value]).await.expect("the real committable commits");
    assert_eq!(factory.metrics().committed_by_end_txn, 1);
}

/// CONCURRENT_TRANSACTIONS and a loading coordinator are retried with
/// backoff until EndTxn succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retriable_end_txn_answers_are_retried() {
    let mock = mock();
    let factory = mock.factory(|_| {});
    let value = crashed_after_pre_commit(&factory, 3, 0..5).await;
    mock.cluster.request_errors(
        RDKafkaApiKey::EndTxn,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS,
        ],
    );
    recover(&factory, &[value]).await.expect("committed after the retries");
    assert_eq!(factory.metrics().committed_by_end_txn, 1);
}

/// A subtask needs more producers than pending transactions: when every slot
/// holds a pre-committed transaction, `begin` fails and says what to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_fails_with_an_error_naming_pool_size() {
    let mock = mock();
    let factory = mock.factory(|_| {});
    let mut sink = recovered(&factory).await;
    let mut ids = BTreeSet::new();
    for checkpoint in 1..=3 {
        let c = committable(&pre_committed(&mut sink, checkpoint, 0..2).await);
        ids.insert(c.transactional_id);
    }
    assert_eq!(ids.len(), 3, "each pending transaction has its own transactional id");
    let e = sink.write(CheckpointId(4), &records(0..1)).await.unwrap_err();
    assert!(e.is_retriable());
    let text = e.to_string();
    assert!(
        text.contains("all 3 transactional producers are busy") && text.contains("`pool_size`"),
        "{text}"
    );
}

/// A committed transaction's id is not reused before the next checkpoint
/// completes; then it is, and the pool rotates over a fixed set of ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_rotate_over_a_fixed_set_of_ids() {
    let mock = mock();
    let factory = mock.factory(|config| {
        config.transaction_timeout = Duration::from_secs(1);
        config.timeout_warning_share = 0.01;
    });
    let mut sink = recovered(&factory).await;
    let mut used = Vec::new();
    let mut previous: Option<serde_json::Value> = None;
    for checkpoint in 1..=7 {
        // As the runtime does it: the next interval's first record arrives
        // before the previous checkpoint completes, its barrier after.
        sink.write(CheckpointId(checkpoint), &records(0..3))
            .await
            .expect("write");
        if let Some(p) = previous.take() {
            sink.commit(&p).await.expect("commit");
        }
        let value = sink.pre_commit().await.expect("pre_commit").expect("open");
        let c = committable(&value);
        assert!(
            used.last().is_none_or(|last: &String| *last != c.transactional_id),
            "the previous id is still held"
        );
        used.push(c.transactional_id);
        previous = Some(value);
    }
    let last = previous.unwrap();
    sink.commit(&last).await.expect("commit");
    sink.commit(&last).await.expect("a repeated commit is a no-op");
    let distinct: BTreeSet<&String> = used.iter().collect();
    assert_eq!(distinct.len(), 3, "{used:?}");
    assert!(distinct.iter().all(|id| factory.transactional_ids(0).contains(id)));
    let metrics = factory.metrics();
    assert_eq!(metrics.committed, 7);
    assert!(metrics.timeout_warnings >= 1, "pending past 1% of 1s must warn");
}

// ---------------------------------------------------------------------------
// Apache Kafka: real commits and aborts, checked with the log-level reader

/// How long a read waits for the markers of transactions that were just
/// ended: Kafka writes them after it answers the commit or abort.
const SETTLE: Duration = Duration::from_secs(30);

struct Broker {
    kafka: &'static KafkaBroker,
    topic: String,
}

async fn broker() -> Broker {
    init_tracing();
    let kafka = KafkaBroker::shared().expect("start the shared Kafka broker");
    let topic = unique("sink-out");
    exactly_kafka::admin::KafkaAdmin::new(kafka.bootstrap())
        .create_topic(&topic, 2)
        .await
        .expect("create topic");
    Broker { kafka, topic }
}

impl Broker {
    fn factory(&self, prefix: &str, edit: impl FnOnce(&mut KafkaSinkConfig)) -> KafkaSinkFactory {
        config(self.kafka.bootstrap(), &self.topic, |config| {
            config.transactional_id_prefix = Some(prefix.to_string());
            edit(config);
        })
    }

    /// The topic as it is now.
    async fn read(&self) -> CommittedRead {
        WireClient::new(self.kafka.bootstrap())
            .unwrap()
            .read_topic(&self.topic)
            .await
            .expect("read the topic")
    }

    /// The topic once the markers of ended transactions are written.
    async fn read_settled(&self) -> CommittedRead {
        WireClient::new(self.kafka.bootstrap())
            .unwrap()
            .read_topic_settled(&self.topic, SETTLE)
            .await
            .expect("read the topic")
    }
}

fn values(read: &CommittedRead) -> Vec<String> {
    let mut v: Vec<String> = read
        .records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect();
    v.sort();
    v
}

fn expected(numbers: impl IntoIterator<Item = usize>) -> Vec<String> {
    let mut v: Vec<String> = numbers.into_iter().map(|i| format!("v-{i}")).collect();
    v.sort();
    v
}

/// The recovery contract on a real broker: after a crash the listed
/// transaction is committed with EndTxn (had its id been initialized first,
/// it would have been aborted), the unlisted one is aborted, a second
/// recovery from the same list changes nothing, and the pool works on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_commits_what_the_checkpoint_lists_and_aborts_the_rest() {
    let broker = broker().await;
    let prefix = unique("recover");
    let factory = broker.factory(&prefix, |_| {});

    let mut crashed = recovered(&factory).await;
    let listed = pre_committed(&mut crashed, 1, 0..10).await;
    crashed.write(CheckpointId(2), &records(10..20)).await.expect("write");
    drop(crashed);
    let read = broker.read().await;
    assert!(read.records.is_empty(), "nothing is visible yet: {:?}", values(&read));
    assert!(!read.open_transactions.is_empty());

    recover(&factory, std::slice::from_ref(&listed)).await.expect("recover");
    let read = broker.read_settled().await;
    assert_eq!(values(&read), expected(0..10));
    assert_eq!(read.aborted_records, 10, "the unlisted transaction is aborted");
    assert!(read.open_transactions.is_empty(), "{:?}", read.open_transactions);
    for r in &read.records {
        let value = String::from_utf8(r.value.clone().unwrap()).unwrap();
        assert_eq!(r.key.as_deref(), Some(value.replacen("v-", "k-", 1).as_bytes()));
    }

    let mut again = subtask(&factory);
    again
        .recover(&[listed])
        .await
        .expect("a second recovery from the same checkpoint");
    assert_eq!(values(&broker.read_settled().await), expected(0..10), "no duplicates");

    let next = pre_committed(&mut again, 3, 20..30).await;
    again.commit(&next).await.expect("commit");
    again.commit(&next).await.expect("a repeated commit is a no-op");
    assert_eq!(values(&broker.read_settled().await), expected((0..10).chain(20..30)));
    let metrics = factory.metrics();
    assert_eq!((metrics.committed, metrics.committed_by_end_txn), (1, 2));
}

/// A pre-committed transaction whose id another producer initialized is
/// gone: Kafka refuses its EndTxn (PRODUCER_FENCED), which the sink reports
/// as data loss naming the id and the checkpoint — or counts with `warn`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_is_reported_as_lost() {
    let broker = broker().await;
    let prefix = unique("fenced");
    let factory = broker.factory(&prefix, |_| {});
    let value = crashed_after_pre_commit(&factory, 5, 0..4).await;
    // Recovery from an older checkpoint that does not list it: its id is
    // initialized, which aborts it.
    recover(&factory, &[]).await.expect("recover");

    let (checkpoint, message) = data_loss(recover(&factory, std::slice::from_ref(&value)).await);
    let c = committable(&value);
    assert_eq!(checkpoint, CheckpointId(5));
    assert!(
        message.contains(&c.transactional_id)
            && message.contains("ProducerFenced")
            && message.contains("data of checkpoint 5 (4 records"),
        "{message}"
    );

    let warn = broker.factory(&prefix, |config| config.on_lost_transaction = OnLostTransaction::Warn);
    recover(&warn, &[value]).await.expect("warn goes on");
    assert_eq!(warn.metrics().lost_transactions, 1);
    let read = broker.read_settled().await;
    assert!(read.records.is_empty(), "{:?}", values(&read));
    assert!(read.open_transactions.is_empty(), "{:?}", read.open_transactions);
    assert_eq!(read.aborted_records, 4, "the fenced transaction was aborted");
}

/// KIP-360 on Apache Kafka: records of an open transaction time out while
/// the broker is frozen, which makes the transaction abortable with an
/// epoch bump; aborting it bumps the producer's epoch. The sink follows:
/// when the pool comes back to that producer, its transaction is recorded
/// with the new epoch (read from the records), pre-commits without a
/// restart, and a recovery after a crash commits it with EndTxn. (Reading
/// the epoch once, as the sink did from librdkafka's statistics, failed
/// that pre-commit, or recorded the old epoch and lost the checkpoint at
/// recovery.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_bumped_by_an_abort_is_followed_and_recovery_commits_with_it() {
    init_tracing();
    let mut kafka = KafkaBroker::start().expect("a broker of this test's own, to freeze");
    let topic = unique("bumped-out");
    exactly_kafka::admin::KafkaAdmin::new(kafka.bootstrap())
        .create_topic(&topic, 2)
        .await
        .expect("create topic");
    let prefix = unique("bumped");
    let factory = config(kafka.bootstrap(), &topic, |config| {
        config.transactional_id_prefix = Some(prefix.clone());
        config.transaction_timeout = Duration::from_secs(60);
        // Records not acknowledged within 4 s fail: with the broker frozen,
        // the transaction becomes abortable and needs an epoch bump.
        for (key, value) in [
            ("message.timeout.ms", "4000"),
            ("request.timeout.ms", "2000"),
            ("socket.timeout.ms", "3000"),
        ] {
            config.properties.insert(key.into(), value.into());
        }
    });
    let mut sink = recovered(&factory).await;
    let mut committed = Vec::new();
    let mut first_epochs = std::collections::BTreeMap::new();
    for checkpoint in 1..=3 {
        let range = checkpoint * 100..checkpoint * 100 + 10;
        let value = pre_committed(&mut sink, checkpoint as u64, range.clone()).await;
        sink.commit(&value).await.expect("commit");
        let c = committable(&value);
        first_epochs.insert(c.transactional_id.clone(), (c.producer_id, c.epoch));
        committed.extend(range);
    }
    assert_eq!(first_epochs.len(), 3, "the pool rotates over its three ids");

    // Checkpoint 4: a first batch, then the broker freezes and records are
    // written until a write reports failed deliveries.
    sink.write(CheckpointId(4), &records(400..410)).await.expect("write");
    kafka.freeze().expect("freezing the broker");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let mut next = 410;
    let failure = loop {
        match sink.write(CheckpointId(4), &records(next..next + 1)).await {
            Err(error) => break error,
            Ok(()) => next += 1,
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no delivery failed within 90 s of the freeze"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(failure.is_retriable(), "{failure}");
    kafka.thaw().expect("thawing the broker");
    sink.abort()
        .await
        .expect("aborting the transaction bumps the producer's epoch");

    // The pool comes back to the aborted producer within a rotation.
    let mut bumped = None;
    for checkpoint in 5..=10u64 {
        let range = checkpoint as usize * 100..checkpoint as usize * 100 + 10;
        let value = pre_committed(&mut sink, checkpoint, range.clone()).await;
        let c = committable(&value);
        let (producer_id, first_epoch) = first_epochs[&c.transactional_id];
        assert_eq!(c.producer_id, producer_id, "{c:?}");
        if c.epoch != first_epoch {
            assert_eq!(c.epoch, first_epoch + 1, "one bump: {c:?}");
            committed.extend(range);
            bumped = Some(value);
            break;
        }
        sink.commit(&value).await.expect("commit");
        committed.extend(range);
    }
    let bumped = bumped.expect("the pool came back to the producer whose epoch was bumped");
    assert_eq!(factory.metrics().epoch_bumps, 1);

    // A crash before the commit: recovery commits it with EndTxn as the
    // bumped epoch.
    drop(sink);
    recover(&factory, std::slice::from_ref(&bumped))
        .await
        .expect("EndTxn with the bumped epoch commits the transaction");
    let read = WireClient::new(kafka.bootstrap())
        .unwrap()
        .read_topic_settled(&topic, SETTLE)
        .await
        .expect("read the topic");
    assert!(read.open_transactions.is_empty(), "{:?}", read.open_transactions);
    assert_eq!(
        values(&read),
        expected(committed),
        "every committed transaction once, the aborted one not at all"
    );
}
