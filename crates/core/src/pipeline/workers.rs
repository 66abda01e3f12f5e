//! Several processes, one pipeline: this process as one worker among those
//! that share the pipeline's regions under leases in the checkpoint store
//! (see [`crate::membership`] and `docs/design/several-processes.md`).
//!
//! The pure [`Worker`] decides; this loop performs its [`Order`]s against
//! the [`LeaseStore`], feeds the answers back as [`Input`]s, and runs one
//! runner per region the worker owns:
//!
//! - `Start`: the claim raised the region's epoch (fencing its previous
//!   owner); the runner reads the region's latest checkpoint after that
//!   fence, recovers its sinks under that epoch (they fence their own
//!   stores) and runs one attempt;
//! - `Stop` (the lease's deadline on this process's own clock passed, or a
//!   renewal found the lease gone): the runner is dropped at once — no last
//!   checkpoint, no commit, its subtasks aborted;
//! - `HandOver` (rebalancing, SIGTERM): the runner takes a last checkpoint,
//!   commits it, closes its sinks and ends; then the lease is released.
//!
//! A failed attempt does not restart in place: the runner waits the restart
//! strategy's delay, ends, and the lease is released; the next claim (this
//! worker's or another's) raises the epoch again, so every attempt of a
//! region starts behind a fence, as in one process. A write refused for its
//! epoch drops the region (another worker took it).
//!
//! The runners are polled by this loop's own task, timer first: after a
//! freeze, the deadline is seen before any runner runs again. What a runner
//! had already handed to its subtasks is refused by the stores by epoch.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing::{error, info, info_span, warn, Instrument};

use super::region::Region;
use super::restore::Claimed;
use super::{Pipeline, RunSummary};
use crate::acting::{boot_ms, ActingGate};
use crate::error::{PipelineError, StoreError};
use crate::membership::{Claim, Epoch, Input, LeaseSettings, LeaseStore, MonoTime, Order, Worker, WorkerId};
use crate::record::CheckpointId;

/// How a region's runner ended.
enum RegionEnd {
    /// Its last checkpoint is committed (handed over, or its sources ended).
    Done(Option<CheckpointId>),
    /// A failure to retry: the lease goes back, and the next claim (which
    /// fences) restarts the region.
    Retry,
    /// A write was refused for its epoch: another worker took the region.
    Lost,
    /// Not retriable, or the restart strategy gave up.
    Fatal(PipelineError),
}

type RunnerFuture<'a> = Pin<Box<dyn Future<Output = RegionEnd> + Send + 'a>>;

/// A region this worker acts on.
struct Running<'a> {
    epoch: Epoch,
    /// Its deadline, for the region's subtasks.
    acting: ActingGate,
    /// `true`: take a last checkpoint and end.
    stop: watch::Sender<bool>,
    future: RunnerFuture<'a>,
}

/// This process's worker id: host, pid and a random tag (a restarted
/// process with a reused pid is another worker).
fn worker_id() -> WorkerId {
    let tag: u32 = rand::random();
    WorkerId(format!(
        "{}:{}:{tag:08x}",
        crate::file_lock::host_name(),
        std::process::id()
    ))
}

/// The worker's monotonic clock: `CLOCK_BOOTTIME` (see [`crate::acting`]),
/// in milliseconds since the worker started.
struct BootClock {
    origin: u64,
}

impl BootClock {
    fn start() -> BootClock {
        BootClock { origin: boot_ms() }
    }

    fn now(&self) -> MonoTime {
        MonoTime(boot_ms().saturating_sub(self.origin))
    }

    /// `t` on the boot clock itself (what an [`ActingGate`] holds).
    fn boot(&self, t: MonoTime) -> u64 {
        self.origin.saturating_add(t.0)
    }

    /// How long from now until `t`.
    fn until(&self, t: MonoTime) -> Duration {
        Duration::from_millis(t.0.saturating_sub(self.now().0))
    }
}

/// Resolves with the first runner of `running` that ended.
fn next_end<'a, 'b>(
    running: &'b mut BTreeMap<usize, Running<'a>>,
) -> impl Future<Output = (usize, RegionEnd)> + use<'a, 'b> {
    std::future::poll_fn(move |cx| {
        for (region, r) in running.iter_mut() {
            if let Poll::Ready(end) = r.future.as_mut().poll(cx) {
                return Poll::Ready((*region, end));
            }
        }
        Poll::Pending
    })
}

/// Runs a store call on a task of its own and feeds its answer back to the
/// worker: a slow call holds up neither the loop nor the runners.
fn answer(answers: &mpsc::UnboundedSender<Input>, call: impl Future<Output = Input> + Send + 'static) {
    let answers = answers.clone();
    tokio::spawn(async move {
        let _ = answers.send(call.await);
    });
}

fn is_fenced(e: &PipelineError) -> bool {
    matches!(e, PipelineError::Store { source, .. } if matches!(**source, StoreError::Fenced { .. }))
}

impl Pipeline {
    /// [`Pipeline::run`] as one worker of several: see the module
    /// documentation. Returns after `shutdown` resolved and every region
    /// this worker owned was handed over, or with the first fatal error
    /// (after handing its other regions over).
    pub(super) async fn run_as_worker(
        &self,
        leases: Arc<dyn LeaseStore>,
        settings: LeaseSettings,
        mut shutdown: Pin<&mut (impl Future<Output = ()> + Send)>,
    ) -> Result<RunSummary, PipelineError> {
        let regions = self.prepare_worker_layout().await?;
        let refused = |e: StoreError| PipelineError::Store {
            pipeline: self.config.name.clone(),
            source: Box::new(e),
        };
        let me = worker_id();
        // A process running the pipeline alone (without workers) neither
        // claims nor fences as workers do: never beside it. The membership
        // row goes in first, then the lock's holder is asked: a run without
        // workers that takes the lock after this sees the row and is
        // refused; one that holds it already is seen here.
        (leases.renew(&me, &[], true, settings.term).await).map_err(|e| refused(e.into()))?;
        if let Some(holder) = leases.sole_holder().await.map_err(|e| refused(e.into()))? {
            let _ = leases.leave(&me).await;
            return Err(refused(StoreError::Locked {
                pipeline: self.config.name.clone(),
                dir: self.store.location(),
                holder: format!(
                    "{holder}, which runs the pipeline without [workers]: stop it first, or give it the same \
                     [workers] section"
                ),
            }));
        }
        info!(
            worker = %me,
            regions = regions.len(),
            lease_term = ?settings.term,
            "joining the pipeline's workers"
        );
        let clock = BootClock::start();
        let mut worker = Worker::new(me.clone(), settings);
        let (answers, mut answered) = mpsc::unbounded_channel::<Input>();
        let attempts = Mutex::new(BTreeMap::new());
        // Worker mode records no clean release of a store lock: a sink that
        // did not close is only logged (the next owner fences anyway).
        let left_open = AtomicBool::new(false);
        let mut running: BTreeMap<usize, Running<'_>> = BTreeMap::new();
        let mut last: Vec<Option<CheckpointId>> = vec![None; regions.len()];
        // Regions asked to hand over, and regions whose sources finished
        // (held idle: a new claim would only find them finished again).
        let mut handing_over = std::collections::BTreeSet::new();
        let mut finished = std::collections::BTreeSet::new();
        let mut fatal: Option<PipelineError> = None;
        let mut shutting_down = false;
        // Releases and the leave in flight: awaited before returning, so an
        // exit does not cut them off (the others would wait out the term).
        let mut farewells = Vec::new();
        let mut orders = worker.handle(clock.now(), Input::Tick);
        loop {
            let mut exit = false;
            for order in orders.drain(..) {
                match order {
                    Order::Renew {
                        seq,
                        regions: held,
                        member,
                    } => {
                        let (leases, me) = (leases.clone(), me.clone());
                        answer(&answers, async move {
                            match leases.renew(&me, &held, member, settings.term).await {
                                Ok(kept) => Input::Renewed { seq, kept },
                                Err(e) => {
                                    warn!(error = %crate::ErrorChain(&e), "could not renew the leases: trying again");
                                    Input::RenewFailed { seq }
                                }
                            }
                        });
                    }
                    Order::Poll => {
                        let (leases, n) = (leases.clone(), regions.len());
                        answer(&answers, async move {
                            match leases.view(n).await {
                                Ok(view) => Input::Viewed(view),
                                Err(e) => {
                                    warn!(error = %crate::ErrorChain(&e), "could not read the leases: trying again");
                                    Input::PollFailed
                                }
                            }
                        });
                    }
                    Order::Claim { region, expected } => {
                        let (leases, me) = (leases.clone(), me.clone());
                        answer(&answers, async move {
                            match leases.claim(region, &me, expected, settings.term).await {
                                Ok(Claim::Granted(lease)) => Input::Claimed {
                                    region,
                                    epoch: lease.epoch,
                                },
                                Ok(_) => Input::ClaimRefused { region },
                                Err(e) => {
                                    warn!(region, error = %crate::ErrorChain(&e), "a claim's outcome is unknown: reading the leases again");
                                    Input::ClaimFailed { region }
                                }
                            }
                        });
                    }
                    Order::Start { region, epoch } => {
                        self.metrics.region_claimed();
                        info!(region, %epoch, worker = %me, "claimed the region: recovering it under its new epoch");
                        let (stop, stop_rx) = watch::channel(false);
                        let deadline = worker.deadline(region, epoch).unwrap_or_default();
                        let acting = ActingGate::until(clock.boot(deadline));
                        let claimed = Claimed {
                            epoch,
                            acting: acting.clone(),
                        };
                        let future =
                            Box::pin(self.run_owned(&regions[region], claimed, stop_rx, &left_open, &attempts));
                        let r = Running {
                            epoch,
                            acting,
                            stop,
                            future,
                        };
                        // The model starts a region only after it stopped
                        // the earlier ownership; were one left, it must
                        // not act on past this point.
                        if let Some(earlier) = running.insert(region, r) {
                            earlier.acting.close();
                        }
                    }
                    Order::Stop { region, epoch } => {
                        finished.remove(&region);
                        handing_over.remove(&region);
                        if let Some(stopped) = running.remove(&region) {
                            stopped.acting.close();
                            drop(stopped);
                            self.metrics.region_dropped();
                            warn!(
                                region,
                                %epoch,
                                "stopped acting on the region at once (its lease may run out: a renewal came too late \
                                 or found it taken): dropped without a last checkpoint; its next owner recovers it"
                            );
                        }
                    }
                    Order::HandOver { region, epoch } => {
                        if let Some(r) = running.get(&region) {
                            info!(region, %epoch, "handing the region over: a last checkpoint, then the lease goes");
                            handing_over.insert(region);
                            let _ = r.stop.send(true);
                        } else if finished.remove(&region) {
                            // Nothing runs: its last checkpoint is committed.
                            let _ = answers.send(Input::Stopped { region });
                        }
                    }
                    Order::Release { region, epoch } => {
                        let (leases, me) = (leases.clone(), me.clone());
                        farewells.push(tokio::spawn(async move {
                            match leases.release(region, &me, epoch).await {
                                Ok(true) => info!(region, %epoch, "released the region's lease"),
                                Ok(false) => {}
                                Err(e) => warn!(
                                    region,
                                    error = %crate::ErrorChain(&e),
                                    "could not release the region's lease: it runs out on its own"
                                ),
                            }
                        }));
                    }
                    Order::Leave => {
                        let (leases, me) = (leases.clone(), me.clone());
                        farewells.push(tokio::spawn(async move {
                            if let Err(e) = leases.leave(&me).await {
                                warn!(error = %crate::ErrorChain(&e), "could not leave the workers: the membership runs out on its own");
                            }
                        }));
                    }
                    Order::Exit => exit = true,
                }
            }
            self.metrics.set_regions_owned(running.len() + finished.len());
            for (region, r) in &running {
                if let Some(deadline) = worker.deadline(*region, r.epoch) {
                    r.acting.extend(clock.boot(deadline));
                }
            }
            farewells.retain(|f| !f.is_finished());
            if exit {
                break;
            }
            // Due already (the timer below counts on a clock that stops while
            // the machine sleeps; the worker's does not): tick before any
            // runner is polled again.
            if worker.next_tick().is_some_and(|t| t <= clock.now()) {
                orders = worker.handle(clock.now(), Input::Tick);
                continue;
            }
            let wait = worker.next_tick().map_or(Duration::from_secs(3600), |t| clock.until(t));
            tokio::select! {
                biased;
                _ = tokio::time::sleep(wait) => orders = worker.handle(clock.now(), Input::Tick),
                Some(input) = answered.recv() => orders = worker.handle(clock.now(), input),
                _ = &mut shutdown, if !shutting_down => {
                    shutting_down = true;
                    info!(worker = %me, "shutdown requested: handing every region over");
                    orders = worker.handle(clock.now(), Input::Shutdown);
                }
                (region, end) = next_end(&mut running) => {
                    let Some(ended) = running.remove(&region) else { continue };
                    ended.acting.close();
                    let now = clock.now();
                    let handed = handing_over.remove(&region);
                    orders = match end {
                        RegionEnd::Done(id) if handed => {
                            last[region] = id;
                            worker.handle(now, Input::Stopped { region })
                        }
                        RegionEnd::Done(id) => {
                            last[region] = id;
                            info!(region, "the region's sources are finished: holding it idle until it is handed over");
                            finished.insert(region);
                            Vec::new()
                        }
                        RegionEnd::Retry => worker.handle(now, Input::Stopped { region }),
                        RegionEnd::Lost => {
                            self.metrics.region_dropped();
                            warn!(region, epoch = %ended.epoch, "another worker took the region: dropped it without writing");
                            worker.handle(now, Input::Lost { region, epoch: ended.epoch })
                        }
                        RegionEnd::Fatal(e) => {
                            let mut orders = worker.handle(now, Input::Stopped { region });
                            if fatal.is_none() {
                                fatal = Some(e);
                                shutting_down = true;
                                orders.extend(worker.handle(now, Input::Shutdown));
                            }
                            orders
                        }
                    };
                }
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), futures_util::future::join_all(farewells)).await;
        info!(worker = %me, "left the pipeline's workers");
        if let Some(e) = fatal {
            return Err(e);
        }
        Ok(RunSummary {
            last_checkpoint: last.iter().copied().min().flatten(),
            regions: last,
            metrics: self.metrics.snapshot(),
        })
    }

    /// One attempt of `region`, owned under `epoch`; on a failure to retry,
    /// waits the restart strategy's delay first.
    async fn run_owned(
        &self,
        region: &Region,
        claimed: Claimed,
        stop: watch::Receiver<bool>,
        left_open: &AtomicBool,
        attempts: &Mutex<BTreeMap<usize, u32>>,
    ) -> RegionEnd {
        let index = region.index.unwrap_or_default();
        for &subtask in region.sources.iter().chain(&region.sinks) {
            self.metrics.assign_region(subtask, index);
        }
        let epoch = claimed.epoch;
        let mut handed_over = stop.clone();
        let attempt = self.run_attempt(region, Some(&claimed), stop, left_open);
        let result = attempt.instrument(info_span!("region", region = index, %epoch)).await;
        // Failures in a row of this region (a completed checkpoint resets
        // it), as the restart strategy counts them.
        let count = |progress: bool, failed: bool| {
            let mut attempts = attempts.lock().unwrap_or_else(|e| e.into_inner());
            let n = attempts.entry(index).or_insert(0u32);
            *n = if progress { 0 } else { *n } + u32::from(failed);
            *n
        };
        match result {
            Ok(last) => {
                count(true, false);
                RegionEnd::Done(last)
            }
            // Refused for its epoch by the checkpoint store: someone took it.
            Err(failure) if is_fenced(&failure.error) => RegionEnd::Lost,
            Err(failure) if !failure.retriable => {
                error!(region = index, error = %crate::ErrorChain(&failure.error), "failed; not retriable");
                RegionEnd::Fatal(failure.error)
            }
            // Failed once the deadline passed (a sink's own fence refusing
            // it, a call cut short): the region is someone else's, or about
            // to be; no restart is counted.
            Err(failure) if !claimed.acting.holds() => {
                warn!(region = index, error = %crate::ErrorChain(&failure.error), "failed after this worker's deadline on the region");
                RegionEnd::Lost
            }
            Err(failure) => {
                let attempt = count(failure.made_progress, true);
                let Some(delay) = self.config.restart.delay(attempt) else {
                    error!(region = index, attempt, error = %crate::ErrorChain(&failure.error), "failed; restart strategy gives up");
                    return RegionEnd::Fatal(PipelineError::RestartsExhausted {
                        pipeline: self.config.name.clone(),
                        attempts: attempt - 1,
                        last: Box::new(failure.error),
                    });
                };
                warn!(
                    region = index,
                    attempt,
                    ?delay,
                    error = %crate::ErrorChain(&failure.error),
                    "failed; the region is claimed again (a new epoch) after the delay"
                );
                self.metrics.restarted_in(Some(index));
                // A hand-over asked meanwhile does not wait out the delay.
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = handed_over.wait_for(|stop| *stop) => {}
                }
                RegionEnd::Retry
            }
        }
    }
}
