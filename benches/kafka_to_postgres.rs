//! `cargo bench --bench kafka_to_postgres`: Kafka → PostgreSQL throughput,
//! checkpoint durations, end-to-end latency and peak memory of `exactly run`,
//! side by side with the ceilings of the same machine (see BENCHMARKS.md).
//!
//! Workload: `EXACTLY_BENCH_RECORDS` (default 1,000,000) JSON records of about
//! 100 bytes, preloaded into a topic with 4 partitions, delivered into a
//! PostgreSQL table with a primary key, parallelism 2, checkpoints every 1 s.
//!
//! Every measured run is a child process (the `exactly` release binary, or this
//! bench binary re-executed in a baseline role), so its peak RSS comes from
//! `wait4` and its throughput from the wall-clock time between spawn and exit.
//! Pipelines are bounded (`stop_at_end = true`): they read up to the end
//! offsets they find at start, take a last checkpoint, commit and exit, like
//! the baselines, which also stop at the end. With `EXACTLY_BENCH_STOP_AT_END=0`
//! they read unbounded and get SIGTERM (last checkpoint, commit, exit) once a
//! persisted checkpoint has read every record, which adds up to one
//! checkpoint interval.
//!
//! The broker (Nisshi) keeps the topic in memory by default: on its SQLite
//! storage every fetch costs the broker seconds of CPU and the same read
//! varies by ±30 % from one run to the next, which hides what the pipeline
//! itself costs (`EXACTLY_BENCH_BROKER_STORAGE=sqlite` measures it anyway).
//!
//! Settings (environment variables):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `EXACTLY_BENCH_RECORDS` | 1000000 | records preloaded and delivered per run |
//! | `EXACTLY_BENCH_LATENCY_RATE` | 2000 | records/s produced during the latency phase |
//! | `EXACTLY_BENCH_LATENCY_SECS` | 20 | length of the latency phase (0 skips it) |
//! | `EXACTLY_BENCH_RUNS` | `loop,copy,consume,eo,alo,redis,pg-fenced,loop,eo,alo` | the runs, in order (a repeated run only repeats the throughput measurement); also the diagnostic `eo-no-discovery` |
//! | `EXACTLY_BENCH_SOURCE_EXTRA` | — | TOML lines appended to every pipeline's `[source.kafka]` (experiments) |
//! | `EXACTLY_BENCH_STOP_AT_END` | 1 | 0: pipelines read unbounded and end by SIGTERM once a persisted checkpoint has read everything |
//! | `EXACTLY_BENCH_BROKER_STORAGE` | `memory` | the broker's storage: `memory` or `sqlite` |

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use bytes::BytesMut;
use exactly_core::{CheckpointStore, FsCheckpointStore};
use exactly_kafka::admin::KafkaAdmin;
use exactly_testkit::{KafkaBroker, PostgresServer, RedisServer};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{IsNull, ToSql, Type};

/// Set in a re-executed child: which baseline it runs.
const ROLE_ENV: &str = "EXACTLY_BENCH_ROLE";
const PARTITIONS: i32 = 4;
const PARALLELISM: usize = 2;
/// Records per source poll (the pipeline's `batch_size`) and per COPY of the minimal loop.
const BATCH: usize = 500;
const TOPIC: &str = "bench-orders";
const CHECKPOINT_INTERVAL: &str = "1s";
/// How often the latency monitor looks for newly visible rows.
const MONITOR_INTERVAL: Duration = Duration::from_millis(10);
/// The longest a throughput run may take before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(1800);

fn main() -> Result<()> {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        return baseline::main(&role);
    }
    // `cargo test --all-targets` runs harness-less benches without `--bench`:
    // only `cargo bench` starts the (long) measurement.
    if !std::env::args().any(|a| a == "--bench") {
        println!("kafka_to_postgres is a benchmark: run it with `cargo bench --bench kafka_to_postgres`");
        return Ok(());
    }
    bench()
}

// ---------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------

/// The value of record `id`: a JSON order of about 100 bytes.
fn order_json(id: u64) -> String {
    format!(
        r#"{{"id":{id},"customer":"c{:05}","amount":{}.{:02},"currency":"EUR","status":"paid","note":"order {id:08}"}}"#,
        id % 10_007,
        id % 1000,
        id % 100
    )
}

/// Partition of record `id` (round robin, so partition `p` holds ids `p, p+4, ...`
/// at offsets `0, 1, ...`).
fn partition_of(id: u64) -> i32 {
    (id % PARTITIONS as u64) as i32
}

/// How many of the first `records` ids go to partition `p` (see
/// [`partition_of`]).
fn records_in_partition(records: u64, p: i32) -> i64 {
    let partitions = PARTITIONS as u64;
    ((records + partitions - 1 - p as u64) / partitions) as i64
}

/// The target table: one row per record, primary key (partition, offset).
fn create_table_sql(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (part integer NOT NULL, off bigint NOT NULL, id bigint NOT NULL, \
         ts timestamptz NOT NULL, payload jsonb NOT NULL, PRIMARY KEY (part, off))"
    )
}

/// Record data per COPY in the minimal loop: the PostgreSQL sink's segment.
const LOOP_COPY_SEGMENT_BYTES: usize = 512 * 1024;

const COPY_TYPES: [Type; 5] = [Type::INT4, Type::INT8, Type::INT8, Type::TIMESTAMPTZ, Type::JSONB];

fn copy_sql(table: &str) -> String {
    format!("COPY {table} (part, off, id, ts, payload) FROM STDIN (FORMAT binary)")
}

/// JSON text sent as `jsonb` without re-serializing it (binary jsonb is a
/// version byte followed by the text), as the sink does with raw values.
#[derive(Debug)]
struct RawJsonb<'a>(&'a [u8]);

impl ToSql for RawJsonb<'_> {
    fn to_sql(&self, _ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        out.extend_from_slice(&[1]);
        out.extend_from_slice(self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }

    fn to_sql_checked(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        if !Self::accepts(ty) {
            return Err(format!("RawJsonb cannot be sent as {ty}").into());
        }
        self.to_sql(ty, out)
    }
}

fn unix_ms_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0
}

fn env_u64(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .replace('_', "")
            .parse()
            .with_context(|| format!("{name}={v} is not a whole number")),
        Err(_) => Ok(default),
    }
}

async fn pg_connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("postgres connection ended: {e}");
        }
    });
    Ok(client)
}

/// A consumer with the settings of the exactly Kafka source (explicit
/// assignment, read_committed, no group commits).
fn raw_consumer(bootstrap: &str) -> Result<BaseConsumer> {
    let mut config = ClientConfig::new();
    config.extend(exactly_kafka::PREFETCH_DEFAULTS.map(|(k, v)| (k.to_string(), v.to_string())));
    Ok(config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "exactly-bench-raw")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .create()?)
}

/// Partitions of subtask `subtask` (the source's rule: partition % parallelism).
fn owned_partitions(subtask: usize) -> Vec<i32> {
    (0..PARTITIONS)
        .filter(|p| *p as usize % PARALLELISM == subtask)
        .collect()
}

// ---------------------------------------------------------------------------
// The runs
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    MinimalLoop,
    RawCopy,
    RawConsume,
    ExactlyOnce,
    AtLeastOnce,
    RedisFenced,
    PostgresFenced,
    /// Diagnostic, only on request: the exactly-once pipeline without
    /// partition discovery, to show what the discovery's waits cost.
    ExactlyOnceNoDiscovery,
}

impl Kind {
    /// The default runs, in order: every row once, then the three rows the
    /// targets compare again, to show how much a single run varies.
    const DEFAULT: [Kind; 10] = [
        Kind::MinimalLoop,
        Kind::RawCopy,
        Kind::RawConsume,
        Kind::ExactlyOnce,
        Kind::AtLeastOnce,
        Kind::RedisFenced,
        Kind::PostgresFenced,
        Kind::MinimalLoop,
        Kind::ExactlyOnce,
        Kind::AtLeastOnce,
    ];
    /// Every run `EXACTLY_BENCH_RUNS` can name.
    const ANY: [Kind; 8] = [
        Kind::MinimalLoop,
        Kind::RawCopy,
        Kind::RawConsume,
        Kind::ExactlyOnce,
        Kind::AtLeastOnce,
        Kind::RedisFenced,
        Kind::PostgresFenced,
        Kind::ExactlyOnceNoDiscovery,
    ];

    fn id(self) -> &'static str {
        match self {
            Kind::MinimalLoop => "loop",
            Kind::RawCopy => "copy",
            Kind::RawConsume => "consume",
            Kind::ExactlyOnce => "eo",
            Kind::AtLeastOnce => "alo",
            Kind::RedisFenced => "redis",
            Kind::PostgresFenced => "pg-fenced",
            Kind::ExactlyOnceNoDiscovery => "eo-no-discovery",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::ExactlyOnce => "exactly, exactly-once (two-phase)",
            Kind::AtLeastOnce => "exactly, at-least-once",
            Kind::RawCopy => "raw binary COPY, 2 connections (sink ceiling)",
            Kind::RawConsume => "raw consume, 2 consumers (source ceiling)",
            Kind::MinimalLoop => "minimal consume → COPY loop ×2 (machine ceiling)",
            Kind::RedisFenced => "exactly, Redis HINCRBY fenced",
            Kind::PostgresFenced => "exactly, PostgreSQL mode = \"fenced\"",
            Kind::ExactlyOnceNoDiscovery => "exactly, exactly-once, partition discovery off (diagnostic)",
        }
    }

    fn is_pipeline(self) -> bool {
        matches!(
            self,
            Kind::ExactlyOnce
                | Kind::AtLeastOnce
                | Kind::RedisFenced
                | Kind::PostgresFenced
                | Kind::ExactlyOnceNoDiscovery
        )
    }

    fn writes_postgres(self) -> bool {
        !matches!(self, Kind::RawConsume | Kind::RedisFenced)
    }

    /// Runs with a latency phase (the raw COPY and raw consume have no end to end).
    fn has_latency(self) -> bool {
        !matches!(self, Kind::RawCopy | Kind::RawConsume | Kind::ExactlyOnceNoDiscovery)
    }
}

/// Table or hash name of run `name` (`phase` is `tp` or `lat`).
fn target_name(name: &str, phase: &str) -> String {
    format!("bench_{}_{phase}", name.replace('-', "_"))
}

struct Settings {
    records: u64,
    latency_rate: u64,
    latency_secs: u64,
    /// Pipelines end by `stop_at_end` instead of SIGTERM.
    stop_at_end: bool,
    /// The broker keeps its data in SQLite instead of memory.
    sqlite_storage: bool,
    kinds: Vec<Kind>,
}

impl Settings {
    fn from_env() -> Result<Settings> {
        let records = env_u64("EXACTLY_BENCH_RECORDS", 1_000_000)?;
        if records < PARTITIONS as u64 {
            bail!("EXACTLY_BENCH_RECORDS must be at least {PARTITIONS}");
        }
        let kinds = match std::env::var("EXACTLY_BENCH_RUNS") {
            Ok(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    Kind::ANY.into_iter().find(|k| k.id() == s).ok_or_else(|| {
                        let ids: Vec<&str> = Kind::ANY.iter().map(|k| k.id()).collect();
                        anyhow!("EXACTLY_BENCH_RUNS: unknown run `{s}` (runs: {})", ids.join(","))
                    })
                })
                .collect::<Result<Vec<Kind>>>()?,
            Err(_) => Kind::DEFAULT.to_vec(),
        };
        let sqlite_storage = match std::env::var("EXACTLY_BENCH_BROKER_STORAGE").as_deref() {
            Err(_) | Ok("memory") => false,
            Ok("sqlite") => true,
            Ok(other) => bail!("EXACTLY_BENCH_BROKER_STORAGE: unknown storage `{other}` (memory or sqlite)"),
        };
        let stop_at_end = std::env::var("EXACTLY_BENCH_STOP_AT_END").map_or(true, |v| v != "0");
        Ok(Settings {
            records,
            latency_rate: env_u64("EXACTLY_BENCH_LATENCY_RATE", 2000)?.max(1),
            latency_secs: env_u64("EXACTLY_BENCH_LATENCY_SECS", 20)?,
            stop_at_end,
            sqlite_storage,
            kinds,
        })
    }
}

/// The services and paths every run uses.
struct Ctx {
    cpu: CpuProbe,
    exactly: PathBuf,
    me: PathBuf,
    work: PathBuf,
    bootstrap: String,
    pg_url: String,
    redis_url: String,
    rt: tokio::runtime::Runtime,
    pg: tokio_postgres::Client,
    settings: Settings,
}

#[derive(Default)]
struct Outcome {
    /// `loop`, `eo`, ...; `loop-2` for a run listed a second time.
    name: String,
    records_per_s: Option<f64>,
    wall: Duration,
    checkpoints: Vec<u64>,
    ready_after: Option<Duration>,
    rss_kib: Option<i64>,
    cpu: Option<CpuUse>,
    latency: Option<Latency>,
    problems: Vec<String>,
    notes: Vec<String>,
}

struct Latency {
    samples: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    missing: usize,
    /// Produce → broker acknowledgement, the part of the latency before any consumer.
    ack_p50_ms: f64,
    ack_p99_ms: f64,
    notes: Vec<String>,
}

fn bench() -> Result<()> {
    let settings = Settings::from_env()?;
    let exactly = PathBuf::from(env!("CARGO_BIN_EXE_exactly"));
    if !exactly.is_file() {
        bail!(
            "the exactly binary is missing at {}: build it first with `cargo build --release --bin exactly` \
             (cargo bench normally builds it)",
            exactly.display()
        );
    }
    let work = tempfile::Builder::new().prefix("exactly-bench-").tempdir()?;
    eprintln!("[bench] work folder {}", work.path().display());
    let storage = if settings.sqlite_storage { "SQLite" } else { "memory" };
    eprintln!("[bench] starting Nisshi ({storage} storage), PostgreSQL and Redis from the test kit");
    let kafka = if settings.sqlite_storage {
        KafkaBroker::start_persistent(work.path().join("broker"))?
    } else {
        KafkaBroker::start()?
    };
    let postgres = PostgresServer::start()?;
    let redis = RedisServer::start()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let pg = rt.block_on(pg_connect(postgres.url()))?;
    let ctx = Ctx {
        cpu: CpuProbe::new(kafka.port(), postgres.data_dir()),
        exactly,
        me: std::env::current_exe()?,
        work: work.path().to_path_buf(),
        bootstrap: kafka.bootstrap().to_string(),
        pg_url: postgres.url().to_string(),
        redis_url: redis.url().to_string(),
        rt,
        pg,
        settings,
    };
    let environment = describe_environment(&ctx)?;
    eprintln!("{environment}");

    let n = ctx.settings.records;
    eprintln!("[bench] preloading {n} records into `{TOPIC}` ({PARTITIONS} partitions)");
    let started = Instant::now();
    preload(&ctx, n)?;
    let preload_time = started.elapsed();
    let preload_rate = n as f64 / preload_time.as_secs_f64();
    eprintln!("[bench] preloaded in {preload_time:.1?} ({preload_rate:.0} records/s)");

    // The first reader of a freshly written topic is slower (cold broker and
    // SQLite caches): read it once, unmeasured, so no run pays for that.
    eprintln!("[bench] warm-up: reading the topic once");
    let warmup = spawn_baseline(&ctx, Kind::RawConsume, "warm-up", TOPIC, "unused", false)?.finish(RUN_TIMEOUT)?;
    if !warmup.success() {
        bail!(
            "the warm-up read of the topic ended with {}; last log lines:\n{}",
            warmup.describe_status(),
            warmup.log.log_tail
        );
    }
    eprintln!("[bench] warm-up read took {:.1?}", warmup.wall);
    let mut results: Vec<(Kind, Outcome)> = Vec::new();
    for kind in ctx.settings.kinds.clone() {
        eprintln!("[bench] --- {} ---", kind.label());
        // Names of a run listed again get its ordinal: `loop`, `loop-2`, ...
        let earlier = results.iter().filter(|(k, _)| *k == kind).count();
        let name = match earlier {
            0 => kind.id().to_string(),
            n => format!("{}-{}", kind.id(), n + 1),
        };
        let mut outcome = Outcome {
            name: name.clone(),
            ..Outcome::default()
        };
        if let Err(e) = throughput_run(&ctx, kind, &name, &mut outcome) {
            outcome.problems.push(format!("throughput run: {e:#}"));
        }
        // A run listed again only repeats the throughput measurement.
        if kind.has_latency() && ctx.settings.latency_secs > 0 && earlier == 0 {
            match latency_run(&ctx, kind, &name) {
                Ok(l) => {
                    outcome.notes.extend(l.notes.iter().cloned());
                    outcome.latency = Some(l);
                }
                Err(e) => outcome.problems.push(format!("latency run: {e:#}")),
            }
        }
        for p in &outcome.problems {
            eprintln!("[bench] PROBLEM {name}: {p}");
        }
        results.push((kind, outcome));
    }
    println!();
    println!("{environment}");
    println!("preload: {n} records produced in {preload_time:.1?} ({preload_rate:.0} records/s)");
    println!("child logs: {}", log_dir().display());
    println!();
    print_table(&ctx, &results);
    drop(kafka);
    drop(postgres);
    drop(redis);
    Ok(())
}

fn num_cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

fn describe_environment(ctx: &Ctx) -> Result<String> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = num_cores();
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let pg_version: String = ctx.rt.block_on(ctx.pg.query_one("SHOW server_version", &[]))?.get(0);
    let nisshi = Command::new("nisshi")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "nisshi (version unknown)".into());
    let s = &ctx.settings;
    let storage = if s.sqlite_storage { "SQLite" } else { "memory" };
    Ok(format!(
        "machine: {cores} cores ({cpu}), {mem_gib:.1} GiB memory, load average at start {}\n\
         broker: {nisshi}, {storage} storage; PostgreSQL {pg_version} (test kit: fsync = off); Redis from the test kit (no persistence)\n\
         workload: {} records of ~{} bytes, {PARTITIONS} partitions, parallelism {PARALLELISM}, checkpoint interval {CHECKPOINT_INTERVAL}, batch {BATCH}\n\
         latency phase: {} records/s for {} s per run",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        s.records,
        order_json(s.records / 2).len(),
        s.latency_rate,
        s.latency_secs
    ))
}

fn preload(ctx: &Ctx, n: u64) -> Result<()> {
    ctx.rt.block_on(async {
        KafkaAdmin::new(&ctx.bootstrap).create_topic(TOPIC, PARTITIONS).await?;
        let linger = std::env::var("EXACTLY_BENCH_PRELOAD_LINGER_MS").unwrap_or_else(|_| "20".into());
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &ctx.bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", &linger)
            .set("batch.size", "1000000")
            .set("message.timeout.ms", "300000")
            .create()?;
        let mut pending = Vec::new();
        for id in 0..n {
            let (key, value) = (id.to_string(), order_json(id));
            let mut record = FutureRecord::to(TOPIC)
                .key(key.as_bytes())
                .payload(value.as_bytes())
                .partition(partition_of(id));
            loop {
                match producer.send_result(record) {
                    Ok(delivery) => break pending.push(delivery),
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => bail!("producing record {id}: {e}"),
                }
            }
            // The last record of every partition goes alone in its own
            // batch: Nisshi's memory storage answers a partition's end offset
            // with its last batch's base offset + 1, which is then right, so
            // bounded pipelines (`stop_at_end`) stop at the real end.
            if pending.len() >= 50_000 || id + 1 + PARTITIONS as u64 >= n {
                for delivery in pending.drain(..) {
                    delivery
                        .await
                        .map_err(|_| anyhow!("the producer was dropped"))?
                        .map_err(|(e, _)| anyhow!("delivery failed: {e}"))?;
                }
            }
        }
        anyhow::Ok(())
    })
}

fn execute(ctx: &Ctx, sql: &str) -> Result<()> {
    ctx.rt
        .block_on(ctx.pg.batch_execute(sql))
        .with_context(|| format!("running `{sql}`"))
}

fn fresh_table(ctx: &Ctx, table: &str) -> Result<()> {
    execute(
        ctx,
        &format!(
            "DROP TABLE IF EXISTS {table}, {table}_dead_letters; {}",
            create_table_sql(table)
        ),
    )
}

/// Drops a run's tables and flushes PostgreSQL's dirty pages, so every run
/// starts from the same state.
fn cleanup_table(ctx: &Ctx, table: &str) -> Result<()> {
    execute(
        ctx,
        &format!("DROP TABLE IF EXISTS {table}, {table}_dead_letters; CHECKPOINT"),
    )
}

fn throughput_run(ctx: &Ctx, kind: Kind, name: &str, outcome: &mut Outcome) -> Result<()> {
    let n = ctx.settings.records;
    let target = target_name(name, "tp");
    if kind.writes_postgres() {
        fresh_table(ctx, &target)?;
    }
    let cpu_before = ctx.cpu.sample();
    let finished = if kind.is_pipeline() {
        let bounded = ctx.settings.stop_at_end;
        let file = write_pipeline(ctx, kind, &format!("{name}-tp"), TOPIC, &target, bounded)?;
        let running = spawn_pipeline(ctx, &file)?;
        if !bounded {
            // Unbounded: SIGTERM (last checkpoint, commit, exit) as soon as a
            // persisted checkpoint has read every record. Its transactions
            // are committed before the process exits, which ends the
            // measurement. (Polling the sink instead costs PostgreSQL dearly:
            // `max(off)` walks every row of the open transaction.)
            let store = FsCheckpointStore::new(file.with_file_name("checkpoints"), &format!("{name}-tp"), 1);
            let ends: Vec<(String, i64)> = (0..PARTITIONS)
                .map(|p| (format!("{TOPIC}-{p}"), records_in_partition(n, p)))
                .collect();
            let deadline = Instant::now() + RUN_TIMEOUT;
            loop {
                if running.has_exited() {
                    break;
                }
                let read_all = store.latest().ok().flatten().is_some_and(|entry| {
                    let positions = &entry.checkpoint.positions;
                    ends.iter()
                        .all(|(split, end)| positions.get(split).is_some_and(|at| at >= *end))
                });
                if read_all {
                    running.signal(libc::SIGTERM);
                    break;
                }
                if Instant::now() > deadline {
                    break; // finish() kills it
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        running.finish(RUN_TIMEOUT)?
    } else {
        spawn_baseline(ctx, kind, name, TOPIC, &target, false)?.finish(RUN_TIMEOUT)?
    };
    // Let the run's PostgreSQL backends exit and be reaped (their CPU time
    // then counts in the postmaster's children time).
    std::thread::sleep(Duration::from_millis(500));
    let cpu_after = ctx.cpu.sample();
    outcome.cpu = Some(CpuUse {
        process_s: finished.cpu_s,
        broker_s: cpu_after.0.zip(cpu_before.0).map(|(a, b)| a - b),
        postgres_s: cpu_after.1.zip(cpu_before.1).map(|(a, b)| a - b),
    });
    outcome.wall = finished.wall;
    outcome.rss_kib = Some(finished.max_rss_kib);
    outcome.checkpoints = finished.log.checkpoints.clone();
    outcome.ready_after = finished.log.ready_after;
    outcome.notes.extend(finished.log.notes("throughput run"));
    if !finished.success() {
        bail!(
            "the run ended with {}; last log lines:\n{}",
            finished.describe_status(),
            finished.log.log_tail
        );
    }
    if kind.is_pipeline() {
        // The run's final metrics (one JSON line on stdout).
        let Some(metrics) = finished
            .stdout
            .lines()
            .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        else {
            bail!("the run printed no metrics line, so its failed checkpoints and dead letters are unknown");
        };
        for key in ["checkpoints_failed", "dead_letters"] {
            let v = metrics.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0);
            if v > 0 {
                outcome.notes.push(format!("{key} = {v} in the throughput run"));
            }
        }
    }
    // Check that everything arrived exactly once before believing the speed.
    match kind {
        Kind::RawConsume => {
            let consumed = finished
                .stdout
                .lines()
                .find_map(|l| l.strip_prefix("records="))
                .and_then(|v| v.trim().parse::<u64>().ok());
            if consumed != Some(n) {
                bail!("consumed {consumed:?} records, expected {n}");
            }
        }
        Kind::RedisFenced => {
            let total = redis_counts(&ctx.redis_url, &target, TOPIC)?
                .iter()
                .map(|c| c.unwrap_or(0))
                .sum::<i64>();
            if total != n as i64 {
                bail!("Redis counted {total} records, expected {n}");
            }
        }
        _ => {
            let row = ctx.rt.block_on(ctx.pg.query_one(
                &format!("SELECT count(*), count(DISTINCT id), (SELECT count(*) FROM pg_prepared_xacts) FROM {target}"),
                &[],
            ))?;
            let (rows, distinct, prepared): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
            if rows != n as i64 || distinct != n as i64 || prepared != 0 {
                bail!(
                    "table holds {rows} rows ({distinct} distinct ids), expected {n}; {prepared} prepared transactions left"
                );
            }
        }
    }
    if kind.writes_postgres() {
        cleanup_table(ctx, &target)?;
    }
    outcome.records_per_s = Some(n as f64 / finished.wall.as_secs_f64());
    eprintln!(
        "[bench] {name}: {n} records in {:.2?} = {:.0} records/s, peak RSS {:.1} MiB, {} checkpoints",
        finished.wall,
        n as f64 / finished.wall.as_secs_f64(),
        finished.max_rss_kib as f64 / 1024.0,
        finished.log.checkpoints.len()
    );
    Ok(())
}

fn write_pipeline(ctx: &Ctx, kind: Kind, name: &str, topic: &str, target: &str, bounded: bool) -> Result<PathBuf> {
    let guarantee = if kind == Kind::AtLeastOnce {
        "at-least-once"
    } else {
        "exactly-once"
    };
    let sink = match kind {
        Kind::RedisFenced => format!(
            "[sink.redis]\nurl = \"{}\"\ncommand = \"hincrby\"\nkey = \"={target}\"\nfield = \"split\"\nstrategy = \"fenced\"\n",
            ctx.redis_url
        ),
        _ => {
            let mode = if kind == Kind::PostgresFenced {
                "mode = \"fenced\"\n"
            } else {
                ""
            };
            format!(
                r#"[sink.postgres]
url = "{url}"
table = "{target}"
{mode}
[sink.postgres.columns]
part = {{ from = "partition", type = "int" }}
off = {{ from = "offset", type = "bigint" }}
id = {{ from = "/id", type = "bigint" }}
ts = {{ from = "timestamp", type = "timestamptz" }}
payload = {{ from = "value", type = "jsonb" }}
"#,
                url = ctx.pg_url
            )
        }
    };
    let text = format!(
        r#"name = "{name}"
guarantee = "{guarantee}"
parallelism = {PARALLELISM}
batch_size = {BATCH}

[checkpoint]
dir = "checkpoints"
interval = "{CHECKPOINT_INTERVAL}"

[restart]
strategy = "fixed"
delay = "1s"
max_attempts = 3

[source.kafka]
bootstrap = "{bootstrap}"
topic = "{topic}"
start = "earliest"
stop_at_end = {bounded}
{discovery}{extra}
{sink}"#,
        bootstrap = ctx.bootstrap,
        extra = std::env::var("EXACTLY_BENCH_SOURCE_EXTRA").map_or(String::new(), |e| format!("{e}\n")),
        discovery = if kind == Kind::ExactlyOnceNoDiscovery {
            "partition_discovery_interval = \"100h\"\n"
        } else {
            ""
        }
    );
    let file = ctx.work.join(format!("{name}.toml"));
    std::fs::write(&file, text)?;
    Ok(file)
}

fn spawn_pipeline(ctx: &Ctx, file: &Path) -> Result<Running> {
    let mut cmd = Command::new(&ctx.exactly);
    cmd.arg("run")
        .arg(file)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("EXACTLY_CRASH_AT");
    Running::spawn(
        cmd,
        &log_dir().join(format!(
            "{}.log",
            file.file_stem().unwrap_or_default().to_string_lossy()
        )),
    )
}

/// Where every child's stderr is kept: `target/tmp/kafka_to_postgres/<run>.log`.
fn log_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("kafka_to_postgres")
}

fn spawn_baseline(ctx: &Ctx, kind: Kind, name: &str, topic: &str, table: &str, follow: bool) -> Result<Running> {
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

// ---------------------------------------------------------------------------
// Child processes: spawn, follow their output, reap them with wait4
// ---------------------------------------------------------------------------

enum ChildEvent {
    /// A "checkpoint complete" log line.
    Checkpoint,
    /// A baseline printed "ready" (assigned and connected).
    Ready,
}

struct Running {
    child: Child,
    started: Instant,
    events: mpsc::Receiver<ChildEvent>,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<StderrSummary>,
    /// This process's peak RSS when the child was spawned (KiB): the floor of
    /// the child's `ru_maxrss` (see [`Running::finish`]).
    parent_hwm_kib: i64,
    /// The child's own peak RSS (`VmHWM`), sampled every 20 ms (KiB).
    sampled_hwm_kib: Arc<AtomicI64>,
    reaped: Arc<AtomicBool>,
    sampler: JoinHandle<()>,
}

/// What the stderr of a child told.
#[derive(Default)]
struct StderrSummary {
    /// `duration_ms` of every "checkpoint complete" line.
    checkpoints: Vec<u64>,
    /// When the child was ready to move records: its last "Kafka source
    /// assigned" or "bounded run: reading up to" line (every source has its
    /// partitions, and its end offsets in a bounded run) or "[baseline] ...
    /// assigned" line.
    ready_after: Option<Duration>,
    /// How many lines matched each of [`WATCHED`].
    watched: [usize; WATCHED.len()],
    log_tail: String,
}

/// Log lines worth a note under the table: (what the line contains, what it means).
const WATCHED: [(&str, &str); 3] = [
    ("pipeline failed; restarting", "restarts"),
    (
        "partition discovery failed",
        "partition discovery requests that timed out after 5 s (the broker answered late)",
    ),
    ("checkpoint aborted", "aborted checkpoints"),
];

impl StderrSummary {
    fn notes(&self, phase: &str) -> Vec<String> {
        WATCHED
            .iter()
            .zip(self.watched)
            .filter(|(_, n)| *n > 0)
            .map(|((_, what), n)| format!("{phase}: {n} log lines about {what}"))
            .collect()
    }
}

struct Finished {
    status: i32,
    wall: Duration,
    /// Peak RSS of the child alone (KiB), see [`Running::finish`].
    max_rss_kib: i64,
    /// User + system CPU seconds of the child.
    cpu_s: f64,
    stdout: String,
    log: StderrSummary,
}

fn seconds(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

/// CPU seconds of one run: the measured process, the broker, PostgreSQL.
struct CpuUse {
    process_s: f64,
    broker_s: Option<f64>,
    postgres_s: Option<f64>,
}

/// Reads the CPU time the broker and PostgreSQL have used so far, from /proc.
struct CpuProbe {
    broker: Option<u32>,
    postmaster: Option<u32>,
    ticks_per_s: f64,
}

/// (ppid, utime + stime, cutime + cstime) of a process, in clock ticks.
fn proc_times(pid: u32) -> Option<(u32, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces): state, ppid, ...
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split_whitespace().collect();
    let num = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let ppid = fields.get(1)?.parse().ok()?;
    Some((ppid, num(11)? + num(12)?, num(13)? + num(14)?))
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

impl CpuProbe {
    fn new(broker_port: u16, pg_data_dir: Option<&Path>) -> CpuProbe {
        let listener = format!("127.0.0.1:{broker_port}");
        let broker = all_pids().into_iter().find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("nisshi") && c.contains(&listener)
            })
        });
        let postmaster = pg_data_dir
            .and_then(|d| std::fs::read_to_string(d.join("postmaster.pid")).ok())
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()));
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        CpuProbe {
            broker,
            postmaster,
            ticks_per_s: if ticks > 0 { ticks as f64 } else { 100.0 },
        }
    }

    /// (broker, PostgreSQL) CPU seconds so far. PostgreSQL is the postmaster,
    /// its live children and the children it has reaped.
    fn sample(&self) -> (Option<f64>, Option<f64>) {
        let broker = self
            .broker
            .and_then(proc_times)
            .map(|(_, own, _)| own as f64 / self.ticks_per_s);
        let postgres = self.postmaster.and_then(|pm| {
            let (_, own, reaped) = proc_times(pm)?;
            let children: u64 = all_pids()
                .into_iter()
                .filter_map(proc_times)
                .filter(|(ppid, _, _)| *ppid == pm)
                .map(|(_, own, _)| own)
                .sum();
            Some((own + reaped + children) as f64 / self.ticks_per_s)
        });
        (broker, postgres)
    }
}

/// Removes ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `VmHWM` (peak resident set size, KiB) of a process, from /proc.
fn vm_hwm_kib(pid: &str) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `duration_ms=N` of a "checkpoint complete" log line.
fn checkpoint_duration(line: &str) -> Option<u64> {
    if !line.contains("checkpoint complete") {
        return None;
    }
    let rest = &line[line.find("duration_ms=")? + "duration_ms=".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

impl Running {
    fn spawn(mut cmd: Command, log: &Path) -> Result<Running> {
        std::fs::create_dir_all(log_dir())?;
        let mut log =
            std::io::BufWriter::new(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // A spawned child starts its rusage with this process's peak RSS (the
        // kernel carries the old address space's high-water mark over exec):
        // give freed heap back, reset our mark to the current RSS, then
        // remember it as the floor.
        // SAFETY: malloc_trim only releases free memory of the allocator.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        unsafe {
            libc::malloc_trim(0);
        }
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let parent_hwm_kib = vm_hwm_kib("self").unwrap_or(i64::MAX);
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let started = Instant::now();
        let reaped = Arc::new(AtomicBool::new(false));
        let sampled_hwm_kib = Arc::new(AtomicI64::new(0));
        let sampler = {
            let (reaped, sampled) = (reaped.clone(), sampled_hwm_kib.clone());
            let pid = child.id().to_string();
            std::thread::spawn(move || {
                while !reaped.load(Ordering::SeqCst) {
                    if let Some(kib) = vm_hwm_kib(&pid) {
                        sampled.fetch_max(kib, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let (tx, events) = mpsc::channel();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        let tx_out = tx.clone();
        let stdout = std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.trim() == "ready" {
                    let _ = tx_out.send(ChildEvent::Ready);
                }
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        let stderr = std::thread::spawn(move || {
            let mut durations = Vec::new();
            let mut ready_after = None;
            let mut watched = [0; WATCHED.len()];
            let mut tail: VecDeque<String> = VecDeque::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let line = strip_ansi(&line);
                let _ = writeln!(log, "{line}");
                if line.contains("bounded run: reading up to")
                    || line.contains("Kafka source assigned")
                    || line.starts_with("[baseline]") && line.contains("assigned")
                {
                    ready_after = Some(started.elapsed());
                }
                if line.starts_with("[baseline]") {
                    eprintln!("{line}");
                }
                for (count, (pattern, _)) in watched.iter_mut().zip(WATCHED) {
                    if line.contains(pattern) {
                        *count += 1;
                    }
                }
                if let Some(ms) = checkpoint_duration(&line) {
                    durations.push(ms);
                    let _ = tx.send(ChildEvent::Checkpoint);
                }
                if tail.len() == 40 {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            let _ = log.flush();
            StderrSummary {
                checkpoints: durations,
                ready_after,
                watched,
                log_tail: Vec::from(tail).join("\n"),
            }
        });
        Ok(Running {
            child,
            started,
            events,
            stdout,
            stderr,
            parent_hwm_kib,
            sampled_hwm_kib,
            reaped,
            sampler,
        })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits until `wanted` is reported (or the child exits, or `timeout`).
    fn wait_for(&self, timeout: Duration, wanted: fn(&ChildEvent) -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(e) if wanted(&e) => return Ok(()),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => bail!("not ready within {timeout:?}"),
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the process ended before it was ready"),
            }
        }
    }

    /// True once the child has exited (without reaping it: `finish` does).
    fn has_exited(&self) -> bool {
        // SAFETY: an all-zero siginfo is valid; waitid with WNOWAIT leaves
        // the child waitable.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                self.pid() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: waitid filled `info` (si_pid stays 0 while the child runs).
        rc == 0 && unsafe { info.si_pid() } != 0
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions; the child is not
        // reaped yet, so the pid still names it.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// Reaps the child with `wait4` (peak RSS from its rusage), killing it
    /// after `timeout`.
    fn finish(self, timeout: Duration) -> Result<Finished> {
        let pid = self.pid();
        let reaped = self.reaped.clone();
        let watchdog = {
            let reaped = reaped.clone();
            let deadline = self.started + timeout;
            std::thread::spawn(move || {
                while !reaped.load(Ordering::SeqCst) {
                    if Instant::now() > deadline {
                        eprintln!("[bench] pid {pid} exceeded {timeout:?}: SIGKILL");
                        // SAFETY: as in `signal`; `reaped` is still false.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value that wait4 overwrites.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: both pointers are valid for the call.
            let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            if rc == pid {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                reaped.store(true, Ordering::SeqCst);
                return Err(err).context("wait4");
            }
        }
        let wall = self.started.elapsed();
        reaped.store(true, Ordering::SeqCst);
        let _ = watchdog.join();
        let _ = self.sampler.join();
        let stdout = self.stdout.join().unwrap_or_default();
        let log = self.stderr.join().unwrap_or_default();
        // ru_maxrss is max(our peak at spawn, the child's own peak): above the
        // floor it is the child's exact peak; at the floor only the sampled
        // VmHWM says how much the child itself used.
        let sampled = self.sampled_hwm_kib.load(Ordering::SeqCst);
        let max_rss_kib = if usage.ru_maxrss > self.parent_hwm_kib {
            usage.ru_maxrss.max(sampled)
        } else {
            sampled
        };
        eprintln!(
            "[bench] pid {pid}: ru_maxrss {} KiB (floor: this process's {} KiB at spawn), sampled VmHWM {sampled} KiB",
            usage.ru_maxrss, self.parent_hwm_kib
        );
        Ok(Finished {
            status,
            wall,
            max_rss_kib,
            cpu_s: seconds(usage.ru_utime) + seconds(usage.ru_stime),
            stdout,
            log,
        })
    }
}

impl Finished {
    fn success(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }

    fn describe_status(&self) -> String {
        if libc::WIFEXITED(self.status) {
            format!("exit code {}", libc::WEXITSTATUS(self.status))
        } else if libc::WIFSIGNALED(self.status) {
            format!("signal {}", libc::WTERMSIG(self.status))
        } else {
            format!("wait status {}", self.status)
        }
    }
}

// ---------------------------------------------------------------------------
// End-to-end latency
// ---------------------------------------------------------------------------

/// Per partition, the highest offset visible to a reader, from the sink's
/// point of view: committed rows in PostgreSQL, or the fenced counters in Redis
/// (the count of partition `p` on a fresh topic is its visible offset + 1).
enum Visibility {
    Postgres(tokio_postgres::Client, tokio::runtime::Runtime, String),
    Redis(redis::Connection, String, String),
}

impl Visibility {
    fn read(&mut self) -> Result<[Option<i64>; PARTITIONS as usize]> {
        let mut out = [None; PARTITIONS as usize];
        match self {
            Visibility::Postgres(client, rt, table) => {
                // One index lookup per partition (primary key (part, off)).
                let sql = format!(
                    "SELECT p, (SELECT max(off) FROM {table} WHERE part = p) FROM generate_series(0, {}) AS p",
                    PARTITIONS - 1
                );
                for row in rt.block_on(client.query(&sql, &[]))? {
                    let p: i32 = row.get(0);
                    out[p as usize] = row.get(1);
                }
            }
            Visibility::Redis(con, hash, topic) => {
                let mut cmd = redis::cmd("HMGET");
                cmd.arg(&*hash);
                for p in 0..PARTITIONS {
                    cmd.arg(format!("{topic}-{p}"));
                }
                let counts: Vec<Option<i64>> = cmd.query(con)?;
                for (p, c) in counts.into_iter().enumerate() {
                    out[p] = c.filter(|c| *c > 0).map(|c| c - 1);
                }
            }
        }
        Ok(out)
    }
}

/// A reader of what `kind` has made visible in `target` from `topic`.
fn visibility(ctx: &Ctx, kind: Kind, target: &str, topic: &str) -> Result<Visibility> {
    Ok(if kind == Kind::RedisFenced {
        Visibility::Redis(
            redis::Client::open(ctx.redis_url.as_str())?.get_connection()?,
            target.to_string(),
            topic.to_string(),
        )
    } else {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = rt.block_on(pg_connect(&ctx.pg_url))?;
        Visibility::Postgres(client, rt, target.to_string())
    })
}

fn redis_counts(url: &str, hash: &str, topic: &str) -> Result<Vec<Option<i64>>> {
    let mut con = redis::Client::open(url)?.get_connection()?;
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(hash);
    for p in 0..PARTITIONS {
        cmd.arg(format!("{topic}-{p}"));
    }
    Ok(cmd.query(&mut con)?)
}

/// One produced record: partition, offset, produce time and time its
/// delivery was acknowledged (Unix ms).
type Produced = (i32, i64, f64, f64);

/// Produces `rate` records/s for `secs` seconds into `topic`, each with its
/// produce time as the Kafka timestamp, and returns where each landed.
fn produce_steadily(bootstrap: &str, topic: &str, rate: u64, secs: u64) -> Result<Vec<Produced>> {
    // The deliveries are awaited on the worker thread as they come, so their
    // acknowledgement times are exact.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .create()?;
        let total = rate * secs;
        let started = Instant::now();
        let mut pending = Vec::with_capacity(total as usize);
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut sent = 0u64;
        while sent < total {
            tick.tick().await;
            let due = ((started.elapsed().as_secs_f64() * rate as f64) as u64 + 1).min(total);
            while sent < due {
                let now = unix_ms_now();
                let value = order_json(sent);
                let key = sent.to_string();
                let record = FutureRecord::to(topic)
                    .payload(value.as_bytes())
                    .key(key.as_bytes())
                    .partition(partition_of(sent))
                    .timestamp(now as i64);
                let delivery = producer
                    .send_result(record)
                    .map_err(|(e, _)| anyhow!("producing the latency records: {e}"))?;
                let ts = now.floor();
                pending.push(tokio::spawn(async move {
                    let outcome = delivery.await;
                    (ts, unix_ms_now(), outcome)
                }));
                sent += 1;
            }
        }
        let mut produced = Vec::with_capacity(pending.len());
        for task in pending {
            let (ts, acked, outcome) = task.await?;
            let d = outcome
                .map_err(|_| anyhow!("the producer was dropped"))?
                .map_err(|(e, _)| anyhow!("delivery failed: {e}"))?;
            produced.push((d.partition, d.offset, ts, acked));
        }
        anyhow::Ok(produced)
    })
}

fn latency_run(ctx: &Ctx, kind: Kind, name: &str) -> Result<Latency> {
    let topic = format!("lat-{name}");
    let target = target_name(name, "lat");
    let (rate, secs) = (ctx.settings.latency_rate, ctx.settings.latency_secs);
    ctx.rt
        .block_on(KafkaAdmin::new(&ctx.bootstrap).create_topic(&topic, PARTITIONS))?;
    if kind.writes_postgres() {
        fresh_table(ctx, &target)?;
    }
    let running = if kind.is_pipeline() {
        let file = write_pipeline(ctx, kind, &format!("{name}-lat"), &topic, &target, false)?;
        let running = spawn_pipeline(ctx, &file)?;
        // Running: the sources are assigned and the sinks connected.
        running.wait_for(Duration::from_secs(120), |e| matches!(e, ChildEvent::Checkpoint))?;
        running
    } else {
        let running = spawn_baseline(ctx, kind, name, &topic, &target, true)?;
        running.wait_for(Duration::from_secs(120), |e| matches!(e, ChildEvent::Ready))?;
        running
    };
    let mut visibility = visibility(ctx, kind, &target, &topic)?;
    // The monitor: (partition, highest visible offset, Unix ms of the answer).
    let stop = Arc::new(AtomicBool::new(false));
    let latest = Arc::new(Mutex::new([None::<i64>; PARTITIONS as usize]));
    let monitor = {
        let (stop, latest) = (stop.clone(), latest.clone());
        std::thread::spawn(move || -> Result<Vec<Vec<(i64, f64)>>> {
            let mut seen: Vec<Vec<(i64, f64)>> = vec![Vec::new(); PARTITIONS as usize];
            while !stop.load(Ordering::SeqCst) {
                let visible = visibility.read()?;
                let at = unix_ms_now();
                for (p, v) in visible.iter().enumerate() {
                    if let Some(v) = *v {
                        if seen[p].last().is_none_or(|(last, _)| v > *last) {
                            seen[p].push((v, at));
                        }
                    }
                }
                *latest.lock().unwrap() = visible;
                std::thread::sleep(MONITOR_INTERVAL);
            }
            Ok(seen)
        })
    };
    eprintln!("[bench] {}: producing {rate} records/s for {secs} s", kind.id());
    let produced = produce_steadily(&ctx.bootstrap, &topic, rate, secs);
    let mut last = [None::<i64>; PARTITIONS as usize];
    if let Ok(produced) = &produced {
        for (p, o, _, _) in produced {
            let l = &mut last[*p as usize];
            *l = Some(l.map_or(*o, |x: i64| x.max(*o)));
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            let now = *latest.lock().unwrap();
            if last
                .iter()
                .zip(now.iter())
                .all(|(want, got)| want.is_none() || got >= want)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    stop.store(true, Ordering::SeqCst);
    let seen = monitor.join().map_err(|_| anyhow!("the monitor panicked"))?;
    running.signal(libc::SIGTERM);
    let finished = running.finish(Duration::from_secs(300));
    if kind.writes_postgres() {
        cleanup_table(ctx, &target)?;
    }
    let (produced, seen, finished) = (produced?, seen?, finished?);
    if kind.is_pipeline() && !finished.success() {
        bail!(
            "the pipeline ended with {} after SIGTERM:\n{}",
            finished.describe_status(),
            finished.log.log_tail
        );
    }
    let mut latencies = Vec::with_capacity(produced.len());
    let mut missing = 0;
    let mut acks: Vec<f64> = produced.iter().map(|(_, _, ts, acked)| acked - ts).collect();
    acks.sort_by(f64::total_cmp);
    for (p, offset, ts, _) in &produced {
        let obs = &seen[*p as usize];
        let i = obs.partition_point(|(v, _)| v < offset);
        match obs.get(i) {
            Some((_, at)) => latencies.push((at - ts).max(0.0)),
            None => missing += 1,
        }
    }
    if latencies.is_empty() {
        bail!("no produced record became visible");
    }
    latencies.sort_by(f64::total_cmp);
    let l = Latency {
        samples: latencies.len(),
        p50_ms: percentile(&latencies, 50.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: *latencies.last().unwrap(),
        missing,
        ack_p50_ms: percentile(&acks, 50.0),
        ack_p99_ms: percentile(&acks, 99.0),
        notes: finished.log.notes("latency run"),
    };
    eprintln!(
        "[bench] {}: latency p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} records ({} never visible); \
         produce→ack p50 {:.0} ms, p99 {:.0} ms",
        name, l.p50_ms, l.p99_ms, l.max_ms, l.samples, l.missing, l.ack_p50_ms, l.ack_p99_ms
    );
    Ok(l)
}

/// Nearest-rank percentile of sorted values.
fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

// ---------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------

/// A row's label; a run listed again is marked with its name (`loop-2`).
fn row_label(kind: Kind, o: &Outcome) -> String {
    if o.name == kind.id() {
        kind.label().to_string()
    } else {
        format!("{} [{}]", kind.label(), o.name)
    }
}

fn print_table(ctx: &Ctx, results: &[(Kind, Outcome)]) {
    // A run listed twice (e.g. the loop first and last) counts with its mean.
    let rate_of = |k: Kind| {
        let rates: Vec<f64> = results
            .iter()
            .filter(|(kind, o)| *kind == k && o.problems.is_empty())
            .filter_map(|(_, o)| o.records_per_s)
            .collect();
        (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
    };
    let ceiling = rate_of(Kind::MinimalLoop);
    println!(
        "| run | records/s | % of minimal loop | wall (startup) | checkpoint p50 | checkpoint p99 | checkpoints | e2e latency p50 | e2e latency p99 | peak RSS |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (kind, o) in results {
        let mut sorted = o.checkpoints.clone();
        sorted.sort_unstable();
        let ck = |p: f64| {
            if sorted.is_empty() {
                "—".to_string()
            } else {
                format!("{} ms", percentile(&sorted, p))
            }
        };
        let rate = o.records_per_s.map_or("failed".into(), |r| format!("{r:.0}"));
        let share = match (o.records_per_s, ceiling) {
            (Some(r), Some(c)) => format!("{:.0} %", 100.0 * r / c),
            _ => "—".into(),
        };
        let (lat50, lat99) = o.latency.as_ref().map_or(("—".into(), "—".into()), |l| {
            (format!("{:.0} ms", l.p50_ms), format!("{:.0} ms", l.p99_ms))
        });
        let rss = o
            .rss_kib
            .map_or("—".into(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
        let checkpoints = if kind.is_pipeline() {
            o.checkpoints.len().to_string()
        } else {
            "—".into()
        };
        let wall = match (o.records_per_s, o.ready_after) {
            (None, _) => "—".to_string(),
            (Some(_), Some(r)) => format!("{:.1} s ({:.1} s)", o.wall.as_secs_f64(), r.as_secs_f64()),
            (Some(_), None) => format!("{:.1} s", o.wall.as_secs_f64()),
        };
        println!(
            "| {} | {rate} | {share} | {wall} | {} | {} | {checkpoints} | {lat50} | {lat99} | {rss} |",
            row_label(*kind, o),
            ck(50.0),
            ck(99.0)
        );
    }
    println!();
    println!(
        "CPU time of the throughput runs (user + system seconds; the machine has {} cores):",
        num_cores()
    );
    println!();
    println!("| run | this run's process | broker | PostgreSQL | total | µs per record |");
    println!("|---|---:|---:|---:|---:|---:|");
    let fmt = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    for (kind, o) in results {
        let Some(c) = &o.cpu else { continue };
        let total = c.process_s + c.broker_s.unwrap_or(0.0) + c.postgres_s.unwrap_or(0.0);
        println!(
            "| {} | {:.1} | {} | {} | {total:.1} | {:.0} |",
            row_label(*kind, o),
            c.process_s,
            fmt(c.broker_s),
            fmt(c.postgres_s),
            total * 1e6 / ctx.settings.records as f64
        );
    }
    println!();
    for (_, o) in results {
        if let Some(l) = &o.latency {
            println!(
                "latency phase {}: {} records visible (max {:.0} ms), {} never; produce→broker ack p50 {:.0} ms, p99 {:.0} ms",
                o.name,
                l.samples,
                l.max_ms,
                l.missing,
                l.ack_p50_ms,
                l.ack_p99_ms
            );
        }
    }
    println!();
    for (_, o) in results {
        for n in &o.notes {
            println!("note: {}: {n}", o.name);
        }
        for p in &o.problems {
            println!("PROBLEM {}: {p}", o.name);
        }
    }
    let eo_runs: Vec<&Outcome> = results
        .iter()
        .filter(|(k, o)| *k == Kind::ExactlyOnce && o.records_per_s.is_some())
        .map(|(_, o)| o)
        .collect();
    if eo_runs.is_empty() {
        println!("targets: no exactly-once run completed");
        return;
    }
    println!(
        "targets ({} exactly-once run(s) of {} records; runs listed more than once count with their mean throughput, \
         their checkpoints pooled and their largest RSS):",
        eo_runs.len(),
        ctx.settings.records
    );
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    let eo_rate = rate_of(Kind::ExactlyOnce);
    match (eo_rate, ceiling) {
        (Some(r), Some(c)) => println!(
            "- throughput ≥ 85 % of the minimal loop: {:.0} % → {}",
            100.0 * r / c,
            verdict(r >= 0.85 * c)
        ),
        _ => println!("- throughput ≥ 85 % of the minimal loop: not measured"),
    }
    match (eo_rate, rate_of(Kind::AtLeastOnce)) {
        (Some(r), Some(a)) => println!(
            "- throughput within 10 % of at-least-once: {:.0} % of it → {}",
            100.0 * r / a,
            verdict(r >= 0.9 * a)
        ),
        _ => println!("- throughput within 10 % of at-least-once: not measured"),
    }
    let mut sorted: Vec<u64> = eo_runs.iter().flat_map(|o| o.checkpoints.iter().copied()).collect();
    sorted.sort_unstable();
    if sorted.is_empty() {
        println!("- checkpoint duration p99 < 250 ms: not measured");
    } else {
        let p99 = percentile(&sorted, 99.0);
        println!("- checkpoint duration p99 < 250 ms: {p99} ms → {}", verdict(p99 < 250));
    }
    match eo_runs.iter().filter_map(|o| o.rss_kib).max() {
        Some(k) => println!(
            "- peak RSS ≤ 150 MiB: {:.0} MiB → {}",
            k as f64 / 1024.0,
            verdict(k <= 150 * 1024)
        ),
        None => println!("- peak RSS ≤ 150 MiB: not measured"),
    }
}

// ---------------------------------------------------------------------------
// Baselines, run in a re-executed child of this bench
// ---------------------------------------------------------------------------

mod baseline {
    use super::*;

    struct Args {
        bootstrap: String,
        topic: String,
        pg_url: String,
        table: String,
        records: u64,
        follow: bool,
    }

    fn var(name: &str) -> Result<String> {
        std::env::var(name).with_context(|| format!("{name} is not set"))
    }

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
            "loop" => minimal_loop(&args),
            other => bail!("unknown {ROLE_ENV} `{other}`"),
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
                    let sink = client.copy_in(&copy_sql(&table)).await?;
                    let mut writer = std::pin::pin!(BinaryCopyInWriter::new(sink, &COPY_TYPES));
                    let ts = SystemTime::now();
                    let owned = owned_partitions(s);
                    for id in (0..n).filter(|id| owned.contains(&partition_of(*id))) {
                        let (part, off, idv) = (partition_of(id), (id / PARTITIONS as u64) as i64, id as i64);
                        let value = order_json(id);
                        let payload = RawJsonb(value.as_bytes());
                        writer.as_mut().write(&[&part, &off, &idv, &ts, &payload]).await?;
                    }
                    anyhow::Ok(writer.finish().await?)
                }));
            }
            let mut rows = 0;
            for t in tasks {
                rows += t.await??;
            }
            anyhow::Ok(rows)
        })?;
        println!("records={rows}");
        Ok(())
    }

    /// Assigns `partitions` from the beginning and returns the consumer and
    /// the end offsets it has to reach: the preload wrote `records` records
    /// round robin with a plain producer, so partition `p` holds offsets
    /// `0..` its share (asking the broker would not do: Nisshi's memory
    /// storage misreports the end).
    fn open(args: &Args, partitions: &[i32]) -> Result<(BaseConsumer, Vec<(i32, i64)>)> {
        let consumer = raw_consumer(&args.bootstrap)?;
        let mut list = TopicPartitionList::new();
        let mut ends = Vec::new();
        for &p in partitions {
            list.add_partition_offset(&args.topic, p, Offset::Beginning)?;
            ends.push((p, records_in_partition(args.records, p)));
        }
        consumer.assign(&list)?;
        Ok((consumer, ends))
    }

    /// Tracks the next offset of each partition against its end.
    struct Progress {
        next: Vec<(i32, i64, i64)>,
    }

    impl Progress {
        fn new(ends: &[(i32, i64)]) -> Progress {
            Progress {
                next: ends.iter().map(|(p, e)| (*p, 0, *e)).collect(),
            }
        }
        fn saw(&mut self, partition: i32, offset: i64) {
            if let Some(e) = self.next.iter_mut().find(|e| e.0 == partition) {
                e.1 = e.1.max(offset + 1);
            }
        }
        fn done(&self) -> bool {
            self.next.iter().all(|(_, next, end)| next >= end)
        }
    }

    /// The source's ceiling: two consumers read their partitions to the end.
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

    struct Row {
        part: i32,
        off: i64,
        id: i64,
        ts: SystemTime,
        payload: Vec<u8>,
    }

    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: i64,
    }

    /// The machine's ceiling: per subtask, a consumer thread converts batches
    /// (JSON parsed for the id, as the sink does) and an async task COPYs each
    /// batch (autocommit: no checkpoints, no explicit transactions).
    fn minimal_loop(args: &Args) -> Result<()> {
        let started = Instant::now();
        let rt = tokio::runtime::Runtime::new()?;
        let mut consumers = Vec::new();
        let mut writers = Vec::new();
        for s in 0..PARALLELISM {
            let (consumer, ends) = open(args, &owned_partitions(s))?;
            let client = rt.block_on(pg_connect(&args.pg_url))?;
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<Row>>(4);
            let follow = args.follow;
            consumers.push(std::thread::spawn(move || -> Result<u64> {
                let mut progress = Progress::new(&ends);
                let mut records = 0;
                while follow || !progress.done() {
                    let mut batch = Vec::with_capacity(BATCH);
                    let deadline = Instant::now() + Duration::from_millis(100);
                    while batch.len() < BATCH {
                        let wait = if batch.is_empty() {
                            deadline.saturating_duration_since(Instant::now())
                        } else {
                            Duration::ZERO
                        };
                        match consumer.poll(wait) {
                            Some(Ok(m)) => {
                                let payload = m.payload().unwrap_or_default().to_vec();
                                let id = serde_json::from_slice::<IdOnly>(&payload)?.id;
                                let ms = m.timestamp().to_millis().unwrap_or(0);
                                progress.saw(m.partition(), m.offset());
                                batch.push(Row {
                                    part: m.partition(),
                                    off: m.offset(),
                                    id,
                                    ts: UNIX_EPOCH + Duration::from_millis(ms as u64),
                                    payload,
                                });
                            }
                            Some(Err(e)) => eprintln!("consumer error: {e}"),
                            None if !batch.is_empty() || Instant::now() >= deadline => break,
                            None => {}
                        }
                    }
                    if !batch.is_empty() {
                        records += batch.len() as u64;
                        if tx.blocking_send(batch).is_err() {
                            bail!("the COPY task stopped");
                        }
                    }
                }
                Ok(records)
            }));
            let statement = copy_sql(&args.table);
            // Rows stream into one COPY (autocommit) like the sink's: it ends
            // after LOOP_COPY_SEGMENT_BYTES, or as soon as no batch is
            // waiting, so rows become visible without delay.
            writers.push(rt.spawn(async move {
                let mut rows = 0;
                let mut open: Option<std::pin::Pin<Box<BinaryCopyInWriter>>> = None;
                let mut bytes = 0;
                loop {
                    let batch = match rx.try_recv() {
                        Ok(batch) => batch,
                        Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                            if let Some(mut writer) = open.take() {
                                rows += writer.as_mut().finish().await?;
                                bytes = 0;
                            }
                            match rx.recv().await {
                                Some(batch) => batch,
                                None => break,
                            }
                        }
                        Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => break,
                    };
                    let writer = match &mut open {
                        Some(writer) => writer,
                        None => open.insert(Box::pin(BinaryCopyInWriter::new(
                            client.copy_in(&statement).await?,
                            &COPY_TYPES,
                        ))),
                    };
                    for r in &batch {
                        let payload = RawJsonb(&r.payload);
                        writer
                            .as_mut()
                            .write(&[&r.part, &r.off, &r.id, &r.ts, &payload])
                            .await?;
                        bytes += r.payload.len();
                    }
                    if bytes >= LOOP_COPY_SEGMENT_BYTES {
                        if let Some(mut writer) = open.take() {
                            rows += writer.as_mut().finish().await?;
                        }
                        bytes = 0;
                    }
                }
                if let Some(mut writer) = open.take() {
                    rows += writer.as_mut().finish().await?;
                }
                anyhow::Ok(rows)
            }));
        }
        eprintln!(
            "[baseline] loop: assigned and connected after {:.0?}",
            started.elapsed()
        );
        println!("ready");
        let mut consumed = 0;
        for c in consumers {
            consumed += c.join().map_err(|_| anyhow!("a consumer panicked"))??;
        }
        let mut written = 0;
        for w in writers {
            written += rt.block_on(w)??;
        }
        eprintln!("[baseline] loop: {written} rows after {:.0?}", started.elapsed());
        println!("records={consumed}");
        println!("rows={written}");
        Ok(())
    }
}
