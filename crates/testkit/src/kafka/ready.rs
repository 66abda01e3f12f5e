//! Whether a broker is ready: it answers a Metadata request listing at
//! least one broker and an elected controller.
//!
//! An open port proves little: a JVM broker accepts connections before it
//! registered with its controller, and a published Docker port accepts them
//! before anything listens inside. One blocking Metadata round trip
//! (encoded with `kafka-protocol`) is what a client's first request needs.

use std::time::Duration;

use kafka_protocol::messages::{MetadataRequest, MetadataResponse};

use super::wire::Connection;

/// Metadata v12: served by every Kafka from 3.0 on (4.x serves v4–v13).
const METADATA_VERSION: i16 = 12;
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

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
    let request = MetadataRequest::default()
        .with_topics(Some(Vec::new()))
        .with_allow_auto_topic_creation(false);
    let response = Connection::open(port, PROBE_TIMEOUT)
        .ok()?
        .send(METADATA_VERSION, &request)
        .ok()?;
    cluster_info(&response)
}

/// The cluster a Metadata answer describes, if it names a broker and an
/// elected controller.
fn cluster_info(response: &MetadataResponse) -> Option<ClusterInfo> {
    if response.brokers.is_empty() || response.controller_id.0 < 0 {
        return None;
    }
    Some(ClusterInfo {
        cluster_id: response.cluster_id.as_ref().map(|id| id.to_string()),
        brokers: response.brokers.len(),
    })
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::protocol::StrBytes;

    use super::*;

    fn answer(brokers: usize, controller: i32) -> MetadataResponse {
        MetadataResponse::default()
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
            )
    }

    #[test]
    fn a_cluster_with_a_broker_and_a_controller_is_ready() {
        let info = cluster_info(&answer(1, 1)).expect("ready");
        assert_eq!(info.brokers, 1);
        assert_eq!(info.cluster_id.as_deref(), Some("cluster-1"));
    }

    #[test]
    fn no_broker_or_no_controller_is_not_ready() {
        assert_eq!(cluster_info(&answer(0, 1)), None);
        assert_eq!(cluster_info(&answer(1, -1)), None);
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
}
