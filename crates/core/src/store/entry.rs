//! What a checkpoint entry is, whatever store keeps it: its name
//! (`<fingerprint>-<unix-ms>-<checkpoint-id>`), its JSON envelope with a
//! SHA-256 checksum of the entry, and why one that cannot be used cannot.
//! Stores keep the envelope's bytes under the name; encoding and checking
//! happen here, once, for every store.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::coordinator::CheckpointData;
use crate::error::StoreError;
use crate::record::CheckpointId;
use crate::store::AccessError;

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
    /// [`crate::Transform::identity`] of each transform, in order. Left out
    /// of the JSON when empty, so a pipeline without transforms keeps the
    /// fingerprint it had before transforms existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transforms: Vec<String>,
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
        cmp(
            "transforms",
            &other.transforms.join(" | "),
            &self.transforms.join(" | "),
        );
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

    /// The entry's name: `<fingerprint>-<unix-ms>-<checkpoint-id>`.
    pub fn file_name(&self) -> String {
        format!("{}-{}-{}", self.fingerprint, self.created_unix_ms, self.checkpoint.id)
    }

    /// The bytes a store keeps: the envelope (format, checksum, entry) as
    /// pretty JSON, readable with `cat` or `psql`.
    pub fn encode(&self) -> Result<Vec<u8>, StoreError> {
        let env = Envelope {
            format: 1,
            sha256: checksum(self),
            entry: self.clone(),
        };
        serde_json::to_vec_pretty(&env).map_err(|e| StoreError::Encode {
            checkpoint: self.checkpoint.id,
            source: e,
        })
    }

    /// Reads the bytes a store kept under `name` in `location`, checking
    /// the envelope, the checksum and that the entry is the one the name
    /// says.
    pub fn decode(location: &str, name: &str, bytes: &[u8]) -> Result<CheckpointEntry, EntryProblem> {
        let problem = |kind| EntryProblem {
            location: location.to_string(),
            name: name.to_string(),
            kind,
        };
        let env: Envelope = serde_json::from_slice(bytes).map_err(|e| problem(ProblemKind::NotAnEntry(e)))?;
        if checksum(&env.entry) != env.sha256 {
            return Err(problem(ProblemKind::Checksum));
        }
        if env.entry.file_name() != name {
            return Err(problem(ProblemKind::WrongName(env.entry.file_name())));
        }
        Ok(env.entry)
    }
}

/// The stored envelope: the entry plus a checksum of its canonical encoding.
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
    /// The whole name (a file's name in the folder store).
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

    /// Sorts names the way entries are ordered: by checkpoint id, then time.
    pub fn sort(names: &mut [EntryName]) {
        names.sort_by_key(|n| (n.id, n.created_unix_ms));
    }
}

/// Why an entry cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("entry {name} in {location} {kind}")]
pub struct EntryProblem {
    /// Where the entries live.
    pub location: String,
    /// The entry's name.
    pub name: String,
    /// What is wrong with it.
    #[source]
    pub kind: ProblemKind,
}

/// What is wrong with an entry.
#[derive(Debug, thiserror::Error)]
pub enum ProblemKind {
    /// It is not there (pruned, deleted or set aside since it was listed).
    #[error("is gone")]
    Gone,
    /// The store could not be read.
    #[error("cannot be read: {0}")]
    Access(#[source] AccessError),
    /// Its bytes are not an entry's envelope (truncated, not JSON, another
    /// format).
    #[error("is not a checkpoint entry: {0}")]
    NotAnEntry(#[source] serde_json::Error),
    /// The entry does not match its checksum (a flipped byte).
    #[error("fails its checksum")]
    Checksum,
    /// The envelope holds another entry than its name says.
    #[error("holds entry {0}")]
    WrongName(String),
}
