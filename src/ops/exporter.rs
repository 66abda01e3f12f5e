//! The pipeline's metrics in the Prometheus text format, through
//! `prometheus-client`: a [`Collector`] that reads [`Metrics`], the
//! consumer lag and the connectors' own counters at every scrape.
//!
//! Every name starts with `exactly_` and carries the label `pipeline`;
//! per-subtask families add `subtask` (and `region`, once the runtime
//! assigns regions), the lag adds `topic` and `partition`. See
//! [`METRIC_NAMES`] for the list.

use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use exactly_core::{HistogramSnapshot, Metrics};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::lag::PartitionLag;

/// The metrics the endpoint serves: name, type, labels besides `pipeline`,
/// meaning. (The README's table is this list.) `region` is there in region
/// failover only.
pub const METRIC_NAMES: &[(&str, &str, &str, &str)] = &[
    ("exactly_records_read_total", "counter", "subtask, region", "records read by source subtask `subtask`"),
    ("exactly_read_bytes_total", "counter", "subtask, region", "their key and value bytes"),
    ("exactly_records_written_total", "counter", "subtask, region", "records written into transactions by sink subtask `subtask` (replays after a restart count again)"),
    ("exactly_written_bytes_total", "counter", "subtask, region", "their key and value bytes"),
    ("exactly_dead_letters_total", "counter", "", "records sent to the sink's dead-letter destination"),
    ("exactly_checkpoints_completed_total", "counter", "", "checkpoints persisted"),
    ("exactly_checkpoints_failed_total", "counter", "", "checkpoints aborted, every cause (declined, timed out, persist failed)"),
    ("exactly_checkpoints_timed_out_total", "counter", "", "of those, the ones that timed out"),
    ("exactly_checkpoint_duration_seconds", "histogram", "", "trigger to persisted, per completed checkpoint"),
    ("exactly_commit_latency_seconds", "histogram", "", "checkpoint completed to transaction committed, per transaction"),
    ("exactly_commits_total", "counter", "", "transactions committed"),
    ("exactly_last_checkpoint_id", "gauge", "", "id of the latest completed checkpoint (0: none yet)"),
    ("exactly_last_checkpoint_age_seconds", "gauge", "", "seconds since it completed (absent before the first)"),
    ("exactly_restarts_total", "counter", "", "restarts after failures"),
    ("exactly_slow_checkpoint_writes_total", "counter", "", "checkpoint writes still running after the checkpoint timeout"),
    ("exactly_checkpoint_cleanup_failures_total", "counter", "", "old checkpoint entries that could not be removed"),
    ("exactly_pending_transactions", "gauge", "subtask, region", "transactions sink subtask `subtask` pre-committed (prepared) that wait for their checkpoint"),
    ("exactly_ready", "gauge", "", "1 when /health/ready answers 200"),
    ("exactly_consumer_lag_records", "gauge", "topic, partition", "end offset minus the latest checkpoint's position (Kafka source)"),
    ("exactly_kafka_sink_lost_transactions_total", "counter", "", "pre-committed Kafka transactions the broker refused to commit (Kafka sink, on_lost_transaction = \"warn\")"),
    ("exactly_kafka_source_transient_errors_total", "counter", "", "client errors the Kafka source rode out"),
    ("exactly_kafka_source_positions_reset_total", "counter", "", "partitions the Kafka source moved on because retention deleted records before they were read (auto.offset.reset)"),
    ("exactly_region_checkpoints_completed_total", "counter", "region", "checkpoints persisted per region (region failover); likewise `_failed_total`, `_timed_out_total`, `exactly_region_restarts_total`, `exactly_region_last_checkpoint_id`"),
];

type Labels = Vec<(String, String)>;
/// Reads one per-subtask value.
type SubtaskValue = fn(&exactly_core::SubtaskSnapshot) -> u64;
/// Reads one per-region value.
type RegionValue = fn(&exactly_core::CheckpointStatsSnapshot) -> u64;

/// The latest consumer lag reading, shared with the lag monitor.
pub type LagReading = Arc<RwLock<Option<Vec<PartitionLag>>>>;

/// Everything a scrape reads.
#[derive(Clone)]
pub struct Observed {
    /// The pipeline's name (the `pipeline` label).
    pub pipeline: String,
    /// Its counters.
    pub metrics: Arc<Metrics>,
    /// The consumer lag (Kafka source), refreshed by the lag monitor.
    pub lag: LagReading,
    /// The Kafka sink, whose factory counts lost transactions.
    pub kafka_sink: Option<Arc<exactly_kafka::KafkaSinkFactory>>,
    /// The Kafka source, whose factory counts transient errors.
    pub kafka_source: Option<Arc<exactly_kafka::KafkaSourceFactory>>,
    /// `/health/ready`'s bound on the latest checkpoint's age.
    pub ready_max_age: std::time::Duration,
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed").field("pipeline", &self.pipeline).finish()
    }
}

/// The registry of one pipeline: prefix `exactly`, label `pipeline`.
pub fn registry(observed: Observed) -> Registry {
    let mut registry = Registry::with_prefix_and_labels(
        "exactly",
        [("pipeline".into(), observed.pipeline.clone().into())].into_iter(),
    );
    registry.register_collector(Box::new(PipelineCollector(observed)));
    registry
}

/// Renders `registry` in the Prometheus text format (0.0.4), or in
/// OpenMetrics when `openmetrics`.
pub fn render(registry: &Registry, openmetrics: bool) -> String {
    let mut out = String::new();
    let encoded = if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, registry)
    };
    encoded.expect("writing into a String cannot fail");
    out
}

#[derive(Debug)]
struct PipelineCollector(Observed);

fn counter(encoder: MetricEncoder<'_>, value: u64) -> Result<(), std::fmt::Error> {
    ConstCounter::new(value).encode(encoder)
}

fn histogram(mut encoder: MetricEncoder<'_>, h: &HistogramSnapshot) -> Result<(), std::fmt::Error> {
    // prometheus-client takes per-bucket counts and accumulates them.
    let mut previous = 0;
    let buckets: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .map(|&(bound_us, cumulative)| {
            let n = cumulative - previous;
            previous = cumulative;
            (bound_us as f64 / 1e6, n)
        })
        .collect();
    encoder.encode_histogram::<Labels>(h.sum_us as f64 / 1e6, h.count, &buckets, None)
}

impl Collector for PipelineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let observed = &self.0;
        let m = &observed.metrics;
        let s = m.snapshot();
        let subtasks = m.subtasks();
        let subtask_labels = |i: usize, region: Option<usize>| -> Labels {
            let mut labels = vec![("subtask".to_string(), i.to_string())];
            if let Some(r) = region {
                labels.push(("region".to_string(), r.to_string()));
            }
            labels
        };
        let records = Unit::Other("records".into());

        let per_subtask: [(&str, &str, Option<&Unit>, SubtaskValue); 4] = [
            ("records_read", "Records read by source subtask `subtask`.", None, |t| {
                t.records_read
            }),
            (
                "read",
                "Key and value bytes of the records read.",
                Some(&Unit::Bytes),
                |t| t.bytes_read,
            ),
            (
                "records_written",
                "Records written into sink transactions by sink subtask `subtask`.",
                None,
                |t| t.records_written,
            ),
            (
                "written",
                "Key and value bytes of the records written.",
                Some(&Unit::Bytes),
                |t| t.bytes_written,
            ),
        ];
        for (name, help, unit, value) in per_subtask {
            let mut family = encoder.encode_descriptor(name, help, unit, MetricType::Counter)?;
            for t in &subtasks {
                counter(family.encode_family(&subtask_labels(t.subtask, t.region))?, value(t))?;
            }
        }
        let mut pending = encoder.encode_descriptor(
            "pending_transactions",
            "Transactions sink subtask `subtask` pre-committed that wait for their checkpoint to complete.",
            None,
            MetricType::Gauge,
        )?;
        for t in &subtasks {
            ConstGauge::new(t.pending_transactions as i64)
                .encode(pending.encode_family(&subtask_labels(t.subtask, t.region))?)?;
        }

        let counters: [(&str, &str, u64); 8] = [
            (
                "dead_letters",
                "Records sent to the sink's dead-letter destination.",
                s.dead_letters,
            ),
            (
                "checkpoints_completed",
                "Checkpoints persisted.",
                s.checkpoints_completed,
            ),
            (
                "checkpoints_failed",
                "Checkpoints aborted, every cause (declined, timed out, persist failed).",
                s.checkpoints_failed,
            ),
            (
                "checkpoints_timed_out",
                "Checkpoints aborted because they timed out.",
                s.checkpoints_timed_out,
            ),
            ("restarts", "Restarts after failures.", s.restarts),
            (
                "slow_checkpoint_writes",
                "Checkpoint writes still running after the checkpoint timeout.",
                s.slow_persists,
            ),
            (
                "checkpoint_cleanup_failures",
                "Old checkpoint entries that could not be removed.",
                s.store_cleanup_failures,
            ),
            ("commits", "Transactions committed.", s.commits),
        ];
        for (name, help, value) in counters {
            counter(encoder.encode_descriptor(name, help, None, MetricType::Counter)?, value)?;
        }
        histogram(
            encoder.encode_descriptor(
                "checkpoint_duration",
                "Trigger-to-persisted time of completed checkpoints.",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?,
            &m.checkpoint_durations(),
        )?;
        histogram(
            encoder.encode_descriptor(
                "commit_latency",
                "Time from a checkpoint's completion to the commit of each of its transactions.",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?,
            &m.commit_latencies(),
        )?;
        ConstGauge::new(s.last_completed_checkpoint as i64).encode(encoder.encode_descriptor(
            "last_checkpoint_id",
            "Id of the latest completed checkpoint (0: none yet).",
            None,
            MetricType::Gauge,
        )?)?;
        if s.last_completed_checkpoint_unix_ms > 0 {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or_default();
            let age = now.saturating_sub(s.last_completed_checkpoint_unix_ms) as f64 / 1000.0;
            ConstGauge::new(age).encode(encoder.encode_descriptor(
                "last_checkpoint_age",
                "Time since the latest checkpoint completed.",
                Some(&Unit::Seconds),
                MetricType::Gauge,
            )?)?;
        }
        let ready = m.readiness(observed.ready_max_age).ready;
        ConstGauge::new(i64::from(ready)).encode(encoder.encode_descriptor(
            "ready",
            "1 when the pipeline is recovered and checkpoints complete (/health/ready answers 200).",
            None,
            MetricType::Gauge,
        )?)?;

        let regions = m.regions();
        if !regions.is_empty() {
            let region_counters: [(&str, &str, RegionValue); 4] = [
                (
                    "region_checkpoints_completed",
                    "Checkpoints of region `region` persisted.",
                    |r| r.completed,
                ),
                (
                    "region_checkpoints_failed",
                    "Checkpoints of region `region` aborted.",
                    |r| r.failed,
                ),
                (
                    "region_checkpoints_timed_out",
                    "Checkpoints of region `region` that timed out.",
                    |r| r.timed_out,
                ),
                ("region_restarts", "Restarts of region `region`.", |r| r.restarts),
            ];
            for (name, help, value) in region_counters {
                let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                for (r, stats) in &regions {
                    let labels: Labels = vec![("region".into(), r.to_string())];
                    counter(family.encode_family(&labels)?, value(stats))?;
                }
            }
            let mut family = encoder.encode_descriptor(
                "region_last_checkpoint_id",
                "Id of the latest completed checkpoint of region `region`.",
                None,
                MetricType::Gauge,
            )?;
            for (r, stats) in &regions {
                let labels: Labels = vec![("region".into(), r.to_string())];
                ConstGauge::new(stats.last_completed_id as i64).encode(family.encode_family(&labels)?)?;
            }
        }

        let lag = observed.lag.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(lag) = lag {
            let mut family = encoder.encode_descriptor(
                "consumer_lag",
                "End offset of the partition minus the position of the latest complete checkpoint.",
                Some(&records),
                MetricType::Gauge,
            )?;
            for p in &lag {
                let labels: Labels = vec![
                    ("topic".into(), p.topic.clone()),
                    ("partition".into(), p.partition.to_string()),
                ];
                ConstGauge::new(p.lag).encode(family.encode_family(&labels)?)?;
            }
        }
        if let Some(sink) = &observed.kafka_sink {
            let k = sink.metrics();
            counter(
                encoder.encode_descriptor(
                    "kafka_sink_lost_transactions",
                    "Pre-committed Kafka transactions the broker refused to commit (on_lost_transaction = \"warn\").",
                    None,
                    MetricType::Counter,
                )?,
                k.lost_transactions,
            )?;
        }
        if let Some(source) = &observed.kafka_source {
            counter(
                encoder.encode_descriptor(
                    "kafka_source_transient_errors",
                    "Client errors the Kafka source rode out (each logged).",
                    None,
                    MetricType::Counter,
                )?,
                source.metrics().transient_errors,
            )?;
            counter(
                encoder.encode_descriptor(
                    "kafka_source_positions_reset",
                    "Partitions the Kafka source moved on because retention deleted records before they were read \
                     (auto.offset.reset; each logged with what was skipped).",
                    None,
                    MetricType::Counter,
                )?,
                source.metrics().positions_reset,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exactly_core::Record;

    fn observed() -> Observed {
        Observed {
            pipeline: "orders".into(),
            metrics: Arc::new(Metrics::default()),
            lag: Arc::default(),
            kafka_sink: None,
            kafka_source: None,
            ready_max_age: std::time::Duration::from_secs(60),
        }
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .map(|v| v.parse().unwrap())
    }

    #[test]
    fn names_follow_the_conventions_and_carry_the_pipeline() {
        let o = observed();
        o.metrics.source_read(1, &[Record::new("t-0", 0, "abc")]);
        o.metrics.sink_wrote(0, &[Record::new("t-0", 0, "abc")]);
        *o.lag.write().unwrap() = Some(vec![PartitionLag {
            topic: "t".into(),
            partition: 3,
            position: Some(5),
            low: 0,
            end: 12,
            lag: 7,
        }]);
        let text = render(&registry(o), false);
        assert_eq!(
            value(&text, r#"exactly_records_read_total{pipeline="orders",subtask="1"}"#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            value(&text, r#"exactly_read_bytes_total{pipeline="orders",subtask="1"}"#),
            Some(3.0)
        );
        assert_eq!(
            value(&text, r#"exactly_records_written_total{pipeline="orders",subtask="0"}"#),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                r#"exactly_consumer_lag_records{pipeline="orders",topic="t",partition="3"}"#
            ),
            Some(7.0)
        );
        assert_eq!(
            value(&text, r#"exactly_checkpoints_completed_total{pipeline="orders"}"#),
            Some(0.0)
        );
        assert_eq!(value(&text, r#"exactly_ready{pipeline="orders"}"#), Some(0.0));
        assert!(
            !text.contains("last_checkpoint_age"),
            "no age before the first checkpoint"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("exactly_"), "{line}");
            assert!(line.contains(r#"pipeline="orders""#), "{line}");
        }
        for (name, kind, _, _) in METRIC_NAMES
            .iter()
            .filter(|(n, ..)| !n.contains("kafka") && !n.contains("region") && !n.contains("age") && !n.contains("lag"))
        {
            let family = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                text.contains(&format!("# TYPE {family} {kind}")) || text.contains(&format!("# TYPE {name} {kind}")),
                "{name} ({kind}) missing:\n{text}"
            );
        }
    }

    #[test]
    fn histograms_are_in_seconds_and_cumulative() {
        let o = observed();
        o.metrics.checkpoint_completed_in(None, 1, 30);
        o.metrics.checkpoint_completed_in(None, 2, 700);
        let text = render(&registry(o), false);
        let bucket = |le: &str| {
            value(
                &text,
                &format!(r#"exactly_checkpoint_duration_seconds_bucket{{pipeline="orders",le="{le}"}}"#),
            )
        };
        assert_eq!(bucket("0.05"), Some(1.0), "{text}");
        assert_eq!(bucket("1"), Some(2.0), "{text}");
        assert_eq!(bucket("+Inf"), Some(2.0));
        assert_eq!(
            value(&text, r#"exactly_checkpoint_duration_seconds_sum{pipeline="orders"}"#),
            Some(0.73)
        );
        assert_eq!(
            value(&text, r#"exactly_last_checkpoint_id{pipeline="orders"}"#),
            Some(2.0)
        );
        assert!(text.contains("exactly_last_checkpoint_age_seconds{"), "{text}");
        assert_eq!(value(&text, r#"exactly_ready{pipeline="orders"}"#), Some(1.0));
    }
}
