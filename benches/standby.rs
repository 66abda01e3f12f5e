//! A hot standby's takeover after SIGKILL of the active process, and after
//! its SIGTERM (a clean hand-over), through the release `exactly` binary:
//! Kafka → PostgreSQL at parallelism 2 on the PostgreSQL checkpoint store,
//! with the default checkpoint settings.
//!
//! ```text
//! cargo bench --bench standby      # EXACTLY_BENCH_STANDBY_ROUNDS=7 by default
//! ```
//!
//! Each round: a topic fed 1,000 orders a second; the active `exactly run`
//! commits; a second `exactly run --standby` waits (its `exactly_standby`
//! gauge is 1); the active one is killed with SIGKILL at a point that moves
//! through the checkpoint interval from round to round; the bench polls the
//! standby's `/metrics` every 10 ms for the moment it holds the lock
//! (`exactly_standby` 0) and for its first commit (`exactly_commits_total`
//! 1), measured from the kill. Then the same rounds with SIGTERM in place
//! of SIGKILL: the active process takes a last checkpoint, commits it,
//! closes its sinks and records a clean release, and the standby recovers
//! without the grace it waits after a kill. The table must then hold each
//! order at most once (the standby is stopped with SIGTERM before the feed
//! ends, so some are not read yet).
//!
//! Then the same with workers (`[workers]`, lease term 3 s, renewal every
//! 1 s, margin 500 ms, poll 250 ms — the defaults) at parallelism 1: two
//! `exactly run` of the pipeline, one owning the region and one owning
//! nothing (a hot standby, `exactly_regions_owned` 0); the owner is killed
//! (SIGKILL: the standby claims when the lease runs out) or stopped
//! (SIGTERM: the region is handed over and its lease released at once);
//! measured from the signal to the standby's claim (`exactly_regions_owned`
//! 1) and to its first commit (`exactly_commits_total` growing).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_testkit::{KafkaBroker, PostgresServer};

const PARTITIONS: i32 = 4;
/// Orders produced per 50 ms: 1,000 a second.
const PER_TICK: i64 = 50;

fn main() -> Result<()> {
    // `cargo test --all-targets` runs harness-less benches without `--bench`.
    if !std::env::args().any(|a| a == "--bench") {
        println!("standby is a benchmark: run it with `cargo bench --bench standby`");
        return Ok(());
    }
    let rounds: u32 = std::env::var("EXACTLY_BENCH_STANDBY_ROUNDS")
        .ok()
        .map(|v| v.parse().context("EXACTLY_BENCH_STANDBY_ROUNDS must be a number"))
        .transpose()?
        .unwrap_or(7);
    let exactly = Path::new(env!("CARGO_BIN_EXE_exactly"));
    if !exactly.to_string_lossy().contains("release") {
        bail!("run it as `cargo bench --bench standby` (it measures the release build of exactly)");
    }
    eprintln!("[standby] starting Apache Kafka and PostgreSQL from the test kit");
    let kafka = KafkaBroker::builder().heap("1g").start()?;
    let postgres = PostgresServer::start_own()?;
    let modes = [
        (Mode::Standby, Signal::Kill),
        (Mode::Standby, Signal::Term),
        (Mode::Workers, Signal::Kill),
        (Mode::Workers, Signal::Term),
    ];
    for (mode, signal) in modes {
        let mut rows = Vec::new();
        for round in 0..rounds {
            // The signal moves through the 1 s checkpoint interval.
            let offset = Duration::from_millis(u64::from(round) * 1000 / u64::from(rounds.max(1)));
            let measured = takeover(
                exactly,
                kafka.bootstrap(),
                postgres.url(),
                (mode, signal, round),
                offset,
            )
            .with_context(|| format!("{} {} round {round}", mode.name(), signal.name()))?;
            eprintln!(
                "[standby] {} {} round {round}: taken {:.0} ms, first commit {:.0} ms after the signal",
                mode.name(),
                signal.name(),
                ms(measured.0),
                ms(measured.1)
            );
            rows.push((offset, measured));
        }
        report(mode, signal, &rows);
    }
    Ok(())
}

/// How the second process waits.
#[derive(Clone, Copy)]
enum Mode {
    /// `--standby` on the pipeline's lock (parallelism 2).
    Standby,
    /// `[workers]`: a worker that owns no region (parallelism 1).
    Workers,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Standby => "standby",
            Mode::Workers => "workers",
        }
    }
}

/// How the active process is stopped.
#[derive(Clone, Copy)]
enum Signal {
    /// SIGKILL: the standby waits the grace after taking the lock.
    Kill,
    /// SIGTERM: a clean hand-over, no grace.
    Term,
}

impl Signal {
    fn tag(self) -> &'static str {
        match self {
            Signal::Kill => "kill",
            Signal::Term => "term",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Signal::Kill => "SIGKILL",
            Signal::Term => "SIGTERM",
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One round: the active process and a waiting one (`mode`), `signal` to
/// the active one `offset` after its first commit; (signal → the waiting
/// one takes over, signal → its first commit).
fn takeover(
    exactly: &Path,
    bootstrap: &str,
    url: &str,
    (mode, signal, round): (Mode, Signal, u32),
    offset: Duration,
) -> Result<(Duration, Duration)> {
    let dir = tempfile::tempdir()?;
    // One pipeline, topic and table per round in the shared store.
    let name = format!("{}_{}_{round}", mode.name(), signal.tag());
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = feed(bootstrap, &name, stop.clone())?;
    let file = pipeline(dir.path(), bootstrap, &name, url, mode)?;
    let (active, mut standby) = match mode {
        Mode::Standby => {
            let mut active = Worker::start(exactly, &file, dir.path(), "active")?;
            active.wait_for("its first commit", |m| value(m, "exactly_commits_total") >= 1.0)?;
            let mut standby = Worker::start(exactly, &file, dir.path(), "standby")?;
            standby.wait_for("standby", |m| value(m, "exactly_standby") == 1.0)?;
            (active, standby)
        }
        Mode::Workers => settled_workers(exactly, &file, dir.path())?,
    };
    let before = standby.metrics().map_or(0.0, |m| value(&m, "exactly_commits_total"));
    std::thread::sleep(offset);

    let taken = |m: &str| match mode {
        Mode::Standby => value(m, "exactly_standby") == 0.0,
        Mode::Workers => value(m, "exactly_regions_owned") == 1.0,
    };
    let committed = |m: &str| value(m, "exactly_commits_total") > before;
    let (stopping, taken, first_commit) = signal_and_measure(active, &mut standby, signal, taken, committed)?;
    if let Some(active) = stopping {
        active.wait_clean()?;
        if matches!(mode, Mode::Standby) && !standby.log().contains("handed over cleanly") {
            bail!("SIGTERM did not hand the pipeline over cleanly:\n{}", standby.log());
        }
    }
    standby.stop()?;
    stop.store(true, Ordering::Relaxed);
    feeder.join().map_err(|_| anyhow::anyhow!("the feed panicked"))??;
    check_at_most_once(url, &name)?;
    Ok((taken, first_commit))
}

/// Two workers of `file` settled: one owns the region and committed (which
/// one depends on the order of their ids), the other owns nothing;
/// (the owner, the standby).
fn settled_workers(exactly: &Path, file: &Path, dir: &Path) -> Result<(Worker, Worker)> {
    let mut first = Worker::start(exactly, file, dir, "first")?;
    first.wait_for("its first commit", |m| value(m, "exactly_commits_total") >= 1.0)?;
    let mut second = Worker::start(exactly, file, dir, "second")?;
    // (regions owned, commits) of a worker.
    let state = |w: &Worker| {
        w.metrics()
            .map(|m| (value(&m, "exactly_regions_owned"), value(&m, "exactly_commits_total")))
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if !first.is_running() || !second.is_running() || Instant::now() > deadline {
            bail!("the workers did not settle:\n{}\n-----\n{}", first.log(), second.log());
        }
        match (state(&first), state(&second)) {
            (Some((1.0, commits)), Some((0.0, _))) if commits >= 1.0 => return Ok((first, second)),
            (Some((0.0, _)), Some((1.0, commits))) if commits >= 1.0 => return Ok((second, first)),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Stops `active` with `signal` and polls `standby`'s metrics every 10 ms
/// until `committed` holds: (the active one, still exiting after SIGTERM;
/// signal → `taken` first held, signal → `committed`).
fn signal_and_measure(
    active: Worker,
    standby: &mut Worker,
    signal: Signal,
    taken: impl Fn(&str) -> bool,
    committed: impl Fn(&str) -> bool,
) -> Result<(Option<Worker>, Duration, Duration)> {
    let signalled = Instant::now();
    let stopping = match signal {
        Signal::Kill => {
            active.kill();
            None
        }
        Signal::Term => Some(active.terminate()),
    };
    let mut taken_at = None;
    let first_commit = loop {
        if !standby.is_running() {
            bail!("the standby ended:\n{}", standby.log());
        }
        if signalled.elapsed() > Duration::from_secs(120) {
            bail!("no commit 120 s after the signal:\n{}", standby.log());
        }
        if let Some(metrics) = standby.metrics() {
            if taken_at.is_none() && taken(&metrics) {
                taken_at = Some(signalled.elapsed());
            }
            if committed(&metrics) {
                break signalled.elapsed();
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok((stopping, taken_at.unwrap_or(first_commit), first_commit))
}

/// Produces 1,000 orders a second into a new `topic` until `stop`.
fn feed(bootstrap: &str, topic: &str, stop: Arc<AtomicBool>) -> Result<std::thread::JoinHandle<Result<()>>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(KafkaAdmin::new(bootstrap).create_topic(topic, PARTITIONS))?;
    let (bootstrap, topic) = (bootstrap.to_string(), topic.to_string());
    Ok(std::thread::spawn(move || {
        runtime.block_on(async {
            let admin = KafkaAdmin::new(&bootstrap);
            let mut id = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let orders = (id..id + PER_TICK).map(|i| {
                    ProduceRecord::new(format!(r#"{{"id":{i},"amount":{}.50}}"#, i % 300))
                        .with_key(i.to_string())
                        .to_partition((i % i64::from(PARTITIONS)) as i32)
                });
                admin.produce(&topic, orders).await?;
                id += PER_TICK;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    }))
}

/// The round's pipeline file, named `name` like its topic and table:
/// defaults but for the PostgreSQL store and, by `mode`, standby at
/// parallelism 2 or workers at parallelism 1 (one region: one owner, one
/// standby worker).
fn pipeline(dir: &Path, bootstrap: &str, name: &str, url: &str, mode: Mode) -> Result<PathBuf> {
    let sections = exactly::config::orders_sections(bootstrap, name, url, name)
        .replace("stop_at_end = true", "stop_at_end = false");
    let (parallelism, waiting) = match mode {
        Mode::Standby => (2, "standby = true\n"),
        Mode::Workers => (1, "\n[workers]\n"),
    };
    let file = dir.join("pipeline.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"{name}\"\nparallelism = {parallelism}\n\n[checkpoint]\nstore = {{ postgres = \"{url}\" }}\n\
             {waiting}\n{sections}"
        ),
    )?;
    Ok(file)
}

/// The value of `metric` in a scrape (summed over its series; 0 when absent).
fn value(scrape: &str, metric: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Worker {
    child: Child,
    log: PathBuf,
    metrics: String,
}

impl Worker {
    fn start(exactly: &Path, file: &Path, dir: &Path, tag: &str) -> Result<Worker> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = dir.join(format!("{tag}.log"));
        let child = Command::new(exactly)
            .args([
                "run",
                &file.to_string_lossy(),
                "--metrics-listen",
                &format!("127.0.0.1:{port}"),
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok(Worker {
            child,
            log,
            metrics: format!("http://127.0.0.1:{port}/metrics"),
        })
    }

    fn metrics(&self) -> Option<String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        agent.get(&self.metrics).call().ok()?.body_mut().read_to_string().ok()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn wait_for(&mut self, what: &str, done: impl Fn(&str) -> bool) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if !self.is_running() {
                bail!("the run ended before {what}:\n{}", self.log());
            }
            if self.metrics().is_some_and(|m| done(&m)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("no {what} within 120 s:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM without waiting (see [`wait_clean`](Self::wait_clean)).
    fn terminate(self) -> Worker {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self
    }

    fn stop(self) -> Result<()> {
        self.terminate().wait_clean()
    }

    /// Waits for the exit, which must be a clean one.
    fn wait_clean(mut self) -> Result<()> {
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the run ended with {status}:\n{}", self.log());
        }
        Ok(())
    }
}

/// Every (partition, offset) at most once in `table`, no prepared
/// transaction left.
fn check_at_most_once(url: &str, table: &str) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let row = client
                .query_one(
                    &format!(
                        "SELECT count(*), count(DISTINCT (part, off)), (SELECT count(*) FROM pg_prepared_xacts) \
                         FROM {table}"
                    ),
                    &[],
                )
                .await?;
            let (rows, distinct, prepared): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
            if rows != distinct || prepared != 0 {
                bail!("{table}: {rows} rows, {distinct} distinct positions, {prepared} prepared transactions left");
            }
            anyhow::Ok(())
        })
}

fn report(mode: Mode, signal: Signal, rows: &[(Duration, (Duration, Duration))]) {
    println!();
    let taken_is = match mode {
        Mode::Standby => "standby holds the lock",
        Mode::Workers => "standby worker claims the region",
    };
    println!("{}: the active process stopped with {}:", mode.name(), signal.name());
    println!();
    println!("| round | signal after the active's first commit + | {taken_is} | standby's first commit |");
    println!("|---:|---:|---:|---:|");
    for (i, (offset, (taken, commit))) in rows.iter().enumerate() {
        println!(
            "| {i} | {:.0} ms | {:.0} ms | {:.0} ms |",
            ms(*offset),
            ms(*taken),
            ms(*commit)
        );
    }
    let stats = |pick: fn(&(Duration, Duration)) -> Duration| {
        let mut v: Vec<f64> = rows.iter().map(|(_, m)| ms(pick(m))).collect();
        v.sort_by(f64::total_cmp);
        let median = if v.is_empty() { 0.0 } else { v[v.len() / 2] };
        (median, v.last().copied().unwrap_or(0.0))
    };
    let (taken_median, taken_max) = stats(|m| m.0);
    let (commit_median, commit_max) = stats(|m| m.1);
    println!();
    println!("{taken_is}: median {taken_median:.0} ms, max {taken_max:.0} ms");
    println!("standby's first commit: median {commit_median:.0} ms, max {commit_max:.0} ms (target: median < 5000 ms)");
    match mode {
        Mode::Standby => println!(
            "settings: checkpoint interval 1 s (default), standby poll {} ms, PostgreSQL store, parallelism 2",
            exactly::config::STANDBY_POLL.as_millis()
        ),
        Mode::Workers => {
            let l = exactly::core::membership::LeaseSettings::default();
            println!(
                "settings: checkpoint interval 1 s (default), lease term {:?}, renewal every {:?}, margin {:?}, \
                 poll {:?} (the [workers] defaults), PostgreSQL store, parallelism 1",
                l.term, l.renew_every, l.margin, l.poll
            );
        }
    }
}
