//! Operating a pipeline: the Prometheus and health endpoint, the consumer
//! lag, `exactly status`, `exactly checkpoints show`, log formats and the
//! catch-up progress line.
//!
//! - [`exporter`]: the metric families ([`exporter::METRIC_NAMES`]);
//! - [`server`]: `/metrics`, `/health/live`, `/health/ready` (axum);
//! - [`lag`]: end offsets minus checkpointed positions (Kafka source);
//! - [`status`] and [`show`]: the commands;
//! - [`progress`], [`logging`], [`redact`].

pub mod exporter;
pub mod lag;
pub mod logging;
pub mod progress;
pub mod redact;
pub mod server;
pub mod show;
pub mod status;

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::config::{Built, PipelineFile, SourceSection};
use exporter::{LagReading, Observed};

/// Default `[metrics] lag_interval`.
pub const DEFAULT_LAG_INTERVAL: Duration = Duration::from_secs(5);
/// How often the lag is read while the progress line shows.
const PROGRESS_LAG_INTERVAL: Duration = Duration::from_secs(1);

/// What a scrape and the progress line read, for a built pipeline.
pub fn observe(file: &PipelineFile, built: &Built) -> Observed {
    let config = file.pipeline_config();
    let default_age = config.checkpoint.interval * 3 + config.checkpoint.timeout;
    Observed {
        pipeline: file.name.clone(),
        metrics: built.pipeline.metrics(),
        lag: LagReading::default(),
        kafka_sink: built.kafka_sink.clone(),
        kafka_source: built.kafka_source.clone(),
        ready_max_age: file.metrics.ready_max_checkpoint_age.map_or(default_age, |d| d.0),
    }
}

/// Keeps `observed.lag` fresh (Kafka sources only; `None` otherwise):
/// every `interval` the positions of the latest checkpoints against the
/// brokers' end offsets. A failed reading is logged once per outage and
/// leaves the previous one out (no stale lag is exported).
pub fn spawn_lag_monitor(file: &PipelineFile, observed: &Observed, interval: Duration) -> Option<JoinHandle<()>> {
    let SourceSection::Kafka(kafka) = &file.source else {
        return None;
    };
    let mut probe = lag::KafkaLagProbe::new(kafka);
    let file = file.clone();
    let reading = observed.lag.clone();
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            // The checkpoint sequences are listed again at every tick: the
            // regions' folders appear one by one as the runtime starts them,
            // and a list taken while only some existed would leave the
            // others' partitions unread for good.
            let positions = status::latest_positions(&status::sequences(&file).await).await;
            match probe.lag(positions.as_ref()).await {
                Ok(lag) => {
                    failing = false;
                    *reading.write().unwrap_or_else(|e| e.into_inner()) = Some(lag);
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(error = %redact::redact(&error), "cannot read the consumer lag; retrying");
                    }
                    failing = true;
                    *reading.write().unwrap_or_else(|e| e.into_inner()) = None;
                }
            }
        }
    }))
}

/// The lag interval to use: `[metrics] lag_interval`, or faster while a
/// progress line may show.
pub fn lag_interval(file: &PipelineFile) -> Duration {
    match file.metrics.lag_interval {
        Some(d) => d.0,
        None if progress::enabled() => PROGRESS_LAG_INTERVAL,
        None => DEFAULT_LAG_INTERVAL,
    }
}

/// Stops background tasks when dropped.
#[derive(Debug, Default)]
pub struct Background(Vec<JoinHandle<()>>);

impl Background {
    /// Adds a task.
    pub fn push(&mut self, task: Option<JoinHandle<()>>) {
        self.0.extend(task);
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
        progress::clear();
    }
}
