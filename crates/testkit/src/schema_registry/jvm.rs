//! Apicurio Registry run from its runner jar as a child JVM: Quarkus on one
//! loopback port, in-memory storage (an embedded H2 database), its output
//! in `registry.log` in a temp folder of its own.
//!
//! Ready means `GET /health/ready` answers 200: the HTTP port opens a
//! little before the storage is up.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::install::{Installation, SERVICE};
use crate::error::Result;
use crate::handle::Lifecycle;
use crate::process::{self, GroupChild, Startup};

/// Quarkus starts in 10–40 s on two busy cores; much longer beside
/// compilers and other JVMs.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);
const POLL_INTERVAL: Duration = Duration::from_millis(200);
const LOG_FILE: &str = "registry.log";
/// Enough for tests' schemas; the registry's RSS stays near 300 MB.
const HEAP: &str = "256m";
const FIX_START: &str = "read the registry log above (registry.log in its folder); check that \
     EXACTLY_SCHEMA_REGISTRY_HOME (or ~/.cache/exactly/apicurio-registry-<version>) holds the unpacked \
     distribution and that `java -version` is 17 or later; or set EXACTLY_SCHEMA_REGISTRY_URL to use a \
     running registry";

/// A registry JVM the test kit started, on a port it keeps across
/// restarts.
pub(crate) struct RegistryJvm {
    install: Installation,
    dir: PathBuf,
    port: u16,
    log: PathBuf,
    tied_to_process: bool,
    child: Option<GroupChild>,
}

impl std::fmt::Debug for RegistryJvm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryJvm")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .finish()
    }
}

impl RegistryJvm {
    /// Starts the registry on a free port, its working folder `dir`, and
    /// waits until it is ready.
    pub(crate) fn start(install: Installation, dir: &Path, tied_to_process: bool) -> Result<RegistryJvm> {
        let mut jvm = RegistryJvm {
            install,
            dir: dir.to_path_buf(),
            port: 0,
            log: dir.join(LOG_FILE),
            tied_to_process,
            child: None,
        };
        process::with_free_port(SERVICE, |port| {
            jvm.port = port;
            jvm.spawn_and_wait()
        })?;
        Ok(jvm)
    }

    /// The HTTP port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The registry's working folder.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pid (and process group) of the running JVM.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(GroupChild::pid)
    }

    fn command(&self) -> Command {
        let mut java = Command::new(&self.install.java);
        java.current_dir(&self.dir)
            .env_remove("JAVA_TOOL_OPTIONS")
            .env_remove("JAVA_OPTS")
            .arg(format!("-Xmx{HEAP}"))
            .args([
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true",
            ])
            .arg(format!("-Dquarkus.http.port={}", self.port))
            .arg("-Dquarkus.http.host=127.0.0.1")
            // No console colours in the log file, no anonymous usage data.
            .arg("-Dquarkus.console.color=false")
            .arg("-Dquarkus.analytics.disabled=true")
            .arg("-jar")
            .arg(&self.install.jar);
        java
    }

    fn spawn_and_wait(&mut self) -> Result<()> {
        let started = Instant::now();
        let java = self.command();
        let mut child = if self.tied_to_process {
            GroupChild::spawn_tied(SERVICE, java, &self.log)?
        } else {
            GroupChild::spawn(SERVICE, java, &self.log)?
        };
        if let Some(pid) = child.pid() {
            // Lets a later run reap the registry if this process dies first.
            let _ = std::fs::write(self.dir.join(process::SERVICE_PID_FILE), pid.to_string());
        }
        let startup = Startup {
            service: SERVICE,
            port: self.port,
            log: &self.log,
            fix: FIX_START,
        };
        loop {
            if let Some(reason) = child.exited() {
                return Err(startup.failed(reason));
            }
            if super::rest::ready(self.port) {
                tracing::info!(
                    port = self.port,
                    after_ms = started.elapsed().as_millis() as u64,
                    "schema registry ready"
                );
                self.child = Some(child);
                return Ok(());
            }
            if started.elapsed() >= STARTUP_TIMEOUT {
                return Err(startup.failed(format!(
                    "GET /health/ready did not answer 200 within {} s",
                    STARTUP_TIMEOUT.as_secs()
                )));
            }
            sleep(POLL_INTERVAL);
        }
    }
}

impl Lifecycle for RegistryJvm {
    /// Kills the JVM (SIGKILL to its process group) and waits until its
    /// port is closed.
    fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill();
            if !process::wait_port_closed(self.port) {
                tracing::warn!(port = self.port, "schema registry port still open after kill");
            }
            tracing::info!(port = self.port, "schema registry stopped");
        }
        Ok(())
    }

    /// Starts it again on the same port, empty (its storage is in memory).
    fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.spawn_and_wait()
    }

    fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| child.exited().is_none())
    }

    fn set_frozen(&mut self, frozen: bool) -> Result<()> {
        match self.pid() {
            Some(pgid) => process::freeze_process_group(pgid, frozen, SERVICE),
            None => Ok(()),
        }
    }

    fn log_path(&self) -> &Path {
        &self.log
    }
}
