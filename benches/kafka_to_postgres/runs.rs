//! Which runs the bench makes, in which order, with which settings
//! (`EXACTLY_BENCH_*`).

use anyhow::{anyhow, bail, Context, Result};

use crate::changes::Changes;
use crate::workload::{TableShape, PARTITIONS};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    MinimalLoop,
    RawCopy,
    /// librdkafka consumers alone.
    RawConsume,
    /// exactly-kafka-wire fetchers alone: the source's ceiling.
    RawFetch,
    ExactlyOnce,
    AtLeastOnce,
    RedisFenced,
    PostgresFenced,
    /// The hand-written exactly-once loop of issue 15 (`hand_loop.rs`).
    HandLoop,
    /// The exactly-once pipeline into the hand loop's table (key and value
    /// as text, no JSON): the same work as the hand loop.
    ExactlyOnceKeyValue,
    /// Diagnostic, only on request: the exactly-once pipeline without
    /// partition discovery, to show what the discovery's waits cost.
    ExactlyOnceNoDiscovery,
    /// The exactly-once pipeline upserting by record key with deletes
    /// (`pk.mode = "record_key"`, `delete.enabled`), over the keyed topic
    /// of `changes.rs`.
    ExactlyOnceUpserts,
    /// The exactly-once pipeline reading Debezium change events
    /// (`format = "debezium"`), over the Debezium topic of `changes.rs`.
    ExactlyOnceDebezium,
}

impl Kind {
    /// The default runs, in order: every row once, then the three rows the
    /// targets compare twice more, interleaved, so that the targets compare
    /// means of three and the table shows how much a single run varies.
    pub const DEFAULT: [Kind; 22] = [
        Kind::MinimalLoop,
        Kind::RawCopy,
        Kind::RawFetch,
        Kind::RawConsume,
        Kind::HandLoop,
        Kind::ExactlyOnce,
        Kind::ExactlyOnceKeyValue,
        Kind::AtLeastOnce,
        Kind::RedisFenced,
        Kind::PostgresFenced,
        Kind::ExactlyOnceUpserts,
        Kind::ExactlyOnceDebezium,
        Kind::MinimalLoop,
        Kind::HandLoop,
        Kind::ExactlyOnce,
        Kind::ExactlyOnceKeyValue,
        Kind::AtLeastOnce,
        Kind::MinimalLoop,
        Kind::HandLoop,
        Kind::ExactlyOnce,
        Kind::ExactlyOnceKeyValue,
        Kind::AtLeastOnce,
    ];
    /// Every run `EXACTLY_BENCH_RUNS` can name.
    pub const ANY: [Kind; 13] = [
        Kind::MinimalLoop,
        Kind::RawCopy,
        Kind::RawFetch,
        Kind::RawConsume,
        Kind::HandLoop,
        Kind::ExactlyOnce,
        Kind::ExactlyOnceKeyValue,
        Kind::AtLeastOnce,
        Kind::RedisFenced,
        Kind::PostgresFenced,
        Kind::ExactlyOnceNoDiscovery,
        Kind::ExactlyOnceUpserts,
        Kind::ExactlyOnceDebezium,
    ];

    pub fn id(self) -> &'static str {
        match self {
            Kind::MinimalLoop => "loop",
            Kind::RawCopy => "copy",
            Kind::RawConsume => "consume",
            Kind::RawFetch => "fetch",
            Kind::ExactlyOnce => "eo",
            Kind::AtLeastOnce => "alo",
            Kind::RedisFenced => "redis",
            Kind::PostgresFenced => "pg-fenced",
            Kind::ExactlyOnceNoDiscovery => "eo-no-discovery",
            Kind::HandLoop => "hand",
            Kind::ExactlyOnceKeyValue => "eo-kv",
            Kind::ExactlyOnceUpserts => "eo-upsert",
            Kind::ExactlyOnceDebezium => "eo-debezium",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::ExactlyOnce => "exactly, exactly-once (two-phase)",
            Kind::AtLeastOnce => "exactly, at-least-once",
            Kind::RawCopy => "raw binary COPY, 2 connections (sink ceiling)",
            Kind::RawConsume => "raw librdkafka consume, 2 consumers",
            Kind::RawFetch => "raw fetch, 2 fetchers (source ceiling)",
            Kind::MinimalLoop => "minimal fetch → COPY loop ×2 (machine ceiling)",
            Kind::RedisFenced => "exactly, Redis HINCRBY fenced",
            Kind::PostgresFenced => "exactly, PostgreSQL mode = \"fenced\"",
            Kind::ExactlyOnceNoDiscovery => "exactly, exactly-once, partition discovery off (diagnostic)",
            Kind::HandLoop => "hand-written exactly-once loop ×2 (key, value as text)",
            Kind::ExactlyOnceKeyValue => "exactly, exactly-once, the hand loop's table (key, value as text)",
            Kind::ExactlyOnceUpserts => "exactly, exactly-once, upserts by key with 10 % deletes",
            Kind::ExactlyOnceDebezium => "exactly, exactly-once, Debezium change events (c/u/d, tombstones)",
        }
    }

    /// Runs of `exactly run`; the others are baselines of this bench.
    pub fn is_pipeline(self) -> bool {
        matches!(
            self,
            Kind::ExactlyOnce
                | Kind::AtLeastOnce
                | Kind::RedisFenced
                | Kind::PostgresFenced
                | Kind::ExactlyOnceNoDiscovery
                | Kind::ExactlyOnceKeyValue
                | Kind::ExactlyOnceUpserts
                | Kind::ExactlyOnceDebezium
        )
    }

    /// The keyed workload the run reads, if it reads one (else the orders
    /// of `TOPIC`).
    pub fn changes(self) -> Option<Changes> {
        match self {
            Kind::ExactlyOnceUpserts => Some(Changes::Upserts),
            Kind::ExactlyOnceDebezium => Some(Changes::Debezium),
            _ => None,
        }
    }

    /// The table the run writes (for the runs that write PostgreSQL).
    pub fn table_shape(self) -> TableShape {
        match self {
            Kind::HandLoop | Kind::ExactlyOnceKeyValue => TableShape::KeyValue,
            Kind::ExactlyOnceUpserts | Kind::ExactlyOnceDebezium => TableShape::Keyed,
            _ => TableShape::Orders,
        }
    }

    pub fn writes_postgres(self) -> bool {
        !matches!(self, Kind::RawConsume | Kind::RawFetch | Kind::RedisFenced)
    }

    /// Runs with a latency phase (the raw COPY, consume and fetch have no end to end).
    pub fn has_latency(self) -> bool {
        !matches!(
            self,
            Kind::RawCopy
                | Kind::RawConsume
                | Kind::RawFetch
                | Kind::ExactlyOnceNoDiscovery
                | Kind::ExactlyOnceUpserts
                | Kind::ExactlyOnceDebezium
        )
    }
}

pub struct Settings {
    pub records: u64,
    pub latency_rate: u64,
    pub latency_secs: u64,
    /// Pipelines end by `stop_at_end` instead of SIGTERM.
    pub stop_at_end: bool,
    pub kinds: Vec<Kind>,
    /// `linger.ms` of the producer that preloads the topic.
    pub preload_linger_ms: u64,
}

impl Settings {
    pub fn from_env() -> Result<Settings> {
        let records = env_u64("EXACTLY_BENCH_RECORDS", 1_000_000)?;
        if records < PARTITIONS as u64 {
            bail!("EXACTLY_BENCH_RECORDS={records} is too small: use at least {PARTITIONS}, one record per partition");
        }
        let kinds = match std::env::var("EXACTLY_BENCH_RUNS") {
            Ok(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    Kind::ANY.into_iter().find(|k| k.id() == s).ok_or_else(|| {
                        let ids: Vec<&str> = Kind::ANY.iter().map(|k| k.id()).collect();
                        anyhow!(
                            "EXACTLY_BENCH_RUNS: unknown run `{s}`; use a comma-separated list of {}",
                            ids.join(",")
                        )
                    })
                })
                .collect::<Result<Vec<Kind>>>()?,
            Err(_) => Kind::DEFAULT.to_vec(),
        };
        if std::env::var_os("EXACTLY_BENCH_BROKER_STORAGE").is_some() {
            bail!(
                "EXACTLY_BENCH_BROKER_STORAGE is gone: the bench runs on Apache Kafka now, which has one storage; \
                 unset it"
            );
        }
        let stop_at_end = std::env::var("EXACTLY_BENCH_STOP_AT_END").map_or(true, |v| v != "0");
        Ok(Settings {
            records,
            latency_rate: env_u64("EXACTLY_BENCH_LATENCY_RATE", 2000)?.max(1),
            latency_secs: env_u64("EXACTLY_BENCH_LATENCY_SECS", 20)?,
            stop_at_end,
            kinds,
            preload_linger_ms: env_u64("EXACTLY_BENCH_PRELOAD_LINGER_MS", 20)?,
        })
    }
}

pub fn env_u64(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .replace('_', "")
            .parse()
            .with_context(|| format!("{name}={v} is not a whole number: set it to one, like 1000000 or 1_000_000")),
        Err(_) => Ok(default),
    }
}
