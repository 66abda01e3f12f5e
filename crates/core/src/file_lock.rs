//! An exclusive OS lock on a file that names its holder, shared by the
//! checkpoint store (one process per checkpoint folder) and the file sink
//! (one process per output folder and pipeline).
//!
//! [`lock_naming_holder`] takes the lock without waiting — the standard
//! library's [`File::try_lock`], an `flock` on Unix, so a lock taken here
//! and one taken with `flock(2)` exclude each other and `/proc/locks`
//! shows it — and writes who holds it (process, host, since when) into the
//! file, for a refused process to name. The kernel releases the lock
//! however the holder ends, SIGKILL included: a process that died leaves
//! no stale lock. Locks belong to open files: a second open of the same
//! path in the same process conflicts with the first like another process
//! would.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::SystemTime;

/// Why [`lock_naming_holder`] did not take the lock.
#[derive(Debug, thiserror::Error)]
pub enum FileLockError {
    /// Another open file holds the lock.
    #[error("held by {holder}")]
    Held {
        /// Who, as the holder wrote it (or a sentence saying it has not
        /// written its name yet).
        holder: String,
    },
    /// Opening, locking or writing the file failed.
    #[error("cannot lock the file")]
    Io(#[source] std::io::Error),
}

/// Opens `path` (creating it), takes an exclusive lock on it without
/// waiting, and writes this process's description ([`holder`]) into it,
/// synced. The lock lasts as long as the returned file is open.
pub fn lock_naming_holder(path: &Path) -> Result<File, FileLockError> {
    lock_after(path).map(|(file, _)| file)
}

/// What [`mark_released_cleanly`] writes first into a lock file.
const RELEASED_CLEANLY: &str = "released cleanly by ";

/// As [`lock_naming_holder`], also telling whether the previous holder
/// marked its release clean ([`mark_released_cleanly`]) before it let go.
pub fn lock_after_holder(path: &Path) -> Result<(File, bool), FileLockError> {
    lock_after(path).map(|(file, previous)| (file, previous.starts_with(RELEASED_CLEANLY)))
}

/// Writes into the held lock `file` that its holder is letting go cleanly
/// (in place of its name, synced), for the next holder's
/// [`lock_after_holder`]. A holder that dies leaves its name instead.
pub fn mark_released_cleanly(mut file: &File) -> std::io::Result<()> {
    let at = humantime::format_rfc3339_seconds(SystemTime::now());
    let mark = format!(
        "{RELEASED_CLEANLY}process {} on host {} at {at}",
        std::process::id(),
        host_name()
    );
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(mark.as_bytes())?;
    file.sync_all()
}

/// Takes the lock, returning the file and what it held before.
fn lock_after(path: &Path) -> Result<(File, String), FileLockError> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(FileLockError::Io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "another process (it has not written its name yet)".to_string(),
                named => named.to_string(),
            };
            return Err(FileLockError::Held { holder });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(FileLockError::Io(e)),
    }
    let mut previous = String::new();
    // A file that is not text was written by nothing of ours: no mark.
    let _ = file.read_to_string(&mut previous);
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(holder().as_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(FileLockError::Io)?;
    Ok((file, previous))
}

/// This process as a lock holder names itself: `process <pid> on host
/// <name> (since <RFC 3339 time>)`.
pub fn holder() -> String {
    let since = humantime::format_rfc3339_seconds(SystemTime::now());
    format!("process {} on host {} (since {since})", std::process::id(), host_name())
}

/// This machine's host name (`unknown` when the system gives none).
pub fn host_name() -> String {
    let name = gethostname::gethostname();
    match name.to_string_lossy() {
        name if name.is_empty() => "unknown".to_string(),
        name => name.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_is_refused_with_the_first_holders_name_until_it_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let first = lock_naming_holder(&path).expect("the first lock");
        match lock_naming_holder(&path) {
            Err(FileLockError::Held { holder }) => assert!(
                holder.starts_with(&format!("process {} on host ", std::process::id())),
                "{holder}"
            ),
            other => panic!("{other:?}"),
        }
        drop(first);
        lock_naming_holder(&path).expect("free again once the holder let go");
    }

    #[test]
    fn only_a_release_marked_clean_reads_as_clean_to_the_next_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let (first, clean) = lock_after_holder(&path).expect("the first lock");
        assert!(!clean, "nobody held it before");
        mark_released_cleanly(&first).unwrap();
        match lock_naming_holder(&path) {
            Err(FileLockError::Held { holder }) => assert!(holder.starts_with(RELEASED_CLEANLY), "{holder}"),
            other => panic!("still held until the file closes: {other:?}"),
        }
        drop(first);
        let (second, clean) = lock_after_holder(&path).unwrap();
        assert!(clean, "the previous holder marked its release");
        // This holder dies without marking: its name stays in the file.
        drop(second);
        let (_third, clean) = lock_after_holder(&path).unwrap();
        assert!(!clean, "a holder that did not mark its release did not release cleanly");
    }

    #[test]
    fn the_host_name_is_the_systems() {
        let name = host_name();
        assert!(!name.is_empty() && !name.contains('\0'), "{name:?}");
    }
}
