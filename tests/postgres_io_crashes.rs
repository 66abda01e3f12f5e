//! The Kafka → PostgreSQL SIGKILL matrix inside the sink's PostgreSQL I/O,
//! through the `exactly` binary on Apache Kafka and a real PostgreSQL, while
//! the topic is being fed: in the middle of a COPY stream (the server has
//! received rows, the COPY is not finished) and between `PREPARE
//! TRANSACTION` and its answer (the server has prepared the transaction,
//! the sink never learns it). Each case ends with every order exactly once
//! and no prepared transaction left.

mod common;

use std::time::Duration;

use common::orders::*;
use common::*;
use exactly_testkit::{KafkaBroker, PostgresServer};

/// A feed of at least 3 s (50 orders every 25 ms).
const ORDERS: i64 = 6000;

/// (case, crash points in turn): each point kills one run, the next run
/// resumes from what the crash left.
const CASES: &[(&str, &[&str])] = &[
    ("mid_copy", &["postgres_sink.mid_copy:2"]),
    ("before_prepare_answer", &["postgres_sink.before_prepare_answer:4"]),
    (
        "before_prepare_answer_then_mid_copy_after_recovery",
        &["postgres_sink.before_prepare_answer@1:2", "postgres_sink.mid_copy@0:1"],
    ),
];

#[test]
fn kafka_to_postgres_is_exactly_once_under_sigkill_inside_postgres_io() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    for (case, points) in CASES {
        let dir = tempfile::tempdir().unwrap();
        let name = fresh(case);
        let table = fresh("io");
        let topic = topic_reaching_every_subtask("io", &[2]);
        // Intervals of 500 ms: a subtask's COPY takes several KiB in one.
        let file = |bounded: bool| {
            orders_pipeline(
                dir.path(),
                &format!("{bounded}.toml"),
                &name,
                2,
                "checkpoints",
                "500ms",
                (kafka.bootstrap(), &topic),
                (url, &table),
                bounded,
            )
        };
        let feed = Feed::start(kafka.bootstrap(), &topic, ORDERS);
        for point in *points {
            run_killed_within(&file(false), point, &[], Duration::from_secs(120));
            assert!(
                feed.is_running(),
                "{case}: the input was complete before the crash at {point}"
            );
            if point.starts_with("postgres_sink.before_prepare_answer") {
                // The server prepared a transaction no checkpoint lists.
                let entry = newest_entries_text(&dir.path().join("checkpoints"), &name).unwrap_or_default();
                let prepared = prepared_of_pipeline(url, &name);
                assert!(
                    prepared.iter().any(|gid| !entry.contains(gid.as_str())),
                    "{case}: no prepared transaction outside the checkpoint after the crash at {point}: {prepared:?}"
                );
            }
        }
        feed.finish();
        let (status, _, log) = wait(spawn(&file(true)), Duration::from_secs(120));
        assert!(status.success(), "{case}: the last run failed:\n{log}");
        assert_orders_exactly_once(url, &table, &name, ORDERS, case);
    }
}
