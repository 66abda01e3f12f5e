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

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::ConnectorError;
use crate::file_lock::{self, FileLockError};

/// Locks held by this process: lock file → the locked file (whatever
/// pipeline of this process took it first: one process, one holder).
static HELD: Mutex<Option<HashMap<PathBuf, (String, File)>>> = Mutex::new(None);

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
    if let Some((_, file)) = held.get(&key) {
        // Still the file there (not one of a folder deleted and created
        // again under the same name)?
        if same_file(file, lock) {
            return Ok(());
        }
        held.remove(&key);
    }
    let file = acquire(lock, pipeline, store, independent_copy)?;
    tracing::info!(pipeline, lock = %lock.display(), "holding the store's lock of the pipeline");
    held.insert(key, (pipeline.to_string(), file));
    Ok(())
}

/// Lets go of the locks [`hold_instance_lock`] took for `pipeline` in this
/// process. The runtime calls it when a run of `pipeline` stopped cleanly,
/// when none of its sinks acts any more.
pub(crate) fn release_instance_locks(pipeline: &str) {
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(held) = held.as_mut() {
        held.retain(|lock, (of, _)| {
            let keep = of != pipeline;
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
    fn a_clean_end_lets_go_of_its_pipelines_locks_only() {
        let dir = tempfile::tempdir().unwrap();
        let (mine, theirs) = (dir.path().join("mine.lock"), dir.path().join("theirs.lock"));
        hold_instance_lock(&mine, "released-p", "mine", "x").unwrap();
        hold_instance_lock(&theirs, "kept-q", "theirs", "x").unwrap();
        release_instance_locks("released-p");
        drop(acquire(&mine, "released-p", "mine", "x").expect("let go"));
        let err = acquire(&theirs, "kept-q", "theirs", "x").unwrap_err();
        assert!(err.to_string().contains("already writes into theirs"), "{err}");
    }
}
