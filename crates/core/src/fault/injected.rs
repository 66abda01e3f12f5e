//! The fault points of a build with the `fault-injection` feature: they
//! read the variables of [`super`] and crash, pause, fail or drop the
//! listed transactions when one selects them.

use super::{
    parse_spec, ABORT_PENDING_ON_RECOVER_ENV, CRASH_AT_ENV, CRASH_MARKER, DELAY_AT_ENV, DELAY_MARKER, FAIL_AT_ENV,
    STOP_AT_ENV, STOP_MARKER,
};
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

/// The point `EXACTLY_CRASH_AT` names, if any (for connectors that prepare
/// a planned crash, e.g. by waiting until a server shows the state the
/// point is about).
pub fn planned_crash_point() -> Option<&'static str> {
    plan().map(|p| p.point.as_str())
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
fn stop_plan() -> Option<&'static Plan> {
    static PLAN: OnceLock<Option<Plan>> = OnceLock::new();
    PLAN.get_or_init(|| std::env::var(STOP_AT_ENV).ok().map(|spec| Plan::parse(&spec)))
        .as_ref()
}

/// Stops the whole process with SIGSTOP when `EXACTLY_STOP_AT` selects
/// this point and hit; it goes on when it gets SIGCONT.
fn stop_if_planned(name: &str, subtask: Option<usize>) {
    let Some(plan) = stop_plan() else { return };
    if let Some(hit) = plan.hit(name, subtask) {
        tracing::warn!(
            point = name,
            ?subtask,
            hit,
            "stop point reached: freezing the process (SIGSTOP)"
        );
        let subtask = subtask.map_or("-".to_string(), |s| s.to_string());
        eprintln!("{STOP_MARKER} point={name} subtask={subtask} hit={hit}");
        // SAFETY: raise has no memory-safety preconditions.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
        tracing::warn!(point = name, "thawed (SIGCONT) after the stop point");
    }
}

fn delay(name: &str, subtask: Option<usize>) -> Option<Duration> {
    stop_if_planned(name, subtask);
    let (plan, duration) = delay_plan()?;
    let hit = plan.hit(name, subtask)?;
    tracing::warn!(point = name, ?subtask, hit, ?duration, "delay point reached: pausing");
    // Straight to stderr too, whatever logging the process set up: the
    // crash kit waits for this line to act while the process is held.
    let subtask = subtask.map_or("-".to_string(), |s| s.to_string());
    eprintln!("{DELAY_MARKER} point={name} subtask={subtask} hit={hit}");
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

/// Whether [`ABORT_PENDING_ON_RECOVER_ENV`] is set to `1`.
pub fn abort_pending_on_recover() -> bool {
    std::env::var(ABORT_PENDING_ON_RECOVER_ENV).is_ok_and(|v| v == "1")
}

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
    stop_if_planned(name, subtask);
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
