//! The services every run uses, from the test kit: an Apache Kafka broker
//! of the bench's own (or the external Kafka of `EXACTLY_KAFKA_BOOTSTRAP`),
//! PostgreSQL and Redis; and the few SQL statements the bench runs itself.

use std::process::Command;

use anyhow::{Context, Result};
use exactly_testkit::kafka::{KAFKA_BOOTSTRAP_ENV, KAFKA_VERSION};
use exactly_testkit::{KafkaBroker, PostgresServer, RedisServer};

use crate::hand_loop::offsets_table;
use crate::workload::{create_table_sql, TableShape};

/// The broker JVM's heap (`-Xms` = `-Xmx`). Kafka keeps records in the page
/// cache, not on the heap: the 1M-record topic (about 130 MB on disk) and
/// the fetch and produce buffers of every run fit many times over.
pub const BROKER_HEAP: &str = "1g";

pub struct Services {
    /// A broker the bench started; `None` with an external Kafka.
    own_kafka: Option<KafkaBroker>,
    external_kafka: Option<&'static KafkaBroker>,
    pub postgres: PostgresServer,
    pub redis: RedisServer,
}

impl Services {
    pub fn start() -> Result<Services> {
        let (own_kafka, external_kafka) = if std::env::var_os(KAFKA_BOOTSTRAP_ENV).is_some() {
            eprintln!("[bench] using the external Kafka of {KAFKA_BOOTSTRAP_ENV}");
            (None, Some(KafkaBroker::shared()?))
        } else {
            eprintln!("[bench] starting Apache Kafka {KAFKA_VERSION} (heap {BROKER_HEAP}), PostgreSQL and Redis");
            (Some(KafkaBroker::builder().heap(BROKER_HEAP).start()?), None)
        };
        Ok(Services {
            own_kafka,
            external_kafka,
            postgres: PostgresServer::start()?,
            redis: RedisServer::start()?,
        })
    }

    pub fn kafka(&self) -> &KafkaBroker {
        match (&self.own_kafka, self.external_kafka) {
            (Some(own), _) => own,
            (None, Some(external)) => external,
            (None, None) => unreachable!("Services::start sets one of them"),
        }
    }

    /// The broker's JVM, when the bench started it.
    pub fn broker_pid(&self) -> Option<u32> {
        self.own_kafka.as_ref().and_then(KafkaBroker::pid)
    }

    /// What the broker is, for the report: version, heap and Java runtime
    /// (the JVM's own executable asked for its version).
    pub fn describe_broker(&self) -> String {
        let Some(pid) = self.broker_pid() else {
            return format!("external Kafka at {} ({KAFKA_BOOTSTRAP_ENV})", self.kafka().bootstrap());
        };
        let java = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .and_then(|exe| Command::new(exe).arg("-version").output().ok())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .next()
                    .map(|l| l.trim().to_string())
            })
            .unwrap_or_else(|| "Java version unknown".into());
        format!("Apache Kafka {KAFKA_VERSION} (test kit: one KRaft node, JVM -Xms/-Xmx {BROKER_HEAP}; {java})")
    }
}

pub async fn pg_connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to PostgreSQL at {url}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("postgres connection ended: {e}");
        }
    });
    Ok(client)
}

/// The bench's own PostgreSQL connection, driven by its own runtime.
pub struct Pg {
    pub rt: tokio::runtime::Runtime,
    pub client: tokio_postgres::Client,
}

impl Pg {
    pub fn connect(url: &str) -> Result<Pg> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let client = rt.block_on(pg_connect(url))?;
        Ok(Pg { rt, client })
    }

    pub fn execute(&self, sql: &str) -> Result<()> {
        self.rt
            .block_on(self.client.batch_execute(sql))
            .with_context(|| format!("running `{sql}`"))
    }

    pub fn fresh_table(&self, table: &str, shape: TableShape) -> Result<()> {
        self.execute(&format!(
            "DROP TABLE IF EXISTS {table}, {table}_dead_letters, {}; {}",
            offsets_table(table),
            create_table_sql(table, shape)
        ))
    }

    /// Drops a run's tables (the hand loop's offsets too) and flushes
    /// PostgreSQL's dirty pages, so every run starts from the same state.
    pub fn cleanup_table(&self, table: &str) -> Result<()> {
        self.execute(&format!(
            "DROP TABLE IF EXISTS {table}, {table}_dead_letters, {}; CHECKPOINT",
            offsets_table(table)
        ))
    }

    pub fn server_version(&self) -> Result<String> {
        Ok(self
            .rt
            .block_on(self.client.query_one("SHOW server_version", &[]))?
            .get(0))
    }
}

/// The counters of the Redis hash `hash`, one per partition of `topic`.
pub fn redis_counts(url: &str, hash: &str, topic: &str) -> Result<Vec<Option<i64>>> {
    let mut con = redis::Client::open(url)?.get_connection()?;
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(hash);
    for p in 0..crate::workload::PARTITIONS {
        cmd.arg(format!("{topic}-{p}"));
    }
    Ok(cmd.query(&mut con)?)
}
