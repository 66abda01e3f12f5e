//! What the integration tests of exactly-kafka-wire share: the broker,
//! fresh names, topics, and librdkafka producers to write records with.
#![allow(dead_code)] // each test binary uses its own part

pub(crate) mod message_set;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use exactly_testkit::KafkaBroker;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::ClientContext;

/// Limit for librdkafka's blocking calls (transactions, flushes).
pub(crate) const TXN_TIMEOUT: Duration = Duration::from_secs(30);

/// A topic, group or transactional id of this run alone: name, process,
/// time, count.
pub(crate) fn fresh(name: &str) -> String {
    static COUNT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{name}.{}.{nanos}.{count}", std::process::id())
}

/// Debug logs of this crate in the test output.
pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("exactly_kafka_wire=debug,librdkafka=warn")
        .try_init();
}

/// The shared broker, with debug logs of this crate in the test output.
pub(crate) fn kafka() -> &'static KafkaBroker {
    init_tracing();
    KafkaBroker::shared().expect("the shared Kafka broker")
}

pub(crate) fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("an rdkafka admin client")
}

/// Creates a topic of `partitions` partitions (a fresh name) on `bootstrap`.
pub(crate) async fn new_topic(bootstrap: &str, name: &str, partitions: i32) -> String {
    let topic = fresh(name);
    let created = admin(bootstrap)
        .create_topics(
            &[NewTopic::new(&topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("CreateTopics");
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    topic
}

/// Deletes the records of `topic`/`partition` below `offset`
/// (DeleteRecords), as retention would: the log then starts there.
pub(crate) async fn delete_records_below(bootstrap: &str, topic: &str, partition: i32, offset: i64) {
    let mut below = rdkafka::TopicPartitionList::new();
    below
        .add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
        .unwrap();
    admin(bootstrap)
        .delete_records(&below, &AdminOptions::new())
        .await
        .expect("DeleteRecords");
}

/// Remembers the `eos` object of librdkafka's latest statistics JSON, and
/// fails the test on a failed delivery.
#[derive(Default)]
pub(crate) struct StatsContext {
    pub eos: Mutex<Option<serde_json::Value>>,
}

impl ClientContext for StatsContext {
    fn stats_raw(&self, statistics: &[u8]) {
        let json: serde_json::Value = serde_json::from_slice(statistics).expect("statistics are JSON");
        *self.eos.lock().unwrap() = json.get("eos").cloned();
    }
}

impl ProducerContext for StatsContext {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result {
            panic!("delivery failed: {error}");
        }
    }
}

/// A librdkafka producer with `settings`.
pub(crate) fn producer(bootstrap: &str, settings: &[(&str, &str)]) -> BaseProducer<StatsContext> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("statistics.interval.ms", "100");
    for (key, value) in settings {
        config.set(*key, *value);
    }
    config
        .create_with_context(StatsContext::default())
        .expect("create producer")
}

/// Produces `values` round-robin over `partitions` partitions (key
/// `key-<value>`) and waits until they are delivered.
pub(crate) fn send(producer: &BaseProducer<StatsContext>, topic: &str, partitions: i32, values: &[String]) {
    for (i, value) in values.iter().enumerate() {
        let key = format!("key-{value}");
        let record = BaseRecord::to(topic)
            .key(&key)
            .payload(value)
            .partition(i as i32 % partitions);
        producer.send(record).map_err(|(e, _)| e).expect("enqueue record");
    }
    producer.flush(TXN_TIMEOUT).expect("flush");
}
