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
    // The process's CPU seconds per million records, averaged like the rates.
    let cpu_of = |k: Kind| -> Option<f64> {
        let per_m: Vec<f64> = results
            .iter()
            .filter(|(kind, o)| *kind == k && o.problems.is_empty())
            .filter_map(|(_, o)| o.cpu.as_ref())
            .map(|c| c.process_s * 1e6 / ctx.settings.records as f64)
            .collect();
        (!per_m.is_empty()).then(|| per_m.iter().sum::<f64>() / per_m.len() as f64)
    };
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
         seconds has {cores}·W to spend: wall × cores), also per million records (= µs per record). The rest: \
         the whole machine's busy time minus the total (this bench's own sampling, the services that sit idle, \
         and any other process); steal: time the hypervisor gave this VM's CPUs to others. Ceiling: the rate \
         this row's work would reach with both cores busy on it alone (cores ÷ its total CPU per record); \
         % of it: how close the row came. Switches: the process's context switches per 1,000 records (every \
         thread, from its rusage): waiting + preempted.",
        cores = crate::num_cores()
    );
    println!();
    println!(
        "| run | process | broker | PostgreSQL (Redis) | process per 1M | broker per 1M | PostgreSQL (Redis) per 1M | \
         total per 1M | ceiling records/s | % of ceiling | switches per 1k | peak RSS | wall × cores | the rest | steal |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let fmt = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    let per_m = |v: Option<f64>| {
        v.map_or("—".to_string(), |v| {
            format!("{:.2}", v * 1e6 / ctx.settings.records as f64)
        })
    };
    for (kind, o) in results {
        let Some(c) = &o.cpu else { continue };
        let total = c.process_s + c.broker_s.unwrap_or(0.0) + c.store_s.unwrap_or(0.0);
        let per_record_s = total / ctx.settings.records as f64;
        let ceiling = crate::num_cores() as f64 / per_record_s;
        let share = o
            .records_per_s
            .map_or("—".to_string(), |r| format!("{:.0} %", 100.0 * r / ceiling));
        let rss = o
            .rss_kib
            .map_or("—".into(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
        let per_k = |n: u64| n as f64 * 1000.0 / ctx.settings.records as f64;
        let switches = o
            .context_switches
            .map_or("—".to_string(), |(v, i)| format!("{:.1} + {:.1}", per_k(v), per_k(i)));
        println!(
            "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {ceiling:.0} | {share} | {switches} | {rss} | {:.1} | {} | {} |",
            row_label(*kind, o),
            c.process_s,
            fmt(c.broker_s),
            fmt(c.store_s),
            per_m(Some(c.process_s)),
            per_m(c.broker_s),
            per_m(c.store_s),
            per_m(Some(total)),
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
    for k in [
        Kind::MinimalLoop,
        Kind::HandLoop,
        Kind::ExactlyOnce,
        Kind::ExactlyOnceKeyValue,
        Kind::AtLeastOnce,
    ] {
        let rates: Vec<String> = rates_of(k).iter().map(|r| format!("{r:.0}")).collect();
        if let Some(mean) = rate_of(k) {
            let cpu = cpu_of(k).map_or(String::new(), |c| format!(", process CPU {c:.2} s per 1M records"));
            println!("- {}: mean {mean:.0} records/s of {}{cpu}", k.label(), rates.join(", "));
        }
    }
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    for eo in [Kind::ExactlyOnce, Kind::ExactlyOnceKeyValue] {
        let what = format!("CPU per record of the process, {} ≤ the hand-written loop's", eo.id());
        match (cpu_of(eo), cpu_of(Kind::HandLoop)) {
            (Some(e), Some(h)) => println!(
                "- {what}: {e:.2} vs {h:.2} s per 1M records ({:.0} %) → {}",
                100.0 * e / h,
                verdict(e <= h)
            ),
            _ => println!("- {what}: not measured"),
        }
    }
    let ratio_target = |eo: Kind, what: &str, of: Option<f64>, need: f64| match (rate_of(eo), of) {
        (Some(r), Some(o)) => println!(
            "- {} throughput ≥ {:.0} % of {what}: {:.0} % → {}",
            eo.id(),
            100.0 * need,
            100.0 * r / o,
            verdict(r >= need * o)
        ),
        _ => println!(
            "- {} throughput ≥ {:.0} % of {what}: not measured",
            eo.id(),
            100.0 * need
        ),
    };
    // The hand loop writes the key-value table: eo-kv does the same work.
    ratio_target(Kind::ExactlyOnce, "the hand-written loop", rate_of(Kind::HandLoop), 1.2);
    ratio_target(
        Kind::ExactlyOnceKeyValue,
        "the hand-written loop",
        rate_of(Kind::HandLoop),
        1.2,
    );
    ratio_target(Kind::ExactlyOnce, "at-least-once", rate_of(Kind::AtLeastOnce), 0.95);
    ratio_target(Kind::ExactlyOnce, "the minimal loop", ceiling, 0.95);
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
