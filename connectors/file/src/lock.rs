//! One writer per output folder and pipeline.
//!
//! Recovery deletes the pipeline's pending files that its checkpoint does
//! not list. A second process of the same pipeline writing the same folder
//! (started with another checkpoint folder, so the checkpoint store's lock
//! does not see it) would delete the first one's pending files, and the two
//! would write the same checkpoint ids. So before a sink subtask touches the
//! folder it takes an OS lock (`flock`, exclusive, non-blocking) on
//! `.exactly-<pipeline>.lock` in it, and writes who holds it there (host,
//! pid, since when) for the refused process to name.
//!
//! The lock is held until the process exits: every subtask of every attempt
//! of the pipeline in this process shares it (a process-wide table, so an
//! in-process restart never leaves a gap in which another process could
//! take it). The kernel releases it however the process ends, SIGKILL
//! included, so a process that died leaves no stale lock.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use exactly_core::ConnectorError;

const CONTEXT: &str = "file sink: locking the output folder";

/// The name of the file in an output folder whose lock the process writing
/// it for `pipeline` holds: `.exactly-<pipeline>.lock`.
pub fn lock_file_name(pipeline: &str) -> String {
    format!(".exactly-{pipeline}.lock")
}

/// Locks held by this process: (output folder, pipeline) → the locked file.
static HELD: Mutex<Option<HashMap<(PathBuf, String), File>>> = Mutex::new(None);

/// Makes sure this process holds the lock of `pipeline` in `dir` (an
/// existing folder), taking it on first use. Blocking.
///
/// Fails with a fatal error naming the pipeline, the folder, the holder and
/// what to do when another process holds it.
pub(crate) fn hold(dir: &Path, pipeline: &str) -> Result<(), ConnectorError> {
    let path = dir.join(lock_file_name(pipeline));
    let folder = fs::canonicalize(dir).map_err(|e| io_error(dir, e))?;
    let key = (folder, pipeline.to_string());
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let held = held.get_or_insert_with(HashMap::new);
    if let Some(file) = held.get(&key) {
        // Still the file in the folder (not one of a folder deleted and
        // created again under the same name)?
        if same_file(file, &path) {
            return Ok(());
        }
        held.remove(&key);
    }
    let file = acquire(&path, pipeline, dir)?;
    tracing::info!(pipeline, lock = %path.display(), "holding the output folder's lock of the pipeline");
    held.insert(key, file);
    Ok(())
}

fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::metadata(path)) {
        (Ok(held), Ok(there)) => held.dev() == there.dev() && held.ino() == there.ino(),
        _ => false,
    }
}

/// Opens `path` and locks it, or says who holds it. A second call in the
/// same process conflicts with the first like another process would (flock
/// locks belong to open files).
pub(crate) fn acquire(path: &Path, pipeline: &str, dir: &Path) -> Result<File, ConnectorError> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "another process (it has not written its name yet)".to_string(),
                named => named.to_string(),
            };
            return Err(ConnectorError::fatal(
                CONTEXT,
                format!(
                    "pipeline `{pipeline}` already writes into {}: {holder} holds {}. Two processes of one \
                     pipeline must not write the same folder (each one's recovery would delete the other's \
                     pending files, and records would be duplicated or lost). Stop that process first, or wait \
                     until it ends (a process that died leaves no lock behind); to run an independent copy, \
                     give it another `name` or another `[sink.file] dir`",
                    dir.display(),
                    path.display()
                ),
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io_error(path, e)),
    }
    let since = humantime::format_rfc3339_seconds(SystemTime::now());
    let me = format!("process {} on host {} (since {since})", std::process::id(), host_name());
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(me.as_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error(path, e))?;
    Ok(file)
}

fn io_error(path: &Path, e: std::io::Error) -> ConnectorError {
    let message = format!("{}: {e}", path.display());
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => ConnectorError::fatal(
            CONTEXT,
            format!("{message} (give the pipeline write access to the folder)"),
        ),
        _ => ConnectorError::transient(CONTEXT, message),
    }
}

/// This machine's name, for the holder's description.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(lock_file_name("p"));
        let first = acquire(&path, "p", dir.path()).expect("the first lock");
        let err = acquire(&path, "p", dir.path()).unwrap_err();
        assert!(!err.is_retriable(), "{err}");
        let text = err.to_string();
        assert!(text.contains("pipeline `p` already writes into"), "{text}");
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        assert!(
            text.contains(&format!("process {} on host ", std::process::id())),
            "{text}"
        );
        assert!(text.contains("Stop that process first"), "{text}");
        drop(first);
        acquire(&path, "p", dir.path()).expect("free again once the holder let go");
    }

    #[test]
    fn the_process_holds_one_lock_per_folder_and_pipeline_for_its_life() {
        let dir = tempfile::tempdir().unwrap();
        hold(dir.path(), "p").expect("first subtask");
        hold(dir.path(), "p").expect("every other subtask and attempt of this process");
        let path = dir.path().join(lock_file_name("p"));
        let err = acquire(&path, "p", dir.path()).unwrap_err();
        assert!(err.to_string().contains("already writes into"), "{err}");
        hold(dir.path(), "q").expect("another pipeline has a lock of its own");
    }
}
