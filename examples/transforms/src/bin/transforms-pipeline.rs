//! Runs the example pipeline (see the library): sequence source →
//! filter → map → flat_map → file sink.
//!
//! `transforms-pipeline <output folder> <checkpoint folder> [exactly-once|at-least-once]`
//!
//! Exits 0 once the source is exhausted and the last checkpoint committed,
//! or on SIGINT after a last checkpoint.

use std::path::PathBuf;

use exactly_core::Guarantee;

fn main() -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, checkpoints, rest @ ..] = &args[..] else {
        return Err("usage: transforms-pipeline <output folder> <checkpoint folder> [guarantee]".into());
    };
    let guarantee: Guarantee = rest.first().map_or(Ok(Guarantee::ExactlyOnce), |g| g.parse())?;
    let pipeline = exactly_example_transforms::pipeline(&PathBuf::from(out), &PathBuf::from(checkpoints), guarantee)
        .map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let summary = runtime
        .block_on(pipeline.run(async {
            let _ = tokio::signal::ctrl_c().await;
        }))
        .map_err(|e| e.to_string())?;
    tracing::info!(
        last_checkpoint = ?summary.last_checkpoint,
        filtered = summary.metrics.records_filtered,
        "finished"
    );
    Ok(())
}
