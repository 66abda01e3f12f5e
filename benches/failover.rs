//! Region failover against global failover, Kafka → PostgreSQL at
//! parallelism 8, through the release `exactly` binary:
//!
//! - with every sink subtask's pre-commit failing with probability 2 %
//!   (`EXACTLY_FAIL_AT=sink.pre_commit~0.02`): the share of checkpoints that
//!   complete, and the records read again per failure;
//! - without faults: throughput.
//!
//! ```text
//! cargo bench --bench failover
//! ```
//!
//! `EXACTLY_BENCH_FAILOVER_RECORDS` (default 3000000) sets the topic's size.
//! Every run reads the whole topic (`stop_at_end`) into a fresh table, which
//! must then hold every record exactly once.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_testkit::{KafkaBroker, PostgresServer};

const PARALLELISM: usize = 8;
const PARTITIONS: i32 = 8;
const FAILURE_PROBABILITY: &str = "0.02";
/// Records handed to the producer at once.
const PRODUCE_CHUNK: usize = 20_000;

struct Outcome {
    wall: Duration,
    completed: u64,
    failed: u64,
    restarts: u64,
    records_in: u64,
}

impl Outcome {
    /// Checkpoints that completed, of all that were started: a failure ends
    /// the checkpoint in flight of what it restarts (its region, or all).
    fn success_rate(&self) -> f64 {
        let started = self.completed + self.failed + self.restarts;
        self.completed as f64 / started.max(1) as f64
    }
}

fn main() -> Result<()> {
    let records: i64 = std::env::var("EXACTLY_BENCH_FAILOVER_RECORDS")
        .ok()
        .map(|v| v.parse().context("EXACTLY_BENCH_FAILOVER_RECORDS must be a number"))
        .transpose()?
        .unwrap_or(3_000_000);
    let exactly = Path::new(env!("CARGO_BIN_EXE_exactly"));
    if !exactly.to_string_lossy().contains("release") {
        bail!("run it as `cargo bench --bench failover` (it measures the release build of exactly)");
    }
    eprintln!("[failover] starting Apache Kafka and PostgreSQL from the test kit");
    let kafka = KafkaBroker::builder().heap("1g").start()?;
    let postgres = PostgresServer::start_own()?;
    let topic = "failover-orders";
    produce(kafka.bootstrap(), topic, records)?;

    // Each pair twice, interleaved, so a change of load on the machine
    // shows as a spread instead of favouring one mode.
    let plan = [false, false, true, true]
        .into_iter()
        .flat_map(|faults| [("region", faults), ("global", faults)]);
    let mut rows = Vec::new();
    for (failover, faults) in plan {
        eprintln!(
            "[failover] {failover} failover, {}",
            if faults { "2 % pre-commit failures" } else { "no faults" }
        );
        let load = load_average();
        let outcome = run(
            exactly,
            kafka.bootstrap(),
            postgres.url(),
            topic,
            records,
            failover,
            faults,
        )?;
        rows.push((failover, faults, load, outcome));
    }
    report(records, &rows);
    Ok(())
}

fn produce(bootstrap: &str, topic: &str, records: i64) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let admin = KafkaAdmin::new(bootstrap);
            admin.create_topic(topic, PARTITIONS).await?;
            // In chunks the producer's queue holds.
            for start in (0..records).step_by(PRODUCE_CHUNK) {
                let orders = (start..records.min(start + PRODUCE_CHUNK as i64)).map(|id| {
                    ProduceRecord::new(format!(
                        r#"{{"id":{id},"customer":"c{}","amount":{}.50}}"#,
                        id % 997,
                        id % 300
                    ))
                    .with_key(id.to_string())
                    .to_partition((id % PARTITIONS as i64) as i32)
                });
                admin.produce(topic, orders).await?;
            }
            anyhow::Ok(())
        })
}

fn run(
    exactly: &Path,
    bootstrap: &str,
    url: &str,
    topic: &str,
    records: i64,
    failover: &str,
    faults: bool,
) -> Result<Outcome> {
    let dir = tempfile::tempdir()?;
    // A table of its own per run: transaction names (and the commit log's
    // markers) carry the table, and every run starts its checkpoint ids anew.
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let table = format!("failover_{failover}_{}_{n}", if faults { "faults" } else { "clean" });
    let file = dir.path().join("pipeline.toml");
    std::fs::write(
        &file,
        format!(
            r#"name = "failover-{failover}"
parallelism = {PARALLELISM}
failover = "{failover}"
[checkpoint]
dir = "checkpoints"
interval = "100ms"
[restart]
strategy = "fixed"
delay = "100ms"
max_attempts = 50
{}"#,
            exactly::config::orders_sections(bootstrap, topic, url, &table)
        ),
    )?;
    let mut command = Command::new(exactly);
    command.arg("run").arg(&file).env("RUST_LOG", "warn");
    command.env_remove(exactly::core::fault::FAIL_AT_ENV);
    if faults {
        command.env(
            exactly::core::fault::FAIL_AT_ENV,
            format!("sink.pre_commit~{FAILURE_PROBABILITY}"),
        );
    }
    let started = Instant::now();
    let out = command.output().context("running exactly")?;
    let wall = started.elapsed();
    if !out.status.success() {
        bail!(
            "{failover} failover run failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let metrics: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .context("the run printed no metrics")?;
    let get = |key: &str| metrics[key].as_u64().unwrap_or_default();
    check_table(url, &table, records)?;
    Ok(Outcome {
        wall,
        completed: get("checkpoints_completed"),
        failed: get("checkpoints_failed"),
        restarts: get("restarts"),
        records_in: get("records_in"),
    })
}

/// Every record exactly once in `table`.
fn check_table(url: &str, table: &str, records: i64) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let row = client
                .query_one(
                    &format!("SELECT count(*), count(DISTINCT (part, off)) FROM {table}"),
                    &[],
                )
                .await?;
            let (rows, distinct): (i64, i64) = (row.get(0), row.get(1));
            if rows != records || distinct != records {
                bail!("{table}: {rows} rows, {distinct} distinct, of {records} records: not exactly once");
            }
            client.batch_execute(&format!("DROP TABLE {table}")).await?;
            anyhow::Ok(())
        })
}

/// The 1-minute load average, as `/proc/loadavg` gives it.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn report(records: i64, rows: &[(&str, bool, String, Outcome)]) {
    println!();
    println!("Kafka → PostgreSQL, {records} records, parallelism {PARALLELISM}, checkpoints every 100 ms");
    println!();
    println!("| failover | faults | records/s | checkpoints completed | success rate | restarts | records read again | per failure | load at start |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (failover, faults, load, o) in rows {
        let replayed = o.records_in.saturating_sub(records as u64);
        let per_failure = if o.restarts == 0 {
            "—".to_string()
        } else {
            format!("{:.0}", replayed as f64 / o.restarts as f64)
        };
        println!(
            "| {failover} | {} | {:.0} | {} | {:.1} % | {} | {replayed} | {per_failure} | {load} |",
            if *faults { "2 % of pre-commits fail" } else { "none" },
            records as f64 / o.wall.as_secs_f64(),
            o.completed,
            o.success_rate() * 100.0,
            o.restarts,
        );
    }
    println!();
    println!(
        "success rate: completed / (completed + aborted + failures); every failure ends the checkpoint in flight of what \
         it restarts (its region, or everything). Records read again: records the sources read beyond the topic's size."
    );
}
