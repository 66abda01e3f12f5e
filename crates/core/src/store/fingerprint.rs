//! Whether a checkpoint belongs to this pipeline: the fingerprint of its
//! definition, and the changes an operator allowed.

use super::entry::{CheckpointEntry, PipelineDescriptor};
use crate::error::StoreError;

/// What a pipeline may resume from despite a different definition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllowedChanges {
    /// Any change (`allow_fingerprint_change`).
    pub any: bool,
    /// Only the parallelism (`allow_parallelism_change`).
    pub parallelism: bool,
}

/// Checks that `entry` was written by the pipeline described by `current`.
/// Returns an error naming what changed unless `allowed` admits it: a
/// change of the parallelism alone needs `allowed.parallelism` (or `any`),
/// every other change `allowed.any`.
pub fn check_fingerprint(
    location: &str,
    entry: &CheckpointEntry,
    current: &PipelineDescriptor,
    allowed: AllowedChanges,
) -> Result<(), StoreError> {
    let expected = current.fingerprint();
    if entry.fingerprint == expected {
        return Ok(());
    }
    let changes = current.describe_changes(&entry.descriptor);
    let only_parallelism = PipelineDescriptor {
        parallelism: entry.descriptor.parallelism,
        ..current.clone()
    }
    .fingerprint()
        == entry.fingerprint;
    if only_parallelism && !allowed.any {
        if allowed.parallelism {
            tracing::warn!(
                was = entry.descriptor.parallelism,
                now = current.parallelism,
                "resuming from a checkpoint taken at another parallelism (explicitly allowed)"
            );
            return Ok(());
        }
        return Err(StoreError::ParallelismChanged {
            dir: location.to_string(),
            checkpoint: entry.checkpoint.id,
            was: entry.descriptor.parallelism,
            now: current.parallelism,
        });
    }
    if allowed.any {
        tracing::warn!(%changes, "resuming from a checkpoint of a different pipeline definition (explicitly allowed)");
        return Ok(());
    }
    Err(StoreError::FingerprintMismatch {
        dir: location.to_string(),
        checkpoint: entry.checkpoint.id,
        expected,
        found: entry.fingerprint.clone(),
        changes,
    })
}
