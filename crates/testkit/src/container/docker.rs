use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::thread::sleep;
use std::time::{Duration, Instant};

use testcontainers::core::{ExecCommand, Mount};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ContainerRequest, Image, ImageExt};

use crate::error::{Result, TestkitError};
use crate::process;

/// How long the engine may take to answer whether it is there.
const DETECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long creating and starting a container may take; the first start
/// pulls the image.
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// How long any other container operation (kill, start, pause, exec...) may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a container may take to become ready once started.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
const READY_POLL: Duration = Duration::from_millis(250);

/// Label put on every container the testkit starts.
const LABEL: (&str, &str) = ("exactly.testkit", "1");

/// A Docker engine that answered.
#[derive(Debug)]
pub(crate) struct Engine {
    /// The engine's version, as it reports it.
    pub(crate) version: String,
}

impl Engine {
    /// The engine's version.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }
}

/// The testkit's runtime for container operations. Multi-threaded, so that
/// `testcontainers`' clean-up on drop (which blocks in place) works.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("exactly-testkit-containers")
            .enable_all()
            .build()
            .expect("creating the testkit's container runtime")
    })
}

/// Runs the future `make` returns on the testkit's runtime and waits for
/// it, from any thread (also one of another tokio runtime): the future is
/// made and driven on a helper thread outside every runtime.
fn block<T: Send, F: Future<Output = T>>(make: impl FnOnce() -> F + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| runtime().block_on(make()))
            .join()
            .expect("a container operation panicked")
    })
}

/// Where `testcontainers` looks for the engine, for messages.
fn engine_address() -> String {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if !host.trim().is_empty() => format!("DOCKER_HOST={host}"),
        _ => "the default socket unix:///var/run/docker.sock (DOCKER_HOST is not set)".into(),
    }
}

/// The Docker engine, asked once per process: `Err` says why none can be
/// used (nothing answers at the address, it did not answer in time...).
pub(crate) fn engine() -> std::result::Result<&'static Engine, String> {
    static ENGINE: OnceLock<std::result::Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let result = detect(DETECT_TIMEOUT);
            match &result {
                Ok(engine) => tracing::info!(version = %engine.version, "a Docker engine answers"),
                Err(reason) => tracing::debug!(%reason, "no Docker engine"),
            }
            result
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Asks the engine `testcontainers` would use for its version, giving up
/// after `timeout`.
fn detect(timeout: Duration) -> std::result::Result<Engine, String> {
    let address = engine_address();
    block(move || async move {
        let asked = async {
            let docker = testcontainers::core::client::docker_client_instance()
                .await
                .map_err(|e| e.to_string())?;
            docker.version().await.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(timeout, asked).await {
            Err(_) => Err(format!("the engine at {address} did not answer within {timeout:?}")),
            Ok(Err(error)) => Err(format!("{address}: {error}")),
            Ok(Ok(version)) => match version.version {
                Some(version) if !version.is_empty() => Ok(Engine { version }),
                _ => Err(format!("the engine at {address} reported no version")),
            },
        }
    })
}

type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;
type TcResult<T> = std::result::Result<T, testcontainers::TestcontainersError>;

/// A started container of any image, as the testkit drives it.
pub(crate) trait Running: Send + Sync {
    fn id(&self) -> &str;
    fn start(&self) -> Fut<'_, TcResult<()>>;
    /// Stops at once (SIGKILL), like a crash.
    fn kill(&self) -> Fut<'_, TcResult<()>>;
    fn pause(&self) -> Fut<'_, TcResult<()>>;
    fn unpause(&self) -> Fut<'_, TcResult<()>>;
    fn is_running(&self) -> Fut<'_, TcResult<bool>>;
    fn exit_code(&self) -> Fut<'_, TcResult<Option<i64>>>;
    /// Runs a command; its exit code and output.
    fn exec(&self, cmd: Vec<String>) -> Fut<'_, TcResult<(Option<i64>, String)>>;
    /// Copies the container's output into `log` from now on, until it stops.
    fn follow_logs(&self, log: PathBuf) -> Pin<Box<dyn Future<Output = ()> + Send>>;
    fn rm(self: Box<Self>) -> Fut<'static, TcResult<()>>;
}

impl<I: Image + 'static> Running for ContainerAsync<I> {
    fn id(&self) -> &str {
        let raw: &testcontainers::core::RawContainer = self;
        raw.id()
    }
    fn start(&self) -> Fut<'_, TcResult<()>> {
        Box::pin(ContainerAsync::start(self))
    }
    fn kill(&self) -> Fut<'_, TcResult<()>> {
        Box::pin(self.stop_with_timeout(Some(0)))
    }
    fn pause(&self) -> Fut<'_, TcResult<()>> {
        Box::pin(ContainerAsync::pause(self))
    }
    fn unpause(&self) -> Fut<'_, TcResult<()>> {
        Box::pin(ContainerAsync::unpause(self))
    }
    fn is_running(&self) -> Fut<'_, TcResult<bool>> {
        Box::pin(ContainerAsync::is_running(self))
    }
    fn exit_code(&self) -> Fut<'_, TcResult<Option<i64>>> {
        Box::pin(ContainerAsync::exit_code(self))
    }
    fn exec(&self, cmd: Vec<String>) -> Fut<'_, TcResult<(Option<i64>, String)>> {
        Box::pin(async move {
            let raw: &testcontainers::core::RawContainer = self;
            let mut result = raw.exec(ExecCommand::new(cmd)).await?;
            let mut output = result.stdout_to_vec().await?;
            output.extend(result.stderr_to_vec().await?);
            Ok((result.exit_code().await?, String::from_utf8_lossy(&output).into_owned()))
        })
    }
    fn follow_logs(&self, log: PathBuf) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let (mut stdout, mut stderr) = (self.stdout(true), self.stderr(true));
        Box::pin(async move {
            let open = || {
                let log = log.clone();
                async move {
                    tokio::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&log)
                        .await
                        .ok()
                }
            };
            let (Some(mut out), Some(mut err)) = (open().await, open().await) else {
                return;
            };
            // Ends with an error once the container stops.
            let _ = tokio::join!(
                tokio::io::copy_buf(&mut stdout, &mut out),
                tokio::io::copy_buf(&mut stderr, &mut err)
            );
        })
    }
    fn rm(self: Box<Self>) -> Fut<'static, TcResult<()>> {
        Box::pin(ContainerAsync::rm(*self))
    }
}

/// Starts `request` as the container `name` publishing `port` (given to
/// the request with `with_mapped_port`) on `127.0.0.1` only, labelled as
/// the testkit's.
fn run<I: Image + 'static>(request: ContainerRequest<I>, name: &str) -> Fut<'static, TcResult<Box<dyn Running>>> {
    let request = request
        .with_container_name(name)
        .with_label(LABEL.0, LABEL.1)
        .with_label("exactly.testkit.pid", std::process::id().to_string())
        .with_startup_timeout(START_TIMEOUT)
        .with_host_config_modifier(|host| {
            for bindings in host.port_bindings.iter_mut().flat_map(|b| b.values_mut()).flatten() {
                for binding in bindings {
                    binding.host_ip = Some("127.0.0.1".into());
                }
            }
        });
    Box::pin(async move { Ok(Box::new(request.start().await?) as Box<dyn Running>) })
}

/// What a service asks of its container: `create(port, name)` starts it
/// publishing `port` (see [`ContainerSpec::request`]).
pub(crate) type Create = Box<dyn Fn(u16, &str) -> Fut<'static, TcResult<Box<dyn Running>>> + Send + Sync>;

/// Builds a [`Create`] from a function making the image request for a port.
pub(crate) fn create<I: Image + 'static>(
    request: impl Fn(u16) -> ContainerRequest<I> + Send + Sync + 'static,
) -> Create {
    Box::new(move |port, name| run(request(port), name))
}

/// A bind mount of `host` at `target` in the container.
pub(crate) fn bind(host: &Path, target: &str) -> Mount {
    Mount::bind_mount(host.display().to_string(), target)
}

/// Readiness check of a service in a container; called repeatedly until it
/// returns `true` (it should give up quickly when the service is not ready).
pub(crate) type ReadyCheck = fn(&Container) -> bool;

/// Static description of a service run as a container.
pub(crate) struct ContainerSpec {
    /// Human name used in errors and logs, e.g. `PostgreSQL (container)`.
    pub(crate) service: &'static str,
    /// Part of the container name, e.g. `postgres`.
    pub(crate) slug: &'static str,
    /// The image, for messages (`postgres:15`).
    pub(crate) image: &'static str,
    /// The port the service listens on inside the container (`None`: the
    /// same as the published one).
    pub(crate) inner_port: Option<u16>,
    /// Creates and starts the container for a published port.
    pub(crate) request: Create,
    /// Extra readiness check, polled after the image's own wait conditions.
    pub(crate) ready: ReadyCheck,
    /// `restart()` replaces the container by a fresh one instead of
    /// starting the stopped one again (for services without durable data).
    pub(crate) fresh_on_restart: bool,
    /// Run before the container is removed, while it runs (e.g. making files
    /// in a bind mount deletable by the caller).
    pub(crate) before_remove: Option<Vec<String>>,
    /// The log file, fed from the container's output.
    pub(crate) log: PathBuf,
    /// How to fix a failed start.
    pub(crate) fix: &'static str,
}

/// A service running in a Docker container, published on a fixed loopback
/// port that survives `stop()` / `restart()`. Removed (with its anonymous
/// volumes) on drop.
pub(crate) struct Container {
    spec: ContainerSpec,
    name: String,
    port: u16,
    running: Option<Box<dyn Running>>,
}

impl Container {
    /// Creates and starts the container on a free loopback port and waits
    /// until the service is ready.
    pub(crate) fn start(_engine: &Engine, spec: ContainerSpec) -> Result<Container> {
        let mut container = Container {
            spec,
            name: String::new(),
            port: 0,
            running: None,
        };
        process::with_free_port(container.spec.service, |port| {
            container.port = port;
            container.name = next_name(container.spec.slug);
            container.create()
        })?;
        Ok(container)
    }

    /// The log file fed from the container's output.
    pub(crate) fn log_path(&self) -> &Path {
        &self.spec.log
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

    /// Runs `args` in the container; its output when it exits with 0.
    pub(crate) fn exec(&self, args: &[&str]) -> Result<String> {
        let cmd: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (code, output) = self.timed("exec", move |r| r.exec(cmd))?;
        match code {
            Some(0) => Ok(output),
            code => Err(TestkitError::CommandFailed {
                service: self.spec.service,
                command: format!("exec {} in {}", args.join(" "), self.name),
                status: code.map_or("no exit code".into(), |c| format!("exit code {c}")),
                output,
                fix: self.spec.fix,
            }),
        }
    }

    /// Whether `args` run in the container exit with 0.
    pub(crate) fn exec_ok(&self, args: &[&str]) -> bool {
        self.exec(args).is_ok()
    }

    fn running(&self) -> Result<&dyn Running> {
        self.running.as_deref().ok_or_else(|| TestkitError::CommandFailed {
            service: self.spec.service,
            command: format!("using container {}", self.name),
            status: "removed".into(),
            output: String::new(),
            fix: self.spec.fix,
        })
    }

    /// Runs a container operation with [`COMMAND_TIMEOUT`]; an error names
    /// the operation and the container.
    fn timed<T: Send>(
        &self,
        action: &str,
        operation: impl for<'r> FnOnce(&'r dyn Running) -> Fut<'r, TcResult<T>> + Send,
    ) -> Result<T> {
        let running = self.running()?;
        let result = block(move || async move { tokio::time::timeout(COMMAND_TIMEOUT, operation(running)).await });
        match result {
            Err(_) => Err(TestkitError::CommandFailed {
                service: self.spec.service,
                command: format!("{action} container {}", self.name),
                status: "failed".into(),
                output: format!("no answer within {COMMAND_TIMEOUT:?}"),
                fix: self.spec.fix,
            }),
            Ok(Err(error)) => Err(TestkitError::Container {
                service: self.spec.service,
                action: format!("{action} container {}", self.name),
                fix: self.spec.fix,
                source: Box::new(error),
            }),
            Ok(Ok(value)) => Ok(value),
        }
    }

    /// Creates and starts the container on `self.port` under `self.name`,
    /// then waits until ready; removes it again if that fails.
    fn create(&mut self) -> Result<()> {
        let _ = std::fs::File::create(&self.spec.log);
        let (request, port, name) = (&self.spec.request, self.port, self.name.as_str());
        let started = block(move || request(port, name));
        let running = match started {
            Ok(running) => running,
            Err(error) => {
                let reason = format!("container {} ({}) did not start: {error}", self.name, self.spec.image);
                return Err(self.failed(reason));
            }
        };
        runtime().spawn(running.follow_logs(self.spec.log.clone()));
        self.running = Some(running);
        if let Err(err) = self.wait_ready(Instant::now()) {
            self.remove();
            return Err(err);
        }
        tracing::info!(service = self.spec.service, container = %self.name, port = self.port, "container started");
        Ok(())
    }

    /// `Some(reason)` when the container is no longer running.
    fn exited(&self) -> Option<String> {
        self.running().ok()?;
        match self.timed("inspect", |r| r.is_running()) {
            Ok(true) => None,
            Ok(false) => {
                let code = self.timed("inspect", |r| r.exit_code()).ok().flatten();
                Some(format!(
                    "the container exited (exit code {})",
                    code.map_or("?".into(), |c| c.to_string())
                ))
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

    fn failed(&self, reason: String) -> TestkitError {
        // Give the log follower a moment to copy the last lines.
        sleep(Duration::from_millis(200));
        TestkitError::StartFailed {
            service: self.spec.service,
            port: self.port,
            reason: format!("container {} ({}): {reason}", self.name, self.spec.image),
            log: self.spec.log.display().to_string(),
            log_tail: process::log_tail(&self.spec.log),
            fix: self.spec.fix,
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.running.is_some() && self.timed("inspect", |r| r.is_running()).unwrap_or(false)
    }

    /// Pauses or unpauses every process of the container.
    pub(crate) fn set_frozen(&mut self, frozen: bool) -> Result<()> {
        if frozen {
            self.timed("pause", |r| r.pause())
        } else {
            self.timed("unpause", |r| r.unpause())
        }
    }

    /// Kills the container (SIGKILL, like a crash), then waits until the
    /// port is closed.
    pub(crate) fn stop(&mut self) -> Result<()> {
        if self.is_running() {
            if let Err(err) = self.timed("kill", |r| r.kill()) {
                // Fine if it just exited by itself.
                if self.is_running() {
                    return Err(err);
                }
            }
            tracing::info!(service = self.spec.service, container = %self.name, "container stopped");
        }
        if !process::wait_port_closed(self.port) {
            tracing::warn!(
                service = self.spec.service,
                port = self.port,
                "port still open after the kill"
            );
        }
        Ok(())
    }

    pub(crate) fn restart(&mut self) -> Result<()> {
        self.stop()?;
        if self.spec.fresh_on_restart {
            // A container that could not be removed would hold the name and
            // port of the new one: say so instead of failing the start later.
            self.try_remove()?;
            return self.create();
        }
        let started = Instant::now();
        let _ = std::fs::File::create(&self.spec.log);
        self.timed("start", |r| r.start())?;
        runtime().spawn(self.running()?.follow_logs(self.spec.log.clone()));
        self.wait_ready(started)?;
        tracing::info!(service = self.spec.service, container = %self.name, port = self.port, "container restarted");
        Ok(())
    }

    /// Removes the container and its anonymous volumes; a failure is logged
    /// (for drop and failed starts, which have an error of their own).
    fn remove(&mut self) {
        if let Err(err) = self.try_remove() {
            tracing::warn!(%err, "could not remove the container");
        }
    }

    /// [`remove`](Self::remove), returning the failure.
    fn try_remove(&mut self) -> Result<()> {
        if let (Some(command), true) = (&self.spec.before_remove, self.is_running()) {
            let args: Vec<&str> = command.iter().map(String::as_str).collect();
            if let Err(err) = self.exec(&args) {
                tracing::warn!(%err, "the clean-up command before removal failed");
            }
        }
        let Some(running) = self.running.take() else {
            return Ok(());
        };
        let id = running.id().to_string();
        let result = block(move || async move { tokio::time::timeout(COMMAND_TIMEOUT, running.rm()).await });
        match result {
            Ok(Ok(())) => {
                tracing::info!(service = self.spec.service, container = %self.name, "container removed");
                process::wait_port_closed(self.port);
                Ok(())
            }
            Ok(Err(error)) => Err(TestkitError::Container {
                service: self.spec.service,
                action: format!("removing container {} ({id})", self.name),
                fix: self.spec.fix,
                source: Box::new(error),
            }),
            Err(_) => Err(TestkitError::CommandFailed {
                service: self.spec.service,
                command: format!("removing container {} ({id})", self.name),
                status: "timed out".into(),
                output: format!("no answer within {COMMAND_TIMEOUT:?}"),
                fix: self.spec.fix,
            }),
        }
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

#[cfg(test)]
mod tests {
    use super::super::{local_then_container, DockerMode, DOCKER_MODE_ENV};
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
        send_sync::<crate::RedisServer>();
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

    /// The container operations work from inside another tokio runtime
    /// (tests are often `#[tokio::test]`), current-thread or not.
    #[test]
    fn operations_run_from_inside_other_runtimes() {
        let current = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert_eq!(current.block_on(async { block(|| async { 1 + 1 }) }), 2);
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        multi.block_on(async { block(tokio::task::yield_now) });
    }
}
