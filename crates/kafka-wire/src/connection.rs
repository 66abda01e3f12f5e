//! One connection to one broker (TCP, or TLS over TCP): framing, headers,
//! correlation ids, the ApiVersions handshake and SASL authentication.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes, VersionRange};
use kafka_protocol::ResponseError;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{debug, trace};

use crate::config::ConnectionOptions;
use crate::error::WireError;
use crate::security::SecurityProtocol;

/// Largest response frame accepted (a fetch answer is bounded by the
/// request's `max_bytes`, far below this).
const MAX_FRAME: usize = 256 * 1024 * 1024;

/// The ApiVersions versions this client speaks. v3 added the flexible
/// (tagged-field) encoding and client software name/version.
const API_VERSIONS: VersionRange = VersionRange { min: 0, max: 3 };

/// `VersionRange { min, max }` in a `const`.
pub(crate) const fn versions(min: i16, max: i16) -> VersionRange {
    VersionRange { min, max }
}

/// The byte stream under a connection: TCP, or TLS over TCP.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send + Sync + std::fmt::Debug {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + std::fmt::Debug> Stream for T {}

/// An open connection to one Kafka broker.
///
/// [`connect`](Self::connect) opens the socket, sets up TLS and performs
/// the ApiVersions handshake, so [`version`](Self::version) can pick, for
/// each API, the highest version both sides support, then authenticates
/// with SASL when the [`ConnectionOptions::security`] say so. [`request`](Self::request) sends one
/// request and waits for its answer; requests are not pipelined.
///
/// After an I/O error, a timeout or a protocol violation the connection is
/// closed and every later request fails: open a new one.
#[derive(Debug)]
pub struct KafkaConnection {
    addr: String,
    stream: Option<Box<dyn Stream>>,
    protocol: SecurityProtocol,
    next_correlation_id: i32,
    client_id: StrBytes,
    request_timeout: Duration,
    broker_versions: BTreeMap<i16, VersionRange>,
}

impl KafkaConnection {
    /// Connects to `addr` (`HOST:PORT`) with default [`ConnectionOptions`].
    pub async fn connect(addr: &str) -> Result<KafkaConnection, WireError> {
        Self::connect_with(addr, &ConnectionOptions::default()).await
    }

    /// Connects to `addr` (`HOST:PORT`), sets up TLS if the options ask
    /// for it, performs the ApiVersions handshake and authenticates with
    /// SASL if the options ask for it — all of it within the options'
    /// `connect_timeout` (`socket.connection.setup.timeout.ms`, 10 s by
    /// default): a broker whose process is frozen still accepts TCP
    /// connections (the kernel answers for it) but never answers
    /// ApiVersions, and must not hold a caller for a whole request timeout.
    pub async fn connect_with(addr: &str, options: &ConnectionOptions) -> Result<KafkaConnection, WireError> {
        match tokio::time::timeout(options.connect_timeout, Self::set_up(addr, options)).await {
            Ok(result) => result,
            Err(_) => Err(WireError::Connect {
                addr: addr.to_string(),
                source: io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "connection not set up (TCP, TLS, ApiVersions, SASL) within {:?}",
                        options.connect_timeout
                    ),
                ),
            }),
        }
    }

    async fn set_up(addr: &str, options: &ConnectionOptions) -> Result<KafkaConnection, WireError> {
        let connect_error = |source| WireError::Connect {
            addr: addr.to_string(),
            source,
        };
        let stream = tokio::time::timeout(options.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                connect_error(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {:?}", options.connect_timeout),
                ))
            })?
            .map_err(connect_error)?;
        // Requests are small and answered one at a time: don't let Nagle delay them.
        stream.set_nodelay(true).map_err(connect_error)?;
        let security = &options.security;
        let stream: Box<dyn Stream> = match &security.tls {
            Some(tls) if security.protocol.uses_tls() => {
                let config = crate::tls::client_config(tls)?;
                let handshake = crate::tls::handshake(config, addr, stream);
                let tls = tokio::time::timeout(options.connect_timeout, handshake)
                    .await
                    .map_err(|_| {
                        connect_error(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no TLS handshake within {:?}", options.connect_timeout),
                        ))
                    })??;
                Box::new(tls)
            }
            _ => Box::new(stream),
        };
        let mut connection = KafkaConnection {
            addr: addr.to_string(),
            stream: Some(stream),
            protocol: security.protocol,
            next_correlation_id: 0,
            client_id: StrBytes::from_string(options.client_id.clone()),
            request_timeout: options.request_timeout,
            broker_versions: BTreeMap::new(),
        };
        connection.handshake().await?;
        if let Some(sasl) = security.sasl.as_ref().filter(|_| security.protocol.uses_sasl()) {
            crate::sasl::authenticate(&mut connection, sasl).await?;
        }
        Ok(connection)
    }

    /// The broker's address, as connected to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The versions of `api` the broker advertised, `None` if it does not
    /// offer the API.
    pub fn broker_versions(&self, api: ApiKey) -> Option<VersionRange> {
        self.broker_versions.get(&(api as i16)).copied()
    }

    /// Every API the broker advertised with its versions, by API key.
    pub fn advertised_apis(&self) -> impl Iterator<Item = (i16, VersionRange)> + '_ {
        self.broker_versions.iter().map(|(key, range)| (*key, *range))
    }

    /// The highest version of `api` that the broker advertises, this crate
    /// can encode, and the caller speaks (`client`).
    pub fn version(&self, api: ApiKey, client: VersionRange) -> Result<i16, WireError> {
        let ours = client.intersect(&api.valid_versions());
        let broker = self.broker_versions(api);
        match broker.map(|range| range.intersect(&ours)) {
            Some(common) if !common.is_empty() => Ok(common.max),
            _ => Err(WireError::ApiNotSupported {
                addr: self.addr.clone(),
                api,
                broker,
                client: ours,
            }),
        }
    }

    /// Sends `body` as version `version` of its API and returns the decoded
    /// answer. Request and response header versions follow the API version
    /// (flexible versions use header v2 / v1, except ApiVersions responses,
    /// which always use header v0).
    pub async fn request<R>(&mut self, version: i16, body: &R) -> Result<R::Response, WireError>
    where
        R: Request + std::fmt::Debug,
    {
        let api = api_key::<R>();
        let mut payload = self.exchange(api, version, body).await?;
        decode_body::<R::Response>(&self.addr, api, version, &mut payload)
    }

    /// Sends `body` at the highest version within `client` that the broker
    /// supports; returns that version with the answer.
    pub async fn negotiated_request<R>(
        &mut self,
        client: VersionRange,
        body: &R,
    ) -> Result<(i16, R::Response), WireError>
    where
        R: Request + std::fmt::Debug,
    {
        let version = self.version(api_key::<R>(), client)?;
        let response = self.request(version, body).await?;
        Ok((version, response))
    }

    /// ApiVersions at the highest version this client speaks; a broker that
    /// does not know it answers UNSUPPORTED_VERSION in the v0 format with its
    /// own range, and the request is repeated in that range. A refusal that
    /// is not in the v0 format (librdkafka's mock cluster answers a v3
    /// request with a one-byte array count) is retried one version lower.
    async fn handshake(&mut self) -> Result<(), WireError> {
        let api = ApiKey::ApiVersions;
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("exactly-kafka-wire"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let mut version = API_VERSIONS.max;
        let response = loop {
            let mut payload = self.exchange(api, version, &request).await?;
            // The answer starts with its error code in every version; an
            // UNSUPPORTED_VERSION answer is always in the v0 format.
            let unsupported = payload.get(..2) == Some(&ResponseError::UnsupportedVersion.code().to_be_bytes()[..]);
            let decode_version = if unsupported { 0 } else { version };
            let response = match decode_body::<ApiVersionsResponse>(&self.addr, api, decode_version, &mut payload) {
                Ok(response) => response,
                Err(error) if unsupported && version > API_VERSIONS.min => {
                    debug!(broker = %self.addr, version, %error, "undecodable ApiVersions refusal; trying one version lower");
                    version -= 1;
                    continue;
                }
                Err(error) => return Err(error),
            };
            if !unsupported {
                break response;
            }
            let theirs = response.api_keys.iter().find(|key| key.api_key == api as i16);
            let retry = theirs.map(|key| key.max_version.min(API_VERSIONS.max));
            match retry {
                Some(retry) if retry < version && retry >= API_VERSIONS.min => version = retry,
                _ => break response,
            }
        };
        WireError::check(&self.addr, api, response.error_code, None)?;
        self.broker_versions = response
            .api_keys
            .iter()
            .map(|key| (key.api_key, versions(key.min_version, key.max_version)))
            .collect();
        debug!(
            broker = %self.addr,
            api_versions_version = version,
            apis = self.broker_versions.len(),
            "connected to Kafka broker"
        );
        Ok(())
    }

    /// Sends one framed request and returns the response body (after its
    /// header). Any failure closes the connection.
    async fn exchange<R>(&mut self, api: ApiKey, version: i16, body: &R) -> Result<Bytes, WireError>
    where
        R: Request + std::fmt::Debug,
    {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let frame = self.frame(api, version, correlation_id, body)?;
        let response_header_version = R::Response::header_version(version);
        let Some(stream) = self.stream.as_mut() else {
            let source = io::Error::new(
                io::ErrorKind::NotConnected,
                "connection closed after an earlier failure",
            );
            return Err(WireError::Io {
                addr: self.addr.clone(),
                api,
                source,
            });
        };
        trace!(broker = %self.addr, ?api, version, correlation_id, ?body, "request");
        let outcome = tokio::time::timeout(self.request_timeout, roundtrip(stream.as_mut(), &frame)).await;
        let result = match outcome {
            Err(_) => Err(WireError::Timeout {
                addr: self.addr.clone(),
                api,
                after: self.request_timeout,
            }),
            Ok(Err(Failed::TlsRecord)) if !self.protocol.uses_tls() => Err(WireError::TlsExpected {
                addr: self.addr.clone(),
                protocol: self.protocol,
            }),
            Ok(Err(Failed::TlsRecord)) => Err(WireError::Protocol {
                addr: self.addr.clone(),
                message: "a TLS record inside the TLS connection instead of a Kafka answer".into(),
            }),
            Ok(Err(Failed::Io(source))) if source.kind() == io::ErrorKind::UnexpectedEof => Err(WireError::Closed {
                addr: self.addr.clone(),
                api,
            }),
            Ok(Err(Failed::Io(source))) => Err(WireError::Io {
                addr: self.addr.clone(),
                api,
                source,
            }),
            Ok(Ok(mut payload)) => {
                decode_body::<ResponseHeader>(&self.addr, api, response_header_version, &mut payload).and_then(
                    |header| {
                        if header.correlation_id == correlation_id {
                            Ok(payload)
                        } else {
                            Err(WireError::Protocol {
                                addr: self.addr.clone(),
                                message: format!(
                                    "answer to {api:?} carries correlation id {}, expected {correlation_id}",
                                    header.correlation_id
                                ),
                            })
                        }
                    },
                )
            }
        };
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    /// Length prefix, request header (version chosen for `api`/`version`)
    /// and body.
    fn frame<R: Request>(&self, api: ApiKey, version: i16, correlation_id: i32, body: &R) -> Result<Bytes, WireError> {
        let codec_error = |message: String| WireError::Codec {
            addr: self.addr.clone(),
            api,
            version,
            message,
        };
        if version < R::VERSIONS.min || version > R::VERSIONS.max {
            return Err(codec_error(format!("version {version} is outside {}", R::VERSIONS)));
        }
        let header = RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let mut frame = BytesMut::with_capacity(256);
        frame.put_i32(0);
        header
            .encode(&mut frame, R::header_version(version))
            .map_err(|e| codec_error(e.to_string()))?;
        body.encode(&mut frame, version)
            .map_err(|e| codec_error(e.to_string()))?;
        let length = i32::try_from(frame.len() - 4).map_err(|_| codec_error("request too large".into()))?;
        frame[..4].copy_from_slice(&length.to_be_bytes());
        Ok(frame.freeze())
    }
}

/// Why a round trip failed.
enum Failed {
    Io(io::Error),
    /// The answer starts like a TLS record (an alert or a handshake
    /// message), not with a frame length: the listener speaks TLS.
    TlsRecord,
}

impl From<io::Error> for Failed {
    fn from(error: io::Error) -> Failed {
        Failed::Io(error)
    }
}

/// Writes `frame` and reads one length-prefixed answer.
async fn roundtrip(stream: &mut dyn Stream, frame: &[u8]) -> Result<Bytes, Failed> {
    stream.write_all(frame).await?;
    stream.flush().await?;
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix).await?;
    if looks_like_tls(prefix) {
        return Err(Failed::TlsRecord);
    }
    let length = i32::from_be_bytes(prefix);
    let length = usize::try_from(length)
        .ok()
        .filter(|length| *length <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("absurd response length {length}")))?;
    let mut payload = vec![0; length];
    stream.read_exact(&mut payload).await?;
    Ok(Bytes::from(payload))
}

/// Whether 4 bytes start a TLS record (content type alert 21 or handshake
/// 22, major version 3): as a frame length they would exceed 350 MB, far
/// beyond [`MAX_FRAME`], so no Kafka answer starts like this.
pub(crate) fn looks_like_tls(prefix: [u8; 4]) -> bool {
    matches!(prefix, [0x15 | 0x16, 0x03, 0x00..=0x04, _])
}

/// Decodes a response header or body, naming the API on failure.
fn decode_body<T: Decodable>(addr: &str, api: ApiKey, version: i16, payload: &mut Bytes) -> Result<T, WireError> {
    T::decode(payload, version).map_err(|e| WireError::Codec {
        addr: addr.to_string(),
        api,
        version,
        message: format!("undecodable answer: {e}"),
    })
}

/// The [`ApiKey`] of request type `R`.
pub(crate) fn api_key<R: Request>() -> ApiKey {
    ApiKey::try_from(R::KEY).expect("every kafka-protocol request type has a known API key")
}

#[cfg(test)]
mod tests;
