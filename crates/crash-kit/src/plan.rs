//! The crash cases: what to kill where, and what the output must show
//! afterwards. The standard lists cover every crash point of the runtime
//! (see `exactly_core::fault`).

use exactly_core::Guarantee;

/// One run of the pipeline that ends with SIGKILL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Killed by the runtime at a crash point: `crash` is
    /// `EXACTLY_CRASH_AT` (`<point>[@<subtask>][:<nth>]`), `delay`, when
    /// given, `EXACTLY_DELAY_AT` (`<point>[@<subtask>][:<nth>]=<duration>`,
    /// to hold another subtask back so the crash lands where the case
    /// says). The run must die at that very point.
    Kill {
        /// `EXACTLY_CRASH_AT`.
        crash: String,
        /// `EXACTLY_DELAY_AT`.
        delay: Option<String>,
    },
    /// Killed half-way through writing a checkpoint entry with an id of at
    /// least `min_id` (written, not fsynced: `store.before_fsync_entry`,
    /// reached by entries only). The kit tries its hits in turn, each on a
    /// fresh folder, until the temporary file left is such an entry (each
    /// region writes its entries in rising id order, so a few hits do).
    /// Only as a case's first step.
    KillHalfWayThroughEntry {
        /// The lowest entry id that counts.
        min_id: u64,
    },
    /// Killed by the kit with SIGKILL after a random delay (seeded, see
    /// [`CrashMatrix::seed`](super::CrashMatrix::seed)). A run that
    /// finishes first is fine.
    KillAtRandom,
    /// Not a kill: an operator's mistake. The case's pipeline runs and is
    /// held right before its first commit (`sink.before_commit:1`, paused
    /// for [`SECOND_PROCESS_HOLD`], and stopped with SIGSTOP there: it has
    /// pre-committed, persisted, not committed); meanwhile a second process
    /// of the same pipeline runs to its end with *another* checkpoint folder
    /// ([`Case::checkpoints`](crate::Case::checkpoints) is
    /// `<dir>/checkpoints-second-process` for it), writing the same output.
    /// Then the first goes on to its end. The output must still be exact:
    /// a connector refuses the second process (the usual way:
    /// `exactly_core::hold_instance_lock`), or survives it some other way.
    SecondProcess,
}

/// How long [`Step::SecondProcess`]'s first process pauses before its first
/// commit: the kit stops it (SIGSTOP) within that pause and lets it go on
/// (SIGCONT) once the second process ended.
pub const SECOND_PROCESS_HOLD: std::time::Duration = std::time::Duration::from_secs(5);

impl Step {
    /// A kill at `spec`: `<crash point>` or `<crash point>+<delay point>=<duration>`.
    pub fn kill(spec: &str) -> Step {
        match spec.split_once('+') {
            Some((crash, delay)) => Step::Kill {
                crash: crash.to_string(),
                delay: Some(delay.to_string()),
            },
            None => Step::Kill {
                crash: spec.to_string(),
                delay: None,
            },
        }
    }

    /// Kills at each of `specs` in turn (see [`Step::kill`]).
    pub fn kills(specs: &[&str]) -> Vec<Step> {
        specs.iter().map(|s| Step::kill(s)).collect()
    }
}

/// What the output must show once the pipeline finished after the kills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Every input exactly once.
    ExactlyOnce,
    /// At least one duplicate and nothing missing: the at-least-once
    /// control, proving the verifier sees duplicates.
    DuplicatesWithoutLoss,
    /// At least one input missing: the abort-on-recover control, proving
    /// the verifier sees loss.
    Loss,
}

/// A crash case: kills, then a run to the end, then the verifier.
#[derive(Clone, Debug)]
pub struct CrashCase {
    /// Its name, in messages and the case folder's name.
    pub name: String,
    /// The guarantee every run of the case uses.
    pub guarantee: Guarantee,
    /// The killed runs, in order.
    pub steps: Vec<Step>,
    /// The run to the end recovers with
    /// `EXACTLY_TEST_ABORT_PENDING_ON_RECOVER=1`: every sink aborts what
    /// the checkpoint lists instead of committing it.
    pub abort_pending_on_recover: bool,
    /// What the output must show.
    pub expect: Expect,
}

impl CrashCase {
    /// An exactly-once case that must end exact.
    pub fn exactly_once(name: &str, steps: Vec<Step>) -> CrashCase {
        CrashCase {
            name: name.to_string(),
            guarantee: Guarantee::ExactlyOnce,
            steps,
            abort_pending_on_recover: false,
            expect: Expect::ExactlyOnce,
        }
    }

    /// An at-least-once case that must show duplicates and no loss.
    pub fn at_least_once(name: &str, steps: Vec<Step>) -> CrashCase {
        CrashCase {
            guarantee: Guarantee::AtLeastOnce,
            expect: Expect::DuplicatesWithoutLoss,
            ..CrashCase::exactly_once(name, steps)
        }
    }

    /// An exactly-once case whose last recovery aborts what the checkpoint
    /// lists: it must show loss.
    pub fn aborting_on_recover(name: &str, steps: Vec<Step>) -> CrashCase {
        CrashCase {
            abort_pending_on_recover: true,
            expect: Expect::Loss,
            ..CrashCase::exactly_once(name, steps)
        }
    }
}

/// SIGKILL at every phase of the protocol in exactly-once mode: while
/// writing, after a pre-commit before the persist, with every ack in before
/// the persist, half-way through writing an entry, after the persist before
/// any commit, between two sink subtasks' commits (subtask 1 held back
/// while subtask 0 commits its second checkpoint and dies: needs
/// parallelism 2), during the recovery after such a crash, several in a
/// row, and a second process of the pipeline with another checkpoint folder
/// ([`Step::SecondProcess`]). Every case must end with every input exactly
/// once.
pub fn exactly_once_cases() -> Vec<CrashCase> {
    let case = |name: &str, specs: &[&str]| CrashCase::exactly_once(name, Step::kills(specs));
    vec![
        case("while_writing", &["source.after_emit:40"]),
        case("after_pre_commit_before_persist", &["sink.after_pre_commit:3"]),
        case("all_acks_before_persist", &["coordinator.before_persist:3"]),
        // Entry 2, so the restart has entry 1 to restore from.
        CrashCase::exactly_once(
            "half_written_checkpoint",
            vec![Step::KillHalfWayThroughEntry { min_id: 2 }],
        ),
        case("after_persist_before_commit", &["coordinator.after_persist:3"]),
        case(
            "between_two_subtasks_commits",
            &["sink.after_commit@0:2+sink.before_commit@1:2=3s"],
        ),
        case(
            "during_recovery",
            &["coordinator.after_persist:3", "recovery.after_commit:1"],
        ),
        case(
            "repeated_kills",
            &[
                "coordinator.after_persist:2",
                "sink.after_pre_commit:4",
                "source.after_emit:30",
                "sink.after_commit:2",
            ],
        ),
        CrashCase::exactly_once("second_process_other_checkpoint_folder", vec![Step::SecondProcess]),
    ]
}

/// The at-least-once negative control: a sink that commits at the barrier
/// (before the checkpoint is persisted) killed right after that commit
/// replays what it committed, so the verifier must see duplicates.
pub fn at_least_once_control() -> CrashCase {
    CrashCase::at_least_once("at_least_once_control", Step::kills(&["sink.after_pre_commit:3"]))
}

/// Every phase at which an at-least-once pipeline can find records
/// committed past the persisted checkpoint: after a sink's commit at the
/// barrier, with every ack in before the persist, half-way through writing
/// an entry, during the recovery after such a crash, several in a row.
/// Each must show duplicates and no loss.
pub fn at_least_once_cases() -> Vec<CrashCase> {
    let case = |name: &str, specs: &[&str]| CrashCase::at_least_once(name, Step::kills(specs));
    vec![
        case("after_a_sinks_commit_at_the_barrier", &["sink.after_pre_commit:3"]),
        case("all_acks_before_persist", &["coordinator.before_persist:3"]),
        CrashCase::at_least_once(
            "half_written_checkpoint",
            vec![Step::KillHalfWayThroughEntry { min_id: 1 }],
        ),
        case(
            "during_recovery",
            &["sink.after_pre_commit:3", "recovery.after_commit:1"],
        ),
        case(
            "repeated_kills",
            &[
                "coordinator.before_persist:2",
                "sink.after_pre_commit:4",
                "source.after_emit:30",
            ],
        ),
    ]
}

/// The abort-on-recover negative control: killed after checkpoint 3 is
/// persisted and before any commit, then recovered aborting what it lists
/// instead of committing it. Its records are lost, so the verifier must see
/// loss.
pub fn abort_on_recover_control() -> CrashCase {
    CrashCase::aborting_on_recover(
        "abort_on_recover_control",
        Step::kills(&["coordinator.after_persist:3"]),
    )
}
