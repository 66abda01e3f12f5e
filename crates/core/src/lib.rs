//! # exactly-core
//!
//! The runtime of **exactly**: every checkpoint interval is one transaction.
//!
//! - [`Source`] / [`SourceFactory`]: where records come from, with replayable positions.
//! - [`TwoPhaseCommitSink`] / [`SinkFactory`]: begin / write / pre-commit / commit / abort.
//! - [`IdempotentSink`] / [`FencedSink`]: sinks without transactions, made exactly-once by
//!   the adapters [`ReplaySafe`], [`WriteAhead`] and [`Fenced`].
//! - [`Coordinator`]: the checkpoint protocol as a pure state machine.
//! - [`CheckpointStore`] / [`SequenceStore`] / [`FsCheckpointStore`]: externalized, checksummed
//!   checkpoints, every write conditional on its owner's epoch.
//! - [`Transform`]: `map`, `filter` and `flat_map` per record, between source and sink.
//! - [`Pipeline`]: runs it all, with barriers, alignment, recovery and restarts.
//!
//! # The public surface
//!
//! Everything a connector, the `exactly` command or a test uses is
//! re-exported here, at the root, grouped below by who needs it; the modules
//! that hold it are private. Five modules stay public because their paths
//! are used as such: [`duration`] (a `#[serde(deserialize_with = …)]`
//! path), [`file_lock`] (the lock helpers the file sink shares with the
//! store), [`store`] (the checkpoint folder's layout: file names, entry
//! names, the lock, which the operations commands and the tests read),
//! [`fault`] (the crash, delay and failure points of the crash tests) and
//! [`membership`] (the pure model of which worker owns which region, with
//! its own submodules).

pub mod acting;
mod coordinator;
pub mod duration;
mod error;
pub mod fault;
pub mod file_lock;
mod idempotent;
mod json;
pub mod membership;
mod metrics;
mod ownership;
mod pipeline;
mod record;
mod restart;
mod retention;
mod sink;
mod source;
mod split_name;
pub mod store;
mod transform;

// Writing connectors: records, the source and sink traits, their errors.
pub use error::{BoxError, ConnectorError, ErrorChain};
pub use record::{CheckpointId, Record, SplitPositions};
pub use sink::{
    erase, Closed, ErasedSink, Ownership, PreparedTransaction, PreparedTransactionsFuture, ReplayCheck, SinkContext,
    SinkFactory, TwoPhaseCommitSink,
};
pub use source::{Poll, SequenceSourceFactory, Source, SourceFactory};
pub use split_name::SplitName;
pub use transform::{OnTransformError, Transform, TransformError};

// Sinks without transactions, and the adapters that make them exactly-once.
pub use idempotent::{
    DeadLetter, Fenced, FencedSink, FencedSinkFactory, HeldInterval, HeldRecords, IdempotentSink,
    IdempotentSinkFactory, Interval, ReplaySafe, WriteAhead, WriteOutcome,
};

// Reading record values: JSON pointers and the JSON check.
pub use json::{validate as validate_json, Found, InvalidPointer, JsonFacts, JsonPointer, Scanned};

// Ownership of transactions across subtasks and rescaling.
pub use ownership::{hold_instance_lock, plan_recovery, RecoveryPlan, TransactionNames};
pub use retention::RestorableCheckpoints;

// Running a pipeline.
pub use error::{PipelineError, StoreError};
pub use pipeline::{route, Failover, Guarantee, Pipeline, PipelineConfig, RunSummary, STANDBY_TAKEOVER_GRACE};
pub use restart::RestartStrategy;
pub use store::{
    check_fingerprint, AllowedChanges, CheckpointEntry, CheckpointStore, Checkpoints, EntryName, FsCheckpointStore,
    PipelineDescriptor, Scope, SequenceStore,
};

// The checkpoint protocol as pure state machines (property-tested on their own).
pub use coordinator::{
    AbortReason, Action, CheckpointConfig, CheckpointData, CommitLedger, Coordinator, Event, PendingCommit, TaskId,
    TaskState,
};

// Observing a running pipeline.
pub use metrics::{
    CheckpointStatsSnapshot, HistogramSnapshot, Metrics, MetricsSnapshot, Readiness, SubtaskSnapshot,
    DURATION_BUCKETS_US,
};
