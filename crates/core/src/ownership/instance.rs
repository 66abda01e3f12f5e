//! One process per pipeline and store: the duty of every sink whose
//! recovery aborts what its pipeline owns, and the helper for it.
//!
//! Recovery aborts every transaction of the pipeline that the restored
//! checkpoint does not list. A second process of the same pipeline writing
//! the same store — started by mistake with another checkpoint folder, so
//! the checkpoint store's own lock does not see it — would abort the first
//! one's pending transactions (loss) and write every record again
//! (duplicates). A sink must refuse it. [`hold_instance_lock`] does it for
//! stores a process reaches through a file system: before a sink subtask
//! touches the store, it makes sure its process holds an OS lock (`flock`,
//! exclusive, non-blocking) on a lock file beside the store, which names
//! its holder (host, pid, since when) for the refused process to quote.
//! Stores of their own kind take their own lock instead (the PostgreSQL
//! sink's advisory lock, Kafka's producer fencing).
//!
//! The lock is held until the process exits, or until the pipeline's run
//! ends cleanly: every subtask of every attempt of the pipeline in this
//! process shares it (a process-wide table, so an in-process restart never
//! leaves a gap in which another process could take it). The kernel
//! releases it however the process ends, SIGKILL included, so a process
//! that died leaves no stale lock. A run that stopped cleanly (every region
//! after its final commits, every sink closed) lets its pipeline's locks go
//! before it hands the pipeline over, so a standby on the same machine is
//! not refused by a process that is only exiting.

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::ConnectorError;
use crate::file_lock::{self, FileLockError};

/// A lock this process holds: the pipelines of this process that asked
/// for it, and the locked file (one process, one holder).
type Held = (BTreeSet<String>, File);

/// Locks held by this process, by lock file.
static HELD: Mutex<Option<HashMap<PathBuf, Held>>> = Mutex::new(None);

/// Runs of each pipeline name going on in this process (see [`RunGuard`]).
static RUNNING: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

/// Makes sure this process holds the lock file `lock` for `pipeline`,
/// taking it on first use; every later call of this process returns at
/// once. Blocking (call it from `spawn_blocking` in async code). `store`
/// names the store in the error (`"the output folder /data/out"`), and
/// `independent_copy` says how to run a second, independent copy
/// (`"another [sink.file] dir"`).
///
/// Fails with a fatal error naming the pipeline, the store, the holder and
/// what to do when another process holds it; with a transient one when the
/// file cannot be opened for a reason that may pass.
pub fn hold_instance_lock(
    lock: &Path,
    pipeline: &str,
    store: &str,
    independent_copy: &str,
) -> Result<(), ConnectorError> {
    let parent = lock
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let folder = fs::canonicalize(parent).map_err(|e| io_error(lock, e))?;
    let key = folder.join(lock.file_name().unwrap_or_default());
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let held = held.get_or_insert_with(HashMap::new);
    if let Some((pipelines, file)) = held.get_mut(&key) {
        // Still the file there (not one of a folder deleted and created
        // again under the same name)?
        if same_file(file, lock) {
            pipelines.insert(pipeline.to_string());
            return Ok(());
        }
        held.remove(&key);
    }
    let file = acquire(lock, pipeline, store, independent_copy)?;
    tracing::info!(pipeline, lock = %lock.display(), "holding the store's lock of the pipeline");
    held.insert(key, (BTreeSet::from([pipeline.to_string()]), file));
    Ok(())
}

/// A run of a pipeline in this process, for the instance locks: while one
/// goes on, the locks its pipeline asked for stay held. Dropped, the run
/// ended without a clean stop and the locks stay until the process exits;
/// [`end_cleanly`](Self::end_cleanly) lets go of those no other run of this
/// process still needs.
#[derive(Debug)]
pub(crate) struct RunGuard {
    pipeline: Option<String>,
}

impl RunGuard {
    pub(crate) fn start(pipeline: &str) -> RunGuard {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        *running
            .get_or_insert_with(HashMap::new)
            .entry(pipeline.to_string())
            .or_default() += 1;
        RunGuard {
            pipeline: Some(pipeline.to_string()),
        }
    }

    /// The run stopped cleanly (every region after its final commits,
    /// every sink closed): unless another run of the same pipeline goes on
    /// in this process, the pipeline no longer needs its locks, and a lock
    /// that no other pipeline of this process asked for is let go.
    pub(crate) fn end_cleanly(mut self) {
        if let Some(pipeline) = self.pipeline.take() {
            if ended(&pipeline) == 0 {
                release_instance_locks(&pipeline);
            }
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if let Some(pipeline) = self.pipeline.take() {
            ended(&pipeline);
        }
    }
}

/// One run of `pipeline` ended; how many still go on.
fn ended(pipeline: &str) -> usize {
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    let running = running.get_or_insert_with(HashMap::new);
    let left = running.get(pipeline).map_or(0, |n| n.saturating_sub(1));
    if left == 0 {
        running.remove(pipeline);
    } else {
        running.insert(pipeline.to_string(), left);
    }
    left
}

/// `pipeline` no longer needs the locks [`hold_instance_lock`] took for it
/// in this process: those no other pipeline asked for are let go.
fn release_instance_locks(pipeline: &str) {
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(held) = held.as_mut() {
        held.retain(|lock, (pipelines, _)| {
            pipelines.remove(pipeline);
            let keep = !pipelines.is_empty();
            if !keep {
                tracing::debug!(pipeline, lock = %lock.display(), "letting the store's lock of the pipeline go");
            }
            keep
        });
    }
}

fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::metadata(path)) {
        (Ok(held), Ok(there)) => held.dev() == there.dev() && held.ino() == there.ino(),
        _ => false,
    }
}

/// Opens `lock` and locks it, or says who holds it. A second call in the
/// same process conflicts with the first like another process would
/// (flock locks belong to open files): [`hold_instance_lock`] keeps one.
fn acquire(lock: &Path, pipeline: &str, store: &str, independent_copy: &str) -> Result<File, ConnectorError> {
    match file_lock::lock_naming_holder(lock) {
        Ok(file) => Ok(file),
        Err(FileLockError::Held { holder }) => Err(ConnectorError::fatal(
            CONTEXT,
            format!(
                "pipeline `{pipeline}` already writes into {store}: {holder} holds {}. Two processes of one \
                 pipeline must not write the same store (each one's recovery would abort the other's pending \
                 transactions, and records would be duplicated or lost). Stop that process first, or wait \
                 until it ends (a process that died leaves no lock behind); to run an independent copy, give \
                 it another `name` or {independent_copy}",
                lock.display()
            ),
        )),
        Err(FileLockError::Io(e)) => Err(io_error(lock, e)),
    }
}

const CONTEXT: &str = "taking the store's lock of the pipeline";

fn io_error(path: &Path, e: std::io::Error) -> ConnectorError {
    let error = match e.kind() {
        std::io::ErrorKind::PermissionDenied => ConnectorError::fatal(
            CONTEXT,
            format!("{} (give the pipeline write access to its folder)", path.display()),
        ),
        _ => ConnectorError::transient(CONTEXT, path.display()),
    };
    error.caused_by(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_name_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join(".exactly-p.lock");
        let first = acquire(&lock, "p", "the folder x", "another dir").expect("the first lock");
        let err = acquire(&lock, "p", "the folder x", "another dir").unwrap_err();
        assert!(!err.is_retriable(), "{err}");
        let text = err.to_string();
        assert!(text.contains("pipeline `p` already writes into the folder x"), "{text}");
        assert!(
            text.contains(&format!("process {} on host ", std::process::id())),
            "{text}"
        );
        assert!(
            text.contains("Stop that process first") && text.contains("another dir"),
            "{text}"
        );
        drop(first);
        acquire(&lock, "p", "the folder x", "another dir").expect("free again once the holder let go");
    }

    #[test]
    fn the_process_holds_one_lock_per_file_and_pipeline_for_its_life() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("out.db.exactly-lock");
        hold_instance_lock(&lock, "p", "out.db", "another path").expect("first subtask");
        hold_instance_lock(&lock, "p", "out.db", "another path").expect("every other subtask and attempt");
        let err = acquire(&lock, "p", "out.db", "another path").unwrap_err();
        assert!(err.to_string().contains("already writes into out.db"), "{err}");
        let other = dir.path().join("other.lock");
        hold_instance_lock(&other, "q", "other", "x").expect("another lock file is another lock");
    }

    #[test]
    fn a_clean_end_lets_go_only_of_locks_no_other_run_or_pipeline_needs() {
        let dir = tempfile::tempdir().unwrap();
        let (mine, theirs, shared) = (
            dir.path().join("mine.lock"),
            dir.path().join("theirs.lock"),
            dir.path().join("shared.lock"),
        );
        let (p, q) = ("released-p", "kept-q");
        let first = RunGuard::start(p);
        let second = RunGuard::start(p);
        let other = RunGuard::start(q);
        hold_instance_lock(&mine, p, "mine", "x").unwrap();
        hold_instance_lock(&theirs, q, "theirs", "x").unwrap();
        hold_instance_lock(&shared, p, "shared", "x").unwrap();
        hold_instance_lock(&shared, q, "shared", "x").unwrap();
        let held = |lock: &Path| acquire(lock, "probe", "it", "x").is_err();
        first.end_cleanly();
        assert!(held(&mine), "another run of the pipeline still goes on");
        second.end_cleanly();
        assert!(!held(&mine), "let go once the last run ended cleanly");
        assert!(held(&theirs), "another pipeline's lock");
        assert!(held(&shared), "another pipeline asked for it too");
        drop(other);
        assert!(held(&shared), "a run that did not end cleanly keeps its locks");
    }
}
