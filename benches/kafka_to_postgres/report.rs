//! The report: the table of every run, the CPU table, the latency phases,
//! notes and problems, and the targets' verdicts.

use crate::measure::percentile;
use crate::runs::Kind;
use crate::{Ctx, Outcome};

/// Peak RSS target of an exactly-once run (MiB).
const RSS_TARGET_MIB: i64 = 150;

/// A row's label; a run listed again is marked with its name (`loop-2`).
fn row_label(kind: Kind, o: &Outcome) -> String {
    if o.name == kind.id() {
        kind.label().to_string()
    } else {
        format!("{} [{}]", kind.label(), o.name)
    }
}

/// Prints the whole report on stdout.
pub fn print_table(ctx: &Ctx, results: &[(Kind, Outcome)]) {
    // A run listed more than once (the loop, exactly-once and at-least-once
    // by default) counts with its mean; a run with a problem not at all.
    let rates_of = |k: Kind| -> Vec<f64> {
        results
            .iter()
            .filter(|(kind, o)| *kind == k && o.problems.is_empty())
            .filter_map(|(_, o)| o.records_per_s)
            .collect()
    };
    let rate_of = |k: Kind| {
        let rates = rates_of(k);
        (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
    };
    let ceiling = rate_of(Kind::MinimalLoop);
    println!(
        "| run | records/s | % of minimal loop | wall (startup) | checkpoint p50 | checkpoint p99 | checkpoints | COPYs | transactions | e2e latency p50 | e2e latency p99 | peak RSS |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (kind, o) in results {
        let mut sorted = o.checkpoints.clone();
        sorted.sort_unstable();
        let ck = |p: f64| {
            if sorted.is_empty() {
                "—".to_string()
            } else {
                format!("{} ms", percentile(&sorted, p))
            }
        };
        let rate = o.records_per_s.map_or("failed".into(), |r| format!("{r:.0}"));
        let share = match (o.records_per_s, ceiling) {
            (Some(r), Some(c)) => format!("{:.0} %", 100.0 * r / c),
            _ => "—".into(),
        };
        let (lat50, lat99) = o.latency.as_ref().map_or(("—".into(), "—".into()), |l| {
            (format!("{:.0} ms", l.p50_ms), format!("{:.0} ms", l.p99_ms))
        });
        let rss = o
            .rss_kib
            .map_or("—".into(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
        let checkpoints = if kind.is_pipeline() {
            o.checkpoints.len().to_string()
        } else {
            "—".into()
        };
        let wall = match (o.records_per_s, o.ready_after) {
            (None, _) => "—".to_string(),
            (Some(_), Some(r)) => format!("{:.1} s ({:.1} s)", o.wall.as_secs_f64(), r.as_secs_f64()),
            (Some(_), None) => format!("{:.1} s", o.wall.as_secs_f64()),
        };
        let count = |v: Option<u64>| v.map_or("—".to_string(), |v| v.to_string());
        println!(
            "| {} | {rate} | {share} | {wall} | {} | {} | {checkpoints} | {} | {} | {lat50} | {lat99} | {rss} |",
            row_label(*kind, o),
            ck(50.0),
            ck(99.0),
            count(o.copies),
            count(o.transactions),
        );
    }
    println!();
    println!(
        "COPYs: of rows, finished (the pipelines' from the PostgreSQL sink's debug log, the baselines' their own \
         count); transactions: write transactions PostgreSQL assigned an id during the throughput run (Redis: \
         fenced Lua scripts run)."
    );
    println!();
    println!(
        "CPU time of the throughput runs (user + system seconds; the machine has {cores} cores, so a run of W \
         seconds has {cores}·W to spend: wall × cores). The rest: the whole machine's busy time minus the total \
         (this bench's own sampling, the services that sit idle, and any other process); steal: time the \
         hypervisor gave this VM's CPUs to others.",
        cores = crate::num_cores()
    );
    println!();
    println!(
        "| run | this run's process | broker | PostgreSQL (Redis) | total | µs per record | wall × cores | the rest | steal |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let fmt = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    for (kind, o) in results {
        let Some(c) = &o.cpu else { continue };
        let total = c.process_s + c.broker_s.unwrap_or(0.0) + c.store_s.unwrap_or(0.0);
        println!(
            "| {} | {:.1} | {} | {} | {total:.1} | {:.0} | {:.1} | {} | {} |",
            row_label(*kind, o),
            c.process_s,
            fmt(c.broker_s),
            fmt(c.store_s),
            total * 1e6 / ctx.settings.records as f64,
            o.cpu_wall.as_secs_f64() * crate::num_cores() as f64,
            fmt(c.machine_s.map(|m| (m - total).max(0.0))),
            fmt(c.steal_s),
        );
    }
    println!();
    for (_, o) in results {
        if let Some(l) = &o.latency {
            println!(
                "latency phase {}: {} records visible (max {:.0} ms), {} never; produce→broker ack p50 {:.0} ms, p99 {:.0} ms",
                o.name,
                l.samples,
                l.max_ms,
                l.missing,
                l.ack_p50_ms,
                l.ack_p99_ms
            );
        }
    }
    println!();
    for (_, o) in results {
        for n in &o.notes {
            println!("note: {}: {n}", o.name);
        }
        for p in &o.problems {
            println!("PROBLEM {}: {p}", o.name);
        }
    }
    let eo_runs: Vec<&Outcome> = results
        .iter()
        .filter(|(k, o)| *k == Kind::ExactlyOnce && o.records_per_s.is_some())
        .map(|(_, o)| o)
        .collect();
    if eo_runs.is_empty() {
        println!("targets: no exactly-once run completed");
        return;
    }
    println!(
        "targets ({} exactly-once run(s) of {} records; runs listed more than once count with their mean throughput, \
         their checkpoints pooled and their largest RSS):",
        eo_runs.len(),
        ctx.settings.records
    );
    for k in [Kind::MinimalLoop, Kind::ExactlyOnce, Kind::AtLeastOnce] {
        let rates: Vec<String> = rates_of(k).iter().map(|r| format!("{r:.0}")).collect();
        if let Some(mean) = rate_of(k) {
            println!("- {}: mean {mean:.0} records/s of {}", k.label(), rates.join(", "));
        }
    }
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    let eo_rate = rate_of(Kind::ExactlyOnce);
    match (eo_rate, ceiling) {
        (Some(r), Some(c)) => println!(
            "- throughput ≥ 85 % of the minimal loop: {:.0} % → {}",
            100.0 * r / c,
            verdict(r >= 0.85 * c)
        ),
        _ => println!("- throughput ≥ 85 % of the minimal loop: not measured"),
    }
    match (eo_rate, rate_of(Kind::AtLeastOnce)) {
        (Some(r), Some(a)) => println!(
            "- throughput within 10 % of at-least-once: {:.0} % of it → {}",
            100.0 * r / a,
            verdict(r >= 0.9 * a)
        ),
        _ => println!("- throughput within 10 % of at-least-once: not measured"),
    }
    let mut sorted: Vec<u64> = eo_runs.iter().flat_map(|o| o.checkpoints.iter().copied()).collect();
    sorted.sort_unstable();
    if sorted.is_empty() {
        println!("- checkpoint duration p99 < 250 ms: not measured");
    } else {
        let p99 = percentile(&sorted, 99.0);
        println!("- checkpoint duration p99 < 250 ms: {p99} ms → {}", verdict(p99 < 250));
    }
    match eo_runs.iter().filter_map(|o| o.rss_kib).max() {
        Some(k) => println!(
            "- peak RSS ≤ {RSS_TARGET_MIB} MiB: {:.0} MiB → {}",
            k as f64 / 1024.0,
            verdict(k <= RSS_TARGET_MIB * 1024)
        ),
        None => println!("- peak RSS ≤ {RSS_TARGET_MIB} MiB: not measured"),
    }
}
