//! The crash matrix: runs the author's pipeline through every crash case,
//! restarting it after each kill, and checks the output with the author's
//! verifier.

use std::ops::Range;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use exactly_core::fault;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::case::Case;
use super::child::{self, Ending, Run};
use super::plan::{self, CrashCase, Expect, Step};
use super::seed;
use super::tally::Tally;
use super::torn::half_written_entry;

type CommandFn = dyn Fn(&Case) -> Command + Send + Sync;
type VerifyFn = dyn Fn(&Case) -> Result<Vec<String>, String> + Send + Sync;

/// A crash case that did not end as it must.
#[derive(Debug, thiserror::Error)]
#[error("crash case `{case}`: {problem}\n  its folder is kept for inspection: {}", dir.display())]
pub struct CrashFailure {
    /// The case's name.
    pub case: String,
    /// What went wrong, with the kills that led there.
    pub problem: String,
    /// The case's folder (output, checkpoints), kept.
    pub dir: PathBuf,
}

/// An author's pipeline under the crash matrix. See the [module
/// docs](super) for an example.
pub struct CrashMatrix {
    inputs: Vec<String>,
    command: Box<CommandFn>,
    verify: Box<VerifyFn>,
    run_limit: Duration,
    random_kills: usize,
    random_window: Range<Duration>,
    seed: u64,
    skip_at_least_once: Option<String>,
    skip_abort_on_recover: Option<String>,
    leftovers: Option<Box<VerifyFn>>,
}

impl std::fmt::Debug for CrashMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrashMatrix")
            .field("inputs", &self.inputs.len())
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl CrashMatrix {
    /// The matrix of a pipeline whose source produces `inputs` (each
    /// record's identity as the verifier reports it, e.g. `seq-0:17`),
    /// started by `command` for a [`Case`] (the same command for every run
    /// of the case: it must run the pipeline from the case's folders until
    /// the source is exhausted, then exit 0) and checked by `verify`, which
    /// returns every record the sink's output holds for the case —
    /// committed output only, duplicates included — or why it cannot.
    ///
    /// The command inherits the test's environment, minus the fault
    /// variables of `exactly_core::fault`, which the kit sets per run.
    pub fn new(
        inputs: Vec<String>,
        command: impl Fn(&Case) -> Command + Send + Sync + 'static,
        verify: impl Fn(&Case) -> Result<Vec<String>, String> + Send + Sync + 'static,
    ) -> CrashMatrix {
        CrashMatrix {
            inputs,
            command: Box::new(command),
            verify: Box::new(verify),
            run_limit: Duration::from_secs(120),
            random_kills: 3,
            random_window: Duration::from_millis(100)..Duration::from_millis(1500),
            seed: seed::from_env_or_fresh(),
            skip_at_least_once: None,
            skip_abort_on_recover: None,
            leftovers: None,
        }
    }

    /// Checks after every exactly-once case that the sink holds nothing of
    /// the case's pipeline but its committed output: `leftovers` lists what
    /// it still holds once the run to the end finished (staged rows, pending
    /// objects or files, open or prepared transactions, named as the store
    /// names them), or says why it cannot. Anything listed fails the case:
    /// it is what a crashed interval left behind and recovery should have
    /// aborted, and it would grow with every crash in production (a sink
    /// that leaks staging data passes every other check, because its
    /// committed output is right).
    pub fn leftovers(
        mut self,
        leftovers: impl Fn(&Case) -> Result<Vec<String>, String> + Send + Sync + 'static,
    ) -> CrashMatrix {
        self.leftovers = Some(Box::new(leftovers));
        self
    }

    /// The longest a run may take (default 120 s); a run still going then is
    /// killed and fails its case (a crash point never reached by an
    /// unbounded source, a hang).
    pub fn run_limit(mut self, limit: Duration) -> CrashMatrix {
        self.run_limit = limit;
        self
    }

    /// The random case kills the pipeline `count` times in a row (default
    /// 3, 0 for none), each run after a delay drawn from `window` (default
    /// 100 ms..1.5 s): choose a window inside the time a run takes.
    pub fn random_kills(mut self, count: usize, window: Range<Duration>) -> CrashMatrix {
        self.random_kills = count;
        self.random_window = window;
        self
    }

    /// The seed of the random kills (default: `EXACTLY_CRASH_SEED`, or a
    /// fresh one). It is printed whenever random kills run.
    pub fn seed(mut self, seed: u64) -> CrashMatrix {
        self.seed = seed;
        self
    }

    /// Leaves the at-least-once control out, saying why (a sink whose
    /// writes are idempotent cannot duplicate even at-least-once).
    pub fn without_at_least_once_control(mut self, why: &str) -> CrashMatrix {
        self.skip_at_least_once = Some(why.to_string());
        self
    }

    /// Leaves the abort-on-recover control out, saying why (a sink whose
    /// output is visible at once has nothing for recovery to abort).
    pub fn without_abort_on_recover_control(mut self, why: &str) -> CrashMatrix {
        self.skip_abort_on_recover = Some(why.to_string());
        self
    }

    /// Every case [`run`](CrashMatrix::run) checks: the exactly-once cases
    /// of [`plan::exactly_once_cases`], the random kills, and the two
    /// controls unless left out.
    pub fn cases(&self) -> Vec<CrashCase> {
        let mut cases = plan::exactly_once_cases();
        if self.random_kills > 0 {
            cases.push(CrashCase::exactly_once(
                "random_kills",
                vec![Step::KillAtRandom; self.random_kills],
            ));
        }
        match &self.skip_at_least_once {
            None => cases.push(plan::at_least_once_control()),
            Some(why) => eprintln!("crash kit: the at-least-once control is left out: {why}"),
        }
        match &self.skip_abort_on_recover {
            None => cases.push(plan::abort_on_recover_control()),
            Some(why) => eprintln!("crash kit: the abort-on-recover control is left out: {why}"),
        }
        cases
    }

    /// Runs every case of [`cases`](CrashMatrix::cases), one after the
    /// other, and panics listing every case that did not end as it must.
    /// One call from a `#[test]`.
    pub fn run(&self) {
        let failures: Vec<String> = self
            .cases()
            .iter()
            .filter_map(|case| self.check_case(case).err())
            .map(|failure| failure.to_string())
            .collect();
        assert!(
            failures.is_empty(),
            "{} crash case(s) failed:\n\n{}",
            failures.len(),
            failures.join("\n\n")
        );
    }

    /// [`check_case`](CrashMatrix::check_case), panicking with the failure.
    pub fn assert_case(&self, case: &CrashCase) -> Tally {
        self.check_case(case).unwrap_or_else(|failure| panic!("{failure}"))
    }

    /// Runs one case on a fresh folder: its kills, each followed by a
    /// restart, then a run to the end, then the verifier; checks the
    /// output shows what the case expects. The folder is deleted when the
    /// case passes and kept when it fails.
    pub fn check_case(&self, case: &CrashCase) -> Result<Tally, CrashFailure> {
        if !fault::ENABLED && (case.abort_pending_on_recover || case.steps.iter().any(|s| s != &Step::KillAtRandom)) {
            let (folder, _) = fresh(case);
            return Err(failure(case, folder, NO_FAULT_INJECTION.to_string()));
        }
        let mut rng = StdRng::seed_from_u64(self.seed);
        if case.steps.contains(&Step::KillAtRandom) {
            eprintln!(
                "crash kit: case `{}` kills at random, seed {} (rerun with {}={})",
                case.name,
                self.seed,
                seed::SEED_ENV,
                self.seed
            );
        }
        let mut done = Vec::new();
        let (folder, spec, steps) = match case.steps.split_first() {
            Some((Step::KillHalfWayThroughEntry { min_id }, rest)) => {
                let (folder, spec, nth) = self.killed_half_way_through_an_entry(case, *min_id)?;
                done.push(format!("store.before_fsync_entry:{nth} (half-way through an entry)"));
                (folder, spec, rest)
            }
            _ => {
                let (folder, spec) = fresh(case);
                (folder, spec, &case.steps[..])
            }
        };
        for step in steps {
            if *step == Step::SecondProcess {
                match self.second_process(&spec) {
                    Ok(what) => {
                        done.push(what);
                        continue;
                    }
                    Err(problem) => {
                        let problem = format!("{}: {problem}", done_so_far(&done));
                        return Err(failure(case, folder, problem));
                    }
                }
            }
            let (env, kill_after, what) = match step {
                Step::Kill { crash, delay } => {
                    let mut env = vec![(fault::CRASH_AT_ENV, crash.clone())];
                    let mut what = format!("{}={crash}", fault::CRASH_AT_ENV);
                    if let Some(delay) = delay {
                        env.push((fault::DELAY_AT_ENV, delay.clone()));
                        what += &format!(" with {}={delay}", fault::DELAY_AT_ENV);
                    }
                    (env, None, what)
                }
                Step::KillAtRandom => {
                    let at = rng.random_range(self.random_window.clone());
                    (Vec::new(), Some(at), format!("SIGKILL after {at:?}"))
                }
                Step::KillHalfWayThroughEntry { .. } => {
                    let problem = "a half-way-through-an-entry kill must be the case's first step".into();
                    return Err(failure(case, folder, problem));
                }
                Step::SecondProcess => unreachable!("handled above"),
            };
            let run = child::run((self.command)(&spec), &env, self.run_limit, kill_after);
            done.push(what.clone());
            let problem = match (&run.ending, step) {
                (Ending::KilledAt(line), Step::Kill { crash, .. }) if line.matches(crash) => None,
                (Ending::KilledAt(line), _) => Some(format!("the run of {what} died at another crash point: {line:?}")),
                (Ending::KilledByKit | Ending::Finished, Step::KillAtRandom) => None,
                (Ending::Finished, _) => Some(format!(
                    "the run of {what} finished without reaching its crash point: the source ends before the \
                     point's hit, or the pipeline never reaches that point (make the input longer or slower)"
                )),
                (ending, _) => Some(self.ended_badly("it", ending)),
            };
            if let Some(problem) = problem {
                let problem = with_log(&format!("after {}: {problem}", done.join(", then ")), &run);
                return Err(failure(case, folder, problem));
            }
        }
        let mut env = Vec::new();
        if case.abort_pending_on_recover {
            env.push((fault::ABORT_PENDING_ON_RECOVER_ENV, "1".to_string()));
        }
        let run = child::run((self.command)(&spec), &env, self.run_limit, None);
        let history = format!(
            "{} ({}), then a run to the end{}",
            done.join(", then "),
            case.guarantee.as_str(),
            if case.abort_pending_on_recover {
                format!(" with {}=1", fault::ABORT_PENDING_ON_RECOVER_ENV)
            } else {
                String::new()
            }
        );
        if run.ending != Ending::Finished {
            let mut problem = self.ended_badly("the run to the end", &run.ending);
            if case.steps.contains(&Step::SecondProcess) {
                problem = format!("{problem}\n  {SECOND_PROCESS_HINT}");
            }
            return Err(failure(
                case,
                folder,
                with_log(&format!("after {history}: {problem}"), &run),
            ));
        }
        let seen = match (self.verify)(&spec) {
            Ok(seen) => seen,
            Err(e) => {
                return Err(failure(
                    case,
                    folder,
                    format!("after {history}: the verifier failed: {e}"),
                ))
            }
        };
        let tally = Tally::of(&self.inputs, &seen);
        let problem = match case.expect {
            Expect::ExactlyOnce if tally.is_exact() => None,
            Expect::ExactlyOnce => Some(format!("exactly-once violated: {tally}")),
            Expect::DuplicatesWithoutLoss if tally.missing > 0 || !tally.unexpected.is_empty() => {
                Some(format!("at-least-once lost records: {tally}"))
            }
            Expect::DuplicatesWithoutLoss if tally.duplicates == 0 => Some(format!(
                "the verifier saw no duplicate in at-least-once mode, though the sink committed past the \
                 persisted checkpoint: it could not tell a broken exactly-once sink from a working one ({tally})"
            )),
            Expect::DuplicatesWithoutLoss => None,
            Expect::Loss if tally.missing == 0 => Some(format!(
                "nothing was lost though recovery handed the sink an empty list, so it should have aborted \
                 what the checkpoint listed. Either the verifier cannot see a loss (it reads uncommitted or \
                 staged output, or reports records from the inputs rather than the store), or the sink's \
                 recovery ignores the list it is given (it commits every transaction it finds instead of \
                 only the listed ones, or its pre-commit already made the output visible) ({tally})"
            )),
            Expect::Loss => None,
        };
        let problem = match (problem, &self.leftovers, case.expect) {
            (None, Some(leftovers), Expect::ExactlyOnce) => match leftovers(&spec) {
                Ok(left) if left.is_empty() => None,
                Ok(left) => Some(format!(
                    "the output is exact ({tally}), but the sink still holds {} thing(s) of this pipeline after the \
                     run to the end, e.g. {:?}: left behind by a crashed interval, and recovery did not abort them \
                     (it must abort every owned transaction the checkpoint does not list)",
                    left.len(),
                    &left[..left.len().min(3)]
                )),
                Err(e) => Some(format!("the leftovers check failed: {e}")),
            },
            (problem, _, _) => problem,
        };
        let problem = problem.map(|p| {
            if case.steps.contains(&Step::SecondProcess) {
                format!("{p}\n  {SECOND_PROCESS_HINT}")
            } else {
                p
            }
        });
        match problem {
            Some(problem) => Err(failure(case, folder, format!("after {history}: {problem}"))),
            None => {
                eprintln!("crash kit: case `{}` as expected after {history}: {tally}", case.name);
                Ok(tally)
            }
        }
    }

    /// [`Step::SecondProcess`] on the case `spec`: what happened, or why
    /// the step could not be taken.
    fn second_process(&self, spec: &Case) -> Result<String, String> {
        let hold = format!("sink.before_commit:1={}ms", plan::SECOND_PROCESS_HOLD.as_millis());
        let mut first = child::spawn((self.command)(spec), &[(fault::DELAY_AT_ENV, hold)]);
        let started = std::time::Instant::now();
        let marker = format!("{} point=sink.before_commit", fault::DELAY_MARKER);
        while !first.stderr_has(&marker) {
            if !first.is_running() || started.elapsed() >= self.run_limit {
                let run = first.finish(Duration::ZERO, None);
                return Err(with_log(
                    &format!(
                        "the first process never paused before its first commit (sink.before_commit:1): {} (the \
                         run must reach a first commit; make the input longer or slower)",
                        self.ended_badly("it", &run.ending)
                    ),
                    &run,
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Held (stopped) while the second runs to its end, whatever the
        // machine's load: its pre-committed transactions and its locks stay.
        first.signal(libc::SIGSTOP);
        let second_spec = Case {
            checkpoints: spec.dir.join("checkpoints-second-process"),
            ..spec.clone()
        };
        let second = child::run((self.command)(&second_spec), &[], self.run_limit, None);
        first.signal(libc::SIGCONT);
        let first = first.finish(self.run_limit, None);
        if !second_spec.checkpoints.exists() {
            return Err(with_log(
                &format!(
                    "the second process kept no checkpoints in {} (Case::checkpoints): the command must put the \
                     run's checkpoints there, or the case tests the checkpoint store's lock instead of the sink's",
                    second_spec.checkpoints.display()
                ),
                &second,
            ));
        }
        let outcome = |run: &Run| match &run.ending {
            Ending::Finished => Ok("ran to its end".to_string()),
            Ending::Failed(status) => Ok(format!("ended with {status}")),
            ending => Err(self.ended_badly("it", ending)),
        };
        let second_did = outcome(&second).map_err(|p| with_log(&format!("the second process: {p}"), &second))?;
        let first_did = outcome(&first).map_err(|p| with_log(&format!("the first process: {p}"), &first))?;
        Ok(format!(
            "a second process of the pipeline with another checkpoint folder, started while the first was held \
             before its first commit ({second_did}; the first then {first_did})"
        ))
    }

    fn ended_badly(&self, what: &str, ending: &Ending) -> String {
        match ending {
            Ending::Failed(status) => format!("{what} failed ({status})"),
            Ending::TimedOut => format!(
                "{what} was still running after {:?} (killed): a hang, an unbounded source, or a crash \
                 point never reached",
                self.run_limit
            ),
            Ending::KilledByKit => format!("{what} was killed by the kit"),
            Ending::KilledAt(line) => format!("{what} died at crash point {line:?}"),
            Ending::Finished => format!("{what} finished"),
        }
    }

    /// Kills fresh pipelines at hit 1, 2, … of `store.before_fsync_entry`
    /// until the temporary entry left has an id of at least `min_id`. That
    /// point is reached by checkpoint entries only (not by the layout or
    /// the id marks), and each region writes its entries in rising id
    /// order, so the hit that leaves one comes within `(min_id + 1) ×
    /// regions` tries plus one per aborted checkpoint, however slow the
    /// machine: the kit stops at the first, and gives up after
    /// [`HALF_WRITTEN_HITS`].
    fn killed_half_way_through_an_entry(
        &self,
        case: &CrashCase,
        min_id: u64,
    ) -> Result<(tempfile::TempDir, Case, u32), CrashFailure> {
        for nth in 1..=HALF_WRITTEN_HITS {
            let (folder, spec) = fresh(case);
            let crash = format!("store.before_fsync_entry:{nth}");
            let run = child::run(
                (self.command)(&spec),
                &[(fault::CRASH_AT_ENV, crash.clone())],
                self.run_limit,
                None,
            );
            match &run.ending {
                Ending::KilledAt(line) if line.matches(&crash) => {}
                ending => {
                    let problem = with_log(&self.ended_badly(&format!("the run of {crash}"), ending), &run);
                    return Err(failure(case, folder, problem));
                }
            }
            if half_written_entry(&spec.checkpoints).is_some_and(|id| id >= min_id) {
                return Ok((folder, spec, nth));
            }
        }
        let (folder, _) = fresh(case);
        let problem = format!(
            "no hit of store.before_fsync_entry among the first {HALF_WRITTEN_HITS} left a half-written entry {min_id} or later \
             under the case's `checkpoints` folder: does the pipeline keep its checkpoints in an \
             FsCheckpointStore rooted there?"
        );
        Err(failure(case, folder, problem))
    }
}

/// What a connector must do about a second process of its pipeline.
const SECOND_PROCESS_HINT: &str = "A second process of the same pipeline (started with another checkpoint folder) \
     wrote the same store: a connector must refuse it before it touches the store — \
     exactly_core::hold_instance_lock for stores on a file system, a lock of the store's own otherwise \
     (docs/connectors.md, \"Ownership\").";

/// The kills done so far, for a message.
fn done_so_far(done: &[String]) -> String {
    if done.is_empty() {
        "at the start".to_string()
    } else {
        format!("after {}", done.join(", then "))
    }
}

/// The hits of `store.before_fsync_entry` the kit tries for a half-written entry
/// (see `killed_half_way_through_an_entry`).
const HALF_WRITTEN_HITS: u32 = 48;

/// A fresh folder for `case`, and what the command is given.
fn fresh(case: &CrashCase) -> (tempfile::TempDir, Case) {
    let folder = tempfile::Builder::new()
        .prefix(&format!("exactly-crash-{}-", case.name))
        .tempdir()
        .expect("creating a crash case's folder");
    let spec = Case {
        name: case.name.clone(),
        dir: folder.path().to_path_buf(),
        checkpoints: folder.path().join("checkpoints"),
        guarantee: case.guarantee,
    };
    (folder, spec)
}

/// The failure of `case`, keeping its folder.
/// Why a case that needs crash points cannot run in a build without them.
const NO_FAULT_INJECTION: &str = "this test build has no fault injection, so the pipeline cannot be killed at a \
     crash point: add `exactly-core = { version = \"…\", features = [\"fault-injection\"] }` to the \
     `[dev-dependencies]` of the crate whose test runs the kit (cargo then builds its pipeline binary with the \
     crash points; a release build never has them)";

fn failure(case: &CrashCase, folder: tempfile::TempDir, problem: String) -> CrashFailure {
    CrashFailure {
        case: case.name.clone(),
        problem,
        dir: folder.keep(),
    }
}

fn with_log(problem: &str, run: &Run) -> String {
    format!("{problem}\n  last lines of its log:\n{}", run.tail(25))
}
