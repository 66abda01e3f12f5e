//! A source subtask: polls its source, routes records to the sink subtasks,
//! and turns barrier commands into position reports and barriers.

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::messages::{Msg, Report, SourceCommand};
use super::routing::route;
use crate::coordinator::{TaskId, TaskState};
use crate::error::ConnectorError;
use crate::fault;
use crate::metrics::Metrics;
use crate::record::{Record, SplitPositions};
use crate::source::{Poll, Source};
use crate::split_name::SplitName;

async fn send(output: &mpsc::Sender<Msg>, msg: Msg) -> Result<(), ConnectorError> {
    output
        .send(msg)
        .await
        .map_err(|_| ConnectorError::transient("source", "a sink subtask stopped"))
}

pub(super) struct SourceTask {
    index: usize,
    source: Box<dyn Source>,
    /// One channel per sink subtask.
    outputs: Vec<mpsc::Sender<Msg>>,
    batch_size: usize,
    reports: mpsc::UnboundedSender<Report>,
    metrics: Arc<Metrics>,
}

impl SourceTask {
    pub(super) fn new(
        index: usize,
        source: Box<dyn Source>,
        outputs: Vec<mpsc::Sender<Msg>>,
        batch_size: usize,
        reports: mpsc::UnboundedSender<Report>,
        metrics: Arc<Metrics>,
    ) -> SourceTask {
        SourceTask {
            index,
            source,
            outputs,
            batch_size,
            reports,
            metrics,
        }
    }

    pub(super) async fn run(mut self, mut control: mpsc::UnboundedReceiver<SourceCommand>) {
        let task = TaskId::Source(self.index);
        if let Err(e) = self.run_inner(&mut control).await {
            let _ = self.reports.send(Report::Failed(task, e));
        }
    }

    /// Sends each record to the sink subtask of its split. A batch whose
    /// records all go to one sink subtask is sent as it is; otherwise each
    /// subtask's part is allocated once, at its size.
    async fn emit(&mut self, records: Vec<Record>) -> Result<(), ConnectorError> {
        let p = self.outputs.len();
        if records.is_empty() {
            return Ok(());
        }
        if p == 1 {
            return send(&self.outputs[0], Msg::Records(records)).await;
        }
        // Records of a split mostly come in runs: its route is computed
        // once per run.
        let mut last: Option<(&SplitName, usize)> = None;
        let routes: Vec<usize> = records
            .iter()
            .map(|r| match last {
                Some((split, to)) if split.shares_with(&r.split) => to,
                _ => {
                    let to = route(&r.split, p);
                    last = Some((&r.split, to));
                    to
                }
            })
            .collect();
        let mut counts = vec![0usize; p];
        routes.iter().for_each(|to| counts[*to] += 1);
        if let Some(only) = counts.iter().position(|n| *n == records.len()) {
            return send(&self.outputs[only], Msg::Records(records)).await;
        }
        let mut per_sink: Vec<Vec<Record>> = counts.iter().map(|n| Vec::with_capacity(*n)).collect();
        for (r, to) in records.into_iter().zip(routes) {
            per_sink[to].push(r);
        }
        for (i, batch) in per_sink.into_iter().enumerate() {
            if !batch.is_empty() {
                send(&self.outputs[i], Msg::Records(batch)).await?;
            }
        }
        Ok(())
    }

    async fn run_inner(&mut self, control: &mut mpsc::UnboundedReceiver<SourceCommand>) -> Result<(), ConnectorError> {
        let mut finished = false;
        loop {
            // Commands first, so barriers are not delayed behind data.
            let command = if finished {
                match control.recv().await {
                    Some(c) => Some(c),
                    None => return Ok(()),
                }
            } else {
                match control.try_recv() {
                    Ok(c) => Some(c),
                    Err(mpsc::error::TryRecvError::Empty) => None,
                    Err(mpsc::error::TryRecvError::Disconnected) => return Ok(()),
                }
            };
            if let Some(command) = command {
                match command {
                    SourceCommand::Barrier(id) => {
                        let position: SplitPositions = self.source.position(id);
                        for output in &self.outputs {
                            send(output, Msg::Barrier(id)).await?;
                        }
                        debug!(checkpoint = %id, "barrier emitted");
                        let state = TaskState::Source(position);
                        let _ = self.reports.send(Report::Ack(id, TaskId::Source(self.index), state));
                    }
                    SourceCommand::Complete(id) => {
                        // Progress publishing only (e.g. consumer-group offsets for lag
                        // tools): a failure here must not restart the pipeline.
                        if let Err(e) = self.source.checkpoint_complete(id).await {
                            warn!(checkpoint = %id, error = %e, "source could not publish checkpoint progress");
                        }
                    }
                    SourceCommand::Stop => {
                        if !finished {
                            finished = true;
                            let _ = self.reports.send(Report::SourceFinished(self.index));
                        }
                    }
                }
                continue;
            }
            match self.source.poll(self.batch_size).await? {
                Poll::Records(records) if records.is_empty() => {}
                Poll::Records(records) => {
                    self.metrics.source_read(self.index, &records);
                    self.emit(records).await?;
                    fault::point_at("source.after_emit", self.index);
                }
                Poll::Finished => {
                    finished = true;
                    info!("source finished");
                    let _ = self.reports.send(Report::SourceFinished(self.index));
                }
            }
        }
    }
}
