//! What the subtasks of an attempt and its driver send each other.

use crate::coordinator::{TaskId, TaskState};
use crate::error::{ConnectorError, StoreError};
use crate::record::{CheckpointId, Record};

/// From a source subtask to a sink subtask, in order.
pub(super) enum Msg {
    Records(Vec<Record>),
    Barrier(CheckpointId),
}

/// From the driver to a source subtask.
pub(super) enum SourceCommand {
    /// Report the position and forward barrier N.
    Barrier(CheckpointId),
    /// Checkpoint N completed (progress publishing only).
    Complete(CheckpointId),
    /// Stop reading (graceful shutdown); barriers still flow.
    Stop,
}

/// From the driver to a sink subtask.
pub(super) enum SinkCommand {
    /// Commit everything pending up to N (completed at that instant).
    Commit(CheckpointId, std::time::Instant),
    /// The final checkpoint is committed: close the sink (see
    /// [`TwoPhaseCommitSink::close`](crate::TwoPhaseCommitSink::close)),
    /// answer how it went, and end.
    Close(tokio::sync::oneshot::Sender<Result<crate::sink::Closed, ConnectorError>>),
}

/// From the subtasks (and the checkpoint writer) to the driver.
pub(super) enum Report {
    Ack(CheckpointId, TaskId, TaskState),
    SourceFinished(usize),
    /// Sink subtask `i` committed everything pending up to the checkpoint.
    Committed(usize, CheckpointId),
    /// The outcome of the checkpoint's write.
    Persisted(CheckpointId, PersistOutcome),
    Failed(TaskId, ConnectorError),
}

/// How a checkpoint write ended.
#[derive(Debug)]
pub(super) enum PersistOutcome {
    /// Durable: the sinks may commit what it lists.
    Persisted,
    /// Certainly not written: the checkpoint is aborted, its transactions
    /// roll into the next one.
    Failed(StoreError),
    /// Maybe written: neither commit nor abort; the region restarts and
    /// reads the store again.
    Indeterminate(StoreError),
    /// Refused for its epoch: the region was taken by a newer owner; the
    /// attempt stops without committing.
    Fenced(StoreError),
}
