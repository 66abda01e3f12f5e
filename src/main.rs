//! The `exactly` command: run a pipeline from a TOML file, inspect its
//! checkpoints, or run the self-verifying demo.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use exactly::config::PipelineFile;
use exactly::core::CheckpointStore;

#[derive(Parser)]
#[command(name = "exactly", version, about = "End-to-end exactly-once data pipelines")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a pipeline until its sources finish or SIGINT/SIGTERM; on a signal take
    /// a last checkpoint and commit it before exiting.
    Run {
        /// The pipeline file.
        file: PathBuf,
        /// Resume even if the latest checkpoint was written by a different pipeline definition.
        #[arg(long)]
        allow_fingerprint_change: bool,
    },
    /// Inspect a pipeline's externalized checkpoints.
    Checkpoints {
        #[command(subcommand)]
        command: CheckpointCmd,
    },
    /// Self-verifying demo on embedded defaults: generate records, run the
    /// pipeline, SIGKILL it mid-stream, restart it, and check every record is in
    /// the output exactly once.
    Demo {
        /// Working folder (default: a fresh temporary folder).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum CheckpointCmd {
    /// List entries, oldest first, marking unreadable ones.
    List {
        /// The pipeline file.
        file: PathBuf,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Cmd::Run {
            file,
            allow_fingerprint_change,
        } => run(&file, allow_fingerprint_change),
        Cmd::Checkpoints {
            command: CheckpointCmd::List { file },
        } => list_checkpoints(&file),
        Cmd::Demo { dir } => demo(dir),
    }
}

fn run(file: &Path, allow_fingerprint_change: bool) -> Result<()> {
    let mut config = PipelineFile::load(file)?;
    config.checkpoint.allow_fingerprint_change |= allow_fingerprint_change;
    let pipeline = config.build()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let summary = runtime.block_on(pipeline.run(shutdown_signal()))?;
    println!("{}", serde_json::to_string(&summary.metrics)?);
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn list_checkpoints(file: &Path) -> Result<()> {
    let config = PipelineFile::load(file)?;
    let store = config.store();
    let names = store.list()?;
    if names.is_empty() {
        println!("no checkpoints in {}", store.location());
    }
    for n in names {
        match store.read(&n.file_name) {
            Ok(e) => {
                let pending: usize = e.checkpoint.pending.values().map(Vec::len).sum();
                println!(
                    "{}  id={} splits={} pending_transactions={}",
                    n.file_name,
                    n.id,
                    e.checkpoint.positions.0.len(),
                    pending
                );
            }
            Err(problem) => println!("{}  UNREADABLE: {problem}", n.file_name),
        }
    }
    Ok(())
}

fn demo(dir: Option<PathBuf>) -> Result<()> {
    let _tmp;
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            d
        }
        None => {
            _tmp = tempfile_dir()?;
            _tmp.clone()
        }
    };
    let (splits, per_split) = (4usize, 5_000i64);
    let file = dir.join("demo.toml");
    std::fs::write(
        &file,
        format!(
            r#"name = "demo"
guarantee = "exactly-once"
parallelism = 2
[checkpoint]
dir = "checkpoints"
interval = "200ms"
[source.sequence]
splits = {splits}
records_per_split = {per_split}
batch = 50
delay_per_poll = "2ms"
[sink.file]
dir = "out"
"#
        ),
    )?;
    let exe = std::env::current_exe()?;
    println!("demo folder: {}", dir.display());
    println!("1. running the pipeline; it will be killed with SIGKILL right after checkpoint 5 is persisted, before any sink commits it");
    let status = Command::new(&exe)
        .args(["run", file.to_str().context("non-UTF-8 path")?])
        .env("EXACTLY_CRASH_AT", "coordinator.after_persist:5")
        .status()?;
    use std::os::unix::process::ExitStatusExt;
    println!("   first run ended by signal {:?}", status.signal());
    println!("2. restarting from the latest checkpoint");
    let status = Command::new(&exe).args(["run", file.to_str().unwrap()]).status()?;
    if !status.success() {
        bail!("the restarted pipeline failed: {status}");
    }
    let lines = exactly::file::read_committed_lines(&dir.join("out"))?;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for l in &lines {
        *counts.entry(l.as_str()).or_default() += 1;
    }
    let expected = exactly::core::SequenceSourceFactory {
        splits,
        records_per_split: per_split,
        batch: 0,
        delay_per_poll: Default::default(),
    }
    .expected_values();
    let missing = expected.iter().filter(|v| !counts.contains_key(v.as_str())).count();
    let duplicates: usize = counts.values().map(|c| c.saturating_sub(1)).sum();
    println!("3. verification");
    println!("   produced   {}", expected.len());
    println!("   in output  {}", lines.len());
    println!("   duplicates {duplicates}");
    println!("   missing    {missing}");
    if duplicates != 0 || missing != 0 || lines.len() != expected.len() {
        bail!("exactly-once violated");
    }
    println!("exactly once: OK");
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("exactly-demo-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
