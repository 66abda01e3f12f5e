//! Finding the checkpoint entry a kill left half-written: the temporary
//! file `FsCheckpointStore` writes an entry to (`.tmp-<fingerprint>-<unix-ms>-<id>`)
//! before the fsync and rename.

use std::path::Path;

/// The id of the entry named by the temporary file `name`, or `None` for
/// another file (the id watermark, committed-through, anything else).
fn entry_id_of_temp_file(name: &str) -> Option<u64> {
    let entry = name.strip_prefix(".tmp-")?;
    let fields: Vec<&str> = entry.split('-').collect();
    match fields[..] {
        [fingerprint, ms, id]
            if fingerprint.len() == 16
                && fingerprint.bytes().all(|b| b.is_ascii_hexdigit())
                && ms.parse::<u64>().is_ok() =>
        {
            id.parse().ok()
        }
        _ => None,
    }
}

/// The highest id of a half-written entry anywhere under `checkpoints`
/// (the pipeline's folder, its region folders).
pub(super) fn half_written_entry(checkpoints: &Path) -> Option<u64> {
    fn walk(dir: &Path, depth: usize, found: &mut Option<u64>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() && depth > 0 {
                walk(&path, depth - 1, found);
            } else if let Some(id) = entry_id_of_temp_file(&e.file_name().to_string_lossy()) {
                *found = (*found).max(Some(id));
            }
        }
    }
    let mut found = None;
    walk(checkpoints, 3, &mut found);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_entries_count() {
        assert_eq!(entry_id_of_temp_file(".tmp-0123456789abcdef-1700000000000-7"), Some(7));
        assert_eq!(entry_id_of_temp_file(".tmp-id-watermark"), None);
        assert_eq!(entry_id_of_temp_file(".tmp-committed-through"), None);
        assert_eq!(entry_id_of_temp_file("0123456789abcdef-1700000000000-7"), None);
        let dir = tempfile::tempdir().unwrap();
        let region = dir.path().join("p").join("region-1");
        std::fs::create_dir_all(&region).unwrap();
        assert_eq!(half_written_entry(dir.path()), None);
        std::fs::write(region.join(".tmp-0123456789abcdef-1700000000000-3"), b"{").unwrap();
        std::fs::write(region.join(".tmp-id-watermark"), b"1").unwrap();
        assert_eq!(half_written_entry(dir.path()), Some(3));
    }
}
