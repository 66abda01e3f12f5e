//! Several Kafka topics into a table each, through the `exactly` binary on
//! Apache Kafka and a real PostgreSQL: `topic_regex` with `table =
//! "${topic}"` (and one topic mapped by `tables`), all tables of a sink
//! subtask's interval in one prepared transaction. Killed (SIGKILL) after a
//! checkpoint listing prepared transactions is persisted, then during the
//! recovery that commits them, then while a fourth topic created mid-run is
//! being written into its new table; a last bounded run ends with every
//! table holding its topic's orders exactly once and no prepared
//! transaction left.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::orders::*;
use common::*;
use exactly_testkit::{KafkaBroker, PostgresServer};

/// Orders fed to each topic.
const PER_TOPIC: i64 = 1500;

/// The pipeline file: every topic matching `<prefix>_[a-z]` into the table
/// named like it, except `<prefix>_c`, mapped to `<prefix>_mapped_c`.
fn pipeline(dir: &Path, name: &str, (bootstrap, prefix): (&str, &str), url: &str, bounded: bool) -> PathBuf {
    let file = dir.join(format!("{name}-{bounded}.toml"));
    let header = pipeline_header(
        name,
        "exactly-once",
        "strategy = \"fixed\"\ndelay = \"200ms\"\nmax_attempts = 100",
    );
    std::fs::write(
        &file,
        format!(
            r#"{header}
[source.kafka]
bootstrap = "{bootstrap}"
topic_regex = "{prefix}_[a-z]"
start = "earliest"
stop_at_end = {bounded}
partition_discovery_interval = "300ms"

[sink.postgres]
url = "{url}"
table = "${{topic}}"
tables = {{ "{prefix}_c" = "{prefix}_mapped_c" }}
create_table = true

[sink.postgres.columns]
part = {{ from = "partition", type = "int" }}
off = {{ from = "offset", type = "bigint" }}
id = {{ from = "/id", type = "bigint" }}
topic = {{ from = "topic", type = "text" }}
"#
        ),
    )
    .unwrap();
    file
}

/// The rows of `table` not from `topic` (the record's own topic column).
fn strangers(url: &str, table: &str, topic: &str) -> i64 {
    with_postgres(url, async |db| {
        db.query_one(&format!("SELECT count(*) FROM {table} WHERE topic <> $1"), &[&topic])
            .await
            .unwrap()
            .get(0)
    })
}

#[test]
fn topics_by_regex_land_in_their_tables_exactly_once_under_sigkill_and_a_topic_created_mid_run() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let name = fresh("topics");
    let prefix = fresh("tt");
    let topic = |t: &str| format!("{prefix}_{t}");
    let feeds: Vec<Feed> = ["a", "b", "c"]
        .iter()
        .map(|t| Feed::start_held(kafka.bootstrap(), &topic(t), PER_TOPIC))
        .collect();
    let fed = pipeline(dir.path(), &name, (kafka.bootstrap(), &prefix), url, false);

    // Every phase of the two-phase matrix, one kill after the other. The
    // feeds trickle their second halves until the end: every crash hits a
    // run with more to read, however slow the machine.
    for point in TWO_PHASE_CRASH_SEQUENCE {
        run_killed_at(&fed, point);
    }

    // A fourth topic, created while a run goes on: its table appears and
    // fills, and the run is killed while it writes.
    let mut run = spawn(&fed);
    wait_for_orders(url, &topic("a"), &mut run, 1, Duration::from_secs(120)).expect("the run ended early");
    let late = Feed::start(kafka.bootstrap(), &topic("d"), PER_TOPIC);
    let seen = wait_for_orders(url, &topic("d"), &mut run, 100, Duration::from_secs(120));
    assert!(seen.is_some(), "the run ended before writing the new topic's table");
    unsafe { libc::kill(run.id() as i32, libc::SIGKILL) };
    let (status, _, _) = wait(run, Duration::from_secs(30));
    assert!(!status.success());

    for feed in feeds.into_iter().chain([late]) {
        feed.finish();
    }
    let bounded = pipeline(dir.path(), &name, (kafka.bootstrap(), &prefix), url, true);
    let (status, _, log) = wait(spawn(&bounded), Duration::from_secs(240));
    assert!(status.success(), "the last run failed:\n{log}");

    for (t, table) in [
        ("a", topic("a")),
        ("b", topic("b")),
        ("c", topic("mapped_c")),
        ("d", topic("d")),
    ] {
        assert_orders_exactly_once(url, &table, &name, PER_TOPIC, &format!("topic {t}"));
        assert_eq!(
            strangers(url, &table, &topic(t)),
            0,
            "{table} holds rows of other topics"
        );
    }
    let unmapped = with_postgres(url, async |db| {
        db.query_one("SELECT to_regclass($1) IS NULL", &[&topic("c")])
            .await
            .unwrap()
            .get::<_, bool>(0)
    });
    assert!(unmapped, "the mapped topic has no table of its own name");
}
