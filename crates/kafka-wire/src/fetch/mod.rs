//! [`Fetcher`]: reads partitions of one topic with read_committed Fetch
//! requests, ahead of the consumer, in the background.

mod aborted;
mod control;
mod driver;
mod partition;
mod settings;
mod state;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::task::JoinHandle;

pub use crate::batch::FetchedRecord;
use crate::config::WireConfig;
use crate::error::WireError;
use crate::topic_id::TopicId;
pub use settings::{FetchSettings, OffsetReset, OnTruncation, FETCH_PROPERTIES};

/// Where a [`Fetcher`] reads a partition from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchPosition {
    /// The next offset to deliver.
    pub offset: i64,
    /// The leader epoch of the last record before `offset` (its batch's),
    /// when known: before fetching, and again after every change of
    /// leader, the fetcher asks the partition's leader where that epoch
    /// ends (OffsetForLeaderEpoch, KIP-320) and so finds a log truncated
    /// below the position instead of reading on in a log that diverged.
    /// `None` (a position from before epochs were recorded, or one no
    /// record was read at yet) is not checked until a record is read.
    pub epoch: Option<i32>,
}

impl FetchPosition {
    /// A position without a known epoch.
    pub fn offset(offset: i64) -> FetchPosition {
        FetchPosition { offset, epoch: None }
    }
}

/// A partition's log found truncated below the position read, and the
/// fetcher gone on at the divergence ([`OnTruncation::Resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    /// The position that was read up to (the next offset then).
    pub position: i64,
    /// The leader epoch of the last record before it.
    pub epoch: i32,
    /// Where the log diverges: reading goes on here.
    pub divergence: i64,
    /// The leader epoch the log shares up to `divergence`.
    pub divergence_epoch: i32,
}

/// What one Fetch answer held for one partition.
#[derive(Debug)]
pub struct FetchedChunk {
    /// The partition.
    pub partition: i32,
    /// Its records to deliver, in offset order.
    pub records: Vec<FetchedRecord>,
    /// The offset the partition is fetched from next: past every batch the
    /// answer held, transaction markers and aborted transactions included.
    /// A chunk may hold no record and still move it (an answer of markers
    /// only), so `next_offset` says how far the partition is read even
    /// where no record says so.
    pub next_offset: i64,
    /// The leader epoch of the last batch the chunk passed (what a position
    /// at `next_offset` records), when the answer held one.
    pub next_epoch: Option<i32>,
    /// The partition's high watermark as the answer reported it.
    pub high_watermark: i64,
    /// Set on a chunk without records that tells the consumer the
    /// partition's log was truncated below the position it read and
    /// reading went on at the divergence ([`OnTruncation::Resume`]):
    /// `next_offset` is below the offsets delivered before, and what comes
    /// next holds records at offsets that were delivered already — new
    /// records, not repeats.
    pub truncation: Option<Truncation>,
    /// Keeps the chunk's bytes counted against
    /// [`FetchSettings::queued_max_bytes`] until the chunk is dropped.
    _queued: Option<OwnedSemaphorePermit>,
}

/// Where [`Fetcher`]s count what they rode out; one may be shared by
/// many fetchers (all subtasks of a source, say).
#[derive(Debug, Default)]
pub struct FetchCounters {
    transient_errors: AtomicU64,
    positions_reset: AtomicU64,
    truncations: AtomicU64,
    truncated_offsets: AtomicU64,
    leader_changes: AtomicU64,
    /// The topics missing from the metadata now.
    missing_topics: Mutex<std::collections::BTreeSet<String>>,
    /// Fetches answered, by the node id of the broker that answered.
    fetches_by_node: Mutex<BTreeMap<i32, u64>>,
    /// The node each partition (topic, partition) is fetched from now.
    fetching_from: Mutex<BTreeMap<(String, i32), i32>>,
}

impl FetchCounters {
    /// Errors ridden out so far: failed connections, requests without an
    /// answer, partitions whose leader moved, metadata that could not be
    /// read. Each was logged.
    pub fn transient_errors(&self) -> u64 {
        self.transient_errors.load(Ordering::Relaxed)
    }

    /// Partitions moved on because retention had deleted records before
    /// they were read (`auto.offset.reset`); each was logged with what was
    /// skipped.
    pub fn positions_reset(&self) -> u64 {
        self.positions_reset.load(Ordering::Relaxed)
    }

    /// Partitions whose log was found truncated below the position read,
    /// and read on from the divergence ([`OnTruncation::Resume`]).
    pub fn truncations(&self) -> u64 {
        self.truncations.load(Ordering::Relaxed)
    }

    /// Offsets read before a truncation that no longer exist in the log
    /// (from each divergence to the position read then).
    pub fn truncated_offsets(&self) -> u64 {
        self.truncated_offsets.load(Ordering::Relaxed)
    }

    /// Times a partition's leader (or its leader epoch) changed under the
    /// fetcher.
    pub fn leader_changes(&self) -> u64 {
        self.leader_changes.load(Ordering::Relaxed)
    }

    /// Whether a fetcher's topic is missing from the metadata now
    /// (deleted, or not created yet): the fetcher waits for it, up to
    /// [`FetchSettings::missing_topic_timeout`].
    pub fn topic_missing(&self) -> bool {
        !lock(&self.missing_topics).is_empty()
    }

    /// The fetchers' topics missing from the metadata now.
    pub fn missing_topics(&self) -> std::collections::BTreeSet<String> {
        lock(&self.missing_topics).clone()
    }

    /// Records whether `topic` is missing; whether that changed.
    fn set_missing(&self, topic: &str, missing: bool) -> bool {
        let mut topics = lock(&self.missing_topics);
        if missing {
            topics.insert(topic.to_string())
        } else {
            topics.remove(topic)
        }
    }

    /// Fetch answers received, by the node id of the broker that sent them.
    pub fn fetches_by_node(&self) -> BTreeMap<i32, u64> {
        lock(&self.fetches_by_node).clone()
    }

    /// The node id of the broker each partition (topic, partition) is
    /// fetched from now: its leader, or the replica the leader named
    /// (KIP-392).
    pub fn fetching_from(&self) -> BTreeMap<(String, i32), i32> {
        lock(&self.fetching_from).clone()
    }

    fn count_fetch(&self, node: i32) {
        *lock(&self.fetches_by_node).entry(node).or_default() += 1;
    }

    fn fetch_from(&self, topic: &str, partition: i32, node: Option<i32>) {
        let mut from = lock(&self.fetching_from);
        let key = (topic.to_string(), partition);
        match node {
            Some(node) => from.insert(key, node),
            None => from.remove(&key),
        };
    }
}

/// A lock of a mutex that a panic elsewhere may have poisoned.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the consumer asks of the fetcher's task.
#[derive(Debug)]
enum Command {
    /// Start reading `partition` at `position`.
    Add { partition: i32, position: FetchPosition },
}

/// Reads partitions of one topic with read_committed Fetch requests,
/// ahead of the consumer, in the background.
///
/// A task of its own keeps one Fetch in flight per partition leader (each
/// answer decoded as soon as it arrives: records are slices of the answer,
/// keys and values are never copied), and queues what it read as
/// [`FetchedChunk`]s, one per partition and answer, until
/// [`FetchSettings::queued_max_bytes`] are queued; then it waits for the
/// consumer. What it delivers is what a read_committed consumer sees:
/// committed and plain records, never aborted ones, never transaction
/// markers.
///
/// Broker trouble is ridden out, as a consumer does: a connection that
/// fails or a partition whose leader moved is retried with backoff after
/// fresh metadata, and each such error is logged and counted
/// ([`FetchCounters`]). Only what no retry cures reaches the consumer, as
/// an `Err` from [`next`](Self::next): refused credentials or
/// certificates, a topic it may not read, corrupt record batches, an
/// offset out of range under [`OffsetReset::Error`].
///
/// Dropping it stops its task and closes its connections.
#[derive(Debug)]
pub struct Fetcher {
    commands: mpsc::UnboundedSender<Command>,
    chunks: mpsc::UnboundedReceiver<Result<FetchedChunk, WireError>>,
    counters: Arc<FetchCounters>,
    task: JoinHandle<()>,
    topic: String,
}

impl Fetcher {
    /// Starts reading `partitions` of `topic`, each from the offset given
    /// (the next record to deliver), on the current tokio runtime; errors
    /// it rides out are counted in `counters`. See [`start_at`](Self::start_at).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(
        config: WireConfig,
        topic: &str,
        partitions: BTreeMap<i32, i64>,
        settings: FetchSettings,
        counters: Arc<FetchCounters>,
    ) -> Fetcher {
        let positions = partitions
            .into_iter()
            .map(|(p, offset)| (p, FetchPosition::offset(offset)))
            .collect();
        Self::start_at(config, topic, positions, None, settings, counters)
    }

    /// Starts reading `partitions` of `topic` from the positions given, on
    /// the current tokio runtime; errors it rides out are counted in
    /// `counters`.
    ///
    /// `topic_id`: the id of the topic the positions were read in, when
    /// known; a topic of that name with another id (deleted and created
    /// again) stops the fetcher with [`WireError::TopicRecreated`]. Without
    /// it, the id the brokers name first is the one kept.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start_at(
        config: WireConfig,
        topic: &str,
        partitions: BTreeMap<i32, FetchPosition>,
        topic_id: Option<TopicId>,
        settings: FetchSettings,
        counters: Arc<FetchCounters>,
    ) -> Fetcher {
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (chunk_tx, chunks) = mpsc::unbounded_channel();
        let driver = driver::Driver::new(
            config,
            topic,
            partitions,
            topic_id,
            settings,
            counters.clone(),
            chunk_tx,
        );
        let task = tokio::spawn(driver.run(command_rx));
        Fetcher {
            commands,
            chunks,
            counters,
            task,
            topic: topic.to_string(),
        }
    }

    /// Starts reading `partition` at `offset` too (a partition found
    /// later). A partition read already is left as it is.
    pub fn add(&self, partition: i32, offset: i64) {
        self.add_at(partition, FetchPosition::offset(offset));
    }

    /// Starts reading `partition` at `position` too (a partition found
    /// later, or one of the checkpoint back in the metadata). A partition
    /// read already is left as it is.
    pub fn add_at(&self, partition: i32, position: FetchPosition) {
        // A closed channel means the task ended; `next` reports why.
        let _ = self.commands.send(Command::Add { partition, position });
    }

    /// The next chunk, waiting up to `wait` for one: `Ok(None)` when none
    /// came. `Err` only for what no retry cures (see [`Fetcher`]); the
    /// fetcher is done then.
    pub async fn next(&mut self, wait: Duration) -> Result<Option<FetchedChunk>, WireError> {
        match tokio::time::timeout(wait, self.chunks.recv()).await {
            Err(_) => Ok(None),
            Ok(received) => self.received(received).map(Some),
        }
    }

    /// The next chunk if one is queued, without waiting.
    pub fn try_next(&mut self) -> Result<Option<FetchedChunk>, WireError> {
        match self.chunks.try_recv() {
            Ok(chunk) => chunk.map(Some),
            Err(mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(mpsc::error::TryRecvError::Disconnected) => self.received(None).map(Some),
        }
    }

    fn received(&self, received: Option<Result<FetchedChunk, WireError>>) -> Result<FetchedChunk, WireError> {
        received.unwrap_or_else(|| {
            Err(WireError::FetcherStopped {
                topic: self.topic.clone(),
            })
        })
    }

    /// The counters it counts in.
    pub fn counters(&self) -> &FetchCounters {
        &self.counters
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}
