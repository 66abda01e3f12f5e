//! The connection against a scripted fake broker: handshake fallback,
//! header versions, correlation ids, timeouts, hang-ups.

use bytes::Buf;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
use kafka_protocol::protocol::decode_request_header_from_buffer;
use tokio::net::TcpListener;

use super::*;

/// One request as the fake broker saw it.
#[derive(Debug)]
struct Seen {
    header: RequestHeader,
    body: Bytes,
}

/// The server side of one connection.
struct FakeBroker {
    stream: TcpStream,
}

impl FakeBroker {
    /// Listens on a free port; returns the address and the accepted side.
    async fn start() -> (String, tokio::task::JoinHandle<FakeBroker>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = tokio::spawn(async move {
            FakeBroker {
                stream: listener.accept().await.unwrap().0,
            }
        });
        (addr, accepted)
    }

    async fn receive(&mut self) -> Seen {
        let length = self.stream.read_i32().await.unwrap() as usize;
        let mut frame = vec![0; length];
        self.stream.read_exact(&mut frame).await.unwrap();
        let mut frame = Bytes::from(frame);
        let header = decode_request_header_from_buffer(&mut frame).unwrap();
        Seen { header, body: frame }
    }

    /// Answers with `body` in `version` under a response header of
    /// `header_version` carrying `correlation_id`.
    async fn answer<T: Encodable>(&mut self, correlation_id: i32, header_version: i16, version: i16, body: &T) {
        let mut frame = BytesMut::new();
        frame.put_i32(0);
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(&mut frame, header_version)
            .unwrap();
        body.encode(&mut frame, version).unwrap();
        let length = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&length.to_be_bytes());
        self.stream.write_all(&frame).await.unwrap();
    }
}

fn api(key: ApiKey, min: i16, max: i16) -> ApiVersion {
    ApiVersion::default()
        .with_api_key(key as i16)
        .with_min_version(min)
        .with_max_version(max)
}

fn options(request_timeout: Duration) -> ConnectionOptions {
    ConnectionOptions {
        request_timeout,
        ..ConnectionOptions::default()
    }
}

/// What [`metadata_twice`] saw.
struct ClientSide {
    advertised: Option<VersionRange>,
    version: i16,
    first: Result<MetadataResponse, WireError>,
    second: Result<MetadataResponse, WireError>,
}

/// A fake broker, and a client that connects to it and sends Metadata
/// twice, at the highest version it shares with the broker.
async fn metadata_twice(request_timeout: Duration) -> (FakeBroker, tokio::task::JoinHandle<ClientSide>) {
    let (addr, accepted) = FakeBroker::start().await;
    let client = tokio::spawn(async move {
        let mut connection = KafkaConnection::connect_with(&addr, &options(request_timeout))
            .await
            .unwrap();
        let version = connection.version(ApiKey::Metadata, versions(1, 13)).unwrap();
        let first = connection.request(version, &MetadataRequest::default()).await;
        let second = connection.request(version, &MetadataRequest::default()).await;
        ClientSide {
            advertised: connection.broker_versions(ApiKey::Metadata),
            version,
            first,
            second,
        }
    });
    (accepted.await.unwrap(), client)
}

#[tokio::test]
async fn falls_back_to_an_older_api_versions_and_checks_correlation_ids() {
    let (mut broker, client) = metadata_twice(Duration::from_secs(5)).await;

    // ApiVersions v3 (request header v2, flexible) is answered the way an
    // older broker does: UNSUPPORTED_VERSION in the v0 format, with its range.
    let seen = broker.receive().await;
    assert_eq!(
        (seen.header.request_api_key, seen.header.request_api_version),
        (ApiKey::ApiVersions as i16, 3)
    );
    assert_eq!(seen.header.client_id.as_deref(), Some("exactly-kafka-wire"));
    let refusal = ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(vec![api(ApiKey::ApiVersions, 0, 2)]);
    broker.answer(seen.header.correlation_id, 0, 0, &refusal).await;

    // The retry uses v2 (request header v1).
    let seen = broker.receive().await;
    assert_eq!(seen.header.request_api_version, 2);
    let offer =
        ApiVersionsResponse::default().with_api_keys(vec![api(ApiKey::ApiVersions, 0, 2), api(ApiKey::Metadata, 0, 9)]);
    broker.answer(seen.header.correlation_id, 0, 2, &offer).await;

    // Metadata v9 is flexible: request header v2 (else the header above and
    // the body here would not decode), response header v1.
    let seen = broker.receive().await;
    assert_eq!(
        (seen.header.request_api_key, seen.header.request_api_version),
        (ApiKey::Metadata as i16, 9)
    );
    let mut body = seen.body.clone();
    MetadataRequest::decode(&mut body, 9).unwrap();
    assert!(!body.has_remaining());
    broker
        .answer(seen.header.correlation_id, 1, 9, &MetadataResponse::default())
        .await;

    // An answer with a wrong correlation id breaks the connection.
    let seen = broker.receive().await;
    broker
        .answer(seen.header.correlation_id + 7, 1, 9, &MetadataResponse::default())
        .await;

    let client = client.await.unwrap();
    assert_eq!(client.advertised, Some(versions(0, 9)));
    assert_eq!(client.version, 9);
    client.first.unwrap();
    let err = client.second.unwrap_err();
    assert!(matches!(err, WireError::Protocol { .. }), "{err}");
    assert!(err.to_string().contains("correlation id"), "{err}");
}

/// librdkafka's mock cluster refuses ApiVersions v3 in the request's own
/// (flexible) encoding, which does not decode as v0: the client steps down.
#[tokio::test]
async fn an_undecodable_refusal_steps_down_one_version() {
    let (mut broker, client) = metadata_twice(Duration::from_secs(5)).await;
    let seen = broker.receive().await;
    assert_eq!(seen.header.request_api_version, 3);
    let refusal = ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(vec![api(ApiKey::ApiVersions, 0, 2)]);
    // Header v0, body in the flexible v3 encoding (compact array count).
    broker.answer(seen.header.correlation_id, 0, 3, &refusal).await;

    let seen = broker.receive().await;
    assert_eq!(seen.header.request_api_version, 2);
    let offer =
        ApiVersionsResponse::default().with_api_keys(vec![api(ApiKey::ApiVersions, 0, 2), api(ApiKey::Metadata, 0, 9)]);
    broker.answer(seen.header.correlation_id, 0, 2, &offer).await;
    for _ in 0..2 {
        let seen = broker.receive().await;
        broker
            .answer(seen.header.correlation_id, 1, 9, &MetadataResponse::default())
            .await;
    }
    let client = client.await.unwrap();
    assert_eq!(client.version, 9);
    client.first.unwrap();
    client.second.unwrap();
}

#[tokio::test]
async fn silence_is_a_timeout_and_closes_the_connection() {
    let (mut broker, client) = metadata_twice(Duration::from_millis(200)).await;
    let seen = broker.receive().await;
    let offer = ApiVersionsResponse::default().with_api_keys(vec![api(ApiKey::Metadata, 0, 12)]);
    broker.answer(seen.header.correlation_id, 0, 3, &offer).await;
    broker.receive().await; // Metadata, never answered

    let client = client.await.unwrap();
    let err = client.first.unwrap_err();
    assert!(
        matches!(
            err,
            WireError::Timeout {
                api: ApiKey::Metadata,
                ..
            }
        ),
        "{err}"
    );
    let err = client.second.unwrap_err();
    assert!(matches!(err, WireError::Io { .. }), "{err}");
    drop(broker);
}

#[tokio::test]
async fn a_hang_up_is_closed() {
    let (addr, accepted) = FakeBroker::start().await;
    let client = tokio::spawn(async move { KafkaConnection::connect(&addr).await });
    let mut broker = accepted.await.unwrap();
    broker.receive().await;
    drop(broker);
    let err = client.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            WireError::Closed {
                api: ApiKey::ApiVersions,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_retriable());
}
