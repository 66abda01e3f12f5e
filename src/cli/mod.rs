//! The `exactly` command as a library: [`main`] parses the command line
//! and runs `run`, `status` or `checkpoints` exactly as the `exactly`
//! binary does (its `main` is one call of it); [`main_with`] does the same
//! for a binary that registers connectors of its own ([`Connectors`]).
//!
//! Binaries return `anyhow` errors, and this is the binary's code: every
//! command ends in an [`anyhow::Error`] whose chain `main` prints.

mod inspect;
mod run;

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

use crate::ops::{self, logging::LogFormat};
pub use crate::plugins::Connectors;

pub use run::RunFlags;

#[derive(Parser)]
#[command(name = "exactly", version, about = "End-to-end exactly-once data pipelines")]
pub(crate) struct Cli {
    /// Log lines as text or as one JSON object per line (stderr; RUST_LOG filters).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Run a pipeline until its sources finish or SIGINT/SIGTERM; on a signal take
    /// a last checkpoint and commit it before exiting.
    Run {
        /// The pipeline file.
        file: PathBuf,
        #[command(flatten)]
        flags: RunFlags,
        /// Serve /metrics, /health/live and /health/ready here (e.g.
        /// 127.0.0.1:9464); overrides `[metrics] listen`.
        #[arg(long, value_name = "ADDRESS")]
        metrics_listen: Option<String>,
    },
    /// What a pipeline is doing, without running it or taking its lock:
    /// the latest complete checkpoint (id, age, positions), what it lists
    /// as pending, the sink's prepared transactions of the pipeline, and
    /// the consumer lag per partition.
    Status {
        /// The pipeline file.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Inspect a pipeline's externalized checkpoints.
    Checkpoints {
        #[command(subcommand)]
        command: CheckpointCmd,
    },
    /// The demo moved to a crate of its own (`cargo run --release -p
    /// exactly-demo`): this says so.
    #[command(hide = true)]
    Demo {
        /// Ignored.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<String>,
    },
}

#[derive(Subcommand)]
pub(crate) enum CheckpointCmd {
    /// List entries, oldest first, marking unreadable ones.
    List {
        /// The pipeline file.
        file: PathBuf,
    },
    /// Print one entry (verified: checksum and name) readably.
    Show {
        /// The entry's file: `<checkpoint dir>/<pipeline>/<fingerprint>-<unix-ms>-<id>`;
        /// or, for any store, the pipeline file followed by the entry's name.
        entry: PathBuf,
        /// The entry's name, when the first argument is the pipeline file.
        name: Option<String>,
        /// Print the entry's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Parses the process's command line and runs the command (after
/// installing the log subscriber).
pub fn main() -> Result<()> {
    main_from(std::env::args_os())
}

/// [`main`] with the command line given (its first item is the program's
/// name).
pub fn main_from<I, T>(args: I) -> Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    main_with(args, Connectors::default())
}

/// The `exactly` command for a binary with connectors of its own: pipeline
/// files may name the kinds `connectors` registers beside the built-in
/// ones, and every command (`run` with its metrics, health, logs and
/// progress line; `status`; `checkpoints list/show`) works for them.
pub fn main_with<I, T>(args: I, connectors: Connectors) -> Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    ops::logging::init(cli.log_format);
    match cli.command {
        Cmd::Run {
            file,
            flags,
            metrics_listen,
        } => run::run(&file, flags, metrics_listen, &connectors),
        Cmd::Status { file, json } => inspect::status(&file, json, &connectors),
        Cmd::Checkpoints {
            command: CheckpointCmd::List { file },
        } => inspect::list_checkpoints(&file, &connectors),
        Cmd::Checkpoints {
            command: CheckpointCmd::Show { entry, name, json },
        } => inspect::show_checkpoint(&entry, name.as_deref(), json, &connectors),
        Cmd::Demo { .. } => {
            bail!("the demo has a crate of its own: run `cargo run --release -p exactly-demo` in exactly's repository")
        }
    }
}
