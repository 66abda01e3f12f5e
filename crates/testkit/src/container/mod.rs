//! The container fallback: services run in Docker containers through the
//! `testcontainers` crate — only in a build with the test kit's
//! `containers` feature (the tests turn it on; the demo leaves it off, and
//! without it the kit starts local programs only, saying so where a
//! container would have been tried) (its async runner, on a runtime of the testkit's
//! own) and the images of `testcontainers-modules`.
//!
//! The engine is the one `testcontainers` finds: `DOCKER_HOST`, the
//! `~/.testcontainers.properties` file, or the local socket. Published ports
//! are bound to `127.0.0.1` of the machine running the engine, so the engine
//! must be local (Docker Engine, rootless Docker, Docker Desktop, or
//! anything else that forwards published ports to this machine's loopback).
//!
//! Containers are named `exactly-testkit-<service>-<pid>-<n>-<random>` and
//! labelled `exactly.testkit=1` (and `exactly.testkit.pid=<pid>`); a handle
//! removes its container (with its anonymous volumes) when it drops.
//! Containers left by a killed test run can be removed with
//! `docker rm -f -v $(docker ps -aq --filter label=exactly.testkit=1)`.
//!
//! The testkit's API is synchronous: every container operation runs on the
//! testkit's own tokio runtime (a background thread pool that lives as long
//! as the process), from a helper thread, so it works the same from plain
//! tests and from inside a test's own tokio runtime.

#[cfg(feature = "containers")]
mod docker;
#[cfg(feature = "containers")]
pub(crate) use docker::{bind, create, engine, Container, ContainerSpec, Engine};

#[cfg(not(feature = "containers"))]
mod absent;
#[cfg(not(feature = "containers"))]
pub(crate) use absent::{engine, Container, Engine};

use std::path::Path;

use crate::error::{Result, TestkitError};
use crate::handle::{Backend, Lifecycle};

/// Environment variable choosing when the testkit may fall back to Docker:
/// `never`, `auto` (the default: when the local programs are missing) or
/// `always` (skip the local programs, always use a container).
pub const DOCKER_MODE_ENV: &str = "EXACTLY_TESTKIT_DOCKER";

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
                tracing::info!(service, version = %engine.version(), ?mode, "starting a container");
                return container(engine);
            }
            Err(reason) if !cfg!(feature = "containers") => format!("Docker was not tried: {reason}"),
            Err(reason) => format!("no Docker engine answered: {reason}"),
        },
    };
    if let TestkitError::BinaryNotFound { docker, .. } = &mut missing {
        *docker = why_not;
    }
    Err(missing)
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
            Managed::Container(container) => container.log_path(),
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
