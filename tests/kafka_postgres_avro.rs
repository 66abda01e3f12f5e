//! Avro in the Confluent wire format (`format = "avro"`) from Apache Kafka
//! into a real PostgreSQL through the `exactly` binary, with the writer
//! schemas fetched from the test kit's schema registry (Apicurio's
//! Confluent-compatible API) behind a front that requires TLS and basic
//! auth (the password in a file the pipeline names), and
//! `schema_evolution = "add-columns"`: the first records are written with
//! schema version 1, the later ones with version 2, which adds an optional
//! field `note`. SIGKILLed after a checkpoint that lists prepared
//! transactions and during the recovery that commits them, then run to the
//! end: every record is in the table exactly once, its `placed`
//! (`timestamp-millis`) as a timestamptz, the column `note` was added and
//! holds exactly the version-2 records' notes, no dead letter, no prepared
//! transaction left, and the registry's password is in no log.
//!
//! The datums are encoded here by hand from Avro's specification (zigzag
//! varints, length-prefixed strings, union branch indexes), not by the
//! crate the sink decodes with.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use common::orders::*;
use common::*;
use exactly_kafka::admin::ProduceRecord;
use exactly_testkit::{KafkaBroker, PostgresServer, SchemaRegistry};

/// Records fed; those from [`SWITCH`] on are written with version 2.
const RECORDS: i64 = 3000;
const SWITCH: i64 = 1200;
/// `placed` of record `i`: a fixed instant plus `i` seconds.
const PLACED_BASE_MS: i64 = 1_709_214_300_123;

const V1: &str = r#"{"type": "record", "name": "Order", "namespace": "exactly.avro_test", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}"#;
const V2: &str = r#"{"type": "record", "name": "Order", "namespace": "exactly.avro_test", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "ref", "type": ["null", {"type": "string", "logicalType": "uuid"}], "default": null},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": null}]}"#;

/// The registry ids of V1 and V2 (the feed's `fn` reads them).
static IDS: OnceLock<(u32, u32)> = OnceLock::new();

fn long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let byte = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

/// Record `i`, framed: magic byte, schema id, datum.
fn avro(i: i64) -> ProduceRecord {
    let (v1, v2) = *IDS.get().expect("schemas registered");
    let mut value = vec![0u8];
    value.extend((if i < SWITCH { v1 } else { v2 }).to_be_bytes());
    long(&mut value, i);
    string(&mut value, &format!("order-{i}"));
    long(&mut value, PLACED_BASE_MS + i * 1000);
    if i >= SWITCH {
        if i % 3 == 0 {
            long(&mut value, 0);
        } else {
            long(&mut value, 1);
            string(&mut value, &format!("note-{i}"));
        }
        long(&mut value, 1);
        string(&mut value, &reference(i));
        long(&mut value, 1);
        long(&mut value, day(i));
    }
    ProduceRecord::new(value)
        .with_key(i.to_string())
        .to_partition((i % ORDER_PARTITIONS as i64) as i32)
}

/// The UUID record `i` (from [`SWITCH`] on) carries.
fn reference(i: i64) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

/// The date record `i` (from [`SWITCH`] on) carries: days since 1970-01-01.
fn day(i: i64) -> i64 {
    19_782 + i % 100
}

/// The note record `i` carries.
fn note(i: i64) -> Option<String> {
    (i >= SWITCH && i % 3 != 0).then(|| format!("note-{i}"))
}

struct Registry<'a> {
    url: &'a str,
    username: &'a str,
    ca_file: &'a Path,
}

fn pipeline(
    dir: &Path,
    name: &str,
    (bootstrap, topic): (&str, &str),
    (url, table): (&str, &str),
    registry: &Registry<'_>,
    bounded: bool,
) -> PathBuf {
    let file = dir.join(format!("{name}-{bounded}.toml"));
    let header = pipeline_header(
        name,
        "exactly-once",
        "strategy = \"fixed\"\ndelay = \"200ms\"\nmax_attempts = 100",
    )
    // One writer of the table: adding a column takes the table's lock,
    // which the open transactions of other subtasks writing it would hold.
    .replace("parallelism = 2", "parallelism = 1");
    std::fs::write(
        &file,
        format!(
            r#"{header}
[source.kafka]
bootstrap = "{bootstrap}"
topic = "{topic}"
start = "earliest"
stop_at_end = {bounded}

[sink.postgres]
url = "{url}"
table = "{table}"
create_table = true
format = "avro"
schema_evolution = "add-columns"

[sink.postgres.registry]
url = "{registry_url}"
username = "{username}"
password = {{ file = "registry-password" }}
ca_file = "{ca_file}"

[sink.postgres.columns]
id = {{ from = "/id", type = "bigint" }}
name = {{ from = "/name", type = "text" }}
placed = {{ from = "/placed", type = "timestamptz" }}
"#,
            registry_url = registry.url,
            username = registry.username,
            ca_file = registry.ca_file.display(),
        ),
    )
    .unwrap();
    file
}

/// `id → (copies, name, placed as Unix ms, note)`.
type Rows = BTreeMap<i64, (i64, String, i64, Option<String>)>;

fn table_rows(url: &str, table: &str) -> Rows {
    with_postgres(url, async |db| {
        db.query(
            &format!(
                "SELECT id, count(*), max(name), max((extract(epoch FROM placed) * 1000)::bigint), max(note) \
                 FROM {table} GROUP BY id"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3), r.get(4))))
        .collect()
    })
}

/// The type of `column` and whether it is nullable.
fn column_of(url: &str, table: &str, column: &str) -> Option<(String, bool)> {
    with_postgres(url, async |db| {
        db.query_opt(
            "SELECT data_type, is_nullable = 'YES' FROM information_schema.columns \
             WHERE table_name = $1 AND column_name = $2",
            &[&table, &column],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1)))
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
fn avro_of_two_schema_versions_lands_exactly_once_with_the_added_column_under_sigkill() {
    let registry = SchemaRegistry::shared().expect("starting the schema registry");
    let subject = fresh("avro-orders-value");
    let v1 = registry.register_avro(&subject, V1).expect("registering version 1");
    let v2 = registry.register_avro(&subject, V2).expect("registering version 2");
    assert_ne!(v1, v2);
    IDS.set((v1, v2)).unwrap();
    let front = registry
        .front()
        .tls()
        .start()
        .expect("starting the TLS and basic-auth front");
    let ca_file = front.ca_file().expect("a TLS front has a CA").to_path_buf();

    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("registry-password"), format!("{}\n", front.password())).unwrap();
    let registry_settings = Registry {
        url: front.url(),
        username: front.username(),
        ca_file: &ca_file,
    };
    let name = fresh("avro_evolution");
    let table = fresh("avro_orders");
    let topic = topic_reaching_every_subtask("avro_orders", &[1]);
    let feed = Feed::start_held_with(kafka.bootstrap(), &topic, RECORDS, avro);
    let endpoints = (kafka.bootstrap(), topic.as_str());
    let fed = pipeline(dir.path(), &name, endpoints, (url, &table), &registry_settings, false);
    let mut logs = Vec::new();
    // Every phase of the two-phase matrix, one kill after the other, then
    // one more after the persist. The feed trickles its second half until
    // the end: every crash hits a run with more to read.
    for point in TWO_PHASE_CRASH_SEQUENCE
        .iter()
        .chain(&["coordinator.after_persist_pending:3"])
    {
        logs.push(run_killed_at_with(&fed, point, &[]));
    }
    feed.finish();
    let bounded = pipeline(dir.path(), &name, endpoints, (url, &table), &registry_settings, true);
    let (status, _, log) = wait(spawn(&bounded), Duration::from_secs(240));
    assert!(status.success(), "the last run failed:\n{log}");
    logs.push(log);

    let rows = table_rows(url, &table);
    let mut wrong = Vec::new();
    for i in 0..RECORDS {
        let expected = (1, format!("order-{i}"), PLACED_BASE_MS + i * 1000, note(i));
        match rows.get(&i) {
            Some(row) if *row == expected => {}
            other => wrong.push(format!("{i}: {other:?}, expected {expected:?}")),
        }
    }
    let extra = rows.keys().filter(|id| !(0..RECORDS).contains(*id)).count();
    assert!(
        wrong.is_empty() && extra == 0,
        "{} records not exactly once as sent ({extra} unknown ids), e.g.:\n{}",
        wrong.len(),
        wrong.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    for (column, ty) in [("note", "text"), ("ref", "uuid"), ("day", "date")] {
        assert_eq!(
            column_of(url, &table, column),
            Some((ty.to_string(), true)),
            "the sink added `{column}` as a nullable {ty} column"
        );
    }
    // The logical types' values, by type: every version-2 record's, and
    // NULL in the version-1 records'.
    let (typed, empty): (i64, i64) = with_postgres(url, async |db| {
        let row = db
            .query_one(
                &format!(
                    "SELECT count(*) FILTER (WHERE id >= $1 AND ref = ('00000000-0000-4000-8000-' || \
                     lpad(to_hex(id), 12, '0'))::uuid AND day = date '1970-01-01' + (19782 + id % 100)::int), \
                     count(*) FILTER (WHERE id < $1 AND ref IS NULL AND day IS NULL) FROM {table}"
                ),
                &[&SWITCH],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    });
    assert_eq!(
        (typed, empty),
        (RECORDS - SWITCH, SWITCH),
        "uuid and date values as sent (version 2), NULL before (version 1)"
    );
    assert_eq!(dead_letters(url, &table), 0, "every record decodes");
    let prepared = prepared_of_pipeline(url, &name);
    assert!(prepared.is_empty(), "prepared transactions left: {prepared:?}");
    assert!(front.refused() == 0, "every request carried the right credentials");
    for log in &logs {
        assert!(!log.contains(front.password()), "the registry's password is in a log");
    }
}
