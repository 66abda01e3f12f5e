//! One writer per output folder and pipeline.
//!
//! Recovery deletes the pipeline's pending files that its checkpoint does
//! not list. A second process of the same pipeline writing the same folder
//! (started with another checkpoint folder, so the checkpoint store's lock
//! does not see it) would delete the first one's pending files, and the two
//! would write the same checkpoint ids. So before a sink subtask touches the
//! folder its process holds the lock of `.exactly-<pipeline>.lock` in it
//! ([`exactly_core::hold_instance_lock`], the helper every connector author
//! gets: held until the process exits, shared by every subtask and attempt,
//! released by the kernel however the process ends).

use std::path::Path;

use exactly_core::ConnectorError;

/// The name of the file in an output folder whose lock the process writing
/// it for `pipeline` holds: `.exactly-<pipeline>.lock`.
pub fn lock_file_name(pipeline: &str) -> String {
    format!(".exactly-{pipeline}.lock")
}

/// Makes sure this process holds the lock of `pipeline` in `dir` (an
/// existing folder), taking it on first use. Blocking.
///
/// Fails with a fatal error naming the pipeline, the folder, the holder and
/// what to do when another process holds it.
pub(crate) fn hold(dir: &Path, pipeline: &str) -> Result<(), ConnectorError> {
    exactly_core::hold_instance_lock(
        &dir.join(lock_file_name(pipeline)),
        pipeline,
        &dir.display().to_string(),
        "another `[sink.file] dir`",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_holds_one_lock_per_folder_and_pipeline_for_its_life() {
        let dir = tempfile::tempdir().unwrap();
        hold(dir.path(), "p").expect("first subtask");
        hold(dir.path(), "p").expect("every other subtask and attempt of this process");
        let path = dir.path().join(lock_file_name("p"));
        let err = exactly_core::file_lock::lock_naming_holder(&path).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("process {} on host", std::process::id())),
            "{err}"
        );
        hold(dir.path(), "q").expect("another pipeline has a lock of its own");
    }
}
