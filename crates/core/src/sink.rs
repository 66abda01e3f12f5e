//! Sinks: where records go, with two-phase commit.
//!
//! A [`TwoPhaseCommitSink`] ties every checkpoint interval to one transaction:
//!
//! ```text
//! begin(N) → write(txn, batch)* → pre_commit(txn) ──► committable ──► (checkpoint N persisted) ──► commit(committable)
//!                                        └─► abort(txn) on failure before pre_commit
//! ```
//!
//! The committable is serializable: it is stored in the checkpoint, so a process
//! that restarts from that checkpoint can finish the commit with
//! [`TwoPhaseCommitSink::recover`]. Stores without transactions use the
//! idempotent-sink adapters instead of implementing this trait by hand.

use std::fmt::Debug;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::coordinator::CheckpointConfig;
use crate::error::ConnectorError;
use crate::record::{CheckpointId, Record};

/// What a sink subtask knows about its place in the pipeline. Built by the
/// runtime; tests build one with [`SinkContext::new`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SinkContext {
    /// The pipeline name (unique per checkpoint folder). Use it to namespace
    /// everything the sink owns (transaction ids, pending files, gids) so recovery
    /// can find it again.
    pub pipeline: String,
    /// This subtask's index, `0..parallelism`.
    pub subtask: usize,
    /// Number of sink subtasks.
    pub parallelism: usize,
    /// Sink subtasks of an earlier run with a higher parallelism that this
    /// subtask takes over (old subtask `j` goes to `j % parallelism`): at
    /// `recover`, their listed committables come with this subtask's own,
    /// and everything else they own must be aborted like this subtask's.
    /// Empty unless the pipeline resumes with a lower parallelism.
    pub adopted: Vec<usize>,
    /// The pipeline's counters; sinks count dead letters here.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The oldest checkpoint of this subtask's region that may still be
    /// restored, kept current by the runtime: prune "already committed"
    /// markers by it (see [`RestorableCheckpoints`](crate::RestorableCheckpoints)). Unknown in a context built
    /// with [`SinkContext::new`] until set.
    pub restorable: crate::retention::RestorableCheckpoints,
    /// How this process owns the subtask's region when several processes
    /// share the pipeline (workers); `None` when one process runs it under
    /// the store's lock. A sink that [fences zombies](SinkFactory::fences_zombies)
    /// makes its own store refuse, from `recover` on, every prepare by a
    /// holder of an older epoch.
    pub ownership: Option<Ownership>,
}

/// A worker's ownership of a sink subtask's region (see
/// [`SinkContext::ownership`]).
#[derive(Clone, Debug)]
pub struct Ownership {
    /// The region's epoch, raised by this worker's claim: every owner
    /// before it holds a lower one.
    pub epoch: crate::membership::Epoch,
    /// The first checkpoint this ownership may begin; every checkpoint id
    /// an earlier owner could have used is below it. `recover` rolls back
    /// only transactions of checkpoints below it, so the late recovery of a
    /// frozen earlier owner (a zombie) cannot touch this owner's work.
    pub first_checkpoint: CheckpointId,
    /// Until when this worker may act, by its own clock: ask it right
    /// before an action your store cannot refuse by epoch (see
    /// [`ActingGate`](crate::acting::ActingGate)).
    pub acting: crate::acting::ActingGate,
}

impl SinkContext {
    /// Subtask `subtask` of `parallelism` of pipeline `pipeline`, adopting
    /// no old subtasks.
    pub fn new(
        pipeline: impl Into<String>,
        subtask: usize,
        parallelism: usize,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> Self {
        SinkContext {
            pipeline: pipeline.into(),
            subtask,
            parallelism,
            metrics,
            adopted: Vec::new(),
            restorable: Default::default(),
            ownership: None,
        }
    }

    /// The same context, owned as `ownership` says (see
    /// [`SinkContext::ownership`]).
    pub fn with_ownership(mut self, ownership: Ownership) -> Self {
        self.ownership = Some(ownership);
        self
    }

    /// The same context, reading the oldest restorable checkpoint from
    /// `restorable` (see [`SinkContext::restorable`]).
    pub fn with_restorable(mut self, restorable: crate::retention::RestorableCheckpoints) -> Self {
        self.restorable = restorable;
        self
    }

    /// The same context, taking over the old subtasks `adopted` (see
    /// [`SinkContext::adopted`]).
    pub fn with_adopted(mut self, adopted: Vec<usize>) -> Self {
        self.adopted = adopted;
        self
    }

    /// This subtask and the old ones it adopts: every subtask index whose
    /// leftovers this subtask must abort at `recover`.
    pub fn owned_subtasks(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.subtask).chain(self.adopted.iter().copied())
    }
}

/// A sink that takes part in the checkpoint's two-phase commit.
///
/// The runtime drives one instance per subtask, from one task (methods are never
/// called concurrently on the same instance). Order of calls:
/// `recover` once, then for each checkpoint interval with data
/// `begin` → `write`* → `pre_commit`, and later `commit` for every committable
/// whose checkpoint (or a later one) has been persisted.
#[async_trait]
pub trait TwoPhaseCommitSink: Send + 'static {
    /// An open transaction (a database transaction, an open pending file...).
    type Transaction: Send + 'static;
    /// The serializable proof of a pre-committed transaction that is enough to
    /// commit it later from any process: a file name, a PostgreSQL gid, a Kafka
    /// transactional id with producer id and epoch.
    type Committable: Serialize + DeserializeOwned + Clone + Debug + Send + Sync + 'static;

    /// Called once before anything else, with the committables the restored
    /// checkpoint lists for this subtask, oldest first (empty on a first start).
    ///
    /// Contract: commit every listed committable (as [`commit`](Self::commit):
    /// idempotent, "already committed" is success) and abort every transaction
    /// this subtask owns that the list does not name (left over by a crash). Must
    /// be idempotent itself: a crash during recovery leads to another recovery
    /// with the same list. No data flows until it returns.
    ///
    /// After a lowering of the parallelism, the list also holds the
    /// committables of the old subtasks in [`SinkContext::adopted`], and what
    /// those owned counts as this subtask's: abort all of it that the list
    /// does not name.
    async fn recover(&mut self, pending: &[Self::Committable]) -> Result<(), ConnectorError>;

    /// Opens the transaction that will hold the records of the interval that ends
    /// with checkpoint `checkpoint`. The runtime calls it lazily, before the first
    /// `write` of an interval; an interval without records opens no transaction.
    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<Self::Transaction, ConnectorError>;

    /// Adds records to the open transaction. They must not become visible to
    /// readers before `commit`. An error fails the checkpoint and aborts the
    /// transaction.
    async fn write(&mut self, txn: &mut Self::Transaction, batch: &[Record]) -> Result<(), ConnectorError>;

    /// Makes the transaction durable without making it visible (flush, fsync,
    /// `PREPARE TRANSACTION`) and returns its committable.
    ///
    /// Contract: after `pre_commit` returns `Ok`, `commit` of the returned
    /// committable must succeed — from this process or any later one — or report
    /// [`ConnectorError::DataLoss`]. An error here fails the checkpoint.
    async fn pre_commit(&mut self, txn: Self::Transaction) -> Result<Self::Committable, ConnectorError>;

    /// Makes a pre-committed transaction visible.
    ///
    /// Contract: idempotent — committing something already committed is success.
    /// Called in checkpoint order, possibly long after `pre_commit`, possibly by
    /// a different process after a restart (through `recover`).
    async fn commit(&mut self, committable: &Self::Committable) -> Result<(), ConnectorError>;

    /// Discards an open (not pre-committed) transaction. Best effort: anything it
    /// leaves behind is cleaned up by the next `recover`.
    async fn abort(&mut self, txn: Self::Transaction) -> Result<(), ConnectorError>;

    /// Called at every checkpoint barrier the subtask acknowledges — after
    /// `pre_commit`, or alone when the interval had no records — just before
    /// the acknowledgement lists this subtask's pre-committed transactions
    /// (again, for those still waiting for an earlier checkpoint). An error
    /// fails the checkpoint and the attempt; recovery then commits what a
    /// persisted checkpoint lists and aborts the rest.
    ///
    /// The default accepts. A sink whose pre-committed transactions expire
    /// (Kafka's transaction timeout) refuses once one could no longer be
    /// committed in time, so no checkpoint lists it any more.
    async fn check_pending(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }

    /// Called once when the subtask stops cleanly: after the final
    /// checkpoint's transactions were committed, with nothing open or
    /// pending. Let go of whatever another process taking the pipeline
    /// over would wait for or be refused by — locks, leases, the sessions
    /// holding them — and answer [`Closed::Released`]: the runtime may then
    /// tell the next holder (a standby) to start at once. Nothing is called
    /// on the sink afterwards. [`Closed::Unknown`] or an error only costs
    /// the next holder the wait it makes after a holder that did not stop
    /// cleanly. Locks taken with
    /// [`hold_instance_lock`](crate::hold_instance_lock) are let go by the
    /// runtime itself.
    ///
    /// Not called after a failure or a crash: whatever the sink holds is
    /// then released as the process or its sessions end. The default
    /// answers `Unknown`: a sink cannot be assumed to hold nothing.
    async fn close(&mut self) -> Result<Closed, ConnectorError> {
        Ok(Closed::Unknown)
    }

    /// Whether replaying every record after `checkpoint` would duplicate
    /// something this subtask (and the old subtasks it adopts) committed:
    /// asked before `recover` when the runtime would restore `checkpoint`
    /// although newer entries exist that cannot be read. Nothing may be
    /// changed here; `recover` comes after.
    ///
    /// Answer [`ReplayCheck::CommittedLater`] when the store shows a commit
    /// of a later checkpoint (a commit marker, a final file), with the
    /// number of records those later commits hold when the store counts
    /// them (the runtime logs it as the duplicates a fallback writes);
    /// `Safe` when it proves there is none or when writes are replay-safe
    /// anyway (idempotent upserts, position fences). The default, `Unknown`,
    /// makes the runtime refuse the fallback unless the operator accepts it.
    async fn check_replay_after(&mut self, checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError> {
        let _ = checkpoint;
        Ok(ReplayCheck::Unknown)
    }
}

/// What a sink let go of when it closed (see
/// [`TwoPhaseCommitSink::close`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Everything another process taking the pipeline over could wait for
    /// or be refused by.
    Released,
    /// The sink cannot tell (the default): the next holder waits as after
    /// a holder that did not stop cleanly.
    Unknown,
}

/// A sink subtask's answer to
/// [`check_replay_after`](TwoPhaseCommitSink::check_replay_after).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ReplayCheck {
    /// Replaying the records after the checkpoint duplicates nothing.
    Safe,
    /// Transactions of checkpoints after the one to restore were committed:
    /// replaying duplicates their records.
    CommittedLater {
        /// The highest such checkpoint.
        checkpoint: CheckpointId,
        /// How many records those transactions hold together — the records
        /// a replay writes a second time — when the store counts them;
        /// `None` when it cannot tell.
        records: Option<u64>,
    },
    /// The sink cannot tell.
    Unknown,
}

impl ReplayCheck {
    /// [`CommittedLater`](Self::CommittedLater) without a record count.
    pub fn committed_later(checkpoint: CheckpointId) -> Self {
        ReplayCheck::CommittedLater {
            checkpoint,
            records: None,
        }
    }
}

/// Describes a sink and creates its subtasks.
pub trait SinkFactory: Send + Sync + 'static {
    /// A stable description of the sink's identity and the settings that affect
    /// its state (e.g. `file:dir=/out`). Part of the pipeline fingerprint.
    fn identity(&self) -> String;

    /// Creates the sink of one subtask. Connect lazily (in `recover`).
    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError>;

    /// Checks that the sink can keep its promises under the pipeline's
    /// checkpoint settings — for example that a checkpoint which takes its
    /// whole `timeout` cannot outlive a transaction timeout of the store, so
    /// a pre-committed transaction is always committed before the store
    /// drops it. Called once, by [`Pipeline::new`](crate::Pipeline::new),
    /// before anything runs; the error names the settings and the fix.
    ///
    /// The default accepts every setting.
    fn check_checkpointing(&self, checkpoint: &CheckpointConfig) -> Result<(), ConnectorError> {
        let _ = checkpoint;
        Ok(())
    }

    /// Whether several records may arrive with one `(split, offset)` — the
    /// outputs of a [`Transform::flat_map`](crate::Transform::flat_map),
    /// which all carry their input's coordinates — and each be written.
    /// Answer `true` only when nothing the sink writes or fences is keyed
    /// on the coordinates alone: not a fence that applies only offsets
    /// above the last one applied, not a primary key or a deduplication
    /// made of the split and offset (it would keep one of the records and
    /// lose the others). [`Pipeline::with_transforms`](crate::Pipeline::with_transforms)
    /// refuses a flat_map unless the sink answers `true`.
    ///
    /// The default answers `false`.
    fn accepts_repeated_coordinates(&self) -> bool {
        false
    }

    /// Whether the sink's own store refuses a zombie: given
    /// [`SinkContext::ownership`], once a subtask was recovered under an epoch,
    /// no holder of an older epoch can prepare, commit or roll back
    /// anything there that outlives its ownership (a PostgreSQL fence row,
    /// Kafka's producer epochs). Several processes may share a pipeline
    /// (workers) only with such a sink: the checkpoint store's epochs keep
    /// a zombie from persisting, but only the sink's store can keep it
    /// from preparing.
    ///
    /// The default answers `false`.
    fn fences_zombies(&self) -> bool {
        false
    }

    /// The transactions of pipeline `pipeline` that the sink's store holds
    /// pre-committed right now (prepared, neither committed nor rolled
    /// back): after a crash, what the next recovery commits (those the
    /// restored checkpoint lists) or rolls back (the others).
    ///
    /// For operators (`exactly status`): called from any process, without
    /// the pipeline's lock, possibly while the pipeline runs. It must only
    /// read: change nothing and take no lock the pipeline's subtasks use.
    /// Errors name the store and the fix (an unreachable server, refused
    /// credentials) without secrets.
    ///
    /// The default answers `Ok(None)`: this sink cannot list them.
    fn prepared_transactions<'a>(&'a self, pipeline: &'a str) -> PreparedTransactionsFuture<'a> {
        let _ = pipeline;
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// What [`SinkFactory::prepared_transactions`] returns.
pub type PreparedTransactionsFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<Vec<PreparedTransaction>>, ConnectorError>> + Send + 'a>,
>;

/// A transaction a sink's store holds pre-committed (see
/// [`SinkFactory::prepared_transactions`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreparedTransaction {
    /// The store's name for it: a PostgreSQL gid, a Kafka transactional id.
    pub name: String,
    /// The sink subtask that wrote it, when the name tells.
    pub subtask: Option<usize>,
    /// The checkpoint whose interval it holds, when the name tells.
    pub checkpoint: Option<CheckpointId>,
    /// When the store says it was prepared, Unix ms.
    pub prepared_unix_ms: Option<i64>,
}

/// The object-safe form of a [`TwoPhaseCommitSink`] that the runtime drives:
/// committables travel as JSON values and the open transaction is held inside.
/// Build one with [`erase`]; connector authors implement [`TwoPhaseCommitSink`].
#[async_trait]
pub trait ErasedSink: Send + 'static {
    /// See [`TwoPhaseCommitSink::recover`].
    async fn recover(&mut self, pending: &[serde_json::Value]) -> Result<(), ConnectorError>;
    /// Writes records, opening the transaction for `checkpoint` first if none is open.
    async fn write(&mut self, checkpoint: CheckpointId, batch: &[Record]) -> Result<(), ConnectorError>;
    /// Pre-commits the open transaction, if any, then runs
    /// [`TwoPhaseCommitSink::check_pending`].
    async fn pre_commit(&mut self) -> Result<Option<serde_json::Value>, ConnectorError>;
    /// See [`TwoPhaseCommitSink::commit`].
    async fn commit(&mut self, committable: &serde_json::Value) -> Result<(), ConnectorError>;
    /// Aborts the open transaction, if any.
    async fn abort(&mut self) -> Result<(), ConnectorError>;
    /// See [`TwoPhaseCommitSink::check_replay_after`].
    async fn check_replay_after(&mut self, checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError>;
    /// See [`TwoPhaseCommitSink::close`]. The default cannot tell.
    async fn close(&mut self) -> Result<Closed, ConnectorError> {
        Ok(Closed::Unknown)
    }
}

/// Wraps a [`TwoPhaseCommitSink`] into the form the runtime drives.
pub fn erase<S: TwoPhaseCommitSink>(sink: S) -> Box<dyn ErasedSink> {
    Box::new(Erased { sink, open: None })
}

struct Erased<S: TwoPhaseCommitSink> {
    sink: S,
    open: Option<S::Transaction>,
}

fn decode<C: DeserializeOwned>(value: &serde_json::Value) -> Result<C, ConnectorError> {
    serde_json::from_value(value.clone()).map_err(|e| {
        ConnectorError::fatal(
            "decoding a committable from the checkpoint",
            format!("{value} does not decode; was the checkpoint written by a different sink type?"),
        )
        .caused_by(e)
    })
}

#[async_trait]
impl<S: TwoPhaseCommitSink> ErasedSink for Erased<S> {
    async fn recover(&mut self, pending: &[serde_json::Value]) -> Result<(), ConnectorError> {
        let decoded = pending.iter().map(decode).collect::<Result<Vec<S::Committable>, _>>()?;
        self.sink.recover(&decoded).await
    }

    async fn write(&mut self, checkpoint: CheckpointId, batch: &[Record]) -> Result<(), ConnectorError> {
        if self.open.is_none() {
            self.open = Some(self.sink.begin(checkpoint).await?);
        }
        let txn = self.open.as_mut().expect("transaction opened above");
        self.sink.write(txn, batch).await
    }

    async fn pre_commit(&mut self) -> Result<Option<serde_json::Value>, ConnectorError> {
        let committable = match self.open.take() {
            Some(txn) => Some(self.sink.pre_commit(txn).await?),
            None => None,
        };
        self.sink.check_pending().await?;
        committable
            .map(|c| {
                serde_json::to_value(&c).map_err(|e| {
                    ConnectorError::fatal("encoding a committable", "not representable as JSON").caused_by(e)
                })
            })
            .transpose()
    }

    async fn commit(&mut self, committable: &serde_json::Value) -> Result<(), ConnectorError> {
        let c: S::Committable = decode(committable)?;
        self.sink.commit(&c).await
    }

    async fn abort(&mut self) -> Result<(), ConnectorError> {
        match self.open.take() {
            Some(txn) => self.sink.abort(txn).await,
            None => Ok(()),
        }
    }

    async fn check_replay_after(&mut self, checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError> {
        self.sink.check_replay_after(checkpoint).await
    }

    async fn close(&mut self) -> Result<Closed, ConnectorError> {
        self.sink.close().await
    }
}
