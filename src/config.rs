//! The TOML pipeline file read by `exactly run`.
//!
//! Every key is checked: an unknown key, a wrong type or a bad value is reported
//! with its name. Any string value may come from the environment or a file
//! (`{ env = "NAME" }`, `{ file = "/run/secrets/name" }`; see [`secrets`]).

pub mod secrets;
pub mod transforms;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use exactly_core::{
    CheckpointConfig, CheckpointStore, Failover, FsCheckpointStore, Guarantee, Pipeline, PipelineConfig,
    RestartStrategy, SequenceSourceFactory, SinkFactory, SourceFactory,
};
use exactly_file::{FileFormat, FileSinkFactory};
use serde::Deserialize;

use crate::plugins::{Connectors, PluginContext};

/// The `[source.kafka]` and `[sink.postgres]` sections of the orders pipeline
/// the README documents: a bounded read of `topic` from the beginning into
/// `table` (created when absent) with the partition, offset, `/id` and the
/// JSON value as columns. Used by the demo (`demo/`) and the end-to-end tests.
pub fn orders_sections(bootstrap: &str, topic: &str, url: &str, table: &str) -> String {
    format!(
        r#"[source.kafka]
bootstrap = "{bootstrap}"
topic = "{topic}"
start = "earliest"
stop_at_end = true

[sink.postgres]
url = "{url}"
table = "{table}"
create_table = true

[sink.postgres.columns]
part = {{ from = "partition", type = "int" }}
off = {{ from = "offset", type = "bigint" }}
id = {{ from = "/id", type = "bigint" }}
payload = {{ from = "value", type = "jsonb" }}
"#
    )
}

/// A built pipeline and the parts of it the operations endpoints read.
pub struct Built {
    /// The pipeline.
    pub pipeline: Pipeline,
    /// Its sink's factory.
    pub sink: Arc<dyn SinkFactory>,
    /// The Kafka source's factory, when the source is Kafka (its counters).
    pub kafka_source: Option<Arc<exactly_kafka::KafkaSourceFactory>>,
    /// The Kafka sink's factory, when the sink is Kafka (lost transactions).
    pub kafka_sink: Option<Arc<exactly_kafka::KafkaSinkFactory>>,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("pipeline", &self.pipeline)
            .finish_non_exhaustive()
    }
}

/// A duration written like `"1s"`, `"250ms"`, `"2m"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        exactly_core::duration::deserialize(d).map(HumanDuration)
    }
}

/// How often a standby tries to take the pipeline's lock.
pub const STANDBY_POLL: Duration = Duration::from_millis(250);

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    /// Pipeline name; checkpoints live under `<checkpoint.dir>/<name>/`.
    pub name: String,
    /// `"exactly-once"` (default) or `"at-least-once"`.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// Source and sink subtasks (default 1).
    #[serde(default = "one")]
    pub parallelism: usize,
    /// `"region"` (default: every source → sink chain checkpoints and fails
    /// over on its own) or `"global"`.
    #[serde(default)]
    pub failover: Failover,
    /// Records per source poll (default 500).
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// `[checkpoint]`.
    pub checkpoint: CheckpointSection,
    /// `[restart]`.
    #[serde(default)]
    pub restart: RestartSection,
    /// `[source.<kind>]`.
    pub source: SourceSection,
    /// `[sink.<kind>]`.
    pub sink: SinkSection,
    /// `[[transform]]`: single-message transforms between source and sink,
    /// in order (see [`transforms`]).
    #[serde(default)]
    pub transform: Vec<transforms::TransformSection>,
    /// `[metrics]`: the Prometheus and health endpoint.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// `[workers]`: this process is one of several that share the
    /// pipeline's regions (needs `[checkpoint] store = { postgres = … }`).
    pub workers: Option<WorkersSection>,
    /// The connectors beyond the built-in ones this file was read with
    /// (see [`PipelineFile::load_with`]).
    #[serde(skip)]
    pub connectors: Connectors,
    /// The folder of the file, for connectors of one's own
    /// ([`PluginContext::base_dir`]).
    #[serde(skip)]
    base_dir: Option<PathBuf>,
}

/// `[workers]`: run the pipeline as one of several processes, on one
/// machine or several, that share its regions under leases in the
/// PostgreSQL checkpoint store. Every setting has a default (an empty
/// `[workers]` is enough).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkersSection {
    /// How long a region's lease runs on the database's clock after each
    /// renewal (default 3s): bounds the failover after a worker dies.
    pub lease_term: Option<HumanDuration>,
    /// How often a worker renews its leases (default 1s).
    pub renew_every: Option<HumanDuration>,
    /// How much before its lease can run out a worker stops acting, by its
    /// own clock (default 500ms).
    pub margin: Option<HumanDuration>,
    /// How often a worker reads the leases to claim free regions (default
    /// 250ms).
    pub poll: Option<HumanDuration>,
}

impl WorkersSection {
    /// The lease settings.
    pub fn settings(&self) -> exactly_core::membership::LeaseSettings {
        let d = exactly_core::membership::LeaseSettings::default();
        exactly_core::membership::LeaseSettings {
            term: self.lease_term.map_or(d.term, |t| t.0),
            renew_every: self.renew_every.map_or(d.renew_every, |t| t.0),
            margin: self.margin.map_or(d.margin, |t| t.0),
            poll: self.poll.map_or(d.poll, |t| t.0),
        }
    }
}

/// `[metrics]`: where `/metrics`, `/health/live` and `/health/ready` are
/// served while the pipeline runs (nothing is served without `listen`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Address to listen on, e.g. `"127.0.0.1:9464"` (`--metrics-listen`
    /// overrides it).
    pub listen: Option<String>,
    /// `/health/ready` answers 503 once the latest completed checkpoint is
    /// older than this (default: 3 checkpoint intervals plus the checkpoint
    /// timeout).
    pub ready_max_checkpoint_age: Option<HumanDuration>,
    /// How often the consumer lag is read from the brokers (default 5s).
    pub lag_interval: Option<HumanDuration>,
}

impl MetricsSection {
    /// `listen` as a socket address; the error names the key and the fix.
    pub fn listen_address(&self, origin: &str) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        self.listen
            .as_deref()
            .map(|a| parse_listen(a, origin, "metrics.listen"))
            .transpose()
    }
}

/// Parses a listen address (`HOST:PORT` with an IP address); `key` names
/// where it came from.
pub fn parse_listen(address: &str, origin: &str, key: &str) -> Result<std::net::SocketAddr, ConfigError> {
    address.parse().map_err(|e| ConfigError::Invalid {
        path: origin.to_string(),
        key: key.to_string(),
        problem: format!(
            "`{address}` is not a listen address ({e}); write an IP address and a port, e.g. \"127.0.0.1:9464\" \
             (or \"0.0.0.0:9464\" for every interface)"
        ),
    })
}

fn one() -> usize {
    1
}
fn default_batch() -> usize {
    500
}
fn default_retain() -> usize {
    3
}

/// `[checkpoint]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSection {
    /// Root folder of the checkpoint store (the folder store; not used
    /// with `store = { postgres = … }`).
    #[serde(default)]
    pub dir: PathBuf,
    /// Where the checkpoints live when not in `dir`: `{ postgres = "postgres://…" }`
    /// (the URL may be a secret: `{ postgres = { env = "NAME" } }`).
    pub store: Option<StoreSection>,
    /// Time between checkpoints (default 1s).
    pub interval: Option<HumanDuration>,
    /// Minimum pause between checkpoints (default 0s).
    pub min_pause: Option<HumanDuration>,
    /// Checkpoint timeout (default 60s).
    pub timeout: Option<HumanDuration>,
    /// Consecutive failed checkpoints tolerated (default 3).
    pub tolerable_failures: Option<u32>,
    /// Entries kept (default 3).
    #[serde(default = "default_retain")]
    pub retain: usize,
    /// Resume from a checkpoint of a different pipeline definition.
    #[serde(default)]
    pub allow_fingerprint_change: bool,
    /// Resume from a checkpoint taken at another parallelism.
    #[serde(default)]
    pub allow_parallelism_change: bool,
    /// Start as if for the first time although no entry of the folder's
    /// history can be read.
    #[serde(default)]
    pub allow_first_start: bool,
    /// Restore the newest readable checkpoint although newer entries cannot
    /// be read and the sinks do not prove the replay harmless.
    #[serde(default)]
    pub allow_fallback: bool,
    /// Wait as a hot standby while another process runs the pipeline (its
    /// lock is held), taking over as soon as it stops (`--standby`); the
    /// default refuses at once.
    #[serde(default)]
    pub standby: bool,
}

/// `[checkpoint] store`: a checkpoint store other than the folder store.
#[derive(Clone, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreSection {
    /// A PostgreSQL database every machine running the pipeline reaches
    /// (`exactly_store_postgres`); libpq's TLS settings in the URL.
    Postgres(String),
}

impl std::fmt::Debug for StoreSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSection::Postgres(url) => f
                .debug_tuple("Postgres")
                .field(&crate::ops::redact::redact(url))
                .finish(),
        }
    }
}

/// `[restart]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartSection {
    /// `"exponential"` (default), `"fixed"` or `"none"`.
    pub strategy: Option<String>,
    /// Fixed delay.
    pub delay: Option<HumanDuration>,
    /// First backoff delay.
    pub initial: Option<HumanDuration>,
    /// Largest backoff delay.
    pub max: Option<HumanDuration>,
    /// Backoff growth factor.
    pub multiplier: Option<f64>,
    /// Share of a delay randomly removed (0..1).
    pub jitter: Option<f64>,
    /// Restarts in a row before giving up.
    pub max_attempts: Option<u32>,
}

/// `[source.<kind>]`: exactly one kind.
// One per pipeline file, read once: the Kafka variant's size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum SourceSection {
    /// Deterministic generated records (tests, demos).
    Sequence(SequenceSection),
    /// A Kafka topic.
    Kafka(exactly_kafka::KafkaSourceConfig),
    /// A kind registered by the binary (see [`crate::plugins`]).
    Plugin(PluginSection),
}

/// `[source.sequence]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequenceSection {
    /// Number of splits.
    pub splits: usize,
    /// Records per split.
    pub records_per_split: i64,
    /// Records per poll (default 100).
    pub batch: Option<usize>,
    /// Pause before each poll (default 0s).
    pub delay_per_poll: Option<HumanDuration>,
}

/// `[sink.<kind>]`: exactly one kind.
#[derive(Clone, Debug)]
pub enum SinkSection {
    /// Two-phase-commit files.
    File(FileSection),
    /// Redis through an idempotent-sink strategy.
    Redis(exactly_redis::RedisSinkConfig),
    /// A PostgreSQL table.
    Postgres(exactly_postgres::PostgresSinkConfig),
    /// A Kafka topic, written in transactions.
    Kafka(exactly_kafka::KafkaSinkConfig),
    /// A kind registered by the binary (see [`crate::plugins`]).
    Plugin(PluginSection),
}

/// `[source.<kind>]` / `[sink.<kind>]` of a kind that is not built in: its
/// kind and its keys, read by the kind's registered config type when the
/// file is checked.
#[derive(Clone)]
pub struct PluginSection {
    /// The kind the section names.
    pub kind: String,
    /// The section's keys (secrets resolved).
    pub section: toml::Value,
}

/// A `[source]` or `[sink]` table that names no kind.
fn no_kind(what: &str) -> String {
    format!("names no kind: write one section such as [{what}.kafka]")
}

/// A `[source]` or `[sink]` table that names two kinds.
fn two_kinds(what: &str, first: &str, second: &str) -> String {
    format!("names two kinds, `{first}` and `{second}`: a pipeline has one {what}; keep one [{what}.<kind>] section")
}

/// `[source.<kind>]`: a built-in kind's section is read straight from the
/// file (toml's errors point at the very key); any other kind's is kept for
/// its registered config type ([`PluginSection`]).
impl<'de> Deserialize<'de> for SourceSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Kinds;
        impl<'de> serde::de::Visitor<'de> for Kinds {
            type Value = SourceSection;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("one [source.<kind>] section")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<SourceSection, A::Error> {
                use serde::de::Error;
                let kind: String = map.next_key()?.ok_or_else(|| A::Error::custom(no_kind("source")))?;
                let section = match kind.as_str() {
                    "sequence" => SourceSection::Sequence(map.next_value()?),
                    "kafka" => SourceSection::Kafka(map.next_value()?),
                    _ => SourceSection::Plugin(PluginSection {
                        section: map.next_value()?,
                        kind: kind.clone(),
                    }),
                };
                match map.next_key::<String>()? {
                    Some(other) => Err(A::Error::custom(two_kinds("source", &kind, &other))),
                    None => Ok(section),
                }
            }
        }
        d.deserialize_map(Kinds)
    }
}

/// `[sink.<kind>]`, read like [`SourceSection`].
impl<'de> Deserialize<'de> for SinkSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Kinds;
        impl<'de> serde::de::Visitor<'de> for Kinds {
            type Value = SinkSection;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("one [sink.<kind>] section")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<SinkSection, A::Error> {
                use serde::de::Error;
                let kind: String = map.next_key()?.ok_or_else(|| A::Error::custom(no_kind("sink")))?;
                let section = match kind.as_str() {
                    "file" => SinkSection::File(map.next_value()?),
                    "redis" => SinkSection::Redis(map.next_value()?),
                    "postgres" => SinkSection::Postgres(map.next_value()?),
                    "kafka" => SinkSection::Kafka(map.next_value()?),
                    _ => SinkSection::Plugin(PluginSection {
                        section: map.next_value()?,
                        kind: kind.clone(),
                    }),
                };
                match map.next_key::<String>()? {
                    Some(other) => Err(A::Error::custom(two_kinds("sink", &kind, &other))),
                    None => Ok(section),
                }
            }
        }
        d.deserialize_map(Kinds)
    }
}

/// Its keys may hold secrets: only the kind is shown.
impl std::fmt::Debug for PluginSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginSection")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// `[sink.file]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSection {
    /// Output folder.
    pub dir: PathBuf,
    /// `"lines"` (default) or `"json-lines"`.
    #[serde(default)]
    pub format: FileFormat,
}

/// A configuration problem, with the key it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML is malformed or a key is unknown or mistyped.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// toml's error, which names the key and line.
        source: toml::de::Error,
    },
    /// A value is out of range.
    #[error("{path}: `{key}` {problem}")]
    Invalid {
        /// The file.
        path: String,
        /// The key.
        key: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
}

impl PipelineFile {
    /// Reads and checks a pipeline file. Relative folders are resolved against the
    /// file's folder.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with(path, &Connectors::default())
    }

    /// [`load`](Self::load) for a binary with connectors of its own: the
    /// file may name their kinds, and their sections are checked by their
    /// config types.
    pub fn load_with(path: &Path, connectors: &Connectors) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut file = Self::parse_in(&text, &path.display().to_string(), Some(base), connectors)?;
        file.resolve_relative(base);
        file.base_dir = Some(base.to_path_buf());
        Ok(file)
    }

    /// Parses and checks TOML text; `origin` names it in errors. Relative
    /// `{ file = … }` paths are relative to the current folder.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::parse_with(text, origin, &Connectors::default())
    }

    /// [`parse`](Self::parse) for a binary with connectors of its own.
    pub fn parse_with(text: &str, origin: &str, connectors: &Connectors) -> Result<Self, ConfigError> {
        Self::parse_in(text, origin, None, connectors)
    }

    /// [`parse`](Self::parse), resolving `{ env = … }` / `{ file = … }`
    /// values (relative files against `base`).
    fn parse_in(text: &str, origin: &str, base: Option<&Path>, connectors: &Connectors) -> Result<Self, ConfigError> {
        let parse_error = |source: toml::de::Error| ConfigError::Parse {
            path: origin.to_string(),
            source,
        };
        let mut value: toml::Value = toml::from_str(text).map_err(parse_error)?;
        // Without references the file is read straight from its text, so
        // errors keep their line numbers.
        let mut file: PipelineFile = if secrets::has_references(&value) {
            secrets::resolve(&mut value, origin, base)?;
            value.try_into().map_err(parse_error)?
        } else {
            toml::from_str(text).map_err(parse_error)?
        };
        file.connectors = connectors.clone();
        file.check(origin)?;
        Ok(file)
    }

    fn resolve_relative(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.checkpoint.dir);
        match &mut self.sink {
            SinkSection::File(f) => fix(&mut f.dir),
            SinkSection::Redis(r) => {
                if let Some(d) = &mut r.spill_dir {
                    fix(d)
                }
            }
            // Their builders resolve their paths (PluginContext::resolve).
            SinkSection::Postgres(_) | SinkSection::Kafka(_) | SinkSection::Plugin(_) => {}
        }
    }

    fn check(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |key: &str, problem: &str| {
            Err(ConfigError::Invalid {
                path: origin.to_string(),
                key: key.to_string(),
                problem: problem.to_string(),
            })
        };
        if self.name.is_empty() || self.name.contains(['/', '\\']) || self.name.starts_with('.') {
            return invalid("name", "must be non-empty, contain no '/' and not start with '.'");
        }
        if self.parallelism == 0 {
            return invalid("parallelism", "must be at least 1");
        }
        if self.batch_size == 0 {
            return invalid("batch_size", "must be at least 1");
        }
        if self.checkpoint.interval.is_some_and(|d| d.0.is_zero()) {
            return invalid("checkpoint.interval", "must be greater than 0s");
        }
        if self.checkpoint.retain == 0 {
            return invalid("checkpoint.retain", "must be at least 1");
        }
        match &self.checkpoint.store {
            None if self.checkpoint.dir.as_os_str().is_empty() => {
                return invalid(
                    "checkpoint.dir",
                    "is missing: name the folder of the checkpoints, or set checkpoint.store = { postgres = \"…\" }",
                )
            }
            None => {}
            Some(StoreSection::Postgres(url)) => {
                if let Err(e) = exactly_store_postgres::PgCheckpointStore::new(url, &self.name, self.checkpoint.retain)
                {
                    return invalid("checkpoint.store.postgres", &crate::ops::redact::redact(&e.to_string()));
                }
            }
        }
        if let Some(workers) = &self.workers {
            if self.checkpoint.store.is_none() {
                return invalid(
                    "workers",
                    "needs a checkpoint store every worker reaches: set checkpoint.store = { postgres = \"…\" } \
                     (the folder store serves one process; drop [workers] to run the pipeline in one)",
                );
            }
            if self.failover != Failover::Region {
                return invalid(
                    "workers",
                    "shares the regions of failover = \"region\" (the default) among workers",
                );
            }
            if self.checkpoint.standby {
                return invalid(
                    "checkpoint.standby",
                    "is not needed with [workers]: a worker that owns no region is a hot standby already",
                );
            }
            if let Err(problem) = workers.settings().validate() {
                return invalid("workers", &problem);
            }
        }
        if let Some(s) = &self.restart.strategy {
            if !["exponential", "fixed", "none"].contains(&s.as_str()) {
                return invalid("restart.strategy", "must be \"exponential\", \"fixed\" or \"none\"");
            }
        }
        if self.restart.jitter.is_some_and(|j| !(0.0..=1.0).contains(&j)) {
            return invalid("restart.jitter", "must be between 0.0 and 1.0");
        }
        self.metrics.listen_address(origin)?;
        if self.metrics.lag_interval.is_some_and(|d| d.0.is_zero()) {
            return invalid("metrics.lag_interval", "must be greater than 0s");
        }
        if self.metrics.ready_max_checkpoint_age.is_some_and(|d| d.0.is_zero()) {
            return invalid("metrics.ready_max_checkpoint_age", "must be greater than 0s");
        }
        match &self.source {
            SourceSection::Sequence(s) if s.splits == 0 || s.records_per_split < 0 => {
                return invalid("source.sequence", "needs splits >= 1 and records_per_split >= 0");
            }
            SourceSection::Kafka(k) => {
                if let Err(e) = k.validate() {
                    return Err(ConfigError::Invalid {
                        path: origin.to_string(),
                        key: format!("source.kafka.{}", e.key),
                        problem: e.problem,
                    });
                }
            }
            SourceSection::Sequence(_) => {}
            SourceSection::Plugin(p) => {
                if let Err(problem) = self.connectors.check_source(&p.kind, p.section.clone()) {
                    // serde quotes values it refuses: passwords in URLs too.
                    return invalid(&format!("source.{}", p.kind), &crate::ops::redact::redact(&problem));
                }
            }
        }
        transforms::check(&self.transform, &self.sink, origin)?;
        match &self.sink {
            SinkSection::Postgres(p) => p.validate().map_err(|e| ConfigError::Invalid {
                path: origin.to_string(),
                key: "sink.postgres".into(),
                problem: exactly_core::ErrorChain(&e).to_string(),
            }),
            SinkSection::Redis(r) => exactly_redis::RedisSinkFactory::new(r.clone())
                .map(|_| ())
                .map_err(|e| ConfigError::Invalid {
                    path: origin.to_string(),
                    key: "sink.redis".into(),
                    problem: exactly_core::ErrorChain(&e).to_string(),
                }),
            SinkSection::Kafka(k) => k.validate().map_err(|e| ConfigError::Invalid {
                path: origin.to_string(),
                key: format!("sink.kafka.{}", e.key),
                problem: e.problem,
            }),
            SinkSection::File(_) => Ok(()),
            SinkSection::Plugin(p) => self
                .connectors
                .check_sink(&p.kind, p.section.clone())
                .or_else(|problem| invalid(&format!("sink.{}", p.kind), &crate::ops::redact::redact(&problem))),
        }
    }

    /// The core settings.
    pub fn pipeline_config(&self) -> PipelineConfig {
        let defaults = CheckpointConfig::default();
        let c = &self.checkpoint;
        let mut config = PipelineConfig::new(self.name.clone());
        config.guarantee = self.guarantee;
        config.parallelism = self.parallelism;
        config.failover = self.failover;
        config.batch_size = self.batch_size;
        config.allow_fingerprint_change = c.allow_fingerprint_change;
        config.allow_parallelism_change = c.allow_parallelism_change;
        config.allow_first_start = c.allow_first_start;
        config.allow_fallback = c.allow_fallback;
        config.standby = c.standby.then_some(STANDBY_POLL);
        config.workers = self.workers.as_ref().map(WorkersSection::settings);
        config.checkpoint = CheckpointConfig {
            interval: c.interval.map_or(defaults.interval, |d| d.0),
            min_pause: c.min_pause.map_or(defaults.min_pause, |d| d.0),
            timeout: c.timeout.map_or(defaults.timeout, |d| d.0),
            tolerable_failures: c.tolerable_failures.unwrap_or(defaults.tolerable_failures),
        };
        config.restart = self.restart_strategy();
        config
    }

    fn restart_strategy(&self) -> RestartStrategy {
        let r = &self.restart;
        let max_attempts = r.max_attempts.unwrap_or(10);
        match r.strategy.as_deref() {
            Some("none") => RestartStrategy::None,
            Some("fixed") => RestartStrategy::FixedDelay {
                delay: r.delay.map_or(Duration::from_secs(1), |d| d.0),
                max_attempts,
            },
            _ => RestartStrategy::ExponentialBackoff {
                initial: r.initial.map_or(Duration::from_millis(200), |d| d.0),
                max: r.max.map_or(Duration::from_secs(30), |d| d.0),
                multiplier: r.multiplier.unwrap_or(2.0),
                jitter: r.jitter.unwrap_or(0.2),
                max_attempts,
            },
        }
    }

    /// The folder store of this pipeline (its folder is named after the
    /// pipeline, see [`FsCheckpointStore::for_pipeline`]), whether or not
    /// `[checkpoint] store` names another one.
    pub fn store(&self) -> FsCheckpointStore {
        FsCheckpointStore::new(&self.checkpoint.dir, &self.name, self.checkpoint.retain)
    }

    /// The checkpoint store the pipeline runs on: `[checkpoint] store`, or
    /// the folder store under `dir`. Connects to nothing yet.
    pub fn checkpoint_store(&self) -> Result<Arc<dyn CheckpointStore>, exactly_store_postgres::ConfigError> {
        Ok(match &self.checkpoint.store {
            None => Arc::new(self.store()),
            Some(StoreSection::Postgres(url)) => Arc::new(exactly_store_postgres::PgCheckpointStore::new(
                url,
                &self.name,
                self.checkpoint.retain,
            )?),
        })
    }

    /// Builds the pipeline.
    pub fn build(&self) -> Result<Pipeline, exactly_core::PipelineError> {
        self.build_parts().map(|built| built.pipeline)
    }

    /// Builds the pipeline, keeping the connector factories whose own
    /// counters the metrics endpoint exports.
    pub fn build_parts(&self) -> Result<Built, exactly_core::PipelineError> {
        let mut kafka_source = None;
        let source: Arc<dyn SourceFactory> = match &self.source {
            SourceSection::Sequence(s) => Arc::new(SequenceSourceFactory {
                splits: s.splits,
                records_per_split: s.records_per_split,
                batch: s.batch.unwrap_or(100),
                delay_per_poll: s.delay_per_poll.map_or(Duration::ZERO, |d| d.0),
            }),
            SourceSection::Kafka(k) => {
                let factory = Arc::new(
                    exactly_kafka::KafkaSourceFactory::new(&self.name, k.clone())
                        .map_err(exactly_core::PipelineError::connector_config)?,
                );
                kafka_source = Some(factory.clone());
                factory
            }
            SourceSection::Plugin(p) => self
                .connectors
                .build_source(&p.kind, p.section.clone(), &self.plugin_context())
                .map_err(exactly_core::PipelineError::connector_config)?,
        };
        let (sink, kafka_sink) = self.sink_factory()?;
        let store = self
            .checkpoint_store()
            .map_err(exactly_core::PipelineError::connector_config)?;
        let transforms = transforms::build(&self.transform, "the pipeline file")
            .map_err(exactly_core::PipelineError::connector_config)?;
        let pipeline =
            Pipeline::new(self.pipeline_config(), source, sink.clone(), store)?.with_transforms(transforms)?;
        Ok(Built {
            pipeline,
            sink,
            kafka_source,
            kafka_sink,
        })
    }

    /// The sink's factory (and, for a Kafka sink, its typed form). Checks
    /// the settings; connects to nothing.
    #[allow(clippy::type_complexity)]
    pub fn sink_factory(
        &self,
    ) -> Result<(Arc<dyn SinkFactory>, Option<Arc<exactly_kafka::KafkaSinkFactory>>), exactly_core::PipelineError> {
        let mut kafka_sink = None;
        let sink: Arc<dyn SinkFactory> = match &self.sink {
            SinkSection::File(f) => Arc::new(FileSinkFactory {
                dir: f.dir.clone(),
                format: f.format,
            }),
            SinkSection::Redis(r) => exactly_redis::RedisSinkFactory::new(r.clone())
                .map_err(exactly_core::PipelineError::connector_config)?
                .into_sink_factory(),
            SinkSection::Postgres(p) => Arc::new(
                exactly_postgres::PostgresSinkFactory::new(p.clone())
                    .map_err(exactly_core::PipelineError::connector_config)?,
            ),
            SinkSection::Kafka(k) => {
                let factory = Arc::new(
                    exactly_kafka::KafkaSinkFactory::new(&self.name, k.clone())
                        .map_err(exactly_core::PipelineError::connector_config)?
                        .with_checkpoint_interval(self.pipeline_config().checkpoint.interval),
                );
                kafka_sink = Some(factory.clone());
                factory
            }
            SinkSection::Plugin(p) => self
                .connectors
                .build_sink(&p.kind, p.section.clone(), &self.plugin_context())
                .map_err(exactly_core::PipelineError::connector_config)?,
        };
        Ok((sink, kafka_sink))
    }

    /// What a registered builder gets besides its section.
    fn plugin_context(&self) -> PluginContext {
        PluginContext::new(&self.name, self.base_dir.as_deref())
    }
}

#[cfg(test)]
impl PipelineFile {
    fn load_text_for_test(text: &str, base: &Path) -> Result<Self, String> {
        Self::parse_in(text, "p.toml", Some(base), &Connectors::default()).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "p"
parallelism = 2
[checkpoint]
dir = "ck"
interval = "250ms"
[source.sequence]
splits = 2
records_per_split = 10
[sink.file]
dir = "out"
"#;

    #[test]
    fn columns_keep_the_files_order_also_when_the_file_holds_references() {
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::set_var("EXACTLY_CONFIG_TEST_ORDER_URL", "postgres://app:pg-secret@db/app") };
        let sink = |url: &str| {
            format!(
                "[sink.postgres]\nurl = {url}\ntable = \"t\"\n[sink.postgres.columns]\n\
                 zeta = {{ from = \"/z\", type = \"text\" }}\nalpha = {{ from = \"/a\", type = \"bigint\" }}\n\
                 mid = {{ from = \"offset\", type = \"bigint\" }}\n"
            )
        };
        for url in [
            "\"postgres://app@db/app\"",
            "{ env = \"EXACTLY_CONFIG_TEST_ORDER_URL\" }",
        ] {
            let text = GOOD.replace("[sink.file]\ndir = \"out\"\n", &sink(url));
            let file = PipelineFile::parse(&text, "p.toml").unwrap();
            let SinkSection::Postgres(pg) = &file.sink else {
                panic!("a postgres sink")
            };
            let names: Vec<&str> = pg.columns.0.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["zeta", "alpha", "mid"], "url = {url}");
        }
    }

    #[test]
    fn the_checkpoint_store_is_a_folder_or_a_postgres_database_whose_url_may_be_a_secret() {
        let folder = PipelineFile::parse(GOOD, "p.toml").unwrap();
        assert!(folder.checkpoint.store.is_none());
        assert!(folder.checkpoint_store().unwrap().location().ends_with("ck/p"));
        // SAFETY: no other test reads or writes this variable.
        unsafe {
            std::env::set_var(
                "EXACTLY_CONFIG_TEST_STORE_URL",
                "postgres://app:store-secret@db:5433/ck",
            )
        };
        let text = GOOD.replace(
            "dir = \"ck\"",
            "store = { postgres = { env = \"EXACTLY_CONFIG_TEST_STORE_URL\" } }",
        );
        let pg = PipelineFile::parse(&text, "p.toml").unwrap();
        assert!(matches!(&pg.checkpoint.store, Some(StoreSection::Postgres(url)) if url.contains("store-secret")));
        let debug = format!("{pg:?}");
        assert!(!debug.contains("store-secret"), "{debug}");
        let location = pg.checkpoint_store().unwrap().location();
        assert!(location.starts_with("postgres://app@db:5433/ck"), "{location}");
        let e = PipelineFile::parse(&GOOD.replace("dir = \"ck\"\n", ""), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("checkpoint.dir") && e.contains("checkpoint.store"), "{e}");
        let e = PipelineFile::parse(
            &GOOD.replace(
                "dir = \"ck\"",
                "store = { postgres = \"postgres://db/x?sslmode=maybe\" }",
            ),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("checkpoint.store.postgres") && e.contains("sslmode=maybe"),
            "{e}"
        );
        let e = PipelineFile::parse(&GOOD.replace("dir = \"ck\"", "store = { redis = \"x\" }"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("redis"), "{e}");
    }

    #[test]
    fn a_good_file_parses() {
        let f = PipelineFile::parse(GOOD, "p.toml").unwrap();
        let c = f.pipeline_config();
        assert_eq!(c.checkpoint.interval, Duration::from_millis(250));
        assert_eq!(c.guarantee, Guarantee::ExactlyOnce);
    }

    /// The shape the project's documentation promises.
    #[test]
    fn the_kafka_to_postgres_example_parses() {
        let text = r#"
name = "orders-to-pg"
guarantee = "exactly-once"
parallelism = 2

[checkpoint]
dir = "/var/lib/exactly/checkpoints"
interval = "1s"

[source.kafka]
bootstrap = "127.0.0.1:9092"
topic = "orders"
start = "earliest"

[sink.postgres]
url = "postgres://postgres@127.0.0.1:5432/postgres"
table = "orders"
create_table = true

[sink.postgres.columns]
part = { from = "partition", type = "int" }
off = { from = "offset", type = "bigint" }
id = { from = "/id", type = "bigint" }
payload = { from = "value", type = "jsonb" }
"#;
        let f = PipelineFile::parse(text, "orders.toml").unwrap();
        assert!(matches!(f.source, SourceSection::Kafka(_)));
        assert!(matches!(f.sink, SinkSection::Postgres(_)));
        let e = PipelineFile::parse(&text.replace("\"bigint\" }\nid", "\"bignum\" }\nid"), "orders.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bignum"), "{e}");
        let e = PipelineFile::parse(&text.replace("topic = \"orders\"", "topik = \"orders\""), "orders.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("topik"), "{e}");
    }

    #[test]
    fn the_metrics_section_is_checked() {
        let f = PipelineFile::parse(&format!("{GOOD}[metrics]\nlisten = \"127.0.0.1:9464\"\n"), "p.toml").unwrap();
        assert_eq!(
            f.metrics.listen_address("p.toml").unwrap(),
            Some("127.0.0.1:9464".parse().unwrap())
        );
        let e = PipelineFile::parse(&format!("{GOOD}[metrics]\nlisten = \"localhost\"\n"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics.listen") && e.contains("127.0.0.1:9464"), "{e}");
        let e = PipelineFile::parse(&format!("{GOOD}[metrics]\nlag_interval = \"0s\"\n"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics.lag_interval"), "{e}");
        let e = PipelineFile::parse(&format!("{GOOD}[metrics]\nlisen = \"x\"\n"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lisen"), "{e}");
    }

    #[test]
    fn secrets_come_from_the_environment_or_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kafka-password"), "kafka-file-secret\n").unwrap();
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::set_var("EXACTLY_CONFIG_TEST_PG_URL", "postgres://app:pg-env-secret@db/shop") };
        let text = r#"
name = "p"
[checkpoint]
dir = "ck"
[source.kafka]
bootstrap = "127.0.0.1:9093"
topic = "orders"
properties = { "security.protocol" = "SASL_SSL", "sasl.mechanism" = "SCRAM-SHA-512", "sasl.username" = "exactly", "sasl.password" = { file = "kafka-password" } }
[sink.postgres]
url = { env = "EXACTLY_CONFIG_TEST_PG_URL" }
table = "orders"
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
"#;
        let path = dir.path().join("p.toml");
        std::fs::write(&path, text).unwrap();
        let file = PipelineFile::load(&path).unwrap();
        let SourceSection::Kafka(kafka) = &file.source else {
            panic!("a Kafka source")
        };
        assert_eq!(kafka.properties["sasl.password"], "kafka-file-secret");
        let SinkSection::Postgres(pg) = &file.sink else {
            panic!("a PostgreSQL sink")
        };
        assert_eq!(pg.url, "postgres://app:pg-env-secret@db/shop");
        let debug = format!("{file:?}");
        assert!(
            !debug.contains("kafka-file-secret") && !debug.contains("pg-env-secret"),
            "{debug}"
        );

        // Against the pipeline file's folder, so that the file reference
        // resolves and the unset variable is the one error.
        let e = PipelineFile::load_text_for_test(
            &text.replace("EXACTLY_CONFIG_TEST_PG_URL", "EXACTLY_CONFIG_TEST_UNSET"),
            dir.path(),
        )
        .unwrap_err();
        assert!(
            e.contains("sink.postgres.url") && e.contains("EXACTLY_CONFIG_TEST_UNSET"),
            "{e}"
        );
        // Unknown keys are still named when the file has references.
        let e = PipelineFile::load_text_for_test(&text.replace("table =", "tabel ="), dir.path()).unwrap_err();
        assert!(e.contains("tabel"), "{e}");
    }

    #[test]
    fn transforms_are_checked_against_the_sink_and_join_the_fingerprint() {
        let route = "[[transform]]\ntype = \"route\"\nfield = \"/region\"\n";
        let e = PipelineFile::parse(&format!("{GOOD}{route}"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("transform[0].type") && e.contains("table = \"${topic}\""),
            "{e}"
        );
        let e = PipelineFile::parse(
            &format!("{GOOD}[[transform]]\ntype = \"drop\"\nfeld = \"/a\"\n"),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("feld"), "{e}");
        let e = PipelineFile::parse(
            &format!("{GOOD}[[transform]]\ntype = \"drop\"\nfield = \"/a\"\non_error = \"ignore\"\n"),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("ignore") && e.contains("dead-letter"), "{e}");
        let plain = PipelineFile::parse(GOOD, "p.toml").unwrap().build().unwrap();
        let text = format!(
            "{GOOD}[[transform]]\ntype = \"drop-if\"\nfield = \"/status\"\nequals = \"test\"\non_error = \"dead-letter\"\n"
        );
        let transformed = PipelineFile::parse(&text, "p.toml").unwrap().build().unwrap();
        assert!(plain.descriptor().transforms.is_empty());
        assert_eq!(
            transformed.descriptor().transforms,
            ["filter:transform[0] drop if /status = \"test\",on_error=dead-letter"]
        );
    }

    /// The README's example of `[[transform]]` parses and builds.
    #[test]
    fn the_readme_transforms_example_parses() {
        let readme = include_str!("../README.md");
        let section = &readme[readme.find("#### Transforms").expect("the section")..];
        let start = section.find("```toml\n").expect("an example") + "```toml\n".len();
        let example = &section[start..start + section[start..].find("```").unwrap()];
        let file = PipelineFile::parse(example, "README.md").unwrap();
        assert_eq!(file.transform.len(), 6);
        let pipeline = file.build().unwrap();
        assert_eq!(pipeline.descriptor().transforms.len(), 6);
    }

    #[test]
    fn errors_name_the_key() {
        let e = PipelineFile::parse(&GOOD.replace("interval", "intervall"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("intervall"), "{e}");
        let e = PipelineFile::parse(&GOOD.replace("\"250ms\"", "\"soon\""), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("soon") && e.contains("duration"), "{e}");
        let e = PipelineFile::parse(&GOOD.replace("parallelism = 2", "parallelism = 0"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`parallelism` must be at least 1"), "{e}");
        let e = PipelineFile::parse(&format!("guarantee = \"maybe-once\"\n{GOOD}"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("maybe-once"), "{e}");
    }
}
