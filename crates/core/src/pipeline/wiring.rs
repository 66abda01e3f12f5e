//! Step 2 of an attempt: connect the recovered subtasks with channels and
//! start them.
//!
//! One bounded channel per (source, sink) pair, so a sink that holds back an
//! aligned input back-pressures exactly that source; unbounded control
//! channels from the driver to every subtask, and one report channel back.

use std::time::Instant;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{info_span, Instrument};

use super::messages::{Report, SourceCommand};
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
    /// "Commit everything pending up to N (completed at that instant)".
    pub(super) sink_controls: Vec<mpsc::UnboundedSender<(CheckpointId, Instant)>>,
}

impl Pipeline {
    /// Starts the subtasks; the first checkpoint they see is `base + 1`.
    pub(super) fn wire(
        &self,
        sinks: Vec<Box<dyn ErasedSink>>,
        sources: Vec<Box<dyn Source>>,
        base: CheckpointId,
    ) -> Wired {
        let p = self.config.parallelism;
        let (report_tx, reports) = mpsc::unbounded_channel::<Report>();
        let mut tasks = JoinSet::new();
        let mut source_outputs: Vec<Vec<_>> = (0..p).map(|_| Vec::with_capacity(p)).collect();
        let mut sink_controls = Vec::with_capacity(p);
        for (i, sink) in sinks.into_iter().enumerate() {
            let mut inputs = Vec::with_capacity(p);
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
                p,
                base,
                report_tx.clone(),
                self.metrics.clone(),
            );
            tasks.spawn(task.run(inputs, control).instrument(info_span!("sink", subtask = i)));
        }
        let mut source_controls = Vec::with_capacity(p);
        for ((i, source), outputs) in sources.into_iter().enumerate().zip(source_outputs) {
            let (control_tx, control) = mpsc::unbounded_channel();
            source_controls.push(control_tx);
            let task = SourceTask::new(
                i,
                source,
                outputs,
                self.config.batch_size,
                report_tx.clone(),
                self.metrics.clone(),
            );
            tasks.spawn(task.run(control).instrument(info_span!("source", subtask = i)));
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
