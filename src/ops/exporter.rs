//! The pipeline's metrics in the Prometheus text format, with
//! `prometheus-client`'s own metric types and encoders.
//!
//! The runtime counts in plain atomics ([`Metrics`]: `exactly-core` knows
//! no exposition format), so every scrape reads them, the consumer lag and
//! the connectors' own counters into a fresh [`Registry`] of
//! prometheus-client [`Family`]s, [`Counter`]s and [`Gauge`]s, and encodes
//! it. A registry per scrape holds exactly the series that exist now (a
//! lag of a partition no longer read, the region families in global
//! failover, the checkpoint age before the first checkpoint are absent, as
//! they should be) and needs no clearing. The two duration histograms are
//! snapshot histograms: the runtime keeps their buckets, and
//! prometheus-client's `Histogram` only takes observations one at a time.
//!
//! Every name starts with `exactly_` and carries the label `pipeline`;
//! per-subtask families add `subtask` (and `region`, once the runtime
//! assigns regions), the lag adds `topic` and `partition`. See
//! [`METRIC_NAMES`] for the list.

use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use exactly_core::{HistogramSnapshot, Metrics};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
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
    ("exactly_records_filtered_total", "counter", "", "records a transform dropped (`drop-if`, a filter, a flat_map with no output; replays count again)"),
    ("exactly_transform_dead_letters_total", "counter", "", "records skipped because a transform with `on_error = \"dead-letter\"` failed on them (each logged with the reason)"),
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
    ("exactly_standby", "gauge", "", "1 while the process waits as a hot standby for the pipeline's lock (`--standby`)"),
    ("exactly_takeovers_total", "counter", "", "times this process took the pipeline over as a hot standby"),
    ("exactly_clean_takeovers_total", "counter", "", "of those, after a clean hand-over (the holder stopped with its last commits and closed its sinks: no grace waited)"),
    ("exactly_regions_claimed_total", "counter", "", "regions this worker claimed (`[workers]`; each claim raised the region's epoch, fencing its previous owner)"),
    ("exactly_regions_dropped_total", "counter", "", "regions this worker stopped acting on without a hand-over: taken by another worker, or its lease's deadline passed (a freeze, a cut-off)"),
    ("exactly_regions_owned", "gauge", "", "regions this worker owns and acts on now (`[workers]`)"),
    ("exactly_fenced_writes_total", "counter", "", "checkpoint writes refused for their epoch (a newer owner took the region; the attempt dropped it without committing)"),
    ("exactly_consumer_lag_records", "gauge", "topic, partition", "end offset minus the latest checkpoint's position (Kafka source)"),
    ("exactly_kafka_sink_lost_transactions_total", "counter", "", "pre-committed Kafka transactions the broker refused to commit (Kafka sink, on_lost_transaction = \"warn\")"),
    ("exactly_kafka_source_transient_errors_total", "counter", "", "client errors the Kafka source rode out"),
    ("exactly_kafka_source_positions_reset_total", "counter", "", "partitions the Kafka source moved on because retention deleted records before they were read (auto.offset.reset)"),
    ("exactly_kafka_source_truncations_total", "counter", "", "partitions whose log the Kafka source found truncated below its position and read on from the divergence (on_log_truncation = \"resume\")"),
    ("exactly_kafka_source_truncated_offsets_total", "counter", "", "offsets read before such truncations that no longer exist in the log"),
    ("exactly_kafka_source_leader_changes_total", "counter", "", "changes of a partition's leader (or leader epoch) the Kafka source followed"),
    ("exactly_kafka_source_topic_missing", "gauge", "", "1 while the Kafka source's topic is missing from the cluster's metadata (deleted): the pipeline stops after missing_topic_timeout"),
    ("exactly_kafka_source_fetches_total", "counter", "broker", "Fetch answers the Kafka source received, by the node id of the broker that sent them"),
    ("exactly_kafka_source_fetch_broker", "gauge", "topic, partition", "the node id of the broker each partition is fetched from now (its leader, or a replica the leader named)"),
    ("exactly_region_checkpoints_completed_total", "counter", "region", "checkpoints persisted per region (region failover); likewise `_failed_total`, `_timed_out_total`, `exactly_region_restarts_total`, `exactly_region_last_checkpoint_id`"),
];

type Labels = Vec<(String, String)>;

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

impl Observed {
    /// Whether the pipeline is ready (`/health/ready`, `exactly_ready`):
    /// the runtime's readiness, and the Kafka source's topic is not missing
    /// from the metadata.
    pub fn readiness(&self) -> exactly_core::Readiness {
        let mut readiness = self.metrics.readiness(self.ready_max_age);
        let missing = self
            .kafka_source
            .as_ref()
            .map(|s| s.metrics().missing_topics)
            .unwrap_or_default();
        if !missing.is_empty() {
            readiness.ready = false;
            let topics: Vec<String> = missing.iter().map(|t| format!("`{t}`")).collect();
            readiness.reason = Some(format!(
                "topic {} missing from the Kafka cluster's metadata (deleted?)",
                topics.join(", ")
            ));
        }
        readiness
    }
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed").field("pipeline", &self.pipeline).finish()
    }
}

/// A histogram the runtime already bucketed, in seconds.
#[derive(Debug)]
struct SnapshotHistogram(HistogramSnapshot);

impl TypedMetric for SnapshotHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for SnapshotHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let h = &self.0;
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

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// A counter holding `value`.
fn counter(value: u64) -> Counter {
    let counter = Counter::default();
    counter.inc_by(value);
    counter
}

/// A gauge holding `value`.
fn gauge(value: i64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(value);
    gauge
}

/// The registry of one pipeline as it stands now: prefix `exactly`, label
/// `pipeline`, every family read from `observed`. (`Registry::register`
/// ends each help text with a period.)
pub fn registry(observed: &Observed) -> Registry {
    let mut registry = Registry::with_prefix_and_labels(
        "exactly",
        [("pipeline".into(), observed.pipeline.clone().into())].into_iter(),
    );
    let m = &observed.metrics;
    let s = m.snapshot();
    let subtasks = m.subtasks();

    type SubtaskValue = fn(&exactly_core::SubtaskSnapshot) -> u64;
    let per_subtask: [(&str, &str, Option<Unit>, SubtaskValue); 4] = [
        ("records_read", "Records read by source subtask `subtask`", None, |t| {
            t.records_read
        }),
        (
            "read",
            "Key and value bytes of the records read",
            Some(Unit::Bytes),
            |t| t.bytes_read,
        ),
        (
            "records_written",
            "Records written into sink transactions by sink subtask `subtask`",
            None,
            |t| t.records_written,
        ),
        (
            "written",
            "Key and value bytes of the records written",
            Some(Unit::Bytes),
            |t| t.bytes_written,
        ),
    ];
    let subtask_labels = |t: &exactly_core::SubtaskSnapshot| -> Labels {
        let mut labels = vec![("subtask".to_string(), t.subtask.to_string())];
        labels.extend(t.region.map(|r| ("region".to_string(), r.to_string())));
        labels
    };
    for (name, help, unit, value) in per_subtask {
        let family = Family::<Labels, Counter>::default();
        for t in &subtasks {
            family.get_or_create(&subtask_labels(t)).inc_by(value(t));
        }
        match unit {
            Some(unit) => registry.register_with_unit(name, help, unit, family),
            None => registry.register(name, help, family),
        }
    }
    let pending = Family::<Labels, Gauge>::default();
    for t in &subtasks {
        pending
            .get_or_create(&subtask_labels(t))
            .set(t.pending_transactions as i64);
    }
    registry.register(
        "pending_transactions",
        "Transactions sink subtask `subtask` pre-committed that wait for their checkpoint to complete",
        pending,
    );

    let counters: [(&str, &str, u64); 15] = [
        (
            "dead_letters",
            "Records sent to the sink's dead-letter destination",
            s.dead_letters,
        ),
        (
            "records_filtered",
            "Records a transform dropped (replays count again)",
            s.records_filtered,
        ),
        (
            "transform_dead_letters",
            "Records skipped because a transform with on_error = dead-letter failed on them",
            s.transform_dead_letters,
        ),
        (
            "checkpoints_completed",
            "Checkpoints persisted",
            s.checkpoints_completed,
        ),
        (
            "checkpoints_failed",
            "Checkpoints aborted, every cause (declined, timed out, persist failed)",
            s.checkpoints_failed,
        ),
        (
            "checkpoints_timed_out",
            "Checkpoints aborted because they timed out",
            s.checkpoints_timed_out,
        ),
        ("restarts", "Restarts after failures", s.restarts),
        (
            "slow_checkpoint_writes",
            "Checkpoint writes still running after the checkpoint timeout",
            s.slow_persists,
        ),
        (
            "checkpoint_cleanup_failures",
            "Old checkpoint entries that could not be removed",
            s.store_cleanup_failures,
        ),
        ("commits", "Transactions committed", s.commits),
        (
            "takeovers",
            "Times this process took the pipeline over as a hot standby",
            s.takeovers,
        ),
        (
            "clean_takeovers",
            "Takeovers after a clean hand-over (no grace waited)",
            s.clean_takeovers,
        ),
        (
            "fenced_writes",
            "Checkpoint writes refused for their epoch (a newer owner took the region)",
            s.fenced_writes,
        ),
        (
            "regions_claimed",
            "Regions this worker claimed (each claim raised the region's epoch)",
            s.regions_claimed,
        ),
        (
            "regions_dropped",
            "Regions this worker stopped acting on without a hand-over (taken by another worker, or its lease deadline passed)",
            s.regions_dropped,
        ),
    ];
    for (name, help, value) in counters {
        registry.register(name, help, counter(value));
    }
    registry.register_with_unit(
        "checkpoint_duration",
        "Trigger-to-persisted time of completed checkpoints",
        Unit::Seconds,
        SnapshotHistogram(m.checkpoint_durations()),
    );
    registry.register_with_unit(
        "commit_latency",
        "Time from a checkpoint's completion to the commit of each of its transactions",
        Unit::Seconds,
        SnapshotHistogram(m.commit_latencies()),
    );
    registry.register(
        "last_checkpoint_id",
        "Id of the latest completed checkpoint (0: none yet)",
        gauge(s.last_completed_checkpoint as i64),
    );
    if s.last_completed_checkpoint_unix_ms > 0 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let age = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        age.set(now.saturating_sub(s.last_completed_checkpoint_unix_ms) as f64 / 1000.0);
        registry.register_with_unit(
            "last_checkpoint_age",
            "Time since the latest checkpoint completed",
            Unit::Seconds,
            age,
        );
    }
    let ready = observed.readiness().ready;
    registry.register(
        "ready",
        "1 when the pipeline is recovered and checkpoints complete (/health/ready answers 200)",
        gauge(i64::from(ready)),
    );
    registry.register(
        "standby",
        "1 while the process waits as a hot standby for the pipeline's lock",
        gauge(i64::from(m.is_standby())),
    );
    registry.register(
        "regions_owned",
        "Regions this worker owns and acts on now ([workers])",
        gauge(s.regions_owned as i64),
    );

    let regions = m.regions();
    if !regions.is_empty() {
        type RegionValue = fn(&exactly_core::CheckpointStatsSnapshot) -> u64;
        let region_counters: [(&str, &str, RegionValue); 4] = [
            (
                "region_checkpoints_completed",
                "Checkpoints of region `region` persisted",
                |r| r.completed,
            ),
            (
                "region_checkpoints_failed",
                "Checkpoints of region `region` aborted",
                |r| r.failed,
            ),
            (
                "region_checkpoints_timed_out",
                "Checkpoints of region `region` that timed out",
                |r| r.timed_out,
            ),
            ("region_restarts", "Restarts of region `region`", |r| r.restarts),
        ];
        let region_labels = |r: &usize| -> Labels { vec![("region".into(), r.to_string())] };
        for (name, help, value) in region_counters {
            let family = Family::<Labels, Counter>::default();
            for (r, stats) in &regions {
                family.get_or_create(&region_labels(r)).inc_by(value(stats));
            }
            registry.register(name, help, family);
        }
        let last = Family::<Labels, Gauge>::default();
        for (r, stats) in &regions {
            last.get_or_create(&region_labels(r))
                .set(stats.last_completed_id as i64);
        }
        registry.register(
            "region_last_checkpoint_id",
            "Id of the latest completed checkpoint of region `region`",
            last,
        );
    }

    let lag = observed.lag.read().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(lag) = lag {
        let family = Family::<Labels, Gauge>::default();
        for p in &lag {
            let labels: Labels = vec![
                ("topic".into(), p.topic.clone()),
                ("partition".into(), p.partition.to_string()),
            ];
            family.get_or_create(&labels).set(p.lag);
        }
        registry.register_with_unit(
            "consumer_lag",
            "End offset of the partition minus the position of the latest complete checkpoint",
            Unit::Other("records".into()),
            family,
        );
    }
    if let Some(sink) = &observed.kafka_sink {
        registry.register(
            "kafka_sink_lost_transactions",
            "Pre-committed Kafka transactions the broker refused to commit (on_lost_transaction = \"warn\")",
            counter(sink.metrics().lost_transactions),
        );
    }
    if let Some(source) = &observed.kafka_source {
        let k = source.metrics();
        registry.register(
            "kafka_source_transient_errors",
            "Client errors the Kafka source rode out (each logged)",
            counter(k.transient_errors),
        );
        registry.register(
            "kafka_source_positions_reset",
            "Partitions the Kafka source moved on because retention deleted records before they were read \
             (auto.offset.reset; each logged with what was skipped)",
            counter(k.positions_reset),
        );
        for (name, help, value) in [
            (
                "kafka_source_truncations",
                "Partitions whose log was found truncated below the position read, read on from the divergence \
                 (on_log_truncation = \"resume\")",
                k.truncations,
            ),
            (
                "kafka_source_truncated_offsets",
                "Offsets read before such truncations that no longer exist in the log",
                k.truncated_offsets,
            ),
            (
                "kafka_source_leader_changes",
                "Changes of a partition's leader (or leader epoch) the Kafka source followed",
                k.leader_changes,
            ),
        ] {
            registry.register(name, help, counter(value));
        }
        registry.register(
            "kafka_source_topic_missing",
            "1 while the topic is missing from the cluster's metadata (deleted)",
            gauge(i64::from(!k.missing_topics.is_empty())),
        );
        let fetches = Family::<Labels, Counter>::default();
        for (node, n) in &k.fetches_by_node {
            fetches
                .get_or_create(&vec![("broker".into(), node.to_string())])
                .inc_by(*n);
        }
        registry.register(
            "kafka_source_fetches",
            "Fetch answers received, by the node id of the broker that sent them",
            fetches,
        );
        let fetching_from = Family::<Labels, Gauge>::default();
        for ((topic, partition), node) in &k.fetching_from {
            let labels: Labels = vec![
                ("topic".into(), topic.clone()),
                ("partition".into(), partition.to_string()),
            ];
            fetching_from.get_or_create(&labels).set(i64::from(*node));
        }
        registry.register(
            "kafka_source_fetch_broker",
            "The node id of the broker each partition is fetched from now",
            fetching_from,
        );
    }
    registry
}

/// The pipeline's metrics now, in the Prometheus text format (0.0.4), or
/// in OpenMetrics when `openmetrics`.
pub fn render(observed: &Observed, openmetrics: bool) -> String {
    let registry = registry(observed);
    let mut out = String::new();
    let encoded = if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, &registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
    };
    encoded.expect("writing into a String cannot fail");
    out
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
        let text = render(&o, false);
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
        let text = render(&o, false);
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
