//! # exactly
//!
//! End-to-end exactly-once data pipelines. This facade re-exports the runtime
//! ([`core`]) and the connectors, and holds the pipeline-file format used by the
//! `exactly` command.

pub mod cli;
pub mod config;
pub mod ops;
pub mod plugins;

pub use exactly_core as core;
pub use exactly_file as file;
pub use exactly_kafka as kafka;
pub use exactly_postgres as postgres;
pub use exactly_redis as redis;

pub use exactly_core::{
    CheckpointConfig, CheckpointId, ConnectorError, Guarantee, Pipeline, PipelineConfig, Record, RestartStrategy,
    Source, SourceFactory, TwoPhaseCommitSink,
};
