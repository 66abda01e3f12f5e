//! A sink subtask: aligns the barriers of its inputs (exactly-once) or
//! counts them (at-least-once), writes records into the sink's open
//! transaction, pre-commits at each aligned barrier and commits what the
//! driver says is complete.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tracing::{info_span, warn, Instrument};

use super::config::Guarantee;
use super::messages::{Msg, Report, SinkCommand};
use crate::coordinator::{CommitLedger, TaskId, TaskState};
use crate::error::ConnectorError;
use crate::fault;
use crate::metrics::Metrics;
use crate::record::CheckpointId;
use crate::sink::ErasedSink;

pub(super) struct SinkTask {
    index: usize,
    sink: Box<dyn ErasedSink>,
    guarantee: Guarantee,
    ledger: CommitLedger,
    /// Highest barrier id seen per input.
    barrier_seen: Vec<CheckpointId>,
    /// Inputs held back during alignment (exactly-once only).
    blocked: Vec<bool>,
    /// Inputs whose source has gone.
    closed: Vec<bool>,
    /// Where the next scan over the inputs starts (fairness).
    next_input: usize,
    last_snapshot: CheckpointId,
    reports: mpsc::UnboundedSender<Report>,
    metrics: Arc<Metrics>,
}

impl SinkTask {
    /// Sink subtask `index` with `inputs` inputs, whose first checkpoint is
    /// `base + 1`.
    pub(super) fn new(
        index: usize,
        sink: Box<dyn ErasedSink>,
        guarantee: Guarantee,
        inputs: usize,
        base: CheckpointId,
        reports: mpsc::UnboundedSender<Report>,
        metrics: Arc<Metrics>,
    ) -> SinkTask {
        SinkTask {
            index,
            sink,
            guarantee,
            ledger: CommitLedger::new(),
            barrier_seen: vec![base; inputs],
            blocked: vec![false; inputs],
            closed: vec![false; inputs],
            next_input: 0,
            last_snapshot: base,
            reports,
            metrics,
        }
    }

    pub(super) async fn run(
        mut self,
        mut inputs: Vec<mpsc::Receiver<Msg>>,
        mut control: mpsc::UnboundedReceiver<SinkCommand>,
    ) {
        let result = async {
            loop {
                tokio::select! {
                    biased;
                    c = control.recv() => match c {
                        Some(SinkCommand::Commit(id, at)) => self.commit_up_to(id, at).await?,
                        Some(SinkCommand::Close(done)) => {
                            let _ = done.send(self.sink.close().await);
                            return Ok(());
                        }
                        None => return Ok(()),
                    },
                    m = self.next_message(&mut inputs) => match m {
                        Some((from, msg)) => self.process(from, msg).await?,
                        None => std::future::pending::<()>().await,
                    },
                }
            }
        }
        .await;
        if let Err(e) = result {
            if let Err(abort_error) = self.sink.abort().await {
                warn!(error = %crate::error::ErrorChain(&abort_error), "abort after failure failed; recovery will clean up");
            }
            let _ = self.reports.send(Report::Failed(TaskId::Sink(self.index), e));
        }
    }

    /// The next message from an input that is not held back by alignment (held
    /// inputs are not read, so their sources feel back-pressure), or `None`
    /// once every source has gone.
    fn next_message<'a>(
        &'a mut self,
        inputs: &'a mut [mpsc::Receiver<Msg>],
    ) -> impl Future<Output = Option<(usize, Msg)>> + 'a {
        std::future::poll_fn(move |cx| {
            let n = inputs.len();
            for k in 0..n {
                let i = (self.next_input + k) % n;
                if self.blocked[i] || self.closed[i] {
                    continue;
                }
                match inputs[i].poll_recv(cx) {
                    std::task::Poll::Ready(Some(msg)) => {
                        self.next_input = (i + 1) % n;
                        return std::task::Poll::Ready(Some((i, msg)));
                    }
                    std::task::Poll::Ready(None) => self.closed[i] = true,
                    std::task::Poll::Pending => {}
                }
            }
            if self.closed.iter().all(|c| *c) {
                std::task::Poll::Ready(None)
            } else {
                std::task::Poll::Pending
            }
        })
    }

    async fn commit_up_to(&mut self, id: CheckpointId, completed_at: Instant) -> Result<(), ConnectorError> {
        let due = self.ledger.due(id);
        if !due.is_empty() {
            fault::pause_at("sink.before_commit", self.index).await;
        }
        for (checkpoint, committable) in &due {
            self.sink
                .commit(committable)
                .instrument(info_span!("commit", checkpoint = %checkpoint))
                .await?;
            self.ledger.mark_committed(*checkpoint);
            self.metrics.committed(completed_at.elapsed().as_micros() as u64);
        }
        if !due.is_empty() {
            fault::point_at("sink.after_commit", self.index);
            self.metrics
                .set_pending_transactions(self.index, self.ledger.entries().len());
        }
        let _ = self.reports.send(Report::Committed(self.index, id));
        Ok(())
    }

    async fn process(&mut self, from: usize, msg: Msg) -> Result<(), ConnectorError> {
        match msg {
            Msg::Records(records) => {
                let interval = self.last_snapshot.next();
                self.sink.write(interval, &records).await?;
                self.metrics.sink_wrote(self.index, &records);
            }
            Msg::Barrier(id) => {
                self.barrier_seen[from] = self.barrier_seen[from].max(id);
                if self.guarantee == Guarantee::ExactlyOnce {
                    self.blocked[from] = true;
                }
                let aligned = *self.barrier_seen.iter().min().expect("at least one input");
                if aligned > self.last_snapshot {
                    self.snapshot(aligned).await?;
                }
            }
        }
        Ok(())
    }

    async fn snapshot(&mut self, id: CheckpointId) -> Result<(), ConnectorError> {
        fault::fail_at("sink.pre_commit", self.index)?;
        let committable = self
            .sink
            .pre_commit()
            .instrument(info_span!("pre_commit", checkpoint = %id))
            .await?;
        match (self.guarantee, committable) {
            (Guarantee::ExactlyOnce, Some(c)) => {
                self.ledger.add(id, c);
                fault::point_at("sink.after_pre_commit", self.index);
                fault::pause_at("sink.after_pre_commit", self.index).await;
            }
            (Guarantee::AtLeastOnce, Some(c)) => {
                self.sink.commit(&c).await?;
                fault::point_at("sink.after_pre_commit", self.index);
                fault::pause_at("sink.after_pre_commit", self.index).await;
            }
            (_, None) => {}
        }
        self.last_snapshot = id;
        self.blocked.iter_mut().for_each(|b| *b = false);
        let pending = self.ledger.snapshot();
        self.metrics.set_pending_transactions(self.index, pending.len());
        let state = TaskState::Sink(pending);
        let _ = self.reports.send(Report::Ack(id, TaskId::Sink(self.index), state));
        Ok(())
    }
}
