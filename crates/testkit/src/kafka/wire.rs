//! Blocking Kafka requests on a loopback TCP connection, encoded and
//! decoded with `kafka-protocol`: what the kit needs to see whether a
//! broker is ready and to drive a cluster (topics, elections, a few
//! records), without a client library.
//!
//! The kit cannot use `exactly-kafka-wire` (that crate tests itself with
//! this kit), and a JVM tool costs seconds per call; Kafka 4.x serves every
//! request used here in the versions chosen by the callers.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use kafka_protocol::ResponseError;

/// The client id the kit's requests carry.
const CLIENT_ID: &str = "exactly-testkit";
/// Bound on an answer's size (a fetch of a test's records stays far below).
const MAX_ANSWER: usize = 64 << 20;

/// Why a request to a broker did not get a usable answer.
#[derive(Debug, thiserror::Error)]
pub enum KafkaRequestError {
    /// Connecting, sending or receiving failed (nothing listens, the
    /// connection closed, the broker did not answer in time).
    #[error("no answer from 127.0.0.1:{port}: {source}")]
    Io {
        /// The broker's port.
        port: u16,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The request could not be encoded, or the answer decoded, in the
    /// version asked for.
    #[error("cannot {what} API {api_key} v{version}: {source}")]
    Codec {
        /// `encode the request of` or `decode the answer of`.
        what: &'static str,
        /// The API key.
        api_key: i16,
        /// The version.
        version: i16,
        /// What `kafka-protocol` said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The answer lacks what the request asked for.
    #[error("the broker's answer lacks {what}")]
    Incomplete {
        /// What is missing.
        what: String,
    },
    /// The broker answered with an error code.
    #[error("the broker answered {error} ({}){}", error.code(), message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Broker {
        /// The error.
        #[source]
        error: ResponseError,
        /// The broker's message, when it gave one.
        message: Option<String>,
    },
}

impl KafkaRequestError {
    /// The broker's error for `code` (`None` for 0, no error), with its
    /// message.
    pub(crate) fn from_code(code: i16, message: Option<&StrBytes>) -> Option<KafkaRequestError> {
        ResponseError::try_from_code(code).map(|error| KafkaRequestError::Broker {
            error,
            message: message.map(|m| m.to_string()),
        })
    }

    /// The broker's error, if the broker answered with one.
    pub fn response_error(&self) -> Option<ResponseError> {
        match self {
            KafkaRequestError::Broker { error, .. } => Some(*error),
            _ => None,
        }
    }

    /// Whether trying again later may succeed: a socket error (the broker
    /// may be starting or electing) or an error Kafka calls retriable.
    pub fn is_retriable(&self) -> bool {
        match self {
            KafkaRequestError::Io { .. } => true,
            KafkaRequestError::Codec { .. } | KafkaRequestError::Incomplete { .. } => false,
            KafkaRequestError::Broker { error, .. } => error.is_retriable(),
        }
    }
}

/// One TCP connection to a broker on `127.0.0.1`.
#[derive(Debug)]
pub(crate) struct Connection {
    stream: TcpStream,
    port: u16,
    correlation_id: i32,
}

impl Connection {
    /// Connects to `127.0.0.1:port`; `timeout` bounds the connection and
    /// every read and write after it.
    pub(crate) fn open(port: u16, timeout: Duration) -> Result<Connection, KafkaRequestError> {
        let io = |source| KafkaRequestError::Io { port, source };
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        let _ = stream.set_nodelay(true);
        Ok(Connection {
            stream,
            port,
            correlation_id: 0x7e57_0000,
        })
    }

    /// Sends `request` in `version` and waits for its answer.
    pub(crate) fn send<R: Request>(&mut self, version: i16, request: &R) -> Result<R::Response, KafkaRequestError> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let frame = frame(self.correlation_id, version, request)?;
        let io = |source| KafkaRequestError::Io {
            port: self.port,
            source,
        };
        self.stream.write_all(&frame).map_err(io)?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(io)?;
        let size = usize::try_from(i32::from_be_bytes(size))
            .ok()
            .filter(|size| *size <= MAX_ANSWER)
            .ok_or_else(|| io(std::io::Error::other("an answer of a size no broker sends")))?;
        let mut answer = vec![0u8; size];
        self.stream.read_exact(&mut answer).map_err(io)?;
        parse::<R>(Bytes::from(answer), self.correlation_id, version).map_err(|err| match err {
            Answer::Codec(source) => KafkaRequestError::Codec {
                what: "decode the answer of",
                api_key: R::KEY,
                version,
                source,
            },
            Answer::Other(reason) => io(std::io::Error::other(reason)),
        })
    }
}

/// Length prefix, request header and `request`.
fn frame<R: Request>(correlation_id: i32, version: i16, request: &R) -> Result<Bytes, KafkaRequestError> {
    let codec = |source: Box<dyn std::error::Error + Send + Sync>| KafkaRequestError::Codec {
        what: "encode the request of",
        api_key: R::KEY,
        version,
        source,
    };
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    header
        .encode(&mut frame, R::header_version(version))
        .map_err(|e| codec(e.into()))?;
    request.encode(&mut frame, version).map_err(|e| codec(e.into()))?;
    let length = i32::try_from(frame.len() - 4).map_err(|e| codec(e.into()))?;
    frame[..4].copy_from_slice(&length.to_be_bytes());
    Ok(frame.freeze())
}

/// Why an answer was not the one expected.
enum Answer {
    Codec(Box<dyn std::error::Error + Send + Sync>),
    Other(String),
}

fn parse<R: Request>(mut answer: Bytes, correlation_id: i32, version: i16) -> Result<R::Response, Answer> {
    let header = ResponseHeader::decode(&mut answer, R::Response::header_version(version))
        .map_err(|e| Answer::Codec(e.into()))?;
    if header.correlation_id != correlation_id {
        return Err(Answer::Other(format!(
            "an answer to request {} where {correlation_id} was expected",
            header.correlation_id
        )));
    }
    let response = R::Response::decode(&mut answer, version).map_err(|e| Answer::Codec(e.into()))?;
    if answer.has_remaining() {
        return Err(Answer::Other(format!(
            "{} bytes after the answer: not a Kafka answer in this version",
            answer.remaining()
        )));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};

    use super::*;

    /// A server answering one request with what `answer` makes of it.
    fn serve_once(
        answer: impl FnOnce(RequestHeader, Bytes) -> Vec<u8> + Send + 'static,
    ) -> (u16, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut size = [0u8; 4];
            stream.read_exact(&mut size).unwrap();
            let mut request = vec![0u8; i32::from_be_bytes(size) as usize];
            stream.read_exact(&mut request).unwrap();
            let mut request = Bytes::from(request);
            let header = RequestHeader::decode(&mut request, MetadataRequest::header_version(12)).unwrap();
            let body = answer(header, request);
            stream.write_all(&(body.len() as i32).to_be_bytes()).unwrap();
            stream.write_all(&body).unwrap();
        });
        (port, server)
    }

    fn metadata_answer(correlation_id: i32, trailing: &[u8]) -> Vec<u8> {
        let mut buf = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(&mut buf, MetadataResponse::header_version(12))
            .unwrap();
        MetadataResponse::default()
            .with_cluster_id(Some(StrBytes::from_static_str("c1")))
            .encode(&mut buf, 12)
            .unwrap();
        buf.extend_from_slice(trailing);
        buf.to_vec()
    }

    #[test]
    fn a_request_goes_out_framed_and_its_answer_comes_back_decoded() {
        let (port, server) = serve_once(|header, mut body| {
            assert_eq!(header.request_api_key, MetadataRequest::KEY);
            assert_eq!(header.request_api_version, 12);
            assert_eq!(header.client_id.as_deref(), Some(CLIENT_ID));
            let request = MetadataRequest::decode(&mut body, 12).unwrap();
            assert_eq!(request.topics, Some(Vec::new()));
            metadata_answer(header.correlation_id, &[])
        });
        let mut connection = Connection::open(port, Duration::from_secs(5)).unwrap();
        let response = connection
            .send(12, &MetadataRequest::default().with_topics(Some(Vec::new())))
            .unwrap();
        assert_eq!(response.cluster_id.as_deref(), Some("c1"));
        server.join().unwrap();
    }

    #[test]
    fn an_answer_to_another_request_or_with_bytes_left_is_refused() {
        for (shift, trailing) in [(1, &[][..]), (0, &[0u8, 1][..])] {
            let (port, server) = serve_once(move |header, _| metadata_answer(header.correlation_id + shift, trailing));
            let mut connection = Connection::open(port, Duration::from_secs(5)).unwrap();
            let err = connection
                .send(12, &MetadataRequest::default().with_topics(Some(Vec::new())))
                .unwrap_err();
            assert!(matches!(err, KafkaRequestError::Io { .. }), "{err}");
            server.join().unwrap();
        }
    }

    #[test]
    fn broker_errors_carry_their_name_and_message() {
        assert!(KafkaRequestError::from_code(0, None).is_none());
        let message = StrBytes::from_static_str("not now");
        let err = KafkaRequestError::from_code(6, Some(&message)).unwrap();
        assert_eq!(err.response_error(), Some(ResponseError::NotLeaderOrFollower));
        assert!(err.is_retriable());
        assert_eq!(err.to_string(), "the broker answered NotLeaderOrFollower (6): not now");
    }
}
