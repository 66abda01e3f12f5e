//! Which Kafka cluster a checkpoint's offsets were read from: the entry
//! `<topic>@cluster:<id>` in the positions, and the check at restore that
//! refuses offsets of another cluster.

use std::collections::{BTreeMap, BTreeSet};

use exactly_core::{ConnectorError, SplitPositions};

use super::Settings;

/// The position entry naming the cluster the positions of `topic` were
/// read from (see [`KafkaSourceFactory`](super::KafkaSourceFactory)).
pub(super) fn cluster_marker(topic: &str, cluster: &str) -> String {
    format!("{topic}{CLUSTER_MARKER}{cluster}")
}

/// Between the topic and the cluster id in [`cluster_marker`].
const CLUSTER_MARKER: &str = "@cluster:";

/// The clusters `positions` say the offsets of `topic` were read from.
pub(super) fn recorded_clusters<'a>(positions: &'a SplitPositions, topic: &str) -> BTreeSet<&'a str> {
    positions
        .0
        .keys()
        .filter_map(|key| key.strip_prefix(topic)?.strip_prefix(CLUSTER_MARKER))
        .collect()
}

/// Whether offsets read from the clusters `recorded` may be resumed on the
/// cluster `current` the brokers answer as.
pub(super) fn check_cluster(
    settings: &Settings,
    recorded: &BTreeSet<&str>,
    current: Option<&str>,
) -> Result<(), ConnectorError> {
    if recorded.is_empty() {
        return Ok(());
    }
    let config = &settings.config;
    let was = recorded
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(" and ");
    let Some(current) = current else {
        return Err(ConnectorError::transient(
            settings.context(),
            format!(
                "the checkpoint's offsets were read from Kafka cluster {was}, and `{}` did not tell its cluster id \
                 within {} to check it is the same cluster; check `bootstrap` and that the brokers are running",
                config.bootstrap,
                humantime::format_duration(config.startup_timeout)
            ),
        ));
    };
    if recorded.iter().all(|c| *c == current) {
        return Ok(());
    }
    if config.accept_cluster_id.as_deref() == Some(current) {
        tracing::warn!(
            source = %settings.label,
            was = %was,
            now = current,
            "resuming the checkpoint's offsets, read from another cluster, on this one, as `accept_cluster_id` says"
        );
        return Ok(());
    }
    Err(ConnectorError::fatal(
        settings.context(),
        format!(
            "the checkpoint's offsets of topic `{topic}` were read from Kafka cluster {was}, but `{bootstrap}` is \
             cluster `{current}`: offsets of one cluster mean nothing in another (resuming would skip or repeat \
             records). Point `bootstrap` back at cluster {was}; to read cluster `{current}` from `start` instead, \
             run the pipeline under a new `name` or `checkpoint.dir` (a first start); only if cluster `{current}` \
             holds the very same offsets (a migration that kept them), set `accept_cluster_id = \"{current}\"` in \
             [source.kafka]",
            topic = settings.topic(),
            bootstrap = config.bootstrap,
        ),
    ))
}

/// The partitions of `topic` that `positions` hold an offset for.
pub(super) fn checkpointed_partitions(positions: &SplitPositions, topic: &str) -> BTreeMap<i32, i64> {
    positions
        .0
        .iter()
        .filter_map(|(split, offset)| {
            let partition = split.strip_prefix(topic)?.strip_prefix('-')?.parse().ok()?;
            Some((partition, *offset))
        })
        .collect()
}
