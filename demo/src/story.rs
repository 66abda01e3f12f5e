//! The demo's steps, each printed as one numbered line (and a detail line
//! or two), ending in the verdict.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use exactly::config::PipelineFile;
use exactly::core::fault;
use exactly_testkit::{KafkaBroker, PostgresServer};

use crate::logfile::LogFile;
use crate::orders::{self, NAME, ORDERS, PARTITIONS};

/// Where the first run dies: right after the second persisted checkpoint
/// that lists prepared transactions (of any region), before any of them is
/// committed. Counting only checkpoints with something pending makes sure
/// the kill leaves transactions to finish, however fast the source reads.
const CRASH_AT: &str = "coordinator.after_persist_pending:2";

/// Lines of the log a failure of the pipeline shows.
const TAIL_LINES: usize = 15;

/// Why the demo stopped.
pub(crate) struct Failure {
    /// What went wrong.
    pub(crate) error: anyhow::Error,
    /// The log file, once there is one.
    pub(crate) log: Option<PathBuf>,
    /// The end of the log, when the pipeline failed (its error is there).
    pub(crate) log_tail: Option<String>,
}

/// Runs the demo in `dir` (a fresh temporary folder when `None`).
pub(crate) fn run(dir: Option<PathBuf>) -> Result<(), Failure> {
    let early = |error: anyhow::Error| Failure {
        error,
        log: None,
        log_tail: None,
    };
    let dir = working_folder(dir).map_err(early)?;
    let log = LogFile::install(dir.join("demo.log")).map_err(early)?;
    steps(&dir, &log).map_err(|error| Failure {
        log_tail: error.downcast_ref::<PipelineError>().map(|_| log.tail(TAIL_LINES)),
        error,
        log: Some(log.path().to_path_buf()),
    })
}

/// The pipeline's process ended otherwise than the step expected: the
/// reason is at the end of the log.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PipelineError(String);

/// `dir`, checked new or empty, or a fresh temporary folder that is kept
/// (it holds the log).
fn working_folder(dir: Option<PathBuf>) -> Result<PathBuf> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            // A used folder holds the topic and checkpoints of an earlier
            // run, which the new run would resume instead of starting over.
            if std::fs::read_dir(&d)?.next().is_some() {
                bail!(
                    "demo folder {} is not empty: pass a new or empty folder to --dir (or none for a temporary one)",
                    d.display()
                );
            }
            Ok(d)
        }
        None => Ok(tempfile::Builder::new()
            .prefix("exactly-demo-")
            .tempdir()
            .context("creating a temporary folder")?
            .keep()),
    }
}

fn steps(dir: &Path, log: &LogFile) -> Result<()> {
    let started = Instant::now();
    println!("exactly demo: Kafka -> PostgreSQL, exactly once across a SIGKILL");
    println!("   every log line goes to {}", log.path().display());

    println!(
        "1. starting Apache Kafka {} and a throwaway PostgreSQL",
        exactly_testkit::kafka::KAFKA_VERSION
    );
    let kafka = KafkaBroker::start_persistent(dir.join("broker")).context("starting the Kafka broker")?;
    // Its own server, whatever EXACTLY_DATABASE_URL says: the demo creates
    // table `orders` and reads every prepared transaction of the server.
    let postgres = PostgresServer::start_own().context("starting PostgreSQL")?;
    println!("   broker {}, database {}", kafka.bootstrap(), postgres.url());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;

    println!("2. producing {ORDERS} orders into topic `{NAME}` ({PARTITIONS} partitions)");
    runtime.block_on(orders::produce(kafka.bootstrap()))?;

    let file = dir.join("orders-to-pg.toml");
    std::fs::write(&file, pipeline_file(kafka.bootstrap(), postgres.url()))
        .with_context(|| format!("writing {}", file.display()))?;
    println!(
        "3. running the pipeline ({}): Kafka -> PostgreSQL, 2 subtasks, a checkpoint every 50 ms",
        file.display()
    );
    let status = run_pipeline(&file, log, Some(CRASH_AT))?;
    if status.signal() != Some(libc::SIGKILL) {
        return Err(PipelineError(format!(
            "the first run was to be killed at its crash point ({}={CRASH_AT}); it ended with {status}",
            fault::CRASH_AT_ENV
        ))
        .into());
    }
    let region = log
        .last_after(fault::CRASH_MARKER)
        .and_then(|marker| crash_region(&marker))
        .ok_or_else(|| PipelineError("the first run died, but not at its crash point".into()))?;
    let config = PipelineFile::load(&file)?;
    let report = runtime.block_on(exactly::ops::status::status(&config))?;
    let checkpoint = report
        .checkpoints
        .iter()
        .find(|s| s.region == Some(region))
        .and_then(|s| s.latest.as_ref())
        .map(|c| c.id)
        .ok_or_else(|| anyhow!("region {region} of the killed pipeline has no complete checkpoint"))?;
    println!(
        "4. killing the pipeline with SIGKILL right after checkpoint {checkpoint} of region {region} was persisted, \
         before its COMMIT PREPARED"
    );
    let rows = runtime.block_on(orders::rows(postgres.url()))?;
    let prepared = report.prepared_transactions.unwrap_or_default();
    let listed = prepared.iter().filter(|p| p.listed).count();
    println!(
        "   left behind: {rows} rows committed; prepared transactions: {listed} listed by a checkpoint \
         (recovery commits them), {} not (recovery rolls them back)",
        prepared.len() - listed
    );

    println!("5. restarting it: recovery finishes what the checkpoints list, then the pipeline reads on to the end");
    let status = run_pipeline(&file, log, None)?;
    if !status.success() {
        return Err(PipelineError(format!("the restarted pipeline failed ({status})")).into());
    }

    println!("6. checking the table against the orders produced");
    let verdict = runtime.block_on(orders::verdict(postgres.url()))?;
    println!("   produced        {ORDERS}");
    println!("   rows in table   {}", verdict.rows);
    println!("   duplicates      {}", verdict.duplicates);
    println!("   missing         {}", verdict.missing);
    if !verdict.exactly_once() {
        bail!("exactly-once violated: {verdict:?}");
    }
    println!("exactly once: OK ({:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}

/// The region of a crash marker's line (`point=… subtask=<region> hit=…`:
/// the coordinator's points count per region).
fn crash_region(marker: &str) -> Option<usize> {
    marker
        .split_whitespace()
        .find_map(|field| field.strip_prefix("subtask="))?
        .parse()
        .ok()
}

/// The pipeline file: the orders of the README, read by 2 subtasks,
/// checkpointed every 50 ms.
fn pipeline_file(bootstrap: &str, url: &str) -> String {
    format!(
        r#"name = "orders-to-pg"
guarantee = "exactly-once"
parallelism = 2
batch_size = 100

[checkpoint]
dir = "checkpoints"
interval = "50ms"

{sections}"#,
        sections = exactly::config::orders_sections(bootstrap, NAME, url, NAME)
    )
}

/// Runs `exactly run file` in a child process (this binary, see
/// [`crate::PIPELINE_ARG`]), its output into the log, with the crash point
/// `crash_at` or none; waits for it to end.
fn run_pipeline(file: &Path, log: &LogFile, crash_at: Option<&str>) -> Result<ExitStatus> {
    let exe = std::env::current_exe().context("finding the demo's own binary")?;
    let mut command = Command::new(exe);
    command
        .arg(crate::PIPELINE_ARG)
        .arg("run")
        .arg(file)
        .stdin(std::process::Stdio::null())
        .stdout(log.for_child()?)
        .stderr(log.for_child()?);
    if std::env::var_os("RUST_LOG").is_none() {
        command.env("RUST_LOG", "info");
    }
    for name in fault::VARIABLES {
        command.env_remove(name);
    }
    if let Some(point) = crash_at {
        command.env(fault::CRASH_AT_ENV, point);
    }
    command.status().context("starting the pipeline's process")
}
