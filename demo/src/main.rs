//! `exactly-demo`: exactly's self-verifying demo. It starts a Kafka broker
//! and a PostgreSQL server of its own, produces orders, runs the pipeline
//! Kafka → PostgreSQL through exactly's own command, kills it with SIGKILL
//! right after a checkpoint listing prepared transactions was persisted,
//! restarts it and checks that every order is in the table exactly once.
//!
//! The terminal shows the demo's numbered steps and its verdict; every
//! log line (the services', the pipeline's, the libraries') goes to the
//! log file whose path it prints first. A failure prints its error and
//! that path.
//!
//! The pipeline runs in a child process, this same binary started as
//! `exactly-demo exactly run <file>` ([`PIPELINE_ARG`]), which is
//! `exactly run` itself ([`exactly::cli`]) in a build with fault injection:
//! that is how the demo can kill it at a chosen point of the protocol.
//! The `exactly` binary has no such switch.

mod logfile;
mod orders;
mod story;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// First argument that makes this binary the pipeline's process: the
/// arguments after it are `exactly`'s.
pub(crate) const PIPELINE_ARG: &str = "exactly";

/// The command line of the demo.
#[derive(Parser)]
#[command(
    name = "exactly-demo",
    version,
    about = "Kafka -> PostgreSQL exactly once across a SIGKILL, verified"
)]
struct Args {
    /// Working folder (must be new or empty; default: a fresh temporary
    /// folder, kept with the log).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    let program = args.next().unwrap_or_default();
    let rest: Vec<_> = args.collect();
    if rest.first().is_some_and(|a| a == PIPELINE_ARG) {
        return match exactly::cli::main_from(std::iter::once(program).chain(rest.into_iter().skip(1))) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("Error: {error:?}");
                ExitCode::FAILURE
            }
        };
    }
    let args = Args::parse();
    match story::run(args.dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            println!();
            println!("the demo failed: {:#}", failure.error);
            if let Some(tail) = &failure.log_tail {
                println!("   last lines of the log:");
                for line in tail.lines() {
                    println!("   | {line}");
                }
            }
            if let Some(log) = &failure.log {
                println!("   full log: {}", log.display());
            }
            ExitCode::FAILURE
        }
    }
}
