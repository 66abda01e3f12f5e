//! Debezium change events (`format = "debezium"`) from Apache Kafka into a
//! real PostgreSQL through the `exactly` binary, with and without Kafka
//! Connect's schema wrapper, under SIGKILL after a checkpoint listing
//! prepared transactions and during the recovery that commits them: the
//! target table ends equal to the source table's final state, computed
//! from the events produced (not from anything the sink wrote).
//!
//! The events are shaped as Debezium's PostgreSQL connector writes them for
//! a `customers` table (`id` primary key, `first_name`, `email`): the key
//! `{"id": …}`, the value's envelope `before` / `after` / `source` / `op` /
//! `ts_ms`; every key lives through snapshot read (`r`) or insert (`c`),
//! two updates (`u`), a delete (`d`) and the tombstone after it, again and
//! again, each key in one partition in order.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::orders::*;
use common::*;
use exactly_kafka::admin::ProduceRecord;
use exactly_testkit::{KafkaBroker, PostgresServer};

/// Events fed per case: keys 0–29 end deleted (their last event is a
/// delete), keys 30–59 updated.
const EVENTS: i64 = 48 * KEYS + 30;
/// Keys (rows of the source table) they touch.
const KEYS: i64 = 60;
/// Each key's life: read or insert, update, update, delete, tombstone.
const LIFE: i64 = 5;

/// Event `i`: its key, and its step in the key's life.
fn step(i: i64) -> (i64, i64, i64) {
    let (key, round) = (i % KEYS, i / KEYS);
    (key, round % LIFE, round)
}

/// The row after event `i` (when it leaves one).
fn row(i: i64) -> String {
    let (key, _, _) = step(i);
    format!(r#"{{"id":{key},"first_name":"n{key}","email":"e{i}@example.com"}}"#)
}

fn source(i: i64) -> String {
    format!(
        r#"{{"version":"2.7.0.Final","connector":"postgresql","name":"dbserver1","ts_ms":{i},"snapshot":"false","db":"shop","sequence":"[null,\"{i}\"]","schema":"public","table":"customers","txId":{i},"lsn":{i},"xmin":null}}"#
    )
}

const ROW_SCHEMA: &str = r#"{"type":"struct","fields":[{"type":"int32","optional":false,"default":0,"field":"id"},{"type":"string","optional":false,"field":"first_name"},{"type":"string","optional":false,"field":"email"}],"optional":true,"name":"dbserver1.public.customers.Value","field":"FIELD"}"#;

fn value_schema() -> String {
    format!(
        r#"{{"type":"struct","fields":[{},{},{{"type":"struct","fields":[{{"type":"string","optional":false,"field":"connector"}}],"optional":false,"name":"io.debezium.connector.postgresql.Source","field":"source"}},{{"type":"string","optional":false,"field":"op"}},{{"type":"int64","optional":true,"field":"ts_ms"}}],"optional":false,"name":"dbserver1.public.customers.Envelope"}}"#,
        ROW_SCHEMA.replace("FIELD", "before"),
        ROW_SCHEMA.replace("FIELD", "after")
    )
}

/// Event `i` as the connector writes it, wrapped in the JSON converter's
/// schema envelope or not.
fn event(i: i64, wrapped: bool) -> ProduceRecord {
    let (key, life, round) = step(i);
    let before = || row(i - KEYS);
    let payload = match life {
        0 => {
            let op = if round == 0 { "r" } else { "c" };
            Some(format!(
                r#"{{"before":null,"after":{},"source":{},"op":"{op}","ts_ms":{i}}}"#,
                row(i),
                source(i)
            ))
        }
        1 | 2 => Some(format!(
            r#"{{"before":{},"after":{},"source":{},"op":"u","ts_ms":{i}}}"#,
            before(),
            row(i),
            source(i)
        )),
        3 => Some(format!(
            r#"{{"before":{},"after":null,"source":{},"op":"d","ts_ms":{i}}}"#,
            before(),
            source(i)
        )),
        _ => None,
    };
    let key_payload = format!(r#"{{"id":{key}}}"#);
    let (key_bytes, value) = if wrapped {
        let key_schema = r#"{"type":"struct","fields":[{"type":"int32","optional":false,"default":0,"field":"id"}],"optional":false,"name":"dbserver1.public.customers.Key"}"#;
        (
            format!(r#"{{"schema":{key_schema},"payload":{key_payload}}}"#),
            payload.map(|p| format!(r#"{{"schema":{},"payload":{p}}}"#, value_schema())),
        )
    } else {
        (key_payload, payload)
    };
    let record = match value {
        Some(value) => ProduceRecord::new(value),
        None => ProduceRecord::tombstone(),
    };
    record
        .with_key(key_bytes)
        .to_partition((key % ORDER_PARTITIONS as i64) as i32)
}

fn plain(i: i64) -> ProduceRecord {
    event(i, false)
}

fn wrapped(i: i64) -> ProduceRecord {
    event(i, true)
}

/// The source table after every event: `id → email`.
fn source_state() -> BTreeMap<i64, String> {
    let mut table = BTreeMap::new();
    for i in 0..EVENTS {
        let (key, life, _) = step(i);
        match life {
            0..=2 => {
                table.insert(key, format!("e{i}@example.com"));
            }
            3 => {
                table.remove(&key);
            }
            _ => {}
        }
    }
    table
}

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
const SINK: &str = r#"create_table = true
format = "debezium"
pk.mode = "record_key"
pk.fields = ["id"]
delete.enabled = true

[sink.postgres.columns]
id = { type = "bigint" }
first_name = { from = "/first_name", type = "text" }
email = { from = "/email", type = "text" }
"#;

fn table_state(url: &str, table: &str) -> BTreeMap<i64, String> {
    with_postgres(url, async |db| {
        db.query(&format!("SELECT id, email FROM {table}"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    })
}

fn dead_letters(url: &str, table: &str) -> i64 {
    with_postgres(url, async |db| {
        db.query_one(&format!("SELECT count(*) FROM {table}_dead_letters"), &[])
            .await
            .unwrap()
            .get(0)
    })
}

#[test]
fn the_table_ends_at_the_source_tables_state_with_and_without_the_schema_wrapper_under_sigkill() {
    let expected = source_state();
    assert!(
        !expected.is_empty() && expected.len() < KEYS as usize,
        "some rows live, others are deleted: {}",
        expected.len()
    );
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let mut failures = Vec::new();
    for (case, make) in [("plain", plain as fn(i64) -> ProduceRecord), ("wrapped", wrapped)] {
        let dir = tempfile::tempdir().unwrap();
        let name = fresh(&format!("debezium_{case}"));
        let table = fresh("customers");
        let topic = topic_reaching_every_subtask("dbserver1_public_customers", &[2]);
        let feed = Feed::start_held_with(kafka.bootstrap(), &topic, EVENTS, make);
        let fed = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &table), false);
        // Every phase of the two-phase matrix, one kill after the other.
        // The feed trickles its second half until the end: every crash
        // hits a run with more to read.
        for point in TWO_PHASE_CRASH_SEQUENCE {
            run_killed_at(&fed, point);
        }
        feed.finish();
        let bounded = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &table), true);
        let (status, _, log) = wait(spawn(&bounded), Duration::from_secs(240));
        assert!(status.success(), "{case}: the last run failed:\n{log}");
        let state = table_state(url, &table);
        if state != expected {
            let wrong = expected.iter().filter(|(k, v)| state.get(k) != Some(v)).count()
                + state.keys().filter(|k| !expected.contains_key(k)).count();
            failures.push(format!("{case}: {wrong} keys differ"));
        }
        let dead = dead_letters(url, &table);
        if dead != 0 {
            failures.push(format!("{case}: {dead} dead letters (every event is a change event)"));
        }
        let prepared = prepared_of_pipeline(url, &name);
        if !prepared.is_empty() {
            failures.push(format!("{case}: prepared transactions left: {prepared:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "not the source table's state:\n{}",
        failures.join("\n")
    );
}
