//! The demo's log file: its own log lines (the test kit's, rdkafka's), and
//! the pipeline's output, which the terminal does not show.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;

use anyhow::{Context, Result};
use tracing_subscriber::EnvFilter;

/// The log file, shared by this process and the pipeline's processes.
pub(crate) struct LogFile {
    path: PathBuf,
}

impl LogFile {
    /// Creates (or appends to) `path` and sends this process's log lines
    /// there, filtered by `RUST_LOG` (default `info`).
    pub(crate) fn install(path: PathBuf) -> Result<LogFile> {
        let file = open(&path)?;
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(Mutex::new(file))
            .try_init()
            .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))?;
        Ok(LogFile { path })
    }

    /// Its path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A handle appending to the file, for a child's stdout or stderr.
    pub(crate) fn for_child(&self) -> Result<Stdio> {
        Ok(Stdio::from(open(&self.path)?))
    }

    /// Its last `n` lines.
    pub(crate) fn tail(&self, n: usize) -> String {
        let Ok(file) = File::open(&self.path) else {
            return String::new();
        };
        let lines: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The rest of the last line holding `marker`, after it.
    pub(crate) fn last_after(&self, marker: &str) -> Option<String> {
        let file = File::open(&self.path).ok()?;
        BufReader::new(file)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| l.split_once(marker).map(|(_, rest)| rest.trim().to_string()))
            .last()
    }
}

fn open(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening the log file {}", path.display()))
}
