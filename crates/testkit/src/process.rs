//! Plumbing shared by every service: free loopback ports, readiness polling,
//! log tails, binary lookup, temp dirs and process-group management.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::error::{Result, TestkitError};
use crate::handle::Lifecycle;

/// How long a service may take to accept TCP connections.
pub(crate) const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait for a port to close after a service was stopped.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How many fresh ports a start-up tries when it loses a race for a port.
const PORT_ATTEMPTS: usize = 3;
const LOG_TAIL_LINES: usize = 40;
const LOG_TAIL_BYTES: u64 = 16 * 1024;

/// Ports handed out by [`free_port`] in this process, so that two services
/// started concurrently by parallel tests never get the same one.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Picks a currently free TCP port on 127.0.0.1.
///
/// The port is chosen by the operating system and is never handed out twice
/// by the same process. Another process may still grab it before the service
/// binds it; the service starters detect that and retry on a new port.
pub fn free_port() -> Result<u16> {
    for _ in 0..256 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|source| TestkitError::Io {
            service: "testkit",
            action: "binding 127.0.0.1:0 to find a free port".into(),
            fix: "make sure the loopback interface is up and the process may open sockets",
            source,
        })?;
        let port = listener
            .local_addr()
            .map_err(|source| TestkitError::Io {
                service: "testkit",
                action: "reading the address of a probe socket".into(),
                fix: "make sure the loopback interface is up",
                source,
            })?
            .port();
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
    Err(TestkitError::Io {
        service: "testkit",
        action: "finding a loopback port not used before by this process".into(),
        fix: "run fewer services at once",
        source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
    })
}

/// Whether something accepts TCP connections on `127.0.0.1:port` right now.
pub fn port_accepts(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(250)).is_ok()
}

/// Waits until nothing accepts connections on `port` any more; returns
/// whether it closed within the shutdown timeout.
pub(crate) fn wait_port_closed(port: u16) -> bool {
    let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
    while port_accepts(port) {
        if Instant::now() >= deadline {
            return false;
        }
        sleep(POLL_INTERVAL);
    }
    true
}

/// The parts of a start-up error that do not change while waiting.
pub(crate) struct Startup<'a> {
    pub(crate) service: &'static str,
    pub(crate) port: u16,
    pub(crate) log: &'a Path,
    pub(crate) fix: &'static str,
}

impl Startup<'_> {
    /// Builds a [`TestkitError::StartFailed`] with the log tail.
    pub(crate) fn failed(&self, reason: impl Into<String>) -> TestkitError {
        TestkitError::StartFailed {
            service: self.service,
            port: self.port,
            reason: reason.into(),
            log: self.log.display().to_string(),
            log_tail: log_tail(self.log),
            fix: self.fix,
        }
    }

    /// Polls until the port accepts TCP connections.
    ///
    /// `exited` is asked on every round whether the service already died; it
    /// returns the reason if so. The whole wait is bounded by
    /// [`STARTUP_TIMEOUT`] counted from `started`.
    pub(crate) fn wait_for_port(&self, started: Instant, mut exited: impl FnMut() -> Option<String>) -> Result<()> {
        loop {
            if let Some(reason) = exited() {
                return Err(self.failed(reason));
            }
            if port_accepts(self.port) {
                // A process that lost the race for the port dies right after
                // start; make sure the one that answered is still ours.
                sleep(POLL_INTERVAL * 2);
                return match exited() {
                    Some(reason) => Err(self.failed(reason)),
                    None => Ok(()),
                };
            }
            if started.elapsed() >= STARTUP_TIMEOUT {
                return Err(self.failed(format!("no connection accepted within {} s", STARTUP_TIMEOUT.as_secs())));
            }
            sleep(POLL_INTERVAL);
        }
    }
}

/// Runs `attempt` with a fresh free port, retrying on a new port when the
/// attempt failed because another process took the port first.
pub(crate) fn with_free_port<T>(service: &'static str, mut attempt: impl FnMut(u16) -> Result<T>) -> Result<T> {
    let mut tries = 0;
    loop {
        tries += 1;
        let port = free_port()?;
        match attempt(port) {
            Err(err) if tries < PORT_ATTEMPTS && err.is_port_conflict() => {
                tracing::warn!(service, port, "port was taken by someone else, retrying");
            }
            other => return other,
        }
    }
}

/// The last lines of a log file, or a note saying why there are none.
pub(crate) fn log_tail(path: &Path) -> String {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(err) => return format!("(no log: {err})"),
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > LOG_TAIL_BYTES {
        let _ = file.seek(SeekFrom::Start(len - LOG_TAIL_BYTES));
    }
    let mut bytes = Vec::new();
    if let Err(err) = file.read_to_end(&mut bytes) {
        return format!("(cannot read log: {err})");
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(LOG_TAIL_LINES);
    if lines.is_empty() {
        "(log is empty)".into()
    } else {
        lines[start..].join("\n")
    }
}

/// Searches `PATH`, then `extra_dirs`, for an executable called `name`.
pub(crate) fn find_binary(name: &str, extra_dirs: &[PathBuf]) -> Option<PathBuf> {
    search_dirs(extra_dirs)
        .into_iter()
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// `PATH`'s directories followed by `extra_dirs`.
pub(crate) fn search_dirs(extra_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    dirs.extend(extra_dirs.iter().cloned());
    dirs
}

/// Human-readable list of the places [`find_binary`] looks in.
pub(crate) fn describe_search(extra_dirs: &[PathBuf]) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut text = format!("PATH={path}");
    for dir in extra_dirs {
        text.push_str(", ");
        text.push_str(&dir.display().to_string());
    }
    text
}

/// `$XDG_CACHE_HOME/exactly`, or `~/.cache/exactly` (the temporary
/// folder without a home): where the install script puts the services'
/// jars and distributions.
pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("exactly")
}

/// `java` from `$JAVA_HOME/bin`, else from `PATH`; `Err` with the places
/// searched (for a [`TestkitError::BinaryNotFound`]).
pub(crate) fn find_java() -> std::result::Result<PathBuf, String> {
    let java_home: Vec<PathBuf> = std::env::var_os("JAVA_HOME")
        .map(|home| vec![PathBuf::from(home).join("bin")])
        .unwrap_or_default();
    java_home
        .iter()
        .map(|dir| dir.join("java"))
        .find(|java| is_executable(java))
        .or_else(|| find_binary("java", &[]))
        .ok_or_else(|| describe_search(&java_home))
}

/// Whether `path` is a regular file (after symlinks) with an execute bit.
pub(crate) fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// File in a service temp dir holding the pid of the process that owns it.
const OWNER_FILE: &str = "owner.pid";
/// File in a service's working dir holding the pid (= process group id) of
/// the service process.
pub(crate) const SERVICE_PID_FILE: &str = "service.pid";
/// Pid files of services left in a temp dir: ours, and PostgreSQL's.
const STALE_PID_FILES: &[&str] = &[SERVICE_PID_FILE, "data/postmaster.pid"];

/// Creates a fresh temp dir named `prefix*`, traversable by every user
/// (mode 0755) so that a service running as another OS user can reach it,
/// and records this process as its owner.
///
/// It lives under `/tmp` when that exists (short paths keep Unix socket
/// names under their length limit), else under the system temp dir. Before
/// creating it, dirs with the same prefix whose owner process is gone (a
/// test run killed before it could clean up) are reaped.
pub(crate) fn service_temp_dir(service: &'static str, prefix: &str) -> Result<TempDir> {
    let base = Path::new("/tmp");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    reap_stale_dirs(&base, prefix);
    let io = |action: String| {
        move |source| TestkitError::Io {
            service,
            action,
            fix: "make sure /tmp (or $TMPDIR) exists and is writable",
            source,
        }
    };
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&base)
        .map_err(io(format!("creating a temp dir in {}", base.display())))?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))
        .map_err(io(format!("making {} traversable", dir.path().display())))?;
    let owner = dir.path().join(OWNER_FILE);
    fs::write(&owner, std::process::id().to_string()).map_err(io(format!("writing {}", owner.display())))?;
    Ok(dir)
}

/// Kills the services left in `base/prefix*` dirs whose owner process no
/// longer exists, and removes those dirs.
///
/// A service process is only killed if its working directory lies inside
/// the stale dir, so a recycled pid never hits an unrelated process.
fn reap_stale_dirs(base: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let dir = entry.path();
        // No owner file: another process may be creating this dir right now.
        let Some(owner) = read_pid(&dir.join(OWNER_FILE)) else {
            continue;
        };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        for pid_file in STALE_PID_FILES {
            let Some(pid) = read_pid(&dir.join(pid_file)) else {
                continue;
            };
            let cwd = fs::read_link(format!("/proc/{pid}/cwd"));
            if cwd.is_ok_and(|cwd| cwd.starts_with(&dir)) {
                tracing::warn!(pid, dir = %dir.display(), "killing a service left by a dead test run");
                kill_process_group(pid);
            }
        }
        match fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(dir = %dir.display(), "removed a stale service dir"),
            Err(err) => tracing::debug!(dir = %dir.display(), %err, "cannot remove stale dir"),
        }
    }
}

/// First line of a pid file as a pid.
pub(crate) fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.lines().next()?.trim().parse().ok()
}

/// The value of an environment variable naming an external service, if it
/// is set and not blank.
pub(crate) fn external_address(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Best-effort port of an address such as `postgres://u@h:5432/db`,
/// `redis://h:6379/` or `h1:9092,h2:9092`; `default` when none is given.
pub(crate) fn port_of_address(address: &str, default: u16) -> u16 {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let first = host_port.split(',').next().unwrap_or(host_port);
    first
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(default)
}

/// Renders a command line for error messages and logs.
pub(crate) fn describe_command(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// Runs a short-lived helper command to completion, capturing its output;
/// a non-zero exit becomes [`TestkitError::CommandFailed`] whose output also
/// carries the tail of `log`, when given.
pub(crate) fn run_command(
    service: &'static str,
    cmd: &mut Command,
    log: Option<&Path>,
    fix: &'static str,
) -> Result<String> {
    let command = describe_command(cmd);
    tracing::debug!(service, %command, "running");
    let output = cmd.stdin(Stdio::null()).output().map_err(|source| TestkitError::Io {
        service,
        action: format!("running `{command}`"),
        fix,
        source,
    })?;
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    if output.status.success() {
        return Ok(text);
    }
    if let Some(log) = log {
        text.push_str(&format!("\n--- tail of {} ---\n{}", log.display(), log_tail(log)));
    }
    Err(TestkitError::CommandFailed {
        service,
        command,
        status: output.status.to_string(),
        output: text,
        fix,
    })
}

/// Sends SIGKILL to every process in the process group `pgid`.
pub(crate) fn kill_process_group(pgid: u32) {
    signal_process_group(pgid, libc::SIGKILL);
}

/// Freezes (SIGSTOP) or thaws (SIGCONT) every process of the process
/// group `pgid` and returns once every thread of each is stopped (or none
/// is), as `/proc/<pid>/task/*/stat` tells: a signal is delivered
/// asynchronously, and a request sent right after `freeze` must meet a
/// frozen service. An error when that has not happened within 5 s.
pub(crate) fn freeze_process_group(pgid: u32, frozen: bool, service: &'static str) -> Result<()> {
    signal_process_group(pgid, if frozen { libc::SIGSTOP } else { libc::SIGCONT });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pending = group_threads_not_yet(pgid, frozen);
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(TestkitError::SignalNotTaken {
                service,
                action: if frozen { "freeze (SIGSTOP)" } else { "thaw (SIGCONT)" },
                threads: pending.join(", "),
            });
        }
        sleep(Duration::from_millis(5));
    }
}

/// The threads (`pid/tid`) of process group `pgid` that are not yet
/// stopped (`stopped`), or not yet running again. A thread that exits
/// meanwhile counts as done.
fn group_threads_not_yet(pgid: u32, stopped: bool) -> Vec<String> {
    // `/proc/<pid>/stat`: `pid (comm) state ppid pgrp ...`; comm may hold
    // spaces and parentheses, so fields are read after its last `)`.
    let fields = |path: &Path| -> Option<Vec<String>> {
        let stat = fs::read_to_string(path).ok()?;
        let (_, rest) = stat.rsplit_once(") ")?;
        Some(rest.split_whitespace().take(3).map(str::to_string).collect())
    };
    let mut pending = Vec::new();
    let Ok(processes) = fs::read_dir("/proc") else {
        return pending;
    };
    for process in processes.flatten() {
        let Some(pid) = process.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if fields(&process.path().join("stat")).and_then(|f| f.get(2)?.parse::<u32>().ok()) != Some(pgid) {
            continue;
        }
        let Ok(tasks) = fs::read_dir(process.path().join("task")) else {
            continue;
        };
        for task in tasks.flatten() {
            // 'T': stopped by a signal; 'Z' and 'X': exited (a frozen
            // parent cannot reap its children).
            let state = fields(&task.path().join("stat")).and_then(|f| f.first()?.chars().next());
            if state.is_some_and(|state| !matches!(state, 'Z' | 'X') && (state == 'T') != stopped) {
                pending.push(format!("{pid}/{}", task.file_name().to_string_lossy()));
            }
        }
    }
    pending
}

/// Sends `signal` to every process in the process group `pgid`.
pub(crate) fn signal_process_group(pgid: u32, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg only sends a signal; pgid is a positive group id of a
    // process group this crate created.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

/// A command handed to the spawner thread, with where to send the child.
type SpawnRequest = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` so that the kernel kills the child (SIGKILL) when this
/// process ends, however it ends (a panic, `exit`, SIGKILL).
///
/// Linux ties `PR_SET_PDEATHSIG` to the *thread* that forked the child, so
/// every such child is forked by one spawner thread that lives as long as
/// the process: a child started from a test thread (or a tokio blocking
/// thread) that ends early stays alive until its handle drops.
fn spawn_tied_to_process(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: Mutex<Option<std::sync::mpsc::Sender<SpawnRequest>>> = Mutex::new(None);
    // SAFETY: the closure only calls async-signal-safe functions (prctl,
    // getppid) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The spawner died between fork and prctl: so did the process.
            if libc::getppid() == 1 {
                return Err(std::io::Error::other("the testkit process is exiting"));
            }
            Ok(())
        });
    }
    let (reply, answer) = std::sync::mpsc::channel();
    {
        let mut spawner = SPAWNER.lock().unwrap_or_else(|e| e.into_inner());
        let sender = spawner.get_or_insert_with(|| {
            let (sender, requests) = std::sync::mpsc::channel::<SpawnRequest>();
            std::thread::Builder::new()
                .name("exactly-testkit-spawner".into())
                .spawn(move || {
                    for (mut cmd, reply) in requests {
                        let _ = reply.send(cmd.spawn());
                    }
                })
                .expect("starting the testkit's spawner thread");
            sender
        });
        sender
            .send((cmd, reply))
            .map_err(|_| std::io::Error::other("the testkit's spawner thread is gone"))?;
    }
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the testkit's spawner thread is gone"))?
}

/// A child process that leads its own process group, so that it and all of
/// its descendants can be killed at once. Killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub(crate) struct GroupChild {
    child: Option<Child>,
}

impl GroupChild {
    /// Spawns `cmd` in a new process group with stdin closed and stdout and
    /// stderr appended to `log`.
    pub(crate) fn spawn(service: &'static str, cmd: Command, log: &Path) -> Result<Self> {
        Self::spawn_with(service, cmd, log, false)
    }

    /// Like [`spawn`](Self::spawn), but the kernel also kills the child when
    /// this process ends without dropping the handle (a handle in a
    /// `static`, a test binary killed by a signal).
    pub(crate) fn spawn_tied(service: &'static str, cmd: Command, log: &Path) -> Result<Self> {
        Self::spawn_with(service, cmd, log, true)
    }

    fn spawn_with(service: &'static str, mut cmd: Command, log: &Path, tied: bool) -> Result<Self> {
        let io = |action: String, fix: &'static str| {
            move |source| TestkitError::Io {
                service,
                action,
                fix,
                source,
            }
        };
        let out = OpenOptions::new().create(true).append(true).open(log).map_err(io(
            format!("opening log file {}", log.display()),
            "make sure the temp dir is writable",
        ))?;
        let err = out.try_clone().map_err(io(
            "duplicating the log file handle".into(),
            "raise the open-file limit",
        ))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        let command = describe_command(&cmd);
        tracing::debug!(service, %command, log = %log.display(), "spawning");
        let child = if tied { spawn_tied_to_process(cmd) } else { cmd.spawn() };
        let child = child.map_err(io(
            format!("spawning `{command}`"),
            "check that the binary is executable",
        ))?;
        Ok(GroupChild { child: Some(child) })
    }

    /// The pid (and process group id) of the process, until it is killed.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(reason)` once the process has exited.
    pub(crate) fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(format!("the process exited early ({status})")),
            Ok(None) => None,
            Err(err) => Some(format!("cannot query the process: {err}")),
        }
    }

    /// Asks the process to stop (SIGTERM to its process group) and waits up to
    /// `grace` for it to exit; kills the process group if it has not.
    /// Returns whether it exited on its own.
    pub(crate) fn terminate(&mut self, grace: Duration) -> bool {
        let Some(child) = self.child.as_mut() else {
            return true;
        };
        signal_process_group(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                // The leader is gone; end whatever of its group is left.
                let pgid = child.id();
                self.child = None;
                signal_process_group(pgid, libc::SIGKILL);
                return true;
            }
            sleep(Duration::from_millis(50));
        }
        self.kill();
        false
    }

    /// Kills the whole process group with SIGKILL and reaps the leader.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_process_group(child.id());
            let _ = child.wait();
        }
    }
}

impl Drop for GroupChild {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Builds the argument list of a service for a given port.
pub(crate) type ArgsForPort = Box<dyn Fn(u16) -> Vec<OsString> + Send + Sync>;

/// Static description of a service that runs as one foreground process.
pub(crate) struct ChildSpec {
    /// Human name of the service.
    pub(crate) service: &'static str,
    /// The program to run.
    pub(crate) program: PathBuf,
    /// Its arguments, given the port to listen on.
    pub(crate) args: ArgsForPort,
    /// Environment variables to remove from the child's environment.
    pub(crate) env_remove: &'static [&'static str],
    /// Working directory of the child.
    pub(crate) cwd: PathBuf,
    /// File receiving the child's stdout and stderr.
    pub(crate) log: PathBuf,
    /// Hint shown when start-up fails.
    pub(crate) fix: &'static str,
}

/// A service that runs as one foreground process in its own process group,
/// on a fixed port that survives [`ChildService::restart`].
pub(crate) struct ChildService {
    spec: ChildSpec,
    port: u16,
    child: Option<GroupChild>,
}

impl ChildService {
    /// Starts the service on a free port and waits until it accepts
    /// connections.
    pub(crate) fn start(spec: ChildSpec) -> Result<Self> {
        let mut service = ChildService {
            spec,
            port: 0,
            child: None,
        };
        with_free_port(service.spec.service, |port| {
            service.port = port;
            service.spawn_and_wait()
        })?;
        Ok(service)
    }

    fn spawn_and_wait(&mut self) -> Result<()> {
        let spec = &self.spec;
        let mut cmd = Command::new(&spec.program);
        cmd.args((spec.args)(self.port)).current_dir(&spec.cwd);
        for var in spec.env_remove {
            cmd.env_remove(var);
        }
        let started = Instant::now();
        let mut child = GroupChild::spawn(spec.service, cmd, &spec.log)?;
        if let Some(pid) = child.pid() {
            // Lets a later run reap the service if this process dies first.
            let _ = fs::write(spec.cwd.join(SERVICE_PID_FILE), pid.to_string());
        }
        let startup = Startup {
            service: spec.service,
            port: self.port,
            log: &spec.log,
            fix: spec.fix,
        };
        startup.wait_for_port(started, || child.exited())?;
        tracing::info!(service = spec.service, port = self.port, "started");
        self.child = Some(child);
        Ok(())
    }

    /// The port the service listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Lifecycle for ChildService {
    /// Kills the process group and waits until the port is closed.
    fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill();
            if !wait_port_closed(self.port) {
                tracing::warn!(
                    service = self.spec.service,
                    port = self.port,
                    "port still open after kill"
                );
            }
            tracing::info!(service = self.spec.service, port = self.port, "stopped");
        }
        Ok(())
    }

    /// Stops the service if it runs, then starts it again on the same port.
    fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.spawn_and_wait()
    }

    fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.exited().is_none())
    }

    fn set_frozen(&mut self, frozen: bool) -> Result<()> {
        match self.child.as_ref().and_then(GroupChild::pid) {
            Some(pgid) => freeze_process_group(pgid, frozen, self.spec.service),
            None => Ok(()),
        }
    }

    fn log_path(&self) -> &Path {
        &self.spec.log
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_not_handed_out_twice() {
        let ports: BTreeSet<u16> = (0..20).map(|_| free_port().unwrap()).collect();
        assert_eq!(ports.len(), 20);
    }

    #[test]
    fn port_of_address_parses_common_forms() {
        assert_eq!(port_of_address("postgres://u@h:6543/db", 5432), 6543);
        assert_eq!(port_of_address("postgres://u:p@h/db", 5432), 5432);
        assert_eq!(port_of_address("redis://127.0.0.1:7000/", 6379), 7000);
        assert_eq!(port_of_address("a:9093,b:9094", 9092), 9093);
        assert_eq!(port_of_address("broker", 9092), 9092);
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        fs::write(&log, text).unwrap();
        let tail = log_tail(&log);
        assert!(tail.ends_with("line 99"));
        assert!(!tail.contains("line 59\n"));
        assert!(log_tail(&dir.path().join("missing")).starts_with("(no log"));
    }
}
