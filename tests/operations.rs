//! Operating a pipeline, through the `exactly` binary on Apache Kafka and a
//! real PostgreSQL: the `/metrics` endpoint scraped and parsed while a
//! Kafka → PostgreSQL pipeline runs, `/health/ready` flipping from 503 to
//! 200 once recovery gets through, `exactly status` on a pipeline killed
//! with prepared transactions pending, `exactly checkpoints show`, JSON
//! logs, the catch-up progress line (only on a terminal), and the errors
//! of bad input. No password of a pipeline file may show in any of it.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::scrape::{get, Scrape};
use common::*;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_testkit::{free_port, KafkaBroker, PostgresServer};

const PARTITIONS: i32 = 3;
/// The password put into every PostgreSQL URL (the test kit's server
/// trusts local connections, so any password works): it must not show in
/// metrics, status output or logs.
const PASSWORD: &str = "s3cret-pw-4711";

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().subsec_nanos();
    format!("{name}_{}_{nanos}", std::process::id())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `postgres://postgres:<PASSWORD>@host:port/db` from the test kit's URL.
fn with_password(url: &str) -> String {
    let with = url.replacen("postgres@", &format!("postgres:{PASSWORD}@"), 1);
    assert_ne!(with, url, "the test kit's URL changed shape: {url}");
    with
}

fn order(id: i64) -> ProduceRecord {
    ProduceRecord::new(format!(r#"{{"id":{id},"customer":"c{}"}}"#, id % 7))
        .with_key(id.to_string())
        .to_partition((id % PARTITIONS as i64) as i32)
}

fn produce(bootstrap: &str, topic: &str, records: Vec<ProduceRecord>) {
    runtime().block_on(async {
        KafkaAdmin::new(bootstrap)
            .produce(topic, records)
            .await
            .expect("producing");
    });
}

fn create_topic(bootstrap: &str, topic: &str) {
    runtime().block_on(async {
        KafkaAdmin::new(bootstrap)
            .create_topic(topic, PARTITIONS)
            .await
            .expect("creating the topic")
    });
}

/// A Kafka → PostgreSQL pipeline file (`extra` is appended, e.g. a
/// `[metrics]` section).
#[allow(clippy::too_many_arguments)]
fn pipeline_file(
    dir: &Path,
    name: &str,
    bootstrap: &str,
    topic: &str,
    url: &str,
    table: &str,
    bounded: bool,
    extra: &str,
) -> PathBuf {
    let file = dir.join(format!("{name}.toml"));
    let sections = exactly::config::orders_sections(bootstrap, topic, url, table)
        .replace("stop_at_end = true", &format!("stop_at_end = {bounded}"));
    std::fs::write(
        &file,
        format!(
            "name = \"{name}\"\nparallelism = 2\nbatch_size = 50\n\n[checkpoint]\ndir = \"checkpoints\"\n\
             interval = \"200ms\"\n\n[restart]\nstrategy = \"fixed\"\ndelay = \"200ms\"\nmax_attempts = 1000\n\n\
             {sections}\n{extra}"
        ),
    )
    .unwrap();
    file
}

fn table_counts(url: &str, table: &str) -> (i64, i64) {
    runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let rows: i64 = client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or(0);
        let dead: i64 = client
            .query_one(&format!("SELECT count(*) FROM {table}_dead_letters"), &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or(0);
        (rows, dead)
    })
}

fn prepared_gids(url: &str, pipeline: &str) -> BTreeSet<String> {
    runtime().block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE $1",
                &[&format!("exactly:{pipeline}:%")],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    })
}

/// Polls `check` every 100 ms until it returns `Some`, at most `limit`.
fn wait_for<T>(what: &str, limit: Duration, check: impl FnMut() -> Option<T>) -> T {
    poll_for(limit, check).unwrap_or_else(|| panic!("{what} did not happen within {limit:?}"))
}

/// [`wait_for`], `None` after `limit`.
fn poll_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(t) = check() {
            return Some(t);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `exactly ARGS...`: status, stdout, stderr.
fn exactly(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    exactly_with_env(args, &[])
}

/// [`exactly`] with extra environment variables.
fn exactly_with_env(args: &[&str], env: &[(&str, &str)]) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_exactly"))
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("EXACTLY_CRASH_AT")
        .env_remove("EXACTLY_DELAY_AT")
        .envs(env.iter().copied())
        .output()
        .expect("running the exactly binary");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status_json(file: &Path) -> serde_json::Value {
    let (status, stdout, stderr) = exactly(&["status", file.to_str().unwrap(), "--json"]);
    assert!(status.success(), "exactly status failed: {stderr}\n{stdout}");
    assert!(
        !stdout.contains(PASSWORD) && !stderr.contains(PASSWORD),
        "the password leaked:\n{stdout}"
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{stdout}"))
}

/// `exactly ARGS...` in the background, its output drained as it runs.
struct Running {
    child: std::process::Child,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Running {
    fn start(args: &[&str]) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_exactly"))
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("EXACTLY_CRASH_AT")
            .env_remove("EXACTLY_DELAY_AT")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting the exactly binary");
        let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = pipe.read_to_string(&mut text);
                text
            })
        };
        let stdout = drain(Box::new(child.stdout.take().unwrap()));
        let stderr = drain(Box::new(child.stderr.take().unwrap()));
        Running {
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Kills it and returns its stderr (for a failure message).
    fn kill_for_log(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr.take().map(|h| h.join().unwrap()).unwrap_or_default()
    }

    /// Waits at most `limit` (then kills it and panics with its log).
    fn wait(mut self, limit: Duration) -> (std::process::ExitStatus, String, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let text = |h: Option<std::thread::JoinHandle<String>>| h.map(|h| h.join().unwrap()).unwrap_or_default();
        let (stdout, stderr) = (text(self.stdout.take()), text(self.stderr.take()));
        match status {
            Some(status) => (status, stdout, stderr),
            None => panic!("exactly did not finish within {limit:?}:\n{stderr}"),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

fn sigterm(pid: u32) {
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
}

/// The main proof: a Kafka → PostgreSQL pipeline started while its
/// database is down is not ready (503) while recovery fails, becomes ready
/// (200) once the database is back, and its scraped metrics add up: every
/// record written is a row or the one dead letter, the lag falls to 0,
/// checkpoints keep completing.
#[test]
fn metrics_and_health_of_a_running_kafka_to_postgres_pipeline() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let mut postgres = PostgresServer::start_own().expect("starting PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let (name, topic, table) = (unique("ops_metrics"), unique("ops_metrics"), unique("ops_metrics"));
    create_topic(kafka.bootstrap(), &topic);
    let orders = 1500;
    let mut records: Vec<ProduceRecord> = (0..orders).map(order).collect();
    records.push(ProduceRecord::new("not json at all").with_key("bad").to_partition(1));
    produce(kafka.bootstrap(), &topic, records);

    let port = free_port().expect("a free port");
    let base = format!("http://127.0.0.1:{port}");
    let url = with_password(postgres.url());
    let file = pipeline_file(
        dir.path(),
        &name,
        kafka.bootstrap(),
        &topic,
        &url,
        &table,
        false,
        "[metrics]\nlag_interval = \"300ms\"\n",
    );
    postgres.stop().expect("stopping PostgreSQL");
    let mut run = Running::start(&[
        "run",
        file.to_str().unwrap(),
        "--metrics-listen",
        &format!("127.0.0.1:{port}"),
    ]);

    // Live at once; not ready while recovery cannot reach the database.
    let (status, body) = wait_for("the endpoint answering", Duration::from_secs(30), || {
        get(&format!("{base}/health/live"))
    });
    assert_eq!(status, 200, "{body}");
    let live: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(live["status"], "live");
    assert_eq!(live["pipeline"], name.as_str());
    wait_for("a failed recovery", Duration::from_secs(30), || {
        (Scrape::take(&base).value("exactly_restarts_total") >= 2.0).then_some(())
    });
    let (status, body) = get(&format!("{base}/health/ready")).unwrap();
    assert_eq!(status, 503, "ready although PostgreSQL is down: {body}");
    let not_ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(not_ready["status"], "not ready");
    assert!(
        not_ready["reason"]
            .as_str()
            .unwrap()
            .contains("no checkpoint completed"),
        "{body}"
    );
    assert_eq!(Scrape::take(&base).value("exactly_ready"), 0.0);
    assert_eq!(get(&format!("{base}/nothing-here")).unwrap().0, 404);

    postgres.restart().expect("restarting PostgreSQL");
    let body = wait_for("/health/ready answering 200", Duration::from_secs(60), || {
        get(&format!("{base}/health/ready"))
            .filter(|(status, _)| *status == 200)
            .map(|(_, b)| b)
    });
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["status"], "ready", "{body}");
    assert!(ready["last_checkpoint"].as_u64().unwrap() > 0, "{body}");

    // A quiet moment: everything read, committed, and the lag caught up.
    let plain_url = postgres.url().to_string();
    let mut last_seen = String::from("nothing scraped yet");
    let scrape = poll_for(Duration::from_secs(90), || {
        let (rows, dead) = table_counts(&plain_url, &table);
        let scrape = Scrape::take(&base);
        let lag = scrape.sum("exactly_consumer_lag_records", &[]);
        let pending = scrape.value("exactly_pending_transactions");
        last_seen = format!("last seen: {rows} rows, {dead} dead letters, lag {lag:?}, {pending} pending");
        (rows == orders && dead == 1 && lag == Some(0.0) && pending == 0.0).then_some(scrape)
    })
    .unwrap_or_else(|| {
        panic!(
            "the pipeline did not catch up within 90 s ({last_seen}); its log:\n{}",
            run.kill_for_log()
        )
    });
    let (rows, dead) = table_counts(&plain_url, &table);
    assert_eq!((rows, dead), (orders, 1));
    assert_eq!(
        scrape.value("exactly_records_written_total"),
        (rows + dead) as f64,
        "records written must be the rows plus the dead letter (nothing was replayed):\n{}",
        scrape.text
    );
    assert_eq!(scrape.value("exactly_records_read_total"), (orders + 1) as f64);
    assert_eq!(
        scrape.value("exactly_dead_letters_total"),
        1.0,
        "the dead letter counted once"
    );
    let lag_series = scrape.series("exactly_consumer_lag_records");
    let partitions: BTreeSet<&str> = lag_series.iter().filter_map(|s| s.labels.get("partition")).collect();
    assert_eq!(partitions, BTreeSet::from(["0", "1", "2"]), "one lag per partition");
    assert!(lag_series.iter().all(|s| s.labels.get("topic") == Some(topic.as_str())));
    let subtasks: BTreeSet<&str> = scrape
        .series("exactly_records_written_total")
        .iter()
        .filter_map(|s| s.labels.get("subtask"))
        .collect();
    assert_eq!(subtasks, BTreeSet::from(["0", "1"]));
    assert!(scrape.value("exactly_written_bytes_total") > 0.0);
    for sample in &scrape.parsed.samples {
        assert_eq!(sample.labels.get("pipeline"), Some(name.as_str()), "{}", sample.metric);
    }
    assert!(
        matches!(
            scrape
                .series("exactly_checkpoint_duration_seconds")
                .first()
                .map(|s| &s.value),
            Some(prometheus_parse::Value::Histogram(_))
        ),
        "the checkpoint duration is a histogram:\n{}",
        scrape.text
    );
    assert!(
        scrape.text.contains("exactly_commit_latency_seconds_bucket"),
        "{}",
        scrape.text
    );
    let commits = scrape.value("exactly_commits_total");
    assert!(commits > 0.0);
    assert!(scrape.value("exactly_last_checkpoint_age_seconds") < 30.0);

    // Checkpoints keep completing while nothing arrives.
    let completed = scrape.value("exactly_checkpoints_completed_total");
    let last_id = scrape.value("exactly_last_checkpoint_id");
    std::thread::sleep(Duration::from_secs(1));
    let later = Scrape::take(&base);
    assert!(later.value("exactly_checkpoints_completed_total") > completed);
    assert!(later.value("exactly_last_checkpoint_id") > last_id);
    assert_eq!(later.value("exactly_records_written_total"), (rows + dead) as f64);

    // exactly status next to the running pipeline: it does not take the
    // lock (the pipeline goes on), sees it running, and no lag.
    let report = status_json(&file);
    assert_eq!(report["running"]["locked"], true, "{report:#}");
    assert_eq!(report["total_lag"], 0, "{report:#}");
    assert!(report["checkpoints"][0]["latest"]["id"].as_u64().unwrap() > 0);
    assert!(run.is_running(), "exactly status disturbed the pipeline");

    let metrics_text = later.text.clone();
    sigterm(run.child.id());
    let (exit, stdout, stderr) = run.wait(Duration::from_secs(60));
    assert!(exit.success(), "the pipeline failed: {exit}\n{stderr}");
    assert!(stdout.contains("\"dead_letters\":1"), "{stdout}");
    for (what, text) in [("metrics", &metrics_text), ("logs", &stderr), ("summary", &stdout)] {
        assert!(!text.contains(PASSWORD), "the password leaked into the {what}:\n{text}");
    }
    let (rows, _) = table_counts(&plain_url, &table);
    assert_eq!(rows, orders, "every order exactly once");
}

/// Orders `0..count` produced from a background thread by one producer,
/// 50 every 25 ms, so a pipeline reading them spans many checkpoints, each
/// with data.
fn feed(bootstrap: &str, topic: &str, count: i64) -> std::thread::JoinHandle<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("creating the feed's producer");
    let topic = topic.to_string();
    std::thread::spawn(move || {
        runtime().block_on(async {
            for start in (0..count).step_by(50) {
                let mut deliveries = Vec::new();
                for id in start..(start + 50).min(count) {
                    let record = order(id);
                    let key = id.to_string();
                    let message = FutureRecord::to(&topic)
                        .key(&key)
                        .payload(record.value.as_deref().unwrap())
                        .partition(record.partition.unwrap());
                    deliveries.push(
                        producer
                            .send_result(message)
                            .map_err(|(e, _)| e)
                            .expect("queueing an order"),
                    );
                }
                for d in deliveries {
                    d.await
                        .expect("the producer is alive")
                        .map_err(|(e, _)| e)
                        .expect("delivering an order");
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    })
}

/// `exactly status` on a pipeline killed right after a checkpoint was
/// persisted, before its transactions were committed: it lists the
/// prepared transactions the server holds, and says recovery commits the
/// ones the checkpoint lists.
#[test]
fn status_lists_the_prepared_transactions_a_killed_pipeline_left() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let mut postgres = PostgresServer::start_own().expect("starting PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let (name, topic, table) = (unique("ops_status"), unique("ops_status"), unique("ops_status"));
    create_topic(kafka.bootstrap(), &topic);
    let orders = 6000;
    let url = with_password(postgres.url());
    let file = pipeline_file(dir.path(), &name, kafka.bootstrap(), &topic, &url, &table, true, "");
    let fed = dir.path().join(format!("{name}-fed.toml"));
    std::fs::write(
        &fed,
        std::fs::read_to_string(&file)
            .unwrap()
            .replace("stop_at_end = true", "stop_at_end = false"),
    )
    .unwrap();
    let file_arg = file.to_str().unwrap();

    let producing = feed(kafka.bootstrap(), &topic, orders);
    // Killed after a persisted checkpoint that lists prepared transactions
    // (an interval in which a region read nothing prepares none).
    run_killed_at(&fed, "coordinator.after_persist_pending:4");
    assert!(
        !producing.is_finished(),
        "the feed ended before the crash: it did not hit a run in progress"
    );
    producing.join().unwrap();
    let left = prepared_gids(postgres.url(), &name);
    assert!(!left.is_empty(), "the crash left no prepared transaction");

    let report = status_json(&file);
    assert_eq!(report["running"]["locked"], false, "{report:#}");
    let sequences = report["checkpoints"].as_array().expect("checkpoint sequences");
    let mut pending = BTreeSet::new();
    for sequence in sequences {
        let latest = &sequence["latest"];
        assert!(latest["id"].as_u64().is_some(), "no complete checkpoint: {report:#}");
        for list in latest["pending"].as_object().expect("pending per subtask").values() {
            for p in list.as_array().unwrap() {
                pending.insert(p["committable"]["gid"].as_str().unwrap().to_string());
            }
        }
    }
    assert!(
        !pending.is_empty(),
        "the persisted checkpoints list nothing: {report:#}"
    );
    let listed: Vec<&serde_json::Value> = report["prepared_transactions"]
        .as_array()
        .expect("a list")
        .iter()
        .collect();
    let names: BTreeSet<String> = listed.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(
        names, left,
        "status must list exactly the server's prepared transactions of the pipeline"
    );
    for p in &listed {
        let gid = p["name"].as_str().unwrap();
        let is_listed = pending.contains(gid);
        assert_eq!(p["listed"], is_listed, "{p}");
        assert_eq!(p["on_recovery"], if is_listed { "commit" } else { "roll back" }, "{p}");
        assert_eq!(
            p["checkpoint"].as_u64(),
            gid.rsplit(':').next().unwrap().parse().ok(),
            "{p}"
        );
    }
    assert!(
        left.iter().any(|g| pending.contains(g)),
        "the listed transactions are still prepared"
    );
    let positions: BTreeSet<String> = sequences
        .iter()
        .flat_map(|s| s["latest"]["positions"].as_object().unwrap().keys().cloned())
        .collect();
    assert!(positions.contains(&format!("{topic}-0")), "{report:#}");
    assert!(
        report["total_lag"].as_i64().unwrap() > 0,
        "not everything was committed before the kill"
    );
    let latest = &sequences[0]["latest"];
    let shown_pending: BTreeSet<String> = latest["pending"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|l| l.as_array().unwrap().iter())
        .map(|p| p["committable"]["gid"].as_str().unwrap().to_string())
        .collect();

    let (status, text, stderr) = exactly(&["status", file_arg]);
    assert!(status.success(), "{stderr}");
    for gid in &left {
        assert!(text.contains(gid.as_str()), "{gid} missing from:\n{text}");
    }
    assert!(text.contains("recovery commits it"), "{text}");
    assert!(text.contains("consumer lag"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");

    // The latest entry, shown readably and as JSON.
    let entry =
        PathBuf::from(report["checkpoints"][0]["folder"].as_str().unwrap()).join(latest["entry"].as_str().unwrap());
    let (status, shown, stderr) = exactly(&["checkpoints", "show", entry.to_str().unwrap()]);
    assert!(status.success(), "{stderr}");
    assert!(shown.contains(&format!("checkpoint {}", latest["id"])), "{shown}");
    for gid in &shown_pending {
        assert!(shown.contains(gid.as_str()), "{gid} missing from:\n{shown}");
    }
    let (status, json, _) = exactly(&["checkpoints", "show", entry.to_str().unwrap(), "--json"]);
    assert!(status.success());
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed["checkpoint"]["id"], latest["id"]);

    // Bad input: a damaged entry, a folder, a missing pipeline file.
    let damaged = entry.clone();
    let copy_dir = dir.path().join("copy").join(&name);
    std::fs::create_dir_all(&copy_dir).unwrap();
    let copy = copy_dir.join(latest["entry"].as_str().unwrap());
    let bytes = std::fs::read_to_string(&damaged).unwrap();
    std::fs::write(&copy, bytes.replacen("\"positions\"", "\"positionz\"", 1)).unwrap();
    let (status, _, err) = exactly(&["checkpoints", "show", copy.to_str().unwrap()]);
    assert!(!status.success());
    assert!(err.contains("is unreadable") && err.contains("Fix:"), "{err}");
    let (status, _, err) = exactly(&["checkpoints", "show", copy_dir.to_str().unwrap()]);
    assert!(!status.success());
    assert!(err.contains("is a folder") && err.contains("Fix:"), "{err}");
    let missing = dir.path().join("nope.toml");
    let (status, _, err) = exactly(&["status", missing.to_str().unwrap()]);
    assert!(!status.success());
    assert!(err.contains("nope.toml") && err.contains("Fix:"), "{err}");

    // An unreachable database: the rest is still shown, the command fails
    // naming the server (without the password) and the fix.
    postgres.stop().expect("stopping PostgreSQL");
    let (status, text, err) = exactly(&["status", file_arg]);
    assert!(
        !status.success(),
        "status must fail when the sink cannot be asked:\n{text}"
    );
    assert!(text.contains("latest complete checkpoint"), "{text}");
    let port = postgres.port().to_string();
    assert!(
        err.contains("cannot connect to PostgreSQL") && err.contains(&port),
        "{err}"
    );
    assert!(err.contains("Check that the server is running"), "{err}");
    assert!(!err.contains(PASSWORD) && !text.contains(PASSWORD), "{err}");
    postgres.restart().expect("restarting PostgreSQL");

    // Recovery commits the listed ones, rolls back the rest; afterwards
    // nothing is left and nothing lags.
    run_to_completion(&file);
    assert!(prepared_gids(postgres.url(), &name).is_empty());
    let report = status_json(&file);
    assert_eq!(report["prepared_transactions"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["total_lag"], 0, "{report:#}");
    assert_eq!(table_counts(postgres.url(), &table).0, orders);
}

/// `--log-format json` writes one JSON object per line; without a terminal
/// no progress line is drawn, on a terminal (a pseudo-terminal from
/// `script`) it is, while the backlog lasts.
#[test]
fn json_logs_and_a_progress_line_only_on_a_terminal() {
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let dir = tempfile::tempdir().unwrap();
    let topic = unique("ops_progress");
    create_topic(kafka.bootstrap(), &topic);
    produce(kafka.bootstrap(), &topic, (0..20_000).map(order).collect());
    let write = |name: &str| {
        let file = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &file,
            format!(
                "name = \"{name}\"\nparallelism = 2\nbatch_size = 20\n[checkpoint]\ndir = \"checkpoints\"\n\
                 interval = \"200ms\"\n[source.kafka]\nbootstrap = \"{}\"\ntopic = \"{topic}\"\nstart = \"earliest\"\n\
                 stop_at_end = true\n[sink.file]\ndir = \"out-{name}\"\n",
                kafka.bootstrap()
            ),
        )
        .unwrap();
        file
    };

    let piped = write("piped");
    // The same backlog as on the terminal below (the first pre-commit
    // waits 3 s), so a progress line would have had time to show.
    let (status, _, stderr) = exactly_with_env(
        &["--log-format", "json", "run", piped.to_str().unwrap()],
        &[("EXACTLY_DELAY_AT", "sink.after_pre_commit:1=3s")],
    );
    assert!(status.success(), "{stderr}");
    // Every line is JSON but the delay point's own marker, which a build
    // with fault injection writes raw for the crash kit.
    let marker = exactly::core::fault::DELAY_MARKER;
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with(marker))
        .collect();
    assert!(lines.len() > 3, "{stderr}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
    }
    assert!(
        lines.iter().any(|l| l.contains("checkpoint complete")),
        "the checkpoint log lines are there: {stderr}"
    );
    assert!(
        !stderr.contains("catching up"),
        "a progress line without a terminal:\n{stderr}"
    );

    // `script` runs the command on a pseudo-terminal and copies what it
    // shows to its own stdout.
    let tty = write("tty");
    let command = format!("{} run {}", env!("CARGO_BIN_EXE_exactly"), tty.display());
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .env("RUST_LOG", "warn")
        // The first pre-commit waits, so the backlog lasts a few seconds
        // whatever the machine's speed.
        .env("EXACTLY_DELAY_AT", "sink.after_pre_commit:1=3s")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("`script` (util-linux) runs the pipeline on a pseudo-terminal; install bsdutils / util-linux");
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    assert!(
        screen.contains("catching up"),
        "no progress line on a terminal:\n{screen}"
    );
    assert!(screen.contains("records") && screen.contains("lag "), "{screen}");
}
