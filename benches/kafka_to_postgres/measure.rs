//! What a run costs, read from the kernel and the services: CPU time of the
//! broker and PostgreSQL (`/proc`), peak RSS (`VmHWM`), the transactions
//! PostgreSQL and Redis counted, and percentiles.

use std::path::Path;

use anyhow::{Context, Result};

/// CPU seconds of one run: the measured process, the broker, the store it
/// writes (PostgreSQL, or Redis for the Redis row), and the whole machine
/// (every process, this bench and others included).
pub struct CpuUse {
    pub process_s: f64,
    pub broker_s: Option<f64>,
    pub store_s: Option<f64>,
    pub machine_s: Option<f64>,
    /// Time the hypervisor ran something else while this VM wanted a CPU.
    pub steal_s: Option<f64>,
}

/// A [`CpuProbe::sample`]: CPU seconds used so far.
#[derive(Clone, Copy)]
pub struct CpuSample {
    broker_s: Option<f64>,
    postgres_s: Option<f64>,
    redis_s: Option<f64>,
    machine_s: Option<f64>,
    steal_s: Option<f64>,
}

impl CpuUse {
    /// What the services and the machine used between `before` and `after`,
    /// beside `process_s` of the measured child, which wrote into Redis or
    /// PostgreSQL.
    pub fn between(process_s: f64, before: CpuSample, after: CpuSample, into_redis: bool) -> CpuUse {
        let delta = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a - b);
        CpuUse {
            process_s,
            broker_s: delta(after.broker_s, before.broker_s),
            store_s: if into_redis {
                delta(after.redis_s, before.redis_s)
            } else {
                delta(after.postgres_s, before.postgres_s)
            },
            machine_s: delta(after.machine_s, before.machine_s),
            steal_s: delta(after.steal_s, before.steal_s),
        }
    }
}

/// Reads the CPU time the broker, PostgreSQL and Redis have used so far:
/// from /proc, and from Redis itself (`INFO cpu`).
pub struct CpuProbe {
    /// The broker's JVM (every thread of it: `/proc/<pid>/stat` sums them).
    broker: Option<u32>,
    postmaster: Option<u32>,
    redis_url: String,
    ticks_per_s: f64,
}

/// (ppid, utime + stime, cutime + cstime) of a process, in clock ticks.
fn proc_times(pid: u32) -> Option<(u32, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces): state, ppid, ...
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split_whitespace().collect();
    let num = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let ppid = fields.get(1)?.parse().ok()?;
    Some((ppid, num(11)? + num(12)?, num(13)? + num(14)?))
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

impl CpuProbe {
    /// `broker`: the JVM's pid (none for an external Kafka); `pg_data_dir`:
    /// where the postmaster writes its pid (none for an external server).
    pub fn new(broker: Option<u32>, pg_data_dir: Option<&Path>, redis_url: &str) -> CpuProbe {
        let postmaster = pg_data_dir
            .and_then(|d| std::fs::read_to_string(d.join("postmaster.pid")).ok())
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()));
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        CpuProbe {
            broker,
            postmaster,
            redis_url: redis_url.to_string(),
            ticks_per_s: if ticks > 0 { ticks as f64 } else { 100.0 },
        }
    }

    /// CPU seconds so far of the broker, of PostgreSQL (the postmaster, its
    /// live children and the children it has reaped), of Redis and of the
    /// machine (every CPU's non-idle time, `/proc/stat`).
    pub fn sample(&self) -> CpuSample {
        let broker_s = self
            .broker
            .and_then(proc_times)
            .map(|(_, own, _)| own as f64 / self.ticks_per_s);
        let postgres_s = self.postmaster.and_then(|pm| {
            let (_, own, reaped) = proc_times(pm)?;
            let children: u64 = all_pids()
                .into_iter()
                .filter_map(proc_times)
                .filter(|(ppid, _, _)| *ppid == pm)
                .map(|(_, own, _)| own)
                .sum();
            Some((own + reaped + children) as f64 / self.ticks_per_s)
        });
        let machine = machine_ticks();
        CpuSample {
            broker_s,
            postgres_s,
            redis_s: redis_cpu_s(&self.redis_url).ok(),
            machine_s: machine.map(|(busy, _)| busy as f64 / self.ticks_per_s),
            steal_s: machine.map(|(_, steal)| steal as f64 / self.ticks_per_s),
        }
    }
}

/// Clock ticks of all CPUs since boot from `/proc/stat`'s `cpu` line: busy
/// (user, nice, system, irq, softirq) and steal.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let busy = f.first()? + f.get(1)? + f.get(2)? + f.get(5)? + f.get(6)?;
    Some((busy, *f.get(7)?))
}

/// `VmHWM` (peak resident set size, KiB) of a process (`self` or a pid), from /proc.
pub fn vm_hwm_kib(pid: &str) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

pub fn seconds(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

/// One past the newest transaction id PostgreSQL has completed
/// (cluster-wide; asking assigns none). Only a transaction that writes gets
/// an id (read-only ones, `COMMIT PREPARED`, a `DELETE` that matched nothing
/// do not), so between two moments when no transaction is in flight the
/// difference is the number of write transactions made in between.
pub async fn pg_next_xid(client: &tokio_postgres::Client) -> Result<i64> {
    let row = client
        .query_one("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint", &[])
        .await
        .context("reading PostgreSQL's next transaction id")?;
    Ok(row.get(0))
}

/// CPU seconds the Redis server has used so far (`used_cpu_user` +
/// `used_cpu_sys` of `INFO cpu`, every thread of the server).
fn redis_cpu_s(url: &str) -> Result<f64> {
    let info = redis_info(url, "cpu")?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    field("used_cpu_user")
        .zip(field("used_cpu_sys"))
        .map(|(user, sys)| user + sys)
        .context("INFO cpu has no used_cpu_user and used_cpu_sys")
}

fn redis_info(url: &str, section: &str) -> Result<String> {
    let mut con = redis::Client::open(url)?
        .get_connection()
        .with_context(|| format!("connecting to Redis at {url}"))?;
    redis::cmd("INFO")
        .arg(section)
        .query(&mut con)
        .with_context(|| format!("INFO {section}"))
}

/// Lua scripts Redis has run so far (`EVALSHA` and `EVAL` calls that did not
/// fail, from `INFO commandstats`): each is one atomic step of the fenced sink.
pub fn redis_scripts_run(url: &str) -> Result<u64> {
    let info = redis_info(url, "commandstats")?;
    Ok(info
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| stat_field(l, "calls").saturating_sub(stat_field(l, "failed_calls")))
        .sum())
}

/// `field=N` of an `INFO commandstats` line (0 when absent).
fn stat_field(line: &str, field: &str) -> u64 {
    line.split([':', ','])
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == field)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Nearest-rank percentile of sorted values.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
