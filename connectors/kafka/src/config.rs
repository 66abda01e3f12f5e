//! `[source.kafka]`: the settings of the Kafka source, with their checks.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use exactly_kafka_wire::{
    FetchSettings, OnTruncation, TopicId, WireConfig, WireError, CLIENT_PROPERTIES, FETCH_PROPERTIES,
};

use crate::properties::{check_properties, de_properties, RedactedProperties};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

/// Default of `partition_discovery_interval`.
pub const DEFAULT_PARTITION_DISCOVERY_INTERVAL: Duration = Duration::from_secs(10);
/// Default of `startup_timeout`.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `missing_topic_timeout`.
pub const DEFAULT_MISSING_TOPIC_TIMEOUT: Duration = Duration::from_secs(60);

/// Client settings the source sets itself, and what to use instead.
const RESERVED_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "set `bootstrap` instead"),
    ("metadata.broker.list", "set `bootstrap` instead"),
    ("group.id", "set `group_id` instead"),
    (
        "enable.auto.commit",
        "offsets live in checkpoints; use `commit_offsets_to_group` to publish them for lag tools",
    ),
    (
        "enable.auto.offset.store",
        "offsets live in checkpoints; use `commit_offsets_to_group` to publish them for lag tools",
    ),
    (
        "isolation.level",
        "the source always reads with read_committed so aborted transactions never enter a pipeline",
    ),
];

/// The settings of the Kafka source, as written in a pipeline file:
///
/// ```toml
/// [source.kafka]
/// bootstrap = "127.0.0.1:9092"          # required, `HOST:PORT[,HOST:PORT...]`
/// topic = "orders"                      # one of topic, topics = ["a", "b"], topic_regex = "orders-.*"
/// start = "earliest"                    # "earliest" (default) | "latest" | "group"
///                                       # | "timestamp:1700000000000" | "2023-11-14T22:13:20Z"
///                                       # | { timestamp_ms = 1700000000000 }
/// group_id = "exactly-orders-pipeline"  # default: "exactly-<pipeline name>"
/// commit_offsets_to_group = true        # default: true
/// partition_discovery_interval = "10s"  # default: "10s"
/// startup_timeout = "30s"               # default: "30s"
/// # accept_cluster_id = "MkU3OEVBNTcwNTJENDM2Qk"  # resume offsets of another cluster on this one
/// # accept_topic_id = "b3ZlcnRoZXJlLWlzLWEtbmV3"  # read a recreated topic from its beginning
/// on_log_truncation = "fail"            # "fail" (default) | "resume": see the field
/// missing_topic_timeout = "60s"         # default: "60s"
///
/// [source.kafka.properties]             # client settings: security, fetching
/// "fetch.max.bytes" = "1048576"
/// ```
///
/// Construct it with serde (TOML, JSON, ...) or [`KafkaSourceConfig::new`], then
/// check it with [`KafkaSourceConfig::validate`] (the factory does so too).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// Bootstrap servers, `HOST:PORT[,HOST:PORT...]`.
    pub bootstrap: String,
    /// The topic to read. Every partition is read, including ones added
    /// later. Give exactly one of `topic`, `topics` and `topic_regex`.
    #[serde(default)]
    pub topic: String,
    /// Several topics to read, each wholly (see `topic`).
    #[serde(default)]
    pub topics: Vec<String>,
    /// Every topic whose whole name matches this regular expression (Rust's
    /// `regex` syntax, anchored at both ends: `orders-.*`), including topics
    /// created while the pipeline runs, found by partition discovery and
    /// read from their beginning. Internal topics (`__consumer_offsets`,
    /// ...) are never read.
    #[serde(default)]
    pub topic_regex: Option<String>,
    /// Where partitions without a checkpointed offset start on a first start.
    #[serde(default)]
    pub start: StartPosition,
    /// Consumer group used to publish progress (and to read it for
    /// `start = "group"`). Default `exactly-<pipeline name>`. The source never
    /// joins the group: partitions are assigned explicitly.
    #[serde(default)]
    pub group_id: Option<String>,
    /// Commit the offsets of every completed checkpoint to the group, so lag
    /// tools see progress. They are never read back, except by `start = "group"`
    /// on a first start.
    #[serde(default = "default_true")]
    pub commit_offsets_to_group: bool,
    /// How often the topic's metadata is read to find new partitions (which are
    /// read from their beginning). Written like `"10s"`, `"500ms"`.
    #[serde(
        default = "default_discovery",
        deserialize_with = "exactly_core::duration::deserialize"
    )]
    pub partition_discovery_interval: Duration,
    /// How long `restore` waits for the brokers before it reports them
    /// unreachable (a transient error, so the runtime retries).
    #[serde(
        default = "default_startup_timeout",
        deserialize_with = "exactly_core::duration::deserialize"
    )]
    pub startup_timeout: Duration,
    /// Bounded run: finish once every partition owned at start is read up to the
    /// end it had when the run started (backfills, tests, benchmarks). The
    /// pipeline then takes a last checkpoint, commits it and exits. A restarted
    /// run reads up to the end it finds then.
    #[serde(default)]
    pub stop_at_end: bool,
    /// The positions in a checkpoint name the Kafka cluster (its id) they
    /// were read from, and a restore on another cluster is refused: offsets
    /// of one cluster mean nothing in another. Set this to the id of the
    /// cluster `bootstrap` points at to resume the checkpoint's offsets
    /// there anyway — only when that cluster holds the very same offsets (a
    /// migration that kept them). Harmless to leave set afterwards: it
    /// admits that one cluster only.
    #[serde(default)]
    pub accept_cluster_id: Option<String>,
    /// The positions in a checkpoint name the topic's id (Kafka gives a
    /// topic a new one when it is deleted and created again under the same
    /// name), and a restore that finds another id is refused: the offsets
    /// belong to the old topic. Set this to the new id, as the refusal
    /// names it, to read the new topic from its beginning instead. Harmless
    /// to leave set afterwards: it admits that one topic only.
    #[serde(default)]
    pub accept_topic_id: Option<String>,
    /// What happens when a partition's log was truncated below the
    /// position read — an unclean leader election elected a replica that
    /// lacked records the pipeline had read, which are gone, and new
    /// records now take their offsets. `"fail"` (default): the pipeline
    /// stops with an error naming the partition, the position and the
    /// divergence. `"resume"`: reading goes on at the divergence, with a
    /// warning, and the offsets read that no longer exist are counted
    /// (`exactly_kafka_source_truncated_offsets_total`).
    #[serde(default)]
    pub on_log_truncation: LogTruncation,
    /// How long the topic may be missing from the cluster's metadata (it
    /// was deleted) while the pipeline runs before the pipeline stops with
    /// an error; meanwhile `/health/ready` fails and
    /// `exactly_kafka_source_topic_missing` is 1.
    #[serde(
        default = "default_missing_topic_timeout",
        deserialize_with = "exactly_core::duration::deserialize"
    )]
    pub missing_topic_timeout: Duration,
    /// Client settings, under librdkafka's names; strings, numbers and
    /// booleans are accepted. The source reads with Kafka's protocol itself
    /// (not librdkafka), and takes:
    ///
    /// - security: `security.protocol`, `sasl.mechanism`, `sasl.username`,
    ///   `sasl.password`, `ssl.ca.location`, `ssl.ca.pem`,
    ///   `ssl.certificate.location`, `ssl.key.location`,
    ///   `ssl.endpoint.identification.algorithm`,
    ///   `enable.ssl.certificate.verification` (see
    ///   [`exactly_kafka_wire::WireConfig::from_properties`]);
    /// - connections: `client.id`, `request.timeout.ms`,
    ///   `socket.timeout.ms`, `socket.connection.setup.timeout.ms`;
    /// - fetching: `fetch.wait.max.ms` (500), `fetch.min.bytes` (1),
    ///   `fetch.max.bytes` (4 MiB), `max.partition.fetch.bytes` (1 MiB),
    ///   `queued.max.messages.kbytes` (4096: each subtask reads about 4 MiB
    ///   ahead), `auto.offset.reset` (`earliest`), `fetch.error.backoff.ms`
    ///   (100), `reconnect.backoff.max.ms` (1000), `metadata.max.age.ms`
    ///   (300000), `client.rack` (see [`exactly_kafka_wire::FetchSettings`]);
    /// - `check.crcs`: accepted; batches' CRCs are always checked.
    ///
    /// Any other key, and the settings the source owns, are refused by
    /// [`validate`](Self::validate), naming the key.
    #[serde(default, deserialize_with = "de_properties")]
    pub properties: BTreeMap<String, String>,
}

impl fmt::Debug for KafkaSourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSourceConfig")
            .field("bootstrap", &self.bootstrap)
            .field("topic", &self.topic)
            .field("topics", &self.topics)
            .field("topic_regex", &self.topic_regex)
            .field("start", &self.start)
            .field("group_id", &self.group_id)
            .field("commit_offsets_to_group", &self.commit_offsets_to_group)
            .field("partition_discovery_interval", &self.partition_discovery_interval)
            .field("startup_timeout", &self.startup_timeout)
            .field("stop_at_end", &self.stop_at_end)
            .field("accept_cluster_id", &self.accept_cluster_id)
            .field("accept_topic_id", &self.accept_topic_id)
            .field("on_log_truncation", &self.on_log_truncation)
            .field("missing_topic_timeout", &self.missing_topic_timeout)
            .field("properties", &RedactedProperties(&self.properties))
            .finish()
    }
}

fn default_true() -> bool {
    true
}
fn default_discovery() -> Duration {
    DEFAULT_PARTITION_DISCOVERY_INTERVAL
}
fn default_startup_timeout() -> Duration {
    DEFAULT_STARTUP_TIMEOUT
}
fn default_missing_topic_timeout() -> Duration {
    DEFAULT_MISSING_TOPIC_TIMEOUT
}

/// What a Kafka source reads ([`KafkaSourceConfig::subscription`]).
#[derive(Clone, Debug)]
pub enum Subscription {
    /// One topic (`topic`).
    Topic(String),
    /// Several topics (`topics`).
    Topics(Vec<String>),
    /// Every topic whose whole name matches (`topic_regex`, anchored).
    Regex(regex::Regex),
}

impl Subscription {
    /// Whether `topic` is read.
    pub fn matches(&self, topic: &str) -> bool {
        match self {
            Subscription::Topic(t) => t == topic,
            Subscription::Topics(ts) => ts.iter().any(|t| t == topic),
            Subscription::Regex(r) => !topic.starts_with("__") && r.is_match(topic),
        }
    }

    /// The topics named, when they are named (not for a regex).
    pub fn named(&self) -> Option<Vec<String>> {
        match self {
            Subscription::Topic(t) => Some(vec![t.clone()]),
            Subscription::Topics(ts) => Some(ts.clone()),
            Subscription::Regex(_) => None,
        }
    }

    /// Short text for logs and errors: the topic, the list, or `/regex/`.
    pub fn label(&self) -> String {
        match self {
            Subscription::Topic(t) => t.clone(),
            Subscription::Topics(ts) => ts.join(","),
            Subscription::Regex(r) => format!("/{}/", r.as_str()),
        }
    }

    /// The source's identity, part of the pipeline's fingerprint:
    /// `kafka:topic=<t>` (as before several topics existed),
    /// `kafka:topics=<a>,<b>` (sorted), `kafka:topic_regex=<pattern>`.
    pub fn identity(&self) -> String {
        match self {
            Subscription::Topic(t) => format!("kafka:topic={t}"),
            Subscription::Topics(ts) => {
                let mut sorted = ts.clone();
                sorted.sort();
                format!("kafka:topics={}", sorted.join(","))
            }
            Subscription::Regex(r) => format!("kafka:topic_regex={}", r.as_str()),
        }
    }

    /// The subtask (of `parallelism`) that reads `partition` of `topic`.
    /// One topic: partition `p` → subtask `p % parallelism`. Several: the
    /// partitions of each topic go round the subtasks from a place of the
    /// topic's own (its name's hash), so topics with few partitions do not
    /// all land on subtask 0. Stable: the same for every run at the same
    /// parallelism.
    pub fn owner(&self, topic: &str, partition: i32, parallelism: usize) -> usize {
        let shift = match self {
            Subscription::Topic(_) => 0,
            _ => topic_hash(topic) as usize,
        };
        (partition as usize).wrapping_add(shift) % parallelism.max(1)
    }
}

/// FNV-1a of a topic's name: fixed forever (ownership depends on it).
fn topic_hash(topic: &str) -> u32 {
    topic.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// `on_log_truncation`: see [`KafkaSourceConfig::on_log_truncation`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogTruncation {
    /// Stop the pipeline, naming the partition and the divergence.
    #[default]
    Fail,
    /// Read on at the divergence, counting what no longer exists.
    Resume,
}

/// Where a partition starts when the checkpoint has no offset for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartPosition {
    /// The first record still in the partition.
    #[default]
    Earliest,
    /// The end of the partition when the source first starts (for
    /// read_committed this is the last stable offset): only records produced
    /// afterwards are read.
    Latest,
    /// The offsets committed to `group_id`; partitions the group never
    /// committed start at earliest.
    Group,
    /// The first record whose timestamp is at or after this Unix time in
    /// milliseconds (Kafka's offsets-for-times); the end of the partition if
    /// there is none.
    Timestamp(i64),
}

impl fmt::Display for StartPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartPosition::Earliest => f.write_str("earliest"),
            StartPosition::Latest => f.write_str("latest"),
            StartPosition::Group => f.write_str("group"),
            StartPosition::Timestamp(ms) => write!(f, "timestamp:{ms}"),
        }
    }
}

const START_EXPECTED: &str = "\"earliest\", \"latest\", \"group\", \"timestamp:<unix ms>\", an RFC 3339 time \
     like \"2023-11-14T22:13:20Z\", or { timestamp_ms = <unix ms> }";

impl StartPosition {
    /// Parses the string forms: `earliest`, `latest`, `group`,
    /// `timestamp:<unix ms>` or an RFC 3339 time (`2023-11-14T22:13:20Z`).
    pub fn parse(text: &str) -> Result<StartPosition, String> {
        match text {
            "earliest" => return Ok(StartPosition::Earliest),
            "latest" => return Ok(StartPosition::Latest),
            "group" => return Ok(StartPosition::Group),
            _ => {}
        }
        if let Some(ms) = text.strip_prefix("timestamp:") {
            return ms.trim().parse::<i64>().map(StartPosition::Timestamp).map_err(|e| {
                format!("`start` = \"{text}\": the timestamp is not a whole number of milliseconds ({e})")
            });
        }
        let time = humantime::parse_rfc3339_weak(text)
            .map_err(|_| format!("`start` = \"{text}\" is not a start position; expected {START_EXPECTED}"))?;
        let ms = match time.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_millis() as i64,
            Err(_) => return Err(format!("`start` = \"{text}\" is before 1970")),
        };
        Ok(StartPosition::Timestamp(ms))
    }

    /// A timestamp start at `time`.
    pub fn at(time: SystemTime) -> StartPosition {
        let ms = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        StartPosition::Timestamp(ms)
    }
}

impl<'de> Deserialize<'de> for StartPosition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StartVisitor;

        impl<'de> Visitor<'de> for StartVisitor {
            type Value = StartPosition;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(START_EXPECTED)
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<StartPosition, E> {
                StartPosition::parse(v).map_err(E::custom)
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StartPosition, A::Error> {
                let mut ms = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "timestamp_ms" || ms.is_some() {
                        return Err(de::Error::custom(format!(
                            "`start` has an unexpected key `{key}`; write start = {{ timestamp_ms = <unix ms> }}"
                        )));
                    }
                    ms = Some(map.next_value::<i64>()?);
                }
                ms.map(StartPosition::Timestamp).ok_or_else(|| {
                    de::Error::custom("`start` needs `timestamp_ms`: start = { timestamp_ms = <unix ms> }")
                })
            }
        }

        d.deserialize_any(StartVisitor)
    }
}

/// A setting of [`KafkaSourceConfig`] or [`KafkaSinkConfig`](crate::KafkaSinkConfig)
/// is invalid. `key` is the setting's name inside `[source.kafka]` or
/// `[sink.kafka]`; the message says how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("kafka {connector}: `{key}` {problem}")]
pub struct KafkaConfigError {
    /// `"source"` or `"sink"`.
    pub connector: &'static str,
    /// The offending key (`topic`, `properties."group.id"`, ...).
    pub key: String,
    /// What is wrong and how to fix it.
    pub problem: String,
}

impl KafkaConfigError {
    /// The same error, reported for the sink's section.
    pub(crate) fn in_sink(self) -> KafkaConfigError {
        KafkaConfigError {
            connector: "sink",
            ..self
        }
    }
}

pub(crate) fn invalid(key: impl Into<String>, problem: impl Into<String>) -> Result<(), KafkaConfigError> {
    Err(KafkaConfigError {
        connector: "source",
        key: key.into(),
        problem: problem.into(),
    })
}

impl KafkaSourceConfig {
    /// Settings for `topic` on `bootstrap`, with every other key at its default.
    pub fn new(bootstrap: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSourceConfig {
            bootstrap: bootstrap.into(),
            topic: topic.into(),
            topics: Vec::new(),
            topic_regex: None,
            start: StartPosition::default(),
            group_id: None,
            commit_offsets_to_group: true,
            partition_discovery_interval: DEFAULT_PARTITION_DISCOVERY_INTERVAL,
            stop_at_end: false,
            accept_cluster_id: None,
            accept_topic_id: None,
            on_log_truncation: LogTruncation::Fail,
            missing_topic_timeout: DEFAULT_MISSING_TOPIC_TIMEOUT,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            properties: BTreeMap::new(),
        }
    }

    /// What the source reads: `topic`, `topics` or `topic_regex`. Call
    /// after [`validate`](Self::validate).
    pub fn subscription(&self) -> Subscription {
        if let Some(pattern) = &self.topic_regex {
            let regex = regex::Regex::new(&format!("^(?:{pattern})$")).expect("checked by validate");
            return Subscription::Regex(regex);
        }
        if !self.topics.is_empty() {
            return Subscription::Topics(self.topics.clone());
        }
        Subscription::Topic(self.topic.clone())
    }

    /// The consumer group: `group_id`, or `exactly-<pipeline>`.
    pub fn group_for(&self, pipeline: &str) -> String {
        self.group_id.clone().unwrap_or_else(|| format!("exactly-{pipeline}"))
    }

    /// Checks every setting; the error names the key and the fix.
    pub fn validate(&self) -> Result<(), KafkaConfigError> {
        check_bootstrap(&self.bootstrap)?;
        match (!self.topic.is_empty(), !self.topics.is_empty(), &self.topic_regex) {
            (true, false, None) => check_topic(&self.topic)?,
            (false, true, None) => {
                for topic in &self.topics {
                    check_topic(topic).map_err(|e| KafkaConfigError {
                        key: "topics".into(),
                        ..e
                    })?;
                }
                let distinct: std::collections::BTreeSet<&String> = self.topics.iter().collect();
                if distinct.len() != self.topics.len() {
                    return invalid("topics", "names a topic twice; list each once");
                }
            }
            (false, false, Some(pattern)) => {
                if let Err(e) = regex::Regex::new(&format!("^(?:{pattern})$")) {
                    return invalid("topic_regex", format!("is not a regular expression: {e}"));
                }
            }
            (false, false, None) => {
                return invalid(
                    "topic",
                    "is missing; name what to read with `topic = \"orders\"`, `topics = [\"a\", \"b\"]` or \
                     `topic_regex = \"orders-.*\"`",
                )
            }
            _ => {
                return invalid(
                    "topic",
                    "`topic`, `topics` and `topic_regex` exclude each other; keep exactly one of them",
                )
            }
        }
        if let StartPosition::Timestamp(ms) = self.start {
            if ms < 0 {
                return invalid("start", format!("timestamp {ms} is negative; give Unix milliseconds"));
            }
        }
        if let Some(group) = &self.group_id {
            if group.trim().is_empty() {
                return invalid(
                    "group_id",
                    "is empty; remove it to use exactly-<pipeline name>, or name a group",
                );
            }
        }
        if let Some(cluster) = &self.accept_cluster_id {
            if cluster.trim().is_empty() || cluster.trim() != cluster {
                return invalid(
                    "accept_cluster_id",
                    "must be a cluster id as the refusal names it (e.g. \"MkU3OEVBNTcwNTJENDM2Qk\"), or be removed",
                );
            }
        }
        if let Some(id) = &self.accept_topic_id {
            if let Err(problem) = id.parse::<TopicId>() {
                return invalid(
                    "accept_topic_id",
                    format!("{problem}; give the id the refusal names, or remove the key"),
                );
            }
        }
        if self.missing_topic_timeout < Duration::from_secs(1) {
            return invalid("missing_topic_timeout", "must be at least 1s; write e.g. \"60s\"");
        }
        if self.partition_discovery_interval < Duration::from_millis(100) {
            return invalid(
                "partition_discovery_interval",
                "must be at least 100ms; write e.g. \"10s\"",
            );
        }
        if self.startup_timeout.is_zero() {
            return invalid("startup_timeout", "must be greater than 0s; write e.g. \"30s\"");
        }
        check_properties(&self.properties, RESERVED_PROPERTIES, "source")?;
        if let Some(key) = self.properties.keys().find(|key| !source_reads(key)) {
            return invalid(
                format!("properties.\"{key}\""),
                "is not a setting of the Kafka source: it reads with Kafka's protocol itself, not librdkafka, and \
                 takes security settings (security.protocol, sasl.*, ssl.*), client.id, request.timeout.ms, \
                 socket.timeout.ms, socket.connection.setup.timeout.ms and the fetch settings fetch.wait.max.ms, \
                 fetch.min.bytes, fetch.max.bytes, max.partition.fetch.bytes, queued.max.messages.kbytes, \
                 auto.offset.reset, fetch.error.backoff.ms, reconnect.backoff.max.ms, metadata.max.age.ms, \
                 client.rack; remove it",
            );
        }
        self.client_settings().map(|_| ())
    }

    /// How the source reaches the brokers (bootstrap, security, timeouts),
    /// for other clients of the same cluster (the lag monitor's, say).
    pub fn wire_config(&self) -> Result<WireConfig, KafkaConfigError> {
        Ok(self.client_settings()?.0)
    }

    /// How the source reaches the brokers and fetches, from `bootstrap`
    /// and `properties`. A malformed value is an error naming its key.
    pub(crate) fn client_settings(&self) -> Result<(WireConfig, FetchSettings), KafkaConfigError> {
        let wrong = |error: WireError| {
            let key = match &error {
                WireError::InvalidConfig { key, .. } if key == "bootstrap.servers" => "bootstrap".to_string(),
                WireError::InvalidConfig { key, .. } => format!("properties.\"{key}\""),
                _ => "properties".to_string(),
            };
            KafkaConfigError {
                connector: "source",
                key,
                problem: format!("is not usable: {error}"),
            }
        };
        let wire = WireConfig::from_properties(&self.bootstrap, &self.properties).map_err(wrong)?;
        let mut fetch = FetchSettings::from_properties(&self.properties).map_err(wrong)?;
        fetch.missing_topic_timeout = self.missing_topic_timeout;
        fetch.on_truncation = match self.on_log_truncation {
            LogTruncation::Fail => OnTruncation::Fail,
            LogTruncation::Resume => OnTruncation::Resume,
        };
        let timeout = wire.options.request_timeout;
        if fetch.max_wait >= timeout {
            return Err(KafkaConfigError {
                connector: "source",
                key: "properties.\"fetch.wait.max.ms\"".into(),
                problem: format!(
                    "({} ms) must be below request.timeout.ms ({} ms): a broker holds a Fetch that long when there \
                     is nothing new, and the request would time out every time; lower it or raise request.timeout.ms",
                    fetch.max_wait.as_millis(),
                    timeout.as_millis()
                ),
            });
        }
        Ok((wire, fetch))
    }
}

/// Whether the source takes the client setting `key`.
fn source_reads(key: &str) -> bool {
    CLIENT_PROPERTIES.contains(&key) || FETCH_PROPERTIES.contains(&key) || key == "check.crcs"
}

/// `HOST:PORT[,HOST:PORT...]`.
pub(crate) fn check_bootstrap(bootstrap: &str) -> Result<(), KafkaConfigError> {
    if bootstrap.trim().is_empty() {
        return invalid("bootstrap", "is empty; set it to the brokers, e.g. \"127.0.0.1:9092\"");
    }
    let servers: Vec<&str> = bootstrap.split(',').map(str::trim).collect();
    if let Some(bad) = servers.iter().find(|s| s.is_empty() || s.contains(char::is_whitespace)) {
        return invalid(
            "bootstrap",
            format!("has an invalid entry \"{bad}\"; write HOST:PORT entries separated by commas"),
        );
    }
    Ok(())
}

/// Kafka's rules for topic names.
pub(crate) fn check_topic(topic: &str) -> Result<(), KafkaConfigError> {
    if topic.is_empty() {
        return invalid("topic", "is empty; set it to the topic's name");
    }
    if topic == "." || topic == ".." || topic.len() > 249 {
        return invalid("topic", format!("\"{topic}\" is not a valid Kafka topic name"));
    }
    if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return invalid(
            "topic",
            format!("\"{topic}\" contains '{c}'; Kafka topic names use only letters, digits, '.', '_' and '-'"),
        );
    }
    Ok(())
}

/// Test support: the `[<side>.kafka]` section of a pipeline file with
/// `bootstrap = "127.0.0.1:9092"`, `topic` and then `body`, deserialized.
#[cfg(test)]
pub(crate) fn parse_section<T: serde::de::DeserializeOwned>(side: &str, topic: &str, body: &str) -> Result<T, String> {
    let text = format!("[{side}.kafka]\nbootstrap = \"127.0.0.1:9092\"\ntopic = \"{topic}\"\n{body}");
    let mut file: toml::Table = toml::from_str(&text).map_err(|e| e.to_string())?;
    let section = file
        .remove(side)
        .and_then(|v| v.as_table().and_then(|t| t.get("kafka")).cloned())
        .ok_or("no section")?;
    section.try_into().map_err(|e: toml::de::Error| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<KafkaSourceConfig, String> {
        let config: KafkaSourceConfig = parse_section("source", "orders", body)?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, KafkaSourceConfig::new("127.0.0.1:9092", "orders"));
        assert_eq!(c.start, StartPosition::Earliest);
        assert!(c.commit_offsets_to_group);
        assert_eq!(c.partition_discovery_interval, Duration::from_secs(10));
        assert_eq!(c.group_for("p"), "exactly-p");
    }

    #[test]
    fn every_key() {
        let c = parse(
            r#"
start = "latest"
group_id = "g"
commit_offsets_to_group = false
partition_discovery_interval = "250ms"
startup_timeout = "2s"
accept_cluster_id = "MkU3OEVBNTcwNTJENDM2Qk"
[source.kafka.properties]
"fetch.max.bytes" = 1048576
"check.crcs" = true
"client.id" = "me"
"#,
        )
        .unwrap();
        assert_eq!(c.start, StartPosition::Latest);
        assert_eq!(c.group_for("p"), "g");
        assert!(!c.commit_offsets_to_group);
        assert_eq!(c.partition_discovery_interval, Duration::from_millis(250));
        assert_eq!(c.startup_timeout, Duration::from_secs(2));
        assert_eq!(c.accept_cluster_id.as_deref(), Some("MkU3OEVBNTcwNTJENDM2Qk"));
        assert_eq!(c.properties["fetch.max.bytes"], "1048576");
        assert_eq!(c.properties["check.crcs"], "true");
        assert_eq!(c.properties["client.id"], "me");
    }

    #[test]
    fn debug_output_hides_secret_properties() {
        let mut c = KafkaSourceConfig::new("127.0.0.1:9093", "orders");
        c.properties.insert("sasl.password".into(), "s3cret-value".into());
        c.properties.insert("ssl.key.password".into(), "k3y-value".into());
        c.properties.insert("sasl.username".into(), "exactly".into());
        let text = format!("{c:?}");
        assert!(!text.contains("s3cret-value") && !text.contains("k3y-value"), "{text}");
        assert!(
            text.contains("\"sasl.password\": \"***\"") && text.contains("exactly"),
            "{text}"
        );
    }

    #[test]
    fn start_forms() {
        let start = |s: &str| parse(&format!("start = {s}")).map(|c| c.start);
        assert_eq!(start("\"earliest\""), Ok(StartPosition::Earliest));
        assert_eq!(start("\"group\""), Ok(StartPosition::Group));
        let forms = [
            ("{ timestamp_ms = 1700000000000 }", 1_700_000_000_000),
            ("\"timestamp:1700000000000\"", 1_700_000_000_000),
            ("\"2023-11-14T22:13:20Z\"", 1_700_000_000_000),
            ("\"2023-11-14T22:13:20.5Z\"", 1_700_000_000_500),
        ];
        for (form, ms) in forms {
            assert_eq!(start(form), Ok(StartPosition::Timestamp(ms)), "{form}");
        }
        assert_eq!(StartPosition::Timestamp(5).to_string(), "timestamp:5");
        assert_eq!(StartPosition::parse("timestamp:5"), Ok(StartPosition::Timestamp(5)));
    }

    #[test]
    fn bad_start_values_say_what_is_expected() {
        let e = parse("start = \"beginning\"").unwrap_err();
        assert!(
            e.contains("`start` = \"beginning\"") && e.contains("\"earliest\""),
            "{e}"
        );
        let e = parse("start = \"timestamp:soon\"").unwrap_err();
        assert!(e.contains("milliseconds"), "{e}");
        let e = parse("start = { ts = 5 }").unwrap_err();
        assert!(e.contains("unexpected key `ts`"), "{e}");
        let e = parse("start = {}").unwrap_err();
        assert!(e.contains("needs `timestamp_ms`"), "{e}");
        let e = parse("start = { timestamp_ms = -5 }").unwrap_err();
        assert!(e.contains("`start`") && e.contains("negative"), "{e}");
        let e = parse("start = 5").unwrap_err();
        assert!(e.contains("earliest"), "{e}");
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_rejected() {
        let e = parse("topics = \"x\"").unwrap_err();
        assert!(e.contains("topics"), "{e}");
        let e = parse("partition_discovery_interval = \"often\"").unwrap_err();
        assert!(e.contains("often") && e.contains("duration"), "{e}");
        let e = parse("partition_discovery_interval = \"1ms\"").unwrap_err();
        assert!(
            e.contains("`partition_discovery_interval` must be at least 100ms"),
            "{e}"
        );
        let e = parse("startup_timeout = \"0s\"").unwrap_err();
        assert!(e.contains("`startup_timeout`"), "{e}");
    }

    #[test]
    fn validation_names_the_key_and_the_fix() {
        let check = |f: &dyn Fn(&mut KafkaSourceConfig)| {
            let mut c = KafkaSourceConfig::new("127.0.0.1:9092", "orders");
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        let e = check(&|c| c.bootstrap = " ".into());
        assert!(e.contains("`bootstrap` is empty"), "{e}");
        let e = check(&|c| c.bootstrap = "a:1,,b:2".into());
        assert!(e.contains("`bootstrap` has an invalid entry"), "{e}");
        let e = check(&|c| c.topic = String::new());
        assert!(e.contains("`topic` is missing") && e.contains("topic_regex"), "{e}");
        let e = check(&|c| c.topic = "a/b".into());
        assert!(e.contains("`topic`") && e.contains("'/'"), "{e}");
        let e = check(&|c| c.group_id = Some(String::new()));
        assert!(e.contains("`group_id` is empty"), "{e}");
        let e = check(&|c| c.accept_cluster_id = Some(" ".into()));
        assert!(e.contains("`accept_cluster_id` must be a cluster id"), "{e}");
        let e = check(&|c| {
            c.properties.insert("isolation.level".into(), "read_uncommitted".into());
        });
        assert!(
            e.contains("`properties.\"isolation.level\"`") && e.contains("read_committed"),
            "{e}"
        );
        let e = check(&|c| {
            c.properties.insert("group.id".into(), "x".into());
        });
        assert!(e.contains("set `group_id` instead"), "{e}");
    }
}
