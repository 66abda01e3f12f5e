//! A checkpoint folder that has a history is never taken for a first start
//! by accident: when none of its entries can be read (corruption, a format
//! change, entries deleted but the id watermark left), the pipeline refuses
//! to start, naming the folder, what is there and the flag that accepts a
//! first start deliberately.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn config(dir: &Path) -> PathBuf {
    write_config(dir, "history", "exactly-once", 2, "[sink.file]\ndir = \"out\"")
}

fn folder(dir: &Path) -> PathBuf {
    dir.join("checkpoints").join("history")
}

/// The entry files of every checkpoint sequence of the pipeline.
fn entries(dir: &Path) -> Vec<PathBuf> {
    checkpoint_entry_files(&folder(dir))
}

/// Every file of the output folder, committed and pending, with its size.
fn output_files(dir: &Path) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir.join("out"))
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    files.sort();
    files
}

fn assert_refused_naming(log: &str, dir: &Path, what: &[&str]) {
    let folder = folder(dir).display().to_string();
    for part in [
        folder.as_str(),
        "has a history but no readable checkpoint",
        "allow_first_start",
        "--allow-first-start",
    ]
    .iter()
    .chain(what)
    {
        assert!(log.contains(part), "`{part}` missing from:\n{log}");
    }
}

#[test]
fn unreadable_entries_stop_the_start_until_a_first_start_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    run_killed_at(&config, "coordinator.after_persist:3");
    let written = entries(dir.path());
    assert!(!written.is_empty());
    for entry in &written {
        let mut bytes = std::fs::read(entry).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x55;
        std::fs::write(entry, bytes).unwrap();
    }
    let before = output_files(dir.path());
    // The listing shows every region's entries and marks them unreadable.
    let listing = std::process::Command::new(env!("CARGO_BIN_EXE_exactly"))
        .args(["checkpoints", "list"])
        .arg(&config)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert_eq!(listing.lines().count(), written.len(), "{listing}");
    assert!(listing.lines().all(|l| l.contains("UNREADABLE")), "{listing}");
    for region in ["region=0", "region=1"] {
        assert!(listing.contains(region), "{region} missing from:\n{listing}");
    }

    let (status, log) = run(&config, None, &[]);
    assert!(
        !status.success(),
        "a folder of unreadable entries was taken for a first start:\n{log}"
    );
    let first = written[0].file_name().unwrap().to_string_lossy().into_owned();
    assert_refused_naming(&log, dir.path(), &[&first, "ids reserved up to"]);
    assert_eq!(
        output_files(dir.path()),
        before,
        "the refused start touched the sink's files"
    );

    let (status, log) = run(&config, None, &["--allow-first-start"]);
    assert!(status.success(), "an accepted first start failed:\n{log}");
    assert!(log.contains("starting as if for the first time"), "{log}");
    for entry in &written {
        let kept = PathBuf::from(format!("{}.unreadable", entry.display()));
        assert!(kept.exists(), "{} was not kept aside", entry.display());
    }
    // The accepted first start replayed the whole input: every record is
    // there, those of the lost checkpoints twice — what the refusal warns of.
    let lines = exactly::file::read_committed_lines(&dir.path().join("out")).unwrap();
    assert!(
        lines.len() > TOTAL,
        "the first start replays what the lost checkpoints had committed"
    );
    let distinct: std::collections::BTreeSet<&String> = lines.iter().collect();
    assert_eq!(distinct.len(), TOTAL);

    // Afterwards the folder is healthy again: a restart resumes normally.
    run_to_completion(&config);
}

#[test]
fn an_id_watermark_without_entries_is_a_history_too() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    run_killed_at(&config, "coordinator.after_persist:3");
    for entry in entries(dir.path()) {
        std::fs::remove_file(entry).unwrap();
    }
    for sequence in checkpoint_sequences(&folder(dir.path())) {
        let watermark = sequence.join(exactly::core::store::ID_WATERMARK_FILE);
        assert!(watermark.exists(), "{}", watermark.display());
    }
    let (status, log) = run(&config, None, &[]);
    assert!(!status.success(), "{log}");
    assert_refused_naming(&log, dir.path(), &["ids reserved up to"]);
}

#[test]
fn a_first_start_pins_the_start_in_checkpoint_zero() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    // Killed before any checkpoint completed: every checkpoint sequence has
    // its checkpoint 0 and nothing else.
    run_killed_at(&config, "source.after_emit:1");
    let sequences = checkpoint_sequences(&folder(dir.path()));
    assert_eq!(sequences.len(), 2, "one checkpoint sequence per region: {sequences:?}");
    for sequence in sequences {
        let names: Vec<String> = checkpoint_entry_files(&sequence)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "{}: {names:?}", sequence.display());
        assert!(names[0].ends_with("-0"), "{names:?}");
    }
    run_to_completion(&config);
    let lines = exactly::file::read_committed_lines(&dir.path().join("out")).unwrap();
    assert_eq!(
        lines.len(),
        TOTAL,
        "exactly once after a crash before the first checkpoint"
    );
}
