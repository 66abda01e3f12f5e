//! `exactly run`: a pipeline until its sources finish or SIGINT/SIGTERM,
//! with the metrics and health endpoint, the lag monitor and the progress
//! line beside it.

use std::path::Path;

use anyhow::Result;

use crate::config::{parse_listen, PipelineFile};
use crate::ops;
use crate::plugins::Connectors;

/// The `--allow-*` flags of `exactly run`: each adds to the pipeline file's
/// key of the same name in `[checkpoint]`.
#[derive(Debug, clap::Args)]
pub struct RunFlags {
    /// Resume even if the latest checkpoint was written by a different pipeline definition.
    #[arg(long)]
    pub allow_fingerprint_change: bool,
    /// Resume from a checkpoint taken at another parallelism: the new sink
    /// subtasks commit what the old ones left pending and abort the rest.
    #[arg(long)]
    pub allow_parallelism_change: bool,
    /// Start as if for the first time although the checkpoint folder has a
    /// history none of whose entries can be read (they are kept as
    /// `<name>.unreadable`): sources go back to `start`.
    #[arg(long)]
    pub allow_first_start: bool,
    /// Restore the newest readable checkpoint although newer entries cannot
    /// be read and the sinks cannot prove that nothing after it was
    /// committed: the records after it are written again (duplicates).
    #[arg(long)]
    pub allow_fallback: bool,
    /// Wait as a hot standby while another process runs the pipeline, and
    /// take over as soon as it stops (adds to `[checkpoint] standby`).
    #[arg(long)]
    pub standby: bool,
}

pub(super) fn run(file: &Path, flags: RunFlags, metrics_listen: Option<String>, connectors: &Connectors) -> Result<()> {
    let mut config = PipelineFile::load_with(file, connectors)?;
    let listen = match metrics_listen {
        Some(address) => Some(parse_listen(&address, "command line", "--metrics-listen")?),
        None => config.metrics.listen_address(&file.display().to_string())?,
    };
    config.checkpoint.allow_fingerprint_change |= flags.allow_fingerprint_change;
    config.checkpoint.allow_parallelism_change |= flags.allow_parallelism_change;
    config.checkpoint.allow_first_start |= flags.allow_first_start;
    config.checkpoint.allow_fallback |= flags.allow_fallback;
    config.checkpoint.standby |= flags.standby;
    let built = config.build_parts()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let summary = runtime.block_on(async {
        let observed = ops::observe(&config, &built);
        let mut background = ops::Background::default();
        let server = match listen {
            Some(address) => Some(ops::server::MetricsServer::start(address, observed.clone()).await?),
            None => None,
        };
        if server.is_some() || ops::progress::enabled() {
            background.push(ops::spawn_lag_monitor(&config, &observed, ops::lag_interval(&config)));
            background.push(Some(tokio::spawn(ops::progress::run(observed))));
        }
        let summary = built.pipeline.run(shutdown_signal()).await?;
        drop(background);
        drop(server);
        anyhow::Ok(summary)
    })?;
    println!("{}", serde_json::to_string(&summary.metrics)?);
    Ok(())
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed here, when
/// it is called, not when the future is first polled: a signal that comes
/// while the pipeline is still starting (a worker joining, a lock being
/// taken) asks for a clean stop instead of killing the process.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = term.recv() => {}
        }
    }
}
