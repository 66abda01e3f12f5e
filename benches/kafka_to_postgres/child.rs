//! The measured child processes: spawn them, follow their output (checkpoint
//! durations, COPYs, readiness), sample their peak RSS, reap them with
//! `wait4`.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::measure::{seconds, vm_hwm_kib};

/// Where every child's stderr is kept: `target/tmp/kafka_to_postgres/<run>-{tp,lat}.log`.
pub fn log_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("kafka_to_postgres")
}

pub enum ChildEvent {
    /// A "checkpoint complete" log line.
    Checkpoint,
    /// A baseline printed "ready" (assigned and connected).
    Ready,
}

pub struct Running {
    child: Child,
    started: Instant,
    events: mpsc::Receiver<ChildEvent>,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<StderrSummary>,
    /// This process's peak RSS when the child was spawned (KiB): the floor of
    /// the child's `ru_maxrss` (see [`Running::finish`]).
    parent_hwm_kib: i64,
    /// The child's own peak RSS (`VmHWM`), sampled every 20 ms (KiB).
    sampled_hwm_kib: Arc<AtomicI64>,
    reaped: Arc<AtomicBool>,
    sampler: JoinHandle<()>,
}

/// What the stderr of a child told.
#[derive(Default)]
pub struct StderrSummary {
    /// `duration_ms` of every "checkpoint complete" line.
    pub checkpoints: Vec<u64>,
    /// COPYs of rows the PostgreSQL sink finished: its "rows written" debug
    /// lines (one per COPY, `exactly_postgres=debug`), and their `rows=`.
    pub copies: u64,
    pub copied_rows: u64,
    /// When the child was ready to move records: its last "Kafka source
    /// assigned" or "bounded run: reading up to" line (every source has its
    /// partitions, and its end offsets in a bounded run) or "[baseline] ...
    /// assigned" line.
    pub ready_after: Option<Duration>,
    /// How many lines matched each of [`WATCHED`].
    watched: [usize; WATCHED.len()],
    pub log_tail: String,
}

/// Log lines worth a note under the table: (what the line contains, what it means).
const WATCHED: [(&str, &str); 3] = [
    ("failed; restarting from its latest complete checkpoint", "restarts"),
    (
        "partition discovery failed",
        "partition discovery requests that timed out after 5 s (the broker answered late)",
    ),
    ("checkpoint aborted", "aborted checkpoints"),
];

impl StderrSummary {
    pub fn notes(&self, phase: &str) -> Vec<String> {
        WATCHED
            .iter()
            .zip(self.watched)
            .filter(|(_, n)| *n > 0)
            .map(|((_, what), n)| format!("{phase}: {n} log lines about {what}"))
            .collect()
    }
}

pub struct Finished {
    status: i32,
    pub wall: Duration,
    /// Peak RSS of the child alone (KiB), see [`Running::finish`].
    pub max_rss_kib: i64,
    /// User + system CPU seconds of the child.
    pub cpu_s: f64,
    /// Times the child's threads gave up a CPU: (waiting, preempted), from
    /// its rusage (`ru_nvcsw`, `ru_nivcsw`).
    pub context_switches: (u64, u64),
    pub stdout: String,
    pub log: StderrSummary,
}

/// Removes ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The number after `field=` in `text`.
fn field_value(text: &str, field: &str) -> Option<u64> {
    let key = format!("{field}=");
    let at = text
        .match_indices(&key)
        .map(|(i, _)| i)
        .find(|i| *i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric() && text.as_bytes()[i - 1] != b'_')?;
    let digits: String = text[at + key.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// `duration_ms=N` of a "checkpoint complete" log line.
fn checkpoint_duration(line: &str) -> Option<u64> {
    let at = line.find("checkpoint complete")?;
    field_value(&line[at..], "duration_ms")
}

/// `rows=N` of the PostgreSQL sink's "rows written" line (one per COPY).
fn rows_written(line: &str) -> Option<u64> {
    if !line.contains("exactly_postgres") {
        return None;
    }
    let at = line.find("rows written")?;
    field_value(&line[at..], "rows")
}
impl Running {
    pub fn spawn(mut cmd: Command, log: &Path) -> Result<Running> {
        std::fs::create_dir_all(log_dir())?;
        let mut log =
            std::io::BufWriter::new(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // A spawned child starts its rusage with this process's peak RSS (the
        // kernel carries the old address space's high-water mark over exec):
        // give freed heap back, reset our mark to the current RSS, then
        // remember it as the floor.
        // SAFETY: malloc_trim only releases free memory of the allocator.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        unsafe {
            libc::malloc_trim(0);
        }
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let parent_hwm_kib = vm_hwm_kib("self").unwrap_or(i64::MAX);
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let started = Instant::now();
        let reaped = Arc::new(AtomicBool::new(false));
        let sampled_hwm_kib = Arc::new(AtomicI64::new(0));
        let sampler = {
            let (reaped, sampled) = (reaped.clone(), sampled_hwm_kib.clone());
            let pid = child.id().to_string();
            std::thread::spawn(move || {
                while !reaped.load(Ordering::SeqCst) {
                    if let Some(kib) = vm_hwm_kib(&pid) {
                        sampled.fetch_max(kib, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let (tx, events) = mpsc::channel();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        let tx_out = tx.clone();
        let stdout = std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.trim() == "ready" {
                    let _ = tx_out.send(ChildEvent::Ready);
                }
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        let stderr = std::thread::spawn(move || {
            let mut durations = Vec::new();
            let (mut copies, mut copied_rows) = (0, 0);
            let mut ready_after = None;
            let mut watched = [0; WATCHED.len()];
            let mut tail: VecDeque<String> = VecDeque::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let line = strip_ansi(&line);
                let _ = writeln!(log, "{line}");
                if line.contains("bounded run: reading up to")
                    || line.contains("Kafka source assigned")
                    || line.starts_with("[baseline]") && line.contains("assigned")
                {
                    ready_after = Some(started.elapsed());
                }
                if line.starts_with("[baseline]") {
                    eprintln!("{line}");
                }
                for (count, (pattern, _)) in watched.iter_mut().zip(WATCHED) {
                    if line.contains(pattern) {
                        *count += 1;
                    }
                }
                if let Some(ms) = checkpoint_duration(&line) {
                    durations.push(ms);
                    let _ = tx.send(ChildEvent::Checkpoint);
                }
                if let Some(rows) = rows_written(&line) {
                    copies += 1;
                    copied_rows += rows;
                }
                if tail.len() == 40 {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            let _ = log.flush();
            StderrSummary {
                checkpoints: durations,
                copies,
                copied_rows,
                ready_after,
                watched,
                log_tail: Vec::from(tail).join("\n"),
            }
        });
        Ok(Running {
            child,
            started,
            events,
            stdout,
            stderr,
            parent_hwm_kib,
            sampled_hwm_kib,
            reaped,
            sampler,
        })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits until `wanted` is reported (or the child exits, or `timeout`).
    pub fn wait_for(&self, timeout: Duration, wanted: fn(&ChildEvent) -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(e) if wanted(&e) => return Ok(()),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => bail!("not ready within {timeout:?}"),
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the process ended before it was ready"),
            }
        }
    }

    /// True once the child has exited (without reaping it: `finish` does).
    pub fn has_exited(&self) -> bool {
        // SAFETY: an all-zero siginfo is valid; waitid with WNOWAIT leaves
        // the child waitable.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                self.pid() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: waitid filled `info` (si_pid stays 0 while the child runs).
        rc == 0 && unsafe { info.si_pid() } != 0
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions; the child is not
        // reaped yet, so the pid still names it.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// Reaps the child with `wait4` (peak RSS from its rusage), killing it
    /// after `timeout`.
    pub fn finish(self, timeout: Duration) -> Result<Finished> {
        let pid = self.pid();
        let reaped = self.reaped.clone();
        let watchdog = {
            let reaped = reaped.clone();
            let deadline = self.started + timeout;
            std::thread::spawn(move || {
                while !reaped.load(Ordering::SeqCst) {
                    if Instant::now() > deadline {
                        eprintln!("[bench] pid {pid} exceeded {timeout:?}: SIGKILL");
                        // SAFETY: as in `signal`; `reaped` is still false.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value that wait4 overwrites.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: both pointers are valid for the call.
            let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            if rc == pid {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                reaped.store(true, Ordering::SeqCst);
                return Err(err).context("wait4");
            }
        }
        let wall = self.started.elapsed();
        reaped.store(true, Ordering::SeqCst);
        let _ = watchdog.join();
        let _ = self.sampler.join();
        let stdout = self.stdout.join().unwrap_or_default();
        let log = self.stderr.join().unwrap_or_default();
        // ru_maxrss is max(our peak at spawn, the child's own peak): above the
        // floor it is the child's exact peak; at the floor only the sampled
        // VmHWM says how much the child itself used.
        let sampled = self.sampled_hwm_kib.load(Ordering::SeqCst);
        let max_rss_kib = if usage.ru_maxrss > self.parent_hwm_kib {
            usage.ru_maxrss.max(sampled)
        } else {
            sampled
        };
        eprintln!(
            "[bench] pid {pid}: ru_maxrss {} KiB (floor: this process's {} KiB at spawn), sampled VmHWM {sampled} KiB",
            usage.ru_maxrss, self.parent_hwm_kib
        );
        Ok(Finished {
            status,
            wall,
            max_rss_kib,
            cpu_s: seconds(usage.ru_utime) + seconds(usage.ru_stime),
            context_switches: (usage.ru_nvcsw.max(0) as u64, usage.ru_nivcsw.max(0) as u64),
            stdout,
            log,
        })
    }
}

impl Finished {
    pub fn success(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }

    pub fn describe_status(&self) -> String {
        if libc::WIFEXITED(self.status) {
            format!("exit code {}", libc::WEXITSTATUS(self.status))
        } else if libc::WIFSIGNALED(self.status) {
            format!("signal {}", libc::WTERMSIG(self.status))
        } else {
            format!("wait status {}", self.status)
        }
    }
}
