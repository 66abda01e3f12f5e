//! The part every service handle has in common: either an external service
//! named by an environment variable, or one the testkit manages.

use std::path::Path;

use tempfile::TempDir;

use crate::error::{Result, TestkitError};
use crate::process;

/// How the service behind a handle runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Named by the service's environment variable (such as
    /// `EXACTLY_DATABASE_URL`); the testkit neither started it nor stops it.
    External,
    /// Started by the testkit from programs installed on this machine.
    Local,
    /// Started by the testkit in a Docker container (see
    /// [`DOCKER_MODE_ENV`](crate::DOCKER_MODE_ENV)).
    Container,
}

/// What the testkit can do with a service it started.
pub(crate) trait Lifecycle {
    /// Stops the service abruptly; keeps its data and port.
    fn stop(&mut self) -> Result<()>;
    /// Starts a stopped service again (stopping it first if it runs).
    fn restart(&mut self) -> Result<()>;
    /// Whether the service is currently started.
    fn is_running(&mut self) -> bool;
    /// Suspends (`true`: SIGSTOP, `docker pause`) or resumes (`false`) every
    /// process of the service without ending it: connections stay open and
    /// requests hang, like a machine that stopped answering.
    fn set_frozen(&mut self, frozen: bool) -> Result<()>;
    /// The service's log file.
    fn log_path(&self) -> &Path;
    /// How the service runs.
    fn backend(&self) -> Backend {
        Backend::Local
    }
    /// The Docker container running the service, if any.
    fn container_name(&self) -> Option<&str> {
        None
    }
}

/// Names of a service kind, used for external handles and their errors.
pub(crate) struct Kind {
    /// Human name, e.g. `Redis`.
    service: &'static str,
    /// Environment variable naming an external instance.
    env_var: &'static str,
    /// Port assumed when the external address names none.
    default_port: u16,
}

impl Kind {
    pub(crate) const fn new(service: &'static str, env_var: &'static str, default_port: u16) -> Kind {
        Kind {
            service,
            env_var,
            default_port,
        }
    }
}

/// A service handle: the address clients use, plus the managed service
/// (`None` when the address came from the environment).
pub(crate) struct ServiceHandle<M> {
    kind: &'static Kind,
    address: String,
    port: u16,
    managed: Option<M>,
    /// Working directory removed on drop; declared after `managed` so the
    /// service stops before its files go.
    _dir: Option<TempDir>,
}

impl<M: Lifecycle> ServiceHandle<M> {
    /// A handle for the external service named by `kind.env_var`, if set.
    pub(crate) fn from_env(kind: &'static Kind) -> Option<Self> {
        let address = process::external_address(kind.env_var)?;
        tracing::info!(%address, "using external {} from {}", kind.service, kind.env_var);
        Some(ServiceHandle {
            kind,
            port: process::port_of_address(&address, kind.default_port),
            address,
            managed: None,
            _dir: None,
        })
    }

    /// A handle for a service the testkit started; `dir`, if any, is removed
    /// after the service was stopped on drop.
    pub(crate) fn managed(kind: &'static Kind, address: String, port: u16, managed: M, dir: Option<TempDir>) -> Self {
        ServiceHandle {
            kind,
            address,
            port,
            managed: Some(managed),
            _dir: dir,
        }
    }

    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn is_external(&self) -> bool {
        self.managed.is_none()
    }

    pub(crate) fn inner(&self) -> Option<&M> {
        self.managed.as_ref()
    }

    pub(crate) fn log_path(&self) -> Option<&Path> {
        self.managed.as_ref().map(M::log_path)
    }

    pub(crate) fn backend(&self) -> Backend {
        self.managed.as_ref().map_or(Backend::External, M::backend)
    }

    pub(crate) fn container_name(&self) -> Option<&str> {
        self.managed.as_ref().and_then(M::container_name)
    }

    pub(crate) fn is_running(&mut self) -> bool {
        self.managed.as_mut().is_none_or(M::is_running)
    }

    pub(crate) fn stop(&mut self) -> Result<()> {
        self.lifecycle("stop")?.stop()
    }

    pub(crate) fn restart(&mut self) -> Result<()> {
        self.lifecycle("restart")?.restart()
    }

    pub(crate) fn set_frozen(&mut self, frozen: bool) -> Result<()> {
        let action = if frozen { "freeze" } else { "thaw" };
        self.lifecycle(action)?.set_frozen(frozen)
    }

    fn lifecycle(&mut self, action: &'static str) -> Result<&mut M> {
        match self.managed.as_mut() {
            Some(managed) => Ok(managed),
            None => Err(TestkitError::External {
                service: self.kind.service,
                env_var: self.kind.env_var,
                address: self.address.clone(),
                action,
            }),
        }
    }
}

impl<M: Lifecycle> std::fmt::Debug for ServiceHandle<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(self.kind.service)
            .field("address", &self.address)
            .field("backend", &self.backend())
            .field("container", &self.container_name())
            .finish()
    }
}

/// Writes the accessors every public service handle shares, delegating to
/// its `handle: ServiceHandle<_>` field.
///
/// `address` names the method returning the client address (`url`,
/// `bootstrap`); the literals document the service in the generated docs.
macro_rules! service_handle_methods {
    (
        address: $address:ident,
        address_doc: $address_doc:literal,
        what: $what:literal,
        env: $env:literal,
        stop_doc: $stop_doc:literal,
        restart_doc: $restart_doc:literal $(,)?
    ) => {
        #[doc = $address_doc]
        pub fn $address(&self) -> &str {
            self.handle.address()
        }

        #[doc = concat!(
                                    "TCP port of the ", $what, " (for an external one: the port named in `", $env,
                                    "`, or the protocol's default port)."
                                )]
        pub fn port(&self) -> u16 {
            self.handle.port()
        }

        #[doc = concat!("Whether this handle points at a ", $what, " given by `", $env, "`.")]
        pub fn is_external(&self) -> bool {
            self.handle.is_external()
        }

        #[doc = concat!(
            "The ", $what, "'s log file (`None` when external). For a container it is fed live \
             from the container's output."
        )]
        pub fn log_path(&self) -> Option<&std::path::Path> {
            self.handle.log_path()
        }

        #[doc = concat!(
            "How the ", $what, " runs: external (`", $env, "`), from local programs, or in a Docker \
             container."
        )]
        pub fn backend(&self) -> crate::Backend {
            self.handle.backend()
        }

        #[doc = concat!(
            "Name of the Docker container running the ", $what, " (`None` unless \
             [`backend`](Self::backend) is [`Backend::Container`](crate::Backend::Container))."
        )]
        pub fn container_name(&self) -> Option<&str> {
            self.handle.container_name()
        }

        #[doc = concat!(
                                    "Whether the testkit's ", $what, " is currently running (always `true` when \
             external: the testkit does not observe it)."
                                )]
        pub fn is_running(&mut self) -> bool {
            self.handle.is_running()
        }

        #[doc = $stop_doc]
        #[doc = ""]
        #[doc = "Fails with [`TestkitError::External`](crate::TestkitError::External) when external."]
        pub fn stop(&mut self) -> crate::Result<()> {
            self.handle.stop()
        }

        #[doc = $restart_doc]
        #[doc = ""]
        #[doc = "Fails with [`TestkitError::External`](crate::TestkitError::External) when external."]
        pub fn restart(&mut self) -> crate::Result<()> {
            self.handle.restart()
        }

        #[doc = concat!(
            "Suspends every process of the ", $what, " (SIGSTOP; `docker pause` for a container) \
             without ending it: its port stays open and requests hang until \
             [`thaw`](Self::thaw). Dropping a frozen handle still removes it."
        )]
        #[doc = ""]
        #[doc = "Fails with [`TestkitError::External`](crate::TestkitError::External) when external."]
        pub fn freeze(&mut self) -> crate::Result<()> {
            self.handle.set_frozen(true)
        }

        #[doc = concat!("Resumes a ", $what, " suspended by [`freeze`](Self::freeze).")]
        #[doc = ""]
        #[doc = "Fails with [`TestkitError::External`](crate::TestkitError::External) when external."]
        pub fn thaw(&mut self) -> crate::Result<()> {
            self.handle.set_frozen(false)
        }
    };
}
