//! Who owns what, for sinks: names for the transactions a sink subtask
//! leaves in its store ([`TransactionNames`]), and the decision recovery
//! makes about them ([`plan_recovery`]: commit every listed committable,
//! abort every owned transaction the list does not name).
//!
//! A sink subtask owns the transactions it names with its pipeline, its
//! own subtask index and those of [`SinkContext::adopted`](crate::SinkContext::adopted)
//! — nothing else, so two pipelines (or two tables of one pipeline) sharing
//! a store never touch each other's transactions. And one process per
//! pipeline and store: [`hold_instance_lock`] refuses a second one.

mod instance;
mod name;
mod recover;

pub use instance::hold_instance_lock;
pub(crate) use instance::RunGuard;
pub use name::TransactionNames;
pub use recover::{plan_recovery, RecoveryPlan};
