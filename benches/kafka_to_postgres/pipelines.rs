//! The exactly rows: a pipeline file per run, `exactly run` as a child, and
//! what the run printed about itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_core::FsCheckpointStore;

use crate::changes;
use crate::child::{log_dir, Finished, Running};
use crate::runs::Kind;
use crate::workload::{records_in_partition, TableShape, BATCH, CHECKPOINT_INTERVAL, PARALLELISM, PARTITIONS};
use crate::Ctx;

/// Writes `<work>/<name>.toml`: `topic` → `target` (a table, or a Redis
/// hash), bounded (`stop_at_end`) or not.
pub fn write_pipeline(ctx: &Ctx, kind: Kind, name: &str, topic: &str, target: &str, bounded: bool) -> Result<PathBuf> {
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
            let keyed = kind.changes().map_or("", changes::sink_settings);
            let columns = match kind.table_shape() {
                TableShape::Orders => {
                    r#"id = { from = "/id", type = "bigint" }
ts = { from = "timestamp", type = "timestamptz" }
payload = { from = "value", type = "jsonb" }"#
                }
                TableShape::KeyValue => {
                    r#"key = { from = "key", type = "text" }
value = { from = "value", type = "text" }"#
                }
                TableShape::Keyed => changes::COLUMNS,
            };
            format!(
                r#"[sink.postgres]
url = "{url}"
table = "{target}"
{mode}{keyed}
[sink.postgres.columns]
{coordinates}{columns}
"#,
                url = ctx.pg_url,
                // The keyed table has a row per key, not per record.
                coordinates = if kind.changes().is_some() {
                    ""
                } else {
                    "part = { from = \"partition\", type = \"int\" }\noff = { from = \"offset\", type = \"bigint\" }\n"
                }
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
interval = "{interval}ms"

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
        interval = CHECKPOINT_INTERVAL.as_millis(),
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

/// Starts `exactly run <file>`, its stderr kept in the log folder. The
/// PostgreSQL sink logs each COPY of rows it finishes at debug level (one
/// line per COPY, a few hundred per million records), which is how the
/// bench counts them.
pub fn spawn_pipeline(ctx: &Ctx, file: &Path) -> Result<Running> {
    let mut cmd = Command::new(&ctx.exactly);
    cmd.arg("run")
        .arg(file)
        .env("RUST_LOG", "info,exactly_postgres=debug")
        .env("NO_COLOR", "1")
        .env_remove("EXACTLY_CRASH_AT")
        .env_remove("EXACTLY_DELAY_AT");
    let stem = file.file_stem().unwrap_or_default().to_string_lossy();
    Running::spawn(cmd, &log_dir().join(format!("{stem}.log")))
}

/// The throughput run of pipeline `name` from `file`: bounded, it ends by
/// itself; unbounded, it gets SIGTERM (last checkpoint, commit, exit) as soon
/// as a persisted checkpoint has read every record. Its transactions are
/// committed before the process exits, which ends the measurement.
/// (Polling the sink instead costs PostgreSQL dearly: `max(off)` walks every
/// row of the open transaction.)
pub fn run_to_end(ctx: &Ctx, name: &str, file: &Path, bounded: bool, timeout: Duration) -> Result<Finished> {
    let running = spawn_pipeline(ctx, file)?;
    if !bounded {
        let store = FsCheckpointStore::new(file.with_file_name("checkpoints"), name, 1);
        let ends: Vec<(String, i64)> = (0..PARTITIONS)
            .map(|p| {
                (
                    format!("{}-{p}", crate::workload::TOPIC),
                    records_in_partition(ctx.settings.records, p),
                )
            })
            .collect();
        let deadline = Instant::now() + timeout;
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
    running.finish(timeout)
}

/// The final metrics `exactly run` prints (one JSON line on stdout).
pub fn final_metrics(finished: &Finished) -> Result<serde_json::Value> {
    match finished
        .stdout
        .lines()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        Some(metrics) => Ok(metrics),
        None => bail!(
            "the run printed no metrics line, so its failed checkpoints and dead letters are unknown; \
             its log is in {}",
            log_dir().display()
        ),
    }
}
