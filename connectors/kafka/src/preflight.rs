//! The source's security check at `restore`: one connection with
//! exactly-kafka-wire (TLS, ApiVersions, SASL) from the same properties
//! before librdkafka's consumer is made.
//!
//! librdkafka treats a refused password, an untrusted certificate or a TLS
//! listener reached without TLS as broker trouble and retries it for ever
//! (the source would report "did not answer" after `startup_timeout`, and
//! the pipeline restart again and again). The wire client tells these
//! misconfigurations apart and names the setting to fix, so they end the
//! pipeline at once with a fatal error instead.

use std::collections::BTreeMap;
use std::time::Duration;

use exactly_core::ConnectorError;
use exactly_kafka_wire::{WireClient, WireConfig, WireError};

/// How long the check may take; a broker slower than that (down, frozen,
/// overloaded) is left to the consumer, which waits `startup_timeout`.
const LIMIT: Duration = Duration::from_secs(5);

/// Connects once to `bootstrap` with `properties` (librdkafka's).
///
/// Contract: `Err(Fatal)` only for a misconfiguration of the client's
/// security (TLS, SASL, credentials), with the wire client's message (which
/// names the setting and the fix and never contains a password), prefixed
/// by `context`. Everything else is `Ok`: a broker that is down or slow
/// (no answer within [`LIMIT`]) is librdkafka's to retry, and properties the wire client cannot use (a
/// mechanism it does not speak) are left to librdkafka.
pub(crate) async fn check_security(
    bootstrap: &str,
    properties: &BTreeMap<String, String>,
    context: &str,
) -> Result<(), ConnectorError> {
    let config = match WireConfig::from_properties(bootstrap, properties) {
        Ok(config) => config,
        Err(error) => {
            tracing::debug!(%error, "{context}: not checking the connection's security first");
            return Ok(());
        }
    };
    match tokio::time::timeout(LIMIT, WireClient::with_config(config).connect()).await {
        Ok(Ok(_connection)) => Ok(()),
        Ok(Err(error)) if is_misconfiguration(&error) => Err(ConnectorError::fatal(context, error.to_string())),
        Err(_) => {
            tracing::debug!("{context}: no answer within {LIMIT:?}; not checking the connection's security first");
            Ok(())
        }
        Ok(Err(error)) => {
            tracing::debug!(%error, "{context}: the first connection failed; the consumer retries");
            Ok(())
        }
    }
}

/// Whether `error` is a security setting to fix, which no retry cures.
fn is_misconfiguration(error: &WireError) -> bool {
    match error {
        WireError::Tls { .. }
        | WireError::TlsExpected { .. }
        | WireError::Sasl { .. }
        | WireError::Authentication { .. } => true,
        WireError::NoBrokerReachable { last, .. } => is_misconfiguration(last),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_broker_is_left_to_the_consumer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let properties = BTreeMap::new();
        check_security(&addr.to_string(), &properties, "kafka source")
            .await
            .expect("a refused connection is not a misconfiguration");
    }

    #[tokio::test(start_paused = true)]
    async fn a_broker_that_does_not_answer_is_left_to_the_consumer() {
        // Accepts (the kernel's backlog) but never answers ApiVersions.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        check_security(&addr.to_string(), &BTreeMap::new(), "kafka source")
            .await
            .expect("a silent broker is not a misconfiguration");
        drop(listener);
    }

    #[tokio::test]
    async fn properties_the_wire_client_cannot_use_are_left_to_librdkafka() {
        let properties: BTreeMap<String, String> = [("security.protocol", "SASL_SSL"), ("sasl.mechanism", "GSSAPI")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        check_security("127.0.0.1:1", &properties, "kafka source")
            .await
            .expect("an unsupported mechanism is librdkafka's business");
    }
}
