//! A Kafka-compatible broker ([Nisshi](https://crates.io/crates/nisshi)) run
//! as a child process, an Apache Kafka container, or an external Kafka named
//! by `EXACTLY_KAFKA_BOOTSTRAP`.
//!
//! This module only manages the broker; it has no Kafka client (the
//! container's readiness check hand-encodes one ApiVersions request).

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use crate::container::{self, strings, Container, ContainerSpec, DockerMode, Engine, Managed};
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

/// Expands to the Apache Kafka image of the Docker fallback (a macro so that
/// `concat!` can use it). Kafka 3.x still answers the old request versions
/// some tests hand-encode; 4.0 dropped them.
macro_rules! kafka_image {
    () => {
        "apache/kafka:3.9.1"
    };
}

/// The image the testkit runs when it starts Kafka in a Docker container.
pub const KAFKA_IMAGE: &str = kafka_image!();

/// Name of the SQLite file a persistent Nisshi broker keeps in its directory.
pub const PERSISTENT_DB_FILE: &str = "nisshi.db";

/// Name of the directory, inside the one given to
/// [`KafkaBroker::start_persistent`], where a persistent container broker
/// keeps its Kafka log dirs.
pub const CONTAINER_DATA_DIR: &str = "kafka-data";

const SERVICE: &str = "Kafka broker (nisshi)";
const CONTAINER_SERVICE: &str = "Kafka broker (container)";
const LOG_FILE: &str = "nisshi.log";
const CONTAINER_LOG_FILE: &str = "kafka.log";
const FIX_START: &str = "read the nisshi log above; check that nisshi was built with \
     `--features dynostore,libsql`, or set EXACTLY_KAFKA_BOOTSTRAP to use a real Kafka instead";
const FIX_CONTAINER: &str = concat!(
    "read the container log above; check that the Docker engine can pull ",
    kafka_image!(),
    " and publish ports on 127.0.0.1; or install Nisshi (`",
    nisshi_install!(),
    "`), or set EXACTLY_KAFKA_BOOTSTRAP to use a real Kafka instead"
);
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
/// Cluster id of every container broker (the base64 of `exactly-testkit-`);
/// fixed so that a later broker can reuse a persistent data dir.
const CLUSTER_ID: &str = "ZXhhY3RseS10ZXN0a2l0LQ";
/// Where a container broker keeps its data (a volume of the image).
const CONTAINER_LOG_DIRS: &str = "/var/lib/kafka/data";

/// A Kafka-compatible broker for tests.
///
/// Started by [`KafkaBroker::start`] (in-memory storage) or
/// [`KafkaBroker::start_persistent`] (storage that survives restarts). In
/// this order, the constructors use:
///
/// 1. the external Kafka named by [`KAFKA_BOOTSTRAP_ENV`], when set (the
///    handle only carries that bootstrap address);
/// 2. a Nisshi broker started from the `nisshi` program, in its own process
///    group, killed when the handle drops;
/// 3. when `nisshi` is missing (or
///    [`EXACTLY_TESTKIT_DOCKER`](crate::DOCKER_MODE_ENV)`=always`) and a
///    Docker engine answers: a single-node KRaft Apache Kafka container
///    ([`KAFKA_IMAGE`]) set up for transactions on one broker (replication
///    factor and min ISR 1 for the transaction and offsets topics), removed
///    when the handle drops.
///
/// Otherwise they fail with [`TestkitError::BinaryNotFound`], which says how
/// to install Nisshi and why Docker was not used.
#[derive(Debug)]
pub struct KafkaBroker {
    handle: ServiceHandle<Managed<ChildService>>,
}

static KIND: Kind = Kind::new(SERVICE, KAFKA_BOOTSTRAP_ENV, 9092);

impl KafkaBroker {
    /// Uses `EXACTLY_KAFKA_BOOTSTRAP` when set; otherwise starts `nisshi
    /// broker` with in-memory storage on a free loopback port and waits (at
    /// most 30 s) until the port accepts connections. Topics and messages
    /// are lost on [`restart`](Self::restart).
    ///
    /// Without `nisshi`, starts a Kafka container instead (see the type's
    /// docs) and waits until it answers an ApiVersions request; its
    /// [`restart`](Self::restart) replaces it by a fresh container on the
    /// same port, so topics and messages are lost as well.
    pub fn start() -> Result<KafkaBroker> {
        if let Some(handle) = ServiceHandle::from_env(&KIND) {
            return Ok(KafkaBroker { handle });
        }
        Self::start_managed(None)
    }

    /// Like [`start`](Self::start), but the broker stores its data in `dir`
    /// (created if missing), so topics and messages survive
    /// [`restart`](Self::restart) and even a new broker started on the same
    /// `dir`. `dir` is left in place on drop.
    ///
    /// A Nisshi broker keeps the SQLite file [`PERSISTENT_DB_FILE`] and its
    /// log `nisshi.log` in `dir`. A container broker bind-mounts
    /// `dir/`[`CONTAINER_DATA_DIR`] as its log dirs (made writable for the
    /// image's user, and its files are created world-writable so that the
    /// caller can delete them) and copies its output to `dir/kafka.log`; the
    /// bind mount needs an engine running on this machine.
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
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        Self::start_managed(Some(&dir))
    }

    /// Nisshi, else a container, as
    /// [`EXACTLY_TESTKIT_DOCKER`](crate::DOCKER_MODE_ENV) allows.
    /// `persistent_dir` is the absolute data dir of a persistent broker.
    fn start_managed(persistent_dir: Option<&Path>) -> Result<KafkaBroker> {
        container::local_then_container(
            SERVICE,
            DockerMode::from_env()?,
            container::engine,
            || Self::start_nisshi(persistent_dir),
            |engine| Self::start_container(engine, persistent_dir),
            nisshi_not_found,
        )
    }

    fn start_nisshi(persistent_dir: Option<&Path>) -> Result<KafkaBroker> {
        let program = find_nisshi()?;
        match persistent_dir {
            // nisshi resolves `sqlite://NAME` against its working directory.
            Some(dir) => {
                let storage = format!("sqlite://{PERSISTENT_DB_FILE}");
                Self::spawn(program, dir.to_path_buf(), &storage, None)
            }
            None => {
                let dir = process::service_temp_dir(SERVICE, "exactly-kafka-")?;
                let cwd = dir.path().to_path_buf();
                Self::spawn(program, cwd, "memory://tansu/", Some(dir))
            }
        }
    }

    fn spawn(program: PathBuf, cwd: PathBuf, storage: &str, dir: Option<TempDir>) -> Result<KafkaBroker> {
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
        let handle = ServiceHandle::managed(&KIND, bootstrap, port, Managed::Local(service), dir);
        Ok(KafkaBroker { handle })
    }

    /// A single-node KRaft Kafka container listening on the same port inside
    /// and outside, so that the advertised `127.0.0.1:PORT` is right on both
    /// sides.
    fn start_container(engine: &Engine, persistent_dir: Option<&Path>) -> Result<KafkaBroker> {
        let io = |action: String| {
            move |source| TestkitError::Io {
                service: CONTAINER_SERVICE,
                action,
                fix: "pass a writable directory, and make sure /tmp is writable",
                source,
            }
        };
        let (temp_dir, log, mount) = match persistent_dir {
            Some(dir) => {
                let data = dir.join(CONTAINER_DATA_DIR);
                fs::create_dir_all(&data).map_err(io(format!("creating {}", data.display())))?;
                // The image runs Kafka as its own user (`appuser`).
                fs::set_permissions(&data, fs::Permissions::from_mode(0o777))
                    .map_err(io(format!("making {} writable for the container", data.display())))?;
                (None, dir.join(CONTAINER_LOG_FILE), Some(data))
            }
            None => {
                let dir = process::service_temp_dir(CONTAINER_SERVICE, "exactly-kafka-")?;
                let log = dir.path().join(CONTAINER_LOG_FILE);
                (Some(dir), log, None)
            }
        };
        let persistent = mount.is_some();
        // Files Kafka creates in a bind mount belong to the image's user;
        // umask 0 lets the caller delete them afterwards. The image's own
        // start script (its default command) does the rest.
        let command = if persistent {
            strings(&["-c", "umask 0000 && exec /etc/kafka/docker/run"])
        } else {
            Vec::new()
        };
        let options = move |port: u16| -> Vec<String> {
            let mut options = Vec::new();
            if let Some(data) = &mount {
                // `--mount` (not `-v`) so a `:` in the path is no separator.
                options.push("--mount".into());
                options.push(format!(
                    "type=bind,source={},target={CONTAINER_LOG_DIRS}",
                    data.display()
                ));
                options.extend(strings(&["--entrypoint", "/bin/sh"]));
            }
            for (name, value) in kafka_env(port) {
                options.push("-e".into());
                options.push(format!("{name}={value}"));
            }
            options
        };
        let container = Container::start(
            engine,
            ContainerSpec {
                service: CONTAINER_SERVICE,
                slug: "kafka",
                image: KAFKA_IMAGE,
                inner_port: None,
                options: Box::new(options),
                command,
                ready: |container| api_versions_answered(container.port()),
                fresh_on_restart: !persistent,
                log,
                fix: FIX_CONTAINER,
            },
        )?;
        let port = container.port();
        let bootstrap = format!("127.0.0.1:{port}");
        let handle = ServiceHandle::managed(
            &KIND,
            bootstrap,
            port,
            Managed::Container(Box::new(container)),
            temp_dir,
        );
        Ok(KafkaBroker { handle })
    }

    service_handle_methods! {
        address: bootstrap,
        address_doc: "Bootstrap servers for a Kafka client: `127.0.0.1:PORT` for a testkit broker, \
                      the value of `EXACTLY_KAFKA_BOOTSTRAP` otherwise.",
        what: "broker",
        env: "EXACTLY_KAFKA_BOOTSTRAP",
        stop_doc: "Kills the broker's process group (SIGKILL, like a crash; `docker kill` for a \
                   container) and waits until its port is closed. Does nothing if already stopped.",
        restart_doc: "Stops the broker if it runs, then starts it again on the same port with the \
                      same storage (a persistent broker keeps its data; an in-memory container is \
                      replaced by a fresh one).",
    }
}

/// The `apache/kafka` image's settings (it turns `KAFKA_*` variables into
/// broker properties) for a combined broker and controller on `port`, able
/// to run transactions alone.
fn kafka_env(port: u16) -> Vec<(&'static str, String)> {
    // The controller listener is not published; it only has to differ from
    // the client port.
    let controller = if port == 9093 { 9094 } else { 9093 };
    vec![
        ("CLUSTER_ID", CLUSTER_ID.into()),
        ("KAFKA_NODE_ID", "1".into()),
        ("KAFKA_PROCESS_ROLES", "broker,controller".into()),
        ("KAFKA_CONTROLLER_QUORUM_VOTERS", format!("1@127.0.0.1:{controller}")),
        (
            "KAFKA_LISTENERS",
            format!("PLAINTEXT://:{port},CONTROLLER://:{controller}"),
        ),
        ("KAFKA_ADVERTISED_LISTENERS", format!("PLAINTEXT://127.0.0.1:{port}")),
        (
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT".into(),
        ),
        ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER".into()),
        ("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT".into()),
        ("KAFKA_LOG_DIRS", CONTAINER_LOG_DIRS.into()),
        ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1".into()),
        ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1".into()),
        ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1".into()),
        ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0".into()),
        // One partition per internal topic: creating the default 50 on the
        // first transaction or group request takes seconds on a small machine.
        ("KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS", "1".into()),
        ("KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS", "1".into()),
        ("KAFKA_HEAP_OPTS", "-Xmx512m -Xms512m".into()),
    ]
}

/// Whether a Kafka broker on `127.0.0.1:port` answers an ApiVersions (v0)
/// request without error. A published Docker port may accept connections
/// before the broker inside listens, so accepting alone proves nothing.
fn api_versions_answered(port: u16) -> bool {
    const API_VERSIONS: i16 = 18;
    const CORRELATION_ID: i32 = 0x7e57_0001;
    const CLIENT_ID: &[u8] = b"exactly-testkit";
    let timeout = Duration::from_secs(2);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    // Request header v1: api key, api version, correlation id, client id.
    let mut request = Vec::new();
    request.extend_from_slice(&API_VERSIONS.to_be_bytes());
    request.extend_from_slice(&0i16.to_be_bytes());
    request.extend_from_slice(&CORRELATION_ID.to_be_bytes());
    request.extend_from_slice(&(CLIENT_ID.len() as i16).to_be_bytes());
    request.extend_from_slice(CLIENT_ID);
    let mut frame = (request.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&request);
    if stream.write_all(&frame).is_err() {
        return false;
    }
    // Response: size, correlation id, then the body's error code.
    let mut head = [0u8; 10];
    if stream.read_exact(&mut head).is_err() {
        return false;
    }
    let correlation = i32::from_be_bytes([head[4], head[5], head[6], head[7]]);
    let error_code = i16::from_be_bytes([head[8], head[9]]);
    correlation == CORRELATION_ID && error_code == 0
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
    process::find_binary("nisshi", &extra).ok_or_else(|| nisshi_not_found(process::describe_search(&extra)))
}

/// The error for a missing `nisshi`, naming every way to get a broker; the
/// Docker fallback fills in why it did not run a container.
fn nisshi_not_found(searched: String) -> TestkitError {
    TestkitError::BinaryNotFound {
        service: SERVICE,
        binary: "nisshi",
        searched,
        docker: String::new(),
        fix: concat!(
            "install Nisshi with `",
            nisshi_install!(),
            "` (later versions need a newer Rust toolchain); or make a Docker engine answer \
             the `docker` CLI (install Docker and start the engine, or point DOCKER_HOST at one) so \
             that the testkit runs ",
            kafka_image!(),
            " in a container; or set EXACTLY_KAFKA_BOOTSTRAP=HOST:PORT to use a real Kafka"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn the_container_advertises_the_published_port_and_allows_transactions() {
        let env: HashMap<_, _> = kafka_env(41234).into_iter().collect();
        assert_eq!(env["KAFKA_ADVERTISED_LISTENERS"], "PLAINTEXT://127.0.0.1:41234");
        assert_eq!(env["KAFKA_LISTENERS"], "PLAINTEXT://:41234,CONTROLLER://:9093");
        assert_eq!(env["KAFKA_CONTROLLER_QUORUM_VOTERS"], "1@127.0.0.1:9093");
        for var in [
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        ] {
            assert_eq!(env[var], "1", "{var}");
        }
        let clash: HashMap<_, _> = kafka_env(9093).into_iter().collect();
        assert_eq!(clash["KAFKA_LISTENERS"], "PLAINTEXT://:9093,CONTROLLER://:9094");
    }

    #[test]
    fn the_missing_nisshi_error_names_every_way_out() {
        let text = nisshi_not_found("PATH=/bin".into()).to_string();
        for part in [NISSHI_INSTALL, KAFKA_IMAGE, "DOCKER_HOST", KAFKA_BOOTSTRAP_ENV] {
            assert!(text.contains(part), "{part} missing from: {text}");
        }
    }

    #[test]
    fn a_real_broker_counts_as_ready() {
        let broker = KafkaBroker::start().expect("start a broker");
        if broker.is_external() {
            return;
        }
        assert!(
            api_versions_answered(broker.port()),
            "{broker:?} did not answer ApiVersions"
        );
    }

    #[test]
    fn only_a_kafka_answer_counts_as_ready() {
        let port = process::free_port().unwrap();
        assert!(!api_versions_answered(port), "nothing listens on {port}");
        // Like a published Docker port with nothing behind it yet: accepts,
        // then closes without answering.
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let closer = std::thread::spawn(move || drop(listener.accept()));
        assert!(!api_versions_answered(port));
        closer.join().unwrap();
    }
}
