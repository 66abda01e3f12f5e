//! What a failed call to a checkpoint store says about its effect (after
//! Materialize's `Determinate` / `Indeterminate`): the runtime aborts a
//! checkpoint whose write certainly failed, but neither commits nor aborts
//! one whose write may have landed — it restarts the region, which fences
//! the sequence and reads it again.

use crate::error::BoxError;

/// A failed call to a checkpoint store. Both kinds keep their cause.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The call certainly had no effect (a refused connection, a statement
    /// that rolled back, a write that failed before its entry's rename, any
    /// failed read). Retrying is safe.
    #[error("checkpoint store {location}: {operation} failed: {source}")]
    Determinate {
        /// Where: the folder, or the database and sequence.
        location: String,
        /// What was being done (`writing entry …`, `fencing`).
        operation: String,
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// The call may have taken effect (the connection closed after the
    /// statement was sent, a time-out while waiting for the answer, the
    /// folder's fsync failed after an entry's rename): only a later read
    /// after a fence can tell.
    #[error("checkpoint store {location}: {operation} may or may not have taken effect: {source}")]
    Indeterminate {
        /// Where: the folder, or the database and sequence.
        location: String,
        /// What was being done.
        operation: String,
        /// The cause.
        #[source]
        source: BoxError,
    },
}

impl AccessError {
    /// A call that certainly had no effect.
    pub fn determinate(location: impl Into<String>, operation: impl Into<String>, source: impl Into<BoxError>) -> Self {
        AccessError::Determinate {
            location: location.into(),
            operation: operation.into(),
            source: source.into(),
        }
    }

    /// A call that may have taken effect.
    pub fn indeterminate(
        location: impl Into<String>,
        operation: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        AccessError::Indeterminate {
            location: location.into(),
            operation: operation.into(),
            source: source.into(),
        }
    }

    /// Whether the call may have taken effect.
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, AccessError::Indeterminate { .. })
    }
}
