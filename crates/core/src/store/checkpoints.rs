//! One checkpoint sequence as the runtime (and the operator commands) use
//! it, on any [`SequenceStore`]: entries encoded and checked by the core,
//! the newest readable one, retention, setting unreadable ones aside, and
//! every write under the owner's epoch — a refused epoch becomes
//! [`StoreError::Fenced`].

use std::sync::Arc;

use tracing::error;

use super::contract::{Cas, Head, Listed, Marks, Removal, SequenceStore};
use super::entry::{CheckpointEntry, EntryName, EntryProblem, ProblemKind};
use crate::error::StoreError;
use crate::membership::Epoch;
use crate::record::CheckpointId;

/// A checkpoint sequence with its retention.
#[derive(Clone)]
pub struct Checkpoints {
    store: Arc<dyn SequenceStore>,
    retain: usize,
}

impl std::fmt::Debug for Checkpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoints")
            .field("location", &self.store.location())
            .field("retain", &self.retain)
            .finish()
    }
}

impl Checkpoints {
    /// The sequence `store`, keeping the newest `retain` entries (at least 1).
    pub fn new(store: Arc<dyn SequenceStore>, retain: usize) -> Self {
        Checkpoints {
            store,
            retain: retain.max(1),
        }
    }

    /// The store underneath.
    pub fn store(&self) -> &Arc<dyn SequenceStore> {
        &self.store
    }

    /// Where the entries live, for messages.
    pub fn location(&self) -> String {
        self.store.location()
    }

    pub(crate) fn fenced(&self, epoch: Epoch, current: Epoch) -> StoreError {
        StoreError::Fenced {
            location: self.location(),
            epoch,
            current,
        }
    }

    /// The sequence's head.
    pub async fn head(&self) -> Result<Head, StoreError> {
        Ok(self.store.head().await?)
    }

    /// Takes the sequence for `owner`: fences it at the epoch it has now,
    /// and returns the head under the new epoch. Every write of an older
    /// epoch that was ever accepted is visible to reads from now on; none is
    /// accepted any more. Fails with [`StoreError::Fenced`] when another
    /// owner fenced it in between.
    pub async fn take(&self, owner: &str) -> Result<Head, StoreError> {
        let head = self.store.head().await?;
        match self.store.fence(head.epoch, owner).await? {
            Cas::Done(head) => Ok(head),
            Cas::Moved(current) => Err(self.fenced(head.epoch, current)),
        }
    }

    /// Every entry, set aside or not, oldest first.
    pub async fn listed(&self) -> Result<Vec<Listed>, StoreError> {
        Ok(self.store.list().await?)
    }

    /// The entries (not set aside), oldest first, readable or not.
    pub async fn list(&self) -> Result<Vec<EntryName>, StoreError> {
        let listed = self.store.list().await?;
        Ok(listed.into_iter().filter(|l| !l.set_aside).map(|l| l.name).collect())
    }

    /// The entries set aside, oldest first.
    pub async fn set_aside_entries(&self) -> Result<Vec<EntryName>, StoreError> {
        let listed = self.store.list().await?;
        Ok(listed.into_iter().filter(|l| l.set_aside).map(|l| l.name).collect())
    }

    /// Reads and verifies the entry `name`; the error says why it cannot
    /// be used.
    pub async fn read(&self, name: &str) -> Result<CheckpointEntry, EntryProblem> {
        let problem = |kind| EntryProblem {
            location: self.location(),
            name: name.to_string(),
            kind,
        };
        match self.store.read(name).await {
            Ok(Some(bytes)) => CheckpointEntry::decode(&self.location(), name, &bytes),
            Ok(None) => Err(problem(ProblemKind::Gone)),
            Err(e) => Err(problem(ProblemKind::Access(e))),
        }
    }

    /// The newest readable entry (highest checkpoint id, then newest time),
    /// skipping unreadable ones (logged), or `None` when there is none. A
    /// store that cannot be read is an error, never a reason to fall back.
    pub async fn latest(&self) -> Result<Option<CheckpointEntry>, StoreError> {
        for name in self.list().await?.iter().rev() {
            let bytes = match self.store.read(&name.file_name).await? {
                Some(bytes) => bytes,
                // Pruned since the listing: an older one is next anyway.
                None => continue,
            };
            match CheckpointEntry::decode(&self.location(), &name.file_name, &bytes) {
                Ok(entry) => return Ok(Some(entry)),
                Err(problem) => error!(
                    %problem,
                    "skipping a corrupt checkpoint entry and falling back to an older one; \
                     if the corrupt one had completed, its commits may be replayed"
                ),
            }
        }
        Ok(None)
    }

    /// Stores `entry` under `epoch`: when this returns `Ok`, a crash cannot
    /// lose or tear it.
    pub async fn save(&self, epoch: Epoch, entry: &CheckpointEntry) -> Result<(), StoreError> {
        let bytes = entry.encode()?;
        match self.store.write(epoch, &entry.file_name(), bytes).await? {
            Cas::Done(()) => Ok(()),
            Cas::Moved(current) => Err(self.fenced(epoch, current)),
        }
    }

    /// Deletes the entries beyond the newest `retain` (never one set aside).
    pub async fn prune(&self, epoch: Epoch) -> Result<(), StoreError> {
        let names = self.list().await?;
        let excess = names.len().saturating_sub(self.retain);
        for name in &names[..excess] {
            if let Cas::Moved(current) = self.store.remove(epoch, &name.file_name, Removal::Delete).await? {
                return Err(self.fenced(epoch, current));
            }
        }
        Ok(())
    }

    /// Sets the entry `name` aside under `epoch` (kept for an operator, no
    /// longer an entry).
    pub async fn set_aside(&self, epoch: Epoch, name: &str) -> Result<(), StoreError> {
        match self.store.remove(epoch, name, Removal::SetAside).await? {
            Cas::Done(()) => Ok(()),
            Cas::Moved(current) => Err(self.fenced(epoch, current)),
        }
    }

    /// Durably records under `epoch` that checkpoint ids up to `upto` may be
    /// in use.
    pub async fn reserve_ids(&self, epoch: Epoch, upto: CheckpointId) -> Result<(), StoreError> {
        self.advance(
            epoch,
            Marks {
                id_watermark: Some(upto),
                ..Marks::default()
            },
        )
        .await
    }

    /// Durably records under `epoch` that every sink committed everything
    /// pending up to checkpoint `id` (never lowers the record).
    pub async fn record_committed(&self, epoch: Epoch, id: CheckpointId) -> Result<(), StoreError> {
        self.advance(
            epoch,
            Marks {
                committed_through: Some(id),
                ..Marks::default()
            },
        )
        .await
    }

    async fn advance(&self, epoch: Epoch, marks: Marks) -> Result<(), StoreError> {
        match self.store.advance(epoch, marks).await? {
            Cas::Done(_) => Ok(()),
            Cas::Moved(current) => Err(self.fenced(epoch, current)),
        }
    }
}
