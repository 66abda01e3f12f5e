//! The baselines, each run in a re-executed child of this bench (so its
//! peak RSS and CPU are its own): the raw binary COPY (the sink's ceiling),
//! the raw librdkafka consume, the raw fetch and the minimal fetch → COPY
//! loop (the source's and the machine's ceilings, `fetched.rs`; the targets
//! compare exactly with the loop) and the hand-written exactly-once loop
//! (`hand_loop.rs`).
//!
//! Each prints `records=N` (and `copies=N` when it writes) on stdout.

use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use exactly_postgres::copy::BinaryCopy;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_postgres::types::ToSql;

use crate::child::{log_dir, Running};
use crate::fetched::{self, Row};
use crate::input::end_offsets;
use crate::runs::{env_u64, Kind};
use crate::services::pg_connect;
use crate::workload::{
    copy_sql, order_json, owned_partitions, partition_of, RawJsonb, CHECKPOINT_INTERVAL, COPY_SEGMENT_BYTES,
    COPY_TYPES, PARALLELISM, PARTITIONS,
};
use crate::Ctx;

/// Set in a re-executed child: which baseline it runs.
pub const ROLE_ENV: &str = "EXACTLY_BENCH_ROLE";

/// Starts baseline `kind` reading `topic` (and writing `table`); `follow`:
/// it keeps reading (latency phase) until it gets SIGTERM, instead of
/// stopping at the end offsets it found at start.
pub fn spawn_baseline(ctx: &Ctx, kind: Kind, name: &str, topic: &str, table: &str, follow: bool) -> Result<Running> {
    let mut cmd = Command::new(&ctx.me);
    cmd.env(ROLE_ENV, kind.id())
        .env("EXACTLY_BENCH_BOOTSTRAP", &ctx.bootstrap)
        .env("EXACTLY_BENCH_TOPIC", topic)
        .env("EXACTLY_BENCH_PG_URL", &ctx.pg_url)
        .env("EXACTLY_BENCH_TABLE", table)
        .env("EXACTLY_BENCH_RECORDS", ctx.settings.records.to_string())
        .env("EXACTLY_BENCH_FOLLOW", if follow { "1" } else { "0" });
    let phase = if follow { "lat" } else { "tp" };
    Running::spawn(cmd, &log_dir().join(format!("{name}-{phase}.log")))
}

pub struct Args {
    pub bootstrap: String,
    pub topic: String,
    pub pg_url: String,
    pub table: String,
    pub records: u64,
    pub follow: bool,
}

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!("{name} is not set: baselines are started by the bench (`cargo bench --bench kafka_to_postgres`)")
    })
}

/// The entry point of a re-executed child.
pub fn main(role: &str) -> Result<()> {
    let args = Args {
        bootstrap: var("EXACTLY_BENCH_BOOTSTRAP")?,
        topic: var("EXACTLY_BENCH_TOPIC")?,
        pg_url: var("EXACTLY_BENCH_PG_URL")?,
        table: var("EXACTLY_BENCH_TABLE")?,
        records: env_u64("EXACTLY_BENCH_RECORDS", 1_000_000)?,
        follow: std::env::var("EXACTLY_BENCH_FOLLOW").is_ok_and(|v| v == "1"),
    };
    match role {
        "copy" => copy(&args),
        "consume" => consume(&args),
        "fetch" => fetched::raw_fetch(&args),
        "loop" => minimal_loop(&args),
        "hand" => crate::hand_loop::run(&args),
        other => bail!("unknown {ROLE_ENV} `{other}`: use copy, consume, fetch, loop or hand"),
    }
}

/// The rows of the workload, without Kafka: subtask `s` writes the
/// partitions it would own, in one binary COPY on its own connection.
fn copy(args: &Args) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let mut tasks = Vec::new();
        for s in 0..PARALLELISM {
            let (url, table, n) = (args.pg_url.clone(), args.table.clone(), args.records);
            tasks.push(tokio::spawn(async move {
                let client = pg_connect(&url).await?;
                let mut copy = BinaryCopy::start(&client, &copy_sql(&table), &COPY_TYPES).await?;
                let ts = SystemTime::now();
                let owned = owned_partitions(s);
                for id in (0..n).filter(|id| owned.contains(&partition_of(*id))) {
                    let (part, off, idv) = (partition_of(id), (id / PARTITIONS as u64) as i64, id as i64);
                    let value = order_json(id);
                    let payload = RawJsonb(value.as_bytes());
                    let cells: [&(dyn ToSql + Sync); 5] = [&part, &off, &idv, &ts, &payload];
                    copy.push_row(cells)?;
                    copy.send_full().await?;
                }
                anyhow::Ok(copy.finish().await?)
            }));
        }
        let mut rows = 0;
        for t in tasks {
            rows += t.await??;
        }
        anyhow::Ok(rows)
    })?;
    println!("records={rows}");
    println!("copies={PARALLELISM}");
    Ok(())
}

/// librdkafka's prefetch bounded like the exactly source's read-ahead (4 MiB
/// per consumer), resuming 10 ms after its queue was full: librdkafka's
/// defaults (64 MiB, 1 s) fetch no faster here and hold far more memory.
pub const LIBRDKAFKA_PREFETCH: [(&str, &str); 2] =
    [("queued.max.messages.kbytes", "4096"), ("fetch.queue.backoff.ms", "10")];

/// Consumer settings like the exactly Kafka source's (explicit assignment,
/// read_committed, no group commits, 4 MiB read ahead), for every consumer
/// of the baselines.
pub fn consumer_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.extend(LIBRDKAFKA_PREFETCH.map(|(k, v)| (k.to_string(), v.to_string())));
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "exactly-bench-raw")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed");
    config
}

/// Assigns `partitions` from the beginning and returns the consumer and,
/// unless following, the end offsets it reads up to.
fn open(args: &Args, partitions: &[i32]) -> Result<(BaseConsumer, Vec<(i32, i64)>)> {
    let consumer: BaseConsumer = consumer_config(&args.bootstrap).create()?;
    let ends = if args.follow {
        Vec::new()
    } else {
        end_offsets(&args.bootstrap, &args.topic, partitions)?
    };
    let mut list = TopicPartitionList::new();
    for &p in partitions {
        list.add_partition_offset(&args.topic, p, Offset::Beginning)?;
    }
    consumer.assign(&list)?;
    Ok((consumer, ends))
}

/// Tracks the next offset of each partition against its end.
pub struct Progress {
    next: Vec<(i32, i64, i64)>,
}

impl Progress {
    pub fn new(ends: &[(i32, i64)]) -> Progress {
        Progress {
            next: ends.iter().map(|(p, e)| (*p, 0, *e)).collect(),
        }
    }
    pub fn saw(&mut self, partition: i32, offset: i64) {
        if let Some(e) = self.next.iter_mut().find(|e| e.0 == partition) {
            e.1 = e.1.max(offset + 1);
        }
    }
    pub fn done(&self) -> bool {
        self.next.iter().all(|(_, next, end)| next >= end)
    }
}

/// What librdkafka reads at most: two consumers read their partitions to
/// the end (the hand loop's consumer, and the source's before it read with
/// exactly-kafka-wire).
fn consume(args: &Args) -> Result<()> {
    let started = Instant::now();
    let mut threads = Vec::new();
    for s in 0..PARALLELISM {
        let (consumer, ends) = open(args, &owned_partitions(s))?;
        threads.push(std::thread::spawn(move || -> Result<(u64, u64)> {
            let mut progress = Progress::new(&ends);
            let (mut records, mut bytes) = (0u64, 0u64);
            while !progress.done() {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        records += 1;
                        bytes += m.payload().map_or(0, |p| p.len()) as u64;
                        progress.saw(m.partition(), m.offset());
                    }
                    Some(Err(e)) => eprintln!("consumer error: {e}"),
                    None => {}
                }
            }
            Ok((records, bytes))
        }));
    }
    eprintln!("[baseline] consume: assigned after {:.0?}", started.elapsed());
    let (mut records, mut bytes) = (0, 0);
    for t in threads {
        let (r, b) = t.join().map_err(|_| anyhow!("a consumer panicked"))??;
        records += r;
        bytes += b;
    }
    eprintln!("[baseline] consume: {records} records after {:.0?}", started.elapsed());
    println!("records={records}");
    println!("bytes={bytes}");
    Ok(())
}

/// The machine's ceiling: per subtask, a task reads its partitions as the
/// exactly source does and converts records into rows (JSON parsed for the
/// id, as the sink does) in batches of up to [`BATCH`]
/// ([`fetched::spawn_reader`]), and another streams them into binary COPYs
/// cut like the sink's (see [`copy_batches`]). No checkpoints, no explicit
/// transactions: each COPY commits by itself.
fn minimal_loop(args: &Args) -> Result<()> {
    let started = Instant::now();
    let rt = tokio::runtime::Runtime::new()?;
    let mut consumers = Vec::new();
    let mut writers = Vec::new();
    for s in 0..PARALLELISM {
        let client = rt.block_on(pg_connect(&args.pg_url))?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Vec<Row>>(4);
        consumers.push(fetched::spawn_reader(&rt, args, s, tx)?);
        writers.push(rt.spawn(copy_batches(client, copy_sql(&args.table), rx)));
    }
    eprintln!(
        "[baseline] loop: assigned and connected after {:.0?}",
        started.elapsed()
    );
    println!("ready");
    let mut consumed = 0;
    for c in consumers {
        consumed += rt.block_on(c).map_err(|_| anyhow!("a reader panicked"))??;
    }
    let (mut written, mut copies) = (0, 0);
    for w in writers {
        let (rows, n) = rt.block_on(w)??;
        written += rows;
        copies += n;
    }
    eprintln!(
        "[baseline] loop: {written} rows in {copies} COPYs after {:.0?}",
        started.elapsed()
    );
    println!("records={consumed}");
    println!("rows={written}");
    println!("copies={copies}");
    Ok(())
}

/// Streams batches into binary COPYs on `client`, each committing by itself
/// (autocommit), cut like the PostgreSQL sink's COPYs: after
/// [`COPY_SEGMENT_BYTES`] of record data (values and keys). A COPY is also
/// finished [`CHECKPOINT_INTERVAL`] after it began, so that when data comes
/// slowly (the latency phase) rows become visible at least as often as the
/// pipelines commit; at full speed a segment fills long before that. A
/// momentarily empty queue does not end a COPY. Returns (rows, COPYs).
async fn copy_batches(
    client: tokio_postgres::Client,
    statement: String,
    mut rx: tokio::sync::mpsc::Receiver<Vec<Row>>,
) -> Result<(u64, u64)> {
    let (mut rows, mut copies) = (0, 0);
    let mut open: Option<(BinaryCopy, tokio::time::Instant)> = None;
    let mut bytes = 0;
    loop {
        let next = match &open {
            Some((_, cut_at)) => match tokio::time::timeout_at(*cut_at, rx.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    // The COPY is a checkpoint interval old.
                    rows += finish(&mut open, &mut copies).await?;
                    bytes = 0;
                    continue;
                }
            },
            None => rx.recv().await,
        };
        let Some(batch) = next else { break };
        let (writer, _) = match &mut open {
            Some(open) => open,
            None => {
                let copy = BinaryCopy::start(&client, &statement, &COPY_TYPES).await?;
                open.insert((copy, tokio::time::Instant::now() + CHECKPOINT_INTERVAL))
            }
        };
        for r in &batch {
            let payload = RawJsonb(&r.payload);
            let cells: [&(dyn ToSql + Sync); 5] = [&r.part, &r.off, &r.id, &r.ts, &payload];
            writer.push_row(cells)?;
            bytes += r.data_bytes;
        }
        writer.send_full().await?;
        if bytes >= COPY_SEGMENT_BYTES {
            rows += finish(&mut open, &mut copies).await?;
            bytes = 0;
        }
    }
    rows += finish(&mut open, &mut copies).await?;
    Ok((rows, copies))
}

/// Finishes the open COPY, if any (its rows commit), counting it.
async fn finish(open: &mut Option<(BinaryCopy, tokio::time::Instant)>, copies: &mut u64) -> Result<u64> {
    let Some((copy, _)) = open.take() else {
        return Ok(0);
    };
    *copies += 1;
    Ok(copy.finish().await?)
}
