//! Which Kafka cluster and which topic a checkpoint's offsets were read
//! from (the entries of [`positions`](super::positions)), and the checks
//! at restore that refuse offsets of another cluster or of a topic
//! deleted and created again since.

use std::collections::BTreeSet;

use exactly_core::ConnectorError;
use exactly_kafka_wire::TopicId;

use super::Settings;

/// Whether offsets read from the clusters `recorded` may be resumed on the
/// cluster `current` the brokers answer as.
pub(super) fn check_cluster(
    settings: &Settings,
    topic: &str,
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
            bootstrap = config.bootstrap,
        ),
    ))
}

/// What a restore does with offsets read from the topic(s) `recorded`
/// when the topic is `current` now: `Ok(true)` resume them, `Ok(false)`
/// read the topic from its beginning (it was recreated, and
/// `accept_topic_id` names the new one), `Err` refuse (recreated, not
/// accepted).
pub(super) fn check_topic_id(
    settings: &Settings,
    topic: &str,
    recorded: &BTreeSet<TopicId>,
    current: Option<TopicId>,
) -> Result<bool, ConnectorError> {
    let Some(current) = current else {
        return Ok(true);
    };
    if recorded.is_empty() || recorded.contains(&current) {
        return Ok(true);
    }
    let was = recorded
        .iter()
        .map(|id| format!("`{id}`"))
        .collect::<Vec<_>>()
        .join(" and ");
    let accepted = settings
        .config
        .accept_topic_id
        .as_deref()
        .and_then(|id| id.parse::<TopicId>().ok());
    if accepted == Some(current) {
        tracing::warn!(
            source = %settings.label,
            was = %was,
            now = %current,
            "topic was recreated; reading the new topic from its beginning, as `accept_topic_id` says"
        );
        return Ok(false);
    }
    Err(ConnectorError::fatal(
        settings.context(),
        format!(
            "topic `{topic}` was deleted and created again since the checkpoint: its offsets were read from the \
             topic with id {was}, and the topic of that name has id `{current}` now. The offsets mean nothing in \
             the new topic (resuming would skip its first records or read past its end). To read the new topic \
             from its beginning, set `accept_topic_id = \"{current}\"` in [source.kafka]; to start over \
             altogether, run the pipeline under a new `name` or `checkpoint.dir`"
        ),
    ))
}
