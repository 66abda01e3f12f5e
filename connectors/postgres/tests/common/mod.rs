//! Helpers shared by the integration tests: a real PostgreSQL from
//! exactly-testkit, sinks built from TOML, and queries that check outcomes.

#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset; helpers, not an API

use std::sync::{Arc, Mutex, Weak};

use exactly_core::{CheckpointId, ConnectorError, Metrics, Record, SinkContext, TwoPhaseCommitSink};
use exactly_postgres::{PostgresCommittable, PostgresSink, PostgresSinkConfig, PostgresSinkFactory};
use exactly_testkit::PostgresServer;
use serde::Deserialize;
use tokio_postgres::{Client, NoTls};

static SHARED: Mutex<Weak<PostgresServer>> = Mutex::new(Weak::new());

/// A server shared by the tests that run at the same time; it stops when
/// the last of them drops its handle.
pub fn shared_server() -> Arc<PostgresServer> {
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(server) = shared.upgrade() {
        return server;
    }
    let server = Arc::new(PostgresServer::start().expect("start PostgreSQL"));
    *shared = Arc::downgrade(&server);
    server
}

/// A plain client for checking what the sink did.
pub async fn client(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
}

/// A name no other test (or earlier run against the same server) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{:08x}", rand::random::<u32>())
}

#[derive(Deserialize)]
struct File {
    sink: Section,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Section {
    Postgres(PostgresSinkConfig),
}

/// Parses a `[sink.postgres]` section: `url` and `table` plus `body` (more
/// keys, then the columns table).
pub fn config(url: &str, table: &str, body: &str) -> PostgresSinkConfig {
    let text = format!("[sink.postgres]\nurl = {url:?}\ntable = {table:?}\n{body}");
    let file: File = toml::from_str(&text).unwrap_or_else(|e| panic!("bad test config: {e}\n{text}"));
    let Section::Postgres(config) = file.sink;
    config
}

pub fn context(pipeline: &str, subtask: usize) -> SinkContext {
    SinkContext::new(pipeline, subtask, 2, Arc::new(Metrics::default()))
}

/// A typed sink of `config` for `pipeline`/`subtask`, with its metrics.
pub fn new_sink(config: &PostgresSinkConfig, pipeline: &str, subtask: usize) -> (PostgresSink, Arc<Metrics>) {
    let factory = PostgresSinkFactory::new(config.clone()).expect("valid config");
    let context = context(pipeline, subtask);
    let metrics = context.metrics.clone();
    (factory.create_sink(context), metrics)
}

/// A record with a JSON value from a `orders-<partition>` split.
pub fn record(partition: i32, offset: i64, value: &str) -> Record {
    Record::new(format!("orders-{partition}"), offset, value.as_bytes().to_vec())
}

/// A table of `id` (the upsert key) and `v`, created by the sink: the TOML
/// after `url` and `table` (see [`config`]; the mode is its default).
pub const KV_UPSERT: &str = r#"
create_table = true
upsert_key = ["id"]
[sink.postgres.columns]
id = { from = "/id", type = "bigint" }
v = { from = "/v", type = "text" }
"#;

/// A record `{"id": <id>, "v": "<v>"}` (for tables of `id` and `v`).
pub fn kv(partition: i32, offset: i64, id: i64, v: &str) -> Record {
    record(partition, offset, &format!(r#"{{"id":{id},"v":"{v}"}}"#))
}

/// What [`pairs`] returns for `expected`.
pub fn expect_pairs(expected: &[(i64, &str)]) -> Vec<(i64, String)> {
    expected.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// begin → write each batch → pre_commit.
pub async fn prepare(sink: &mut PostgresSink, checkpoint: u64, batches: &[Vec<Record>]) -> PostgresCommittable {
    let mut txn = sink.begin(CheckpointId(checkpoint)).await.expect("begin");
    for batch in batches {
        sink.write(&mut txn, batch).await.expect("write");
    }
    sink.pre_commit(txn).await.expect("pre_commit")
}

pub async fn count(db: &Client, table: &str) -> i64 {
    db.query_one(&format!("SELECT count(*) FROM \"{table}\""), &[])
        .await
        .expect("count rows")
        .get(0)
}

/// Gids of prepared transactions that start with `prefix`, oldest first.
pub async fn prepared(db: &Client, prefix: &str) -> Vec<String> {
    db.query(
        "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, $1) ORDER BY prepared",
        &[&prefix],
    )
    .await
    .expect("list prepared transactions")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// `(key, value)` pairs of a two-column table, ordered by key.
pub async fn pairs(db: &Client, table: &str) -> Vec<(i64, String)> {
    db.query(&format!("SELECT id, v FROM \"{table}\" ORDER BY id"), &[])
        .await
        .expect("read rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The message of a fatal error (panics on anything else).
pub fn fatal_message(result: Result<(), ConnectorError>) -> String {
    message_of(result, "fatal")
}

/// The message of a transient error (panics on anything else).
pub fn transient_message(result: Result<(), ConnectorError>) -> String {
    message_of(result, "transient")
}

fn message_of(result: Result<(), ConnectorError>, kind: &str) -> String {
    match (kind, result) {
        ("fatal", Err(ConnectorError::Fatal { message, .. }))
        | ("transient", Err(ConnectorError::Transient { message, .. })) => message,
        (_, other) => panic!("expected a {kind} error, got {other:?}"),
    }
}

/// The first column of every row `sql` returns.
pub async fn column<T: for<'a> tokio_postgres::types::FromSql<'a>>(db: &Client, sql: &str) -> Vec<T> {
    db.query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// One test's world: a server (usually the shared one), a checking client, a fresh table
/// and pipeline name, and the sink configuration for them.
pub struct Fixture {
    pub pg: Arc<PostgresServer>,
    pub db: Client,
    pub table: String,
    pub pipeline: String,
    pub config: PostgresSinkConfig,
}

impl Fixture {
    /// `body` is the TOML after `url` and `table` (see [`config`]).
    pub async fn new(table_prefix: &str, body: &str) -> Fixture {
        Self::on(shared_server(), table_prefix, body).await
    }

    /// Like [`new`](Self::new), on a server of the test's own (whatever
    /// `EXACTLY_DATABASE_URL` says): for tests that create roles, which
    /// must not be left on an external server, or that log in without a
    /// password (the testkit's trust authentication).
    pub async fn own(table_prefix: &str, body: &str) -> Fixture {
        let pg = PostgresServer::start_own().expect("start PostgreSQL");
        Self::on(Arc::new(pg), table_prefix, body).await
    }

    async fn on(pg: Arc<PostgresServer>, table_prefix: &str, body: &str) -> Fixture {
        let db = client(pg.url()).await;
        let table = unique(table_prefix);
        let config = config(pg.url(), &table, body);
        Fixture {
            pg,
            db,
            table,
            pipeline: unique("pipe"),
            config,
        }
    }

    /// A sink of this fixture's pipeline that has recovered `pending`.
    pub async fn recovered(&self, subtask: usize, pending: &[PostgresCommittable]) -> (PostgresSink, Arc<Metrics>) {
        let (mut sink, metrics) = new_sink(&self.config, &self.pipeline, subtask);
        sink.recover(pending).await.expect("recover");
        (sink, metrics)
    }

    pub async fn count(&self) -> i64 {
        count(&self.db, &self.table).await
    }
}

/// A session of "another process": a client with `application_name`
/// holding the lock `key`; returns it and its backend pid.
pub async fn foreign_holder(url: &str, application_name: &str, key: i64) -> (Client, i32) {
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    config.application_name(application_name);
    let (other, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    // Waits for a session of a sink the test just dropped to end.
    other.execute("SELECT pg_advisory_lock($1)", &[&key]).await.unwrap();
    let pid: i32 = other.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    (other, pid)
}

/// Closes `session` (backend `pid`) as a process that ends would, and
/// waits (at most 10 s) until its backend, and the advisory locks it
/// holds, are gone: they go a moment after the client is dropped.
pub async fn end_session(db: &Client, session: Client, pid: i32) {
    drop(session);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left: i64 = db
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the session of backend {pid} is still there after 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
