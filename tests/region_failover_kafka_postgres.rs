//! Region failover of a Kafka → PostgreSQL pipeline through the `exactly`
//! binary, on Apache Kafka and a real PostgreSQL, while the topic is being
//! fed: sink subtask 0's pre-commit fails once (`EXACTLY_FAIL_AT`), so its
//! region restarts after a 3 s delay. From the failure to the restart (both
//! read from the run's log) subtask 0 commits nothing; in region failover,
//! sink subtask 1 keeps committing meanwhile (read from the commit log's
//! `committed_at`); in global failover, the control, nothing commits until
//! everything restarted. Both end with every order exactly once.

mod common;

use std::time::Duration;

use common::orders::*;
use common::*;
use exactly_testkit::{KafkaBroker, PostgresServer};

/// A feed of at least 5 s (50 orders every 25 ms).
const ORDERS: i64 = 10_000;

/// The restart delay: the outage of the failed part.
const RESTART_DELAY: Duration = Duration::from_secs(3);

/// The outage the test causes, judged by what happened rather than by the
/// configured delay alone: it runs from the injected failure (the log line
/// saying so) to the restart of the failed part (the next line of a restore,
/// which comes after the restart delay), and the commits of each sink
/// subtask inside it come from the commit log's `committed_at`. A commit
/// of the checkpoint before the failure may land a moment after it, so the
/// first half second is left out.
struct Outage {
    /// From the failure to the restart.
    length: Duration,
    /// Commits of subtask 0 (the failed one) inside it.
    commits_of_0_during: usize,
    /// Commits of subtask 1 inside it.
    commits_of_1_during: usize,
}

/// When the first line of `log` after `after` (Unix seconds) that contains
/// `text` was written, by its timestamp, in Unix seconds.
fn logged_at(log: &str, text: &str, after: f64) -> Option<f64> {
    log.lines().filter(|line| line.contains(text)).find_map(|line| {
        let plain = strip_ansi(line);
        let stamp = plain.split_whitespace().next()?;
        let at = humantime::parse_rfc3339_weak(stamp).ok()?;
        let at = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
        (at >= after).then_some(at)
    })
}

fn outage(url: &str, name: &str, log: &str) -> Outage {
    const EDGE: f64 = 0.5;
    let failed = logged_at(log, "failure point reached", 0.0)
        .unwrap_or_else(|| panic!("no timestamped failure line in the log:\n{log}"));
    let restarted = ["restoring from checkpoint", "no checkpoint found"]
        .iter()
        .filter_map(|line| logged_at(log, line, failed))
        .min_by(f64::total_cmp)
        .unwrap_or_else(|| panic!("no restore after the failure in the log:\n{log}"));
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
    let during = |subtask: i32| {
        commits
            .iter()
            .filter(|(s, t)| *s == subtask && *t > failed + EDGE && *t < restarted)
            .count()
    };
    Outage {
        length: Duration::from_secs_f64(restarted - failed),
        commits_of_0_during: during(0),
        commits_of_1_during: during(1),
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
    let outage = outage(url, &name, &log);
    eprintln!(
        "{failover}: from the failure to the restart {:?}; commits meanwhile: subtask 0 {}, subtask 1 {}",
        outage.length, outage.commits_of_0_during, outage.commits_of_1_during
    );
    assert!(
        outage.length >= RESTART_DELAY,
        "{failover}: the failed part restarted {:?} after the failure, before the restart delay",
        outage.length
    );
    assert_eq!(
        outage.commits_of_0_during, 0,
        "{failover}: the failed subtask 0 committed while it was down"
    );
    outage
}

#[test]
fn a_failure_in_one_region_leaves_the_other_committing_and_ends_exactly_once() {
    let outage = run_with_one_failure("region");
    assert!(
        outage.commits_of_1_during >= 3,
        "subtask 1 kept committing while region 0 restarted ({} commits in {:?})",
        outage.commits_of_1_during,
        outage.length
    );
}

#[test]
fn the_same_failure_in_global_failover_stops_every_commit_until_the_restart() {
    let outage = run_with_one_failure("global");
    assert_eq!(
        outage.commits_of_1_during, 0,
        "in global failover subtask 1 restarts with subtask 0, so it cannot commit in the gap"
    );
}
