//! Deterministic crash injection for crash tests.
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
//! | point | phase |
//! |---|---|
//! | `source.after_emit` | while writing: records handed to sinks, no checkpoint yet |
//! | `sink.after_pre_commit` | a sink pre-committed; the checkpoint is not persisted |
//! | `coordinator.before_persist` | every task acknowledged; nothing persisted |
//! | `store.before_fsync` | the entry is half written (temporary file) |
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

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

struct Plan {
    point: String,
    /// Only this subtask's hits count (`point@subtask`).
    subtask: Option<usize>,
    nth: u32,
    hits: AtomicU32,
}

/// Environment variable naming the crash point: `<point>[:<nth hit>]`.
pub const CRASH_AT_ENV: &str = "EXACTLY_CRASH_AT";
/// Environment variable naming the delay point:
/// `<point>[:<nth hit>]=<duration>`.
pub const DELAY_AT_ENV: &str = "EXACTLY_DELAY_AT";

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

impl Plan {
    /// `<point>[@<subtask>][:<nth>]`.
    fn parse(spec: &str) -> Plan {
        let (point, subtask, nth) = parse_spec(spec);
        Plan {
            point: point.to_string(),
            subtask,
            nth,
            hits: AtomicU32::new(0),
        }
    }

    /// Whether this call of `name` (by `subtask`, when a subtask's) is the
    /// planned hit.
    fn hit(&self, name: &str, subtask: Option<usize>) -> Option<u32> {
        if self.point != name || self.subtask.is_some_and(|s| subtask != Some(s)) {
            return None;
        }
        let hit = self.hits.fetch_add(1, Ordering::SeqCst) + 1;
        (hit == self.nth).then_some(hit)
    }
}

fn plan() -> Option<&'static Plan> {
    static PLAN: OnceLock<Option<Plan>> = OnceLock::new();
    PLAN.get_or_init(|| std::env::var(CRASH_AT_ENV).ok().map(|spec| Plan::parse(&spec)))
        .as_ref()
}

fn delay_plan() -> Option<&'static (Plan, Duration)> {
    static PLAN: OnceLock<Option<(Plan, Duration)>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let spec = std::env::var(DELAY_AT_ENV).ok()?;
        match parse_delay(&spec) {
            Ok(plan) => Some(plan),
            Err(problem) => {
                tracing::error!(%spec, %problem, "{DELAY_AT_ENV} is not `<point>[:<nth>]=<duration>`; no delay");
                None
            }
        }
    })
    .as_ref()
}

fn parse_delay(spec: &str) -> Result<(Plan, Duration), String> {
    let (point, duration) = spec.rsplit_once('=').ok_or("no `=<duration>`")?;
    let duration = humantime::parse_duration(duration).map_err(|e| e.to_string())?;
    Ok((Plan::parse(point), duration))
}

/// Environment variable naming a failure point (see the module docs).
pub const FAIL_AT_ENV: &str = "EXACTLY_FAIL_AT";

/// When a failure point fails: at one hit, or at random.
enum Failing {
    Once(Plan),
    Randomly { plan: Plan, probability: f64 },
}

fn fail_plan() -> Option<&'static Failing> {
    static PLAN: OnceLock<Option<Failing>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let spec = std::env::var(FAIL_AT_ENV).ok()?;
        match spec.split_once('~') {
            Some((point, probability)) => match probability.parse::<f64>() {
                Ok(probability) if (0.0..=1.0).contains(&probability) => Some(Failing::Randomly {
                    plan: Plan::parse(point),
                    probability,
                }),
                _ => {
                    tracing::error!(%spec, "{FAIL_AT_ENV}: the probability after `~` must be between 0 and 1; no failures");
                    None
                }
            },
            None => Some(Failing::Once(Plan::parse(&spec))),
        }
    })
    .as_ref()
}

/// Marks a failure point of subtask `subtask`: `Err` (transient) when
/// `EXACTLY_FAIL_AT` selects this hit. Without the variable it costs one
/// atomic load.
pub fn fail_at(name: &str, subtask: usize) -> Result<(), crate::ConnectorError> {
    let Some(failing) = fail_plan() else {
        return Ok(());
    };
    let fails = match failing {
        Failing::Once(plan) => plan.hit(name, Some(subtask)).is_some(),
        Failing::Randomly { plan, probability } => {
            plan.point == name && plan.subtask.is_none_or(|s| s == subtask) && rand::random::<f64>() < *probability
        }
    };
    if !fails {
        return Ok(());
    }
    tracing::warn!(point = name, subtask, "failure point reached: failing");
    Err(crate::ConnectorError::transient(
        format!("subtask {subtask}"),
        format!("failure injected at {name} ({FAIL_AT_ENV})"),
    ))
}

/// How long to pause at `name`, when `EXACTLY_DELAY_AT` selects this point
/// and hit.
fn delay(name: &str, subtask: Option<usize>) -> Option<Duration> {
    let (plan, duration) = delay_plan()?;
    let hit = plan.hit(name, subtask)?;
    tracing::warn!(point = name, ?subtask, hit, ?duration, "delay point reached: pausing");
    Some(*duration)
}

/// Marks a delay point in async code: sleeps when `EXACTLY_DELAY_AT`
/// selects this point and hit. Without the variable it costs one atomic
/// load.
pub async fn pause(name: &str) {
    if let Some(duration) = delay(name, None) {
        tokio::time::sleep(duration).await;
    }
}

/// [`pause`] at a point of subtask `subtask` (its hits count apart when the
/// plan names a subtask).
pub async fn pause_at(name: &str, subtask: usize) {
    if let Some(duration) = delay(name, Some(subtask)) {
        tokio::time::sleep(duration).await;
    }
}

/// [`pause`] for code that runs on a blocking thread.
pub fn pause_blocking(name: &str) {
    if let Some(duration) = delay(name, None) {
        std::thread::sleep(duration);
    }
}

/// Environment variable of the negative controls: when it is `1`, the
/// runtime recovers every sink as if the restored checkpoint listed nothing
/// (`recover(&[])`), so each sink aborts the transactions the checkpoint
/// lists instead of committing them — whatever the sink — and a test can
/// show that its exactly-once check catches the loss. Like
/// `EXACTLY_CRASH_AT`, it lives in the environment of a test run and never
/// in a pipeline file.
pub const ABORT_PENDING_ON_RECOVER_ENV: &str = "EXACTLY_TEST_ABORT_PENDING_ON_RECOVER";

/// Whether [`ABORT_PENDING_ON_RECOVER_ENV`] is set to `1`.
pub fn abort_pending_on_recover() -> bool {
    std::env::var(ABORT_PENDING_ON_RECOVER_ENV).is_ok_and(|v| v == "1")
}

/// Start of the line a process writes to stderr right before a crash
/// point kills it: `<marker> point=<name> subtask=<index or -> hit=<n>`.
pub const CRASH_MARKER: &str = "EXACTLY_CRASH_POINT_REACHED";

/// Marks a crash point. Kills the process with SIGKILL when `EXACTLY_CRASH_AT`
/// selects this point and hit.
pub fn point(name: &str) {
    crash_if_planned(name, None);
}

/// [`point`] of subtask `subtask`: with `EXACTLY_CRASH_AT=<point>@<subtask>`
/// only that subtask's hits count.
pub fn point_at(name: &str, subtask: usize) {
    crash_if_planned(name, Some(subtask));
}

fn crash_if_planned(name: &str, subtask: Option<usize>) {
    let Some(plan) = plan() else { return };
    if let Some(hit) = plan.hit(name, subtask) {
        tracing::error!(
            point = name,
            ?subtask,
            hit,
            "crash point reached: killing the process with SIGKILL"
        );
        // Also straight to stderr, unbuffered, whatever logging the process
        // set up (or none): crash tests read this line to check where the
        // process died (exactly_testkit::crash parses it).
        let subtask = subtask.map_or("-".to_string(), |s| s.to_string());
        eprintln!("{CRASH_MARKER} point={name} subtask={subtask} hit={hit}");
        // SAFETY: raise has no memory-safety preconditions.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_name_a_point_and_a_hit() {
        let plan = Plan::parse("sink.after_commit:3");
        assert_eq!((plan.point.as_str(), plan.nth), ("sink.after_commit", 3));
        assert_eq!(plan.hit("other", None), None);
        assert_eq!(plan.hit("sink.after_commit", Some(0)), None);
        assert_eq!(plan.hit("sink.after_commit", Some(1)), None);
        assert_eq!(plan.hit("sink.after_commit", Some(0)), Some(3), "any subtask counts");
        assert_eq!(plan.hit("sink.after_commit", None), None, "only the nth hit");
        let plan = Plan::parse("coordinator.after_persist");
        assert_eq!(plan.nth, 1);
        let plan = Plan::parse("sink.after_commit@1:2");
        assert_eq!(
            (plan.point.as_str(), plan.subtask, plan.nth),
            ("sink.after_commit", Some(1), 2)
        );
        assert_eq!(plan.hit("sink.after_commit", Some(0)), None);
        assert_eq!(plan.hit("sink.after_commit", Some(1)), None);
        assert_eq!(plan.hit("sink.after_commit", Some(0)), None, "subtask 0 does not count");
        assert_eq!(plan.hit("sink.after_commit", Some(1)), Some(2));
        assert_eq!(Plan::parse("recovery.after_commit@0").subtask, Some(0));
    }

    #[test]
    fn delays_name_a_point_a_hit_and_a_duration() {
        let (plan, duration) = parse_delay("sink.after_pre_commit:2=1500ms").unwrap();
        assert_eq!((plan.point.as_str(), plan.nth), ("sink.after_pre_commit", 2));
        assert_eq!(duration, Duration::from_millis(1500));
        let (plan, duration) = parse_delay("coordinator.before_persist=12s").unwrap();
        assert_eq!(
            (plan.point.as_str(), plan.nth, duration),
            ("coordinator.before_persist", 1, Duration::from_secs(12))
        );
        assert!(parse_delay("sink.after_commit:2").is_err());
        assert!(parse_delay("sink.after_commit=often").is_err());
    }
}
