//! The folder store: one folder per pipeline under the store root, one per
//! region inside it, one file per entry, written atomically (temporary
//! file, fsync, rename, fsync of the folder):
//!
//! ```text
//! /var/lib/exactly/checkpoints/orders-to-pg/region-0/9c87f7685fe0947a-1522439833113-4048
//! ```
//!
//! Besides the entries a sequence's folder holds `id-watermark` and
//! `committed-through`; the pipeline's folder holds `layout`, `lock` and
//! what layout changes set aside (`retired-…`). Unreadable entries set
//! aside are renamed `<entry>.unreadable`.
//!
//! Epochs: one process runs a pipeline on a folder (it holds the folder's
//! `flock`), so the epochs live in that process's memory, shared by every
//! handle on the same folder; a sequence's write, advance and fence take
//! one mutex, so a fence waits for a write in progress. No file records
//! them, and a folder on a shared mount is not a store for several
//! processes (use the PostgreSQL store).
//!
//! What a failure says: everything before an entry's rename certainly had
//! no effect (the temporary file is not an entry); a failed fsync of the
//! folder after the rename may or may not have kept it.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::access::AccessError;
use super::contract::{Cas, CheckpointStore, Head, Layout, Listed, Marks, Removal, Scope, SequenceStore, StoreLock};
use super::entry::{CheckpointEntry, EntryName, EntryProblem, ProblemKind};
use super::{
    COMMITTED_THROUGH_FILE, ID_WATERMARK_FILE, LAYOUT_FILE, LOCK_FILE, QUARANTINE_SUFFIX, REGION_PREFIX, RETIRED_PREFIX,
};
use crate::error::StoreError;
use crate::membership::Epoch;
use crate::record::CheckpointId;

/// A sequence's epoch in this process.
#[derive(Debug, Default)]
struct Fence {
    epoch: Epoch,
    owner: Option<String>,
}

/// The epochs of every folder this process uses, shared by all handles on
/// one folder (kept while a handle lives).
fn fence_of(dir: &Path) -> Arc<Mutex<Fence>> {
    static FOLDERS: OnceLock<Mutex<HashMap<PathBuf, Weak<Mutex<Fence>>>>> = OnceLock::new();
    let key = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut folders = FOLDERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(fence) = folders.get(&key).and_then(Weak::upgrade) {
        return fence;
    }
    folders.retain(|_, fence| fence.strong_count() > 0);
    let fence = Arc::new(Mutex::new(Fence::default()));
    folders.insert(key, Arc::downgrade(&fence));
    fence
}

/// One sequence's folder and the synchronous operations on it.
#[derive(Clone, Debug)]
struct Folder {
    dir: PathBuf,
    fence: Arc<Mutex<Fence>>,
}

impl Folder {
    fn new(dir: PathBuf) -> Folder {
        Folder {
            fence: fence_of(&dir),
            dir,
        }
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn determinate(&self, operation: &str, e: impl Into<crate::error::BoxError>) -> AccessError {
        AccessError::determinate(self.location(), operation, e)
    }

    fn fence_state(&self) -> std::sync::MutexGuard<'_, Fence> {
        self.fence.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The names `parse` reads from the folder's file names, oldest first
    /// (none when the folder does not exist).
    fn names(&self, parse: impl Fn(&str) -> Option<EntryName>) -> Result<Vec<EntryName>, AccessError> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.determinate("listing entries", e)),
        };
        let mut names = rd
            .flatten()
            .filter_map(|e| parse(&e.file_name().to_string_lossy()))
            .collect::<Vec<_>>();
        EntryName::sort(&mut names);
        Ok(names)
    }

    fn entries(&self) -> Result<Vec<EntryName>, AccessError> {
        self.names(EntryName::parse)
    }

    fn set_aside(&self) -> Result<Vec<EntryName>, AccessError> {
        self.names(|name| EntryName::parse(name.strip_suffix(QUARANTINE_SUFFIX)?))
    }

    fn list(&self) -> Result<Vec<Listed>, AccessError> {
        let live = self
            .entries()?
            .into_iter()
            .map(|name| Listed { name, set_aside: false });
        let aside = self
            .set_aside()?
            .into_iter()
            .map(|name| Listed { name, set_aside: true });
        let mut listed: Vec<Listed> = live.chain(aside).collect();
        listed.sort_by_key(|l| (l.name.id, l.name.created_unix_ms, l.set_aside));
        Ok(listed)
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, AccessError> {
        match fs::read(self.dir.join(name)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.determinate(&format!("reading {name}"), e)),
        }
    }

    /// A file of the folder holding one checkpoint id; `None` when it does
    /// not exist.
    fn read_id_file(&self, name: &str) -> Result<Option<CheckpointId>, AccessError> {
        match fs::read_to_string(self.dir.join(name)) {
            Ok(text) => text
                .trim()
                .parse()
                .map(|n| Some(CheckpointId(n)))
                .map_err(|e| self.determinate(&format!("reading {name}"), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.determinate(&format!("reading {name}"), e)),
        }
    }

    fn head_with(&self, fence: &Fence) -> Result<Head, AccessError> {
        Ok(Head {
            epoch: fence.epoch,
            owner: fence.owner.clone(),
            id_watermark: self.read_id_file(ID_WATERMARK_FILE)?,
            committed_through: self.read_id_file(COMMITTED_THROUGH_FILE)?,
        })
    }

    fn head(&self) -> Result<Head, AccessError> {
        let fence = self.fence_state();
        self.head_with(&fence)
    }

    fn fence(&self, expected: Epoch, owner: &str) -> Result<Cas<Head>, AccessError> {
        let mut fence = self.fence_state();
        if fence.epoch != expected {
            return Ok(Cas::Moved(fence.epoch));
        }
        fence.epoch = expected.next();
        fence.owner = Some(owner.to_string());
        self.head_with(&fence).map(Cas::Done)
    }

    fn advance(&self, epoch: Epoch, marks: Marks) -> Result<Cas<Head>, AccessError> {
        let fence = self.fence_state();
        if fence.epoch != epoch {
            return Ok(Cas::Moved(fence.epoch));
        }
        for (file, mark) in [
            (ID_WATERMARK_FILE, marks.id_watermark),
            (COMMITTED_THROUGH_FILE, marks.committed_through),
        ] {
            let Some(mark) = mark else { continue };
            if self.read_id_file(file)?.is_some_and(|recorded| recorded >= mark) {
                continue;
            }
            self.write_atomically(file, mark.0.to_string().as_bytes(), false)?;
        }
        self.head_with(&fence).map(Cas::Done)
    }

    fn write(&self, epoch: Epoch, name: &str, bytes: &[u8]) -> Result<Cas<()>, AccessError> {
        let fence = self.fence_state();
        if fence.epoch != epoch {
            return Ok(Cas::Moved(fence.epoch));
        }
        self.write_atomically(name, bytes, true)?;
        drop(fence);
        self.sweep_temporary_entries(name);
        Ok(Cas::Done(()))
    }

    /// Removes what crashed writers of entries left (`.tmp-<entry>`), except
    /// the entry just written. Best effort.
    fn sweep_temporary_entries(&self, written: &str) {
        let Ok(rd) = fs::read_dir(&self.dir) else { return };
        for e in rd.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let is_stale_entry = file
                .strip_prefix(".tmp-")
                .is_some_and(|name| name != written && EntryName::parse(name).is_some());
            if is_stale_entry {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    fn remove(&self, epoch: Epoch, name: &str, how: Removal) -> Result<Cas<()>, AccessError> {
        let fence = self.fence_state();
        if fence.epoch != epoch {
            return Ok(Cas::Moved(fence.epoch));
        }
        let from = self.dir.join(name);
        match how {
            Removal::Delete => match fs::remove_file(&from) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.determinate(&format!("deleting {name}"), e)),
            },
            Removal::SetAside => self.quarantine(name)?,
        }
        Ok(Cas::Done(()))
    }

    /// Renames the entry `name` to `<name>.unreadable`, unconditionally.
    fn quarantine(&self, name: &str) -> Result<(), AccessError> {
        let from = self.dir.join(name);
        let to = self.dir.join(format!("{name}{QUARANTINE_SUFFIX}"));
        match fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => return Ok(()),
            Err(e) => return Err(self.determinate(&format!("setting {name} aside"), e)),
        }
        self.sync_folder(&format!("setting {name} aside"))
    }

    /// fsync of the folder after a rename in it: the rename happened, so a
    /// failure leaves it unknown whether it survives a crash.
    fn sync_folder(&self, operation: &str) -> Result<(), AccessError> {
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| AccessError::indeterminate(self.location(), operation, e))
    }

    /// temp file, fsync, rename, fsync of the folder. `entry`: a checkpoint
    /// entry (its own crash point beside the one every write reaches).
    fn write_atomically(&self, name: &str, bytes: &[u8], entry: bool) -> Result<(), AccessError> {
        let operation = format!("writing {name}");
        let failed = |e: std::io::Error| self.determinate(&operation, e);
        if !self.dir.exists() {
            fs::create_dir_all(&self.dir).map_err(failed)?;
            // Make the new folder itself durable in its parent.
            if let Some(parent) = self.dir.parent() {
                fs::File::open(parent).and_then(|d| d.sync_all()).map_err(failed)?;
            }
        }
        let tmp = self.dir.join(format!(".tmp-{name}"));
        {
            let mut f = fs::File::create(&tmp).map_err(failed)?;
            f.write_all(bytes).map_err(failed)?;
            crate::fault::point("store.before_fsync");
            if entry {
                crate::fault::point("store.before_fsync_entry");
            }
            f.sync_all().map_err(failed)?;
        }
        fs::rename(&tmp, self.dir.join(name)).map_err(failed)?;
        self.sync_folder(&operation)
    }
}

/// A sequence of the folder store.
#[derive(Clone, Debug)]
struct FsSequence(Folder);

/// Runs `call` on `folder` from a blocking thread.
async fn blocking<T: Send + 'static>(
    folder: &Folder,
    call: impl FnOnce(&Folder) -> Result<T, AccessError> + Send + 'static,
) -> Result<T, AccessError> {
    let folder = folder.clone();
    let location = folder.location();
    tokio::task::spawn_blocking(move || call(&folder))
        .await
        .unwrap_or_else(|joined| Err(AccessError::indeterminate(location, "a store call", joined)))
}

#[async_trait]
impl SequenceStore for FsSequence {
    fn location(&self) -> String {
        self.0.location()
    }

    async fn head(&self) -> Result<Head, AccessError> {
        blocking(&self.0, Folder::head).await
    }

    async fn fence(&self, expected: Epoch, owner: &str) -> Result<Cas<Head>, AccessError> {
        let owner = owner.to_string();
        blocking(&self.0, move |f| f.fence(expected, &owner)).await
    }

    async fn advance(&self, epoch: Epoch, marks: Marks) -> Result<Cas<Head>, AccessError> {
        blocking(&self.0, move |f| f.advance(epoch, marks)).await
    }

    async fn list(&self) -> Result<Vec<Listed>, AccessError> {
        blocking(&self.0, Folder::list).await
    }

    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>, AccessError> {
        let name = name.to_string();
        blocking(&self.0, move |f| f.read(&name)).await
    }

    async fn write(&self, epoch: Epoch, name: &str, bytes: Vec<u8>) -> Result<Cas<()>, AccessError> {
        let name = name.to_string();
        blocking(&self.0, move |f| f.write(epoch, &name, &bytes)).await
    }

    async fn remove(&self, epoch: Epoch, name: &str, how: Removal) -> Result<Cas<()>, AccessError> {
        let name = name.to_string();
        blocking(&self.0, move |f| f.remove(epoch, &name, how)).await
    }
}

/// [`CheckpointStore`] on a local (or mounted) filesystem.
#[derive(Clone, Debug)]
pub struct FsCheckpointStore {
    /// The pipeline's folder (which holds the global sequence).
    folder: Folder,
    retain: usize,
}

impl FsCheckpointStore {
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
            folder: Folder::new(root.as_ref().join(pipeline)),
            retain: retain.max(1),
        }
    }

    /// The pipeline's folder.
    pub fn dir(&self) -> &Path {
        &self.folder.dir
    }

    /// The folder, for messages.
    pub fn location(&self) -> String {
        self.folder.location()
    }

    /// Region `region`'s folder as a store of its own (for reading it).
    pub fn region(&self, region: usize) -> FsCheckpointStore {
        FsCheckpointStore {
            folder: Folder::new(self.folder.dir.join(format!("{REGION_PREFIX}{region}"))),
            retain: self.retain,
        }
    }

    fn pipeline_name(&self) -> String {
        let dir = &self.folder.dir;
        dir.file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned())
    }

    /// The folder's entry names, oldest first, including ones that may be
    /// corrupt (not those set aside).
    pub fn list(&self) -> Result<Vec<EntryName>, AccessError> {
        self.folder.entries()
    }

    /// The names of the entries set aside (`<name>.unreadable`), oldest
    /// first.
    pub fn quarantined(&self) -> Result<Vec<EntryName>, AccessError> {
        self.folder.set_aside()
    }

    /// Reads and verifies the entry `name`; the error says why it cannot be
    /// used.
    pub fn read(&self, name: &str) -> Result<CheckpointEntry, EntryProblem> {
        let location = self.location();
        match self.folder.read(name) {
            Ok(Some(bytes)) => CheckpointEntry::decode(&location, name, &bytes),
            Ok(None) => Err(EntryProblem {
                location,
                name: name.to_string(),
                kind: ProblemKind::Gone,
            }),
            Err(e) => Err(EntryProblem {
                location,
                name: name.to_string(),
                kind: ProblemKind::Access(e),
            }),
        }
    }

    /// The newest readable entry of the folder, skipping unreadable ones.
    pub fn latest(&self) -> Result<Option<CheckpointEntry>, AccessError> {
        for name in self.list()?.iter().rev() {
            match self.read(&name.file_name) {
                Ok(entry) => return Ok(Some(entry)),
                Err(EntryProblem {
                    kind: ProblemKind::Access(e),
                    ..
                }) => return Err(e),
                Err(_) => continue,
            }
        }
        Ok(None)
    }

    /// The folder's id watermark.
    pub fn id_watermark(&self) -> Result<Option<CheckpointId>, AccessError> {
        self.folder.read_id_file(ID_WATERMARK_FILE)
    }

    /// The folder's committed-through record.
    pub fn committed_through(&self) -> Result<Option<CheckpointId>, AccessError> {
        self.folder.read_id_file(COMMITTED_THROUGH_FILE)
    }

    /// Sets the entry `name` aside (`<name>.unreadable`), whatever the
    /// epoch: for tests and operators.
    pub fn quarantine(&self, name: &str) -> Result<(), AccessError> {
        self.folder.quarantine(name)
    }

    /// The regions that have a folder, lowest first.
    pub fn regions(&self) -> Result<Vec<usize>, AccessError> {
        let rd = match fs::read_dir(&self.folder.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.folder.determinate("listing regions", e)),
        };
        let mut regions: Vec<usize> = rd
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str()?.strip_prefix(REGION_PREFIX)?.parse().ok())
            .collect();
        regions.sort_unstable();
        Ok(regions)
    }

    fn read_layout(&self) -> Result<Option<Layout>, AccessError> {
        match fs::read(self.folder.dir.join(LAYOUT_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| self.folder.determinate("reading the layout", e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.folder.determinate("reading the layout", e)),
        }
    }

    fn record_layout_sync(
        &self,
        expected: Option<Layout>,
        layout: Layout,
    ) -> Result<Cas<(), Option<Layout>>, AccessError> {
        // The pipeline's folder's mutex orders layout records too.
        let _one_at_a_time = self.folder.fence_state();
        let recorded = self.read_layout()?;
        if recorded != expected {
            return Ok(Cas::Moved(recorded));
        }
        let bytes = serde_json::to_vec_pretty(&layout).expect("a layout serializes");
        self.folder.write_atomically(LAYOUT_FILE, &bytes, false)?;
        Ok(Cas::Done(()))
    }

    fn retire_sync(&self, scope: Scope) -> Result<(), AccessError> {
        let dir = &self.folder.dir;
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let failed = |e: std::io::Error| self.folder.determinate(&format!("setting {scope} aside"), e);
        let sequence = match scope {
            Scope::Global => self.folder.clone(),
            Scope::Region(r) => Folder::new(dir.join(format!("{REGION_PREFIX}{r}"))),
        };
        let mut fence = sequence.fence_state();
        fence.epoch = fence.epoch.next();
        fence.owner = None;
        match scope {
            Scope::Region(r) => {
                let from = dir.join(format!("{REGION_PREFIX}{r}"));
                if from.exists() {
                    let to = dir.join(format!("{RETIRED_PREFIX}{stamp}-{REGION_PREFIX}{r}"));
                    fs::rename(&from, &to).map_err(failed)?;
                }
            }
            Scope::Global => {
                let to = dir.join(format!("{RETIRED_PREFIX}{stamp}-global"));
                let mut moved = self.list()?.into_iter().map(|n| n.file_name).collect::<Vec<_>>();
                moved.extend([ID_WATERMARK_FILE.to_string(), COMMITTED_THROUGH_FILE.to_string()]);
                for name in moved {
                    let from = dir.join(&name);
                    if from.exists() {
                        fs::create_dir_all(&to).map_err(failed)?;
                        fs::rename(&from, to.join(&name)).map_err(failed)?;
                    }
                }
            }
        }
        drop(fence);
        self.folder.sync_folder(&format!("setting {scope} aside"))
    }

    /// An exclusive OS lock (`flock`) on [`LOCK_FILE`], which then holds
    /// the holder's host, pid and start time (read by a refused process).
    /// The kernel releases the lock when the holder's file closes, however
    /// the holder ends. A clean release writes its mark into the file in
    /// place of the name (see [`crate::file_lock::mark_released_cleanly`]).
    fn lock_sync(&self) -> Result<StoreLock, StoreError> {
        let dir = &self.folder.dir;
        let failed = |e: std::io::Error| StoreError::Access(self.folder.determinate("locking the pipeline", e));
        fs::create_dir_all(dir).map_err(failed)?;
        match crate::file_lock::lock_after_holder(&dir.join(LOCK_FILE)) {
            Ok((file, previous_clean)) => {
                let mark = LockFile(Arc::new(file.try_clone().map_err(failed)?), self.folder.clone());
                Ok(StoreLock::new(file).handing_over(mark, previous_clean))
            }
            Err(crate::file_lock::FileLockError::Held { holder }) => Err(StoreError::Locked {
                pipeline: self.pipeline_name(),
                dir: dir.display().to_string(),
                holder,
            }),
            Err(crate::file_lock::FileLockError::Io(e)) => Err(failed(e)),
        }
    }
}

/// The lock file of a held [`FsCheckpointStore::lock`] (a second handle on
/// the open file that holds the `flock`), to mark a clean release in.
struct LockFile(Arc<fs::File>, Folder);

#[async_trait]
impl super::contract::HandOver for LockFile {
    async fn record_clean_release(&self) -> Result<(), AccessError> {
        let file = self.0.clone();
        let folder = self.1.clone();
        tokio::task::spawn_blocking(move || {
            crate::file_lock::mark_released_cleanly(&file)
                .map_err(|e| folder.determinate("marking the pipeline's lock released cleanly", e))
        })
        .await
        .expect("the mark does not panic")
    }
}

#[async_trait]
impl CheckpointStore for FsCheckpointStore {
    fn location(&self) -> String {
        self.folder.location()
    }

    fn retain(&self) -> usize {
        self.retain
    }

    fn sequence(&self, scope: Scope) -> Arc<dyn SequenceStore> {
        let folder = match scope {
            Scope::Global => self.folder.clone(),
            Scope::Region(r) => Folder::new(self.folder.dir.join(format!("{REGION_PREFIX}{r}"))),
        };
        Arc::new(FsSequence(folder))
    }

    async fn regions(&self) -> Result<Vec<usize>, AccessError> {
        let store = self.clone();
        blocking(&self.folder, move |_| store.regions()).await
    }

    async fn layout(&self) -> Result<Option<Layout>, AccessError> {
        let store = self.clone();
        blocking(&self.folder, move |_| store.read_layout()).await
    }

    async fn record_layout(
        &self,
        expected: Option<Layout>,
        layout: Layout,
    ) -> Result<Cas<(), Option<Layout>>, AccessError> {
        let store = self.clone();
        blocking(&self.folder, move |_| store.record_layout_sync(expected, layout)).await
    }

    async fn retire(&self, scope: Scope) -> Result<(), AccessError> {
        let store = self.clone();
        blocking(&self.folder, move |_| store.retire_sync(scope)).await
    }

    async fn lock(&self) -> Result<StoreLock, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.lock_sync())
            .await
            .expect("the lock task does not panic")
    }
}

#[cfg(test)]
mod tests;
