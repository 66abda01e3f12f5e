//! The fault points of a build without the `fault-injection` feature (every
//! release build): each does nothing, whatever the environment says.
//! [`super::warn_if_ignored`] tells an operator who set one of the
//! variables that it has no effect.

/// Does nothing: this build has no fault injection.
#[inline(always)]
pub fn point(_name: &str) {}

/// Does nothing: this build has no fault injection.
#[inline(always)]
pub fn point_at(_name: &str, _subtask: usize) {}

/// Does nothing: this build has no fault injection.
#[inline(always)]
pub async fn pause(_name: &str) {}

/// Does nothing: this build has no fault injection.
#[inline(always)]
pub async fn pause_at(_name: &str, _subtask: usize) {}

/// Does nothing: this build has no fault injection.
#[inline(always)]
pub fn pause_blocking(_name: &str) {}

/// Always `Ok`: this build has no fault injection.
#[inline(always)]
pub fn fail_at(_name: &str, _subtask: usize) -> Result<(), crate::ConnectorError> {
    Ok(())
}

/// Always `false`: this build never aborts what a checkpoint lists.
#[inline(always)]
pub fn abort_pending_on_recover() -> bool {
    false
}

/// Always `None`: this build has no fault injection.
#[inline(always)]
pub fn planned_crash_point() -> Option<&'static str> {
    None
}
