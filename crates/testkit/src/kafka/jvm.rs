//! An Apache Kafka broker run from its jars as a child JVM: one KRaft node
//! that is broker and controller at once, on two loopback ports.
//!
//! Its folder holds `server.properties`, `log4j2.properties`, the broker's
//! output (`kafka.log`) and its data (`data/`). The data is formatted once
//! (`kafka.tools.StorageTool format`) and kept across
//! [`restart`](Lifecycle::restart)s: a restarted broker recovers its logs
//! like one that crashed.
//!
//! A node is either alone ([`Quorum::Alone`]: node 1, its own single-node
//! quorum, the [`KafkaBroker`](super::KafkaBroker)) or one voter of a static
//! quorum of several ([`Quorum::Voters`]: the nodes of a
//! [`KafkaCluster`](super::KafkaCluster), each with its node id, ports and
//! folder, all formatted with one cluster id).

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::install::{Installation, SERVICE};
use super::ready;
use crate::error::{Result, TestkitError};
use crate::handle::Lifecycle;
use crate::process::{self, GroupChild, Startup};

/// The cluster id of a container broker on a persistent data folder: fixed,
/// because the image formats its data on every start (skipping a formatted
/// folder), and a container started again on the same folder must agree
/// with the id already there. Every other broker formats its data once with
/// a [`new_cluster_id`] of its own.
#[cfg_attr(not(feature = "containers"), allow(dead_code))]
pub(crate) const CLUSTER_ID: &str = "ZXhhY3RseS10ZXN0a2l0LQ";
/// File Kafka writes into a formatted data folder.
pub(crate) const META_PROPERTIES: &str = "meta.properties";
/// Folder (inside the broker's folder) of the broker's logs and metadata.
pub(crate) const DATA_DIR: &str = "data";
pub(crate) const LOG_FILE: &str = "kafka.log";
const PROPERTIES_FILE: &str = "server.properties";
const LOG4J_FILE: &str = "log4j2.properties";
/// A JVM broker needs a few seconds to start alone, and much longer when
/// several start at once on a small machine beside compilers and tests.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
const POLL_INTERVAL: Duration = Duration::from_millis(100);
const FIX_START: &str = "read the broker log above (kafka.log in the broker's folder); check that \
     EXACTLY_KAFKA_LIBS (or ~/.cache/exactly/kafka-<version>/libs) holds the jars of one Kafka 4.x \
     release and that `java -version` works; or set EXACTLY_KAFKA_BOOTSTRAP to use a running Kafka";

/// Settings of every test kit broker: one node able to run transactions and
/// consumer groups alone, quick to answer the first group or transactional
/// request. [`KafkaBrokerBuilder::setting`](super::KafkaBrokerBuilder::setting)
/// overrides any of them.
pub(crate) const TEST_SETTINGS: &[(&str, &str)] = &[
    ("num.partitions", "1"),
    ("default.replication.factor", "1"),
    ("min.insync.replicas", "1"),
    ("offsets.topic.replication.factor", "1"),
    // One partition per internal topic: creating the default 50 on the
    // first group or transactional request takes seconds on a small machine.
    ("offsets.topic.num.partitions", "1"),
    ("transaction.state.log.replication.factor", "1"),
    ("transaction.state.log.min.isr", "1"),
    ("transaction.state.log.num.partitions", "1"),
    ("share.coordinator.state.topic.replication.factor", "1"),
    ("share.coordinator.state.topic.min.isr", "1"),
    ("group.initial.rebalance.delay.ms", "0"),
    ("auto.create.topics.enable", "true"),
    ("num.network.threads", "2"),
    ("num.io.threads", "4"),
    ("log.cleaner.dedupe.buffer.size", "8388608"),
];

/// How the JVM of a broker is sized.
pub(crate) const DEFAULT_HEAP: &str = "512m";

/// What a broker is started with.
#[derive(Clone, Debug)]
pub(crate) struct BrokerSpec {
    pub(crate) install: Installation,
    /// The broker's folder (created if missing).
    pub(crate) dir: PathBuf,
    /// Settings added to (or replacing) [`TEST_SETTINGS`].
    pub(crate) settings: Vec<(String, String)>,
    /// `-Xmx` / `-Xms` of the JVM.
    pub(crate) heap: String,
    /// Whether the kernel kills the broker when this process ends even if
    /// the handle was never dropped (a broker kept in a `static`).
    pub(crate) tied_to_process: bool,
    /// A `SASL_SSL` listener besides the plaintext one.
    pub(crate) secured: Option<SecuredSpec>,
    /// The node's id (`node.id`).
    pub(crate) node_id: i32,
    /// Where the node finds its controller quorum.
    pub(crate) quorum: Quorum,
}

/// The controller quorum a node belongs to, and how its data folder is
/// formatted.
#[derive(Clone, Debug)]
pub(crate) enum Quorum {
    /// The node alone is its quorum: a single-node dynamic quorum
    /// (`controller.quorum.bootstrap.servers` naming its own controller
    /// port, formatted `--standalone`) with a cluster id of its own.
    Alone,
    /// A static quorum of several nodes (`controller.quorum.voters`, the
    /// same on every node; formatted without `--standalone` or
    /// `--initial-controllers`, which are for dynamic quorums), every node
    /// formatted with `cluster_id`.
    Voters {
        /// `ID@127.0.0.1:CONTROLLER_PORT,...` for every node.
        voters: String,
        /// The id every node's data folder is formatted with.
        cluster_id: String,
    },
}

/// The `SASL_SSL` listener of a secured broker: its certificate, the SASL
/// mechanisms it enables and its one user.
#[derive(Clone, Debug)]
pub(crate) struct SecuredSpec {
    /// The broker's certificate and key (PEM), signed by the test CA.
    pub(crate) server: crate::tls::CertFiles,
    /// Enabled mechanisms (`SCRAM-SHA-256`, `SCRAM-SHA-512`, `PLAIN`).
    pub(crate) mechanisms: Vec<String>,
    pub(crate) username: String,
    pub(crate) password: String,
}

/// The listener name of the secured listener in `server.properties`.
const SECURED_LISTENER: &str = "SASL_SSL";
/// The PEM keystore (key, then certificate) of the secured listener.
const KEYSTORE_FILE: &str = "keystore.pem";

/// A broker JVM the test kit started, with the two ports it keeps across
/// restarts.
pub(crate) struct JvmBroker {
    spec: BrokerSpec,
    port: u16,
    controller_port: u16,
    /// The `SASL_SSL` port of a secured broker (0 otherwise).
    secured_port: u16,
    log: PathBuf,
    child: Option<GroupChild>,
}

impl std::fmt::Debug for JvmBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JvmBroker")
            .field("dir", &self.spec.dir)
            .field("port", &self.port)
            .field("controller_port", &self.controller_port)
            .field("secured_port", &self.secured_port)
            .finish()
    }
}

impl JvmBroker {
    /// Writes the broker's configuration, formats its data folder if it is
    /// new, starts the JVM on free ports and waits until it answers
    /// Metadata.
    pub(crate) fn start(spec: BrokerSpec) -> Result<JvmBroker> {
        let mut broker = JvmBroker::on_ports(spec, 0, 0)?;
        process::with_free_port(SERVICE, |port| {
            broker.port = port;
            broker.controller_port = process::free_port()?;
            if broker.spec.secured.is_some() {
                broker.secured_port = process::free_port()?;
            }
            broker.launch()
        })?;
        Ok(broker)
    }

    /// A node that will listen on `port` and `controller_port` (chosen by
    /// the caller, who names them to the other nodes of its quorum), its
    /// folder created; nothing runs until [`launch`](Self::launch).
    pub(crate) fn on_ports(spec: BrokerSpec, port: u16, controller_port: u16) -> Result<JvmBroker> {
        fs::create_dir_all(spec.dir.join(DATA_DIR)).map_err(|source| TestkitError::Io {
            service: SERVICE,
            action: format!("creating {}", spec.dir.join(DATA_DIR).display()),
            fix: "pass a writable directory",
            source,
        })?;
        let log = spec.dir.join(LOG_FILE);
        Ok(JvmBroker {
            spec,
            port,
            controller_port,
            secured_port: 0,
            log,
            child: None,
        })
    }

    /// Writes the configuration, formats the data folder if it is new,
    /// starts the JVM and waits until it answers Metadata (for a node of a
    /// quorum of several: once a majority of the voters runs).
    pub(crate) fn launch(&mut self) -> Result<()> {
        self.write_config()?;
        self.format_if_new()?;
        self.spawn_and_wait()
    }

    /// Kills the JVM (SIGKILL to its process group) and reaps it, without
    /// waiting for its ports to close.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
            tracing::info!(node = self.spec.node_id, port = self.port, "Kafka broker killed");
        }
    }

    /// Stops the JVM the way an operator does (SIGTERM: a controlled
    /// shutdown that hands the broker's leaderships to the other replicas
    /// first) and waits until its ports are closed. Killed when it has not
    /// exited within `grace`; returns whether it exited on its own.
    pub(crate) fn shut_down(&mut self, grace: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let clean = child.terminate(grace);
        self.wait_ports_closed("a shutdown");
        tracing::info!(
            node = self.spec.node_id,
            port = self.port,
            clean,
            "Kafka broker shut down"
        );
        clean
    }

    /// Waits until the client and controller ports are closed, after `what`
    /// ended the JVM; warns about a port still open.
    fn wait_ports_closed(&self, what: &str) {
        for port in [self.port, self.controller_port] {
            if !process::wait_port_closed(port) {
                tracing::warn!(port, "Kafka port still open after {what}");
            }
        }
    }

    /// The node id.
    pub(crate) fn node_id(&self) -> i32 {
        self.spec.node_id
    }

    /// The client port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The `SASL_SSL` port of a secured broker.
    pub(crate) fn secured_port(&self) -> Option<u16> {
        self.spec.secured.as_ref().map(|_| self.secured_port)
    }

    /// The broker's folder.
    pub(crate) fn dir(&self) -> &Path {
        &self.spec.dir
    }

    /// The pid (and process group) of the running JVM.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(GroupChild::pid)
    }

    fn write_config(&self) -> Result<()> {
        let properties = self.spec.dir.join(PROPERTIES_FILE);
        fs::write(&properties, self.properties()).map_err(io(&properties))?;
        if let Some(secured) = &self.spec.secured {
            // Kafka's PEM keystore: the private key, then the certificate.
            let read = |path: &Path| fs::read_to_string(path).map_err(io(path));
            let keystore = self.spec.dir.join(KEYSTORE_FILE);
            let text = format!("{}{}", read(&secured.server.key)?, read(&secured.server.cert)?);
            fs::write(&keystore, text).map_err(io(&keystore))?;
            crate::tls::restrict(&keystore)?;
        }
        let log4j = self.spec.dir.join(LOG4J_FILE);
        fs::write(&log4j, LOG4J_PROPERTIES).map_err(io(&log4j))
    }

    /// `server.properties`: the node's listeners and folder, then the test
    /// settings, then the caller's (later lines win).
    fn properties(&self) -> String {
        let (port, controller) = (self.port, self.controller_port);
        let data = self.spec.dir.join(DATA_DIR);
        let quorum = match &self.spec.quorum {
            Quorum::Alone => format!("controller.quorum.bootstrap.servers=127.0.0.1:{controller}"),
            Quorum::Voters { voters, .. } => format!("controller.quorum.voters={voters}"),
        };
        let mut text = format!(
            "# written by exactly-testkit\n\
             process.roles=broker,controller\n\
             node.id={}\n\
             {quorum}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
             controller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=PLAINTEXT\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
             log.dirs={}\n",
            self.spec.node_id,
            data.display()
        );
        if let Some(secured) = &self.spec.secured {
            text.push_str(&self.secured_properties(secured));
        }
        let caller = self.spec.settings.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        for (key, value) in TEST_SETTINGS.iter().copied().chain(caller) {
            text.push_str(&format!("{key}={value}\n"));
        }
        text
    }

    /// The `SASL_SSL` listener on 127.0.0.1, advertised as `localhost` (the
    /// name its certificate is issued for): added to the listeners, with
    /// the PEM keystore and the enabled mechanisms. Brokers and controller
    /// keep talking over their plaintext listeners, so the node works as
    /// before; SCRAM credentials are created at format time.
    fn secured_properties(&self, secured: &SecuredSpec) -> String {
        let (port, controller, secured_port) = (self.port, self.controller_port, self.secured_port);
        let name = SECURED_LISTENER.to_ascii_lowercase();
        let mut text = format!(
            "listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller},\
             {SECURED_LISTENER}://127.0.0.1:{secured_port}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port},{SECURED_LISTENER}://localhost:{secured_port}\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,{SECURED_LISTENER}:SASL_SSL\n\
             listener.name.{name}.sasl.enabled.mechanisms={}\n\
             listener.name.{name}.ssl.keystore.type=PEM\n\
             listener.name.{name}.ssl.keystore.location={}\n\
             listener.name.{name}.ssl.client.auth=none\n",
            secured.mechanisms.join(","),
            self.spec.dir.join(KEYSTORE_FILE).display(),
        );
        for mechanism in &secured.mechanisms {
            let module = if mechanism == "PLAIN" {
                format!(
                    "org.apache.kafka.common.security.plain.PlainLoginModule required user_{}=\"{}\";",
                    secured.username, secured.password
                )
            } else {
                "org.apache.kafka.common.security.scram.ScramLoginModule required;".to_string()
            };
            text.push_str(&format!(
                "listener.name.{name}.{}.sasl.jaas.config={module}\n",
                mechanism.to_ascii_lowercase()
            ));
        }
        text
    }

    /// `StorageTool format` once per data folder. A node alone is formatted
    /// `--standalone` with a cluster id of its own: two brokers of the kit
    /// are two clusters to a client, as two real clusters are. A voter of a
    /// static quorum is formatted with its cluster's id. A node started
    /// again on its folder finds the id there.
    fn format_if_new(&self) -> Result<()> {
        if self.spec.dir.join(DATA_DIR).join(META_PROPERTIES).exists() {
            return Ok(());
        }
        let mut format = self.java();
        format.arg("kafka.tools.StorageTool").arg("format");
        let cluster_id = match &self.spec.quorum {
            Quorum::Alone => {
                format.arg("--standalone");
                new_cluster_id()
            }
            Quorum::Voters { cluster_id, .. } => cluster_id.clone(),
        };
        format
            .args(["--ignore-formatted", "-t", &cluster_id, "-c"])
            .arg(self.spec.dir.join(PROPERTIES_FILE));
        if let Some(secured) = &self.spec.secured {
            for mechanism in secured.mechanisms.iter().filter(|m| m.starts_with("SCRAM-")) {
                format.arg("--add-scram").arg(format!(
                    "{mechanism}=[name={},password={}]",
                    secured.username, secured.password
                ));
            }
        }
        process::run_command(SERVICE, &mut format, None, FIX_START).map(drop)
    }

    /// The cluster id its data folder was formatted with.
    #[cfg(test)]
    pub(crate) fn cluster_id(&self) -> Option<String> {
        let meta = fs::read_to_string(self.spec.dir.join(DATA_DIR).join(META_PROPERTIES)).ok()?;
        meta.lines()
            .find_map(|line| line.strip_prefix("cluster.id="))
            .map(|id| id.trim().to_string())
    }

    /// `java <options> -cp <libs>/* MAIN`, run in the broker's folder.
    fn java(&self) -> Command {
        let mut java = Command::new(&self.spec.install.java);
        let heap = &self.spec.heap;
        java.current_dir(&self.spec.dir)
            .env_remove("KAFKA_OPTS")
            .env_remove("KAFKA_HEAP_OPTS")
            .env_remove("JAVA_TOOL_OPTIONS")
            .arg(format!("-Xmx{heap}"))
            .arg(format!("-Xms{heap}"))
            .args(["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true"])
            .arg(jvm_property(
                "log4j2.configurationFile",
                &self.spec.dir.join(LOG4J_FILE),
            ))
            .arg(jvm_property("kafka.logs.dir", &self.spec.dir))
            .arg("-cp")
            .arg(self.spec.install.class_path());
        java
    }

    fn spawn_and_wait(&mut self) -> Result<()> {
        let mut java = self.java();
        java.arg("kafka.Kafka").arg(self.spec.dir.join(PROPERTIES_FILE));
        let started = Instant::now();
        let mut child = if self.spec.tied_to_process {
            GroupChild::spawn_tied(SERVICE, java, &self.log)?
        } else {
            GroupChild::spawn(SERVICE, java, &self.log)?
        };
        if let Some(pid) = child.pid() {
            // Lets a later run reap the broker if this process dies first.
            let _ = fs::write(self.spec.dir.join(process::SERVICE_PID_FILE), pid.to_string());
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
            if let Some(cluster) = ready::metadata_answered(self.port) {
                tracing::info!(
                    node = self.spec.node_id,
                    port = self.port,
                    cluster = ?cluster.cluster_id,
                    after_ms = started.elapsed().as_millis() as u64,
                    "Kafka broker ready"
                );
                self.child = Some(child);
                return Ok(());
            }
            if started.elapsed() >= STARTUP_TIMEOUT {
                return Err(startup.failed(format!(
                    "no Metadata answer listing a broker within {} s",
                    STARTUP_TIMEOUT.as_secs()
                )));
            }
            sleep(POLL_INTERVAL);
        }
    }
}

impl Lifecycle for JvmBroker {
    /// Kills the JVM (SIGKILL, like a crash) and waits until its port is
    /// closed.
    fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill();
            self.wait_ports_closed("kill");
            tracing::info!(node = self.spec.node_id, port = self.port, "Kafka broker stopped");
        }
        Ok(())
    }

    /// Same ports, same data folder: the broker recovers its logs.
    fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.write_config()?;
        self.spawn_and_wait()
    }

    fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| child.exited().is_none())
    }

    /// SIGSTOP or SIGCONT to the JVM's process group; returns once every
    /// thread is stopped (or running again).
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

/// `-Dname=path`.
fn jvm_property(name: &str, path: &Path) -> OsString {
    let mut arg = OsString::from(format!("-D{name}="));
    arg.push(path);
    arg
}

/// A fresh cluster id: 16 random bytes in URL-safe base64 without padding
/// (22 characters), as Kafka's `Uuid` prints them. The first character is
/// never `-`, which `StorageTool -t` would take for an option.
pub(crate) fn new_cluster_id() -> String {
    let mut bytes = random_bytes();
    bytes[0] &= 0x7f;
    kafka_uuid(bytes)
}

/// `bytes` in URL-safe base64 without padding: how Kafka prints a `Uuid`
/// (cluster ids, topic ids, directory ids).
pub(crate) fn kafka_uuid(bytes: [u8; 16]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let value = u128::from_be_bytes(bytes);
    let mut chars = [0u8; 22];
    for (i, c) in chars.iter_mut().enumerate() {
        // Sextet i holds bits 6i..6i+6 from the top; the last one takes the
        // low 2 bits followed by zeros.
        let end = 6 * i as u32 + 6;
        let sextet = if end <= 128 {
            value >> (128 - end)
        } else {
            value << (end - 128)
        };
        *c = ALPHABET[(sextet & 0x3f) as usize];
    }
    String::from_utf8(chars.to_vec()).expect("the alphabet is ASCII")
}

/// 16 bytes from the kernel's random source, or (without one) from the
/// time, the pid and a counter.
fn random_bytes() -> [u8; 16] {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    if fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok()
    {
        return bytes;
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seed =
        nanos ^ (u64::from(std::process::id()) << 32) ^ COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    bytes[..8].copy_from_slice(&mix(seed).to_be_bytes());
    bytes[8..].copy_from_slice(&mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15)).to_be_bytes());
    bytes
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TestkitError + '_ {
    move |source| TestkitError::Io {
        service: SERVICE,
        action: format!("writing {}", path.display()),
        fix: "pass a writable directory",
        source,
    }
}

/// The broker's log configuration: INFO to standard output (the broker's
/// log file), without the per-request and state-change chatter.
const LOG4J_PROPERTIES: &str = "\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
logger.controller.name = org.apache.kafka.controller
logger.controller.level = warn
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = warn
";

#[cfg(test)]
mod tests {
    use super::*;

    fn broker(settings: &[(&str, &str)]) -> JvmBroker {
        JvmBroker {
            spec: BrokerSpec {
                install: Installation {
                    java: "java".into(),
                    libs: "/libs".into(),
                },
                dir: "/tmp/b".into(),
                settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                heap: DEFAULT_HEAP.into(),
                tied_to_process: false,
                secured: None,
                node_id: 1,
                quorum: Quorum::Alone,
            },
            port: 41234,
            controller_port: 41235,
            secured_port: 0,
            log: "/tmp/b/kafka.log".into(),
            child: None,
        }
    }

    /// The value the broker reads for `key`: Java properties keep the last.
    fn value(text: &str, key: &str) -> Option<String> {
        text.lines()
            .rev()
            .filter_map(|line| line.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
    }

    #[test]
    fn one_node_listens_on_its_ports_and_can_run_transactions_alone() {
        let text = broker(&[]).properties();
        assert_eq!(
            value(&text, "advertised.listeners").as_deref(),
            Some("PLAINTEXT://127.0.0.1:41234")
        );
        assert_eq!(
            value(&text, "controller.quorum.bootstrap.servers").as_deref(),
            Some("127.0.0.1:41235")
        );
        assert_eq!(value(&text, "log.dirs").as_deref(), Some("/tmp/b/data"));
        for key in [
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
            "transaction.state.log.min.isr",
        ] {
            assert_eq!(value(&text, key).as_deref(), Some("1"), "{key}");
        }
    }

    #[test]
    fn a_voter_names_the_static_quorum_and_its_own_node_id() {
        let mut node = broker(&[]);
        node.spec.node_id = 2;
        node.spec.quorum = Quorum::Voters {
            voters: "1@127.0.0.1:41001,2@127.0.0.1:41235".into(),
            cluster_id: "AAAAAAAAAAAAAAAAAAAAAA".into(),
        };
        let text = node.properties();
        assert_eq!(value(&text, "node.id").as_deref(), Some("2"));
        assert_eq!(
            value(&text, "controller.quorum.voters").as_deref(),
            Some("1@127.0.0.1:41001,2@127.0.0.1:41235")
        );
        assert_eq!(
            value(&text, "controller.quorum.bootstrap.servers"),
            None,
            "a static quorum is named once"
        );
        assert_eq!(
            value(&text, "listeners").as_deref(),
            Some("PLAINTEXT://127.0.0.1:41234,CONTROLLER://127.0.0.1:41235")
        );
    }

    #[test]
    fn cluster_ids_are_kafka_uuids_of_their_own() {
        assert_eq!(kafka_uuid(*b"exactly-testkit-"), CLUSTER_ID);
        assert_eq!(kafka_uuid([0xff; 16]), "_____________________w");
        let ids: std::collections::BTreeSet<String> = (0..64).map(|_| new_cluster_id()).collect();
        assert_eq!(ids.len(), 64, "every broker gets an id of its own");
        for id in &ids {
            assert_eq!(id.len(), 22, "{id}");
            assert!(!id.starts_with('-'), "{id} would read as an option");
            assert!(
                id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{id}"
            );
        }
    }

    #[test]
    fn a_secured_broker_adds_a_sasl_ssl_listener_and_keeps_its_plaintext_ones() {
        let mut secured = broker(&[]);
        secured.secured_port = 41236;
        secured.spec.secured = Some(SecuredSpec {
            server: crate::tls::CertFiles {
                cert: "/tmp/b/tls/broker.crt".into(),
                key: "/tmp/b/tls/broker.key".into(),
            },
            mechanisms: vec!["SCRAM-SHA-256".into(), "PLAIN".into()],
            username: "exactly".into(),
            password: "pw".into(),
        });
        let text = secured.properties();
        assert_eq!(
            value(&text, "listeners").as_deref(),
            Some("PLAINTEXT://127.0.0.1:41234,CONTROLLER://127.0.0.1:41235,SASL_SSL://127.0.0.1:41236")
        );
        assert_eq!(
            value(&text, "advertised.listeners").as_deref(),
            Some("PLAINTEXT://127.0.0.1:41234,SASL_SSL://localhost:41236")
        );
        assert_eq!(value(&text, "inter.broker.listener.name").as_deref(), Some("PLAINTEXT"));
        assert_eq!(
            value(&text, "listener.name.sasl_ssl.sasl.enabled.mechanisms").as_deref(),
            Some("SCRAM-SHA-256,PLAIN")
        );
        assert_eq!(
            value(&text, "listener.name.sasl_ssl.ssl.keystore.location").as_deref(),
            Some("/tmp/b/keystore.pem")
        );
        assert!(value(&text, "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config")
            .is_some_and(|v| v.contains("ScramLoginModule")));
        assert!(value(&text, "listener.name.sasl_ssl.plain.sasl.jaas.config")
            .is_some_and(|v| v.contains("user_exactly=\"pw\"")));
    }

    #[test]
    fn settings_of_the_caller_win() {
        let text = broker(&[("transaction.max.timeout.ms", "5000"), ("num.partitions", "3")]).properties();
        assert_eq!(value(&text, "transaction.max.timeout.ms").as_deref(), Some("5000"));
        assert_eq!(value(&text, "num.partitions").as_deref(), Some("3"));
    }
}
