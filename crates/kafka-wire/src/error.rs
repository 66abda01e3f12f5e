//! The one error type of this crate.

use std::time::Duration;

use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

/// Everything that can go wrong talking to a broker.
///
/// Every variant names the broker address (or bootstrap list) and, where one
/// was involved, the Kafka API, so a message is actionable on its own.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A client setting asks for something this crate does not implement
    /// (GSSAPI, keystores, ...). `what` names the setting and its value.
    #[error("{what} is not supported by exactly-kafka-wire; {fix}")]
    Unsupported {
        /// The unsupported feature and the setting that asked for it.
        what: String,
        /// What to do instead.
        fix: &'static str,
    },

    /// A setting or argument is malformed (an empty bootstrap list, a
    /// server without a port, ...).
    #[error("invalid Kafka client setting `{key}`: {message}")]
    InvalidConfig {
        /// The offending setting.
        key: String,
        /// What is wrong with it.
        message: String,
    },

    /// The TCP connection could not be opened.
    #[error("connecting to Kafka broker {addr}: {source}")]
    Connect {
        /// The broker address.
        addr: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Reading or writing the socket failed (the broker closed the
    /// connection, reset it, ...). The connection is unusable afterwards.
    #[error("{api:?} request to Kafka broker {addr}: {source}")]
    Io {
        /// The broker address.
        addr: String,
        /// The API of the request in flight.
        api: ApiKey,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The broker closed the connection instead of (completely) answering:
    /// it is going down or restarting, or a proxy dropped the connection.
    /// Nothing is known about the request's effect; retriable.
    #[error("Kafka broker {addr} closed the connection instead of answering {api:?}")]
    Closed {
        /// The broker address.
        addr: String,
        /// The API of the request in flight.
        api: ApiKey,
    },

    /// TLS could not be set up with the broker: its certificate is not
    /// trusted or not issued for the host, it speaks no TLS, ... Not
    /// retriable: a setting must change.
    #[error("TLS with Kafka broker {addr} failed: {problem}; fix: {fix}")]
    Tls {
        /// The broker address.
        addr: String,
        /// What went wrong.
        problem: String,
        /// The setting that fixes it.
        fix: String,
    },

    /// The broker answered in TLS (an alert) to a connection without TLS:
    /// the listener is an `SSL` or `SASL_SSL` one. Not retriable.
    #[error(
        "Kafka broker {addr} speaks TLS on this listener, and this connection does not \
         (security.protocol={protocol}); fix: set security.protocol=SSL, or SASL_SSL if the listener \
         authenticates with SASL, and ssl.ca.location to the CA of its certificate"
    )]
    TlsExpected {
        /// The broker address.
        addr: String,
        /// The `security.protocol` in use.
        protocol: crate::security::SecurityProtocol,
    },

    /// SASL authentication could not even be attempted: the listener does
    /// not enable the mechanism, or does not speak SASL. Not retriable.
    #[error("SASL with Kafka broker {addr} failed: {problem}; fix: {fix}")]
    Sasl {
        /// The broker address.
        addr: String,
        /// What went wrong.
        problem: String,
        /// The setting that fixes it.
        fix: String,
    },

    /// The broker refused the credentials (SASL_AUTHENTICATION_FAILED).
    /// Not retriable.
    #[error(
        "Kafka broker {addr} refused the {mechanism} credentials of user `{username}`: {message}; \
         fix: check sasl.username and sasl.password (and that the broker has {mechanism} credentials for the user)"
    )]
    Authentication {
        /// The broker address.
        addr: String,
        /// The mechanism used.
        mechanism: crate::security::SaslMechanism,
        /// The user name (never the password).
        username: String,
        /// The broker's message.
        message: String,
    },

    /// The broker did not answer in time. The connection is unusable
    /// afterwards.
    #[error("{api:?} request to Kafka broker {addr} got no answer within {after:?}")]
    Timeout {
        /// The broker address.
        addr: String,
        /// The API of the request in flight.
        api: ApiKey,
        /// The timeout that elapsed.
        after: Duration,
    },

    /// A message could not be encoded or a response could not be decoded.
    #[error("{api:?} v{version} with Kafka broker {addr}: {message}")]
    Codec {
        /// The broker address.
        addr: String,
        /// The API of the message.
        api: ApiKey,
        /// The API version used.
        version: i16,
        /// What went wrong.
        message: String,
    },

    /// The byte stream broke the protocol (a wrong correlation id, an
    /// absurd frame length, a corrupt record batch, ...).
    #[error("Kafka broker {addr} broke the protocol: {message}")]
    Protocol {
        /// The broker address.
        addr: String,
        /// What was wrong.
        message: String,
    },

    /// The broker does not offer any version of an API that this client
    /// speaks (`broker` is `None` when it does not offer the API at all).
    #[error(
        "Kafka broker {addr} does not support {api:?} in a version this client speaks \
         (broker: {}, client: {client})",
        broker.map_or_else(|| "none".to_string(), |range| range.to_string())
    )]
    ApiNotSupported {
        /// The broker address.
        addr: String,
        /// The API.
        api: ApiKey,
        /// The versions the broker advertised, if any.
        broker: Option<VersionRange>,
        /// The versions this client implements.
        client: VersionRange,
    },

    /// The broker answered with an error code.
    #[error("{api:?} on Kafka broker {addr} failed: {error}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Broker {
        /// The broker address.
        addr: String,
        /// The API of the request.
        api: ApiKey,
        /// The Kafka error.
        error: ResponseError,
        /// The broker's error message, when it sent one.
        message: Option<String>,
    },

    /// No server of the bootstrap list could be reached.
    #[error("no Kafka broker of `{bootstrap}` could be reached; last error: {last}")]
    NoBrokerReachable {
        /// The bootstrap list.
        bootstrap: String,
        /// The error of the last server tried.
        last: Box<WireError>,
    },

    /// The task of a [`Fetcher`](crate::Fetcher) ended without saying why
    /// (it panicked; the log tells more).
    #[error("the fetcher of topic `{topic}` stopped unexpectedly; see the log for a panic")]
    FetcherStopped {
        /// The topic it read.
        topic: String,
    },

    /// A partition's log no longer holds what a position passed: an unclean
    /// leader election (or a lost disk) truncated it below the position,
    /// and the records between the divergence and the position are gone or
    /// were replaced by others (KIP-320's check with OffsetForLeaderEpoch).
    #[error(
        "the log of {topic}/{partition} was truncated below the position read: the position is offset {position} \
         after a record of leader epoch {epoch}, but the leader's log {}",
        match divergence {
            Some((offset, epoch)) => format!(
                "diverges at offset {offset} (leader epoch {epoch} ends there): the records from {offset} to {} \
                 that were read no longer exist, and new records take their offsets",
                position - 1
            ),
            None => format!("has no record of leader epoch {epoch} (nothing tells where it diverges)"),
        }
    )]
    LogTruncated {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The position: the next offset to read.
        position: i64,
        /// The leader epoch of the last record before the position.
        epoch: i32,
        /// The first offset past the last record the log still shares with
        /// what was read, with the epoch it belongs to; `None` when the
        /// leader cannot tell.
        divergence: Option<(i64, i32)>,
    },

    /// The topic read was deleted and a topic of the same name created: its
    /// offsets mean nothing for the new one.
    #[error(
        "topic `{topic}` was deleted and created again: it had id {was} when it was read, and has id {now} now; \
         the positions read belong to the old topic"
    )]
    TopicRecreated {
        /// The topic's name.
        topic: String,
        /// The id of the topic the positions belong to.
        was: crate::TopicId,
        /// The id of the topic of that name now.
        now: crate::TopicId,
    },

    /// The topic read is missing from the cluster's metadata, for longer
    /// than the fetcher waits for it to come back.
    #[error("topic `{topic}` has been missing from the metadata of `{bootstrap}` for {missing_for:?} (deleted?)")]
    TopicMissing {
        /// The topic's name.
        topic: String,
        /// The bootstrap servers asked.
        bootstrap: String,
        /// How long it has been missing.
        missing_for: std::time::Duration,
    },

    /// Reading a partition stopped advancing before its high watermark.
    #[error(
        "reading {topic}/{partition} from Kafka broker {addr} stalled at offset {offset} \
         (high watermark {})",
        high_watermark.map_or_else(|| "unknown".to_string(), |hw| hw.to_string())
    )]
    Stalled {
        /// The broker address.
        addr: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The next offset to read.
        offset: i64,
        /// The partition's high watermark, if the broker reported one.
        high_watermark: Option<i64>,
    },
}

impl WireError {
    /// The Kafka error code, when the broker answered with one.
    pub fn broker_error(&self) -> Option<ResponseError> {
        match self {
            WireError::Broker { error, .. } => Some(*error),
            _ => None,
        }
    }

    /// Whether retrying the same call later may succeed: the broker could
    /// not be reached, timed out, or answered with a retriable error code.
    /// Refused credentials, TLS failures and settings that do not fit the
    /// listener are not: a setting must change.
    pub fn is_retriable(&self) -> bool {
        match self {
            WireError::Connect { .. }
            | WireError::Io { .. }
            | WireError::Closed { .. }
            | WireError::Timeout { .. }
            | WireError::Stalled { .. } => true,
            WireError::NoBrokerReachable { last, .. } => last.is_retriable(),
            WireError::Broker { error, .. } => error.is_retriable(),
            _ => false,
        }
    }

    /// `Err(Broker)` for a non-zero error `code`, `Ok(())` for zero.
    pub(crate) fn check(addr: &str, api: ApiKey, code: i16, message: Option<&str>) -> Result<(), WireError> {
        match ResponseError::try_from_code(code) {
            None => Ok(()),
            Some(error) => Err(WireError::Broker {
                addr: addr.to_string(),
                api,
                error,
                message: message.map(str::to_string),
            }),
        }
    }
}
