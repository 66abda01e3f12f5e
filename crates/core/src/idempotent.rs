//! Exactly-once effects for stores without transactions.
//!
//! Connector authors implement one small trait and pick a strategy; an adapter
//! turns it into a [`TwoPhaseCommitSink`] the runtime drives like any other:
//!
//! | strategy | trait | valid when | visible |
//! |---|---|---|---|
//! | [`ReplaySafe`] | [`IdempotentSink`] | every write is an upsert by a deterministic key | at once |
//! | [`WriteAhead`] | [`IdempotentSink`] | writes are idempotent; output must appear only after the checkpoint | at commit |
//! | [`Fenced`] | [`FencedSink`] | anything, even increments: the store applies a record only above the stored position of its split, atomically with the write | at once |
//!
//! Records carry deterministic identities (`split`, `offset`, or a user key), so
//! a replay after a crash writes the same things again.

use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::ConnectorError;
use crate::metrics::Metrics;
use crate::record::{CheckpointId, Record};
use crate::sink::{erase, Closed, ErasedSink, ReplayCheck, SinkContext, SinkFactory, TwoPhaseCommitSink};

/// A record a sink refused, with the reason. Sinks store these in their own
/// dead-letter destination; the adapters count them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// Split of the refused record.
    pub split: String,
    /// Offset of the refused record.
    pub offset: i64,
    /// Why it was refused (e.g. "no key: field /id is missing").
    pub reason: String,
}

/// What a write did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Records applied.
    pub applied: usize,
    /// Records skipped because the store had already applied them (fenced sinks).
    pub skipped: usize,
    /// Records refused and sent to the sink's dead-letter destination.
    pub dead_letters: Vec<DeadLetter>,
}

/// A sink whose writes are idempotent: writing the same records again (in the
/// same order) leaves the store as if they were written once.
#[async_trait]
pub trait IdempotentSink: Send + 'static {
    /// Connects and prepares. Called once, before any write; idempotent.
    async fn open(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }

    /// Writes a batch. Contract: idempotent under replay (upsert by a
    /// deterministic key); records whose key cannot be derived go to the sink's
    /// dead-letter destination and are reported in the outcome, never dropped.
    async fn write(&mut self, batch: &[Record]) -> Result<WriteOutcome, ConnectorError>;

    /// Writes every record of one checkpoint interval at once: the
    /// [`WriteAhead`] adapter calls this (and not [`write`](Self::write))
    /// when `interval`'s checkpoint completed, with the records the sink
    /// subtask `interval.subtask` held for it, in order.
    ///
    /// Contract: a repeated call for the same interval (a commit repeated
    /// after a crash, by this process or another) carries the same records,
    /// so the interval can be the store's replay-safe unit: one object or
    /// file named by `(interval.subtask, interval.checkpoint)` (see
    /// [`crate::TransactionNames::for_keys`]), overwritten or skipped when it
    /// exists. Intervals of one subtask are written in checkpoint order, but
    /// an interval may be written again after later ones (a repeated
    /// commit). Default: [`write`](Self::write) with the batch.
    async fn write_interval(&mut self, interval: Interval, batch: &[Record]) -> Result<WriteOutcome, ConnectorError> {
        let _ = interval;
        self.write(batch).await
    }

    /// Makes everything written so far durable in the store. Default: writes are
    /// durable when `write` returns.
    async fn flush(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
    /// Releases what the sink holds when its subtask stops cleanly; see
    /// [`TwoPhaseCommitSink::close`]. Default: cannot tell.
    async fn close(&mut self) -> Result<Closed, ConnectorError> {
        Ok(Closed::Unknown)
    }
}

/// Which checkpoint interval a [`IdempotentSink::write_interval`] call
/// writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The sink subtask that held the records (after a lowering of the
    /// parallelism, possibly an old subtask the current one adopted).
    pub subtask: usize,
    /// The checkpoint whose completion released them.
    pub checkpoint: CheckpointId,
}

/// A sink that keeps, per `scope` and source split, the highest offset it has
/// applied, and applies a record only when its offset is above it — checking
/// and advancing that position atomically with the write.
#[async_trait]
pub trait FencedSink: Send + 'static {
    /// Connects and prepares. Called once, before any write; idempotent.
    async fn open(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }

    /// Applies the records of `batch` whose offset is above the stored position
    /// of (`scope`, record split) and advances that position, atomically per
    /// record or per batch. Contract: after a crash, replaying records at or
    /// below the stored position changes nothing.
    async fn write_fenced(&mut self, scope: &str, batch: &[Record]) -> Result<WriteOutcome, ConnectorError>;

    /// Makes everything written so far durable. Default: durable on return.
    async fn flush(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
    /// Releases what the sink holds when its subtask stops cleanly; see
    /// [`TwoPhaseCommitSink::close`]. Default: cannot tell.
    async fn close(&mut self) -> Result<Closed, ConnectorError> {
        Ok(Closed::Unknown)
    }
}

/// Creates the idempotent sink of each subtask.
pub trait IdempotentSinkFactory: Send + Sync + 'static {
    /// The sink type.
    type Sink: IdempotentSink;
    /// See [`SinkFactory::identity`].
    fn identity(&self) -> String;
    /// Creates the sink of one subtask. Like [`SinkFactory::create`], it
    /// gets the subtask's own context (the adapter keeps a clone); connect
    /// lazily.
    fn create(&self, context: SinkContext) -> Result<Self::Sink, ConnectorError>;
}

/// Creates the fenced sink of each subtask.
pub trait FencedSinkFactory: Send + Sync + 'static {
    /// The sink type.
    type Sink: FencedSink;
    /// See [`SinkFactory::identity`].
    fn identity(&self) -> String;
    /// Creates the sink of one subtask. Like [`SinkFactory::create`], it
    /// gets the subtask's own context (the adapter keeps a clone); connect
    /// lazily.
    fn create(&self, context: SinkContext) -> Result<Self::Sink, ConnectorError>;

    /// See [`SinkFactory::fences_zombies`]: whether, given
    /// [`SinkContext::ownership`], the store refuses the writes of an
    /// owner of an older epoch once a newer one opened the subtask (for
    /// example an epoch kept beside the position fence and compared by the
    /// same atomic write). The default answers `false`.
    fn fences_zombies(&self) -> bool {
        false
    }
}

fn count(metrics: &Metrics, outcome: &WriteOutcome) {
    if !outcome.dead_letters.is_empty() {
        for d in &outcome.dead_letters {
            tracing::warn!(split = %d.split, offset = d.offset, reason = %d.reason, "record sent to the dead-letter destination");
        }
        metrics.add_dead_letters(outcome.dead_letters.len() as u64);
    }
}

// ---------------------------------------------------------------- replay-safe

/// Strategy 1: write records as they arrive, flush at every checkpoint. After a
/// failure the replay rewrites the same keys, so the final state is exact.
#[derive(Debug)]
pub struct ReplaySafe<F>(pub F);

struct ReplaySafeSink<S> {
    sink: S,
    context: SinkContext,
}

impl<F: IdempotentSinkFactory> SinkFactory for ReplaySafe<F> {
    fn identity(&self) -> String {
        format!("replay-safe({})", self.0.identity())
    }
    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        Ok(erase(ReplaySafeSink {
            sink: self.0.create(context.clone())?,
            context,
        }))
    }
}

#[async_trait]
impl<S: IdempotentSink> TwoPhaseCommitSink for ReplaySafeSink<S> {
    type Transaction = ();
    type Committable = ();

    async fn recover(&mut self, _pending: &[()]) -> Result<(), ConnectorError> {
        self.sink.open().await
    }
    async fn begin(&mut self, _checkpoint: CheckpointId) -> Result<(), ConnectorError> {
        Ok(())
    }
    async fn write(&mut self, _txn: &mut (), batch: &[Record]) -> Result<(), ConnectorError> {
        let outcome = self.sink.write(batch).await?;
        count(&self.context.metrics, &outcome);
        Ok(())
    }
    async fn pre_commit(&mut self, _txn: ()) -> Result<(), ConnectorError> {
        self.sink.flush().await
    }
    async fn commit(&mut self, _c: &()) -> Result<(), ConnectorError> {
        Ok(())
    }
    async fn abort(&mut self, _txn: ()) -> Result<(), ConnectorError> {
        Ok(())
    }

    /// Writes are idempotent (upserts by key, or behind a position fence):
    /// a replay changes nothing.
    async fn check_replay_after(&mut self, _checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError> {
        Ok(ReplayCheck::Safe)
    }
    async fn close(&mut self) -> Result<Closed, ConnectorError> {
        self.sink.close().await
    }
}

// ---------------------------------------------------------------- write-ahead

/// Strategy 2: hold a checkpoint's records and write them only after that
/// checkpoint completes. Up to `inline_limit` records travel inside the
/// checkpoint; larger intervals spill to an fsynced file in `spill_dir`.
#[derive(Debug)]
pub struct WriteAhead<F> {
    /// The wrapped factory.
    pub factory: F,
    /// Folder for spill files (one per pending interval and subtask).
    pub spill_dir: PathBuf,
    /// Intervals with at most this many records are kept in the checkpoint itself.
    pub inline_limit: usize,
}

/// The committable of [`WriteAhead`]: the held records, or the file holding them.
///
/// Checkpoints written by earlier versions hold `Inline` committables
/// (no interval: committed through [`IdempotentSink::write`]); new ones
/// hold `InlineInterval`. Both deserialize, pinned by a test.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum HeldRecords {
    /// Records stored in the checkpoint (written before intervals were
    /// recorded).
    Inline(Vec<Record>),
    /// Records of one interval stored in the checkpoint.
    InlineInterval {
        /// The sink subtask that held them.
        subtask: usize,
        /// Their checkpoint.
        checkpoint: CheckpointId,
        /// The records, in order.
        records: Vec<Record>,
    },
    /// Records spilled to this file (JSON lines), named relative to the spill
    /// folder so the pipeline can run from another working folder.
    Spilled(String),
}

/// Committed spill files are renamed `<name>.done` and kept so a repeated
/// commit after a crash can tell "already committed" from "lost": until no
/// checkpoint that may still be restored can list them (see
/// [`crate::retention`]), or, while the oldest restorable checkpoint is
/// unknown, the newest [`DONE_MARKERS_KEPT`] per subtask.
const DONE_SUFFIX: &str = ".done";
/// Done markers kept per subtask while the oldest restorable checkpoint is
/// unknown: far more than a checkpoint can list as pending.
const DONE_MARKERS_KEPT: usize = 100;

struct WriteAheadSink<S> {
    sink: S,
    context: SinkContext,
    spill_dir: PathBuf,
    inline_limit: usize,
    /// Done markers committed since the last `begin`.
    done_since_begin: Vec<String>,
    /// Done markers with the checkpoint of the first `begin` after their
    /// commit: deletable once the oldest restorable checkpoint is at or
    /// above it.
    releasable: Vec<(CheckpointId, String)>,
}

impl<F: IdempotentSinkFactory> SinkFactory for WriteAhead<F> {
    fn identity(&self) -> String {
        format!("write-ahead({})", self.factory.identity())
    }
    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        Ok(erase(WriteAheadSink {
            sink: self.factory.create(context.clone())?,
            spill_dir: self.spill_dir.join(&context.pipeline),
            inline_limit: self.inline_limit,
            context,
            done_since_begin: Vec::new(),
            releasable: Vec::new(),
        }))
    }
}

/// The start of every spill file name of sink subtask `subtask`.
fn spill_prefix(subtask: usize) -> String {
    format!("spill-{subtask}-")
}

fn spill_error(path: &std::path::Path, e: impl Into<crate::error::BoxError>) -> ConnectorError {
    ConnectorError::transient("write-ahead spill file", path.display()).caused_by(e)
}

impl<S: IdempotentSink> WriteAheadSink<S> {
    fn spill_prefix(&self) -> String {
        spill_prefix(self.context.subtask)
    }

    async fn spill(&mut self, checkpoint: CheckpointId, records: &[Record]) -> Result<String, ConnectorError> {
        let name = format!(
            "{}{:010}-{:08x}.jsonl",
            self.spill_prefix(),
            checkpoint.0,
            rand::random::<u32>()
        );
        let path = self.spill_dir.join(&name);
        let mut bytes = Vec::new();
        for r in records {
            serde_json::to_writer(&mut bytes, r).map_err(|e| spill_error(&path, e))?;
            bytes.push(b'\n');
        }
        let p = path.clone();
        let dir = self.spill_dir.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::io::Write;
            std::fs::create_dir_all(&dir)?;
            let mut f = std::fs::File::create(&p)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::File::open(&dir)?.sync_all()
        })
        .await
        .expect("spill task panicked")
        .map_err(|e| spill_error(&path, e))?;
        Ok(name)
    }

    /// The spilled records, `None` when the file was already committed, or
    /// `DataLoss` when neither the file nor its done marker exists.
    async fn read_spill(&mut self, name: &str) -> Result<Option<Vec<Record>>, ConnectorError> {
        let path = self.spill_dir.join(name);
        match tokio::fs::read(&path).await {
            Ok(bytes) => bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice(l).map_err(|e| spill_error(&path, e)))
                .collect::<Result<Vec<Record>, _>>()
                .map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if tokio::fs::try_exists(self.spill_dir.join(format!("{name}{DONE_SUFFIX}")))
                    .await
                    .unwrap_or(false)
                {
                    Ok(None)
                } else {
                    Err(ConnectorError::DataLoss {
                        context: "write-ahead sink".into(),
                        checkpoint: checkpoint_of(name),
                        message: format!(
                            "spill file {} is gone and was never committed (was the spill folder on a \
                             temporary file system, or cleaned?)",
                            path.display()
                        ),
                    })
                }
            }
            Err(e) => Err(spill_error(&path, e)),
        }
    }

    /// Marks a spill file committed and prunes old markers of this subtask.
    async fn mark_done(&mut self, name: &str) -> Result<(), ConnectorError> {
        let path = self.spill_dir.join(name);
        let done = format!("{name}{DONE_SUFFIX}");
        tokio::fs::rename(&path, self.spill_dir.join(&done))
            .await
            .map_err(|e| spill_error(&path, e))?;
        self.done_since_begin.push(done);
        self.prune_done().await;
        Ok(())
    }

    /// Deletes the done markers no restorable checkpoint can list (see
    /// [`crate::retention`]); while the oldest restorable checkpoint is
    /// unknown, all but the newest [`DONE_MARKERS_KEPT`].
    async fn prune_done(&mut self) {
        let Some(oldest) = self.context.restorable.oldest() else {
            let mut done = self.own_files(|n| n.ends_with(DONE_SUFFIX)).await;
            done.sort();
            for old in done.iter().rev().skip(DONE_MARKERS_KEPT) {
                let _ = tokio::fs::remove_file(self.spill_dir.join(old)).await;
            }
            return;
        };
        let (released, kept) = std::mem::take(&mut self.releasable)
            .into_iter()
            .partition(|(begun, _)| *begun <= oldest);
        self.releasable = kept;
        for (_, name) in released {
            let _ = tokio::fs::remove_file(self.spill_dir.join(name)).await;
        }
    }

    /// Names of this subtask's files in the spill folder that match `filter`.
    async fn own_files(&mut self, filter: impl Fn(&str) -> bool + Send + Sync) -> Vec<String> {
        let prefix = self.spill_prefix();
        self.files(|name| name.starts_with(&prefix) && filter(name)).await
    }

    /// Names of the files in the spill folder that match `filter`.
    async fn files(&mut self, filter: impl Fn(&str) -> bool + Send + Sync) -> Vec<String> {
        let mut names = Vec::new();
        if let Ok(mut entries) = tokio::fs::read_dir(&self.spill_dir).await {
            while let Ok(Some(e)) = entries.next_entry().await {
                let name = e.file_name().to_string_lossy().into_owned();
                if filter(&name) {
                    names.push(name);
                }
            }
        }
        names
    }
}

fn checkpoint_of(spill_name: &str) -> CheckpointId {
    CheckpointId(
        spill_name
            .split('-')
            .nth(2)
            .and_then(|s| s.parse().ok())
            .unwrap_or_default(),
    )
}

/// The interval of a spill file, from its name (`spill-<subtask>-<checkpoint>-…`).
fn interval_of(spill_name: &str) -> Option<Interval> {
    let subtask = spill_name.split('-').nth(1)?.parse().ok()?;
    let checkpoint = spill_name.split('-').nth(2)?.parse().ok()?;
    Some(Interval {
        subtask,
        checkpoint: CheckpointId(checkpoint),
    })
}

/// An interval's records on their way to a [`WriteAhead`] checkpoint.
#[derive(Debug)]
pub struct HeldInterval {
    checkpoint: CheckpointId,
    records: Vec<Record>,
}

#[async_trait]
impl<S: IdempotentSink> TwoPhaseCommitSink for WriteAheadSink<S> {
    type Transaction = HeldInterval;
    type Committable = HeldRecords;

    async fn recover(&mut self, pending: &[HeldRecords]) -> Result<(), ConnectorError> {
        self.sink.open().await?;
        // Spill files of this subtask and of the old subtasks it adopts;
        // those the checkpoint does not list belong to intervals that never
        // completed: their records will be replayed.
        let prefixes: Vec<String> = self.context.owned_subtasks().map(spill_prefix).collect();
        let owned = self
            .files(|n| prefixes.iter().any(|p| n.starts_with(p)) && !n.ends_with(DONE_SUFFIX))
            .await;
        let plan = crate::ownership::plan_recovery(
            pending,
            |held| match held {
                HeldRecords::Spilled(name) => Some(name.clone()),
                HeldRecords::Inline(_) | HeldRecords::InlineInterval { .. } => None,
            },
            owned.into_iter().map(Some),
        );
        for held in plan.commit {
            self.commit(held).await?;
        }
        for name in plan.abort.into_iter().flatten() {
            let path = self.spill_dir.join(&name);
            tokio::fs::remove_file(&path).await.map_err(|e| spill_error(&path, e))?;
        }
        // Markers of earlier runs were committed before anything of this run
        // begins: released by its first begin.
        self.done_since_begin = self.own_files(|n| n.ends_with(DONE_SUFFIX)).await;
        Ok(())
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<HeldInterval, ConnectorError> {
        // Every checkpoint that lists a marker committed so far is below
        // this one.
        let done = std::mem::take(&mut self.done_since_begin);
        self.releasable.extend(done.into_iter().map(|name| (checkpoint, name)));
        Ok(HeldInterval {
            checkpoint,
            records: Vec::new(),
        })
    }

    async fn write(&mut self, txn: &mut HeldInterval, batch: &[Record]) -> Result<(), ConnectorError> {
        txn.records.extend_from_slice(batch);
        Ok(())
    }

    async fn pre_commit(&mut self, txn: HeldInterval) -> Result<HeldRecords, ConnectorError> {
        if txn.records.len() <= self.inline_limit {
            Ok(HeldRecords::InlineInterval {
                subtask: self.context.subtask,
                checkpoint: txn.checkpoint,
                records: txn.records,
            })
        } else {
            Ok(HeldRecords::Spilled(self.spill(txn.checkpoint, &txn.records).await?))
        }
    }

    async fn commit(&mut self, held: &HeldRecords) -> Result<(), ConnectorError> {
        let (interval, records) = match held {
            HeldRecords::Inline(r) => (None, r.clone()),
            HeldRecords::InlineInterval {
                subtask,
                checkpoint,
                records,
            } => (
                Some(Interval {
                    subtask: *subtask,
                    checkpoint: *checkpoint,
                }),
                records.clone(),
            ),
            HeldRecords::Spilled(name) => match self.read_spill(name).await? {
                Some(r) => (interval_of(name), r),
                None => return Ok(()),
            },
        };
        let outcome = match interval {
            Some(interval) => self.sink.write_interval(interval, &records).await?,
            None => self.sink.write(&records).await?,
        };
        self.sink.flush().await?;
        count(&self.context.metrics, &outcome);
        if let HeldRecords::Spilled(name) = held {
            self.mark_done(name).await?;
        }
        Ok(())
    }

    async fn abort(&mut self, _txn: HeldInterval) -> Result<(), ConnectorError> {
        Ok(())
    }

    /// Held records are written with idempotent writes: a replay changes
    /// nothing.
    async fn check_replay_after(&mut self, _checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError> {
        Ok(ReplayCheck::Safe)
    }
    async fn close(&mut self) -> Result<Closed, ConnectorError> {
        self.sink.close().await
    }
}

// ---------------------------------------------------------------- fenced

/// Strategy 3: the store applies each record only above the stored position of
/// its split, atomically with the write — exactly-once effects even for
/// increments. The fence scope is `<pipeline>/<sink identity>`.
#[derive(Debug)]
pub struct Fenced<F>(pub F);

/// A fenced sink seen as an idempotent one: its writes are fenced in `scope`,
/// which makes replays harmless, so the replay-safe driver fits.
struct ScopedFence<S> {
    sink: S,
    scope: String,
}

#[async_trait]
impl<S: FencedSink> IdempotentSink for ScopedFence<S> {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        self.sink.open().await
    }
    async fn write(&mut self, batch: &[Record]) -> Result<WriteOutcome, ConnectorError> {
        let outcome = self.sink.write_fenced(&self.scope, batch).await?;
        if outcome.skipped > 0 {
            tracing::debug!(
                skipped = outcome.skipped,
                "replayed records skipped by the position fence"
            );
        }
        Ok(outcome)
    }
    async fn flush(&mut self) -> Result<(), ConnectorError> {
        self.sink.flush().await
    }
    async fn close(&mut self) -> Result<Closed, ConnectorError> {
        self.sink.close().await
    }
}

impl<F: FencedSinkFactory> SinkFactory for Fenced<F> {
    fn identity(&self) -> String {
        format!("fenced({})", self.0.identity())
    }
    fn fences_zombies(&self) -> bool {
        self.0.fences_zombies()
    }
    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        Ok(erase(ReplaySafeSink {
            sink: ScopedFence {
                sink: self.0.create(context.clone())?,
                scope: format!("{}/{}", context.pipeline, self.0.identity()),
            },
            context,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// An in-memory key/value store shared by the subtasks of a unit test: the
    /// adapters' logic under test, not a stand-in for a connector.
    #[derive(Clone, Default)]
    struct Store {
        values: Arc<Mutex<BTreeMap<String, String>>>,
        counter: Arc<Mutex<i64>>,
        fences: Arc<Mutex<BTreeMap<(String, String), i64>>>,
        /// Every interval written through `write_interval`, with its size.
        intervals: Arc<Mutex<Vec<(Interval, usize)>>>,
    }

    #[async_trait]
    impl IdempotentSink for Store {
        async fn write_interval(
            &mut self,
            interval: Interval,
            batch: &[Record],
        ) -> Result<WriteOutcome, ConnectorError> {
            self.intervals.lock().unwrap().push((interval, batch.len()));
            self.write(batch).await
        }

        async fn write(&mut self, batch: &[Record]) -> Result<WriteOutcome, ConnectorError> {
            let mut out = WriteOutcome::default();
            let mut values = self.values.lock().unwrap();
            for r in batch {
                match &r.key {
                    Some(k) => {
                        values.insert(
                            String::from_utf8_lossy(k).into(),
                            String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into(),
                        );
                        out.applied += 1;
                    }
                    None => out.dead_letters.push(DeadLetter {
                        split: r.split.to_string(),
                        offset: r.offset,
                        reason: "no key".into(),
                    }),
                }
            }
            Ok(out)
        }
    }

    #[async_trait]
    impl FencedSink for Store {
        async fn write_fenced(&mut self, scope: &str, batch: &[Record]) -> Result<WriteOutcome, ConnectorError> {
            let mut out = WriteOutcome::default();
            let mut fences = self.fences.lock().unwrap();
            let mut counter = self.counter.lock().unwrap();
            for r in batch {
                let fence = fences.entry((scope.to_string(), r.split.to_string())).or_insert(-1);
                if r.offset > *fence {
                    *counter += 1;
                    *fence = r.offset;
                    out.applied += 1;
                } else {
                    out.skipped += 1;
                }
            }
            Ok(out)
        }
    }

    struct StoreFactory(Store);
    impl IdempotentSinkFactory for StoreFactory {
        type Sink = Store;
        fn identity(&self) -> String {
            "memory".into()
        }
        fn create(&self, _: SinkContext) -> Result<Store, ConnectorError> {
            Ok(self.0.clone())
        }
    }
    impl FencedSinkFactory for StoreFactory {
        type Sink = Store;
        fn identity(&self) -> String {
            "memory".into()
        }
        fn create(&self, _: SinkContext) -> Result<Store, ConnectorError> {
            Ok(self.0.clone())
        }
    }

    fn context() -> SinkContext {
        SinkContext::new("p", 0, 1, Arc::default())
    }

    fn keyed(offsets: std::ops::Range<i64>) -> Vec<Record> {
        offsets
            .map(|o| Record::new("s-0", o, format!("v{o}")).with_key(format!("k{}", o % 3)))
            .collect()
    }

    #[tokio::test]
    async fn write_ahead_shows_nothing_before_commit_and_recovers_spilled_intervals() {
        let spill = tempfile::tempdir().unwrap();
        let store = Store::default();
        let factory = WriteAhead {
            factory: StoreFactory(store.clone()),
            spill_dir: spill.path().to_path_buf(),
            inline_limit: 2,
        };
        let ctx = context();
        let mut sink = factory.create(ctx.clone()).unwrap();
        sink.recover(&[]).await.unwrap();
        sink.write(CheckpointId(1), &keyed(0..5)).await.unwrap();
        let spilled = sink.pre_commit().await.unwrap().unwrap();
        assert!(spilled.to_string().contains("Spilled"), "{spilled}");
        assert!(store.values.lock().unwrap().is_empty(), "nothing visible before commit");
        sink.write(CheckpointId(2), &keyed(5..6)).await.unwrap();
        let inline = sink.pre_commit().await.unwrap().unwrap();
        let orphan_interval = {
            sink.write(CheckpointId(3), &keyed(6..9)).await.unwrap();
            sink.pre_commit().await.unwrap().unwrap()
        };
        // Crash: a new subtask recovers with the checkpoint listing 1 and 2 only.
        let mut restarted = factory.create(ctx).unwrap();
        restarted.recover(&[spilled.clone(), inline.clone()]).await.unwrap();
        restarted.recover(&[spilled, inline]).await.unwrap();
        let values = store.values.lock().unwrap().clone();
        assert_eq!(values.get("k2").map(String::as_str), Some("v5"));
        assert_eq!(values.len(), 3);
        let left: Vec<String> = std::fs::read_dir(spill.path().join("p"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            left.iter().all(|n| n.ends_with(".done")),
            "orphan {orphan_interval} removed: {left:?}"
        );
        assert_eq!(left.len(), 1, "the committed interval's done marker stays: {left:?}");
    }

    /// The write-ahead adapter hands the sink each interval's subtask and
    /// checkpoint, inline or spilled, the same again on a repeated commit;
    /// a committable of an earlier version (no interval) still commits.
    #[tokio::test]
    async fn write_ahead_writes_whole_intervals_named_by_their_checkpoint() {
        let spill = tempfile::tempdir().unwrap();
        let store = Store::default();
        let factory = WriteAhead {
            factory: StoreFactory(store.clone()),
            spill_dir: spill.path().to_path_buf(),
            inline_limit: 2,
        };
        let ctx = SinkContext::new("p", 1, 2, Arc::default());
        let mut sink = factory.create(ctx.clone()).unwrap();
        sink.recover(&[]).await.unwrap();
        sink.write(CheckpointId(7), &keyed(0..2)).await.unwrap();
        let inline = sink.pre_commit().await.unwrap().unwrap();
        sink.write(CheckpointId(8), &keyed(2..7)).await.unwrap();
        let spilled = sink.pre_commit().await.unwrap().unwrap();
        sink.commit(&inline).await.unwrap();
        sink.commit(&spilled).await.unwrap();
        // A crash after the commits: recovery commits both again.
        factory.create(ctx).unwrap().recover(&[inline, spilled]).await.unwrap();
        let at = |checkpoint| Interval {
            subtask: 1,
            checkpoint: CheckpointId(checkpoint),
        };
        assert_eq!(
            *store.intervals.lock().unwrap(),
            vec![(at(7), 2), (at(8), 5), (at(7), 2)],
            "the spilled interval's repeat finds its done marker and writes nothing"
        );
        // A checkpoint of an earlier version holds `{"Inline": [records]}`.
        let record = Record::new("s-0", 9, "v").with_key("k9");
        let legacy = serde_json::json!({ "Inline": [serde_json::to_value(&record).unwrap()] });
        let before = store.intervals.lock().unwrap().len();
        let mut sink = factory.create(context()).unwrap();
        sink.recover(&[legacy])
            .await
            .expect("an earlier version's committable commits");
        assert_eq!(store.intervals.lock().unwrap().len(), before, "committed through write");
        assert_eq!(store.values.lock().unwrap().get("k9").map(String::as_str), Some("v"));
    }

    #[tokio::test]
    async fn a_lost_spill_file_is_reported_as_data_loss() {
        let spill = tempfile::tempdir().unwrap();
        let factory = WriteAhead {
            factory: StoreFactory(Store::default()),
            spill_dir: spill.path().to_path_buf(),
            inline_limit: 0,
        };
        let mut sink = factory.create(context()).unwrap();
        sink.recover(&[]).await.unwrap();
        sink.write(CheckpointId(4), &keyed(0..3)).await.unwrap();
        let held = sink.pre_commit().await.unwrap().unwrap();
        for e in std::fs::read_dir(spill.path().join("p")).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let err = factory.create(context()).unwrap().recover(&[held]).await.unwrap_err();
        assert!(
            matches!(
                err,
                ConnectorError::DataLoss {
                    checkpoint: CheckpointId(4),
                    ..
                }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn replay_safe_counts_dead_letters() {
        let store = Store::default();
        let ctx = context();
        let metrics = ctx.metrics.clone();
        let mut sink = ReplaySafe(StoreFactory(store.clone())).create(ctx).unwrap();
        sink.recover(&[]).await.unwrap();
        let mut batch = keyed(0..3);
        batch.push(Record::new("s-0", 3, "no key"));
        sink.write(CheckpointId(1), &batch).await.unwrap();
        assert_eq!(store.values.lock().unwrap().len(), 3, "visible at once");
        assert_eq!(metrics.snapshot().dead_letters, 1);
    }

    #[tokio::test]
    async fn the_fence_drops_replayed_increments() {
        let store = Store::default();
        let mut sink = Fenced(StoreFactory(store.clone())).create(context()).unwrap();
        sink.recover(&[]).await.unwrap();
        sink.write(CheckpointId(1), &keyed(0..10)).await.unwrap();
        // A replay from offset 4 after a crash, then new records.
        sink.write(CheckpointId(1), &keyed(4..12)).await.unwrap();
        assert_eq!(*store.counter.lock().unwrap(), 12);
    }

    /// Done markers go once no restorable checkpoint can list them: after
    /// the first begin that follows their commit has a checkpoint at or
    /// below the oldest restorable one — never earlier.
    #[tokio::test]
    async fn done_markers_are_pruned_by_the_oldest_restorable_checkpoint() {
        let spill = tempfile::tempdir().unwrap();
        let factory = WriteAhead {
            factory: StoreFactory(Store::default()),
            spill_dir: spill.path().to_path_buf(),
            inline_limit: 0,
        };
        let restorable = crate::retention::RestorableCheckpoints::default();
        let mut sink = factory.create(context().with_restorable(restorable.clone())).unwrap();
        let markers = || -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(spill.path().join("p"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".done"))
                .map(|n| n.split('-').nth(2).unwrap().to_string())
                .collect();
            names.sort();
            names
        };
        sink.recover(&[]).await.unwrap();
        async fn interval(sink: &mut Box<dyn ErasedSink>, id: u64) {
            sink.write(CheckpointId(id), &keyed(0..2)).await.unwrap();
            let held = sink.pre_commit().await.unwrap().unwrap();
            sink.commit(&held).await.unwrap();
        }
        restorable.set(Some(CheckpointId(0)));
        interval(&mut sink, 1).await; // marker 1, released by the begin of 2
        interval(&mut sink, 2).await; // marker 2, released by the begin of 4
        restorable.set(Some(CheckpointId(1)));
        interval(&mut sink, 4).await;
        assert_eq!(
            markers(),
            ["0000000001", "0000000002", "0000000004"],
            "2 > oldest 1: all kept"
        );
        restorable.set(Some(CheckpointId(2)));
        interval(&mut sink, 5).await;
        assert_eq!(
            markers(),
            ["0000000002", "0000000004", "0000000005"],
            "marker 1 released at 2"
        );
        restorable.set(None);
        interval(&mut sink, 6).await;
        assert_eq!(
            markers().len(),
            4,
            "unknown: nothing released (the newest 100 are kept)"
        );
    }
}
