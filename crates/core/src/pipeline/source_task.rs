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
use crate::transform::{Chain, Tally};

/// Sends `msg` to a sink subtask. When the channel is full the source waits
/// until half of it is free, not for one slot: a source that reads faster
/// than its sink writes then wakes once per several batches instead of once
/// per batch the sink takes (everything queued ahead has to reach the sink
/// first anyway, so a barrier arrives no later).
async fn send(output: &mpsc::Sender<Msg>, msg: Msg) -> Result<(), ConnectorError> {
    let stopped = || ConnectorError::transient("source", "a sink subtask stopped");
    if output.capacity() == 0 {
        let half = (output.max_capacity() / 2).max(1);
        // The permits go back when dropped; the send below takes one.
        drop(output.reserve_many(half).await.map_err(|_| stopped())?);
    }
    output.send(msg).await.map_err(|_| stopped())
}

pub(super) struct SourceTask {
    index: usize,
    source: Box<dyn Source>,
    /// One channel per sink subtask.
    outputs: Vec<mpsc::Sender<Msg>>,
    /// Run on every batch the source returns, before it is routed.
    transforms: Chain,
    batch_size: usize,
    reports: mpsc::UnboundedSender<Report>,
    metrics: Arc<Metrics>,
}

impl SourceTask {
    pub(super) fn new(
        index: usize,
        source: Box<dyn Source>,
        outputs: Vec<mpsc::Sender<Msg>>,
        transforms: Chain,
        batch_size: usize,
        reports: mpsc::UnboundedSender<Report>,
        metrics: Arc<Metrics>,
    ) -> SourceTask {
        SourceTask {
            index,
            source,
            outputs,
            transforms,
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
                            warn!(checkpoint = %id, error = %crate::error::ErrorChain(&e), "source could not publish checkpoint progress");
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
                    // The source's position already covers every record
                    // read: what a transform drops stays passed.
                    let records = if self.transforms.is_empty() {
                        records
                    } else {
                        let mut tally = Tally::default();
                        let out = self.transforms.apply(records, &mut tally)?;
                        self.metrics.transformed(&tally);
                        out
                    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::CheckpointId;

    fn barrier(id: u64) -> Msg {
        Msg::Barrier(CheckpointId(id))
    }

    fn id_of(msg: Option<Msg>) -> u64 {
        match msg {
            Some(Msg::Barrier(id)) => id.0,
            _ => panic!("expected a barrier"),
        }
    }

    #[tokio::test]
    async fn a_full_channel_takes_the_next_message_once_half_of_it_is_free() {
        let (tx, mut rx) = mpsc::channel(4);
        for id in 1..=4 {
            send(&tx, barrier(id)).await.expect("room");
        }
        let waiting = tokio::spawn(async move { send(&tx, barrier(5)).await });
        tokio::task::yield_now().await;
        assert_eq!(id_of(rx.recv().await), 1);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "one free slot of four does not wake the source");
        assert_eq!(id_of(rx.recv().await), 2);
        waiting.await.expect("joined").expect("sent once half is free");
        let rest: Vec<u64> = [rx.recv().await, rx.recv().await, rx.recv().await]
            .into_iter()
            .map(id_of)
            .collect();
        assert_eq!(rest, [3, 4, 5], "nothing lost or reordered");
    }

    #[tokio::test]
    async fn a_stopped_sink_is_a_transient_error_even_while_waiting_for_room() {
        let (tx, rx) = mpsc::channel(2);
        send(&tx, barrier(1)).await.expect("room");
        send(&tx, barrier(2)).await.expect("room");
        let waiting = tokio::spawn(async move { send(&tx, barrier(3)).await });
        tokio::task::yield_now().await;
        drop(rx);
        let error = waiting.await.expect("joined").expect_err("the sink is gone");
        assert!(error.to_string().contains("a sink subtask stopped"), "{error}");
    }
}
