//! A crash matrix for any connector: SIGKILL a pipeline at every crash
//! point of the runtime and at random moments, restart it until it
//! finishes, and check with the author's verifier that every input landed
//! exactly once — and that the verifier can tell when it did not.
//!
//! The author gives three things:
//!
//! - the inputs: every record's identity as the verifier reports it;
//! - a command running the pipeline as a child process for a [`Case`]
//!   (typically a `[[bin]]` target of the connector's crate that builds a
//!   `Pipeline` from its factories, an `FsCheckpointStore` rooted at
//!   [`Case::checkpoints`] and the [`Case::guarantee`], with a bounded
//!   source and `RestartStrategy::None`, and exits 0 once the source is
//!   exhausted). The runtime's crash points read `EXACTLY_CRASH_AT` and
//!   friends (see `exactly_core::fault`) from the environment, which the
//!   kit sets per run; they exist only in a build with fault injection,
//!   which the test's crate asks for with `exactly-core = { …, features =
//!   ["fault-injection"] }` in its `[dev-dependencies]` (cargo then builds
//!   the `[[bin]]` with them for `cargo test`, and never for a release);
//! - a verifier returning every record the sink's output holds for the
//!   case (committed output only, duplicates included).
//!
//! [`CrashMatrix::run`] then checks, one case after the other on fresh
//! folders ([`plan`] lists them):
//!
//! - **exactly once** after a SIGKILL while writing, after a pre-commit
//!   before the persist, with every ack in, half-way through writing a
//!   checkpoint entry, after the persist before any commit, between two
//!   sink subtasks' commits, during recovery, several in a row, and at
//!   random moments (seeded; the seed is printed, `EXACTLY_CRASH_SEED`
//!   reruns it);
//! - **exactly once with a second process** of the pipeline started with
//!   another checkpoint folder while the first holds its first commit
//!   ([`plan::Step::SecondProcess`]; the command must put that run's
//!   checkpoints in [`Case::checkpoints`], and the sink should refuse it:
//!   `exactly_core::hold_instance_lock`);
//! - the **at-least-once control**: the same pipeline at-least-once,
//!   killed right after a sink's commit at the barrier, must show
//!   duplicates (and no loss);
//! - the **abort-on-recover control**: killed after a persist, recovered
//!   with `EXACTLY_TEST_ABORT_PENDING_ON_RECOVER=1` (the runtime then hands
//!   every sink an empty list, so it aborts what the checkpoint lists), must
//!   show loss.
//!
//! The controls prove the verifier able to fail; a sink that cannot
//! duplicate or lose that way (idempotent writes, output visible at once)
//! leaves them out, saying why. Every killed run must die at its very
//! crash point (the runtime writes `EXACTLY_CRASH_POINT_REACHED point=…` to
//! stderr first), and a point never reached fails the case instead of
//! passing it. A failure names the case, the kills, the first missing and
//! first duplicated record and the end of the log, and keeps the case's
//! folder.
//!
//! ```no_run
//! use std::process::Command;
//! use exactly_crash_kit::{Case, CrashMatrix};
//!
//! let inputs: Vec<String> = (0..2000).map(|i| format!("line-{i}")).collect();
//! CrashMatrix::new(
//!     inputs,
//!     |case: &Case| {
//!         let mut run = Command::new("target/debug/my-pipeline"); // env!("CARGO_BIN_EXE_my-pipeline") in a test
//!         run.arg(&case.dir).arg(&case.checkpoints).arg(case.guarantee.as_str());
//!         run
//!     },
//!     |case: &Case| {
//!         let text = std::fs::read_to_string(case.dir.join("out.txt")).map_err(|e| e.to_string())?;
//!         Ok(text.lines().map(str::to_string).collect())
//!     },
//! )
//! .run();
//! ```

mod case;
mod child;
mod matrix;
pub mod plan;
mod seed;
mod tally;
mod torn;

pub use case::Case;
pub use matrix::{CrashFailure, CrashMatrix};
pub use plan::{CrashCase, Expect, Step};
pub use seed::SEED_ENV;
pub use tally::Tally;
