//! [`Fetcher`]: reads partitions of one topic with read_committed Fetch
//! requests, ahead of the consumer, in the background.

mod aborted;
mod driver;
mod partition;
mod settings;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::task::JoinHandle;

pub use crate::batch::FetchedRecord;
use crate::config::WireConfig;
use crate::error::WireError;
pub use settings::{FetchSettings, OffsetReset, FETCH_PROPERTIES};

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
    /// The partition's high watermark as the answer reported it.
    pub high_watermark: i64,
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
}

/// What the consumer asks of the fetcher's task.
#[derive(Debug)]
enum Command {
    /// Start reading `partition` at `offset`.
    Add { partition: i32, offset: i64 },
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
    /// it rides out are counted in `counters`.
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
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (chunk_tx, chunks) = mpsc::unbounded_channel();
        let driver = driver::Driver::new(config, topic, partitions, settings, counters.clone(), chunk_tx);
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
        // A closed channel means the task ended; `next` reports why.
        let _ = self.commands.send(Command::Add { partition, offset });
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
