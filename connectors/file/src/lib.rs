//! # exactly-file
//!
//! A real two-phase-commit file sink.
//!
//! Every transaction writes a hidden pending file
//! `.part-<pipeline>-<subtask>-<checkpoint>-<run>.pending` in the output
//! folder:
//!
//! - `pre_commit` flushes and fsyncs it and returns its name (the committable);
//! - `commit` renames it to `part-<pipeline>-<subtask>-<checkpoint>-<run>.<ext>`
//!   atomically and fsyncs the folder — idempotent: a file already renamed is
//!   success;
//! - `abort` deletes it;
//! - `recover` finishes the renames the checkpoint lists and deletes every
//!   other pending file of the pipeline's subtasks it owns (its own and, after
//!   a lowering of the parallelism, those of the old subtasks it adopts; see
//!   [`SinkContext::owned_subtasks`]). Files of other pipelines writing into
//!   the same folder are never touched;
//! - `check_replay_after` (asked before a fallback past unreadable checkpoint
//!   entries) reads the checkpoint ids in the committed files' names: a
//!   committed file of a later checkpoint is a commit the replay would
//!   duplicate. Committed files must stay in the folder for that answer:
//!   files a consumer moved away are not seen.
//!
//! Readers only ever see complete files whose checkpoint completed. `<run>` is a
//! random tag per sink instance, so a checkpoint id reused after a rollback can
//! never overwrite an earlier committed file. The checkpoint has ten digits;
//! names are parsed from their end, so a pipeline name may contain `-`.
//!
//! **One writer per folder and pipeline.** Before it touches the folder a sink
//! subtask makes sure its process holds an OS lock (`flock`) on
//! `.exactly-<pipeline>.lock` in the folder, which names the holder (host, pid,
//! since when). Another process of the same pipeline — even with another
//! checkpoint folder — is refused with a fatal error naming the pipeline, the
//! folder and the holder. The lock is held until the process exits and goes
//! with it, however it ends.
//!
//! **Older names.** Files named before names carried the pipeline
//! (`.part-<subtask>-<checkpoint>-<run>.pending`, `part-<subtask>-…`) are still
//! committed when a checkpoint lists them (committables hold whole names) and
//! read by [`read_committed_lines`]. An unlisted pending file of that form is
//! left in place with a warning: it could belong to any pipeline of the
//! folder, so deleting it could destroy another pipeline's pre-committed data.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use exactly_core::{
    erase, plan_recovery, CheckpointId, ConnectorError, ErasedSink, Record, ReplayCheck, SinkContext, SinkFactory,
    TwoPhaseCommitSink,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

mod lock;
mod names;
mod replay;

pub use lock::lock_file_name;

/// How records are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileFormat {
    /// The raw value bytes followed by `\n`. A null value (a tombstone)
    /// has no such form: it stops the pipeline with an error naming the
    /// record and `json-lines`, never a line that reads as an empty value.
    #[default]
    Lines,
    /// One JSON object per line: split, offset, key, value (UTF-8, lossy;
    /// `null` for a null value, `""` for an empty one), timestamp.
    JsonLines,
}

impl FileFormat {
    fn extension(self) -> &'static str {
        match self {
            FileFormat::Lines => "txt",
            FileFormat::JsonLines => "jsonl",
        }
    }

    fn encode(self, record: &Record, out: &mut Vec<u8>) -> Result<(), ConnectorError> {
        match self {
            FileFormat::Lines => {
                let Some(value) = &record.value else {
                    return Err(ConnectorError::fatal(
                        "file sink",
                        format!(
                            "record {}@{} has a null value (a tombstone), which format `lines` cannot tell from an \
                             empty line; set `format = \"json-lines\"` in [sink.file], which writes it as null",
                            record.split, record.offset
                        ),
                    ));
                };
                out.extend_from_slice(value);
            }
            FileFormat::JsonLines => {
                let line = serde_json::json!({
                    "split": record.split,
                    "offset": record.offset,
                    "key": record.key.as_deref().map(String::from_utf8_lossy),
                    "value": record.value.as_deref().map(String::from_utf8_lossy),
                    "timestamp_ms": record.timestamp_ms,
                });
                out.extend_from_slice(line.to_string().as_bytes());
            }
        }
        out.push(b'\n');
        Ok(())
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
        Ok(erase(FileSink::new(self.dir.clone(), self.format, &context)))
    }

    /// Lines are appended to the transaction's file as they come, keyed on
    /// nothing: several records at one coordinate are several lines.
    fn accepts_repeated_coordinates(&self) -> bool {
        true
    }
}

/// One subtask of the file sink. See the crate documentation.
#[derive(Debug)]
pub struct FileSink {
    dir: PathBuf,
    format: FileFormat,
    pipeline: String,
    subtask: usize,
    parallelism: usize,
    /// This subtask and the old ones it adopted: whose leftovers it cleans up.
    owned: Vec<usize>,
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
    let error = match e.kind() {
        std::io::ErrorKind::PermissionDenied => ConnectorError::fatal(
            context,
            format!("{} (give the pipeline write access to the folder)", path.display()),
        ),
        _ => ConnectorError::transient(context, path.display()),
    };
    error.caused_by(e)
}

impl FileSink {
    fn new(dir: PathBuf, format: FileFormat, context: &SinkContext) -> FileSink {
        FileSink {
            dir,
            format,
            pipeline: context.pipeline.clone(),
            subtask: context.subtask,
            parallelism: context.parallelism,
            owned: context.owned_subtasks().collect(),
            run: format!("{:08x}", rand::random::<u32>()),
        }
    }

    /// Takes (or confirms) this process's lock of the pipeline in the folder.
    async fn hold_lock(&self) -> Result<(), ConnectorError> {
        let (dir, pipeline) = (self.dir.clone(), self.pipeline.clone());
        tokio::task::spawn_blocking(move || lock::hold(&dir, &pipeline))
            .await
            .expect("lock task panicked")
    }

    /// Whether recovery may delete the pending file `name` when the
    /// checkpoint does not list it: a pending file of this pipeline written
    /// by a subtask this one owns. Pending files of the older form are
    /// collected in `older` instead (they name no pipeline).
    fn is_own_leftover(&self, name: &str, older: &mut Vec<String>) -> bool {
        let Some(part) = names::parse_pending(name) else {
            return false;
        };
        if !self.owned.contains(&part.subtask) {
            return false;
        }
        match part.pipeline {
            Some(pipeline) => pipeline == self.pipeline,
            None => {
                older.push(name.to_string());
                false
            }
        }
    }

    /// The names of the files in the output folder.
    async fn file_names(&self) -> Result<Vec<String>, ConnectorError> {
        let listing = |e| io_error("file sink: listing the output folder", &self.dir, e);
        let mut entries = tokio::fs::read_dir(&self.dir).await.map_err(listing)?;
        let mut names = Vec::new();
        while let Some(entry) = entries.next_entry().await.map_err(listing)? {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    /// The lines of the files `names` of the folder together, read in
    /// chunks; `None` when one of them is gone meanwhile (a consumer moved
    /// it away), so the count would be short.
    async fn count_lines(&self, names: &[&str]) -> Result<Option<u64>, ConnectorError> {
        use tokio::io::AsyncReadExt;
        let mut lines = 0u64;
        let mut chunk = vec![0u8; 64 * 1024];
        for name in names {
            let path = self.dir.join(name);
            let counting = |e| io_error("file sink: counting the records of a committed file", &path, e);
            let mut file = match tokio::fs::File::open(&path).await {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(counting(e)),
            };
            loop {
                let n = file.read(&mut chunk).await.map_err(counting)?;
                if n == 0 {
                    break;
                }
                lines += chunk[..n].iter().filter(|b| **b == b'\n').count() as u64;
            }
        }
        Ok(Some(lines))
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

    /// Holds nothing of its own: its lock is the process's instance lock,
    /// which the runtime lets go after a clean stop.
    async fn close(&mut self) -> Result<exactly_core::Closed, ConnectorError> {
        Ok(exactly_core::Closed::Released)
    }

    async fn recover(&mut self, pending: &[FileCommittable]) -> Result<(), ConnectorError> {
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| io_error("file sink: creating the output folder", &self.dir, e))?;
        self.hold_lock().await?;
        let mut older = Vec::new();
        let owned: Vec<String> = self
            .file_names()
            .await?
            .into_iter()
            .filter(|name| self.is_own_leftover(name, &mut older))
            .collect();
        let plan = plan_recovery(pending, |c| c.pending.clone(), owned);
        for c in plan.commit {
            self.commit(c).await?;
        }
        for name in &plan.abort {
            tracing::info!(file = %name, "deleting orphaned pending file");
            let path = self.dir.join(name);
            match tokio::fs::remove_file(&path).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io_error("file sink: deleting an orphaned pending file", &path, e))
                }
                _ => {}
            }
        }
        let listed: Vec<&str> = pending.iter().map(|c| c.pending.as_str()).collect();
        older.retain(|name| !listed.contains(&name.as_str()));
        if !older.is_empty() {
            tracing::warn!(
                folder = %self.dir.display(),
                files = ?older,
                "pending files named in the older form (without a pipeline) are left in place: they may belong \
                 to another pipeline writing into this folder; delete them by hand once no pipeline's latest \
                 checkpoint lists them"
            );
        }
        Ok(())
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<PendingFile, ConnectorError> {
        let stem = names::stem(&self.pipeline, self.subtask, checkpoint.0, &self.run);
        let committable = FileCommittable {
            pending: names::pending(&stem),
            final_name: names::committed(&stem, self.format.extension()),
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
            self.format.encode(r, &mut txn.buffer)?;
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

    /// From the committed files' names (by the rules of the private `replay` module): `CommittedLater`
    /// when a committed file of this pipeline, of this subtask or one whose
    /// records it replays (`j % parallelism`, adopted ones included), holds
    /// a later checkpoint; `Unknown` when only a file named in the older
    /// form (no pipeline) does; `Safe` otherwise, also when the folder does
    /// not exist (nothing was committed there). A `CommittedLater` counts
    /// the lines of those later files: one per record (exact for
    /// `json-lines`; in format `lines` a value holding line breaks counts
    /// once per line), uncounted when a later file of the older form or a
    /// file gone meanwhile makes the count short. Reads only: the folder is
    /// listed and the later files read, nothing is locked or changed.
    async fn check_replay_after(&mut self, checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError> {
        if !tokio::fs::try_exists(&self.dir).await.unwrap_or(true) {
            return Ok(ReplayCheck::Safe);
        }
        let files = self.file_names().await?;
        let replayer = replay::Replayer {
            pipeline: &self.pipeline,
            subtask: self.subtask,
            parallelism: self.parallelism,
        };
        let names = || files.iter().map(String::as_str);
        let answer = replayer.check(checkpoint, names());
        let ReplayCheck::CommittedLater { checkpoint: later, .. } = answer else {
            return Ok(answer);
        };
        let records = if replayer.unattributed_later(checkpoint, names()) {
            None
        } else {
            self.count_lines(&replayer.later_files(checkpoint, names())).await?
        };
        Ok(ReplayCheck::CommittedLater {
            checkpoint: later,
            records,
        })
    }
}

fn checkpoint_of(final_name: &str) -> CheckpointId {
    CheckpointId(names::parse_committed(final_name).map_or(0, |p| p.checkpoint))
}

/// Reads every committed output file of `dir` and returns its lines (for tests
/// and verification; pending files are ignored). Files of every pipeline
/// writing into `dir` count; [`read_committed_lines_of`] reads one
/// pipeline's.
pub fn read_committed_lines(dir: &Path) -> std::io::Result<Vec<String>> {
    read_lines_where(dir, |name| name.starts_with("part-"))
}

/// Like [`read_committed_lines`], but only the files pipeline `pipeline`
/// committed (files named in the older form, without a pipeline, are left
/// out).
pub fn read_committed_lines_of(dir: &Path, pipeline: &str) -> std::io::Result<Vec<String>> {
    read_lines_where(dir, |name| {
        names::parse_committed(name).is_some_and(|p| p.pipeline.as_deref() == Some(pipeline))
    })
}

fn read_lines_where(dir: &Path, wanted: impl Fn(&str) -> bool) -> std::io::Result<Vec<String>> {
    let mut lines = Vec::new();
    if !dir.exists() {
        return Ok(lines);
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if wanted(&name) {
            let text = std::fs::read_to_string(entry.path())?;
            lines.extend(text.lines().map(str::to_string));
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checkpoints written earlier list committables of this form: it must
    /// keep deserializing (docs/connectors.md, "Versioning a committable").
    #[test]
    fn the_committable_form_is_pinned() {
        let text = r#"{"pending":".pending-exactly.p.00000.00000000000000000007","final_name":"part-00000-7.txt"}"#;
        let c: FileCommittable = serde_json::from_str(text).unwrap();
        assert_eq!(c.final_name, "part-00000-7.txt");
        assert_eq!(serde_json::to_string(&c).unwrap(), text);
    }

    /// Subtask `subtask` of pipeline `pipeline`, taking over `adopted`.
    fn sink_of(dir: &Path, pipeline: &str, subtask: usize, adopted: Vec<usize>) -> FileSink {
        let context = SinkContext::new(pipeline, subtask, 2, Default::default()).with_adopted(adopted);
        FileSink::new(dir.to_path_buf(), FileFormat::Lines, &context)
    }

    fn sink(dir: &Path, subtask: usize) -> FileSink {
        sink_of(dir, "p", subtask, Vec::new())
    }

    /// Pre-commits `n` records as checkpoint `checkpoint` of `sink`.
    async fn pre_committed(sink: &mut FileSink, checkpoint: u64, n: i64) -> FileCommittable {
        let mut txn = sink.begin(CheckpointId(checkpoint)).await.unwrap();
        sink.write(&mut txn, &records(n)).await.unwrap();
        sink.pre_commit(txn).await.unwrap()
    }

    fn pending_files(dir: &Path) -> std::collections::BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".pending"))
            .collect()
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

    #[test]
    fn json_lines_write_a_null_value_as_null_and_an_empty_one_as_empty() {
        let mut out = Vec::new();
        FileFormat::JsonLines
            .encode(&Record::tombstone("s", 0), &mut out)
            .unwrap();
        FileFormat::JsonLines
            .encode(&Record::new("s", 1, ""), &mut out)
            .unwrap();
        let lines: Vec<serde_json::Value> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(lines[0]["value"], serde_json::Value::Null);
        assert_eq!(lines[1]["value"], serde_json::json!(""));
    }

    #[test]
    fn lines_refuse_a_null_value_naming_the_record_and_the_format_that_keeps_it() {
        let mut out = Vec::new();
        let error = FileFormat::Lines
            .encode(&Record::tombstone("orders-3", 17), &mut out)
            .unwrap_err();
        assert!(matches!(error, ConnectorError::Fatal { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains("orders-3@17") && message.contains("json-lines"),
            "{message}"
        );
        assert!(out.is_empty(), "nothing written for it");
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
    async fn recovery_never_touches_the_files_of_another_pipeline_in_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let mut mine = sink_of(dir.path(), "left", 0, Vec::new());
        let mut theirs = sink_of(dir.path(), "right", 0, Vec::new());
        mine.recover(&[]).await.unwrap();
        theirs.recover(&[]).await.unwrap();
        let my_orphan = pre_committed(&mut mine, 3, 1).await;
        let their_pending = pre_committed(&mut theirs, 3, 2).await;
        assert!(my_orphan.pending.starts_with(".part-left-0-"), "{my_orphan:?}");
        assert!(
            their_pending.final_name.starts_with("part-right-0-"),
            "{their_pending:?}"
        );

        sink_of(dir.path(), "left", 0, Vec::new()).recover(&[]).await.unwrap();
        assert_eq!(pending_files(dir.path()), [their_pending.pending.clone()].into());
        sink_of(dir.path(), "right", 0, Vec::new())
            .recover(std::slice::from_ref(&their_pending))
            .await
            .unwrap();
        assert_eq!(read_committed_lines_of(dir.path(), "right").unwrap(), vec!["v0", "v1"]);
        assert!(read_committed_lines_of(dir.path(), "left").unwrap().is_empty());
        assert_eq!(read_committed_lines(dir.path()).unwrap(), vec!["v0", "v1"]);
    }

    #[tokio::test]
    async fn recovery_commits_and_cleans_up_for_the_subtasks_it_adopts() {
        let dir = tempfile::tempdir().unwrap();
        // Parallelism 3 before: subtask 2 goes to subtask 0 at parallelism 2.
        let mut old2 = sink_of(dir.path(), "p", 2, Vec::new());
        let mut old1 = sink_of(dir.path(), "p", 1, Vec::new());
        old2.recover(&[]).await.unwrap();
        let listed = pre_committed(&mut old2, 4, 2).await;
        let orphan = pre_committed(&mut old2, 5, 1).await;
        let not_adopted = pre_committed(&mut old1, 5, 1).await;

        let mut heir = sink_of(dir.path(), "p", 0, vec![2]);
        heir.recover(std::slice::from_ref(&listed)).await.unwrap();
        heir.recover(std::slice::from_ref(&listed)).await.unwrap();
        assert_eq!(read_committed_lines(dir.path()).unwrap(), vec!["v0", "v1"]);
        assert!(
            !dir.path().join(&orphan.pending).exists(),
            "the adopted subtask's leftover"
        );
        assert_eq!(
            pending_files(dir.path()),
            [not_adopted.pending].into(),
            "subtask 1 is not adopted"
        );
    }

    #[tokio::test]
    async fn files_named_in_the_older_form_are_committed_when_listed_and_otherwise_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let older = |checkpoint: u64| FileCommittable {
            pending: format!(".part-0-{checkpoint:010}-0a1b2c3d.pending"),
            final_name: format!("part-0-{checkpoint:010}-0a1b2c3d.txt"),
        };
        let (listed, unlisted) = (older(3), older(4));
        std::fs::write(dir.path().join(&listed.pending), "old\n").unwrap();
        std::fs::write(dir.path().join(&unlisted.pending), "unknown owner\n").unwrap();
        sink(dir.path(), 0)
            .recover(std::slice::from_ref(&listed))
            .await
            .unwrap();
        assert_eq!(read_committed_lines(dir.path()).unwrap(), vec!["old"]);
        assert_eq!(pending_files(dir.path()), [unlisted.pending].into());
        assert_eq!(checkpoint_of(&listed.final_name), CheckpointId(3));
    }

    /// Before a fallback to checkpoint 4 (newer entries unreadable): the
    /// committed file of checkpoint 5 is a commit the replay would
    /// duplicate; a file of 6 only pre-committed is not, and recovery then
    /// deletes it.
    #[tokio::test]
    async fn the_replay_check_reads_the_checkpoints_of_the_committed_files() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut s = sink(&out, 1);
        assert_eq!(
            s.check_replay_after(CheckpointId(4)).await.unwrap(),
            ReplayCheck::Safe,
            "no folder: nothing committed"
        );
        s.recover(&[]).await.unwrap();
        let four = pre_committed(&mut s, 4, 1).await;
        s.commit(&four).await.unwrap();
        let five = pre_committed(&mut s, 5, 1).await;
        s.commit(&five).await.unwrap();
        let _six = pre_committed(&mut s, 6, 1).await;
        let mut other = sink_of(&out, "other", 1, Vec::new());
        other.recover(&[]).await.unwrap();
        let theirs = pre_committed(&mut other, 9, 1).await;
        other.commit(&theirs).await.unwrap();

        let mut restarted = sink(&out, 1);
        assert_eq!(
            restarted.check_replay_after(CheckpointId(4)).await.unwrap(),
            ReplayCheck::CommittedLater {
                checkpoint: CheckpointId(5),
                records: Some(1)
            }
        );
        assert_eq!(
            restarted.check_replay_after(CheckpointId(5)).await.unwrap(),
            ReplayCheck::Safe
        );
        assert_eq!(
            sink(&out, 0).check_replay_after(CheckpointId(4)).await.unwrap(),
            ReplayCheck::Safe,
            "subtask 1's files are not subtask 0's"
        );
        // Subtask 3 of parallelism 4 committed checkpoint 5: subtask 1 of 2
        // replays its records.
        let context = SinkContext::new("p", 3, 4, Default::default());
        let mut s3 = FileSink::new(out.clone(), FileFormat::Lines, &context);
        let late = pre_committed(&mut s3, 7, 3).await;
        s3.commit(&late).await.unwrap();
        assert_eq!(
            restarted.check_replay_after(CheckpointId(5)).await.unwrap(),
            ReplayCheck::CommittedLater {
                checkpoint: CheckpointId(7),
                records: Some(3)
            }
        );
        assert_eq!(
            restarted.check_replay_after(CheckpointId(3)).await.unwrap(),
            ReplayCheck::CommittedLater {
                checkpoint: CheckpointId(7),
                records: Some(5)
            },
            "4, 5 and 7"
        );
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
