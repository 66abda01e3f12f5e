//! Step 2 of an attempt of a region: connect its recovered subtasks with
//! channels and start them.
//!
//! One bounded channel per (source, sink) pair of the region, so a sink that
//! holds back an aligned input back-pressures exactly that source (a forward
//! chain has one pair and nothing to align); unbounded control channels from
//! the driver to every subtask, and one report channel back.

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{info_span, Instrument, Span};

use super::messages::{Report, SinkCommand, SourceCommand};
use super::region::Region;
use super::sink_task::SinkTask;
use super::source_task::SourceTask;
use super::Pipeline;
use crate::record::CheckpointId;
use crate::sink::ErasedSink;
use crate::source::Source;

/// The running subtasks of an attempt, as the driver sees them.
pub(super) struct Wired {
    /// Every subtask; joining one that panicked fails the attempt.
    pub(super) tasks: JoinSet<()>,
    pub(super) reports: mpsc::UnboundedReceiver<Report>,
    /// For the checkpoint writer's reports.
    pub(super) report_tx: mpsc::UnboundedSender<Report>,
    pub(super) source_controls: Vec<mpsc::UnboundedSender<SourceCommand>>,
    /// "Commit everything pending up to N", "close".
    pub(super) sink_controls: Vec<mpsc::UnboundedSender<SinkCommand>>,
}

impl Pipeline {
    /// Starts the region's subtasks; the first checkpoint they see is
    /// `base + 1`.
    pub(super) fn wire(
        &self,
        region: &Region,
        sinks: Vec<(usize, Box<dyn ErasedSink>)>,
        sources: Vec<(usize, Box<dyn Source>)>,
        base: CheckpointId,
    ) -> Wired {
        let (n_sources, n_sinks) = (sources.len(), sinks.len());
        let (report_tx, reports) = mpsc::unbounded_channel::<Report>();
        let mut tasks = JoinSet::new();
        let mut source_outputs: Vec<Vec<_>> = (0..n_sources).map(|_| Vec::with_capacity(n_sinks)).collect();
        let mut sink_controls = Vec::with_capacity(n_sinks);
        for (i, sink) in sinks {
            let mut inputs = Vec::with_capacity(n_sources);
            for outputs in &mut source_outputs {
                let (tx, rx) = mpsc::channel(self.config.channel_capacity);
                outputs.push(tx);
                inputs.push(rx);
            }
            let (control_tx, control) = mpsc::unbounded_channel();
            sink_controls.push(control_tx);
            let task = SinkTask::new(
                i,
                sink,
                self.config.guarantee,
                n_sources,
                base,
                report_tx.clone(),
                self.metrics.clone(),
            );
            tasks.spawn(task.run(inputs, control).instrument(subtask_span(region, "sink", i)));
        }
        let mut source_controls = Vec::with_capacity(n_sources);
        for ((i, source), outputs) in sources.into_iter().zip(source_outputs) {
            let (control_tx, control) = mpsc::unbounded_channel();
            source_controls.push(control_tx);
            let task = SourceTask::new(
                i,
                source,
                outputs,
                self.transforms.clone(),
                self.config.batch_size,
                report_tx.clone(),
                self.metrics.clone(),
            );
            tasks.spawn(task.run(control).instrument(subtask_span(region, "source", i)));
        }
        Wired {
            tasks,
            reports,
            report_tx,
            source_controls,
            sink_controls,
        }
    }
}

/// The span of subtask `i` (`sink` or `source`), with its region.
fn subtask_span(region: &Region, kind: &str, i: usize) -> Span {
    match (kind, region.index) {
        ("sink", Some(r)) => info_span!("sink", subtask = i, region = r),
        ("sink", None) => info_span!("sink", subtask = i),
        (_, Some(r)) => info_span!("source", subtask = i, region = r),
        (_, None) => info_span!("source", subtask = i),
    }
}
