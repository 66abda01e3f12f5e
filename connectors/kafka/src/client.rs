//! Glue between librdkafka and the sink's producers and the admin client:
//! client settings, creation errors, log forwarding.

use exactly_core::BoxError;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;

use crate::properties::shown_value;

/// librdkafka settings for `bootstrap` plus `properties`.
pub(crate) fn client_config<'a>(
    bootstrap: &str,
    properties: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (key, value) in properties {
        config.set(key, value);
    }
    config
}

/// What to say about a client creation failure, and the cause to keep: a
/// setting librdkafka rejected is named with its value redacted when it is
/// a secret, and librdkafka's own error (which repeats the value) is then
/// not kept; any other failure is kept as the cause.
pub(crate) fn creation_problem(error: KafkaError) -> (String, Option<BoxError>) {
    match &error {
        KafkaError::ClientConfig(_, description, key, value) => (
            format!(
                "librdkafka rejected the setting `{key}` = \"{}\" ({description}); fix or remove it in `properties`",
                shown_value(key, value)
            ),
            None,
        ),
        _ => ("librdkafka could not create the client".to_string(), Some(error.into())),
    }
}

/// Forwards a librdkafka log line to `tracing`.
pub(crate) fn forward_log(level: RDKafkaLogLevel, facility: &str, message: &str) {
    match level {
        RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
            tracing::warn!(target: "librdkafka", facility, "{message}")
        }
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => tracing::info!(target: "librdkafka", facility, "{message}"),
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
    }
}
