//! The latency phase of a run: a fresh topic, the run started unbounded, a
//! steady producer, and a monitor polling what a reader can see.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use crate::baselines::spawn_baseline;
use crate::child::ChildEvent;
use crate::input::{create_topic, produce_steadily};
use crate::measure::percentile;
use crate::pipelines::{spawn_pipeline, write_pipeline};
use crate::runs::Kind;
use crate::services::pg_connect;
use crate::workload::{target_name, unix_ms_now, PARTITIONS};
use crate::Ctx;

/// How often the monitor looks for newly visible rows.
const MONITOR_INTERVAL: Duration = Duration::from_millis(10);

pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub missing: usize,
    /// Produce → broker acknowledgement, the part of the latency before any consumer.
    pub ack_p50_ms: f64,
    pub ack_p99_ms: f64,
    pub notes: Vec<String>,
}

/// Per partition, the highest offset visible to a reader, from the sink's
/// point of view: committed rows in PostgreSQL, or the fenced counters in Redis
/// (the count of partition `p` on a fresh topic is its visible offset + 1).
enum Visibility {
    Postgres(tokio_postgres::Client, tokio::runtime::Runtime, String),
    Redis(redis::Connection, String, String),
}

impl Visibility {
    fn read(&mut self) -> Result<[Option<i64>; PARTITIONS as usize]> {
        let mut out = [None; PARTITIONS as usize];
        match self {
            Visibility::Postgres(client, rt, table) => {
                // One index lookup per partition (primary key (part, off)).
                let sql = format!(
                    "SELECT p, (SELECT max(off) FROM {table} WHERE part = p) FROM generate_series(0, {}) AS p",
                    PARTITIONS - 1
                );
                for row in rt.block_on(client.query(&sql, &[]))? {
                    let p: i32 = row.get(0);
                    out[p as usize] = row.get(1);
                }
            }
            Visibility::Redis(con, hash, topic) => {
                let mut cmd = redis::cmd("HMGET");
                cmd.arg(&*hash);
                for p in 0..PARTITIONS {
                    cmd.arg(format!("{topic}-{p}"));
                }
                let counts: Vec<Option<i64>> = cmd.query(con)?;
                for (p, c) in counts.into_iter().enumerate() {
                    out[p] = c.filter(|c| *c > 0).map(|c| c - 1);
                }
            }
        }
        Ok(out)
    }
}

fn visibility(ctx: &Ctx, kind: Kind, target: &str, topic: &str) -> Result<Visibility> {
    Ok(if kind == Kind::RedisFenced {
        Visibility::Redis(
            redis::Client::open(ctx.redis_url.as_str())?.get_connection()?,
            target.to_string(),
            topic.to_string(),
        )
    } else {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = rt.block_on(pg_connect(&ctx.pg_url))?;
        Visibility::Postgres(client, rt, target.to_string())
    })
}

/// The latency phase of run `name`.
pub fn latency_run(ctx: &Ctx, kind: Kind, name: &str) -> Result<Latency> {
    let topic = format!("lat-{name}");
    let target = target_name(name, "lat");
    let (rate, secs) = (ctx.settings.latency_rate, ctx.settings.latency_secs);
    ctx.pg.rt.block_on(create_topic(&ctx.bootstrap, &topic))?;
    if kind.writes_postgres() {
        ctx.pg.fresh_table(&target, kind.table_shape())?;
    }
    let running = if kind.is_pipeline() {
        let file = write_pipeline(ctx, kind, &format!("{name}-lat"), &topic, &target, false)?;
        let running = spawn_pipeline(ctx, &file)?;
        // Running: the sources are assigned and the sinks connected.
        running.wait_for(Duration::from_secs(120), |e| matches!(e, ChildEvent::Checkpoint))?;
        running
    } else {
        let running = spawn_baseline(ctx, kind, name, &topic, &target, true)?;
        running.wait_for(Duration::from_secs(120), |e| matches!(e, ChildEvent::Ready))?;
        running
    };
    let mut visibility = visibility(ctx, kind, &target, &topic)?;
    // The monitor: (partition, highest visible offset, Unix ms of the answer).
    let stop = Arc::new(AtomicBool::new(false));
    let latest = Arc::new(Mutex::new([None::<i64>; PARTITIONS as usize]));
    let monitor = {
        let (stop, latest) = (stop.clone(), latest.clone());
        std::thread::spawn(move || -> Result<Vec<Vec<(i64, f64)>>> {
            let mut seen: Vec<Vec<(i64, f64)>> = vec![Vec::new(); PARTITIONS as usize];
            while !stop.load(Ordering::SeqCst) {
                let visible = visibility.read()?;
                let at = unix_ms_now();
                for (p, v) in visible.iter().enumerate() {
                    if let Some(v) = *v {
                        if seen[p].last().is_none_or(|(last, _)| v > *last) {
                            seen[p].push((v, at));
                        }
                    }
                }
                *latest.lock().unwrap() = visible;
                std::thread::sleep(MONITOR_INTERVAL);
            }
            Ok(seen)
        })
    };
    eprintln!("[bench] {}: producing {rate} records/s for {secs} s", kind.id());
    let produced = produce_steadily(&ctx.bootstrap, &topic, rate, secs);
    let mut last = [None::<i64>; PARTITIONS as usize];
    if let Ok(produced) = &produced {
        for (p, o, _, _) in produced {
            let l = &mut last[*p as usize];
            *l = Some(l.map_or(*o, |x: i64| x.max(*o)));
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            let now = *latest.lock().unwrap();
            if last
                .iter()
                .zip(now.iter())
                .all(|(want, got)| want.is_none() || got >= want)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    stop.store(true, Ordering::SeqCst);
    let seen = monitor.join().map_err(|_| anyhow!("the monitor panicked"))?;
    running.signal(libc::SIGTERM);
    let finished = running.finish(Duration::from_secs(300));
    if kind.writes_postgres() {
        ctx.pg.cleanup_table(&target)?;
    }
    let (produced, seen, finished) = (produced?, seen?, finished?);
    if kind.is_pipeline() && !finished.success() {
        bail!(
            "the pipeline ended with {} after SIGTERM:\n{}",
            finished.describe_status(),
            finished.log.log_tail
        );
    }
    let mut latencies = Vec::with_capacity(produced.len());
    let mut missing = 0;
    let mut acks: Vec<f64> = produced.iter().map(|(_, _, ts, acked)| acked - ts).collect();
    acks.sort_by(f64::total_cmp);
    for (p, offset, ts, _) in &produced {
        let obs = &seen[*p as usize];
        let i = obs.partition_point(|(v, _)| v < offset);
        match obs.get(i) {
            Some((_, at)) => latencies.push((at - ts).max(0.0)),
            None => missing += 1,
        }
    }
    if latencies.is_empty() {
        bail!("no produced record became visible");
    }
    latencies.sort_by(f64::total_cmp);
    let l = Latency {
        samples: latencies.len(),
        p50_ms: percentile(&latencies, 50.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: *latencies.last().unwrap(),
        missing,
        ack_p50_ms: percentile(&acks, 50.0),
        ack_p99_ms: percentile(&acks, 99.0),
        notes: finished.log.notes("latency run"),
    };
    eprintln!(
        "[bench] {}: latency p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} records ({} never visible); \
         produce→ack p50 {:.0} ms, p99 {:.0} ms",
        name, l.p50_ms, l.p99_ms, l.max_ms, l.samples, l.missing, l.ack_p50_ms, l.ack_p99_ms
    );
    Ok(l)
}
