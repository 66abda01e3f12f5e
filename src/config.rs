//! The TOML pipeline file read by `exactly run`.
//!
//! Every key is checked: an unknown key, a wrong type or a bad value is reported
//! with its name. Any string value may come from the environment or a file
//! (`{ env = "NAME" }`, `{ file = "/run/secrets/name" }`; see [`secrets`]).

pub mod secrets;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use exactly_core::{
    CheckpointConfig, Failover, FsCheckpointStore, Guarantee, Pipeline, PipelineConfig, RestartStrategy,
    SequenceSourceFactory, SinkFactory, SourceFactory,
};
use exactly_file::{FileFormat, FileSinkFactory};
use serde::Deserialize;

/// The `[source.kafka]` and `[sink.postgres]` sections of the orders pipeline
/// the README documents: a bounded read of `topic` from the beginning into
/// `table` (created when absent) with the partition, offset, `/id` and the
/// JSON value as columns. Used by `exactly demo` and the end-to-end tests.
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

/// A duration written like `"1s"`, `"250ms"`, `"2m"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map(HumanDuration).map_err(|e| {
            serde::de::Error::custom(format!("`{s}` is not a duration ({e}); write e.g. \"1s\" or \"250ms\""))
        })
    }
}

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
    /// `[metrics]`: the Prometheus and health endpoint.
    #[serde(default)]
    pub metrics: MetricsSection,
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
    /// Root folder of the checkpoint store.
    pub dir: PathBuf,
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
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceSection {
    /// Deterministic generated records (tests, demos).
    Sequence(SequenceSection),
    /// A Kafka topic.
    Kafka(exactly_kafka::KafkaSourceConfig),
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
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SinkSection {
    /// Two-phase-commit files.
    File(FileSection),
    /// Redis through an idempotent-sink strategy.
    Redis(exactly_redis::RedisSinkConfig),
    /// A PostgreSQL table.
    Postgres(exactly_postgres::PostgresSinkConfig),
    /// A Kafka topic, written in transactions.
    Kafka(exactly_kafka::KafkaSinkConfig),
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
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// toml's message, which names the key and line.
        message: String,
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
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut file = Self::parse_in(&text, &path.display().to_string(), Some(base))?;
        file.resolve_relative(base);
        Ok(file)
    }

    /// Parses and checks TOML text; `origin` names it in errors. Relative
    /// `{ file = … }` paths are relative to the current folder.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::parse_in(text, origin, None)
    }

    /// [`parse`](Self::parse), resolving `{ env = … }` / `{ file = … }`
    /// values (relative files against `base`).
    fn parse_in(text: &str, origin: &str, base: Option<&Path>) -> Result<Self, ConfigError> {
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        };
        let mut value: toml::Value = toml::from_str(text).map_err(parse_error)?;
        // Without references the file is read straight from its text, so
        // errors keep their line numbers.
        let file: PipelineFile = if secrets::has_references(&value) {
            secrets::resolve(&mut value, origin, base)?;
            value.try_into().map_err(parse_error)?
        } else {
            toml::from_str(text).map_err(parse_error)?
        };
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
            SinkSection::Postgres(_) | SinkSection::Kafka(_) => {}
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
        }
        match &self.sink {
            SinkSection::Postgres(p) => p.validate().map_err(|e| ConfigError::Invalid {
                path: origin.to_string(),
                key: "sink.postgres".into(),
                problem: e.to_string(),
            }),
            SinkSection::Redis(r) => exactly_redis::RedisSinkFactory::new(r.clone())
                .map(|_| ())
                .map_err(|e| ConfigError::Invalid {
                    path: origin.to_string(),
                    key: "sink.redis".into(),
                    problem: e.to_string(),
                }),
            SinkSection::Kafka(k) => k.validate().map_err(|e| ConfigError::Invalid {
                path: origin.to_string(),
                key: format!("sink.kafka.{}", e.key),
                problem: e.problem,
            }),
            SinkSection::File(_) => Ok(()),
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

    /// The checkpoint store of this pipeline (its folder is named after the
    /// pipeline, see [`FsCheckpointStore::for_pipeline`]).
    pub fn store(&self) -> FsCheckpointStore {
        FsCheckpointStore::new(&self.checkpoint.dir, &self.name, self.checkpoint.retain)
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
                        .map_err(|e| exactly_core::PipelineError::Config(e.to_string()))?,
                );
                kafka_source = Some(factory.clone());
                factory
            }
        };
        let (sink, kafka_sink) = self.sink_factory()?;
        let pipeline = Pipeline::new(self.pipeline_config(), source, sink.clone(), Arc::new(self.store()))?;
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
                .map_err(|e| exactly_core::PipelineError::Config(e.to_string()))?
                .into_sink_factory(),
            SinkSection::Postgres(p) => Arc::new(
                exactly_postgres::PostgresSinkFactory::new(p.clone())
                    .map_err(|e| exactly_core::PipelineError::Config(e.to_string()))?,
            ),
            SinkSection::Kafka(k) => {
                let factory = Arc::new(
                    exactly_kafka::KafkaSinkFactory::new(&self.name, k.clone())
                        .map_err(|e| exactly_core::PipelineError::Config(e.to_string()))?
                        .with_checkpoint_interval(self.pipeline_config().checkpoint.interval),
                );
                kafka_sink = Some(factory.clone());
                factory
            }
        };
        Ok((sink, kafka_sink))
    }
}

#[cfg(test)]
impl PipelineFile {
    fn load_text_for_test(text: &str, base: &Path) -> Result<Self, String> {
        Self::parse_in(text, "p.toml", Some(base)).map_err(|e| e.to_string())
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

        let e = PipelineFile::parse(
            &text.replace("EXACTLY_CONFIG_TEST_PG_URL", "EXACTLY_CONFIG_TEST_UNSET"),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("sink.postgres.url") && e.contains("EXACTLY_CONFIG_TEST_UNSET"),
            "{e}"
        );
        // Unknown keys are still named when the file has references.
        let e = PipelineFile::load_text_for_test(&text.replace("table =", "tabel ="), dir.path()).unwrap_err();
        assert!(e.contains("tabel"), "{e}");
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
