//! Externalized checkpoints: one sequence of entries per region (or one for
//! global failover), each entry named `<fingerprint>-<unix-ms>-<checkpoint-id>`,
//! self-describing JSON with a SHA-256 checksum.
//!
//! - [`contract`]: what a store guarantees — [`CheckpointStore`] and
//!   [`SequenceStore`], compare-and-set on the owner's [`Epoch`](crate::membership::Epoch),
//!   errors that say whether a call may have taken effect ([`AccessError`]);
//! - [`entry`]: names, the envelope and its checksum, why an entry is unreadable;
//! - [`Checkpoints`]: a sequence as the runtime uses it (latest, retention,
//!   setting aside, writes under an epoch);
//! - [`FsCheckpointStore`]: the folder store, the default for one machine;
//! - [`conformance`]: checks any store against the contract (the stores'
//!   own tests run them).
//!
//! Another store (the PostgreSQL one, in its own crate) implements the two
//! traits; the core knows nothing of it.

mod access;
mod checkpoints;
pub mod conformance;
pub mod contract;
pub mod entry;
mod fingerprint;
mod fs;

pub use access::AccessError;
pub use checkpoints::Checkpoints;
pub use contract::{
    Cas, CheckpointStore, HandOver, Head, Layout, Listed, Marks, Removal, Scope, SequenceStore, StoreLock,
};
pub use entry::{CheckpointEntry, EntryName, EntryProblem, PipelineDescriptor, ProblemKind};
pub use fingerprint::{check_fingerprint, AllowedChanges};
pub use fs::FsCheckpointStore;

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

/// Who this process is, for owners and lock holders:
/// `process <pid> on host <host> (since <its first call>)`.
pub fn this_process() -> String {
    static ME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ME.get_or_init(crate::file_lock::holder).clone()
}
