//! Error types of the runtime and of the connector traits.

use crate::coordinator::AbortReason;
use crate::record::CheckpointId;

/// The cause an error keeps: any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error reported by a connector (source or sink). Connectors classify their
/// failures so the runtime knows whether retrying can help.
///
/// `message` says what failed and what to do; `source` keeps the error that
/// caused it (a driver's, the operating system's), so an operator sees the
/// whole chain (`exactly` prints it, one cause per line) and code can
/// downcast it. Build them with [`transient`](Self::transient) /
/// [`fatal`](Self::fatal) and add the cause with
/// [`caused_by`](Self::caused_by).
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// A failure that may go away (network, service restarting, lock timeout).
    /// The runtime fails the current attempt and restarts the pipeline from the
    /// last complete checkpoint, following the restart strategy.
    #[error("transient failure in {context}: {message}")]
    Transient {
        /// Where: the connector and what it was doing.
        context: String,
        /// What failed, and what to do about it.
        message: String,
        /// The error that caused it, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// A failure that retrying will not fix (bad configuration, wrong server
    /// settings, permission denied). The pipeline stops with this error.
    #[error("{context}: {message}")]
    Fatal {
        /// Where: the connector and what it was doing.
        context: String,
        /// What failed, and what to do about it.
        message: String,
        /// The error that caused it, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// Data of a pre-committed checkpoint could not be committed and is gone
    /// (e.g. a transaction timed out on the server). Never silent.
    #[error("data of checkpoint {checkpoint} was lost in {context}: {message}")]
    DataLoss {
        /// Where: the connector and the transaction.
        context: String,
        /// The checkpoint whose data is gone.
        checkpoint: CheckpointId,
        /// What the store answered.
        message: String,
    },
}

impl ConnectorError {
    /// A transient error.
    pub fn transient(context: impl Into<String>, message: impl ToString) -> Self {
        ConnectorError::Transient {
            context: context.into(),
            message: message.to_string(),
            source: None,
        }
    }

    /// A fatal error.
    pub fn fatal(context: impl Into<String>, message: impl ToString) -> Self {
        ConnectorError::Fatal {
            context: context.into(),
            message: message.to_string(),
            source: None,
        }
    }

    /// The same error, keeping `cause` as its [`source`](std::error::Error::source)
    /// (replacing any kept before). A [`DataLoss`](Self::DataLoss) keeps no
    /// cause: its message holds what the store answered.
    pub fn caused_by(mut self, cause: impl Into<BoxError>) -> Self {
        match &mut self {
            ConnectorError::Transient { source, .. } | ConnectorError::Fatal { source, .. } => {
                *source = Some(cause.into())
            }
            ConnectorError::DataLoss { .. } => {}
        }
        self
    }

    /// True when the runtime may restart and try again.
    pub fn is_retriable(&self) -> bool {
        matches!(self, ConnectorError::Transient { .. })
    }
}

/// Shows an error followed by each of its causes, `: `-separated, for a
/// log line or a message that keeps only text. A cause whose text the line
/// already holds (a wrapper that repeats its source) is not written again.
#[derive(Clone, Copy, Debug)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut line = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            cause = c.source();
        }
        f.write_str(&line)
    }
}

/// Errors of the checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A call to the checkpoint store failed; the error says whether it
    /// may have taken effect.
    #[error(transparent)]
    Access(#[from] crate::store::AccessError),
    /// A write was refused for its epoch: another owner took the
    /// checkpoint sequence since this attempt did. The attempt stops
    /// without committing.
    #[error(
        "the checkpoints in {location} were taken by a newer owner (epoch {current}) while this attempt \
         held epoch {epoch}: it stops without committing or rolling back anything"
    )]
    Fenced {
        /// Where the sequence lives.
        location: String,
        /// The epoch the refused write carried.
        epoch: crate::membership::Epoch,
        /// The sequence's epoch now.
        current: crate::membership::Epoch,
    },
    /// An entry could not be encoded.
    #[error("checkpoint {checkpoint} could not be encoded: {source}")]
    Encode {
        /// The checkpoint whose entry it was.
        checkpoint: CheckpointId,
        /// What the encoder reported.
        #[source]
        source: serde_json::Error,
    },
    /// The latest complete checkpoint was written by a pipeline with a different
    /// definition.
    #[error(
        "the latest checkpoint in {dir} (id {checkpoint}) belongs to a different pipeline definition \
         (fingerprint {found}, this pipeline is {expected}); what changed: {changes}. \
         Resuming could mix incompatible state. Restore the old settings, point checkpoint.dir \
         elsewhere, or allow it explicitly (allow_fingerprint_change / --allow-fingerprint-change)"
    )]
    FingerprintMismatch {
        /// The checkpoint folder.
        dir: String,
        /// The latest complete checkpoint.
        checkpoint: CheckpointId,
        /// This pipeline's fingerprint.
        expected: String,
        /// The checkpoint's fingerprint.
        found: String,
        /// What differs between the two definitions.
        changes: String,
    },
    /// Another process runs the pipeline: it holds the checkpoint folder's
    /// lock.
    #[error(
        "pipeline {pipeline} is already running: {holder} holds the lock on its checkpoints in {dir}. \
         Only one process may run a pipeline (two would commit each other's transactions and duplicate or \
         lose records). Stop that process first, or wait until it ends; a process that died leaves no lock \
         behind. To run a second, independent copy, give it another name or checkpoint.dir"
    )]
    Locked {
        /// The pipeline's name.
        pipeline: String,
        /// The checkpoint folder.
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
        /// The checkpoint folder.
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
        /// The checkpoint folder.
        dir: String,
        /// The unreadable entries and why.
        skipped: String,
        /// The newest readable checkpoint.
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
        /// The checkpoint folder.
        dir: String,
        /// The latest complete checkpoint.
        checkpoint: CheckpointId,
        /// Its parallelism.
        was: usize,
        /// This pipeline's.
        now: usize,
    },
}

/// Errors that end a pipeline run.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// A connector failed and the restart strategy gave up (or the error was fatal).
    #[error("pipeline {pipeline}: {source}")]
    Connector {
        /// The pipeline's name.
        pipeline: String,
        /// The connector's error.
        #[source]
        source: ConnectorError,
    },
    /// The checkpoint store failed.
    #[error("pipeline {pipeline}: {source}")]
    Store {
        /// The pipeline's name.
        pipeline: String,
        /// The store's error.
        #[source]
        source: Box<StoreError>,
    },
    /// Too many checkpoints failed in a row.
    #[error(
        "pipeline {pipeline}: {failures} consecutive checkpoints failed (tolerated: {tolerated}); last reason: {reason}"
    )]
    TooManyCheckpointFailures {
        /// The pipeline's name.
        pipeline: String,
        /// Consecutive failed checkpoints.
        failures: u32,
        /// `checkpoint.tolerable_failures`.
        tolerated: u32,
        /// Why the last one failed.
        reason: AbortReason,
    },
    /// The restart strategy allows no more attempts.
    #[error("pipeline {pipeline}: giving up after {attempts} restart attempts; last failure: {last}")]
    RestartsExhausted {
        /// The pipeline's name.
        pipeline: String,
        /// Restart attempts made.
        attempts: u32,
        /// The failure of the last attempt.
        #[source]
        last: Box<PipelineError>,
    },
    /// The pipeline definition is invalid.
    #[error("pipeline configuration: {0}")]
    Config(String),
    /// A connector refused its settings (or the checkpoint settings, or a
    /// transform its section) before anything ran.
    #[error("pipeline configuration: {source}")]
    ConnectorConfig {
        /// The connector's error.
        #[source]
        source: BoxError,
    },
}

impl PipelineError {
    /// A [`ConnectorConfig`](Self::ConnectorConfig) error keeping `cause`.
    pub fn connector_config(cause: impl Into<BoxError>) -> Self {
        PipelineError::ConnectorConfig { source: cause.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_shows_every_cause_once() {
        let io = std::io::Error::other("disk full");
        let e = PipelineError::Connector {
            pipeline: "p".into(),
            source: ConnectorError::transient("file sink: fsync", "/out/x").caused_by(io),
        };
        assert_eq!(
            ErrorChain(&e).to_string(),
            "pipeline p: transient failure in file sink: fsync: /out/x: disk full"
        );
    }
}
