//! Kafka → PostgreSQL orders for the end-to-end tests of operations (one
//! instance, rescaling, crashes inside PostgreSQL I/O): a topic whose
//! partitions reach every sink subtask, a feed that produces while the
//! pipeline runs, pipeline files from `exactly::config::orders_sections`,
//! and checks of the table and the pipeline's prepared transactions.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use exactly::kafka::admin::{KafkaAdmin, ProduceRecord};

/// Partitions of an orders topic.
pub const ORDER_PARTITIONS: i32 = 6;

pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A topic, table or pipeline name no other test (or earlier run against
/// external services) uses: lower case, a valid SQL identifier.
pub fn fresh(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().subsec_nanos();
    format!("{prefix}_{}_{n}_{nanos}", std::process::id())
}

/// A fresh topic name whose [`ORDER_PARTITIONS`] partitions reach every
/// sink subtask at each of `parallelisms` in global failover too (records
/// go to sink `route(split)` there; in region failover sink `i` writes what
/// source subtask `i` reads, and `ORDER_PARTITIONS` is at least every
/// parallelism the tests use), so every subtask has transactions of its own.
pub fn topic_reaching_every_subtask(prefix: &str, parallelisms: &[usize]) -> String {
    for _ in 0..10_000 {
        let topic = fresh(prefix);
        let covers = |p: usize| {
            let reached: BTreeSet<usize> = (0..ORDER_PARTITIONS)
                .map(|partition| exactly::core::route(&exactly::kafka::split_name(&topic, partition), p))
                .collect();
            reached.len() == p
        };
        if parallelisms.iter().all(|p| covers(*p)) {
            return topic;
        }
    }
    panic!("no topic name routes to every subtask of {parallelisms:?}");
}

/// Order `id`: a JSON value with the id, keyed by it, in partition
/// `id % ORDER_PARTITIONS`.
pub fn order(id: i64) -> ProduceRecord {
    ProduceRecord::new(format!(
        r#"{{"id":{id},"customer":"c{}","amount":{}.{:02}}}"#,
        id % 97,
        id % 500,
        id % 100
    ))
    .with_key(format!("{id}"))
    .to_partition((id % ORDER_PARTITIONS as i64) as i32)
}

/// Orders of a [`Feed`] per chunk, and the pause after each.
pub const FEED_CHUNK: i64 = 50;
pub const FEED_PAUSE: Duration = Duration::from_millis(25);
/// The shortest pause after each order a held feed trickles
/// ([`Feed::start_held`]); the pause is longer for a small count, so that
/// the trickle lasts [`TRICKLE_LASTS`] at least.
pub const TRICKLE_PAUSE: Duration = Duration::from_millis(50);
/// How long a held feed's trickle lasts at least: far longer than any kill
/// sequence of the suite on a loaded machine.
pub const TRICKLE_LASTS: Duration = Duration::from_secs(180);

/// Orders `0..count` produced into a new topic from a background thread,
/// [`FEED_CHUNK`] at a time with [`FEED_PAUSE`] after each, by one
/// idempotent producer that waits for each chunk's deliveries: a pipeline
/// reading them as they come spans many checkpoints, however fast the
/// machine.
pub struct Feed {
    thread: std::thread::JoinHandle<()>,
    /// Held feeds trickle their second half until this is dropped.
    gate: Option<std::sync::mpsc::Sender<()>>,
}

impl Feed {
    pub fn start(bootstrap: &str, topic: &str, count: i64) -> Feed {
        Feed::start_with(bootstrap, topic, count, order)
    }

    /// [`Feed::start`] that produces the first half of the orders, then
    /// trickles the rest — one order at a time, for at least
    /// [`TRICKLE_LASTS`] — until
    /// [`Feed::finish`], and then produces what is left at full pace: the
    /// topic is still being fed for as long as the test needs, however slow
    /// the machine (a test asserting that something happened while the
    /// input was incomplete cannot lose the race to the feed's end), and
    /// every run of a pipeline keeps getting records (a kill point that
    /// needs an interval with data still comes: a sink opens no
    /// transaction for an empty interval).
    pub fn start_held(bootstrap: &str, topic: &str, count: i64) -> Feed {
        let (gate, held) = std::sync::mpsc::channel::<()>();
        let mut feed = Feed::start_gated(bootstrap, topic, count, order, Some((count / 2, held)));
        feed.gate = Some(gate);
        feed
    }

    /// [`Feed::start_held`] producing `make(i)` for `i` in `0..count`.
    pub fn start_held_with(bootstrap: &str, topic: &str, count: i64, make: fn(i64) -> ProduceRecord) -> Feed {
        let (gate, held) = std::sync::mpsc::channel::<()>();
        let mut feed = Feed::start_gated(bootstrap, topic, count, make, Some((count / 2, held)));
        feed.gate = Some(gate);
        feed
    }

    /// [`Feed::start`] producing `make(i)` for `i` in `0..count` (each
    /// names its partition; a `None` value is a tombstone).
    pub fn start_with(bootstrap: &str, topic: &str, count: i64, make: fn(i64) -> ProduceRecord) -> Feed {
        Feed::start_gated(bootstrap, topic, count, make, None)
    }

    fn start_gated(
        bootstrap: &str,
        topic: &str,
        count: i64,
        make: fn(i64) -> ProduceRecord,
        hold: Option<(i64, std::sync::mpsc::Receiver<()>)>,
    ) -> Feed {
        use rdkafka::producer::{FutureProducer, FutureRecord};
        current_thread_runtime().block_on(async {
            KafkaAdmin::new(bootstrap)
                .create_topic(topic, ORDER_PARTITIONS)
                .await
                .expect("creating the topic")
        });
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            // Rides out the outages of the broker tests.
            .set("message.timeout.ms", "120000")
            .create()
            .expect("creating the feed's producer");
        let topic = topic.to_string();
        let thread = std::thread::spawn(move || {
            current_thread_runtime().block_on(async {
                let trickled = hold.as_ref().map_or(1, |(at, _)| (count - at).max(1));
                let trickle_pause = (TRICKLE_LASTS / trickled as u32).max(TRICKLE_PAUSE);
                let mut hold = hold;
                let mut start = 0;
                while start < count {
                    // Past the first half and the gate still up: one order
                    // at a time (the gate drops in Feed::finish).
                    let trickling = match &hold {
                        Some((at, held)) if start >= *at => match held.try_recv() {
                            Err(std::sync::mpsc::TryRecvError::Empty) => true,
                            _ => {
                                hold = None;
                                false
                            }
                        },
                        _ => false,
                    };
                    let mut end = (start + if trickling { 1 } else { FEED_CHUNK }).min(count);
                    if let Some((at, _)) = &hold {
                        if start < *at {
                            end = end.min(*at);
                        }
                    }
                    let chunk: Vec<ProduceRecord> = (start..end).map(make).collect();
                    start = end;
                    let mut deliveries = Vec::with_capacity(chunk.len());
                    for record in &chunk {
                        let mut message = FutureRecord::<[u8], [u8]>::to(&topic)
                            .key(record.key.as_deref().expect("fed records have keys"))
                            .partition(record.partition.expect("fed records name their partition"));
                        if let Some(value) = record.value.as_deref() {
                            message = message.payload(value);
                        }
                        if !record.headers.is_empty() {
                            let headers = record.headers.iter().fold(
                                rdkafka::message::OwnedHeaders::new(),
                                |headers, (key, value)| {
                                    headers.insert(rdkafka::message::Header {
                                        key,
                                        value: value.as_deref(),
                                    })
                                },
                            );
                            message = message.headers(headers);
                        }
                        let queued = producer.send_result(message).map_err(|(e, _)| e);
                        deliveries.push(queued.expect("queueing an order of the feed"));
                    }
                    for delivery in deliveries {
                        let delivered = delivery.await.expect("the feed's producer is alive");
                        delivered.map_err(|(e, _)| e).expect("delivering an order of the feed");
                    }
                    tokio::time::sleep(if trickling { trickle_pause } else { FEED_PAUSE }).await;
                }
            })
        });
        Feed { thread, gate: None }
    }

    /// Whether orders are still being produced.
    pub fn is_running(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Waits until every order is produced.
    pub fn finish(mut self) {
        drop(self.gate.take());
        if let Err(panic) = self.thread.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Writes `<dir>/<file>` running pipeline `name` at `parallelism` from
/// `topic` into `table`: checkpoints every `interval` into `checkpoints`
/// (relative to `dir`), fixed restarts, and the sections of
/// `exactly::config::orders_sections`, reading the topic as it grows
/// (`bounded = false`) or up to the end it had at start.
#[allow(clippy::too_many_arguments)]
pub fn orders_pipeline(
    dir: &Path,
    file: &str,
    name: &str,
    parallelism: usize,
    checkpoints: &str,
    interval: &str,
    (bootstrap, topic): (&str, &str),
    (url, table): (&str, &str),
    bounded: bool,
) -> PathBuf {
    let sections = exactly::config::orders_sections(bootstrap, topic, url, table);
    assert!(sections.contains("stop_at_end = true"), "{sections}");
    let sections = if bounded {
        sections
    } else {
        sections.replace("stop_at_end = true", "stop_at_end = false")
    };
    let path = dir.join(file);
    std::fs::write(
        &path,
        format!(
            "name = \"{name}\"\nguarantee = \"exactly-once\"\nparallelism = {parallelism}\nbatch_size = 10\n\n\
             [checkpoint]\ndir = \"{checkpoints}\"\ninterval = \"{interval}\"\n\n\
             [restart]\nstrategy = \"fixed\"\ndelay = \"200ms\"\nmax_attempts = 100\n\n{sections}"
        ),
    )
    .unwrap();
    path
}

/// Runs `f` with a fresh client of `url`.
pub fn with_postgres<T>(url: &str, f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    current_thread_runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connecting to PostgreSQL");
        tokio::spawn(connection);
        f(&client).await
    })
}

/// Rows committed in `table` so far (0 while the sink has not created it).
pub fn committed_orders(url: &str, table: &str) -> i64 {
    with_postgres(url, async |db| {
        match db.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await {
            Ok(row) => row.get(0),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => 0,
            Err(e) => panic!("counting the rows of {table}: {e}"),
        }
    })
}

/// The gids of pipeline `pipeline`'s prepared transactions (every table
/// and subtask), oldest first.
pub fn prepared_of_pipeline(url: &str, pipeline: &str) -> Vec<String> {
    let prefix = format!("exactly:{pipeline}:");
    with_postgres(url, async |db| {
        db.query(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, $1) ORDER BY prepared",
            &[&prefix],
        )
        .await
        .expect("listing prepared transactions")
        .iter()
        .map(|r| r.get(0))
        .collect()
    })
}

/// The sink subtask in a gid `exactly:<pipeline>:<table>:<subtask>:<checkpoint>`.
pub fn subtask_of_gid(gid: &str) -> usize {
    let mut parts = gid.rsplitn(3, ':');
    let _checkpoint = parts.next();
    parts
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a gid of the sink: {gid}"))
}

/// Asserts that `table` holds orders `0..produced` exactly once (by id and
/// by Kafka position) and that pipeline `pipeline` left no prepared
/// transaction behind.
pub fn assert_orders_exactly_once(url: &str, table: &str, pipeline: &str, produced: i64, what: &str) {
    let (rows, positions, ids) = with_postgres(url, async |db| {
        let row = db
            .query_one(
                &format!("SELECT count(*), count(DISTINCT (part, off)) FROM {table}"),
                &[],
            )
            .await
            .unwrap();
        let ids: BTreeSet<i64> = db
            .query(&format!("SELECT id FROM {table}"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        (row.get::<_, i64>(0), row.get::<_, i64>(1), ids)
    });
    let expected: BTreeSet<i64> = (0..produced).collect();
    let missing = expected.difference(&ids).count();
    assert_eq!(
        (rows, positions, missing),
        (produced, produced, 0),
        "{what}: rows / distinct (partition, offset) / missing ids"
    );
    assert_eq!(ids, expected, "{what}: the set of ids");
    assert_eq!(
        prepared_of_pipeline(url, pipeline),
        Vec::<String>::new(),
        "{what}: prepared transactions left behind"
    );
}

/// Waits (at most `timeout`) until `table` holds at least `rows` committed
/// rows and returns their count; `None` if `run` ended first.
pub fn wait_for_orders(
    url: &str,
    table: &str,
    run: &mut super::Background,
    rows: i64,
    timeout: Duration,
) -> Option<i64> {
    let deadline = Instant::now() + timeout;
    loop {
        if !run.is_running() {
            return None;
        }
        let committed = committed_orders(url, table);
        if committed >= rows {
            return Some(committed);
        }
        assert!(
            Instant::now() < deadline,
            "{table}: {committed} rows committed after {timeout:?}, waiting for {rows}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The newest checkpoint entry of every checkpoint sequence (region) of
/// pipeline `name` in `checkpoints`, as one text; `None` before the first.
pub fn newest_entries_text(checkpoints: &Path, name: &str) -> Option<String> {
    let mut text = String::new();
    for sequence in super::checkpoint_sequences(&checkpoints.join(name)) {
        let Ok(entries) = std::fs::read_dir(&sequence) else {
            continue;
        };
        let newest = entries
            .flatten()
            .filter_map(|e| exactly::core::store::EntryName::parse(&e.file_name().to_string_lossy()))
            .max_by_key(|n| (n.id, n.created_unix_ms));
        if let Some(newest) = newest {
            text.push_str(&std::fs::read_to_string(sequence.join(newest.file_name)).unwrap());
            text.push('\n');
        }
    }
    (!text.is_empty()).then_some(text)
}
