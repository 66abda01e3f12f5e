//! The checkpoint store's contract: two small traits, compare-and-set style
//! (after Materialize's `Consensus`), whose every call says what it
//! guarantees when several callers — attempts of one process, or processes
//! on several machines — use the store at once.
//!
//! - [`SequenceStore`]: one checkpoint sequence (a region's, or the one of
//!   global failover) — its [`Head`] (epoch, owner, reserved ids, committed
//!   checkpoints) and its entries, every write conditional on the writer's
//!   [`Epoch`];
//! - [`CheckpointStore`]: the pipeline's store — its sequences, how they are
//!   laid out, retiring them, and the lock of a single-process run.
//!
//! A store keeps entries as bytes under their names; the core encodes,
//! checks and names them ([`CheckpointEntry`](super::CheckpointEntry)), and
//! [`Checkpoints`](super::Checkpoints) reads and writes them for the
//! runtime. Every failing call returns an [`AccessError`] that says whether
//! it certainly had no effect or may have taken effect.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::access::AccessError;
use super::entry::EntryName;
use crate::error::StoreError;
use crate::membership::Epoch;
use crate::record::CheckpointId;

/// A checkpoint sequence of a pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The one sequence of global failover.
    Global,
    /// Region `i`'s sequence (region failover).
    Region(usize),
}

impl Scope {
    /// `None` → [`Scope::Global`], `Some(i)` → [`Scope::Region`]`(i)`.
    pub fn of(region: Option<usize>) -> Scope {
        region.map_or(Scope::Global, Scope::Region)
    }

    /// The region, `None` for the global sequence.
    pub fn region(self) -> Option<usize> {
        match self {
            Scope::Global => None,
            Scope::Region(i) => Some(i),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Global => f.write_str("global"),
            Scope::Region(i) => write!(f, "region {i}"),
        }
    }
}

/// The state of a sequence besides its entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Head {
    /// The current epoch: the one the latest [`fence`](SequenceStore::fence)
    /// took (0 before any).
    pub epoch: Epoch,
    /// Who took it (`process <pid> on host <host> (since …)`), if recorded.
    pub owner: Option<String>,
    /// The highest checkpoint id reserved so far: ids up to it may have been
    /// used, so a new owner starts above it.
    pub id_watermark: Option<CheckpointId>,
    /// The highest checkpoint whose transactions every sink committed.
    pub committed_through: Option<CheckpointId>,
}

/// Ids an owner raises with [`SequenceStore::advance`]; `None` leaves one
/// as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// Raise the id watermark to at least this.
    pub id_watermark: Option<CheckpointId>,
    /// Raise committed-through to at least this.
    pub committed_through: Option<CheckpointId>,
}

/// The outcome of a conditional call that reached the store.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cas<T, M = Epoch> {
    /// The condition held and the change is made (durably).
    Done(T),
    /// The condition did not hold (the store has `M` instead of what was
    /// expected): nothing changed.
    Moved(M),
}

/// A listed entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Its name.
    pub name: EntryName,
    /// Set aside ([`Removal::SetAside`]): kept for an operator, no longer an
    /// entry (never restored, never pruned).
    pub set_aside: bool,
}

/// How [`SequenceStore::remove`] removes an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Delete it (retention).
    Delete,
    /// Keep its bytes for an operator but make it no longer an entry (an
    /// unreadable entry a start was allowed past).
    SetAside,
}

/// One checkpoint sequence.
///
/// Guarantees every implementation gives, whoever calls at the same time:
///
/// - **Linearizable**: every call takes effect at one instant between its
///   start and its return; a read sees every change that returned before it
///   began.
/// - **Fencing**: after [`fence`](Self::fence) returned `Done`, every call
///   conditional on an older epoch is refused ([`Cas::Moved`]), and every
///   such call that was accepted before is visible to the new owner's reads.
///   A write whose outcome its caller does not know is settled (landed or
///   refused) before a later fence returns.
/// - **Durable**: a change that returned `Done` survives a crash of the
///   store.
/// - **Errors say what is known** ([`AccessError`]): `Determinate` when the
///   call certainly had no effect, `Indeterminate` when it may have taken
///   effect. Reads fail determinately.
#[async_trait]
pub trait SequenceStore: Send + Sync + 'static {
    /// Where the sequence lives (a folder, a database and a key), for
    /// messages; without secrets.
    fn location(&self) -> String;

    /// The current head.
    async fn head(&self) -> Result<Head, AccessError>;

    /// Takes the sequence for `owner`: iff its epoch is still `expected`,
    /// raises it to `expected + 1` and records `owner`, returning the new
    /// head; otherwise `Moved` with the current epoch and nothing changes.
    async fn fence(&self, expected: Epoch, owner: &str) -> Result<Cas<Head>, AccessError>;

    /// Iff the epoch is `epoch`, raises the id watermark and committed-through
    /// to at least `marks` (never lowers them), returning the new head. Two
    /// calls of one owner commute.
    async fn advance(&self, epoch: Epoch, marks: Marks) -> Result<Cas<Head>, AccessError>;

    /// Every entry, set aside or not, oldest first (by checkpoint id, then
    /// time).
    async fn list(&self) -> Result<Vec<Listed>, AccessError>;

    /// The bytes of the entry `name` (not set aside), or `None` when there
    /// is none by that name.
    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>, AccessError>;

    /// Iff the epoch is `epoch`, stores `bytes` as the entry `name`,
    /// atomically (a reader sees all of it or nothing) and durably. Writing
    /// the same name again replaces it.
    async fn write(&self, epoch: Epoch, name: &str, bytes: Vec<u8>) -> Result<Cas<()>, AccessError>;

    /// Iff the epoch is `epoch`, removes the entry `name` as `how` says; a
    /// name that is already gone is no error.
    async fn remove(&self, epoch: Epoch, name: &str, how: Removal) -> Result<Cas<()>, AccessError>;
}

/// A pipeline's checkpoint store: its sequences and how they are laid out.
/// The same guarantees as [`SequenceStore`]'s.
#[async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// Where the pipeline's checkpoints live, for messages; without secrets.
    fn location(&self) -> String;

    /// How many entries the runtime keeps per sequence (at least 1).
    fn retain(&self) -> usize;

    /// The sequence `scope` (whether or not it holds anything yet).
    fn sequence(&self, scope: Scope) -> Arc<dyn SequenceStore>;

    /// The regions that have a sequence, lowest first.
    async fn regions(&self) -> Result<Vec<usize>, AccessError>;

    /// How the sequences are laid out, as last recorded; `None` before the
    /// first record.
    async fn layout(&self) -> Result<Option<Layout>, AccessError>;

    /// Iff the recorded layout is `expected`, records `layout` durably (the
    /// commit point of a change of layout); otherwise `Moved` with the
    /// recorded one.
    async fn record_layout(
        &self,
        expected: Option<Layout>,
        layout: Layout,
    ) -> Result<Cas<(), Option<Layout>>, AccessError>;

    /// Sets aside what a layout no longer uses — the sequence `scope`'s
    /// entries, id watermark and committed-through record — renamed, never
    /// deleted. The sequence starts over empty, under a higher epoch than
    /// any before: nothing of an older epoch is accepted in it.
    async fn retire(&self, scope: Scope) -> Result<(), AccessError>;

    /// Takes the pipeline's exclusive lock for as long as the returned guard
    /// lives, or fails with [`StoreError::Locked`] naming the holder. A lock
    /// must not outlive its holder (a process that dies, even by SIGKILL,
    /// releases it). The runtime holds it for a whole run.
    async fn lock(&self) -> Result<StoreLock, StoreError>;

    /// Where several processes of the pipeline keep their membership and
    /// region leases, when this store is one every machine reaches and can
    /// judge leases by one clock; `None` (the default) when it cannot
    /// (the folder store): then one process runs the pipeline, under
    /// [`lock`](Self::lock).
    fn leases(&self) -> Option<Arc<dyn crate::membership::LeaseStore>> {
        None
    }
}

/// How a pipeline's checkpoints are laid out: recorded in its store so a
/// change of failover mode or parallelism is noticed and carried over (see
/// the runtime's layout changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// One global checkpoint sequence, or one per region.
    pub failover: crate::pipeline::Failover,
    /// The number of source and of sink subtasks.
    pub parallelism: usize,
}

impl Layout {
    /// The checkpoint sequences.
    pub fn scopes(&self) -> Vec<Scope> {
        match self.failover {
            crate::pipeline::Failover::Global => vec![Scope::Global],
            crate::pipeline::Failover::Region => (0..self.parallelism).map(Scope::Region).collect(),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failover at parallelism {}",
            self.failover.as_str(),
            self.parallelism
        )
    }
}

/// A held [`CheckpointStore::lock`]; released when dropped.
pub struct StoreLock {
    #[allow(dead_code)]
    held: Box<dyn Send + Sync>,
    lost: Option<tokio::sync::watch::Receiver<Option<String>>>,
    /// How this holder records a clean release, where the store can.
    hand_over: Option<Box<dyn HandOver>>,
    /// The holder before this one released the lock cleanly.
    previous_clean: bool,
}

/// How a lock's holder tells the next one that it stopped cleanly: a
/// record kept beside the lock (in the lock file, in a table), written by
/// the holder while it still holds the lock and read — and cleared — by the
/// next holder when it takes the lock (see
/// [`StoreLock::previous_released_cleanly`]).
#[async_trait]
pub trait HandOver: Send + Sync + 'static {
    /// Records durably that the holder stopped acting on the pipeline and
    /// closed its sinks. Called while the lock is held, once, right before
    /// the lock is let go (the implementation may let it go itself).
    /// `Ok` only when the record is durable; an error leaves the next
    /// holder to treat the release as a crash.
    async fn record_clean_release(&self) -> Result<(), AccessError>;
}

impl StoreLock {
    /// A guard holding `held` (whatever keeps the lock: an open file, a
    /// database session) until it drops.
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        StoreLock {
            held: Box::new(held),
            lost: None,
            hand_over: None,
            previous_clean: false,
        }
    }

    /// The same lock, able to record a clean release through `hand_over`;
    /// `previous_clean` says whether the holder before this one released
    /// cleanly (what the store read, and cleared, when it took the lock).
    pub fn handing_over(mut self, hand_over: impl HandOver, previous_clean: bool) -> Self {
        self.hand_over = Some(Box::new(hand_over));
        self.previous_clean = previous_clean;
        self
    }

    /// Whether the previous holder released the lock cleanly: it stopped
    /// acting after its last checkpoint's commits and closed its sinks
    /// before it let go ([`release_cleanly`](Self::release_cleanly)), so
    /// nothing of it can still be running. `false` when it died, lost the
    /// lock, stopped after a failure, when there was none, and on a store
    /// that cannot tell.
    pub fn previous_released_cleanly(&self) -> bool {
        self.previous_clean
    }

    /// Records that this holder stopped cleanly (on a store that can, see
    /// [`HandOver`]), then lets the lock go. Call it only when nothing of
    /// the run acts any more: every region stopped after its final
    /// checkpoint was committed, and every sink closed. On an error the
    /// lock is let go all the same, unrecorded.
    pub async fn release_cleanly(self) -> Result<(), AccessError> {
        match &self.hand_over {
            Some(hand_over) => hand_over.record_clean_release().await,
            None => Ok(()),
        }
    }

    /// A lock that can be lost while held (a database session the server
    /// ends): the store sends why on `lost` when it is gone, and the runtime
    /// then stops acting at once (see [`StoreLock::lost`]).
    pub fn losable(held: impl Send + Sync + 'static, lost: tokio::sync::watch::Receiver<Option<String>>) -> Self {
        StoreLock {
            held: Box::new(held),
            lost: Some(lost),
            hand_over: None,
            previous_clean: false,
        }
    }

    /// Resolves with why, once the lock is lost; never for a lock that
    /// cannot be lost (a file lock the process holds).
    pub async fn lost(&mut self) -> String {
        match &mut self.lost {
            Some(lost) => loop {
                if let Some(why) = lost.borrow_and_update().clone() {
                    return why;
                }
                if lost.changed().await.is_err() {
                    return "the lock's watcher ended".to_string();
                }
            },
            None => std::future::pending().await,
        }
    }
}

impl fmt::Debug for StoreLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreLock")
    }
}
