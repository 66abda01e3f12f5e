//! Transforms from the pipeline file, through the `exactly` binary on
//! Apache Kafka and a real PostgreSQL: `[[transform]]` drops test orders
//! (`drop-if`), renames, drops and inserts fields, copies a header into
//! the value and routes each order to the table of its region. Killed
//! (SIGKILL) after a checkpoint listing prepared transactions is
//! persisted, then during the recovery that commits them; a last bounded
//! run ends with each table holding exactly what the transforms make of
//! the input, computed here from the orders alone, and no prepared
//! transaction left.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::orders::*;
use common::*;
use exactly::kafka::admin::ProduceRecord;
use exactly_testkit::{KafkaBroker, PostgresServer};
use serde_json::{json, Value};

/// Orders fed to the topic.
const ORDERS: i64 = 3000;

const REGIONS: [&str; 2] = ["eu", "us"];

/// Order `i`: one test order in seven, the region alternating, a trace
/// header.
fn order_with_trace(i: i64) -> ProduceRecord {
    let status = if i % 7 == 0 { "test" } else { "paid" };
    let region = REGIONS[(i % 2) as usize];
    ProduceRecord::new(
        json!({"id": i, "amount": i % 500, "internal": "x", "status": status, "region": region}).to_string(),
    )
    .with_key(i.to_string())
    .with_header("trace", format!("t-{i}"))
    .to_partition((i % ORDER_PARTITIONS as i64) as i32)
}

/// What the transforms make of order `i`: `None` when it is dropped, else
/// its region and value.
fn transformed(i: i64) -> Option<(&'static str, Value)> {
    if i % 7 == 0 {
        return None;
    }
    let region = REGIONS[(i % 2) as usize];
    Some((
        region,
        json!({"id": i, "total": i % 500, "status": "paid", "region": region, "source": {"shop": "main"}, "trace": format!("t-{i}")}),
    ))
}

fn pipeline(
    dir: &Path,
    name: &str,
    (bootstrap, topic): (&str, &str),
    (url, prefix): (&str, &str),
    bounded: bool,
) -> PathBuf {
    postgres_pipeline_file(
        dir,
        name,
        (bootstrap, topic),
        (url, &format!("{prefix}_${{topic}}")),
        bounded,
        SINK,
    )
}

/// The rest of the pipeline's `[sink.postgres]` section.
const SINK: &str = r#"create_table = true

[sink.postgres.columns]
part = { from = "partition", type = "int" }
off = { from = "offset", type = "bigint" }
id = { from = "/id", type = "bigint" }
total = { from = "/total", type = "bigint" }
trace = { from = "/trace", type = "text" }
payload = { from = "value", type = "jsonb" }

[[transform]]
type = "drop-if"
field = "/status"
equals = "test"

[[transform]]
type = "rename"
field = "/amount"
to = "/total"

[[transform]]
type = "drop"
field = "/internal"

[[transform]]
type = "insert"
field = "/source/shop"
value = "main"

[[transform]]
type = "header"
header = "trace"
field = "/trace"

[[transform]]
type = "route"
field = "/region"
"#;

/// Every row of `table`: (partition, offset) → (id, total, trace, payload).
type Rows = BTreeMap<(i32, i64), (i64, i64, String, Value)>;

/// The rows of `table` and how many there are (a duplicate (partition,
/// offset) would make the count larger than the map).
fn rows_of(url: &str, table: &str) -> (Rows, usize) {
    with_postgres(url, async |db| {
        let rows = db
            .query(
                &format!("SELECT part, off, id, total, trace, payload FROM {table}"),
                &[],
            )
            .await
            .unwrap();
        let count = rows.len();
        let map = rows
            .iter()
            .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3), r.get(4), r.get(5))))
            .collect();
        (map, count)
    })
}

#[test]
fn transforms_from_the_pipeline_file_shape_and_route_rows_exactly_once_under_sigkill() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let name = fresh("transforms");
    let topic = fresh("tx");
    let prefix = fresh("routed");
    // Half the orders now, the rest when the test lets the feed finish:
    // the crashes below hit runs that have more to read.
    let feed = Feed::start_held_with(kafka.bootstrap(), &topic, ORDERS, order_with_trace);
    let fed = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &prefix), false);

    // Every phase of the two-phase matrix, one kill after the other; the
    // last two are a checkpoint listing prepared transactions persisted and
    // nothing committed, then the recovery that commits them. What those
    // kills left prepared is asserted on, not a row count: an interval may
    // hold no order on a slow machine.
    let (earlier, last_two) = TWO_PHASE_CRASH_SEQUENCE
        .split_last_chunk::<2>()
        .expect("two points at least");
    assert_eq!(
        last_two,
        &["coordinator.after_persist_pending:1", "recovery.after_commit:1"]
    );
    for point in earlier {
        run_killed_at(&fed, point);
    }
    run_killed_at(&fed, last_two[0]);
    // Each region checkpoints on its own: the kill came after one region
    // persisted a checkpoint listing prepared transactions, while another
    // may have prepared its next one without persisting it. The listed ones
    // are those the latest entry of some region names.
    let prepared = prepared_of_pipeline(url, &name);
    let entries = serde_json::to_string(
        &latest_entries(&dir.path().join("checkpoints"), &name)
            .iter()
            .map(|e| &e.checkpoint.pending)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let (listed, unlisted): (Vec<String>, Vec<String>) = prepared
        .into_iter()
        .partition(|gid| entries.contains(&format!("\"{gid}\"")));
    eprintln!("prepared after the kill: listed {listed:?}, not listed {unlisted:?}");
    assert!(
        !listed.is_empty(),
        "the kill after persisting a checkpoint that lists prepared transactions left none of them prepared \
         (prepared but not listed: {unlisted:?})"
    );
    // Killed after the recovery of a subtask with a listed transaction
    // (gids end in `:<subtask>:<checkpoint>`): its listed transactions are
    // committed (the other region's may still be prepared).
    let subtask = listed[0]
        .rsplit(':')
        .nth(1)
        .expect("a gid ends in :<subtask>:<checkpoint>");
    let (point, hit) = last_two[1].split_once(':').expect("<point>:<hit>");
    run_killed_at(&fed, &format!("{point}@{subtask}:{hit}"));
    // What left pg_prepared_xacts was committed when a checkpoint listed it
    // and rolled back when none did: a commit leaves its marker in the
    // commit log (written inside the prepared transaction), a rollback
    // none. (Checkpoint ids are reserved before use, so a rolled-back gid
    // is never prepared again.)
    let still = prepared_of_pipeline(url, &name);
    let gone = |gids: &[String]| -> Vec<String> { gids.iter().filter(|gid| !still.contains(gid)).cloned().collect() };
    let (listed_gone, unlisted_gone) = (gone(&listed), gone(&unlisted));
    assert!(
        !listed_gone.is_empty(),
        "the recovery ended none of the prepared transactions the checkpoint listed: {listed:?}"
    );
    let committed_of = |gids: &[String]| -> Vec<String> {
        with_postgres(url, async |db| {
            db.query("SELECT gid FROM exactly_commit_log WHERE gid = ANY($1)", &[&gids])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect()
        })
    };
    let committed = committed_of(&listed_gone);
    assert_eq!(
        committed.len(),
        listed_gone.len(),
        "the recovery rolled back listed transactions instead of committing them: gone {listed_gone:?}, \
         committed {committed:?}"
    );
    assert_eq!(
        committed_of(&unlisted_gone),
        Vec::<String>::new(),
        "the recovery committed prepared transactions no checkpoint listed"
    );

    feed.finish();
    let bounded = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (url, &prefix), true);
    let (status, _, log) = wait(spawn(&bounded), Duration::from_secs(240));
    assert!(status.success(), "the last run failed:\n{log}");

    // What the transforms make of the input, from the orders alone: the
    // Kafka coordinates of order i are its partition and its rank among
    // the orders of that partition (one producer, in order).
    let mut expected: BTreeMap<&str, Rows> = BTreeMap::new();
    let mut next_offset = [0i64; ORDER_PARTITIONS as usize];
    for i in 0..ORDERS {
        let partition = (i % ORDER_PARTITIONS as i64) as usize;
        let offset = next_offset[partition];
        next_offset[partition] += 1;
        if let Some((region, value)) = transformed(i) {
            expected
                .entry(region)
                .or_default()
                .insert((partition as i32, offset), (i, i % 500, format!("t-{i}"), value));
        }
    }
    for region in REGIONS {
        let table = format!("{prefix}_{region}");
        let (rows, count) = rows_of(url, &table);
        let want = &expected[region];
        assert_eq!(count, want.len(), "{table}: rows (a duplicate or a loss)");
        assert_eq!(&rows, want, "{table}: what the transforms make of the orders");
    }
    assert_eq!(
        prepared_of_pipeline(url, &name),
        Vec::<String>::new(),
        "prepared transactions left behind"
    );
    let unrouted = with_postgres(url, async |db| {
        db.query_one("SELECT to_regclass($1) IS NULL", &[&format!("{prefix}_{topic}")])
            .await
            .unwrap()
            .get::<_, bool>(0)
    });
    assert!(unrouted, "no record went to its topic's table");
}
