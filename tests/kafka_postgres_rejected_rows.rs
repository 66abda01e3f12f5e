//! Kafka → PostgreSQL through the `exactly` binary with
//! `on_rejected_row = "dead-letter"`, on Apache Kafka and a real
//! PostgreSQL: 1 % of the orders break a CHECK constraint of the user's
//! table. Under SIGKILL at every phase of the two-phase commit (while
//! writing, after PREPARE, after a persisted checkpoint that lists prepared
//! transactions, between two subtasks' commits, during recovery) exactly
//! those orders end in the dead-letter table, once each, with the server's
//! message naming the constraint, and every other order is in the table
//! exactly once.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::orders::*;
use common::*;
use exactly_kafka::admin::ProduceRecord;
use exactly_testkit::{KafkaBroker, PostgresServer};

/// Orders fed to each case.
const ORDERS: i64 = 4000;

/// Order `id` breaks the table's CHECK constraint: one in a hundred.
fn refused(id: i64) -> bool {
    id % 100 == 42
}

/// Order `id`, keyed by it, in partition `id % ORDER_PARTITIONS`; its
/// amount is negative when [`refused`].
fn order_with_amount(id: i64) -> ProduceRecord {
    let amount = if refused(id) {
        format!("-{}.50", id % 7 + 1)
    } else {
        format!("{}.{:02}", id % 500, id % 100)
    };
    ProduceRecord::new(format!(r#"{{"id":{id},"customer":"c{}","amount":{amount}}}"#, id % 97))
        .with_key(format!("{id}"))
        .to_partition((id % ORDER_PARTITIONS as i64) as i32)
}

/// Creates `table` with a CHECK constraint on the amount.
fn create_table(url: &str, table: &str) {
    with_postgres(url, async |db| {
        db.batch_execute(&format!(
            "CREATE TABLE {table} (part int NOT NULL, off bigint NOT NULL, id bigint NOT NULL, \
             amount numeric(12, 2) NOT NULL CONSTRAINT amount_not_negative CHECK (amount >= 0), payload jsonb)"
        ))
        .await
        .unwrap()
    });
}

/// The pipeline file `<dir>/<name>-<bounded>.toml`: the topic into `table`,
/// refused rows to the dead letters; bounded (to the end the topic has at
/// start) or reading as the topic grows. Both share the checkpoints.
fn pipeline(
    dir: &Path,
    name: &str,
    (bootstrap, topic): (&str, &str),
    (url, table): (&str, &str),
    bounded: bool,
) -> PathBuf {
    postgres_pipeline_file(dir, name, (bootstrap, topic), (url, table), bounded, SINK)
}

/// The rest of the pipeline's `[sink.postgres]` section.
const SINK: &str = r#"on_rejected_row = "dead-letter"

[sink.postgres.columns]
part = { from = "partition", type = "int" }
off = { from = "offset", type = "bigint" }
id = { from = "/id", type = "bigint" }
amount = { from = "/amount", type = "numeric" }
payload = { from = "value", type = "jsonb" }
"#;

/// What the table and its dead letters hold.
struct Outcome {
    /// id → rows.
    rows: BTreeMap<i64, usize>,
    /// Rows of the table, and their distinct (partition, offset).
    positions: (i64, i64),
    /// id (the record key) → dead letters.
    dead: BTreeMap<i64, usize>,
    /// Dead-letter errors that do not give the server's message.
    unexplained: Vec<String>,
    prepared: Vec<String>,
}

fn outcome(url: &str, table: &str, pipeline: &str) -> Outcome {
    let mut outcome = with_postgres(url, async |db| {
        let mut rows = BTreeMap::new();
        for row in db.query(&format!("SELECT id FROM {table}"), &[]).await.unwrap() {
            *rows.entry(row.get::<_, i64>(0)).or_default() += 1;
        }
        let counts = db
            .query_one(
                &format!("SELECT count(*), count(DISTINCT (part, off)) FROM {table}"),
                &[],
            )
            .await
            .unwrap();
        let mut dead = BTreeMap::new();
        let mut unexplained = Vec::new();
        let letters = db
            .query(&format!("SELECT key, error FROM {table}_dead_letters"), &[])
            .await
            .unwrap();
        for letter in letters {
            let key: Vec<u8> = letter.get(0);
            let id: i64 = String::from_utf8(key).unwrap().parse().unwrap();
            *dead.entry(id).or_default() += 1;
            let error: String = letter.get(1);
            if !(error.contains("PostgreSQL refused the row: 23514") && error.contains("amount_not_negative")) {
                unexplained.push(error);
            }
        }
        Outcome {
            rows,
            positions: (counts.get(0), counts.get(1)),
            dead,
            unexplained,
            prepared: Vec::new(),
        }
    });
    outcome.prepared = prepared_of_pipeline(url, pipeline);
    outcome
}

impl Outcome {
    /// What is wrong, if anything.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let good: BTreeSet<i64> = (0..ORDERS).filter(|id| !refused(*id)).collect();
        let bad: BTreeSet<i64> = (0..ORDERS).filter(|id| refused(*id)).collect();
        let written: BTreeSet<i64> = self.rows.keys().copied().collect();
        let dead: BTreeSet<i64> = self.dead.keys().copied().collect();
        if written != good {
            problems.push(format!(
                "rows: {} missing, {} unexpected",
                good.difference(&written).count(),
                written.difference(&good).count()
            ));
        }
        let duplicated = self.rows.values().filter(|n| **n > 1).count();
        if duplicated > 0 || self.positions.0 != self.positions.1 {
            problems.push(format!(
                "{duplicated} ids written twice; rows/positions {:?}",
                self.positions
            ));
        }
        if dead != bad {
            problems.push(format!("dead letters: {:?} instead of {:?}", dead, bad));
        }
        if self.dead.values().any(|n| *n > 1) {
            problems.push(format!("dead letters written twice: {:?}", self.dead));
        }
        if !self.unexplained.is_empty() {
            problems.push(format!(
                "dead letters without the server's message: {:?}",
                &self.unexplained[..1]
            ));
        }
        if !self.prepared.is_empty() {
            problems.push(format!("prepared transactions left: {:?}", self.prepared));
        }
        problems
    }
}

#[test]
fn refused_rows_are_dead_lettered_exactly_once_under_sigkill_at_every_phase() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let mut failures = Vec::new();
    for (case, points) in TWO_PHASE_CRASH_CASES {
        let dir = tempfile::tempdir().unwrap();
        let name = fresh(&format!("refused_{case}"));
        let table = fresh("refused");
        let topic = topic_reaching_every_subtask("refused", &[2]);
        create_table(url, &table);
        let feed = Feed::start_with(kafka.bootstrap(), &topic, ORDERS, order_with_amount);
        let fed = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &table), false);
        for point in *points {
            run_killed_at(&fed, point);
            assert!(
                feed.is_running(),
                "{case}: the feed ended before the crash at {point}; the crash did not hit a run in progress"
            );
        }
        feed.finish();
        let bounded = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &table), true);
        let (status, stdout, log) = wait(spawn(&bounded), std::time::Duration::from_secs(180));
        assert!(status.success(), "{case}: the last run failed:\n{log}");
        assert!(
            stdout.contains("\"dead_letters\":"),
            "{case}: the run reports its dead letters: {stdout}"
        );
        let problems = outcome(url, &table, &name).problems();
        if !problems.is_empty() {
            failures.push(format!("{case} ({points:?}): {}", problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "not exactly once:\n{}", failures.join("\n"));
}

/// Off by default: without `on_rejected_row`, the first refused row stops
/// the pipeline with the server's error naming the constraint, and nothing
/// of its transaction is committed.
#[test]
fn by_default_a_refused_row_stops_the_pipeline_naming_the_constraint() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let (name, table) = (fresh("refused_default"), fresh("refused"));
    let topic = topic_reaching_every_subtask("refused", &[2]);
    create_table(pg.url(), &table);
    Feed::start_with(kafka.bootstrap(), &topic, 200, order_with_amount).finish();
    let file = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (pg.url(), &table), true);
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("on_rejected_row = \"dead-letter\"\n", "")).unwrap();
    let (status, _, log) = wait(spawn(&file), std::time::Duration::from_secs(120));
    assert!(!status.success(), "a refused row must stop the pipeline:\n{log}");
    assert!(log.contains("23514") && log.contains("amount_not_negative"), "{log}");
    let refused_ids: Vec<i64> = with_postgres(pg.url(), async |db| {
        db.query(&format!("SELECT id FROM {table} WHERE id % 100 = 42"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    });
    assert!(refused_ids.is_empty(), "{refused_ids:?}");
}
