//! The Docker fallback: services run in containers driven through the
//! `docker` command-line client, synchronously.
//!
//! The CLI talks to whichever engine `DOCKER_HOST` (or the current docker
//! context) names. Published ports are bound to `127.0.0.1` of the machine
//! running the engine, so the engine must be local (Docker Engine, rootless
//! Docker, Docker Desktop, or anything else that forwards published ports to
//! this machine's loopback).
//!
//! Containers are named `exactly-testkit-<service>-<pid>-<n>` and labelled
//! `exactly.testkit=1` (and `exactly.testkit.pid=<pid>`); a handle removes
//! its container (`docker rm -f -v`) when it drops. Containers left by a
//! killed test run can be removed with
//! `docker rm -f -v $(docker ps -aq --filter label=exactly.testkit=1)`.

use std::fs::File;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::thread::{self, sleep, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::{Result, TestkitError};
use crate::handle::{Backend, Lifecycle};
use crate::process::{self, GroupChild};

/// Environment variable choosing when the testkit may fall back to Docker:
/// `never`, `auto` (the default: when the local programs are missing) or
/// `always` (skip the local programs, always use a container).
pub const DOCKER_MODE_ENV: &str = "EXACTLY_TESTKIT_DOCKER";

/// How long `docker version` may take to tell whether an engine answers.
const DETECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `docker run` may take; the first run pulls the image.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// How long any other docker command (kill, start, rm, exec...) may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a container may take to become ready once created or started.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
const READY_POLL: Duration = Duration::from_millis(250);
/// How long `docker logs` may take to dump a log after a failed start.
const LOG_DUMP_TIMEOUT: Duration = Duration::from_secs(10);

/// Label put on every container the testkit starts.
const LABEL: &str = "exactly.testkit=1";

/// When the testkit may use Docker, from [`DOCKER_MODE_ENV`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DockerMode {
    /// Never start containers.
    Never,
    /// Start a container when the local programs are missing.
    Auto,
    /// Skip the local programs; always start a container.
    Always,
}

impl DockerMode {
    /// Reads [`DOCKER_MODE_ENV`]; unset or blank means `auto`.
    pub(crate) fn from_env() -> Result<DockerMode> {
        DockerMode::parse(std::env::var(DOCKER_MODE_ENV).ok().as_deref())
    }

    /// Parses a value of [`DOCKER_MODE_ENV`] (case-insensitive).
    pub(crate) fn parse(value: Option<&str>) -> Result<DockerMode> {
        let value = value.map(str::trim).unwrap_or_default();
        match value.to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(DockerMode::Auto),
            "never" => Ok(DockerMode::Never),
            "always" => Ok(DockerMode::Always),
            _ => Err(TestkitError::InvalidSetting {
                var: DOCKER_MODE_ENV,
                value: value.to_string(),
                fix: "set EXACTLY_TESTKIT_DOCKER to `never`, `auto` (the default) or `always`, or unset it",
            }),
        }
    }
}

/// A Docker engine that answered.
#[derive(Debug)]
pub(crate) struct Engine {
    /// The `docker` program.
    pub(crate) docker: PathBuf,
    /// The engine's version, as reported by `docker version`.
    pub(crate) version: String,
}

/// The Docker engine, asked once per process: `Err` says why none can be
/// used (no `docker` program, no engine answering within a few seconds...).
pub(crate) fn engine() -> std::result::Result<&'static Engine, String> {
    static ENGINE: OnceLock<std::result::Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let result = detect(process::find_binary("docker", &[]), DETECT_TIMEOUT);
            match &result {
                Ok(engine) => tracing::info!(version = %engine.version, "a Docker engine answers"),
                Err(reason) => tracing::debug!(%reason, "no Docker engine"),
            }
            result
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Asks `docker` for the engine's version, giving up after `timeout`.
fn detect(docker: Option<PathBuf>, timeout: Duration) -> std::result::Result<Engine, String> {
    let Some(docker) = docker else {
        return Err("the `docker` program is not on PATH".into());
    };
    let mut cmd = Command::new(&docker);
    cmd.args(["version", "--format", "{{.Server.Version}}"]);
    let finished = run_timed(&mut cmd, timeout).map_err(|err| format!("cannot run {}: {err}", docker.display()))?;
    let version = finished.stdout.trim().to_string();
    match finished.status {
        None => Err(format!("`docker version` did not answer within {timeout:?}")),
        Some(status) if !status.success() || version.is_empty() => {
            let stderr = finished.stderr.split_whitespace().collect::<Vec<_>>().join(" ");
            let why = if stderr.is_empty() {
                "no server version"
            } else {
                &stderr
            };
            Err(format!("`docker version` failed ({status}: {why})"))
        }
        Some(_) => Ok(Engine { docker, version }),
    }
}

/// The service start order after the environment override: the local
/// programs (`local`), then a container (`container`), as allowed by `mode`.
///
/// `local` failing with [`TestkitError::BinaryNotFound`] falls through to
/// Docker; any other result of `local` is returned as is. When no container
/// can be started either, the `BinaryNotFound` error is returned with its
/// `docker` field saying why (in `always` mode, `not_found` builds that error,
/// given what was searched).
pub(crate) fn local_then_container<'e, T>(
    service: &'static str,
    mode: DockerMode,
    engine: impl FnOnce() -> std::result::Result<&'e Engine, String>,
    local: impl FnOnce() -> Result<T>,
    container: impl FnOnce(&Engine) -> Result<T>,
    not_found: impl FnOnce(String) -> TestkitError,
) -> Result<T> {
    let mut missing = if mode == DockerMode::Always {
        not_found(format!("nowhere: {DOCKER_MODE_ENV}=always skips the local programs"))
    } else {
        match local() {
            Err(err @ TestkitError::BinaryNotFound { .. }) => err,
            other => return other,
        }
    };
    let why_not = match mode {
        DockerMode::Never => format!("Docker was not tried because {DOCKER_MODE_ENV}=never"),
        DockerMode::Auto | DockerMode::Always => match engine() {
            Ok(engine) => {
                tracing::info!(service, version = %engine.version, ?mode, "starting a container");
                return container(engine);
            }
            Err(reason) => format!("no Docker engine answered: {reason}"),
        },
    };
    if let TestkitError::BinaryNotFound { docker, .. } = &mut missing {
        *docker = why_not;
    }
    Err(missing)
}

/// How a finished (or timed-out) command ended.
pub(crate) struct Finished {
    /// `None` when it was killed because it ran out of time.
    pub(crate) status: Option<ExitStatus>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `cmd` with stdin closed and its output captured; kills it (and its
/// process group) when it has not finished after `timeout`.
pub(crate) fn run_timed(cmd: &mut Command, timeout: Duration) -> std::io::Result<Finished> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn()?;
    // Read both pipes while waiting, so a chatty command never blocks.
    let stdout = child.stdout.take().map(read_all);
    let stderr = child.stderr.take().map(read_all);
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => sleep(Duration::from_millis(10)),
            Ok(None) | Err(_) => {
                process::kill_process_group(child.id());
                let _ = child.wait();
                break None;
            }
        }
    };
    let join = |reader: Option<JoinHandle<String>>| reader.and_then(|r| r.join().ok()).unwrap_or_default();
    Ok(Finished {
        status,
        stdout: join(stdout),
        stderr: join(stderr),
    })
}

fn read_all(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Runs `docker ARGS...`; a failure, non-zero exit or timeout becomes an
/// error naming the command and carrying its output.
fn docker(
    service: &'static str,
    docker: &Path,
    args: &[String],
    timeout: Duration,
    fix: &'static str,
) -> Result<String> {
    let mut cmd = Command::new(docker);
    cmd.args(args);
    let command = process::describe_command(&cmd);
    tracing::debug!(service, %command, "running");
    let finished = run_timed(&mut cmd, timeout).map_err(|source| TestkitError::Io {
        service,
        action: format!("running `{command}`"),
        fix,
        source,
    })?;
    let status = match finished.status {
        Some(status) if status.success() => return Ok(finished.stdout),
        Some(status) => status.to_string(),
        None => format!("no answer within {} s, killed", timeout.as_secs()),
    };
    Err(TestkitError::CommandFailed {
        service,
        command,
        status,
        output: format!("{}{}", finished.stdout, finished.stderr),
        fix,
    })
}

/// Strings from string literals, for building `docker` argument lists.
pub(crate) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Readiness check of a service in a container; called repeatedly until it
/// returns `true` (it should give up quickly when the service is not ready).
pub(crate) type ReadyCheck = fn(&Container) -> bool;

/// Static description of a service run as a container.
pub(crate) struct ContainerSpec {
    /// Human name of the service.
    pub(crate) service: &'static str,
    /// Short name used in the container name, e.g. `kafka`.
    pub(crate) slug: &'static str,
    /// The image, with a pinned tag.
    pub(crate) image: &'static str,
    /// Port the service listens on inside the container; `None` means the
    /// same port as on the host.
    pub(crate) inner_port: Option<u16>,
    /// `docker run` options besides name, labels and the published port
    /// (environment, mounts...), given the host port.
    pub(crate) options: Box<dyn Fn(u16) -> Vec<String> + Send + Sync>,
    /// Command and arguments after the image (empty: the image's default).
    pub(crate) command: Vec<String>,
    /// Whether the service answers.
    pub(crate) ready: ReadyCheck,
    /// `true`: `restart()` replaces the container by a fresh one, so nothing
    /// outside mounted directories is kept; `false`: `restart()` starts the
    /// same container again, keeping its filesystem and volumes.
    pub(crate) fresh_on_restart: bool,
    /// File the container's output is copied to (by `docker logs --follow`).
    pub(crate) log: PathBuf,
    /// Hint shown when something fails.
    pub(crate) fix: &'static str,
}

/// A service running in a Docker container, published on a fixed loopback
/// port that survives `stop()` / `restart()`. Removed (with its anonymous
/// volumes) on drop.
pub(crate) struct Container {
    spec: ContainerSpec,
    docker: PathBuf,
    name: String,
    port: u16,
    /// Whether a container of that name may exist (and must be removed).
    created: bool,
    /// `docker logs --follow` copying the output to `spec.log`.
    follower: Option<GroupChild>,
}

impl Container {
    /// Creates and starts the container on a free loopback port and waits
    /// until the service is ready.
    pub(crate) fn start(engine: &Engine, spec: ContainerSpec) -> Result<Container> {
        let mut container = Container {
            spec,
            docker: engine.docker.clone(),
            name: String::new(),
            port: 0,
            created: false,
            follower: None,
        };
        process::with_free_port(container.spec.service, |port| {
            container.port = port;
            container.name = next_name(container.spec.slug);
            container.create()
        })?;
        Ok(container)
    }

    /// The container's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The loopback port the service is published on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The port the service listens on inside the container.
    pub(crate) fn inner_port(&self) -> u16 {
        self.spec.inner_port.unwrap_or(self.port)
    }

    /// Runs `docker exec NAME ARGS...` and returns its stdout.
    pub(crate) fn exec(&self, args: &[&str]) -> Result<String> {
        let mut full = strings(&["exec", &self.name]);
        full.extend(strings(args));
        self.docker(&full, COMMAND_TIMEOUT)
    }

    /// Whether `docker exec NAME ARGS...` exits successfully.
    pub(crate) fn exec_ok(&self, args: &[&str]) -> bool {
        self.exec(args).is_ok()
    }

    fn docker(&self, args: &[String], timeout: Duration) -> Result<String> {
        docker(self.spec.service, &self.docker, args, timeout, self.spec.fix)
    }

    /// `docker run` on `self.port` under `self.name`, then waits until
    /// ready; removes the container again if that fails.
    fn create(&mut self) -> Result<()> {
        let mut args = strings(&["run", "-d", "--name", &self.name, "--label", LABEL, "--label"]);
        args.push(format!("exactly.testkit.pid={}", std::process::id()));
        args.push("-p".into());
        args.push(format!("127.0.0.1:{}:{}", self.port, self.inner_port()));
        args.extend((self.spec.options)(self.port));
        args.push(self.spec.image.into());
        args.extend(self.spec.command.iter().cloned());
        // Even a failed `docker run` may leave a created container behind.
        self.created = true;
        // The readiness limit counts from the container's start, not from
        // before `docker run`, which may spend minutes pulling the image.
        let result = self.docker(&args, RUN_TIMEOUT).and_then(|_| {
            let started = Instant::now();
            self.follow_logs(false)?;
            self.wait_ready(started)
        });
        if let Err(err) = result {
            if err.to_string().contains("is already in use by container") {
                // Someone else's container has this name: not ours to remove.
                self.created = false;
            }
            self.remove();
            return Err(err);
        }
        tracing::info!(service = self.spec.service, container = %self.name, port = self.port, "container started");
        Ok(())
    }

    /// Starts copying the container's output to the log file. `truncate`:
    /// start the file afresh (`docker logs` replays the whole output of the
    /// container, also from before a restart).
    fn follow_logs(&mut self, truncate: bool) -> Result<()> {
        self.stop_following();
        if truncate {
            let _ = File::create(&self.spec.log);
        }
        let mut cmd = Command::new(&self.docker);
        cmd.args(["logs", "--follow", &self.name]);
        self.follower = Some(GroupChild::spawn(self.spec.service, cmd, &self.spec.log)?);
        Ok(())
    }

    fn stop_following(&mut self) {
        if let Some(mut follower) = self.follower.take() {
            follower.kill();
        }
    }

    /// Replaces the log file by a complete `docker logs` dump, so that an
    /// error shows the latest output.
    fn dump_logs(&mut self) {
        self.stop_following();
        if File::create(&self.spec.log).is_err() {
            return;
        }
        let mut cmd = Command::new(&self.docker);
        cmd.args(["logs", &self.name]);
        let Ok(mut dump) = GroupChild::spawn(self.spec.service, cmd, &self.spec.log) else {
            return;
        };
        let deadline = Instant::now() + LOG_DUMP_TIMEOUT;
        while dump.exited().is_none() && Instant::now() < deadline {
            sleep(Duration::from_millis(20));
        }
        dump.kill();
    }

    /// `Some(reason)` when the container is no longer running.
    fn exited(&self) -> Option<String> {
        let state = self.docker(
            &strings(&["inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", &self.name]),
            COMMAND_TIMEOUT,
        );
        match state {
            Ok(state) => {
                let mut parts = state.split_whitespace();
                let status = parts.next().unwrap_or("unknown");
                let code = parts.next().unwrap_or("?");
                (status != "running" && status != "created" && status != "restarting")
                    .then(|| format!("the container is {status} (exit code {code})"))
            }
            Err(err) => Some(format!("cannot inspect the container: {err}")),
        }
    }

    /// Polls the readiness check until it passes, the container exits, or
    /// [`READY_TIMEOUT`] (counted from `started`) runs out.
    fn wait_ready(&mut self, started: Instant) -> Result<()> {
        loop {
            if (self.spec.ready)(self) {
                return Ok(());
            }
            if let Some(reason) = self.exited() {
                return Err(self.failed(reason));
            }
            if started.elapsed() >= READY_TIMEOUT {
                let reason = format!("not ready within {} s", READY_TIMEOUT.as_secs());
                return Err(self.failed(reason));
            }
            sleep(READY_POLL);
        }
    }

    fn failed(&mut self, reason: String) -> TestkitError {
        self.dump_logs();
        TestkitError::StartFailed {
            service: self.spec.service,
            port: self.port,
            reason: format!("container {} ({}): {reason}", self.name, self.spec.image),
            log: self.spec.log.display().to_string(),
            log_tail: process::log_tail(&self.spec.log),
            fix: self.spec.fix,
        }
    }

    fn is_running(&self) -> bool {
        self.created
            && self
                .docker(
                    &strings(&["inspect", "-f", "{{.State.Running}}", &self.name]),
                    COMMAND_TIMEOUT,
                )
                .is_ok_and(|out| out.trim() == "true")
    }

    /// `docker pause` / `docker unpause`.
    fn set_frozen(&mut self, frozen: bool) -> Result<()> {
        let verb = if frozen { "pause" } else { "unpause" };
        self.docker(&strings(&[verb, &self.name]), COMMAND_TIMEOUT).map(drop)
    }

    /// `docker kill` (SIGKILL, like a crash), then waits until the container
    /// stopped and the port is closed.
    fn stop(&mut self) -> Result<()> {
        if self.is_running() {
            if let Err(err) = self.docker(&strings(&["kill", &self.name]), COMMAND_TIMEOUT) {
                // Fine if it just exited by itself.
                if self.is_running() {
                    return Err(err);
                }
            }
            self.docker(&strings(&["wait", &self.name]), COMMAND_TIMEOUT)?;
            tracing::info!(service = self.spec.service, container = %self.name, "container stopped");
        }
        self.stop_following();
        if !process::wait_port_closed(self.port) {
            tracing::warn!(
                service = self.spec.service,
                port = self.port,
                "port still open after docker kill"
            );
        }
        Ok(())
    }

    fn restart(&mut self) -> Result<()> {
        self.stop()?;
        if self.spec.fresh_on_restart {
            // A container that could not be removed would hold the name and
            // port of the new one: say so instead of failing the start later.
            self.try_remove()?;
            return self.create();
        }
        let started = Instant::now();
        self.docker(&strings(&["start", &self.name]), COMMAND_TIMEOUT)?;
        self.follow_logs(true)?;
        self.wait_ready(started)?;
        tracing::info!(service = self.spec.service, container = %self.name, port = self.port, "container restarted");
        Ok(())
    }

    /// `docker rm -f -v`: removes the container and its anonymous volumes;
    /// a failure is logged (for drop and failed starts, which have an error
    /// of their own to report).
    fn remove(&mut self) {
        if let Err(err) = self.try_remove() {
            tracing::warn!(%err, "could not remove the container");
        }
    }

    /// [`remove`](Self::remove), returning the failure.
    fn try_remove(&mut self) -> Result<()> {
        self.stop_following();
        if !std::mem::take(&mut self.created) {
            return Ok(());
        }
        let removed = self.docker(&strings(&["rm", "-f", "-v", &self.name]), COMMAND_TIMEOUT);
        if removed.is_err() {
            // Still there: drop may try again.
            self.created = true;
        }
        removed?;
        tracing::info!(service = self.spec.service, container = %self.name, "container removed");
        process::wait_port_closed(self.port);
        Ok(())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.remove();
    }
}

/// `exactly-testkit-<slug>-<pid>-<n>-<random>`: unique within this process,
/// and the random part keeps processes with the same pid (CI jobs in
/// containers sharing one engine) from picking the same name.
fn next_name(slug: &str) -> String {
    use std::hash::BuildHasher;
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let random = std::collections::hash_map::RandomState::new().hash_one(n) as u32;
    format!("exactly-testkit-{slug}-{}-{n}-{random:08x}", std::process::id())
}

/// A service the testkit manages: from local programs (`L`) or a container.
pub(crate) enum Managed<L> {
    /// Started from programs installed on this machine.
    Local(L),
    /// Running in a Docker container (boxed: it is much larger than a local
    /// service).
    Container(Box<Container>),
}

impl<L> Managed<L> {
    /// The locally started service, if that is what this is.
    pub(crate) fn local(&self) -> Option<&L> {
        match self {
            Managed::Local(local) => Some(local),
            Managed::Container(_) => None,
        }
    }
}

impl<L: Lifecycle> Lifecycle for Managed<L> {
    fn stop(&mut self) -> Result<()> {
        match self {
            Managed::Local(local) => local.stop(),
            Managed::Container(container) => container.stop(),
        }
    }

    fn restart(&mut self) -> Result<()> {
        match self {
            Managed::Local(local) => local.restart(),
            Managed::Container(container) => container.restart(),
        }
    }

    fn is_running(&mut self) -> bool {
        match self {
            Managed::Local(local) => local.is_running(),
            Managed::Container(container) => container.is_running(),
        }
    }

    fn set_frozen(&mut self, frozen: bool) -> Result<()> {
        match self {
            Managed::Local(local) => local.set_frozen(frozen),
            Managed::Container(container) => container.set_frozen(frozen),
        }
    }

    fn log_path(&self) -> &Path {
        match self {
            Managed::Local(local) => local.log_path(),
            Managed::Container(container) => &container.spec.log,
        }
    }

    fn backend(&self) -> Backend {
        match self {
            Managed::Local(local) => local.backend(),
            Managed::Container(_) => Backend::Container,
        }
    }

    fn container_name(&self) -> Option<&str> {
        match self {
            Managed::Local(local) => local.container_name(),
            Managed::Container(container) => Some(container.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn parses_the_docker_mode() {
        assert_eq!(DockerMode::parse(None).unwrap(), DockerMode::Auto);
        assert_eq!(DockerMode::parse(Some(" ")).unwrap(), DockerMode::Auto);
        assert_eq!(DockerMode::parse(Some("auto")).unwrap(), DockerMode::Auto);
        assert_eq!(DockerMode::parse(Some("Never")).unwrap(), DockerMode::Never);
        assert_eq!(DockerMode::parse(Some("ALWAYS")).unwrap(), DockerMode::Always);
        let err = DockerMode::parse(Some("sometimes")).unwrap_err().to_string();
        assert!(
            err.contains(DOCKER_MODE_ENV) && err.contains("sometimes") && err.contains("always"),
            "{err}"
        );
    }

    /// Writes an executable shell script standing in for `docker`.
    fn fake_docker(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("docker");
        let script = format!("#!/bin/sh\n[ \"$1\" = --testkit-probe ] && exit 0\n{body}\n");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A process forked by a parallel test while the file was open for
        // writing makes exec fail with ETXTBSY until that process execs.
        for _ in 0..100 {
            match Command::new(&path).arg("--testkit-probe").status() {
                Err(err) if err.raw_os_error() == Some(libc::ETXTBSY) => sleep(Duration::from_millis(10)),
                _ => break,
            }
        }
        path
    }

    #[test]
    fn detects_an_engine_or_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let timeout = Duration::from_secs(5);

        let err = detect(None, timeout).unwrap_err();
        assert!(err.contains("not on PATH"), "{err}");

        let answers = fake_docker(
            dir.path(),
            r#"[ "$1 $2 $3" = "version --format {{.Server.Version}}" ] && echo 27.1.0"#,
        );
        assert_eq!(detect(Some(answers), timeout).unwrap().version, "27.1.0");

        let refuses = fake_docker(
            dir.path(),
            "echo 'Cannot connect to the Docker daemon at unix:///nonexistent.sock' >&2; exit 1",
        );
        let err = detect(Some(refuses), timeout).unwrap_err();
        assert!(err.contains("Cannot connect to the Docker daemon"), "{err}");

        let client_only = fake_docker(dir.path(), "echo; exit 0");
        assert!(detect(Some(client_only), timeout).is_err());
    }

    #[test]
    fn gives_up_on_a_hanging_docker() {
        let dir = tempfile::tempdir().unwrap();
        let hangs = fake_docker(dir.path(), "sleep 30");
        let started = Instant::now();
        let err = detect(Some(hangs), Duration::from_millis(300)).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the hanging child was not killed"
        );
        assert!(err.contains("did not answer"), "{err}");
    }

    fn not_found(searched: String) -> TestkitError {
        TestkitError::BinaryNotFound {
            service: "Thing",
            binary: "thingd",
            searched,
            docker: String::new(),
            fix: "install thingd",
        }
    }

    fn engine_ok() -> std::result::Result<&'static Engine, String> {
        static ENGINE: OnceLock<Engine> = OnceLock::new();
        Ok(ENGINE.get_or_init(|| Engine {
            docker: PathBuf::from("/usr/bin/docker"),
            version: "27.1.0".into(),
        }))
    }

    fn no_engine() -> std::result::Result<&'static Engine, String> {
        Err("Cannot connect to the Docker daemon".into())
    }

    fn missing_locally() -> Result<&'static str> {
        Err(not_found("PATH=/bin".into()))
    }

    #[test]
    fn prefers_local_programs_then_docker() {
        let local_ok = || Ok("local");
        let container = |_: &Engine| Ok("container");
        let pick = |mode,
                    engine: fn() -> std::result::Result<&'static Engine, String>,
                    local: fn() -> Result<&'static str>| {
            local_then_container("Thing", mode, engine, local, container, not_found)
        };
        assert_eq!(pick(DockerMode::Auto, engine_ok, local_ok).unwrap(), "local");
        assert_eq!(pick(DockerMode::Auto, engine_ok, missing_locally).unwrap(), "container");
        assert_eq!(pick(DockerMode::Always, engine_ok, local_ok).unwrap(), "container");

        let err = pick(DockerMode::Never, engine_ok, missing_locally)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("EXACTLY_TESTKIT_DOCKER=never") && err.contains("install thingd"),
            "{err}"
        );

        let err = pick(DockerMode::Auto, no_engine, missing_locally)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no Docker engine answered: Cannot connect") && err.contains("PATH=/bin"),
            "{err}"
        );

        let err = pick(DockerMode::Always, no_engine, local_ok).unwrap_err().to_string();
        assert!(
            err.contains("EXACTLY_TESTKIT_DOCKER=always skips") && err.contains("no Docker engine answered"),
            "{err}"
        );
    }

    #[test]
    fn other_local_failures_do_not_fall_back() {
        let failing = || -> Result<&'static str> {
            Err(TestkitError::CommandFailed {
                service: "Thing",
                command: "thingd".into(),
                status: "exit status: 1".into(),
                output: String::new(),
                fix: "read the log",
            })
        };
        let container = |_: &Engine| -> Result<&'static str> { panic!("must not start a container") };
        let err =
            local_then_container("Thing", DockerMode::Auto, engine_ok, failing, container, not_found).unwrap_err();
        assert!(matches!(err, TestkitError::CommandFailed { .. }), "{err}");
    }

    #[test]
    fn handles_stay_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<crate::KafkaBroker>();
        send_sync::<crate::PostgresServer>();
        send_sync::<Container>();
    }

    #[test]
    fn names_are_unique_and_labelled_by_pid() {
        let a = next_name("kafka");
        let b = next_name("kafka");
        assert_ne!(a, b);
        assert!(
            a.starts_with(&format!("exactly-testkit-kafka-{}-", std::process::id())),
            "{a}"
        );
    }

    /// A stand-in for the `docker` CLI that keeps container state as files
    /// in `state` and records every call in `state/calls`. Toggles: the file
    /// `fail_run_once` makes the next `run` fail like a taken port;
    /// `exit_on_run` makes containers exit right after `run`; `name_taken`
    /// makes every `run` fail because another container has the name.
    fn fake_engine(state: &Path) -> Engine {
        let script = r#"
S='STATE'
echo "$*" >> "$S/calls"
cmd=$1; shift
case "$cmd" in
run)
    name=; prev=
    for a in "$@"; do [ "$prev" = "--name" ] && name=$a; prev=$a; done
    if [ -f "$S/name_taken" ]; then
        echo "docker: Error response from daemon: Conflict. The container name \"/$name\" is already in use by container \"0123\"." >&2; exit 125
    fi
    if [ -f "$S/fail_run_once" ]; then
        rm "$S/fail_run_once"; touch "$S/$name.created"
        echo "Bind for 127.0.0.1:1 failed: port is already allocated" >&2; exit 125
    fi
    touch "$S/$name.created"
    if [ -f "$S/exit_on_run" ]; then echo "fatal: broken image" >> "$S/$name.log"; exit 0; fi
    echo "started $name" >> "$S/$name.log"; touch "$S/$name.running"; echo 0123abcd ;;
logs)
    if [ "$1" = "--follow" ]; then
        cat "$S/$2.log"; while [ -f "$S/$2.running" ]; do sleep 0.05; done
    else
        cat "$S/$1.log"
    fi ;;
inspect)
    [ -f "$S/$3.created" ] || { echo "Error: No such object: $3" >&2; exit 1; }
    if [ -f "$S/$3.running" ]; then r=true; st=running; else r=false; st=exited; fi
    case "$2" in *Running*) echo $r ;; *) echo "$st 1" ;; esac ;;
kill)
    [ -f "$S/$1.running" ] || { echo "Error: container $1 is not running" >&2; exit 1; }
    rm "$S/$1.running"; echo "killed $1" >> "$S/$1.log" ;;
wait) echo 137 ;;
start) touch "$S/$1.running"; echo "restarted $1" >> "$S/$1.log" ;;
exec) [ -f "$S/$1.running" ] ;;
rm) rm -f "$S/$3.created" "$S/$3.running" "$S/$3.log" ;;
*) echo "unexpected docker $cmd" >&2; exit 2 ;;
esac
"#
        .replace("STATE", &state.display().to_string());
        let bin = state.join("bin");
        std::fs::create_dir(&bin).unwrap();
        Engine {
            docker: fake_docker(&bin, &script),
            version: "fake".into(),
        }
    }

    fn fake_spec(log: PathBuf, fresh_on_restart: bool) -> ContainerSpec {
        ContainerSpec {
            service: "Fake service",
            slug: "fake",
            image: "example/fake:1",
            inner_port: Some(1234),
            options: Box::new(|port| vec!["-e".into(), format!("PORT={port}")]),
            command: strings(&["serve", "--fast"]),
            ready: |container| container.exec_ok(&["true"]),
            fresh_on_restart,
            log,
            fix: "fix the fake",
        }
    }

    fn calls(state: &Path) -> Vec<String> {
        std::fs::read_to_string(state.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits (briefly) until the log file mentions `text`.
    fn log_shows(log: &Path, text: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if std::fs::read_to_string(log).unwrap_or_default().contains(text) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn drives_a_container_through_its_life_with_the_docker_cli() {
        let state = tempfile::tempdir().unwrap();
        let engine = fake_engine(state.path());
        let log = state.path().join("service.log");
        let mut container = Container::start(&engine, fake_spec(log.clone(), false)).unwrap();
        let name = container.name().to_string();
        let port = container.port();
        assert!(name.starts_with("exactly-testkit-fake-"), "{name}");
        let run = format!(
            "run -d --name {name} --label exactly.testkit=1 --label exactly.testkit.pid={} \
             -p 127.0.0.1:{port}:1234 -e PORT={port} example/fake:1 serve --fast",
            std::process::id()
        );
        assert_eq!(calls(state.path())[0], run);
        assert!(log_shows(&log, &format!("started {name}")), "log not followed");
        assert!(container.is_running());

        container.stop().unwrap();
        assert!(!container.is_running());
        assert!(calls(state.path()).contains(&format!("kill {name}")));
        container.stop().unwrap(); // stopping twice is harmless
        assert_eq!(
            calls(state.path()).iter().filter(|c| c.starts_with("kill")).count(),
            1,
            "a stopped container is not killed again"
        );

        container.restart().unwrap();
        assert!(container.is_running());
        assert_eq!(container.port(), port);
        assert!(calls(state.path()).contains(&format!("start {name}")));
        assert!(log_shows(&log, &format!("restarted {name}")));

        drop(container);
        assert_eq!(calls(state.path()).last().unwrap(), &format!("rm -f -v {name}"));
        assert!(!state.path().join(format!("{name}.created")).exists());
    }

    #[test]
    fn a_fresh_restart_replaces_the_container_on_the_same_port() {
        let state = tempfile::tempdir().unwrap();
        let engine = fake_engine(state.path());
        let log = state.path().join("service.log");
        let mut container = Container::start(&engine, fake_spec(log, true)).unwrap();
        let (name, port) = (container.name().to_string(), container.port());
        container.restart().unwrap();
        let calls = calls(state.path());
        let runs: Vec<_> = calls.iter().filter(|c| c.starts_with("run ")).collect();
        assert_eq!(runs.len(), 2, "{calls:?}");
        assert_eq!(runs[0], runs[1], "same name and port: {calls:?}");
        assert!(calls.contains(&format!("rm -f -v {name}")));
        assert!(!calls.iter().any(|c| c.starts_with("start ")), "{calls:?}");
        assert_eq!(container.port(), port);
        assert!(container.is_running());
    }

    #[test]
    fn retries_on_a_new_port_when_docker_cannot_publish_it() {
        let state = tempfile::tempdir().unwrap();
        let engine = fake_engine(state.path());
        std::fs::write(state.path().join("fail_run_once"), "").unwrap();
        let container = Container::start(&engine, fake_spec(state.path().join("log"), false)).unwrap();
        let calls = calls(state.path());
        let runs: Vec<_> = calls.iter().filter(|c| c.starts_with("run ")).collect();
        assert_eq!(runs.len(), 2, "{calls:?}");
        assert_ne!(runs[0], runs[1], "new name and port on retry");
        let first_name = runs[0].split_whitespace().nth(3).unwrap();
        assert!(
            calls.contains(&format!("rm -f -v {first_name}")),
            "the failed container is removed: {calls:?}"
        );
        assert!(container.name() != first_name);
    }

    #[test]
    fn a_name_taken_by_another_container_is_an_error_that_removes_nothing() {
        let state = tempfile::tempdir().unwrap();
        let engine = fake_engine(state.path());
        std::fs::write(state.path().join("name_taken"), "").unwrap();
        let err = match Container::start(&engine, fake_spec(state.path().join("log"), false)) {
            Ok(_) => panic!("a taken name must not count as started"),
            Err(err) => err.to_string(),
        };
        assert!(err.contains("already in use"), "{err}");
        let calls = calls(state.path());
        assert!(
            calls.iter().all(|c| !c.starts_with("rm ")),
            "the other container is left alone: {calls:?}"
        );
    }

    #[test]
    fn a_container_that_exits_fails_with_its_log_and_is_removed() {
        let state = tempfile::tempdir().unwrap();
        let engine = fake_engine(state.path());
        std::fs::write(state.path().join("exit_on_run"), "").unwrap();
        let err = match Container::start(&engine, fake_spec(state.path().join("log"), false)) {
            Ok(_) => panic!("a container that exits must not count as started"),
            Err(err) => err,
        };
        let text = err.to_string();
        assert!(
            text.contains("is exited") && text.contains("fatal: broken image") && text.contains("fix the fake"),
            "{text}"
        );
        let calls = calls(state.path());
        assert!(
            calls.last().unwrap().starts_with("rm -f -v exactly-testkit-fake-"),
            "{calls:?}"
        );
    }

    #[test]
    fn run_timed_captures_both_streams() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let finished = run_timed(&mut cmd, Duration::from_secs(5)).unwrap();
        assert_eq!(finished.status.and_then(|s| s.code()), Some(3));
        assert_eq!(finished.stdout.trim(), "out");
        assert_eq!(finished.stderr.trim(), "err");
    }
}
