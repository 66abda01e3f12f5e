//! Mode `two-phase`: one PostgreSQL transaction per checkpoint interval and
//! sink subtask, prepared (`PREPARE TRANSACTION`) at pre-commit and
//! committed (`COMMIT PREPARED`) once the checkpoint listing it is durable.
//!
//! ```text
//! sink         the protocol steps (TwoPhaseCommitSink), one batch's data path
//! transaction  an open transaction, and the committable a checkpoint lists
//! writer       the write connection: subtask locks, BEGIN, the open COPY of rows, PREPARE
//! committer    the commit connection: COMMIT PREPARED, merge of staged rows, marker pruning
//! recover      commit what the checkpoint lists, roll back the rest the subtask owns
//! fence        with several workers: the subtask's epoch in the sink's database
//! rejected     rows the server refuses at the end of a COPY, found and sent to the dead letters
//! gid          transaction names
//! markers      which commit markers may be deleted
//! status       the pipeline's prepared transactions for `exactly status`
//! io_faults    crash points inside the PostgreSQL I/O, for the crash tests
//! ```

mod committer;
mod fence;
pub(crate) mod gid;
mod io_faults;
mod markers;
mod recover;
mod rejected;
mod sink;
mod status;
mod transaction;
mod writer;

pub use sink::PostgresSink;
pub(crate) use status::prepared_transactions;
pub use transaction::{PostgresCommittable, PostgresTransaction};
