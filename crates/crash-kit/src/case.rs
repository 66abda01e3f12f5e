//! What the kit hands the author's command for one run of a crash case.

use std::path::PathBuf;

use exactly_core::Guarantee;

/// One crash case's folder and settings, the same for every run (killed or
/// not) of the case. The author's command must run the pipeline from
/// exactly these: its output under [`dir`](Case::dir), its checkpoints in
/// an `FsCheckpointStore` rooted at [`checkpoints`](Case::checkpoints),
/// with [`guarantee`](Case::guarantee).
#[derive(Clone, Debug)]
pub struct Case {
    /// The case's name (e.g. `after_persist_before_commit`).
    pub name: String,
    /// A fresh, empty folder the case owns: put the sink's output (a
    /// database file, a folder) and the pipeline file, if any, here.
    pub dir: PathBuf,
    /// `<dir>/checkpoints`: the root of the pipeline's checkpoint store.
    /// The kit looks here for half-written entries.
    pub checkpoints: PathBuf,
    /// The guarantee to run the pipeline with: exactly-once, or
    /// at-least-once for the negative control.
    pub guarantee: Guarantee,
}
