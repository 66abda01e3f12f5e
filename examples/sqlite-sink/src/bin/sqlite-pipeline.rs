//! The example pipeline, for the crash kit to run as a child process:
//! sequence source (4 splits × 1500 records) → SQLite sink, parallelism 2,
//! a checkpoint every 50 ms, no in-process restarts (the kit restarts the
//! process).
//!
//! `sqlite-pipeline <database> <checkpoint folder> <exactly-once|at-least-once> [correct|commit-at-pre-commit|abort-on-recover]`
//!
//! Exits 0 once the source is exhausted and the last checkpoint committed,
//! or on SIGINT after a last checkpoint.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use exactly_core::{FsCheckpointStore, Pipeline, PipelineConfig, RestartStrategy, SequenceSourceFactory};
use exactly_example_sqlite_sink::{Mode, SqliteSinkFactory};

/// The source of the example: what the crash test expects back.
fn source() -> SequenceSourceFactory {
    SequenceSourceFactory {
        splits: 4,
        records_per_split: 1500,
        batch: 20,
        delay_per_poll: Duration::from_millis(5),
    }
}

fn main() -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [database, checkpoints, guarantee, rest @ ..] = &args[..] else {
        return Err("usage: sqlite-pipeline <database> <checkpoint folder> <guarantee> [mode]".into());
    };
    let mode: Mode = rest.first().map_or(Ok(Mode::Correct), |m| m.parse())?;
    let mut config = PipelineConfig::new("sqlite-example");
    config.guarantee = guarantee.parse()?;
    config.parallelism = 2;
    config.checkpoint.interval = Duration::from_millis(50);
    config.restart = RestartStrategy::None;
    let store = FsCheckpointStore::for_pipeline(checkpoints, &config, 3);
    let pipeline = Pipeline::new(
        config,
        Arc::new(source()),
        Arc::new(SqliteSinkFactory {
            path: PathBuf::from(database),
            mode,
        }),
        Arc::new(store),
    )
    .map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let summary = runtime
        .block_on(pipeline.run(async {
            let _ = tokio::signal::ctrl_c().await;
        }))
        .map_err(|e| e.to_string())?;
    tracing::info!(last_checkpoint = ?summary.last_checkpoint, "finished");
    Ok(())
}
