//! # exactly-file
//!
//! A real two-phase-commit file sink.
//!
//! Every transaction writes a hidden pending file
//! `.part-<subtask>-<checkpoint>-<run>.pending` in the output folder:
//!
//! - `pre_commit` flushes and fsyncs it and returns its name (the committable);
//! - `commit` renames it to `part-<subtask>-<checkpoint>-<run>.<ext>` atomically
//!   and fsyncs the folder — idempotent: a file already renamed is success;
//! - `abort` deletes it;
//! - `recover` finishes the renames the checkpoint lists and deletes every other
//!   pending file of the subtask (left over by a crash).
//!
//! Readers only ever see complete files whose checkpoint completed. `<run>` is a
//! random tag per sink instance, so a checkpoint id reused after a rollback can
//! never overwrite an earlier committed file.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use exactly_core::{
    erase, CheckpointId, ConnectorError, ErasedSink, Record, SinkContext, SinkFactory, TwoPhaseCommitSink,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

/// How records are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileFormat {
    /// The raw value bytes followed by `\n`.
    #[default]
    Lines,
    /// One JSON object per line: split, offset, key, value (UTF-8, lossy), timestamp.
    JsonLines,
}

impl FileFormat {
    fn extension(self) -> &'static str {
        match self {
            FileFormat::Lines => "txt",
            FileFormat::JsonLines => "jsonl",
        }
    }

    fn encode(self, record: &Record, out: &mut Vec<u8>) {
        match self {
            FileFormat::Lines => out.extend_from_slice(&record.value),
            FileFormat::JsonLines => {
                let line = serde_json::json!({
                    "split": record.split,
                    "offset": record.offset,
                    "key": record.key.as_deref().map(String::from_utf8_lossy),
                    "value": String::from_utf8_lossy(&record.value),
                    "timestamp_ms": record.timestamp_ms,
                });
                out.extend_from_slice(line.to_string().as_bytes());
            }
        }
        out.push(b'\n');
    }
}

/// Creates [`FileSink`] subtasks writing into `dir`.
#[derive(Clone, Debug)]
pub struct FileSinkFactory {
    /// Output folder (created when absent).
    pub dir: PathBuf,
    /// Record encoding.
    pub format: FileFormat,
}

impl FileSinkFactory {
    /// Sink writing lines into `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileSinkFactory {
            dir: dir.into(),
            format: FileFormat::Lines,
        }
    }
}

impl SinkFactory for FileSinkFactory {
    fn identity(&self) -> String {
        format!("file:dir={},format={:?}", self.dir.display(), self.format)
    }

    fn create(&self, context: SinkContext) -> Result<Box<dyn ErasedSink>, ConnectorError> {
        Ok(erase(FileSink {
            dir: self.dir.clone(),
            format: self.format,
            subtask: context.subtask,
            run: format!("{:08x}", rand::random::<u32>()),
        }))
    }
}

/// One subtask of the file sink. See the crate documentation.
#[derive(Debug)]
pub struct FileSink {
    dir: PathBuf,
    format: FileFormat,
    subtask: usize,
    run: String,
}

/// An open pending file.
#[derive(Debug)]
pub struct PendingFile {
    file: tokio::io::BufWriter<tokio::fs::File>,
    committable: FileCommittable,
    buffer: Vec<u8>,
}

/// A pre-committed file: its pending and final names inside the output folder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCommittable {
    /// Name of the fsynced pending file.
    pub pending: String,
    /// Name it gets at commit.
    pub final_name: String,
}

fn io_error(context: &str, path: &Path, e: std::io::Error) -> ConnectorError {
    let message = format!("{}: {e}", path.display());
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => ConnectorError::fatal(
            context,
            format!("{message} (give the pipeline write access to the folder)"),
        ),
        _ => ConnectorError::transient(context, message),
    }
}

impl FileSink {
    fn pending_prefix(&self) -> String {
        format!(".part-{}-", self.subtask)
    }

    async fn sync_dir(&self) -> Result<(), ConnectorError> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || std::fs::File::open(&dir).and_then(|d| d.sync_all()))
            .await
            .expect("fsync task panicked")
            .map_err(|e| io_error("file sink: fsync of the output folder", &self.dir, e))
    }
}

#[async_trait]
impl TwoPhaseCommitSink for FileSink {
    type Transaction = PendingFile;
    type Committable = FileCommittable;

    async fn recover(&mut self, pending: &[FileCommittable]) -> Result<(), ConnectorError> {
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| io_error("file sink: creating the output folder", &self.dir, e))?;
        for c in pending {
            self.commit(c).await?;
        }
        let listed: Vec<&str> = pending.iter().map(|c| c.pending.as_str()).collect();
        let prefix = self.pending_prefix();
        let mut entries = tokio::fs::read_dir(&self.dir)
            .await
            .map_err(|e| io_error("file sink: listing the output folder", &self.dir, e))?;
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|e| io_error("file sink: listing the output folder", &self.dir, e))?
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && name.ends_with(".pending") && !listed.contains(&name.as_str()) {
                tracing::info!(file = %name, "deleting orphaned pending file");
                tokio::fs::remove_file(entry.path())
                    .await
                    .map_err(|e| io_error("file sink: deleting an orphaned pending file", &entry.path(), e))?;
            }
        }
        Ok(())
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<PendingFile, ConnectorError> {
        let stem = format!("part-{}-{:010}-{}", self.subtask, checkpoint.0, self.run);
        let committable = FileCommittable {
            pending: format!(".{stem}.pending"),
            final_name: format!("{stem}.{}", self.format.extension()),
        };
        let path = self.dir.join(&committable.pending);
        let file = tokio::fs::File::create(&path)
            .await
            .map_err(|e| io_error("file sink: creating a pending file", &path, e))?;
        Ok(PendingFile {
            file: tokio::io::BufWriter::new(file),
            committable,
            buffer: Vec::new(),
        })
    }

    async fn write(&mut self, txn: &mut PendingFile, batch: &[Record]) -> Result<(), ConnectorError> {
        txn.buffer.clear();
        for r in batch {
            self.format.encode(r, &mut txn.buffer);
        }
        txn.file
            .write_all(&txn.buffer)
            .await
            .map_err(|e| io_error("file sink: writing", &self.dir.join(&txn.committable.pending), e))
    }

    async fn pre_commit(&mut self, mut txn: PendingFile) -> Result<FileCommittable, ConnectorError> {
        let path = self.dir.join(&txn.committable.pending);
        txn.file
            .flush()
            .await
            .map_err(|e| io_error("file sink: flushing", &path, e))?;
        txn.file
            .get_ref()
            .sync_all()
            .await
            .map_err(|e| io_error("file sink: fsync", &path, e))?;
        // The pending file's name must survive a power loss too.
        self.sync_dir().await?;
        Ok(txn.committable)
    }

    async fn commit(&mut self, c: &FileCommittable) -> Result<(), ConnectorError> {
        let from = self.dir.join(&c.pending);
        let to = self.dir.join(&c.final_name);
        match tokio::fs::rename(&from, &to).await {
            Ok(()) => self.sync_dir().await,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if tokio::fs::try_exists(&to).await.unwrap_or(false) {
                    // Already committed; make sure that rename is durable.
                    self.sync_dir().await
                } else {
                    Err(ConnectorError::DataLoss {
                        context: "file sink commit".into(),
                        checkpoint: checkpoint_of(&c.final_name),
                        message: format!(
                            "neither {} nor {} exists: the pending file was deleted outside the pipeline",
                            from.display(),
                            to.display()
                        ),
                    })
                }
            }
            Err(e) => Err(io_error("file sink: renaming a pending file", &from, e)),
        }
    }

    async fn abort(&mut self, txn: PendingFile) -> Result<(), ConnectorError> {
        let path = self.dir.join(&txn.committable.pending);
        drop(txn);
        match tokio::fs::remove_file(&path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io_error("file sink: deleting an aborted pending file", &path, e))
            }
            _ => Ok(()),
        }
    }
}

fn checkpoint_of(final_name: &str) -> CheckpointId {
    CheckpointId(
        final_name
            .split('-')
            .nth(2)
            .and_then(|s| s.parse().ok())
            .unwrap_or_default(),
    )
}

/// Reads every committed output file of `dir` and returns its lines (for tests
/// and verification; pending files are ignored).
pub fn read_committed_lines(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut lines = Vec::new();
    if !dir.exists() {
        return Ok(lines);
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("part-") {
            let text = std::fs::read_to_string(entry.path())?;
            lines.extend(text.lines().map(str::to_string));
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(dir: &Path, subtask: usize) -> FileSink {
        FileSink {
            dir: dir.to_path_buf(),
            format: FileFormat::Lines,
            subtask,
            run: "r1".into(),
        }
    }

    fn records(n: i64) -> Vec<Record> {
        (0..n).map(|i| Record::new("s", i, format!("v{i}"))).collect()
    }

    #[tokio::test]
    async fn nothing_is_visible_before_commit_and_commit_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path(), 0);
        s.recover(&[]).await.unwrap();
        let mut txn = s.begin(CheckpointId(1)).await.unwrap();
        s.write(&mut txn, &records(3)).await.unwrap();
        let c = s.pre_commit(txn).await.unwrap();
        assert!(read_committed_lines(dir.path()).unwrap().is_empty());
        s.commit(&c).await.unwrap();
        s.commit(&c).await.unwrap();
        assert_eq!(read_committed_lines(dir.path()).unwrap(), vec!["v0", "v1", "v2"]);
    }

    #[tokio::test]
    async fn recovery_commits_listed_and_deletes_orphans_of_its_subtask_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut s0 = sink(dir.path(), 0);
        let mut s1 = sink(dir.path(), 1);
        s0.recover(&[]).await.unwrap();
        let mut listed = s0.begin(CheckpointId(1)).await.unwrap();
        s0.write(&mut listed, &records(2)).await.unwrap();
        let listed = s0.pre_commit(listed).await.unwrap();
        let mut orphan = s0.begin(CheckpointId(2)).await.unwrap();
        s0.write(&mut orphan, &records(1)).await.unwrap();
        let _orphan = s0.pre_commit(orphan).await.unwrap();
        let mut other = s1.begin(CheckpointId(2)).await.unwrap();
        s1.write(&mut other, &records(1)).await.unwrap();
        let other = s1.pre_commit(other).await.unwrap();

        let mut restarted = sink(dir.path(), 0);
        restarted.recover(std::slice::from_ref(&listed)).await.unwrap();
        restarted.recover(std::slice::from_ref(&listed)).await.unwrap();
        assert_eq!(read_committed_lines(dir.path()).unwrap(), vec!["v0", "v1"]);
        assert!(dir.path().join(&other.pending).exists(), "subtask 1's file is not ours");
        let pending: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".pending"))
            .collect();
        assert_eq!(pending.len(), 1);
    }

    #[tokio::test]
    async fn a_vanished_pending_file_is_reported_as_data_loss() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path(), 0);
        s.recover(&[]).await.unwrap();
        let mut txn = s.begin(CheckpointId(7)).await.unwrap();
        s.write(&mut txn, &records(1)).await.unwrap();
        let c = s.pre_commit(txn).await.unwrap();
        std::fs::remove_file(dir.path().join(&c.pending)).unwrap();
        let err = s.commit(&c).await.unwrap_err();
        assert!(
            matches!(
                err,
                ConnectorError::DataLoss {
                    checkpoint: CheckpointId(7),
                    ..
                }
            ),
            "{err}"
        );
    }
}
