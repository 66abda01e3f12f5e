//! Glue between librdkafka and the sink's producers and the admin client:
//! client settings, creation errors, log forwarding.

use exactly_core::ConnectorError;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;

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

/// Turns a client creation failure into a fatal configuration error.
pub(crate) fn creation_error(what: &str, error: KafkaError) -> ConnectorError {
    let message = match &error {
        KafkaError::ClientConfig(_, description, key, value) => {
            let value = if crate::config::is_secret_property(key) {
                "***"
            } else {
                value.as_str()
            };
            format!("librdkafka rejected the setting `{key}` = \"{value}\" ({description}); fix or remove it in `properties`")
        }
        other => other.to_string(),
    };
    ConnectorError::fatal(what, message)
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
