//! Deterministic crash injection for crash tests — compiled only into
//! builds with the `fault-injection` feature.
//!
//! # Only in test builds
//!
//! The feature is off by default, so a release build (`cargo build
//! --release -p exactly`, `cargo install`) has no crash, delay, failure or
//! abort switch at all: every function below does nothing and
//! [`abort_pending_on_recover`] is always `false`, whatever the
//! environment says. A pipeline started in such a build with one of the
//! variables set logs one warning per variable saying it is ignored
//! ([`warn_if_ignored`]). Test builds turn the feature on through a
//! dev-dependency: `exactly-core = { …, features = ["fault-injection"] }`
//! in `[dev-dependencies]` (a case of the crash kit that needs a point
//! fails naming this line when the pipeline it runs lacks it), which
//! cargo applies to everything a `cargo test` or `cargo bench` builds —
//! the crate's binaries that integration tests run as
//! `CARGO_BIN_EXE_<name>` included — and to nothing a plain `cargo build`
//! builds. (A `cargo build --workspace` that selects a package depending
//! on the feature normally, as the demo does, builds every selected
//! binary with it: build a release binary on its own.) [`ENABLED`] tells
//! which kind of build this is.
//!
//! The points are written here rather than with the `fail` crate: a point
//! takes a subtask and counts hits per subtask (`point@1:3`), a crash
//! writes a marker line the crash kit parses before it SIGKILLs the
//! process, and a point may prepare its crash ([`planned_crash_point`]);
//! `fail`'s actions (panic, sleep, return, print) cover none of these.
//!
//! # The points
//!
//! The runtime and connectors call [`point`] at every phase boundary of the
//! protocol. When the environment variable `EXACTLY_CRASH_AT` names that point,
//! the process kills itself with `SIGKILL` on the given hit — no destructors, no
//! flushing, exactly like a machine losing power at that moment. Without the
//! variable a point costs one atomic load.
//!
//! Format: `EXACTLY_CRASH_AT=<point>[@<subtask>][:<nth hit, default 1>]`,
//! e.g. `EXACTLY_CRASH_AT=sink.after_pre_commit:3` (the third hit by any
//! subtask) or `sink.after_commit@0:2` (the second hit by subtask 0: points
//! of subtasks count each subtask's hits apart). The log line before the kill
//! names the point, the subtask and the hit, so a test can check which
//! phase it hit.
//!
//! A sibling variable pauses instead of killing, to hold a phase up (a slow
//! checkpoint write, a sink that takes long to acknowledge):
//! `EXACTLY_DELAY_AT=<point>[:<nth hit>]=<duration>`, e.g.
//! `EXACTLY_DELAY_AT=sink.after_pre_commit:3=12s`. The runtime pauses at the
//! points below where it calls [`pause`] (async) or [`pause_blocking`]
//! (`coordinator.before_persist`, on the thread that writes the checkpoint);
//! connectors may name points of their own.
//!
//! A third variable makes a point fail instead, with a transient error (as a
//! sink that loses its connection would): `EXACTLY_FAIL_AT=<point>[@<subtask>][:<nth>]`
//! fails that one hit, `EXACTLY_FAIL_AT=<point>[@<subtask>]~<probability>`
//! every hit with that probability (for measuring failover). The runtime's
//! failure point is `sink.pre_commit` (before a sink subtask pre-commits).
//!
//! Points used by the runtime:
//!
//! A fourth variable freezes the whole process at a point instead, as a
//! VM pause, a long GC-like stall or `SIGSTOP` would:
//! `EXACTLY_STOP_AT=<point>[@<subtask>][:<nth>]` writes
//! `EXACTLY_STOP_POINT_REACHED point=<point> subtask=<n|-> hit=<n>` to
//! stderr and stops the process with `SIGSTOP` at that hit of any point
//! (crash or delay point; every call counts, so `sink.after_pre_commit`,
//! both a crash and a delay point, counts each pre-commit twice); the test
//! sends `SIGCONT` when it wants the process back (a worker frozen past its
//! lease at a chosen phase).
//!
//! | point | phase |
//! |---|---|
//! | `source.after_emit` | while writing: records handed to sinks, no checkpoint yet |
//! | `sink.after_pre_commit` | a sink pre-committed; the checkpoint is not persisted |
//! | `coordinator.before_persist` | every task acknowledged; nothing persisted |
//! | `store.before_fsync` | a write of the folder store (layout, id marks, entry) is half done (temporary file) |
//! | `store.before_fsync_entry` | the same, counting only checkpoint entries: hit `n` is the `n`-th entry written |
//! | `coordinator.after_persist` | checkpoint durable; no sink has committed |
//! | `coordinator.after_persist_pending` | the same, counting only checkpoints that list pre-committed transactions (however fast a source is, the kill leaves something to finish) |
//! | `sink.before_commit` | a sink subtask is about to commit a completed checkpoint (a delay point) |
//! | `sink.after_commit` | one sink subtask committed; others may not have |
//! | `recovery.after_commit` | recovery committed one subtask's pending transactions |
//!
//! The points of a subtask (`source.*`, `sink.*`, `recovery.*` and the
//! connectors' own) take `@<subtask>`, and in region failover the
//! `coordinator.*` points `@<region>`; the others count every hit.
//! Connectors' points: `kafka_sink.before_end_txn` (recovery is about to
//! finish a listed transaction with EndTxn), `kafka_sink.before_init_producer`
//! (on the blocking thread of an InitProducerId; a delay point).

#[cfg(feature = "fault-injection")]
#[path = "injected.rs"]
mod points;
#[cfg(not(feature = "fault-injection"))]
#[path = "inert.rs"]
mod points;

pub use points::{
    abort_pending_on_recover, fail_at, pause, pause_at, pause_blocking, planned_crash_point, point, point_at,
};

/// Whether this build has fault injection (the `fault-injection` feature):
/// `false` in every release build.
pub const ENABLED: bool = cfg!(feature = "fault-injection");

/// Environment variable naming the crash point: `<point>[:<nth hit>]`.
pub const CRASH_AT_ENV: &str = "EXACTLY_CRASH_AT";
/// Environment variable naming the delay point:
/// `<point>[:<nth hit>]=<duration>`.
pub const DELAY_AT_ENV: &str = "EXACTLY_DELAY_AT";
/// Environment variable naming a failure point (see the module docs).
pub const FAIL_AT_ENV: &str = "EXACTLY_FAIL_AT";
/// Environment variable of the negative controls: when it is `1`, the
/// runtime recovers every sink as if the restored checkpoint listed nothing
/// (`recover(&[])`), so each sink aborts the transactions the checkpoint
/// lists instead of committing them — whatever the sink — and a test can
/// show that its exactly-once check catches the loss. Like
/// `EXACTLY_CRASH_AT`, it lives in the environment of a test run and never
/// in a pipeline file, and only a build with fault injection reads it.
pub const ABORT_PENDING_ON_RECOVER_ENV: &str = "EXACTLY_TEST_ABORT_PENDING_ON_RECOVER";

/// Environment variable naming the point where the process stops itself
/// with `SIGSTOP`: `<point>[@<subtask>][:<nth hit>]`.
pub const STOP_AT_ENV: &str = "EXACTLY_STOP_AT";

/// Every variable this module reads (in a build with fault injection).
pub const VARIABLES: [&str; 5] = [
    CRASH_AT_ENV,
    DELAY_AT_ENV,
    FAIL_AT_ENV,
    ABORT_PENDING_ON_RECOVER_ENV,
    STOP_AT_ENV,
];

/// Start of the line a process writes to stderr right before a crash
/// point kills it: `<marker> point=<name> subtask=<index or -> hit=<n>`.
pub const CRASH_MARKER: &str = "EXACTLY_CRASH_POINT_REACHED";
/// What a build with fault injection writes to stderr when it pauses at a
/// delay point (`<marker> point=<point> subtask=<n|-> hit=<n>`), before the
/// pause: the crash kit waits for it to act while the process is held.
pub const DELAY_MARKER: &str = "EXACTLY_DELAY_POINT_REACHED";
/// What a build with fault injection writes to stderr right before it
/// stops itself at the point [`STOP_AT_ENV`] names.
pub const STOP_MARKER: &str = "EXACTLY_STOP_POINT_REACHED";

/// Splits a point spec `<point>[@<subtask>][:<nth hit, default 1>]` (the
/// value of [`CRASH_AT_ENV`], and of the other variables before their `=`
/// or `~`) into the point's name, the subtask and the hit.
pub fn parse_spec(spec: &str) -> (&str, Option<usize>, u32) {
    let (point, nth) = match spec.rsplit_once(':') {
        Some((p, n)) if n.parse::<u32>().is_ok() => (p, n.parse().unwrap_or(1)),
        _ => (spec, 1),
    };
    let (point, subtask) = match point.rsplit_once('@') {
        Some((p, s)) if s.parse::<usize>().is_ok() => (p, s.parse().ok()),
        _ => (point, None),
    };
    (point, subtask, nth.max(1))
}

/// The variables of [`VARIABLES`] set in this process's environment that
/// this build ignores: all the set ones without fault injection, none with
/// it.
pub fn ignored_variables() -> Vec<&'static str> {
    if ENABLED {
        return Vec::new();
    }
    VARIABLES
        .into_iter()
        .filter(|name| std::env::var_os(name).is_some())
        .collect()
}

/// Logs a warning, once per process, for each fault-injection variable set
/// in the environment of a build without fault injection: it has no
/// effect. Called when a pipeline starts.
pub fn warn_if_ignored() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        for name in ignored_variables() {
            tracing::warn!(
                variable = name,
                "{name} is set but ignored: this build has no fault injection (it is compiled only into test \
                 builds, with the `fault-injection` feature of exactly-core), so nothing will crash, pause, fail \
                 or abort on purpose"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_a_point_a_subtask_and_a_hit() {
        assert_eq!(parse_spec("sink.after_commit@1:2"), ("sink.after_commit", Some(1), 2));
        assert_eq!(
            parse_spec("coordinator.after_persist"),
            ("coordinator.after_persist", None, 1)
        );
        assert_eq!(parse_spec("source.after_emit:0"), ("source.after_emit", None, 1));
    }

    /// Without the feature every point is inert: a crash point the
    /// environment selects returns, and the abort switch stays off.
    #[cfg(not(feature = "fault-injection"))]
    #[test]
    fn without_the_feature_the_variables_do_nothing() {
        std::env::set_var(CRASH_AT_ENV, "inert.test");
        std::env::set_var(ABORT_PENDING_ON_RECOVER_ENV, "1");
        std::env::set_var(FAIL_AT_ENV, "inert.test");
        point("inert.test");
        point_at("inert.test", 0);
        assert!(fail_at("inert.test", 0).is_ok());
        assert!(!abort_pending_on_recover());
        assert_eq!(planned_crash_point(), None);
        let ignored = ignored_variables();
        for name in [CRASH_AT_ENV, FAIL_AT_ENV, ABORT_PENDING_ON_RECOVER_ENV] {
            assert!(ignored.contains(&name), "{name} not reported as ignored: {ignored:?}");
        }
    }
}
