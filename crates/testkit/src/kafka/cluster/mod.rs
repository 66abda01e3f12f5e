//! A Kafka cluster of several KRaft nodes run from the same jars as the
//! single [`KafkaBroker`](super::KafkaBroker), for tests of what only a
//! cluster does: leaders that move, replicas that fall out of sync,
//! preferred and unclean elections, one broker down or frozen while the
//! others serve.
//!
//! - this file: starting the nodes, and stopping, killing, starting,
//!   freezing and thawing each of them;
//! - `topics.rs`: creating, deleting and configuring topics, and reading
//!   their leaders, leader epochs and in-sync replicas from Metadata;
//! - `election.rs`: preferred and unclean elections, and the recipe that
//!   truncates a partition's log by an unclean election;
//! - `records.rs`: writing and reading a few records, and a partition's end
//!   offset, to set up and check a test;
//! - `shared.rs`: one cluster per test process, lent to one test at a time.
//!
//! Every request goes over Kafka's protocol (`kafka/wire.rs`): a JVM
//! tool per call would cost seconds, and the jars the kit installs do not
//! carry Kafka's command-line tools (`kafka-tools-*.jar`).
//!
//! # Waiting
//!
//! Operations that change the cluster return once their effect shows: a
//! started broker in every running broker's Metadata, a created topic led
//! and fully in sync (a deleted one gone, preferred leaders leading) on
//! every running broker, an elected leader in Metadata, written records
//! acknowledged. Each wait polls within a generous deadline for a loaded
//! two-core machine, never a fixed sleep, and fails naming what it last
//! saw. Readings (`topic`, `leaders`, ...) ask the first broker that
//! answers. A broker killed with SIGKILL stays in the cluster's Metadata, and
//! leads its partitions, until the controller fences it: Kafka's
//! `broker.session.timeout.ms` (9 s by default) after its last heartbeat.

mod election;
mod records;
mod shared;
mod topics;

use std::collections::BTreeSet;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::{Request, StrBytes};
use tempfile::TempDir;

pub use election::{LoneLeader, UncleanElection};
pub use records::{Acks, FetchedRecord};
pub use shared::SharedCluster;
pub use topics::{PartitionState, TopicState};

use super::install::Installation;
use super::jvm::{new_cluster_id, BrokerSpec, JvmBroker, Quorum, DEFAULT_HEAP};
use super::wire::{Connection, KafkaRequestError};
use crate::error::{Result, TestkitError};
use crate::handle::Lifecycle;
use crate::process;

pub(crate) const SERVICE: &str = "Kafka cluster";
/// How many brokers [`KafkaCluster::start`] starts.
pub const DEFAULT_BROKERS: usize = 3;
/// Bound on every wait of the cluster: elections, fencing (9 s), a node
/// restarting beside two others on two busy cores.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on one request's round trip.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How long a controlled shutdown may take (a broker hands its leaderships
/// over in a few seconds; Kafka's own timeout for it is 30 s).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(60);
/// Metadata v12: topic ids, leader epochs (Kafka 4.x serves v4–v13).
const METADATA_VERSION: i16 = 12;
/// How many times a start on ports another process took is tried.
const START_ATTEMPTS: usize = 3;
const FIX: &str = "read the brokers' logs (KafkaCluster::log_path); a broker needs a majority of the \
     cluster's nodes running to answer; on a loaded machine, run fewer tests at once";

/// A cluster of Apache Kafka brokers, each a KRaft node that is broker and
/// controller at once, run from the kit's jars.
///
/// Nodes are numbered 1 to n (their `node.id`); every per-broker method
/// takes that number. Each node has its own client port, controller port
/// and data folder on `127.0.0.1`; all are voters of one static controller
/// quorum (`controller.quorum.voters`) and formatted with one cluster id.
/// Topics are replicated like production ones: the consumer offsets and
/// transaction logs have replication factor 3 and min ISR 2 (on fewer
/// nodes: all of them, min ISR 1), topics created without a factor get 3.
/// Unclean leader election stays off (a test turns it on per topic), and so
/// does the automatic preferred-leader rebalance (a test elects preferred
/// leaders with [`elect_preferred_leaders`](Self::elect_preferred_leaders)
/// when it wants them). The consumer group's initial rebalance delay is 0.
///
/// A node's data survives [`stop_broker`](Self::stop_broker) and
/// [`start_broker`](Self::start_broker). Every node is killed, and the
/// cluster's folder removed, when the handle drops; the kernel also kills
/// them when the test process dies first.
///
/// A cluster needs a Java runtime and the jars (`bash
/// .ci/install-services.sh`); there is no container fallback. Each node
/// takes a JVM with a 512 MB heap.
///
/// ```no_run
/// let mut cluster = exactly_testkit::KafkaCluster::start()?;
/// cluster.create_topic("t", 6, 3, &[("min.insync.replicas", "2")])?;
/// let leaders = cluster.leaders("t")?;
/// cluster.stop_broker(leaders[&0].unwrap())?;
/// # Ok::<(), exactly_testkit::TestkitError>(())
/// ```
pub struct KafkaCluster {
    /// Node `i + 1` at index `i`; declared before `dir` so that the nodes
    /// are killed before their folder goes.
    nodes: Vec<Node>,
    cluster_id: String,
    dir: TempDir,
}

/// One node of the cluster.
struct Node {
    broker: JvmBroker,
    /// Suspended by [`KafkaCluster::freeze_broker`]: no request is sent
    /// to it (it would hang) until thawed.
    frozen: bool,
}

impl Node {
    /// Whether requests may go to the node: started and not frozen.
    fn answers(&self) -> bool {
        self.broker.pid().is_some() && !self.frozen
    }
}

/// One broker of a [`KafkaCluster`]: its node id and client address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClusterBroker {
    node_id: i32,
    port: u16,
}

impl ClusterBroker {
    /// The node id (`node.id`, the id Metadata and replica lists name).
    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    /// The client port on `127.0.0.1`; the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// What one try of a wait saw: done with a value, or not yet, with what it
/// saw instead (reported if the wait times out).
pub(crate) enum Step<T> {
    Done(T),
    NotYet(String),
}

impl KafkaCluster {
    /// Starts [`DEFAULT_BROKERS`] brokers with the kit's settings and waits
    /// until every one of them is in the cluster's Metadata.
    pub fn start() -> Result<KafkaCluster> {
        Self::builder().start()
    }

    /// A cluster with settings of the caller's choice.
    pub fn builder() -> KafkaClusterBuilder {
        KafkaClusterBuilder {
            brokers: DEFAULT_BROKERS,
            settings: Vec::new(),
            heap: DEFAULT_HEAP.into(),
        }
    }

    /// Every broker's address, comma-separated, for a client's bootstrap
    /// servers.
    pub fn bootstrap(&self) -> String {
        self.brokers()
            .iter()
            .map(ClusterBroker::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every broker, by node id.
    pub fn brokers(&self) -> Vec<ClusterBroker> {
        self.nodes.iter().map(|node| broker_of(&node.broker)).collect()
    }

    /// The broker with node id `node_id`.
    ///
    /// # Panics
    ///
    /// When the cluster has no such node (ids run from 1 to the number of
    /// brokers), as every per-broker method does.
    pub fn broker(&self, node_id: i32) -> ClusterBroker {
        broker_of(&self.node(node_id).broker)
    }

    /// The node ids, 1 to n.
    pub fn node_ids(&self) -> Vec<i32> {
        self.nodes.iter().map(|node| node.broker.node_id()).collect()
    }

    /// The cluster id every node was formatted with.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The cluster's folder (one `node-ID` folder per node, each with its
    /// `server.properties`, `kafka.log` and `data/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A broker's log file.
    pub fn log_path(&self, node_id: i32) -> &Path {
        self.node(node_id).broker.log_path()
    }

    /// A broker's pid (and process group id), while it runs.
    pub fn pid(&self, node_id: i32) -> Option<u32> {
        self.node(node_id).broker.pid()
    }

    /// Whether a broker's JVM runs (frozen or not).
    pub fn is_running(&mut self, node_id: i32) -> bool {
        self.node_mut(node_id).broker.is_running()
    }

    /// Whether a broker is frozen by [`freeze_broker`](Self::freeze_broker).
    pub fn is_frozen(&self, node_id: i32) -> bool {
        self.node(node_id).frozen
    }

    /// Kills a broker (SIGKILL to its process group, like a crash) and
    /// waits until its ports are closed. Its data stays. Does nothing if it
    /// is already stopped. The cluster keeps listing it, and it keeps
    /// leading its partitions, until the controller fences it
    /// (`broker.session.timeout.ms`).
    pub fn stop_broker(&mut self, node_id: i32) -> Result<()> {
        let node = self.node_mut(node_id);
        node.frozen = false;
        node.broker.stop()
    }

    /// Kills a broker (SIGKILL to its process group) and returns once the
    /// JVM has exited, without waiting for anything else.
    pub fn kill_broker(&mut self, node_id: i32) {
        let node = self.node_mut(node_id);
        node.frozen = false;
        node.broker.kill();
    }

    /// Starts a stopped broker on the same ports with the same data (it
    /// recovers its logs as after a crash) and waits until every running
    /// broker's Metadata lists it again. Does nothing if it runs (frozen or
    /// not). A node answers only while a majority of the cluster's nodes
    /// runs: start the others first.
    pub fn start_broker(&mut self, node_id: i32) -> Result<()> {
        self.start_brokers(&[node_id])
    }

    /// [`start_broker`](Self::start_broker) for several brokers at once, in
    /// parallel (nodes that form a quorum together must start together).
    pub fn start_brokers(&mut self, node_ids: &[i32]) -> Result<()> {
        let mut stopped = Vec::new();
        for node_id in node_ids {
            if !self.is_running(*node_id) {
                stopped.push(*node_id);
            }
        }
        let wanted: Vec<usize> = stopped.iter().map(|id| self.index(*id)).collect();
        let nodes = self
            .nodes
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| wanted.contains(i))
            .map(|(_, node)| node);
        launch_all(nodes, |broker| broker.restart())?;
        self.wait_for_brokers(&stopped)
    }

    /// Stops a broker if it runs, then [`start_broker`](Self::start_broker)s
    /// it.
    pub fn restart_broker(&mut self, node_id: i32) -> Result<()> {
        self.stop_broker(node_id)?;
        self.start_broker(node_id)
    }

    /// Shuts a broker down the way an operator's rolling restart does:
    /// SIGTERM, which makes it hand its leaderships to the other in-sync
    /// replicas (a controlled shutdown) before it exits, and waits until its
    /// ports are closed. An error when it did not exit within
    /// [`SHUTDOWN_GRACE`] (it is then killed). Does nothing if it is
    /// stopped; thaws it first if it is frozen.
    pub fn shut_down_broker(&mut self, node_id: i32) -> Result<()> {
        if self.is_frozen(node_id) {
            self.thaw_broker(node_id)?;
        }
        let node = self.node_mut(node_id);
        if node.broker.shut_down(SHUTDOWN_GRACE) {
            Ok(())
        } else {
            Err(TestkitError::Timeout {
                service: SERVICE,
                condition: format!("broker {node_id} to finish its controlled shutdown (SIGTERM)"),
                waited_s: SHUTDOWN_GRACE.as_secs(),
                last: "still running: it was killed".into(),
                fix: "read the broker's log (`log_path`): a controlled shutdown waits for the controller to move \
                      the broker's leaderships",
            })
        }
    }

    /// One step of a rolling restart as operators do it:
    /// [`shut_down_broker`](Self::shut_down_broker), then
    /// [`start_broker`](Self::start_broker), then
    /// [`wait_until_fully_replicated`](Self::wait_until_fully_replicated), so
    /// that the next broker's controlled shutdown finds every partition's
    /// replicas in sync to hand its leaderships to.
    pub fn roll_broker(&mut self, node_id: i32) -> Result<()> {
        self.shut_down_broker(node_id)?;
        self.start_broker(node_id)?;
        self.wait_until_fully_replicated()
    }

    /// Waits until no partition of any topic (the internal ones included)
    /// is under-replicated: every replica in the in-sync set, as the first
    /// broker that answers says.
    pub fn wait_until_fully_replicated(&self) -> Result<()> {
        let request = MetadataRequest::default()
            .with_topics(None)
            .with_allow_auto_topic_creation(false);
        self.wait_until("every partition of every topic fully replicated", |cluster| {
            let metadata: MetadataResponse =
                match cluster.any_broker("reading Metadata", |port| request_to(port, &request)) {
                    Ok(metadata) => metadata,
                    Err(err) => return Ok(Step::NotYet(err.to_string())),
                };
            let lagging: Vec<String> = metadata
                .topics
                .iter()
                .flat_map(|topic| {
                    let name = topic.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
                    topic
                        .partitions
                        .iter()
                        .filter(|p| p.isr_nodes.len() < p.replica_nodes.len())
                        .map(move |p| format!("{name}/{}", p.partition_index))
                })
                .collect();
            if lagging.is_empty() {
                Ok(Step::Done(()))
            } else {
                Ok(Step::NotYet(format!("under-replicated: {lagging:?}")))
            }
        })
    }

    /// Suspends a broker (SIGSTOP to its process group) and returns once
    /// every thread of its JVM is stopped: its ports stay open and its
    /// requests (clients', other brokers', the controller quorum's) hang
    /// until [`thaw_broker`](Self::thaw_broker). The kit sends no request
    /// to it meanwhile. Does nothing if it does not run.
    pub fn freeze_broker(&mut self, node_id: i32) -> Result<()> {
        let node = self.node_mut(node_id);
        if node.broker.pid().is_none() {
            return Ok(());
        }
        node.broker.set_frozen(true)?;
        node.frozen = true;
        tracing::info!(node = node_id, "Kafka broker frozen");
        Ok(())
    }

    /// Resumes a broker suspended by [`freeze_broker`](Self::freeze_broker)
    /// and returns once every thread of its JVM runs again.
    pub fn thaw_broker(&mut self, node_id: i32) -> Result<()> {
        let node = self.node_mut(node_id);
        node.broker.set_frozen(false)?;
        node.frozen = false;
        tracing::info!(node = node_id, "Kafka broker thawed");
        Ok(())
    }

    /// Thaws every frozen broker and starts every stopped one, then waits
    /// until every broker is in the cluster's Metadata: the cluster as
    /// started (its topics as they are now).
    pub fn heal(&mut self) -> Result<()> {
        for node_id in self.node_ids() {
            if self.is_frozen(node_id) {
                self.thaw_broker(node_id)?;
            }
        }
        self.start_brokers(&self.node_ids())?;
        self.wait_for_brokers(&self.node_ids())
    }

    /// The node ids the cluster's Metadata lists now: the brokers that are
    /// registered and not fenced (asked of the first broker that answers).
    pub fn live_brokers(&self) -> Result<BTreeSet<i32>> {
        let metadata = self.metadata(None)?;
        Ok(metadata.brokers.iter().map(|b| b.node_id.0).collect())
    }

    /// Waits until the Metadata of every broker that answers lists every
    /// one of `node_ids`.
    fn wait_for_brokers(&self, node_ids: &[i32]) -> Result<()> {
        if node_ids.is_empty() {
            return Ok(());
        }
        let wanted: BTreeSet<i32> = node_ids.iter().copied().collect();
        self.wait_until(
            &format!("brokers {wanted:?} listed in every broker's Metadata"),
            |cluster| {
                for node in cluster.nodes.iter().filter(|node| node.answers()) {
                    let port = node.broker.port();
                    let listed: BTreeSet<i32> = match metadata_of(port, None) {
                        Ok(metadata) => metadata.brokers.iter().map(|b| b.node_id.0).collect(),
                        Err(err) => return Ok(Step::NotYet(format!("node {}: {err}", node.broker.node_id()))),
                    };
                    if !wanted.is_subset(&listed) {
                        return Ok(Step::NotYet(format!("node {} lists {listed:?}", node.broker.node_id())));
                    }
                }
                Ok(Step::Done(()))
            },
        )?;
        tracing::info!(brokers = ?wanted, "Kafka brokers in the cluster");
        Ok(())
    }

    /// Metadata for `topics` (`None`: no topic) from the first broker that
    /// answers.
    pub(crate) fn metadata(&self, topics: Option<&[&str]>) -> Result<MetadataResponse> {
        self.any_broker("reading Metadata", |port| metadata_of(port, topics))
    }

    /// Runs `request` against each broker that answers, in node order,
    /// until one gets through the socket; the broker's own error codes are
    /// the caller's to read.
    pub(crate) fn any_broker<T>(
        &self,
        action: &str,
        mut request: impl FnMut(u16) -> Result<T, KafkaRequestError>,
    ) -> Result<T> {
        let mut last = None;
        for node in self.nodes.iter().filter(|node| node.answers()) {
            match request(node.broker.port()) {
                Err(err @ KafkaRequestError::Io { .. }) => last = Some(err),
                Err(err) => return Err(kafka_error(action, err)),
                Ok(answer) => return Ok(answer),
            }
        }
        let source = last.unwrap_or_else(|| KafkaRequestError::Io {
            port: 0,
            source: std::io::Error::new(std::io::ErrorKind::NotConnected, "no broker runs unfrozen"),
        });
        Err(kafka_error(action, source))
    }

    /// The port of a broker requests may go to (started, not frozen).
    pub(crate) fn answering_port(&self, node_id: i32) -> Option<u16> {
        let index = usize::try_from(node_id).ok()?.checked_sub(1)?;
        self.nodes
            .get(index)
            .filter(|node| node.answers())
            .map(|node| node.broker.port())
    }

    /// The ports of every broker requests may go to.
    pub(crate) fn answering_ports(&self) -> Vec<(i32, u16)> {
        self.nodes
            .iter()
            .filter(|node| node.answers())
            .map(|node| (node.broker.node_id(), node.broker.port()))
            .collect()
    }

    /// Polls `probe` until it is done, an error, or [`OPERATION_TIMEOUT`]
    /// passed (then a [`TestkitError::Timeout`] naming `condition` and
    /// what the last try saw).
    pub(crate) fn wait_until<T>(&self, condition: &str, mut probe: impl FnMut(&Self) -> Result<Step<T>>) -> Result<T> {
        let started = Instant::now();
        loop {
            let last = match probe(self)? {
                Step::Done(value) => return Ok(value),
                Step::NotYet(last) => last,
            };
            if started.elapsed() >= OPERATION_TIMEOUT {
                return Err(TestkitError::Timeout {
                    service: SERVICE,
                    condition: condition.to_string(),
                    waited_s: OPERATION_TIMEOUT.as_secs(),
                    last,
                    fix: FIX,
                });
            }
            sleep(POLL_INTERVAL);
        }
    }

    fn index(&self, node_id: i32) -> usize {
        usize::try_from(node_id)
            .ok()
            .and_then(|id| id.checked_sub(1))
            .filter(|index| *index < self.nodes.len())
            .unwrap_or_else(|| panic!("the cluster has nodes 1 to {}, not {node_id}", self.nodes.len()))
    }

    fn node(&self, node_id: i32) -> &Node {
        &self.nodes[self.index(node_id)]
    }

    fn node_mut(&mut self, node_id: i32) -> &mut Node {
        let index = self.index(node_id);
        &mut self.nodes[index]
    }
}

impl std::fmt::Debug for KafkaCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaCluster")
            .field("cluster_id", &self.cluster_id)
            .field("bootstrap", &self.bootstrap())
            .field("dir", &self.dir.path())
            .finish()
    }
}

fn broker_of(broker: &JvmBroker) -> ClusterBroker {
    ClusterBroker {
        node_id: broker.node_id(),
        port: broker.port(),
    }
}

/// A Metadata request to one broker.
fn metadata_of(port: u16, topics: Option<&[&str]>) -> Result<MetadataResponse, KafkaRequestError> {
    let topics = topics.unwrap_or_default().iter().map(|name| {
        MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))
    });
    let request = MetadataRequest::default()
        .with_topics(Some(topics.collect()))
        .with_allow_auto_topic_creation(false);
    request_to(port, &request)
}

/// One request to one broker in the version the kit uses for it.
pub(crate) fn request_to<R: Request + Versioned>(port: u16, request: &R) -> Result<R::Response, KafkaRequestError> {
    Connection::open(port, REQUEST_TIMEOUT)?.send(R::VERSION, request)
}

/// The version of each request the kit sends to a cluster: the newest
/// Kafka 4.1 serves that still names topics (not only their ids).
pub(crate) trait Versioned {
    /// The request's version.
    const VERSION: i16;
}

impl Versioned for MetadataRequest {
    const VERSION: i16 = METADATA_VERSION;
}

pub(crate) fn kafka_error(action: &str, source: KafkaRequestError) -> TestkitError {
    TestkitError::Kafka {
        service: SERVICE,
        action: action.to_string(),
        fix: FIX,
        source,
    }
}

/// Launches (with `launch`) every node of `nodes` at once, one thread
/// each: the nodes of a quorum wait for each other.
fn launch_all<'a>(
    nodes: impl Iterator<Item = &'a mut Node>,
    launch: impl Fn(&mut JvmBroker) -> Result<()> + Sync,
) -> Result<()> {
    let launch = &launch;
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let threads: Vec<_> = nodes
            .map(|node| {
                node.frozen = false;
                scope.spawn(move || launch(&mut node.broker))
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    });
    results.into_iter().collect()
}

/// Settings of a cluster of `brokers` nodes, before the caller's: internal
/// topics replicated three times (min ISR 2), elections only when a test
/// asks.
fn cluster_settings(brokers: usize) -> Vec<(String, String)> {
    let replication = brokers.min(3);
    let min_isr = if replication >= 3 { 2 } else { 1 };
    [
        ("default.replication.factor", replication),
        ("offsets.topic.replication.factor", replication),
        ("transaction.state.log.replication.factor", replication),
        ("transaction.state.log.min.isr", min_isr),
        ("share.coordinator.state.topic.replication.factor", replication),
        ("share.coordinator.state.topic.min.isr", min_isr),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value.to_string()))
    .chain(
        [
            ("unclean.leader.election.enable", "false"),
            ("auto.leader.rebalance.enable", "false"),
            ("group.initial.rebalance.delay.ms", "0"),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value.to_string())),
    )
    .collect()
}

/// Settings of a [`KafkaCluster`]; see [`KafkaCluster::builder`].
#[derive(Clone, Debug)]
pub struct KafkaClusterBuilder {
    brokers: usize,
    settings: Vec<(String, String)>,
    heap: String,
}

impl KafkaClusterBuilder {
    /// How many brokers (nodes) the cluster has, [`DEFAULT_BROKERS`] by
    /// default. Every node is a voter of the controller quorum, which
    /// answers while a majority of them runs.
    pub fn brokers(mut self, brokers: usize) -> Self {
        self.brokers = brokers;
        self
    }

    /// Sets a property of every broker (`server.properties`), replacing
    /// the kit's value of the same key, e.g. `broker.session.timeout.ms`.
    pub fn setting(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        self.settings.push((key.into(), value.to_string()));
        self
    }

    /// Every node's JVM heap (`-Xms` and `-Xmx`), `512m` by default.
    pub fn heap(mut self, heap: impl Into<String>) -> Self {
        self.heap = heap.into();
        self
    }

    /// Formats and starts every node at once and waits until every broker
    /// is in every broker's Metadata.
    pub fn start(self) -> Result<KafkaCluster> {
        if self.brokers == 0 {
            return Err(TestkitError::InvalidSetting {
                var: "KafkaClusterBuilder::brokers",
                value: "0".into(),
                fix: "a cluster has at least one broker",
            });
        }
        let install = Installation::find().map_err(|err| match err {
            TestkitError::BinaryNotFound {
                service,
                binary,
                searched,
                fix,
                ..
            } => TestkitError::BinaryNotFound {
                service,
                binary,
                searched,
                docker: "a Kafka cluster runs from the local jars only".into(),
                fix,
            },
            other => other,
        })?;
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.try_start(&install) {
                Err(err) if attempt < START_ATTEMPTS && err.is_port_conflict() => {
                    tracing::warn!("a port of the Kafka cluster was taken by someone else, retrying");
                }
                Ok(cluster) => {
                    tracing::info!(
                        bootstrap = %cluster.bootstrap(),
                        cluster = cluster.cluster_id(),
                        after_ms = started.elapsed().as_millis() as u64,
                        "Kafka cluster ready"
                    );
                    return Ok(cluster);
                }
                Err(err) => return Err(err),
            }
        }
    }

    fn try_start(&self, install: &Installation) -> Result<KafkaCluster> {
        let dir = process::service_temp_dir(SERVICE, "exactly-kafka-cluster-")?;
        let mut ports = Vec::with_capacity(self.brokers);
        for _ in 0..self.brokers {
            ports.push((process::free_port()?, process::free_port()?));
        }
        let voters = ports
            .iter()
            .enumerate()
            .map(|(i, (_, controller))| format!("{}@127.0.0.1:{controller}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let cluster_id = new_cluster_id();
        let mut settings = cluster_settings(self.brokers);
        settings.extend(self.settings.iter().cloned());
        let mut nodes = Vec::with_capacity(self.brokers);
        for (i, (port, controller_port)) in ports.into_iter().enumerate() {
            let node_id = i32::try_from(i + 1).expect("a few nodes");
            let spec = BrokerSpec {
                install: install.clone(),
                dir: dir.path().join(format!("node-{node_id}")),
                settings: settings.clone(),
                heap: self.heap.clone(),
                // Three JVMs left behind by a killed test run would weigh.
                tied_to_process: true,
                secured: None,
                node_id,
                quorum: Quorum::Voters {
                    voters: voters.clone(),
                    cluster_id: cluster_id.clone(),
                },
            };
            nodes.push(Node {
                broker: JvmBroker::on_ports(spec, port, controller_port)?,
                frozen: false,
            });
        }
        let mut cluster = KafkaCluster { nodes, cluster_id, dir };
        launch_all(cluster.nodes.iter_mut(), JvmBroker::launch)?;
        cluster.wait_for_brokers(&cluster.node_ids())?;
        Ok(cluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_nodes_replicate_internal_topics_three_times_and_elect_only_on_request() {
        let settings = cluster_settings(3);
        let value = |key: &str| settings.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        assert_eq!(value("offsets.topic.replication.factor"), Some("3"));
        assert_eq!(value("transaction.state.log.replication.factor"), Some("3"));
        assert_eq!(value("transaction.state.log.min.isr"), Some("2"));
        assert_eq!(value("unclean.leader.election.enable"), Some("false"));
        assert_eq!(value("auto.leader.rebalance.enable"), Some("false"));
        assert_eq!(value("group.initial.rebalance.delay.ms"), Some("0"));
        let two = cluster_settings(2);
        let value = |key: &str| two.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        assert_eq!(value("offsets.topic.replication.factor"), Some("2"));
        assert_eq!(value("transaction.state.log.min.isr"), Some("1"));
    }
}
