//! Apache Kafka for tests: a single-node KRaft broker run from its jars as a
//! child JVM, an Apache Kafka container, or an external Kafka named by
//! `EXACTLY_KAFKA_BOOTSTRAP`.
//!
//! - [`KafkaBroker::shared`]: one broker per test process (or the external
//!   one), for tests that only create topics, produce and consume. A JVM
//!   broker costs seconds to start; sharing it keeps a test binary quick.
//! - [`KafkaBroker::start`], [`KafkaBroker::start_persistent`] and
//!   [`KafkaBroker::builder`]: a broker of the test's own, always started by
//!   the kit whatever the environment says, which the test may stop,
//!   restart, freeze or configure (`transaction.max.timeout.ms`, ...).
//! - [`KafkaCluster`]: several brokers (three by default) from the same
//!   jars, for tests of leader changes, elections and one broker down or
//!   frozen while the others serve.
//! - [`KafkaBrokerBuilder::sasl_ssl`]: such a broker with a `SASL_SSL`
//!   listener too ([`KafkaBroker::secured`]): a certificate signed by a CA
//!   made for the run, SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN for one user
//!   with a random password.
//!
//! The jars come from [`KAFKA_LIBS_ENV`] or [`default_libs_dir`], put there
//! by `.ci/install-services.sh`; `java` from `JAVA_HOME` or `PATH`.

pub mod cluster;
mod container;
mod install;
mod jvm;
mod ready;
mod wire;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use cluster::{
    Acks, ClusterBroker, FetchedRecord, KafkaCluster, KafkaClusterBuilder, LoneLeader, PartitionState, SharedCluster,
    TopicState, UncleanElection,
};
pub use container::{CONTAINER_DATA_DIR, KAFKA_IMAGE};
pub use install::{default_libs_dir, KAFKA_INSTALL, KAFKA_LIBS_ENV, KAFKA_VERSION};
/// A Kafka error code, as [`KafkaRequestError::response_error`] gives it.
pub use kafka_protocol::ResponseError;
pub use wire::KafkaRequestError;

use crate::container::{self as docker, DockerMode, Managed};
use crate::error::{Result, TestkitError};
use crate::handle::{Kind, ServiceHandle};
use crate::process;
use install::{Installation, SERVICE};
use jvm::{BrokerSpec, JvmBroker, Quorum, SecuredSpec, DEFAULT_HEAP};

/// Environment variable that points the testkit at an existing Kafka
/// (`HOST:PORT[,HOST:PORT...]`) instead of the shared broker.
pub const KAFKA_BOOTSTRAP_ENV: &str = "EXACTLY_KAFKA_BOOTSTRAP";

/// Name of the folder, inside the broker's folder, holding its data (Kafka's
/// `log.dirs`, with `meta.properties` once formatted).
pub const DATA_DIR: &str = jvm::DATA_DIR;

/// An Apache Kafka broker for tests.
///
/// A broker the kit started is one KRaft node (broker and controller) on
/// two free loopback ports, with replication factor and min ISR 1 for the
/// offsets and transaction logs, one partition per internal topic and no
/// initial rebalance delay. Its data lives on disk, so it survives
/// [`restart`](Self::restart) (a restarted broker recovers its logs as after
/// a crash). The broker is killed, and its temp folder removed, when the
/// handle drops.
///
/// Without a Java runtime or the broker's jars (or with
/// [`EXACTLY_TESTKIT_DOCKER`](crate::DOCKER_MODE_ENV)`=always`), the kit
/// runs [`KAFKA_IMAGE`] in a Docker container when an engine answers;
/// otherwise it fails with [`TestkitError::BinaryNotFound`] naming the
/// install command, the jar folder variable and the override.
#[derive(Debug)]
pub struct KafkaBroker {
    handle: ServiceHandle<Managed<JvmBroker>>,
    secured: Option<SecuredListener>,
}

/// The `SASL_SSL` listener of a broker started with
/// [`KafkaBrokerBuilder::sasl_ssl`].
#[derive(Clone)]
pub struct SecuredListener {
    /// `localhost:PORT`: the name the broker's certificate is issued for.
    pub bootstrap: String,
    /// The PEM certificate of the CA that signed the broker's certificate.
    pub ca_file: PathBuf,
    /// The SASL user.
    pub username: String,
    /// Its password (SCRAM credentials and PLAIN alike).
    pub password: String,
    /// The enabled SASL mechanisms.
    pub mechanisms: Vec<String>,
}

impl std::fmt::Debug for SecuredListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecuredListener")
            .field("bootstrap", &self.bootstrap)
            .field("ca_file", &self.ca_file)
            .field("username", &self.username)
            .field("password", &"***")
            .field("mechanisms", &self.mechanisms)
            .finish()
    }
}

impl SecuredListener {
    /// The librdkafka (and exactly-kafka-wire) properties of a client of
    /// this listener authenticating with `mechanism`.
    pub fn client_properties(&self, mechanism: &str) -> Vec<(String, String)> {
        [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", mechanism),
            ("sasl.username", &self.username),
            ("sasl.password", &self.password),
            ("ssl.ca.location", &self.ca_file.display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

static KIND: Kind = Kind::new(SERVICE, KAFKA_BOOTSTRAP_ENV, 9092);

/// The folder and process of the shared broker, for the exit hook.
static SHARED_CLEANUP: Mutex<Option<(PathBuf, Option<u32>)>> = Mutex::new(None);

impl KafkaBroker {
    /// The broker every test of this process may share: the external Kafka
    /// named by [`KAFKA_BOOTSTRAP_ENV`] when set, otherwise one started on
    /// first use and kept until the process exits (the kernel kills it then,
    /// however the process ends; its folder is removed on a normal exit and
    /// reaped by a later run otherwise).
    ///
    /// Tests may create topics, produce, consume and run transactions on it;
    /// they must not depend on what other tests do there (use topic names of
    /// their own). It cannot be stopped, restarted or frozen: a test that
    /// needs that starts its own with [`start`](Self::start).
    pub fn shared() -> Result<&'static KafkaBroker> {
        static SHARED: Mutex<Option<&'static KafkaBroker>> = Mutex::new(None);
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(broker) = *shared {
            return Ok(broker);
        }
        let broker = match ServiceHandle::from_env(&KIND) {
            Some(handle) => KafkaBroker { handle, secured: None },
            None => {
                let mut builder = KafkaBroker::builder();
                builder.tied_to_process = true;
                let broker = builder.start()?;
                if let Some(jvm) = broker.jvm() {
                    *SHARED_CLEANUP.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some((jvm.dir().to_path_buf(), jvm.pid()));
                    // SAFETY: registering a plain `extern "C"` function.
                    unsafe { libc::atexit(remove_shared_broker) };
                }
                broker
            }
        };
        let broker: &'static KafkaBroker = Box::leak(Box::new(broker));
        *shared = Some(broker);
        Ok(broker)
    }

    /// Starts a broker of the caller's own with the test settings, its data
    /// in a temp folder removed on drop. Never uses
    /// [`KAFKA_BOOTSTRAP_ENV`].
    pub fn start() -> Result<KafkaBroker> {
        Self::builder().start()
    }

    /// Like [`start`](Self::start), but the broker keeps its data in `dir`
    /// (created if missing; [`DATA_DIR`] inside it, with `server.properties`
    /// and the log `kafka.log` beside it), which is left in place on drop:
    /// a broker started later on the same `dir` finds every topic and
    /// message again.
    pub fn start_persistent(dir: impl AsRef<Path>) -> Result<KafkaBroker> {
        Self::builder().data_dir(dir).start()
    }

    /// A broker of the caller's own with settings of its choice.
    pub fn builder() -> KafkaBrokerBuilder {
        KafkaBrokerBuilder {
            settings: Vec::new(),
            data_dir: None,
            heap: DEFAULT_HEAP.into(),
            tied_to_process: false,
            sasl_mechanisms: None,
        }
    }

    /// The `SASL_SSL` listener, for a broker started with
    /// [`KafkaBrokerBuilder::sasl_ssl`]. [`bootstrap`](Self::bootstrap)
    /// stays the plaintext listener of the same broker (for the test's own
    /// set-up and checks).
    pub fn secured(&self) -> Option<&SecuredListener> {
        self.secured.as_ref()
    }

    /// The pid (and process group id) of the broker's JVM, while a broker
    /// the kit started from its jars runs.
    pub fn pid(&self) -> Option<u32> {
        self.jvm().and_then(JvmBroker::pid)
    }

    fn jvm(&self) -> Option<&JvmBroker> {
        self.handle.inner().and_then(Managed::local)
    }

    service_handle_methods! {
        address: bootstrap,
        address_doc: "Bootstrap servers for a Kafka client: `127.0.0.1:PORT` for a testkit broker, \
                      the value of `EXACTLY_KAFKA_BOOTSTRAP` for the external one.",
        what: "broker",
        env: "EXACTLY_KAFKA_BOOTSTRAP",
        stop_doc: "Kills the broker (SIGKILL to its process group, like a crash; `docker kill` for a \
                   container) and waits until its ports are closed. Does nothing if already stopped.",
        restart_doc: "Stops the broker if it runs, then starts it again on the same ports with the \
                      same data (an in-memory container is replaced by a fresh one).",
    }
}

/// Settings of a broker of the caller's own; see [`KafkaBroker::builder`].
#[derive(Clone, Debug)]
pub struct KafkaBrokerBuilder {
    settings: Vec<(String, String)>,
    data_dir: Option<PathBuf>,
    heap: String,
    tied_to_process: bool,
    sasl_mechanisms: Option<Vec<String>>,
}

/// The mechanisms [`KafkaBrokerBuilder::sasl_ssl`] enables.
pub const SECURED_MECHANISMS: [&str; 3] = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"];

impl KafkaBrokerBuilder {
    /// Adds a `SASL_SSL` listener (see [`KafkaBroker::secured`]) enabling
    /// [`SECURED_MECHANISMS`]. Local jars only: a container broker is not
    /// secured.
    pub fn sasl_ssl(self) -> Self {
        self.sasl_mechanisms(&SECURED_MECHANISMS)
    }

    /// Like [`sasl_ssl`](Self::sasl_ssl), enabling only `mechanisms` (out
    /// of [`SECURED_MECHANISMS`]).
    pub fn sasl_mechanisms(mut self, mechanisms: &[&str]) -> Self {
        self.sasl_mechanisms = Some(mechanisms.iter().map(|m| m.to_string()).collect());
        self
    }

    /// Sets a broker property (`server.properties`; `KAFKA_*` for a
    /// container), e.g. `transaction.max.timeout.ms`,
    /// `transactional.id.expiration.ms`,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`. It
    /// replaces the test kit's value of the same key.
    pub fn setting(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        self.settings.push((key.into(), value.to_string()));
        self
    }

    /// Keeps the data in `dir` (see [`KafkaBroker::start_persistent`]).
    pub fn data_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.data_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The JVM heap (`-Xms` and `-Xmx`), `512m` by default.
    pub fn heap(mut self, heap: impl Into<String>) -> Self {
        self.heap = heap.into();
        self
    }

    /// Starts the broker from its jars, else in a container (as
    /// [`EXACTLY_TESTKIT_DOCKER`](crate::DOCKER_MODE_ENV) allows), and waits
    /// until it answers Metadata.
    pub fn start(self) -> Result<KafkaBroker> {
        let persistent_dir = match &self.data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| TestkitError::Io {
                    service: SERVICE,
                    action: format!("creating {}", dir.display()),
                    fix: "pass a writable directory",
                    source,
                })?;
                Some(std::path::absolute(dir).unwrap_or_else(|_| dir.clone()))
            }
            None => None,
        };
        docker::local_then_container(
            SERVICE,
            DockerMode::from_env()?,
            docker::engine,
            || self.start_jvm(persistent_dir.as_deref()),
            |engine| {
                if self.sasl_mechanisms.is_some() {
                    return Err(TestkitError::Io {
                        service: SERVICE,
                        action: "starting a secured broker in a container".into(),
                        fix: "run .ci/install-services.sh: a SASL_SSL broker runs from the local jars only",
                        source: std::io::Error::other("the container broker has no SASL_SSL listener"),
                    });
                }
                let started = container::start(engine, persistent_dir.as_deref(), &self.settings)?;
                let port = started.container.port();
                let handle = ServiceHandle::managed(
                    &KIND,
                    format!("127.0.0.1:{port}"),
                    port,
                    Managed::Container(Box::new(started.container)),
                    started.temp_dir,
                );
                Ok(KafkaBroker { handle, secured: None })
            },
            |searched| install::not_found("java and kafka_2.13-*.jar", searched),
        )
    }

    fn start_jvm(&self, persistent_dir: Option<&Path>) -> Result<KafkaBroker> {
        let install = Installation::find()?;
        let (dir, temp_dir) = match persistent_dir {
            Some(dir) => (dir.to_path_buf(), None),
            None => {
                let temp = process::service_temp_dir(SERVICE, "exactly-kafka-")?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let secured = match &self.sasl_mechanisms {
            Some(mechanisms) => Some(secured_spec(&dir, mechanisms)?),
            None => None,
        };
        let broker = JvmBroker::start(BrokerSpec {
            install,
            dir: dir.clone(),
            settings: self.settings.clone(),
            heap: self.heap.clone(),
            tied_to_process: self.tied_to_process,
            secured: secured.clone(),
            node_id: 1,
            quorum: Quorum::Alone,
        })?;
        let port = broker.port();
        let secured = secured.zip(broker.secured_port()).map(|(spec, port)| SecuredListener {
            bootstrap: format!("localhost:{port}"),
            ca_file: dir.join(TLS_DIR).join("ca.crt"),
            username: spec.username,
            password: spec.password,
            mechanisms: spec.mechanisms,
        });
        let handle = ServiceHandle::managed(
            &KIND,
            format!("127.0.0.1:{port}"),
            port,
            Managed::Local(broker),
            temp_dir,
        );
        Ok(KafkaBroker { handle, secured })
    }
}

/// Folder (inside the broker's folder) of the secured listener's CA and
/// certificate.
const TLS_DIR: &str = "tls";

/// A CA and a certificate for `localhost` in `<dir>/tls` (kept when the
/// folder already has them: a broker started again on a persistent folder
/// keeps its certificate and its user), and the user.
fn secured_spec(dir: &Path, mechanisms: &[String]) -> Result<SecuredSpec> {
    if let Some(unknown) = mechanisms.iter().find(|m| !SECURED_MECHANISMS.contains(&m.as_str())) {
        return Err(TestkitError::InvalidSetting {
            var: "KafkaBrokerBuilder::sasl_mechanisms",
            value: unknown.clone(),
            fix: "enable SCRAM-SHA-256, SCRAM-SHA-512 and/or PLAIN",
        });
    }
    let tls = dir.join(TLS_DIR);
    let user_file = tls.join("user");
    let server = crate::tls::CertFiles {
        cert: tls.join("broker.crt"),
        key: tls.join("broker.key"),
    };
    let kept = std::fs::read_to_string(&user_file).ok().filter(|_| server.key.exists());
    let (username, password) = match kept.as_deref().and_then(|text| text.split_once('\n')) {
        Some((username, password)) => (username.to_string(), password.trim_end().to_string()),
        None => {
            let ca = crate::tls::TestCa::generate(&tls)?;
            ca.server_cert("broker", &["localhost"])?;
            let password = format!("kafka-secret-{}", jvm::new_cluster_id().replace(['-', '_'], "x"));
            let username = "exactly".to_string();
            std::fs::write(&user_file, format!("{username}\n{password}\n")).map_err(|source| TestkitError::Io {
                service: SERVICE,
                action: format!("writing {}", user_file.display()),
                fix: "pass a writable directory",
                source,
            })?;
            (username, password)
        }
    };
    Ok(SecuredSpec {
        server,
        mechanisms: mechanisms.to_vec(),
        username,
        password,
    })
}

/// Exit hook of the shared broker: kills it and removes its folder.
extern "C" fn remove_shared_broker() {
    let Some((dir, pid)) = SHARED_CLEANUP.lock().ok().and_then(|mut cleanup| cleanup.take()) else {
        return;
    };
    if let Some(pid) = pid {
        process::kill_process_group(pid);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_broker_is_started_once_and_answers() {
        let first = KafkaBroker::shared().expect("the shared broker");
        let second = KafkaBroker::shared().expect("the shared broker again");
        assert!(std::ptr::eq(first, second));
        if !first.is_external() {
            let info = ready::metadata_answered(first.port()).expect("a Metadata answer");
            // A container broker formats its data in the container.
            if let Some(jvm) = first.jvm() {
                let formatted = jvm.cluster_id();
                assert!(formatted.is_some(), "the data folder names its cluster");
                assert_eq!(
                    info.cluster_id, formatted,
                    "the cluster id in Metadata is the one formatted"
                );
            }
            assert_ne!(
                info.cluster_id.as_deref(),
                Some(jvm::CLUSTER_ID),
                "a cluster of its own"
            );
            assert_eq!(info.brokers, 1);
        }
    }
}
