//! Region failover of a Kafka → PostgreSQL pipeline through the `exactly`
//! binary, on Apache Kafka and a real PostgreSQL, while the topic is being
//! fed: sink subtask 0's pre-commit fails once (`EXACTLY_FAIL_AT`), so its
//! region restarts after a 3 s delay. In region failover, sink subtask 1
//! keeps committing meanwhile (read from the commit log's `committed_at`);
//! in global failover, the control, nothing commits until everything
//! restarted. Both end with every order exactly once.

mod common;

use std::time::Duration;

use common::orders::*;
use common::*;
use exactly_testkit::{KafkaBroker, PostgresServer};

/// A feed of at least 5 s (50 orders every 25 ms).
const ORDERS: i64 = 10_000;

/// The restart delay: the outage of the failed part.
const RESTART_DELAY: Duration = Duration::from_secs(3);

/// Commits of each sink subtask while subtask 0 was down: the longest gap
/// between two consecutive commits of subtask 0, and the commits of
/// subtask 1 inside it (by `committed_at` in the commit log), leaving out
/// half a second at each end (the commits of one checkpoint by both
/// subtasks land a moment apart).
struct Outage {
    gap: Duration,
    commits_of_1_during: usize,
}

fn outage(url: &str, name: &str) -> Outage {
    const EDGE: f64 = 0.5;
    let commits = with_postgres(url, async |db| {
        db.query(
            "SELECT subtask, extract(epoch FROM committed_at)::float8 FROM exactly_commit_log \
             WHERE pipeline = $1 AND committed_at IS NOT NULL ORDER BY committed_at",
            &[&name],
        )
        .await
        .expect("reading the commit log")
        .iter()
        .map(|r| (r.get::<_, i32>(0), r.get::<_, f64>(1)))
        .collect::<Vec<_>>()
    });
    let of_0: Vec<f64> = commits.iter().filter(|(s, _)| *s == 0).map(|(_, t)| *t).collect();
    let (from, to) = of_0
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by(|a, b| (a.1 - a.0).total_cmp(&(b.1 - b.0)))
        .expect("subtask 0 committed at least twice");
    Outage {
        gap: Duration::from_secs_f64(to - from),
        commits_of_1_during: commits
            .iter()
            .filter(|(s, t)| *s == 1 && *t > from + EDGE && *t < to - EDGE)
            .count(),
    }
}

/// Runs the pipeline in `failover` mode over a fed topic with sink subtask
/// 0's 10th pre-commit failing, stops it with SIGTERM once every order is
/// committed, checks exactly once and returns the outage it saw.
fn run_with_one_failure(failover: &str) -> Outage {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let name = fresh(failover);
    let table = fresh("failover");
    let topic = topic_reaching_every_subtask("failover", &[2]);
    let file = orders_pipeline(
        dir.path(),
        "p.toml",
        &name,
        2,
        "checkpoints",
        "100ms",
        (kafka.bootstrap(), &topic),
        (url, &table),
        false,
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text
        .replacen(
            "parallelism = 2\n",
            &format!("parallelism = 2\nfailover = \"{failover}\"\n"),
            1,
        )
        .replacen(
            "delay = \"200ms\"",
            &format!("delay = \"{}s\"", RESTART_DELAY.as_secs()),
            1,
        );
    std::fs::write(&file, text).unwrap();

    let feed = Feed::start(kafka.bootstrap(), &topic, ORDERS);
    let fault = [(exactly::core::fault::FAIL_AT_ENV, "sink.pre_commit@0:10")];
    let mut run = spawn_with(&file, &[], &fault);
    feed.finish();
    let committed = wait_for_orders(url, &table, &mut run, ORDERS, Duration::from_secs(120));
    assert_eq!(
        committed,
        Some(ORDERS),
        "{failover}: the run ended before committing every order"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let (status, _, log) = wait(run, Duration::from_secs(60));
    assert!(status.success(), "{failover}: SIGTERM must end the run cleanly:\n{log}");
    assert!(
        log.contains("failure point reached"),
        "{failover}: the failure was not injected:\n{log}"
    );
    assert_eq!(
        log.matches("failed; restarting from its latest complete checkpoint")
            .count(),
        1,
        "{failover}: one restart:\n{log}"
    );
    assert_orders_exactly_once(url, &table, &name, ORDERS, failover);
    let outage = outage(url, &name);
    eprintln!(
        "{failover}: subtask 0 down {:?}, subtask 1 committed {} times meanwhile",
        outage.gap, outage.commits_of_1_during
    );
    outage
}

#[test]
fn a_failure_in_one_region_leaves_the_other_committing_and_ends_exactly_once() {
    let outage = run_with_one_failure("region");
    assert!(
        outage.gap >= RESTART_DELAY - Duration::from_millis(500),
        "subtask 0 was down for the restart delay (longest gap between its commits: {:?})",
        outage.gap
    );
    assert!(
        outage.commits_of_1_during >= 3,
        "subtask 1 kept committing while region 0 restarted ({} commits in {:?})",
        outage.commits_of_1_during,
        outage.gap
    );
}

#[test]
fn the_same_failure_in_global_failover_stops_every_commit_until_the_restart() {
    let outage = run_with_one_failure("global");
    assert!(
        outage.gap >= RESTART_DELAY - Duration::from_millis(500),
        "everything was down for the restart delay (longest gap of subtask 0: {:?})",
        outage.gap
    );
    assert_eq!(
        outage.commits_of_1_during, 0,
        "in global failover subtask 1 restarts with subtask 0, so it cannot commit in the gap"
    );
}
