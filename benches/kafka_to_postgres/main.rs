//! `cargo bench --bench kafka_to_postgres`: Kafka → PostgreSQL throughput,
//! checkpoint durations, COPYs and transactions, end-to-end latency and
//! peak memory of `exactly run` on Apache Kafka, side by side with the
//! ceilings of the same machine (see BENCHMARKS.md).
//!
//! Workload: `EXACTLY_BENCH_RECORDS` (default 1,000,000) JSON records of about
//! 100 bytes, preloaded into a topic with 4 partitions, delivered into a
//! PostgreSQL table with a primary key, parallelism 2, checkpoints every 1 s.
//! The keyed rows (`eo-upsert`, `eo-debezium`) read as many changes to a
//! quarter as many keys, every tenth a delete (`changes.rs`), and check the
//! table against the last change of every key.
//!
//! Every measured run is a child process (the `exactly` release binary, or this
//! bench binary re-executed in a baseline role), so its peak RSS comes from
//! `wait4` and its throughput from the wall-clock time between spawn and exit.
//! Pipelines are bounded (`stop_at_end = true`): they read up to the end
//! offsets the broker reports at start, take a last checkpoint, commit and
//! exit, like the baselines, which also stop at those ends. With
//! `EXACTLY_BENCH_STOP_AT_END=0` they read unbounded and get SIGTERM (last
//! checkpoint, commit, exit) once a persisted checkpoint has read every
//! record, which adds up to one checkpoint interval.
//!
//! The files: `services.rs` (broker, PostgreSQL, Redis), `input.rs` (the
//! topic), `pipelines.rs` (the exactly rows), `baselines.rs` (raw COPY, raw
//! librdkafka consume, the minimal loop), `changes.rs` (the keyed
//! workloads), `fetched.rs` (the raw fetch and
//! the minimal loop's reader, on exactly-kafka-wire's fetcher, as the
//! source reads), `hand_loop.rs` (the hand-written
//! exactly-once loop), `child.rs` (spawning and reaping the runs),
//! `measure.rs` (CPU, RSS, transactions), `latency.rs` (the latency
//! phase), `report.rs` (the table), `runs.rs` (which runs, which settings),
//! `workload.rs` (records, table, COPY).
//!
//! Settings (environment variables):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `EXACTLY_BENCH_RECORDS` | 1000000 | records preloaded and delivered per run |
//! | `EXACTLY_BENCH_LATENCY_RATE` | 2000 | records/s produced during the latency phase |
//! | `EXACTLY_BENCH_LATENCY_SECS` | 20 | length of the latency phase (0 skips it) |
//! | `EXACTLY_BENCH_RUNS` | `loop,copy,fetch,consume,hand,eo,eo-kv,alo,redis,pg-fenced,eo-upsert,eo-debezium` then `loop,hand,eo,eo-kv,alo` twice | the runs, in order (a repeated run only repeats the throughput measurement); also the diagnostic `eo-no-discovery` |
//! | `EXACTLY_BENCH_SOURCE_EXTRA` | — | TOML lines appended to every pipeline's `[source.kafka]` (experiments) |
//! | `EXACTLY_BENCH_STOP_AT_END` | 1 | 0: pipelines read unbounded and end by SIGTERM once a persisted checkpoint has read everything |
//! | `EXACTLY_BENCH_PRELOAD_LINGER_MS` | 20 | `linger.ms` of the producer that preloads the topic |
//! | `EXACTLY_BENCH_EXACTLY` | the binary cargo built | another `exactly` binary to run (comparing builds) |
//! | `EXACTLY_KAFKA_BOOTSTRAP` | — | an external Kafka to use instead of a broker of the bench's own (the topics must not exist there) |

// A benchmark binary has no public API: the workspace's API lints
// (missing_docs, unreachable_pub, missing_debug_implementations) do not apply.
#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

mod baselines;
mod changes;
mod child;
mod fetched;
mod hand_loop;
mod input;
mod latency;
mod measure;
mod pipelines;
mod report;
mod runs;
mod services;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::baselines::spawn_baseline;
use crate::changes::Changes;
use crate::child::log_dir;
use crate::latency::{latency_run, Latency};
use crate::measure::{pg_next_xid, redis_scripts_run, vm_hwm_kib, CpuProbe, CpuUse};
use crate::pipelines::{final_metrics, run_to_end, write_pipeline};
use crate::runs::{Kind, Settings};
use crate::services::{redis_counts, Pg, Services};
use crate::workload::{order_json, target_name, BATCH, CHECKPOINT_INTERVAL, PARALLELISM, PARTITIONS, TOPIC};

/// The longest a throughput run may take before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(1800);

fn main() -> Result<()> {
    if let Ok(role) = std::env::var(baselines::ROLE_ENV) {
        return baselines::main(&role);
    }
    // `cargo test --all-targets` runs harness-less benches without `--bench`:
    // only `cargo bench` starts the (long) measurement.
    if !std::env::args().any(|a| a == "--bench") {
        println!("kafka_to_postgres is a benchmark: run it with `cargo bench --bench kafka_to_postgres`");
        return Ok(());
    }
    bench()
}

/// The services and paths every run uses.
pub struct Ctx {
    cpu: CpuProbe,
    /// The release `exactly` binary.
    exactly: PathBuf,
    /// This bench, re-executed for the baselines.
    me: PathBuf,
    /// Pipeline files and checkpoints.
    work: PathBuf,
    bootstrap: String,
    pg_url: String,
    redis_url: String,
    /// The bench's own PostgreSQL connection (tables, checks, counters).
    pg: Pg,
    settings: Settings,
}

/// What one run measured.
#[derive(Default)]
pub struct Outcome {
    /// `loop`, `eo`, ...; `loop-2` for a run listed a second time.
    name: String,
    records_per_s: Option<f64>,
    wall: Duration,
    checkpoints: Vec<u64>,
    ready_after: Option<Duration>,
    rss_kib: Option<i64>,
    cpu: Option<CpuUse>,
    /// The run's process's context switches (all its threads): waiting,
    /// preempted.
    context_switches: Option<(u64, u64)>,
    /// Between the CPU samples: the run and the wait for its backends.
    cpu_wall: Duration,
    /// COPYs of rows the run finished.
    copies: Option<u64>,
    /// Write transactions PostgreSQL counted (Redis: fenced scripts).
    transactions: Option<u64>,
    latency: Option<Latency>,
    problems: Vec<String>,
    notes: Vec<String>,
}

fn bench() -> Result<()> {
    let settings = Settings::from_env()?;
    let exactly = std::env::var_os("EXACTLY_BENCH_EXACTLY")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_exactly")), PathBuf::from);
    if !exactly.is_file() {
        bail!(
            "the exactly binary is missing at {}: build it first with `cargo build --release --bin exactly` \
             (cargo bench normally builds it)",
            exactly.display()
        );
    }
    let work = tempfile::Builder::new().prefix("exactly-bench-").tempdir()?;
    eprintln!("[bench] work folder {}", work.path().display());
    let started = Instant::now();
    let services = Services::start()?;
    let pg = Pg::connect(services.postgres.url())?;
    let ctx = Ctx {
        cpu: CpuProbe::new(
            services.broker_pid(),
            services.postgres.data_dir(),
            services.redis.url(),
        ),
        exactly,
        me: std::env::current_exe()?,
        work: work.path().to_path_buf(),
        bootstrap: services.kafka().bootstrap().to_string(),
        pg_url: services.postgres.url().to_string(),
        redis_url: services.redis.url().to_string(),
        pg,
        settings,
    };
    let environment = describe_environment(&ctx, &services)?;
    eprintln!("{environment}");

    let n = ctx.settings.records;
    eprintln!("[bench] preloading {n} records into `{TOPIC}` ({PARTITIONS} partitions)");
    let preload_started = Instant::now();
    input::preload(&ctx.pg.rt, &ctx.bootstrap, TOPIC, n, ctx.settings.preload_linger_ms)?;
    let preload_time = preload_started.elapsed();
    let preload_rate = n as f64 / preload_time.as_secs_f64();
    eprintln!("[bench] preloaded in {preload_time:.1?} ({preload_rate:.0} records/s)");
    // The keyed topics of the upsert and Debezium rows, when they run.
    let keyed: std::collections::BTreeSet<Changes> = ctx.settings.kinds.iter().filter_map(|k| k.changes()).collect();
    for changes in keyed {
        eprintln!(
            "[bench] preloading {n} changes to {} keys into `{}`",
            changes::keys(n),
            changes.topic()
        );
        input::preload_changes(&ctx.pg.rt, &ctx.bootstrap, changes, n, ctx.settings.preload_linger_ms)?;
    }

    // Warm-up, unmeasured: one run of the minimal loop, so that no measured
    // run pays for a cold start of the services. The broker's JVM compiles
    // its fetch path on the first reads, and PostgreSQL creates the WAL
    // segments the first million rows need (later runs recycle them).
    eprintln!("[bench] warm-up: the minimal loop, unmeasured");
    let warmup_table = target_name("warm-up", "tp");
    ctx.pg.fresh_table(&warmup_table, Kind::MinimalLoop.table_shape())?;
    let warmup =
        spawn_baseline(&ctx, Kind::MinimalLoop, "warm-up", TOPIC, &warmup_table, false)?.finish(RUN_TIMEOUT)?;
    if !warmup.success() {
        bail!(
            "the warm-up run ended with {}; last log lines:\n{}",
            warmup.describe_status(),
            warmup.log.log_tail
        );
    }
    ctx.pg.cleanup_table(&warmup_table)?;
    eprintln!("[bench] warm-up took {:.1?}", warmup.wall);
    let mut results: Vec<(Kind, Outcome)> = Vec::new();
    for kind in ctx.settings.kinds.clone() {
        eprintln!("[bench] --- {} --- (load average {})", kind.label(), load_average());
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
    let broker_hwm = services
        .broker_pid()
        .and_then(|pid| vm_hwm_kib(&pid.to_string()))
        .map_or("—".to_string(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
    println!();
    println!("{environment}");
    println!("preload: {n} records produced in {preload_time:.1?} ({preload_rate:.0} records/s)");
    println!(
        "whole bench: {:.0?} from the services' start; load average at end {}; broker JVM peak RSS {broker_hwm}",
        started.elapsed(),
        load_average()
    );
    println!("child logs: {}", log_dir().display());
    println!();
    report::print_table(&ctx, &results);
    // The bench's connection first, so it does not see its server go away.
    drop(ctx);
    drop(services);
    Ok(())
}

pub fn num_cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// The 1, 5 and 15 minute load averages.
fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn describe_environment(ctx: &Ctx, services: &Services) -> Result<String> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let s = &ctx.settings;
    Ok(format!(
        "machine: {} cores ({cpu}), {mem_gib:.1} GiB memory, load average at start {}\n\
         broker: {}\n\
         PostgreSQL {} (test kit: fsync = off); Redis from the test kit (no persistence)\n\
         workload: {} records of ~{} bytes, {PARTITIONS} partitions, parallelism {PARALLELISM}, \
         checkpoint interval {CHECKPOINT_INTERVAL:?}, batch {BATCH}\n\
         latency phase: {} records/s for {} s per run",
        num_cores(),
        load_average(),
        services.describe_broker(),
        ctx.pg.server_version()?,
        s.records,
        order_json(s.records / 2).len(),
        s.latency_rate,
        s.latency_secs
    ))
}

/// The `name=N` line a baseline printed.
fn printed(stdout: &str, name: &str) -> Option<u64> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.trim().parse().ok())
}

/// Run `name` of `kind` once over the preloaded topic: its time, CPU, COPYs
/// and transactions; then the check that the target holds every record
/// exactly once, without which the speed means nothing.
fn throughput_run(ctx: &Ctx, kind: Kind, name: &str, outcome: &mut Outcome) -> Result<()> {
    let n = ctx.settings.records;
    let target = target_name(name, "tp");
    if kind.writes_postgres() {
        ctx.pg.fresh_table(&target, kind.table_shape())?;
    }
    let xid_before = ctx.pg.rt.block_on(pg_next_xid(&ctx.pg.client))?;
    let scripts_before = match kind {
        Kind::RedisFenced => Some(redis_scripts_run(&ctx.redis_url)?),
        _ => None,
    };
    let cpu_before = ctx.cpu.sample();
    let cpu_started = Instant::now();
    let finished = if kind.is_pipeline() {
        let bounded = ctx.settings.stop_at_end;
        let pipeline = format!("{name}-tp");
        let topic = kind.changes().map_or(TOPIC, Changes::topic);
        let file = write_pipeline(ctx, kind, &pipeline, topic, &target, bounded)?;
        run_to_end(ctx, &pipeline, &file, bounded, RUN_TIMEOUT)?
    } else {
        spawn_baseline(ctx, kind, name, TOPIC, &target, false)?.finish(RUN_TIMEOUT)?
    };
    // Let the run's PostgreSQL backends exit and be reaped (their CPU time
    // then counts in the postmaster's children time).
    std::thread::sleep(Duration::from_millis(500));
    let cpu_after = ctx.cpu.sample();
    outcome.cpu_wall = cpu_started.elapsed();
    outcome.cpu = Some(CpuUse::between(
        finished.cpu_s,
        cpu_before,
        cpu_after,
        kind == Kind::RedisFenced,
    ));
    let xid_after = ctx.pg.rt.block_on(pg_next_xid(&ctx.pg.client))?;
    outcome.transactions = match scripts_before {
        Some(before) => Some(redis_scripts_run(&ctx.redis_url)?.saturating_sub(before)),
        None if kind.writes_postgres() => Some((xid_after - xid_before).max(0) as u64),
        None => None,
    };
    outcome.wall = finished.wall;
    outcome.rss_kib = Some(finished.max_rss_kib);
    outcome.context_switches = Some(finished.context_switches);
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
        let metrics = final_metrics(&finished)?;
        for key in ["checkpoints_failed", "dead_letters", "restarts"] {
            let v = metrics.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0);
            if v > 0 {
                outcome.notes.push(format!("{key} = {v} in the throughput run"));
            }
        }
        if kind.writes_postgres() {
            let log = &finished.log;
            if log.copies == 0 {
                outcome.notes.push(
                    "the sink logged no \"rows written\" line at debug level, so its COPYs are not counted".into(),
                );
            } else {
                outcome.copies = Some(log.copies);
                // The keyed rows merge changes by key: fewer rows than records.
                if log.copied_rows != n && kind.changes().is_none() {
                    outcome.notes.push(format!(
                        "the sink's COPYs carried {} rows for {n} records (rows of aborted transactions count too)",
                        log.copied_rows
                    ));
                }
            }
        }
    } else {
        outcome.copies = printed(&finished.stdout, "copies");
    }
    // Check that everything arrived exactly once before believing the speed.
    match kind {
        Kind::RawConsume | Kind::RawFetch => {
            let consumed = printed(&finished.stdout, "records");
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
        _ if kind.changes().is_some() => {
            let changes = kind.changes().expect("a keyed run");
            let row = ctx.pg.rt.block_on(ctx.pg.client.query_one(
                &format!(
                    "SELECT count(*), coalesce(sum(version), 0)::bigint, \
                     (SELECT count(*) FROM pg_prepared_xacts) FROM {target}"
                ),
                &[],
            ))?;
            let (rows, versions, prepared): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
            let (expected_rows, expected_versions) = changes.final_state(n);
            if (rows, versions, prepared) != (expected_rows, expected_versions, 0) {
                bail!(
                    "table holds {rows} rows (sum of versions {versions}), expected the last change of every key: \
                     {expected_rows} rows (sum {expected_versions}); {prepared} prepared transactions left"
                );
            }
            let dead = final_metrics(&finished)?
                .get("dead_letters")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            if dead > 0 {
                bail!("{dead} dead letters: every record of the keyed workload is a valid change");
            }
        }
        _ => {
            let id = kind.table_shape().id_column();
            let row = ctx.pg.rt.block_on(ctx.pg.client.query_one(
                &format!(
                    "SELECT count(*), count(DISTINCT {id}), (SELECT count(*) FROM pg_prepared_xacts) FROM {target}"
                ),
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
        ctx.pg.cleanup_table(&target)?;
    }
    outcome.records_per_s = Some(n as f64 / finished.wall.as_secs_f64());
    eprintln!(
        "[bench] {name}: {n} records in {:.2?} = {:.0} records/s, peak RSS {:.1} MiB, {} checkpoints, \
         {} COPYs, {} transactions",
        finished.wall,
        n as f64 / finished.wall.as_secs_f64(),
        finished.max_rss_kib as f64 / 1024.0,
        finished.log.checkpoints.len(),
        outcome.copies.map_or("?".into(), |c| c.to_string()),
        outcome.transactions.map_or("?".into(), |c| c.to_string()),
    );
    Ok(())
}
