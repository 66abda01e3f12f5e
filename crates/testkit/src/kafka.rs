//! A Kafka-compatible broker ([Nisshi](https://crates.io/crates/nisshi)) run
//! as a child process, or an external Kafka named by `EXACTLY_KAFKA_BOOTSTRAP`.
//!
//! This module only manages the broker process; it has no Kafka client.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use crate::error::{Result, TestkitError};
use crate::handle::{Kind, ServiceHandle};
use crate::process::{self, ChildService, ChildSpec};

/// Environment variable that points the testkit at an existing Kafka
/// (`HOST:PORT[,HOST:PORT...]`) instead of starting a broker.
pub const KAFKA_BOOTSTRAP_ENV: &str = "EXACTLY_KAFKA_BOOTSTRAP";

/// Expands to the command installing the Nisshi release the testkit is
/// written for (a macro so that `concat!` can use it).
macro_rules! nisshi_install {
    () => {
        "cargo install nisshi --version 0.7.0-pre.2 --locked --features dynostore,libsql"
    };
}

/// The command that installs the Nisshi release the testkit is written for.
pub const NISSHI_INSTALL: &str = nisshi_install!();

/// Name of the SQLite file a persistent broker keeps in its directory.
pub const PERSISTENT_DB_FILE: &str = "nisshi.db";

const SERVICE: &str = "Kafka broker (nisshi)";
const LOG_FILE: &str = "nisshi.log";
const FIX_START: &str = "read the nisshi log above; check that nisshi was built with \
     `--features dynostore,libsql`, or set EXACTLY_KAFKA_BOOTSTRAP to use a real Kafka instead";
/// Variables nisshi reads that must not leak from the test environment.
const NISSHI_ENV: &[&str] = &[
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "DATA_LAKE",
];

/// A Kafka-compatible broker for tests.
///
/// Started by [`KafkaBroker::start`] (in-memory storage) or
/// [`KafkaBroker::start_persistent`] (SQLite file that survives restarts);
/// the broker runs in its own process group, which is killed when the
/// handle drops. When [`KAFKA_BOOTSTRAP_ENV`] is set, both constructors
/// return a handle that only carries that bootstrap address.
#[derive(Debug)]
pub struct KafkaBroker {
    handle: ServiceHandle<ChildService>,
}

static KIND: Kind = Kind::new(SERVICE, KAFKA_BOOTSTRAP_ENV, 9092);

impl KafkaBroker {
    /// Uses `EXACTLY_KAFKA_BOOTSTRAP` when set; otherwise starts `nisshi
    /// broker` with in-memory storage on a free loopback port and waits (at
    /// most 30 s) until the port accepts connections. Topics and messages
    /// are lost on [`restart`](Self::restart).
    pub fn start() -> Result<KafkaBroker> {
        if let Some(handle) = ServiceHandle::from_env(&KIND) {
            return Ok(KafkaBroker { handle });
        }
        let dir = process::service_temp_dir(SERVICE, "exactly-kafka-")?;
        let cwd = dir.path().to_path_buf();
        Self::spawn(cwd, "memory://tansu/", Some(dir))
    }

    /// Like [`start`](Self::start), but the broker stores its data in the
    /// SQLite file [`PERSISTENT_DB_FILE`] inside `dir` (created if missing),
    /// so topics and messages survive [`restart`](Self::restart) and even a
    /// new broker started on the same `dir`. The broker's log is
    /// `dir/nisshi.log`. `dir` is left in place on drop.
    pub fn start_persistent(dir: impl AsRef<Path>) -> Result<KafkaBroker> {
        if let Some(handle) = ServiceHandle::from_env(&KIND) {
            return Ok(KafkaBroker { handle });
        }
        let dir = dir.as_ref();
        fs::create_dir_all(dir).map_err(|source| TestkitError::Io {
            service: SERVICE,
            action: format!("creating {}", dir.display()),
            fix: "pass a writable directory",
            source,
        })?;
        let cwd = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        // nisshi resolves `sqlite://NAME` against its working directory.
        let storage = format!("sqlite://{PERSISTENT_DB_FILE}");
        Self::spawn(cwd, &storage, None)
    }

    fn spawn(cwd: PathBuf, storage: &str, dir: Option<TempDir>) -> Result<KafkaBroker> {
        let program = find_nisshi()?;
        let storage = OsString::from(storage);
        let args = move |port: u16| -> Vec<OsString> {
            let url = format!("tcp://127.0.0.1:{port}");
            vec![
                "broker".into(),
                "--listener-url".into(),
                url.clone().into(),
                "--advertised-listener-url".into(),
                url.into(),
                "--storage-engine".into(),
                storage.clone(),
            ]
        };
        let service = ChildService::start(ChildSpec {
            service: SERVICE,
            program,
            args: Box::new(args),
            env_remove: NISSHI_ENV,
            log: cwd.join(LOG_FILE),
            cwd,
            fix: FIX_START,
        })?;
        let port = service.port();
        let bootstrap = format!("127.0.0.1:{port}");
        let handle = ServiceHandle::managed(&KIND, bootstrap, port, service, dir);
        Ok(KafkaBroker { handle })
    }

    service_handle_methods! {
        address: bootstrap,
        address_doc: "Bootstrap servers for a Kafka client: `127.0.0.1:PORT` for a testkit broker, \
                      the value of `EXACTLY_KAFKA_BOOTSTRAP` otherwise.",
        what: "broker",
        env: "EXACTLY_KAFKA_BOOTSTRAP",
        stop_doc: "Kills the broker's process group (SIGKILL, like a crash) and waits until its \
                   port is closed. Does nothing if already stopped.",
        restart_doc: "Stops the broker if it runs, then starts it again on the same port with the \
                      same storage (a persistent broker keeps its data).",
    }
}

/// `nisshi` on `PATH`, in `$CARGO_HOME/bin` or in `~/.cargo/bin`.
fn find_nisshi() -> Result<PathBuf> {
    let mut extra = Vec::new();
    if let Some(cargo_home) = std::env::var_os("CARGO_HOME") {
        extra.push(PathBuf::from(cargo_home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        extra.push(PathBuf::from(home).join(".cargo").join("bin"));
    }
    process::find_binary("nisshi", &extra).ok_or_else(|| TestkitError::BinaryNotFound {
        service: SERVICE,
        binary: "nisshi",
        searched: process::describe_search(&extra),
        fix: concat!(
            "install Nisshi with `",
            nisshi_install!(),
            "` (later versions need a newer Rust toolchain), or set \
             EXACTLY_KAFKA_BOOTSTRAP=HOST:PORT to use a real Kafka"
        ),
    })
}
