//! Whether a broker is ready: it answers a Metadata request listing at
//! least one broker and an elected controller.
//!
//! An open port proves little: a JVM broker accepts connections before it
//! registered with its controller, and a published Docker port accepts them
//! before anything listens inside. One blocking Metadata round trip
//! (encoded with `kafka-protocol`) is what a client's first request needs.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, MetadataRequest, MetadataResponse, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};

/// Metadata v12: served by every Kafka from 3.0 on (4.x serves v4–v13).
const METADATA_VERSION: i16 = 12;
const CORRELATION_ID: i32 = 0x7e57_0001;
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on an answer's size: a Metadata answer without topics is small.
const MAX_ANSWER: usize = 1 << 20;

/// What a ready broker told about its cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClusterInfo {
    /// The cluster id (`None` when the broker reports none).
    pub(crate) cluster_id: Option<String>,
    /// How many brokers the cluster lists.
    pub(crate) brokers: usize,
}

/// `Some` once the broker on `127.0.0.1:port` answers Metadata with at
/// least one broker and a controller; `None` while it cannot (nothing
/// listens, the connection closes, the answer is not Kafka's, no broker is
/// registered yet).
pub(crate) fn metadata_answered(port: u16) -> Option<ClusterInfo> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT)).ok()?;
    stream.write_all(&request_frame()?).ok()?;
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).ok()?;
    let size = usize::try_from(i32::from_be_bytes(size))
        .ok()
        .filter(|size| *size <= MAX_ANSWER)?;
    let mut answer = vec![0u8; size];
    stream.read_exact(&mut answer).ok()?;
    parse_answer(Bytes::from(answer))
}

/// Length prefix, request header and a Metadata request for no topics.
fn request_frame() -> Option<Bytes> {
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Metadata as i16)
        .with_request_api_version(METADATA_VERSION)
        .with_correlation_id(CORRELATION_ID)
        .with_client_id(Some(StrBytes::from_static_str("exactly-testkit")));
    let request = MetadataRequest::default()
        .with_topics(Some(Vec::new()))
        .with_allow_auto_topic_creation(false);
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    header
        .encode(&mut frame, MetadataRequest::header_version(METADATA_VERSION))
        .ok()?;
    request.encode(&mut frame, METADATA_VERSION).ok()?;
    let length = i32::try_from(frame.len() - 4).ok()?;
    frame[..4].copy_from_slice(&length.to_be_bytes());
    Some(frame.freeze())
}

fn parse_answer(mut answer: Bytes) -> Option<ClusterInfo> {
    let header = ResponseHeader::decode(&mut answer, MetadataResponse::header_version(METADATA_VERSION)).ok()?;
    if header.correlation_id != CORRELATION_ID {
        return None;
    }
    let response = MetadataResponse::decode(&mut answer, METADATA_VERSION).ok()?;
    if answer.has_remaining() || response.brokers.is_empty() || response.controller_id.0 < 0 {
        return None;
    }
    Some(ClusterInfo {
        cluster_id: response.cluster_id.map(|id| id.to_string()),
        brokers: response.brokers.len(),
    })
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
    use kafka_protocol::messages::BrokerId;

    use super::*;

    fn answer(brokers: usize, controller: i32, correlation_id: i32) -> Bytes {
        let header = ResponseHeader::default().with_correlation_id(correlation_id);
        let response = MetadataResponse::default()
            .with_cluster_id(Some(StrBytes::from_static_str("cluster-1")))
            .with_controller_id(BrokerId(controller))
            .with_brokers(
                (0..brokers)
                    .map(|n| {
                        MetadataResponseBroker::default()
                            .with_node_id(BrokerId(n as i32))
                            .with_host(StrBytes::from_static_str("127.0.0.1"))
                            .with_port(9092)
                    })
                    .collect(),
            );
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, MetadataResponse::header_version(METADATA_VERSION))
            .unwrap();
        response.encode(&mut buf, METADATA_VERSION).unwrap();
        buf.freeze()
    }

    #[test]
    fn a_cluster_with_a_broker_and_a_controller_is_ready() {
        let info = parse_answer(answer(1, 1, CORRELATION_ID)).expect("ready");
        assert_eq!(info.brokers, 1);
        assert_eq!(info.cluster_id.as_deref(), Some("cluster-1"));
    }

    #[test]
    fn no_broker_no_controller_or_another_answer_is_not_ready() {
        assert_eq!(parse_answer(answer(0, 1, CORRELATION_ID)), None);
        assert_eq!(parse_answer(answer(1, -1, CORRELATION_ID)), None);
        assert_eq!(parse_answer(answer(1, 1, 7)), None);
        assert_eq!(parse_answer(Bytes::from_static(b"\0\0")), None);
    }

    #[test]
    fn a_port_that_accepts_and_closes_is_not_ready() {
        let port = crate::process::free_port().unwrap();
        assert_eq!(metadata_answered(port), None, "nothing listens on {port}");
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let closer = std::thread::spawn(move || drop(listener.accept()));
        assert_eq!(metadata_answered(port), None);
        closer.join().unwrap();
    }

    #[test]
    fn the_request_is_a_framed_metadata_request() {
        let mut frame = request_frame().unwrap();
        let length = frame.get_i32();
        assert_eq!(length as usize, frame.remaining());
        let header = RequestHeader::decode(&mut frame, MetadataRequest::header_version(METADATA_VERSION)).unwrap();
        assert_eq!(header.request_api_key, ApiKey::Metadata as i16);
        let request = MetadataRequest::decode(&mut frame, METADATA_VERSION).unwrap();
        assert_eq!(request.topics, Some(Vec::new()));
    }
}
