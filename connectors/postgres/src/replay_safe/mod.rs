//! Modes `upsert` and `fenced`: exactly-once effects without prepared
//! transactions, through the core's idempotent-sink adapters
//! ([`ReplaySafe`](exactly_core::ReplaySafe) and
//! [`Fenced`](exactly_core::Fenced)).
//!
//! ```text
//! session  the connection: subtask locks, checked tables, rows and dead letters written
//! upsert   PostgresUpsertSink, driven by ReplaySafe: a batch is one upsert statement, visible at once
//! fenced   PostgresFencedSink, driven by Fenced: an interval's rows and positions in one local transaction
//! ```

mod fenced;
mod session;
mod upsert;

pub use fenced::PostgresFencedSink;
pub use upsert::PostgresUpsertSink;
