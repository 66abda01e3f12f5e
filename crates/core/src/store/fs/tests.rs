use super::*;
use crate::coordinator::CheckpointData;
use crate::store::{conformance, Checkpoints, PipelineDescriptor};

fn descriptor() -> PipelineDescriptor {
    PipelineDescriptor {
        name: "p".into(),
        source: "sequence:splits=2".into(),
        sink: "file:dir=/out".into(),
        parallelism: 2,
        guarantee: "exactly-once".into(),
        transforms: Vec::new(),
    }
}

fn entry(id: u64) -> CheckpointEntry {
    let mut e = CheckpointEntry::new(
        descriptor(),
        CheckpointData {
            id: CheckpointId(id),
            ..Default::default()
        },
    );
    e.created_unix_ms = 1_700_000_000_000 + id;
    e
}

/// The global sequence of `store`, taken.
async fn taken(store: &FsCheckpointStore) -> (Checkpoints, Epoch) {
    let checkpoints = Checkpoints::new(store.sequence(Scope::Global), store.retain());
    let head = checkpoints.take("test").await.unwrap();
    (checkpoints, head.epoch)
}

#[tokio::test]
async fn the_folder_store_keeps_the_contract() {
    let root = tempfile::tempdir().unwrap();
    let store = FsCheckpointStore::new(root.path(), "p", 3);
    conformance::sequence_contract(&store, Scope::Region(0)).await;
    conformance::sequence_contract(&store, Scope::Global).await;
    conformance::pipeline_contract(&store).await;
    // Two handles on one folder share its epochs, as two processes on one
    // database share its rows.
    let other = FsCheckpointStore::new(root.path(), "p", 3);
    conformance::racing_handles(&store, &other, Scope::Region(1)).await;
}

#[tokio::test]
async fn entries_are_named_and_the_latest_complete_one_wins() {
    let root = tempfile::tempdir().unwrap();
    let store = FsCheckpointStore::new(root.path(), "p", 3);
    let (checkpoints, epoch) = taken(&store).await;
    assert!(checkpoints.latest().await.unwrap().is_none());
    for id in 1..=5 {
        checkpoints.save(epoch, &entry(id)).await.unwrap();
    }
    assert_eq!(store.list().unwrap().len(), 5, "saving does not prune");
    checkpoints.prune(epoch).await.unwrap();
    let names = store.list().unwrap();
    assert_eq!(names.iter().map(|n| n.id.0).collect::<Vec<_>>(), vec![3, 4, 5]);
    let fp = descriptor().fingerprint();
    assert_eq!(names[2].file_name, format!("{fp}-1700000000005-5"));
    assert!(
        store.dir().join(format!("{fp}-1700000000005-5")).is_file(),
        "one file per entry, named after it"
    );
    assert_eq!(store.latest().unwrap().unwrap().checkpoint.id, CheckpointId(5));
    assert_eq!(
        checkpoints.latest().await.unwrap().unwrap().checkpoint.id,
        CheckpointId(5)
    );
    assert_eq!(store.id_watermark().unwrap(), None);
    checkpoints.reserve_ids(epoch, CheckpointId(100)).await.unwrap();
    assert_eq!(store.id_watermark().unwrap(), Some(CheckpointId(100)));
    assert_eq!(
        fs::read_to_string(store.dir().join(ID_WATERMARK_FILE)).unwrap(),
        "100",
        "the watermark file keeps its format"
    );
    assert_eq!(store.list().unwrap().len(), 3, "the watermark is not an entry");
}

#[tokio::test]
async fn the_committed_checkpoint_is_recorded_and_never_lowered() {
    let root = tempfile::tempdir().unwrap();
    let store = FsCheckpointStore::new(root.path(), "p", 3);
    let (checkpoints, epoch) = taken(&store).await;
    assert_eq!(store.committed_through().unwrap(), None);
    checkpoints.record_committed(epoch, CheckpointId(7)).await.unwrap();
    assert_eq!(store.committed_through().unwrap(), Some(CheckpointId(7)));
    checkpoints.record_committed(epoch, CheckpointId(5)).await.unwrap();
    assert_eq!(
        store.committed_through().unwrap(),
        Some(CheckpointId(7)),
        "never lowered"
    );
    checkpoints.record_committed(epoch, CheckpointId(9)).await.unwrap();
    let again = FsCheckpointStore::new(root.path(), "p", 3);
    assert_eq!(again.committed_through().unwrap(), Some(CheckpointId(9)), "durable");
    assert!(store.list().unwrap().is_empty(), "the record is not an entry");
}

#[tokio::test]
async fn one_holder_at_a_time_and_the_refusal_names_it() {
    let root = tempfile::tempdir().unwrap();
    let store = FsCheckpointStore::new(root.path(), "p", 3);
    let held = store.lock().await.expect("the first lock");
    // flock locks belong to open files: a second open in the same
    // process conflicts like another process would.
    let other = FsCheckpointStore::new(root.path(), "p", 3);
    let err = other.lock().await.unwrap_err().to_string();
    assert!(err.contains("pipeline p is already running"), "{err}");
    assert!(err.contains(&format!("process {}", std::process::id())), "{err}");
    assert!(err.contains("on host "), "{err}");
    assert!(
        FsCheckpointStore::new(root.path(), "q", 3).lock().await.is_ok(),
        "another pipeline"
    );
    drop(held);
    other.lock().await.expect("free again after the holder dropped it");
    assert!(store.list().unwrap().is_empty(), "the lock file is not an entry");
}

#[tokio::test]
async fn a_clean_release_is_told_to_the_next_holder_once_and_a_dropped_lock_is_not() {
    let root = tempfile::tempdir().unwrap();
    let store = FsCheckpointStore::new(root.path(), "p", 3);
    let first = store.lock().await.unwrap();
    assert!(!first.previous_released_cleanly(), "nobody held it before");
    first.release_cleanly().await.expect("marked");
    let second = store.lock().await.expect("let go by the release");
    assert!(second.previous_released_cleanly());
    drop(second);
    let third = store.lock().await.unwrap();
    assert!(
        !third.previous_released_cleanly(),
        "the holder before it dropped the lock without a clean release"
    );
}

#[tokio::test]
async fn corrupt_and_half_written_entries_are_skipped() {
    let root = tempfile::tempdir().unwrap();
    let store = FsCheckpointStore::new(root.path(), "p", 10);
    let (checkpoints, epoch) = taken(&store).await;
    checkpoints.save(epoch, &entry(1)).await.unwrap();
    checkpoints.save(epoch, &entry(2)).await.unwrap();
    // Flip a byte inside entry 2 (still valid JSON, wrong checksum).
    let p2 = store.dir().join(entry(2).file_name());
    let text = fs::read_to_string(&p2).unwrap().replace("\"id\": 2", "\"id\": 3");
    fs::write(&p2, text).unwrap();
    // A truncated entry 3.
    let e3 = entry(3);
    let full = fs::read(store.dir().join(entry(1).file_name())).unwrap();
    fs::write(store.dir().join(e3.file_name()), &full[..full.len() / 2]).unwrap();
    assert_eq!(store.latest().unwrap().unwrap().checkpoint.id, CheckpointId(1));
    assert_eq!(
        checkpoints.latest().await.unwrap().unwrap().checkpoint.id,
        CheckpointId(1)
    );
    let why = checkpoints.read(&entry(2).file_name()).await.unwrap_err().to_string();
    assert!(why.contains("fails its checksum"), "{why}");
    let why = checkpoints.read(&e3.file_name()).await.unwrap_err().to_string();
    assert!(why.contains("is not a checkpoint entry"), "{why}");
    checkpoints.set_aside(epoch, &e3.file_name()).await.unwrap();
    assert!(store.dir().join(format!("{}.unreadable", e3.file_name())).is_file());
    assert_eq!(
        checkpoints.set_aside_entries().await.unwrap()[0].id,
        CheckpointId(3),
        "listed as set aside"
    );
}

#[tokio::test]
async fn a_temporary_file_of_a_crashed_write_is_swept_by_the_next_write() {
    let root = tempfile::tempdir().unwrap();
    let store = FsCheckpointStore::new(root.path(), "p", 10);
    let (checkpoints, epoch) = taken(&store).await;
    checkpoints.save(epoch, &entry(1)).await.unwrap();
    let torn = store.dir().join(format!(".tmp-{}", entry(2).file_name()));
    fs::write(&torn, b"{\"form").unwrap();
    assert_eq!(store.list().unwrap().len(), 1, "a temporary file is no entry");
    checkpoints.save(epoch, &entry(3)).await.unwrap();
    assert!(!torn.exists());
}

#[test]
fn a_pipeline_without_transforms_keeps_the_fingerprint_it_had_before_transforms_existed() {
    use sha2::{Digest, Sha256};
    let before = r#"{"name":"p","source":"sequence:splits=2","sink":"file:dir=/out","parallelism":2,"guarantee":"exactly-once"}"#;
    assert_eq!(
        descriptor().fingerprint(),
        hex::encode(&Sha256::digest(before.as_bytes())[..8])
    );
    let with = PipelineDescriptor {
        transforms: vec!["filter:even".into()],
        ..descriptor()
    };
    assert_ne!(with.fingerprint(), descriptor().fingerprint());
    assert!(with
        .describe_changes(&descriptor())
        .contains("transforms was ``, is now `filter:even`"));
}
