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

/// From the subtasks (and the checkpoint writer) to the driver.
pub(super) enum Report {
    Ack(CheckpointId, TaskId, TaskState),
    SourceFinished(usize),
    /// Sink subtask `i` committed everything pending up to the checkpoint.
    Committed(usize, CheckpointId),
    Persisted(CheckpointId, Result<(), StoreError>),
    Failed(TaskId, ConnectorError),
}
