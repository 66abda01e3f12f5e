//! A schema registry for tests: Apicurio Registry, whose Confluent-compatible
//! API (`/apis/ccompat/v7`) Confluent's serializers and exactly's Avro
//! decoder speak, run from its runner jar as a child JVM with in-memory
//! storage; or an external registry named by `EXACTLY_SCHEMA_REGISTRY_URL`.
//!
//! - [`SchemaRegistry::shared`]: one registry per test process (or the
//!   external one), for tests that register and read schemas under subjects
//!   of their own. The JVM takes 10–40 s to start and about 300 MB, so tests
//!   share it.
//! - [`SchemaRegistry::start_own`]: a registry of the test's own, always
//!   started by the kit, which the test may stop, restart (empty) or freeze.
//! - [`SchemaRegistry::front`]: HTTP basic authentication, and TLS if asked,
//!   in front of any of them ([`RegistryFront`]), for clients' credentials
//!   and certificate checks.
//!
//! Schema ids are global: the first schema registered in a fresh registry
//! gets id 1, and registering the same schema again (under any subject)
//! gives its id again.
//!
//! The distribution comes from [`SCHEMA_REGISTRY_HOME_ENV`] or
//! [`default_home`], put there by `.ci/install-services.sh`; `java` (17 or
//! later) from `JAVA_HOME` or `PATH`. There is no container fallback.

mod front;
mod install;
mod jvm;
mod rest;

use std::path::PathBuf;
use std::sync::Mutex;

pub use front::{RegistryFront, RegistryFrontBuilder};
pub use install::{default_home, APICURIO_VERSION, SCHEMA_REGISTRY_HOME_ENV};

use crate::container::Managed;
use crate::error::Result;
use crate::handle::{Kind, ServiceHandle};
use crate::process;
use install::{Installation, SERVICE};
use jvm::RegistryJvm;

/// Environment variable that points the test kit at an existing registry's
/// Confluent-compatible API (`http://HOST:PORT/apis/ccompat/v7`, or a
/// Confluent Schema Registry's root URL) instead of the shared one.
pub const SCHEMA_REGISTRY_URL_ENV: &str = "EXACTLY_SCHEMA_REGISTRY_URL";

/// The path of Apicurio Registry's Confluent-compatible API.
pub const CCOMPAT_PATH: &str = "/apis/ccompat/v7";

static KIND: Kind = Kind::new(SERVICE, SCHEMA_REGISTRY_URL_ENV, 8081);

/// The folder and process of the shared registry, for the exit hook.
static SHARED_CLEANUP: Mutex<Option<(PathBuf, Option<u32>)>> = Mutex::new(None);

/// A schema registry for tests; see the [module documentation](self).
///
/// A registry the kit started is killed, and its folder removed, when the
/// handle drops (the shared one when the process exits).
#[derive(Debug)]
pub struct SchemaRegistry {
    handle: ServiceHandle<Managed<RegistryJvm>>,
}

impl SchemaRegistry {
    /// The registry every test of this process may share: the external one
    /// named by [`SCHEMA_REGISTRY_URL_ENV`] when set, otherwise one started
    /// on first use and kept until the process exits (the kernel kills it
    /// then, however the process ends).
    ///
    /// Tests register schemas under subjects of their own and must not
    /// depend on the ids other tests get. It cannot be stopped, restarted or
    /// frozen: a test that needs that uses [`start_own`](Self::start_own).
    pub fn shared() -> Result<&'static SchemaRegistry> {
        static SHARED: Mutex<Option<&'static SchemaRegistry>> = Mutex::new(None);
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(registry) = *shared {
            return Ok(registry);
        }
        let registry = match ServiceHandle::from_env(&KIND) {
            Some(handle) => SchemaRegistry { handle },
            None => {
                let registry = Self::start_local(true)?;
                if let Some(jvm) = registry.jvm() {
                    *SHARED_CLEANUP.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some((jvm.dir().to_path_buf(), jvm.pid()));
                    // SAFETY: registering a plain `extern "C"` function.
                    unsafe { libc::atexit(remove_shared_registry) };
                }
                registry
            }
        };
        let registry: &'static SchemaRegistry = Box::leak(Box::new(registry));
        *shared = Some(registry);
        Ok(registry)
    }

    /// [`SCHEMA_REGISTRY_URL_ENV`] when set; otherwise a registry of the
    /// caller's own, like [`start_own`](Self::start_own).
    pub fn start() -> Result<SchemaRegistry> {
        match ServiceHandle::from_env(&KIND) {
            Some(handle) => Ok(SchemaRegistry { handle }),
            None => Self::start_own(),
        }
    }

    /// Starts a registry of the caller's own on a free loopback port,
    /// whatever [`SCHEMA_REGISTRY_URL_ENV`] says, and waits (at most 180 s)
    /// until `/health/ready` answers.
    pub fn start_own() -> Result<SchemaRegistry> {
        Self::start_local(false)
    }

    fn start_local(tied_to_process: bool) -> Result<SchemaRegistry> {
        let install = Installation::find()?;
        let dir = process::service_temp_dir(SERVICE, "exactly-registry-")?;
        let jvm = RegistryJvm::start(install, dir.path(), tied_to_process)?;
        let port = jvm.port();
        let handle = ServiceHandle::managed(
            &KIND,
            format!("http://127.0.0.1:{port}{CCOMPAT_PATH}"),
            port,
            Managed::Local(jvm),
            Some(dir),
        );
        Ok(SchemaRegistry { handle })
    }

    /// Registers `schema` (an Avro schema's JSON text) under `subject` and
    /// returns its id: `POST {url}/subjects/{subject}/versions`. A schema
    /// the registry already holds gets its id again; one the subject's
    /// compatibility rules refuse is an error with the registry's answer.
    pub fn register_avro(&self, subject: &str, schema: &str) -> Result<u32> {
        rest::register(self.url(), subject, "AVRO", schema)
    }

    /// Registers a schema of any type the registry knows (`AVRO`, `JSON`,
    /// `PROTOBUF`) under `subject`, like
    /// [`register_avro`](Self::register_avro).
    pub fn register(&self, subject: &str, schema_type: &str, schema: &str) -> Result<u32> {
        rest::register(self.url(), subject, schema_type, schema)
    }

    /// The registry's answer for schema `id` (`GET {url}/schemas/ids/{id}`):
    /// an object with `schema` (the text), `schemaType` and `references`.
    pub fn schema_by_id(&self, id: u32) -> Result<serde_json::Value> {
        rest::schema_by_id(self.url(), id)
    }

    /// HTTP basic authentication (and TLS with
    /// [`RegistryFrontBuilder::tls`]) in front of this registry.
    pub fn front(&self) -> RegistryFrontBuilder {
        RegistryFrontBuilder::new(self.url())
    }

    /// The pid (and process group id) of the registry's JVM, while a
    /// registry the kit started runs.
    pub fn pid(&self) -> Option<u32> {
        self.jvm().and_then(RegistryJvm::pid)
    }

    fn jvm(&self) -> Option<&RegistryJvm> {
        self.handle.inner().and_then(Managed::local)
    }

    service_handle_methods! {
        address: url,
        address_doc: "The base URL of the Confluent-compatible API, \
                      `http://127.0.0.1:PORT/apis/ccompat/v7` for a registry the kit started, the value \
                      of `EXACTLY_SCHEMA_REGISTRY_URL` otherwise; paths such as `/schemas/ids/{id}` and \
                      `/subjects/{subject}/versions` follow it.",
        what: "schema registry",
        env: "EXACTLY_SCHEMA_REGISTRY_URL",
        stop_doc: "Kills the registry (SIGKILL to its process group, like a crash) and waits until its \
                   port is closed. Does nothing if already stopped.",
        restart_doc: "Stops the registry if it runs, then starts it again on the same port, empty: \
                      its storage is in memory, so schemas must be registered again (ids start at 1).",
    }
}

/// Exit hook of the shared registry: kills it and removes its folder.
extern "C" fn remove_shared_registry() {
    let Some((dir, pid)) = SHARED_CLEANUP.lock().ok().and_then(|mut cleanup| cleanup.take()) else {
        return;
    };
    if let Some(pid) = pid {
        process::kill_process_group(pid);
    }
    let _ = std::fs::remove_dir_all(dir);
}
