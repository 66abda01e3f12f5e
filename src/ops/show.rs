//! `exactly checkpoints show <entry>`: one checkpoint entry, verified
//! (checksum, name) and printed for people, or as JSON with `--json`.

use std::path::Path;

use anyhow::{bail, Result};
use exactly_core::{CheckpointEntry, FsCheckpointStore};

use super::redact::redact;
use super::status::{sequences, split_entry_path, summary, write_pending};
use crate::config::PipelineFile;

/// Reads and verifies the entry at `path`; the error names the problem and
/// the fix.
pub fn read_entry(path: &Path) -> Result<CheckpointEntry> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "no checkpoint entry at {shown}. Fix: give the path of an entry file, \
             `<checkpoint dir>/<pipeline>/<fingerprint>-<unix-ms>-<id>`; `exactly checkpoints list pipeline.toml` \
             lists them"
        ),
        Err(e) => bail!("cannot read {shown}: {e}. Fix: check the path and its permissions"),
        Ok(m) if m.is_dir() => bail!(
            "{shown} is a folder, not a checkpoint entry. Fix: give the path of one entry file in it \
             (`exactly checkpoints list pipeline.toml` lists them)"
        ),
        Ok(_) => {}
    }
    let Some((root, folder, name)) = split_entry_path(path) else {
        bail!("{shown} does not name a checkpoint entry file. Fix: give the path of an entry file");
    };
    if exactly_core::EntryName::parse(&name).is_none() {
        bail!(
            "{shown} is not a checkpoint entry: entries are named <fingerprint>-<unix-ms>-<id> (the folder also \
             holds id-watermark, committed-through and lock, which are not entries). Fix: give the path of an \
             entry; `exactly checkpoints list pipeline.toml` lists them"
        );
    }
    let store = FsCheckpointStore::new(root, &folder, 1);
    store.read(&name).map_err(|why| {
        anyhow::anyhow!(
            "checkpoint entry {shown} is unreadable: {why}. Past an unreadable newest entry the runtime restores \
             the newest readable one only when the sinks prove that nothing after it was committed, and otherwise \
             refuses to start (allow_fallback = true in [checkpoint] or --allow-fallback accepts the duplicates); \
             with no readable entry it refuses too. Fix: restore the file from a backup if you have one; \
             otherwise leave it where it is (a deleted or moved entry is not checked for)"
        )
    })
}

/// Finds the entry `name` in any checkpoint sequence of the pipeline
/// `config` describes, in whichever store it names, and verifies it.
pub async fn find_entry(config: &PipelineFile, name: &str) -> Result<CheckpointEntry> {
    if exactly_core::EntryName::parse(name).is_none() {
        bail!(
            "`{name}` is not a checkpoint entry's name: entries are named <fingerprint>-<unix-ms>-<id>. Fix: \
             `exactly checkpoints list pipeline.toml` lists them"
        );
    }
    for sequence in sequences(config).await {
        let listed = sequence.checkpoints.list().await?;
        if listed.iter().any(|n| n.file_name == name) {
            return sequence.checkpoints.read(name).await.map_err(|why| {
                anyhow::anyhow!(
                    "checkpoint entry {name} is unreadable: {}. Fix: restore it from a backup if you have one; \
                     otherwise leave it where it is",
                    redact(&why.to_string())
                )
            });
        }
    }
    bail!(
        "no checkpoint entry {name} in the pipeline's store. Fix: `exactly checkpoints list pipeline.toml` lists \
         the entries there are"
    )
}

/// The entry as text.
pub fn render_text(entry: &CheckpointEntry) -> String {
    use std::fmt::Write;
    let s = summary(entry);
    let d = &entry.descriptor;
    let mut out = String::new();
    let when =
        humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(s.created_unix_ms));
    let age = humantime::format_duration(std::time::Duration::from_secs(s.age_seconds as u64));
    let _ = writeln!(out, "checkpoint {}  (entry {})", s.id, s.entry);
    let _ = writeln!(out, "  written      {when} ({age} ago)");
    let _ = writeln!(out, "  pipeline     {}", d.name);
    let _ = writeln!(out, "  fingerprint  {}", entry.fingerprint);
    let _ = writeln!(out, "  source       {}", redact(&d.source));
    let _ = writeln!(out, "  sink         {}", redact(&d.sink));
    let _ = writeln!(out, "  parallelism  {}", d.parallelism);
    let _ = writeln!(out, "  guarantee    {}", d.guarantee);
    // Written by the first entry after a change of parallelism.
    let data = serde_json::to_value(&entry.checkpoint).unwrap_or_default();
    if let Some(previous) = data.get("previous_parallelism").and_then(|p| p.as_u64()) {
        let _ = writeln!(out, "  taken over from parallelism {previous}");
    }
    let _ = writeln!(out, "  positions (next offset per split): {}", s.positions.len());
    for (split, offset) in &s.positions {
        let _ = writeln!(out, "    {split:<40} {offset}");
    }
    let listed: usize = s.pending.values().map(Vec::len).sum();
    let _ = writeln!(out, "  pending transactions (committed on recovery): {listed}");
    write_pending(&mut out, &s.pending);
    out
}
