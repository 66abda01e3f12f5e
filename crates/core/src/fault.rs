//! Deterministic crash injection for crash tests.
//!
//! The runtime and connectors call [`point`] at every phase boundary of the
//! protocol. When the environment variable `EXACTLY_CRASH_AT` names that point,
//! the process kills itself with `SIGKILL` on the given hit — no destructors, no
//! flushing, exactly like a machine losing power at that moment. Without the
//! variable a point costs one atomic load.
//!
//! Format: `EXACTLY_CRASH_AT=<point>[:<nth hit, default 1>]`, e.g.
//! `EXACTLY_CRASH_AT=sink.after_pre_commit:3`.
//!
//! Points used by the runtime:
//!
//! | point | phase |
//! |---|---|
//! | `source.after_emit` | while writing: records handed to sinks, no checkpoint yet |
//! | `sink.after_pre_commit` | a sink pre-committed; the checkpoint is not persisted |
//! | `coordinator.before_persist` | every task acknowledged; nothing persisted |
//! | `store.before_fsync` | the entry is half written (temporary file) |
//! | `coordinator.after_persist` | checkpoint durable; no sink has committed |
//! | `sink.after_commit` | one sink subtask committed; others may not have |
//! | `recovery.after_commit` | recovery committed one subtask's pending transactions |

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

struct Plan {
    point: String,
    nth: u32,
    hits: AtomicU32,
}

fn plan() -> Option<&'static Plan> {
    static PLAN: OnceLock<Option<Plan>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let spec = std::env::var("EXACTLY_CRASH_AT").ok()?;
        let (point, nth) = match spec.rsplit_once(':') {
            Some((p, n)) => (p.to_string(), n.parse().unwrap_or(1)),
            None => (spec, 1),
        };
        Some(Plan {
            point,
            nth: nth.max(1),
            hits: AtomicU32::new(0),
        })
    })
    .as_ref()
}

/// Environment variable of the negative controls: when it is `1`, sinks
/// that support it abort on recovery the transactions a checkpoint lists
/// instead of committing them, so a test can show that its exactly-once check
/// catches the loss. Like `EXACTLY_CRASH_AT`, it lives in the environment of
/// a test run and never in a pipeline file.
pub const ABORT_PENDING_ON_RECOVER_ENV: &str = "EXACTLY_TEST_ABORT_PENDING_ON_RECOVER";

/// Whether [`ABORT_PENDING_ON_RECOVER_ENV`] is set to `1`.
pub fn abort_pending_on_recover() -> bool {
    std::env::var(ABORT_PENDING_ON_RECOVER_ENV).is_ok_and(|v| v == "1")
}

/// Marks a crash point. Kills the process with SIGKILL when `EXACTLY_CRASH_AT`
/// selects this point and hit.
pub fn point(name: &str) {
    let Some(plan) = plan() else { return };
    if plan.point != name {
        return;
    }
    let hit = plan.hits.fetch_add(1, Ordering::SeqCst) + 1;
    if hit == plan.nth {
        tracing::error!(
            point = name,
            hit,
            "crash point reached: killing the process with SIGKILL"
        );
        // SAFETY: raise has no memory-safety preconditions.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}
