//! The crash matrix: runs the author's pipeline through every crash case,
//! restarting it after each kill, and checks the output with the author's
//! verifier.

use std::ops::Range;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use exactly_core::fault;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
        }
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
                done.push(format!("store.before_fsync:{nth} (half-way through an entry)"));
                (folder, spec, rest)
            }
            _ => {
                let (folder, spec) = fresh(case);
                (folder, spec, &case.steps[..])
            }
        };
        for step in steps {
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
                    let at = rng.gen_range(self.random_window.clone());
                    (Vec::new(), Some(at), format!("SIGKILL after {at:?}"))
                }
                Step::KillHalfWayThroughEntry { .. } => {
                    let problem = "a half-way-through-an-entry kill must be the case's first step".into();
                    return Err(failure(case, folder, problem));
                }
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
            let problem = self.ended_badly("the run to the end", &run.ending);
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
                "the verifier saw no loss though recovery aborted what the checkpoint listed: it could not \
                 tell a sink that loses pre-committed transactions from a working one ({tally})"
            )),
            Expect::Loss => None,
        };
        match problem {
            Some(problem) => Err(failure(case, folder, format!("after {history}: {problem}"))),
            None => {
                eprintln!("crash kit: case `{}` as expected after {history}: {tally}", case.name);
                Ok(tally)
            }
        }
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

    /// Kills fresh pipelines at hit 1, 2, … of `store.before_fsync` until
    /// the temporary file left is an entry with an id of at least `min_id`.
    fn killed_half_way_through_an_entry(
        &self,
        case: &CrashCase,
        min_id: u64,
    ) -> Result<(tempfile::TempDir, Case, u32), CrashFailure> {
        for nth in 1..=12 {
            let (folder, spec) = fresh(case);
            let crash = format!("store.before_fsync:{nth}");
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
            "no hit of store.before_fsync among the first 12 left a half-written entry {min_id} or later \
             under the case's `checkpoints` folder: does the pipeline keep its checkpoints in an \
             FsCheckpointStore rooted there?"
        );
        Err(failure(case, folder, problem))
    }
}

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
