//! SASL authentication of a fresh connection: SaslHandshake (v1: the
//! tokens then travel in SaslAuthenticate requests), then one
//! SaslAuthenticate for PLAIN or two for SCRAM.
//!
//! Refusals are [`WireError::Sasl`] (the listener does not enable the
//! mechanism, or speaks no SASL) and [`WireError::Authentication`] (wrong
//! user name or password): both name the setting to fix and are not
//! retriable.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use kafka_protocol::ResponseError;
use tracing::debug;

use crate::connection::{versions, KafkaConnection};
use crate::error::WireError;
use crate::scram::{new_nonce, ScramClient, ScramError};
use crate::security::{SaslMechanism, SaslSettings};

/// SaslHandshake v1: authentication continues in SaslAuthenticate
/// requests (v0 would send raw tokens).
const SASL_HANDSHAKE: VersionRange = versions(1, 1);
/// SaslAuthenticate v1 added `session_lifetime_ms`, v2 the flexible
/// encoding.
const SASL_AUTHENTICATE: VersionRange = versions(0, 2);

/// Authenticates `connection` with `sasl`.
pub(crate) async fn authenticate(connection: &mut KafkaConnection, sasl: &SaslSettings) -> Result<(), WireError> {
    handshake(connection, sasl.mechanism).await?;
    match sasl.mechanism {
        SaslMechanism::Plain => {
            let mut token = Vec::with_capacity(sasl.username.len() + sasl.password.len() + 2);
            token.push(0);
            token.extend_from_slice(sasl.username.as_bytes());
            token.push(0);
            token.extend_from_slice(sasl.password.as_bytes());
            let answer = exchange(connection, sasl, token).await;
            answer.map(drop)
        }
        SaslMechanism::ScramSha256 => scram::<sha2::Sha256>(connection, sasl).await,
        SaslMechanism::ScramSha512 => scram::<sha2::Sha512>(connection, sasl).await,
    }?;
    debug!(broker = %connection.addr(), mechanism = %sasl.mechanism, user = %sasl.username, "SASL authenticated");
    Ok(())
}

/// SaslHandshake: is the mechanism enabled on this listener?
async fn handshake(connection: &mut KafkaConnection, mechanism: SaslMechanism) -> Result<(), WireError> {
    let request = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism.name()));
    let version = connection.version(ApiKey::SaslHandshake, SASL_HANDSHAKE)?;
    let response = connection.request(version, &request).await?;
    let enabled: Vec<String> = response.mechanisms.iter().map(|m| m.to_string()).collect();
    match ResponseError::try_from_code(response.error_code) {
        None => Ok(()),
        Some(ResponseError::UnsupportedSaslMechanism) => Err(WireError::Sasl {
            addr: connection.addr().to_string(),
            problem: format!(
                "the listener does not enable SASL mechanism {mechanism} (it enables {})",
                if enabled.is_empty() {
                    "none".to_string()
                } else {
                    enabled.join(", ")
                }
            ),
            fix: "set sasl.mechanism to a mechanism the listener enables, or enable it on the brokers \
                  (sasl.enabled.mechanisms, with credentials for it)"
                .into(),
        }),
        Some(ResponseError::IllegalSaslState) => Err(WireError::Sasl {
            addr: connection.addr().to_string(),
            problem: "the listener does not authenticate with SASL".into(),
            fix: "set security.protocol to PLAINTEXT or SSL for this listener, or use the brokers' SASL_PLAINTEXT / \
                  SASL_SSL listener"
                .into(),
        }),
        Some(error) => Err(WireError::Broker {
            addr: connection.addr().to_string(),
            api: ApiKey::SaslHandshake,
            error,
            message: None,
        }),
    }
}

/// The SCRAM exchange: client-first, client-final, then the server's proof.
async fn scram<D>(connection: &mut KafkaConnection, sasl: &SaslSettings) -> Result<(), WireError>
where
    D: hmac::digest::Digest
        + hmac::digest::block_api::BlockSizeUser
        + hmac::digest::FixedOutputReset
        + Clone
        + Default
        + Send
        + Sync
        + 'static,
{
    let mut client = ScramClient::<D>::new(&sasl.username, &sasl.password, &new_nonce());
    let server_first = exchange(connection, sasl, client.client_first().into_bytes()).await?;
    let scram_error = |ScramError(problem): ScramError| WireError::Sasl {
        addr: connection.addr().to_string(),
        problem: format!("{} exchange failed: {problem}", sasl.mechanism),
        fix: "check that bootstrap names the Kafka brokers and sasl.mechanism what their listener enables".into(),
    };
    let client_final = client
        .client_final(&String::from_utf8_lossy(&server_first))
        .map_err(scram_error)?;
    let server_final = exchange(connection, sasl, client_final.into_bytes()).await?;
    let verified = client.verify_server_final(&String::from_utf8_lossy(&server_final));
    verified.map_err(|ScramError(problem)| WireError::Sasl {
        addr: connection.addr().to_string(),
        problem: format!("{} exchange failed: {problem}", sasl.mechanism),
        fix: "check that bootstrap names the Kafka brokers and sasl.mechanism what their listener enables".into(),
    })
}

/// One SaslAuthenticate round trip; the broker's token back.
async fn exchange(connection: &mut KafkaConnection, sasl: &SaslSettings, token: Vec<u8>) -> Result<Bytes, WireError> {
    let version = connection.version(ApiKey::SaslAuthenticate, SASL_AUTHENTICATE)?;
    let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
    let response = connection.request(version, &request).await?;
    match ResponseError::try_from_code(response.error_code) {
        None => Ok(response.auth_bytes),
        Some(ResponseError::SaslAuthenticationFailed) => Err(WireError::Authentication {
            addr: connection.addr().to_string(),
            mechanism: sasl.mechanism,
            username: sasl.username.clone(),
            message: response.error_message.map(|m| m.to_string()).unwrap_or_default(),
        }),
        Some(error) => Err(WireError::Broker {
            addr: connection.addr().to_string(),
            api: ApiKey::SaslAuthenticate,
            error,
            message: response.error_message.map(|m| m.to_string()),
        }),
    }
}
