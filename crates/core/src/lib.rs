//! # exactly-core
//!
//! The runtime of **exactly**: every checkpoint interval is one transaction.
//!
//! - [`Source`] / [`SourceFactory`]: where records come from, with replayable positions.
//! - [`TwoPhaseCommitSink`] / [`SinkFactory`]: begin / write / pre-commit / commit / abort.
//! - [`Coordinator`]: the checkpoint protocol as a pure state machine.
//! - [`CheckpointStore`] / [`FsCheckpointStore`]: externalized, checksummed checkpoints.
//! - [`Pipeline`]: runs it all, with barriers, alignment, recovery and restarts.

pub mod coordinator;
pub mod duration;
pub mod error;
pub mod fault;
pub mod idempotent;
pub mod json;
pub mod metrics;
pub mod ownership;
pub mod pipeline;
pub mod record;
pub mod restart;
pub mod retention;
pub mod sink;
pub mod source;
pub mod split_name;
pub mod store;

pub use coordinator::{
    Action, CheckpointConfig, CheckpointData, CommitLedger, Coordinator, Event, PendingCommit, TaskId, TaskState,
};
pub use error::{ConnectorError, PipelineError, StoreError};
pub use idempotent::{
    DeadLetter, Fenced, FencedSink, FencedSinkFactory, HeldInterval, HeldRecords, IdempotentSink,
    IdempotentSinkFactory, ReplaySafe, WriteAhead, WriteOutcome,
};
pub use json::{validate as validate_json, InvalidPointer, JsonFacts, JsonPointer, Scanned};
pub use metrics::{CheckpointStatsSnapshot, HistogramSnapshot, Metrics, MetricsSnapshot, Readiness, SubtaskSnapshot};
pub use ownership::{plan_recovery, RecoveryPlan, TransactionNames};
pub use pipeline::{route, Failover, Guarantee, Pipeline, PipelineConfig, RunSummary};
pub use record::{CheckpointId, Record, SplitPositions};
pub use restart::RestartStrategy;
pub use retention::RestorableCheckpoints;
pub use sink::{
    erase, ErasedSink, PreparedTransaction, PreparedTransactionsFuture, ReplayCheck, SinkContext, SinkFactory,
    TwoPhaseCommitSink,
};
pub use source::{Poll, SequenceSourceFactory, Source, SourceFactory};
pub use split_name::SplitName;
pub use store::{
    check_fingerprint, AllowedChanges, CheckpointEntry, CheckpointStore, EntryName, FsCheckpointStore,
    PipelineDescriptor,
};
