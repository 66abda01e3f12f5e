//! Externalized checkpoints.
//!
//! Layout: one folder per pipeline under the store root, one file per complete
//! checkpoint named `<fingerprint>-<unix-ms>-<checkpoint-id>`:
//!
//! ```text
//! /var/lib/exactly/checkpoints/orders-to-pg/9c87f7685fe0947a-1522439833113-4048
//! ```
//!
//! Entries are self-describing JSON (an operator can read them with `cat`) and
//! carry a SHA-256 checksum of their content. Writes are atomic: temporary file,
//! fsync, rename, fsync of the folder. [`CheckpointStore::latest`] skips partial
//! or corrupt entries.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::coordinator::CheckpointData;
use crate::error::StoreError;
use crate::record::CheckpointId;

/// What a pipeline is made of, as far as its state is concerned. Its hash is the
/// fingerprint that prefixes every checkpoint entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineDescriptor {
    /// Pipeline name.
    pub name: String,
    /// [`crate::SourceFactory::identity`].
    pub source: String,
    /// [`crate::SinkFactory::identity`].
    pub sink: String,
    /// Number of source and of sink subtasks.
    pub parallelism: usize,
    /// `exactly-once` or `at-least-once`.
    pub guarantee: String,
}

impl PipelineDescriptor {
    /// First 16 hex digits of the SHA-256 of the descriptor's JSON.
    pub fn fingerprint(&self) -> String {
        let json = serde_json::to_vec(self).expect("descriptor serializes");
        hex::encode(&Sha256::digest(&json)[..8])
    }

    /// Human-readable list of the fields that differ from `other`.
    pub fn describe_changes(&self, other: &PipelineDescriptor) -> String {
        let mut changes = Vec::new();
        let mut cmp = |field: &str, old: &dyn std::fmt::Display, new: &dyn std::fmt::Display| {
            let (old, new) = (old.to_string(), new.to_string());
            if old != new {
                changes.push(format!("{field} was `{old}`, is now `{new}`"));
            }
        };
        cmp("name", &other.name, &self.name);
        cmp("source", &other.source, &self.source);
        cmp("sink", &other.sink, &self.sink);
        cmp("parallelism", &other.parallelism, &self.parallelism);
        cmp("guarantee", &other.guarantee, &self.guarantee);
        if changes.is_empty() {
            "nothing visible (the fingerprint algorithm changed)".into()
        } else {
            changes.join("; ")
        }
    }
}

/// One stored checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointEntry {
    /// Fingerprint of `descriptor`.
    pub fingerprint: String,
    /// When the entry was written, Unix milliseconds.
    pub created_unix_ms: u64,
    /// The pipeline that wrote it.
    pub descriptor: PipelineDescriptor,
    /// The checkpoint itself.
    pub checkpoint: CheckpointData,
}

impl CheckpointEntry {
    /// Builds an entry stamped with the current time.
    pub fn new(descriptor: PipelineDescriptor, checkpoint: CheckpointData) -> Self {
        CheckpointEntry {
            fingerprint: descriptor.fingerprint(),
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or_default(),
            descriptor,
            checkpoint,
        }
    }

    /// The entry's file name: `<fingerprint>-<unix-ms>-<checkpoint-id>`.
    pub fn file_name(&self) -> String {
        format!("{}-{}-{}", self.fingerprint, self.created_unix_ms, self.checkpoint.id)
    }
}

/// On-disk envelope: the entry plus a checksum of its canonical encoding.
#[derive(Serialize, Deserialize)]
struct Envelope {
    format: u32,
    sha256: String,
    entry: CheckpointEntry,
}

fn checksum(entry: &CheckpointEntry) -> String {
    hex::encode(Sha256::digest(serde_json::to_vec(entry).expect("entry serializes")))
}

/// A listed entry name, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryName {
    /// Fingerprint part.
    pub fingerprint: String,
    /// Timestamp part.
    pub created_unix_ms: u64,
    /// Checkpoint id part.
    pub id: CheckpointId,
    /// The file name.
    pub file_name: String,
}

impl EntryName {
    /// Parses `<fingerprint>-<unix-ms>-<checkpoint-id>`; `None` for anything else
    /// (temporary files, foreign files).
    pub fn parse(name: &str) -> Option<EntryName> {
        let mut parts = name.splitn(3, '-');
        let fingerprint = parts.next()?;
        let ms = parts.next()?.parse().ok()?;
        let id = parts.next()?.parse().ok()?;
        if fingerprint.is_empty() || !fingerprint.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        Some(EntryName {
            fingerprint: fingerprint.to_string(),
            created_unix_ms: ms,
            id: CheckpointId(id),
            file_name: name.to_string(),
        })
    }
}

/// Durable storage for complete checkpoints of one pipeline.
///
/// Implementations are synchronous; the runtime calls them from a blocking thread.
pub trait CheckpointStore: Send + Sync + 'static {
    /// Stores `entry` atomically and durably: when this returns `Ok`, a crash of
    /// the process or the machine cannot lose or tear it.
    fn save(&self, entry: &CheckpointEntry) -> Result<(), StoreError>;

    /// Removes entries beyond the retention and what crashed writers left.
    /// Best effort: the runtime calls it after every save, and logs and
    /// counts a failure (`store_cleanup_failures`) but carries on.
    fn prune(&self) -> Result<(), StoreError>;

    /// Renames the entry `name` so it is no longer an entry (it keeps its
    /// bytes for an operator to look at, as `<name>.unreadable`). The
    /// runtime quarantines unreadable entries once a start past them was
    /// accepted, so they do not stop every later start.
    fn quarantine(&self, name: &str) -> Result<(), StoreError>;

    /// The newest readable entry (highest checkpoint id, then newest time),
    /// skipping partial or corrupt ones, or `None` when there is none.
    fn latest(&self) -> Result<Option<CheckpointEntry>, StoreError>;

    /// Entry names, oldest first, including ones that may be corrupt.
    fn list(&self) -> Result<Vec<EntryName>, StoreError>;

    /// Names of the entries set aside by [`quarantine`](Self::quarantine)
    /// (with the entry's own name), oldest first. The runtime reads them to
    /// tell an entry set aside by an accepted fallback from one that is
    /// gone. The default, none, makes every gap look unexplained (a start
    /// is then refused rather than duplicating silently).
    fn quarantined(&self) -> Result<Vec<EntryName>, StoreError> {
        Ok(Vec::new())
    }

    /// Reads and verifies the entry `name` (from [`list`](Self::list));
    /// `Err` says why it cannot be used (unreadable, corrupt, torn).
    fn read(&self, name: &str) -> Result<CheckpointEntry, String>;

    /// Where the entries live, for messages.
    fn location(&self) -> String;

    /// The highest checkpoint id reserved by any run so far (see
    /// [`reserve_ids`](Self::reserve_ids)); `None` when nothing was reserved.
    fn id_watermark(&self) -> Result<Option<CheckpointId>, StoreError>;

    /// Durably records that ids up to `upto` may be in use, before any of them is
    /// triggered, so a restarted pipeline never reuses a checkpoint id (sinks name
    /// transactions after it). The runtime reserves ids in blocks.
    fn reserve_ids(&self, upto: CheckpointId) -> Result<(), StoreError>;

    /// The highest checkpoint id recorded by
    /// [`record_committed`](Self::record_committed), or `None`.
    fn committed_through(&self) -> Result<Option<CheckpointId>, StoreError>;

    /// Durably records that every sink subtask has committed everything
    /// pending up to checkpoint `id` (the runtime calls it after those
    /// commits). A later recovery then knows that the transactions a
    /// checkpoint up to `id` lists are committed, even when the store that
    /// holds them can no longer tell (a Kafka transactional id that expired
    /// while the pipeline was stopped). Never lowers the recorded id.
    fn record_committed(&self, id: CheckpointId) -> Result<(), StoreError>;

    /// Takes the pipeline's exclusive lock for as long as the returned guard
    /// lives, or fails with [`StoreError::Locked`] naming the holder when
    /// another process holds it. The runtime holds it while a pipeline runs,
    /// so two processes never run the same pipeline. A lock must not outlive
    /// its holder (a process that dies, even by SIGKILL, releases it).
    fn lock_exclusive(&self) -> Result<StoreLock, StoreError>;

    /// The store of region `region` of this pipeline (its own entries, id
    /// watermark and committed-through record; the lock and the layout stay
    /// with the pipeline's store).
    fn region(&self, region: usize) -> Arc<dyn CheckpointStore>;

    /// The regions that have a store, lowest first.
    fn regions(&self) -> Result<Vec<usize>, StoreError>;

    /// How the pipeline's checkpoints are laid out (one global sequence, or
    /// one per region, and at which parallelism), as last recorded; `None`
    /// before the first record.
    fn layout(&self) -> Result<Option<Layout>, StoreError>;

    /// Durably records the layout: the commit point of a change of layout.
    fn record_layout(&self, layout: &Layout) -> Result<(), StoreError>;

    /// Sets aside what a layout no longer uses (it is renamed, never
    /// deleted): the entries, id watermark and committed-through record of
    /// the pipeline's own store (`None`), or the store of region `r`.
    fn retire(&self, region: Option<usize>) -> Result<(), StoreError>;
}

/// How a pipeline's checkpoints are laid out: recorded in the pipeline's
/// folder so a change of failover mode or parallelism is noticed and carried
/// over (see the runtime's layout changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// One global checkpoint sequence, or one per region.
    pub failover: crate::pipeline::Failover,
    /// The number of source and of sink subtasks.
    pub parallelism: usize,
}

impl Layout {
    /// The checkpoint sequences: `None` for the global one, `Some(r)` for
    /// each region.
    pub fn scopes(&self) -> Vec<Option<usize>> {
        match self.failover {
            crate::pipeline::Failover::Global => vec![None],
            crate::pipeline::Failover::Region => (0..self.parallelism).map(Some).collect(),
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failover at parallelism {}",
            self.failover.as_str(),
            self.parallelism
        )
    }
}

/// A held [`CheckpointStore::lock_exclusive`]; released when dropped.
pub struct StoreLock(#[allow(dead_code)] Box<dyn Send + Sync>);

impl StoreLock {
    /// A guard holding `held` (whatever keeps the lock: an open file, a
    /// lease) until it drops.
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        StoreLock(Box::new(held))
    }
}

impl std::fmt::Debug for StoreLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreLock")
    }
}

/// Name of the id watermark file inside a pipeline's folder.
pub const ID_WATERMARK_FILE: &str = "id-watermark";

/// Name of the file inside a pipeline's folder that holds the highest
/// checkpoint id whose transactions every sink has committed.
pub const COMMITTED_THROUGH_FILE: &str = "committed-through";

/// Name of the file inside a pipeline's folder that records its [`Layout`].
pub const LAYOUT_FILE: &str = "layout";

/// Prefix of a region's folder inside the pipeline's folder.
pub const REGION_PREFIX: &str = "region-";

/// Prefix of what a layout change set aside, inside the pipeline's folder.
pub const RETIRED_PREFIX: &str = "retired-";

/// Suffix of a quarantined (unreadable) entry's file name.
pub const QUARANTINE_SUFFIX: &str = ".unreadable";

/// Name of the file inside a pipeline's folder that the running process
/// holds an OS lock (`flock`) on, and in which it wrote who it is.
pub const LOCK_FILE: &str = "lock";

/// [`CheckpointStore`] on a local (or mounted) filesystem.
#[derive(Clone, Debug)]
pub struct FsCheckpointStore {
    dir: PathBuf,
    retain: usize,
    /// Serializes [`CheckpointStore::record_committed`] so the recorded id
    /// only grows.
    committed: std::sync::Arc<std::sync::Mutex<()>>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl FsCheckpointStore {
    /// The entry names `parse` reads from the folder's file names, oldest
    /// first (none when the folder does not exist).
    fn names_in_folder(&self, parse: impl Fn(&str) -> Option<EntryName>) -> Result<Vec<EntryName>, StoreError> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&self.dir)(e)),
        };
        let mut names = rd
            .flatten()
            .filter_map(|e| parse(&e.file_name().to_string_lossy()))
            .collect::<Vec<_>>();
        names.sort_by_key(|n| (n.id, n.created_unix_ms));
        Ok(names)
    }

    /// Store of the pipeline `config` configures, under `root` (entries in
    /// `root/<config.name>/`), keeping the newest `retain` entries (at least
    /// 1): the pipeline's name is said once, in its configuration.
    pub fn for_pipeline(root: impl AsRef<Path>, config: &crate::PipelineConfig, retain: usize) -> Self {
        FsCheckpointStore::new(root, &config.name, retain)
    }

    /// Store of the folder `root/pipeline/`, keeping the newest `retain`
    /// entries (at least 1). For reading a folder by name (operator tools);
    /// a pipeline builds its store with [`for_pipeline`](Self::for_pipeline).
    pub fn new(root: impl AsRef<Path>, pipeline: &str, retain: usize) -> Self {
        FsCheckpointStore {
            dir: root.as_ref().join(pipeline),
            retain: retain.max(1),
            committed: Default::default(),
        }
    }

    /// The pipeline's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn pipeline_name(&self) -> String {
        self.dir
            .file_name()
            .map_or_else(|| self.dir.display().to_string(), |n| n.to_string_lossy().into_owned())
    }

    /// Reads and verifies one entry; `Err` describes why it is unusable.
    pub fn read(&self, name: &str) -> Result<CheckpointEntry, String> {
        let path = self.dir.join(name);
        let bytes = fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::decode(&path, name, &bytes)
    }

    fn decode(path: &Path, name: &str, bytes: &[u8]) -> Result<CheckpointEntry, String> {
        let env: Envelope =
            serde_json::from_slice(bytes).map_err(|e| format!("{} is not a checkpoint entry: {e}", path.display()))?;
        if checksum(&env.entry) != env.sha256 {
            return Err(format!("{} fails its checksum", path.display()));
        }
        if env.entry.file_name() != name {
            return Err(format!("{} holds entry {}", path.display(), env.entry.file_name()));
        }
        Ok(env.entry)
    }

    /// temp file, fsync, rename, fsync of the folder.
    fn write_atomically(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        if !self.dir.exists() {
            fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
            // Make the new folder itself durable in its parent.
            if let Some(parent) = self.dir.parent() {
                fs::File::open(parent)
                    .and_then(|d| d.sync_all())
                    .map_err(io_err(parent))?;
            }
        }
        let tmp = self.dir.join(format!(".tmp-{name}"));
        {
            let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
            f.write_all(bytes).map_err(io_err(&tmp))?;
            crate::fault::point("store.before_fsync");
            f.sync_all().map_err(io_err(&tmp))?;
        }
        let final_path = self.dir.join(name);
        fs::rename(&tmp, &final_path).map_err(io_err(&final_path))?;
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))
    }

    /// A file of the pipeline's folder holding one checkpoint id; `None`
    /// when it does not exist.
    fn read_id_file(&self, name: &str) -> Result<Option<CheckpointId>, StoreError> {
        let path = self.dir.join(name);
        match fs::read_to_string(&path) {
            Ok(text) => text
                .trim()
                .parse()
                .map(|n| Some(CheckpointId(n)))
                .map_err(|e| StoreError::Io {
                    path: path.display().to_string(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    fn prune(&self) -> Result<(), StoreError> {
        let names = CheckpointStore::list(self)?;
        if names.len() > self.retain {
            for n in &names[..names.len() - self.retain] {
                let path = self.dir.join(&n.file_name);
                fs::remove_file(&path).map_err(io_err(&path))?;
            }
        }
        // Temporary files of crashed writers.
        for e in fs::read_dir(&self.dir).map_err(io_err(&self.dir))?.flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(())
    }
}

impl CheckpointStore for FsCheckpointStore {
    fn save(&self, entry: &CheckpointEntry) -> Result<(), StoreError> {
        let env = Envelope {
            format: 1,
            sha256: checksum(entry),
            entry: entry.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&env).map_err(|e| StoreError::Encode {
            checkpoint: entry.checkpoint.id,
            message: e.to_string(),
        })?;
        self.write_atomically(&entry.file_name(), &bytes)
    }

    fn prune(&self) -> Result<(), StoreError> {
        FsCheckpointStore::prune(self)
    }

    fn quarantine(&self, name: &str) -> Result<(), StoreError> {
        let from = self.dir.join(name);
        let to = self.dir.join(format!("{name}{QUARANTINE_SUFFIX}"));
        fs::rename(&from, &to).map_err(io_err(&from))?;
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))
    }

    fn id_watermark(&self) -> Result<Option<CheckpointId>, StoreError> {
        self.read_id_file(ID_WATERMARK_FILE)
    }

    fn reserve_ids(&self, upto: CheckpointId) -> Result<(), StoreError> {
        self.write_atomically(ID_WATERMARK_FILE, upto.0.to_string().as_bytes())
    }

    fn committed_through(&self) -> Result<Option<CheckpointId>, StoreError> {
        self.read_id_file(COMMITTED_THROUGH_FILE)
    }

    /// `flock(LOCK_EX | LOCK_NB)` on [`LOCK_FILE`], which then holds the
    /// holder's host, pid and start time (read by a refused process). The
    /// kernel releases the lock when the holder's file closes, however the
    /// holder ends.
    fn region(&self, region: usize) -> Arc<dyn CheckpointStore> {
        Arc::new(FsCheckpointStore {
            dir: self.dir.join(format!("{REGION_PREFIX}{region}")),
            retain: self.retain,
            committed: Default::default(),
        })
    }

    fn regions(&self) -> Result<Vec<usize>, StoreError> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&self.dir)(e)),
        };
        let mut regions: Vec<usize> = rd
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str()?.strip_prefix(REGION_PREFIX)?.parse().ok())
            .collect();
        regions.sort_unstable();
        Ok(regions)
    }

    fn layout(&self) -> Result<Option<Layout>, StoreError> {
        let path = self.dir.join(LAYOUT_FILE);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| StoreError::Io {
                path: path.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    fn record_layout(&self, layout: &Layout) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(layout).expect("a layout serializes");
        self.write_atomically(LAYOUT_FILE, &bytes)
    }

    fn retire(&self, region: Option<usize>) -> Result<(), StoreError> {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        match region {
            Some(r) => {
                let from = self.dir.join(format!("{REGION_PREFIX}{r}"));
                if from.exists() {
                    let to = self.dir.join(format!("{RETIRED_PREFIX}{stamp}-{REGION_PREFIX}{r}"));
                    fs::rename(&from, &to).map_err(io_err(&from))?;
                }
            }
            None => {
                let to = self.dir.join(format!("{RETIRED_PREFIX}{stamp}-global"));
                let mut moved = CheckpointStore::list(self)?
                    .into_iter()
                    .map(|n| n.file_name)
                    .collect::<Vec<_>>();
                moved.extend([ID_WATERMARK_FILE.to_string(), COMMITTED_THROUGH_FILE.to_string()]);
                for name in moved {
                    let from = self.dir.join(&name);
                    if from.exists() {
                        fs::create_dir_all(&to).map_err(io_err(&to))?;
                        fs::rename(&from, to.join(&name)).map_err(io_err(&from))?;
                    }
                }
            }
        }
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))
    }

    fn lock_exclusive(&self) -> Result<StoreLock, StoreError> {
        use std::io::{Read, Seek};
        use std::os::fd::AsRawFd;
        fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        let path = self.dir.join(LOCK_FILE);
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path))?;
        // SAFETY: flock only acts on the open descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::WouldBlock {
                return Err(io_err(&path)(error));
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(StoreError::Locked {
                pipeline: self.pipeline_name(),
                dir: self.dir.display().to_string(),
                holder: if holder.is_empty() {
                    "another process (it has not written its name yet)".into()
                } else {
                    holder.to_string()
                },
            });
        }
        let since = humantime::format_rfc3339_seconds(SystemTime::now());
        let me = format!("process {} on host {} (since {since})", std::process::id(), host_name());
        file.set_len(0).map_err(io_err(&path))?;
        file.rewind().map_err(io_err(&path))?;
        file.write_all(me.as_bytes()).map_err(io_err(&path))?;
        Ok(StoreLock::new(file))
    }

    fn record_committed(&self, id: CheckpointId) -> Result<(), StoreError> {
        let _one_at_a_time = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        if self.committed_through()?.is_some_and(|recorded| recorded >= id) {
            return Ok(());
        }
        self.write_atomically(COMMITTED_THROUGH_FILE, id.0.to_string().as_bytes())
    }

    fn latest(&self) -> Result<Option<CheckpointEntry>, StoreError> {
        for name in self.list()?.iter().rev() {
            let path = self.dir.join(&name.file_name);
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                // Pruned since the listing: an older one is next anyway.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                // The store is unreadable right now: never fall back to an older
                // checkpoint (or a first start) because of that; retry instead.
                Err(e) => return Err(io_err(&path)(e)),
            };
            match Self::decode(&path, &name.file_name, &bytes) {
                Ok(entry) => return Ok(Some(entry)),
                Err(problem) => tracing::error!(
                    %problem,
                    "skipping a corrupt checkpoint entry and falling back to an older one; \
                     if the corrupt one had completed, its commits may be replayed"
                ),
            }
        }
        Ok(None)
    }

    fn read(&self, name: &str) -> Result<CheckpointEntry, String> {
        FsCheckpointStore::read(self, name)
    }

    fn list(&self) -> Result<Vec<EntryName>, StoreError> {
        self.names_in_folder(EntryName::parse)
    }

    fn quarantined(&self) -> Result<Vec<EntryName>, StoreError> {
        self.names_in_folder(|name| EntryName::parse(name.strip_suffix(QUARANTINE_SUFFIX)?))
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }
}

/// What a pipeline may resume from despite a different definition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllowedChanges {
    /// Any change (`allow_fingerprint_change`).
    pub any: bool,
    /// Only the parallelism (`allow_parallelism_change`).
    pub parallelism: bool,
}

/// This machine's host name, for the lock holder's description.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    if ok && end > 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".into()
    }
}

/// Checks that `entry` was written by the pipeline described by `current`.
/// Returns an error naming what changed unless `allowed` admits it: a
/// change of the parallelism alone needs `allowed.parallelism` (or `any`),
/// every other change `allowed.any`.
pub fn check_fingerprint(
    store: &dyn CheckpointStore,
    entry: &CheckpointEntry,
    current: &PipelineDescriptor,
    allowed: AllowedChanges,
) -> Result<(), StoreError> {
    let expected = current.fingerprint();
    if entry.fingerprint == expected {
        return Ok(());
    }
    let changes = current.describe_changes(&entry.descriptor);
    let only_parallelism = PipelineDescriptor {
        parallelism: entry.descriptor.parallelism,
        ..current.clone()
    }
    .fingerprint()
        == entry.fingerprint;
    if only_parallelism && !allowed.any {
        if allowed.parallelism {
            tracing::warn!(
                was = entry.descriptor.parallelism,
                now = current.parallelism,
                "resuming from a checkpoint taken at another parallelism (explicitly allowed)"
            );
            return Ok(());
        }
        return Err(StoreError::ParallelismChanged {
            dir: store.location(),
            checkpoint: entry.checkpoint.id,
            was: entry.descriptor.parallelism,
            now: current.parallelism,
        });
    }
    if allowed.any {
        tracing::warn!(%changes, "resuming from a checkpoint of a different pipeline definition (explicitly allowed)");
        return Ok(());
    }
    Err(StoreError::FingerprintMismatch {
        dir: store.location(),
        checkpoint: entry.checkpoint.id,
        expected,
        found: entry.fingerprint.clone(),
        changes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor() -> PipelineDescriptor {
        PipelineDescriptor {
            name: "p".into(),
            source: "sequence:splits=2".into(),
            sink: "file:dir=/out".into(),
            parallelism: 2,
            guarantee: "exactly-once".into(),
        }
    }

    fn entry(id: u64) -> CheckpointEntry {
        let mut e = CheckpointEntry::new(
            descriptor(),
            CheckpointData {
                id: CheckpointId(id),
                ..Default::default()
            },
        );
        e.created_unix_ms = 1_700_000_000_000 + id;
        e
    }

    #[test]
    fn entries_are_named_and_the_latest_complete_one_wins() {
        let root = tempfile::tempdir().unwrap();
        let store = FsCheckpointStore::new(root.path(), "p", 3);
        assert!(store.latest().unwrap().is_none());
        for id in 1..=5 {
            store.save(&entry(id)).unwrap();
        }
        assert_eq!(store.list().unwrap().len(), 5, "saving does not prune");
        store.prune().unwrap();
        let names = store.list().unwrap();
        assert_eq!(names.iter().map(|n| n.id.0).collect::<Vec<_>>(), vec![3, 4, 5]);
        let fp = descriptor().fingerprint();
        assert_eq!(names[2].file_name, format!("{fp}-1700000000005-5"));
        assert_eq!(store.latest().unwrap().unwrap().checkpoint.id, CheckpointId(5));
        assert_eq!(store.id_watermark().unwrap(), None);
        store.reserve_ids(CheckpointId(100)).unwrap();
        assert_eq!(store.id_watermark().unwrap(), Some(CheckpointId(100)));
        assert_eq!(store.list().unwrap().len(), 3, "the watermark is not an entry");
    }

    #[test]
    fn the_committed_checkpoint_is_recorded_and_never_lowered() {
        let root = tempfile::tempdir().unwrap();
        let store = FsCheckpointStore::new(root.path(), "p", 3);
        assert_eq!(store.committed_through().unwrap(), None);
        store.record_committed(CheckpointId(7)).unwrap();
        assert_eq!(store.committed_through().unwrap(), Some(CheckpointId(7)));
        store.record_committed(CheckpointId(5)).unwrap();
        assert_eq!(
            store.committed_through().unwrap(),
            Some(CheckpointId(7)),
            "never lowered"
        );
        store.record_committed(CheckpointId(9)).unwrap();
        let again = FsCheckpointStore::new(root.path(), "p", 3);
        assert_eq!(again.committed_through().unwrap(), Some(CheckpointId(9)), "durable");
        assert!(store.list().unwrap().is_empty(), "the record is not an entry");
    }

    #[test]
    fn one_holder_at_a_time_and_the_refusal_names_it() {
        let root = tempfile::tempdir().unwrap();
        let store = FsCheckpointStore::new(root.path(), "p", 3);
        let held = store.lock_exclusive().expect("the first lock");
        // flock locks belong to open files: a second open in the same
        // process conflicts like another process would.
        let other = FsCheckpointStore::new(root.path(), "p", 3);
        let err = other.lock_exclusive().unwrap_err().to_string();
        assert!(err.contains("pipeline p is already running"), "{err}");
        assert!(err.contains(&format!("process {}", std::process::id())), "{err}");
        assert!(err.contains("on host "), "{err}");
        assert!(
            FsCheckpointStore::new(root.path(), "q", 3).lock_exclusive().is_ok(),
            "another pipeline"
        );
        drop(held);
        other.lock_exclusive().expect("free again after the holder dropped it");
        assert!(store.list().unwrap().is_empty(), "the lock file is not an entry");
    }

    #[test]
    fn corrupt_and_half_written_entries_are_skipped() {
        let root = tempfile::tempdir().unwrap();
        let store = FsCheckpointStore::new(root.path(), "p", 10);
        store.save(&entry(1)).unwrap();
        store.save(&entry(2)).unwrap();
        // Flip a byte inside entry 2 (still valid JSON, wrong checksum).
        let p2 = store.dir().join(entry(2).file_name());
        let text = fs::read_to_string(&p2).unwrap().replace("\"id\": 2", "\"id\": 3");
        fs::write(&p2, text).unwrap();
        // A truncated entry 3.
        let e3 = entry(3);
        let full = fs::read(store.dir().join(entry(1).file_name())).unwrap();
        fs::write(store.dir().join(e3.file_name()), &full[..full.len() / 2]).unwrap();
        assert_eq!(store.latest().unwrap().unwrap().checkpoint.id, CheckpointId(1));
    }

    #[test]
    fn fingerprint_mismatch_names_what_changed() {
        let root = tempfile::tempdir().unwrap();
        let store = FsCheckpointStore::new(root.path(), "p", 10);
        let e = entry(1);
        let mut changed = descriptor();
        changed.parallelism = 4;
        let none = AllowedChanges::default();
        let err = check_fingerprint(&store, &e, &changed, none).unwrap_err().to_string();
        assert!(
            err.contains("parallelism 2, this pipeline runs with 4") && err.contains("allow_parallelism_change"),
            "a parallelism change has its own flag: {err}"
        );
        let parallelism = AllowedChanges {
            parallelism: true,
            ..none
        };
        check_fingerprint(&store, &e, &changed, parallelism).unwrap();
        changed.sink = "file:dir=/elsewhere".into();
        let err = check_fingerprint(&store, &e, &changed, parallelism)
            .unwrap_err()
            .to_string();
        assert!(err.contains("parallelism was `2`, is now `4`"), "{err}");
        assert!(err.contains("sink was `file:dir=/out`"), "{err}");
        assert!(err.contains("allow_fingerprint_change"), "{err}");
        let any = AllowedChanges { any: true, ..none };
        check_fingerprint(&store, &e, &changed, any).unwrap();
        check_fingerprint(&store, &e, &descriptor(), none).unwrap();
    }
}
