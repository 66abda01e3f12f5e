//! One run of the author's pipeline as a child process: the fault
//! variables of the run set (and every other one removed), its output
//! drained while it runs, bounded in time, and how it ended.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exactly_core::fault;

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Ending {
    /// Exit status 0.
    Finished,
    /// Another exit status, or a signal other than the kit's or a crash
    /// point's SIGKILL.
    Failed(ExitStatus),
    /// A crash point killed it; what its line on stderr says.
    KilledAt(CrashLine),
    /// The kit killed it (a random kill).
    KilledByKit,
    /// Still running after the run's time limit (then killed).
    TimedOut,
}

/// The `EXACTLY_CRASH_POINT_REACHED point=… subtask=… hit=…` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct CrashLine {
    pub(super) point: String,
    pub(super) subtask: Option<usize>,
    pub(super) hit: u32,
}

impl CrashLine {
    fn find(log: &str) -> Option<CrashLine> {
        let line = log
            .lines()
            .find_map(|l| l.split_once(fault::CRASH_MARKER).map(|(_, rest)| rest))?;
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_string)
        };
        Some(CrashLine {
            point: field("point")?,
            subtask: field("subtask")?.parse().ok(),
            hit: field("hit")?.parse().ok()?,
        })
    }

    /// Whether this is where `EXACTLY_CRASH_AT=spec` kills
    /// (`<point>[@<subtask>][:<nth>]`).
    pub(super) fn matches(&self, spec: &str) -> bool {
        let (point, subtask, nth) = fault::parse_spec(spec);
        self.point == point && self.hit == nth && (subtask.is_none() || self.subtask == subtask)
    }
}

/// A finished run.
pub(super) struct Run {
    pub(super) ending: Ending,
    /// Its stderr, then its stdout.
    pub(super) log: String,
}

impl Run {
    /// The last `lines` lines of the log.
    pub(super) fn tail(&self, lines: usize) -> String {
        let all: Vec<&str> = self.log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// Copies `pipe` into `into` as it comes, so the kit can read what a
/// running process wrote so far.
fn stream(mut pipe: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(&chunk[..n]);
        }
    })
}

/// A run going on in the background.
pub(super) struct Running {
    child: Child,
    started: Instant,
    stdout: JoinHandle<Vec<u8>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_done: JoinHandle<()>,
}

/// Starts `command` with the fault variables `env` (all others removed).
pub(super) fn spawn(mut command: Command, env: &[(&str, String)]) -> Running {
    for var in [
        fault::CRASH_AT_ENV,
        fault::DELAY_AT_ENV,
        fault::FAIL_AT_ENV,
        fault::ABORT_PENDING_ON_RECOVER_ENV,
    ] {
        command.env_remove(var);
    }
    command
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("crash kit: cannot start the pipeline's command {command:?}: {e}"));
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let stderr_done = stream(child.stderr.take().expect("piped"), stderr.clone());
    Running {
        child,
        started: Instant::now(),
        stdout,
        stderr,
        stderr_done,
    }
}

impl Running {
    /// Whether its stderr so far has a line containing `needle`.
    pub(super) fn stderr_has(&self, needle: &str) -> bool {
        let bytes = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&bytes).contains(needle)
    }

    /// Sends it `signal` (SIGSTOP to hold it, SIGCONT to let it go on).
    pub(super) fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
    }

    /// Whether it is still running.
    pub(super) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until it ends, at most `limit` from its start (then kills it);
    /// `kill_after` kills it earlier with SIGKILL (a random kill).
    pub(super) fn finish(mut self, limit: Duration, kill_after: Option<Duration>) -> Run {
        let mut killed_by_kit = false;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the pipeline") {
                break Some(status);
            }
            let elapsed = self.started.elapsed();
            if kill_after.is_some_and(|at| elapsed >= at) && !killed_by_kit {
                killed_by_kit = true;
                let _ = self.child.kill();
            } else if elapsed >= limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let _ = self.stderr_done.join();
        let stderr = String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
        let stdout = String::from_utf8_lossy(&self.stdout.join().unwrap_or_default()).into_owned();
        let log = format!("{stderr}{stdout}");
        let ending = match status {
            None => Ending::TimedOut,
            Some(status) if status.success() => Ending::Finished,
            Some(status) if status.signal() == Some(libc::SIGKILL) => match CrashLine::find(&log) {
                Some(line) => Ending::KilledAt(line),
                None if killed_by_kit => Ending::KilledByKit,
                None => Ending::Failed(status),
            },
            Some(status) => Ending::Failed(status),
        };
        Run { ending, log }
    }
}

/// Runs `command` with the fault variables `env` (all others removed) for
/// at most `limit`; `kill_after` kills it earlier with SIGKILL (a random
/// kill).
pub(super) fn run(command: Command, env: &[(&str, String)], limit: Duration, kill_after: Option<Duration>) -> Run {
    spawn(command, env).finish(limit, kill_after)
}

#[cfg(test)]
mod tests {
    use super::CrashLine;

    #[test]
    fn crash_lines_name_point_subtask_and_hit() {
        let log = "INFO starting\nEXACTLY_CRASH_POINT_REACHED point=sink.after_commit subtask=0 hit=2\n";
        let line = CrashLine::find(log).unwrap();
        assert_eq!(
            line,
            CrashLine {
                point: "sink.after_commit".into(),
                subtask: Some(0),
                hit: 2
            }
        );
        assert!(line.matches("sink.after_commit@0:2"));
        assert!(line.matches("sink.after_commit:2"));
        assert!(!line.matches("sink.after_commit@1:2"));
        assert!(!line.matches("sink.after_commit"));
        let line =
            CrashLine::find("EXACTLY_CRASH_POINT_REACHED point=coordinator.after_persist subtask=- hit=1").unwrap();
        assert_eq!(line.subtask, None);
        assert!(line.matches("coordinator.after_persist"));
        assert_eq!(CrashLine::find("no crash here"), None);
    }
}
