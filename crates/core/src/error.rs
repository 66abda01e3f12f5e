//! Error types of the runtime and of the connector traits.

use crate::record::CheckpointId;

/// An error reported by a connector (source or sink). Connectors classify their
/// failures so the runtime knows whether retrying can help.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// A failure that may go away (network, service restarting, lock timeout).
    /// The runtime fails the current attempt and restarts the pipeline from the
    /// last complete checkpoint, following the restart strategy.
    #[error("transient failure in {context}: {message}")]
    Transient { context: String, message: String },
    /// A failure that retrying will not fix (bad configuration, wrong server
    /// settings, permission denied). The pipeline stops with this error.
    #[error("{context}: {message}")]
    Fatal { context: String, message: String },
    /// Data of a pre-committed checkpoint could not be committed and is gone
    /// (e.g. a transaction timed out on the server). Never silent.
    #[error("data of checkpoint {checkpoint} was lost in {context}: {message}")]
    DataLoss {
        context: String,
        checkpoint: CheckpointId,
        message: String,
    },
}

impl ConnectorError {
    /// A transient error.
    pub fn transient(context: impl Into<String>, message: impl ToString) -> Self {
        ConnectorError::Transient {
            context: context.into(),
            message: message.to_string(),
        }
    }

    /// A fatal error.
    pub fn fatal(context: impl Into<String>, message: impl ToString) -> Self {
        ConnectorError::Fatal {
            context: context.into(),
            message: message.to_string(),
        }
    }

    /// True when the runtime may restart and try again.
    pub fn is_retriable(&self) -> bool {
        matches!(self, ConnectorError::Transient { .. })
    }
}

/// Errors of the checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading or writing the checkpoint folder failed.
    #[error("checkpoint store I/O on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// An entry could not be encoded.
    #[error("checkpoint {checkpoint} could not be encoded: {message}")]
    Encode { checkpoint: CheckpointId, message: String },
    /// The latest complete checkpoint was written by a pipeline with a different
    /// definition.
    #[error(
        "the latest checkpoint in {dir} (id {checkpoint}) belongs to a different pipeline definition \
         (fingerprint {found}, this pipeline is {expected}); what changed: {changes}. \
         Resuming could mix incompatible state. Restore the old settings, point checkpoint.dir \
         elsewhere, or allow it explicitly (allow_fingerprint_change / --allow-fingerprint-change)"
    )]
    FingerprintMismatch {
        dir: String,
        checkpoint: CheckpointId,
        expected: String,
        found: String,
        changes: String,
    },
    /// Another process runs the pipeline: it holds the checkpoint folder's
    /// lock.
    #[error(
        "pipeline {pipeline} is already running: {holder} holds the lock on its checkpoint folder {dir}. \
         Only one process may run a pipeline (two would commit each other's transactions and duplicate or \
         lose records). Stop that process first, or wait until it ends; a process that died leaves no lock \
         behind. To run a second, independent copy, give it another name or checkpoint.dir"
    )]
    Locked {
        pipeline: String,
        dir: String,
        /// Who holds it: host, pid and since when, as the holder wrote it.
        holder: String,
    },
    /// The folder has a history (entries, reserved ids) but no entry can be
    /// read.
    #[error(
        "the checkpoint folder {dir} has a history but no readable checkpoint ({history}). Starting as if \
         for the first time would send the sources back to their start position and roll back transactions \
         a lost checkpoint may list: records would be duplicated or lost. Restore the entries (from a \
         backup), or accept a first start deliberately with allow_first_start = true in [checkpoint] or \
         --allow-first-start (the unreadable entries are then kept as <name>.unreadable)"
    )]
    NoReadableCheckpoint {
        dir: String,
        /// What is there: the unreadable entries and why, the id watermark.
        history: String,
    },
    /// Newer entries than the newest readable one cannot be read, and the
    /// sinks do not prove that restoring the older one duplicates nothing.
    #[error(
        "the newest checkpoint entries in {dir} cannot be read or are gone ({skipped}); the newest readable one is \
         checkpoint {restored}. Restoring it would write every record after it again, and {known}. Refusing \
         to start: restore the unreadable entries (from a backup), or accept the fallback and its \
         duplicates deliberately with allow_fallback = true in [checkpoint] or --allow-fallback"
    )]
    FallbackRefused {
        dir: String,
        /// The unreadable entries and why.
        skipped: String,
        restored: CheckpointId,
        /// What is known to have been committed after `restored`.
        known: String,
    },
    /// The latest complete checkpoint was taken at another parallelism, and
    /// changing it was not allowed.
    #[error(
        "the latest checkpoint in {dir} (id {checkpoint}) was taken with parallelism {was}, this pipeline \
         runs with {now}. Changing it is supported: the new sink subtasks commit what the old ones left \
         pending and abort the rest before data flows, and every split resumes from its position. Allow it \
         explicitly with allow_parallelism_change = true in [checkpoint] or --allow-parallelism-change, \
         or set parallelism back to {was}"
    )]
    ParallelismChanged {
        dir: String,
        checkpoint: CheckpointId,
        was: usize,
        now: usize,
    },
}

/// Errors that end a pipeline run.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// A connector failed and the restart strategy gave up (or the error was fatal).
    #[error("pipeline {pipeline}: {source}")]
    Connector {
        pipeline: String,
        #[source]
        source: ConnectorError,
    },
    /// The checkpoint store failed.
    #[error("pipeline {pipeline}: {source}")]
    Store {
        pipeline: String,
        #[source]
        source: Box<StoreError>,
    },
    /// Too many checkpoints failed in a row.
    #[error(
        "pipeline {pipeline}: {failures} consecutive checkpoints failed (tolerated: {tolerated}); last reason: {reason}"
    )]
    TooManyCheckpointFailures {
        pipeline: String,
        failures: u32,
        tolerated: u32,
        reason: String,
    },
    /// The restart strategy allows no more attempts.
    #[error("pipeline {pipeline}: giving up after {attempts} restart attempts; last failure: {last}")]
    RestartsExhausted {
        pipeline: String,
        attempts: u32,
        last: String,
    },
    /// The pipeline definition is invalid.
    #[error("pipeline configuration: {0}")]
    Config(String),
}
