//! What the store's tests share.
#![allow(dead_code)]

use exactly_core::{CheckpointData, CheckpointEntry, CheckpointId, PipelineDescriptor};

/// A pipeline name no other test (or earlier run on an external server)
/// uses.
pub(crate) fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// A connection of the test's own.
pub(crate) async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the test's own connection");
    tokio::spawn(connection);
    client
}

/// An empty checkpoint entry of `pipeline` with id `id`.
pub(crate) fn entry(pipeline: &str, id: u64) -> CheckpointEntry {
    CheckpointEntry::new(
        PipelineDescriptor {
            name: pipeline.into(),
            source: "sequence:splits=1".into(),
            sink: "file:dir=/out".into(),
            parallelism: 1,
            guarantee: "exactly-once".into(),
            transforms: Vec::new(),
        },
        CheckpointData {
            id: CheckpointId(id),
            ..CheckpointData::default()
        },
    )
}
