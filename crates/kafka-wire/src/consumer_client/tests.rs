//! The pure parts of the consumer client: offset specs, leaders, requests
//! in every version spoken, and answers in both OffsetFetch layouts.

use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::{
    GroupId, ListOffsetsRequest, ListOffsetsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;

use super::connections::breaks_connection;
use super::*;

const ADDR: &str = "broker-1:9092";

/// `message` encoded in `version` and decoded again: fails where a field is
/// set that `version` does not have.
fn roundtrip<T: Encodable + Decodable>(message: &T, version: i16) -> T {
    let mut buffer = BytesMut::new();
    message
        .encode(&mut buffer, version)
        .unwrap_or_else(|e| panic!("encoding v{version}: {e}"));
    let mut bytes = buffer.freeze();
    T::decode(&mut bytes, version).unwrap_or_else(|e| panic!("decoding v{version}: {e}"))
}

fn partitions(list: &[i32]) -> BTreeSet<i32> {
    list.iter().copied().collect()
}

fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

fn cluster(leaders: &[(i32, i32)], errors: &[(i32, ResponseError)]) -> ClusterMetadata {
    ClusterMetadata {
        cluster_id: Some("cluster-x".into()),
        brokers: BTreeMap::from([(1, "broker-1:9092".into()), (2, "broker-2:9092".into())]),
        leaders: leaders.iter().copied().collect(),
        partition_errors: errors.iter().copied().collect(),
        leader_epochs: leaders.iter().map(|(p, _)| (*p, 0)).collect(),
        topic_id: None,
    }
}

fn broker_error(result: Result<impl Debug, WireError>) -> (ResponseError, String) {
    match result {
        Err(error @ WireError::Broker { error: code, .. }) => (code, error.to_string()),
        other => panic!("expected a broker error, got {other:?}"),
    }
}

#[test]
fn offset_specs_map_to_list_offsets_timestamps() {
    assert_eq!(OffsetSpec::Earliest.wire_timestamp().unwrap(), -2);
    assert_eq!(OffsetSpec::Latest.wire_timestamp().unwrap(), -1);
    assert_eq!(OffsetSpec::Timestamp(0).wire_timestamp().unwrap(), 0);
    assert_eq!(
        OffsetSpec::Timestamp(1_700_000_000_000).wire_timestamp().unwrap(),
        1_700_000_000_000
    );
    for ms in [-1, -2, -3, i64::MIN] {
        let err = OffsetSpec::Timestamp(ms).wire_timestamp().unwrap_err();
        assert!(matches!(err, WireError::InvalidConfig { .. }), "{ms}: {err}");
        assert!(err.to_string().contains(&ms.to_string()), "{err}");
    }
}

#[test]
fn partitions_with_metadata_errors_have_no_leader() {
    let metadata = TopicMetadata::from_cluster(cluster(
        &[(0, 1), (1, 2), (2, -1), (3, 2), (4, 7)],
        &[
            (2, ResponseError::LeaderNotAvailable),
            (3, ResponseError::ReplicaNotAvailable),
        ],
    ));
    assert_eq!(metadata.cluster_id.as_deref(), Some("cluster-x"));
    assert_eq!(
        metadata.leaders,
        BTreeMap::from([(0, Some(1)), (1, Some(2)), (2, None), (3, Some(2)), (4, Some(7))])
    );
    assert_eq!(metadata.leader_address(0), Some("broker-1:9092"));
    assert_eq!(metadata.leader_address(1), Some("broker-2:9092"));
    assert_eq!(metadata.leader_address(2), None, "leaderless");
    assert_eq!(metadata.leader_address(3), Some("broker-2:9092"), "a follower is down");
    assert_eq!(metadata.leader_address(4), None, "leader 7 is not among the brokers");
    assert_eq!(metadata.leader_address(5), None, "no such partition");

    // An error code with a leader id still means no usable leader.
    let metadata = TopicMetadata::from_cluster(cluster(&[(0, 1)], &[(0, ResponseError::ListenerNotFound)]));
    assert_eq!(metadata.leaders, BTreeMap::from([(0, None)]));
}

#[test]
fn groups_partitions_by_leader_address() {
    let cluster = cluster(
        &[(0, 1), (1, 2), (2, 1), (3, -1), (4, 2)],
        &[
            (3, ResponseError::LeaderNotAvailable),
            (4, ResponseError::ReplicaNotAvailable),
        ],
    );
    let grouped = partitions_by_leader(ADDR, "t", &partitions(&[0, 1, 2, 4]), &cluster).unwrap();
    assert_eq!(
        grouped,
        BTreeMap::from([
            ("broker-1:9092".to_string(), vec![0, 2]),
            ("broker-2:9092".to_string(), vec![1, 4]),
        ])
    );

    let (error, message) = broker_error(partitions_by_leader(ADDR, "t", &partitions(&[0, 3]), &cluster));
    assert_eq!(error, ResponseError::LeaderNotAvailable);
    assert!(message.contains("t/3"), "{message}");

    let (error, message) = broker_error(partitions_by_leader(ADDR, "t", &partitions(&[9]), &cluster));
    assert_eq!(error, ResponseError::UnknownTopicOrPartition);
    assert!(message.contains("t/9") && message.contains("5 partitions"), "{message}");
    assert!(WireError::Broker {
        addr: ADDR.into(),
        api: ApiKey::Metadata,
        error,
        message: None
    }
    .is_retriable());
}

#[test]
fn only_failed_exchanges_drop_the_connection() {
    let api = ApiKey::OffsetFetch;
    let addr = || ADDR.to_string();
    let breaking = [
        WireError::Io {
            addr: addr(),
            api,
            source: std::io::Error::other("reset"),
        },
        WireError::Closed { addr: addr(), api },
        WireError::Timeout {
            addr: addr(),
            api,
            after: Duration::from_secs(1),
        },
        WireError::Protocol {
            addr: addr(),
            message: "bad frame".into(),
        },
    ];
    for error in &breaking {
        assert!(breaks_connection(error), "{error}");
    }
    let kept = [
        WireError::Broker {
            addr: addr(),
            api,
            error: ResponseError::NotCoordinator,
            message: None,
        },
        WireError::ApiNotSupported {
            addr: addr(),
            api,
            broker: None,
            client: OFFSET_FETCH,
        },
        WireError::Connect {
            addr: addr(),
            source: std::io::Error::other("refused"),
        },
    ];
    for error in &kept {
        assert!(!breaks_connection(error), "{error}");
    }
}

#[test]
fn list_offsets_requests_encode_in_every_version() {
    let request = requests::list_offsets("t", &[0, 2], -2, 0, Duration::from_secs(30));
    for version in LIST_OFFSETS.min..=LIST_OFFSETS.max {
        let decoded: ListOffsetsRequest = roundtrip(&request, version);
        assert_eq!(decoded.replica_id.0, -1, "v{version}: a consumer, not a follower");
        assert_eq!(decoded.isolation_level, 0, "v{version}");
        let topic = &decoded.topics[0];
        assert_eq!(topic.name.0.as_str(), "t");
        assert!(
            topic.partitions.iter().map(|p| p.partition_index).eq([0, 2]),
            "v{version}"
        );
        assert!(topic.partitions.iter().all(|p| p.timestamp == -2), "v{version}");
        assert_eq!(decoded.timeout_ms, if version >= 10 { 30_000 } else { 0 }, "v{version}");
    }
}

#[test]
fn offset_fetch_requests_use_the_layout_of_their_version() {
    let asked = partitions(&[3, 1]);
    for version in OFFSET_FETCH.min..=OFFSET_FETCH.max {
        let decoded: OffsetFetchRequest = roundtrip(&requests::offset_fetch("g", "t", &asked, version), version);
        let (group, topics) = if version >= 8 {
            assert_eq!(decoded.groups.len(), 1, "v{version}");
            let group = &decoded.groups[0];
            assert_eq!(group.member_id, None, "v{version}: no member");
            assert_eq!(group.member_epoch, -1, "v{version}");
            let topics = group.topics.as_deref().expect("topics asked for");
            (
                &group.group_id,
                topics.iter().map(|t| (&t.name, &t.partition_indexes)).collect(),
            )
        } else {
            let topics = decoded.topics.as_deref().expect("topics asked for");
            (
                &decoded.group_id,
                topics
                    .iter()
                    .map(|t| (&t.name, &t.partition_indexes))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(group.0.as_str(), "g", "v{version}");
        assert_eq!(topics, [(&name("t"), &vec![1, 3])], "v{version}");
        assert_eq!(decoded.require_stable, version >= 7, "v{version}");
    }
}

#[test]
fn offset_commit_requests_are_a_standalone_consumers_in_every_version() {
    let offsets = BTreeMap::from([(0, 17), (5, 0)]);
    let request = requests::offset_commit("g", "t", &offsets);
    for version in OFFSET_COMMIT.min..=OFFSET_COMMIT.max {
        let decoded: OffsetCommitRequest = roundtrip(&request, version);
        assert_eq!(decoded.group_id.0.as_str(), "g");
        assert_eq!(decoded.generation_id_or_member_epoch, -1, "v{version}");
        assert_eq!(decoded.member_id.as_str(), "", "v{version}");
        assert_eq!(decoded.group_instance_id, None, "v{version}");
        let topic = &decoded.topics[0];
        assert_eq!(topic.name.0.as_str(), "t");
        let committed: Vec<(i32, i64)> = topic
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.committed_offset))
            .collect();
        assert_eq!(committed, [(0, 17), (5, 0)], "v{version}");
    }
}

/// `topics` (name, then (index, offset, error code) per partition) in
/// the topic and partition types of one OffsetFetch answer layout.
macro_rules! fetch_answer_topics {
    ($topic:ty, $partition:ty, $topics:expr) => {
        $topics
            .iter()
            .map(|(topic, partitions)| {
                let partitions = partitions.iter().map(|&(index, offset, error)| {
                    <$partition>::default()
                        .with_partition_index(index)
                        .with_committed_offset(offset)
                        .with_error_code(error)
                });
                <$topic>::default()
                    .with_name(name(topic))
                    .with_partitions(partitions.collect())
            })
            .collect()
    };
}

/// An OffsetFetch answer for group `g` in `version`'s layout: per
/// partition of topic `t` (index, offset, error code), a partition of
/// another topic, and a group-level error code.
fn offset_fetch_answer(version: i16, group_error: i16, answered: &[(i32, i64, i16)]) -> OffsetFetchResponse {
    let topics = [("other", vec![(0, 99, 0)]), ("t", answered.to_vec())];
    let response = if version >= 8 {
        let topics = fetch_answer_topics!(OffsetFetchResponseTopics, OffsetFetchResponsePartitions, topics);
        let group = OffsetFetchResponseGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_error_code(group_error)
            .with_topics(topics);
        OffsetFetchResponse::default().with_groups(vec![group])
    } else {
        let topics = fetch_answer_topics!(OffsetFetchResponseTopic, OffsetFetchResponsePartition, topics);
        OffsetFetchResponse::default()
            .with_error_code(group_error)
            .with_topics(topics)
    };
    roundtrip(&response, version)
}

#[test]
fn reads_committed_offsets_in_both_offset_fetch_layouts() {
    for version in [2, 7, 8, 9] {
        let asked = partitions(&[0, 1, 2]);
        let read = |response| requests::fetched_offsets(ADDR, "g", "t", &asked, version, response);

        let answer = offset_fetch_answer(version, 0, &[(0, 42, 0), (1, -1, 0), (2, 0, 0), (7, 5, 0)]);
        assert_eq!(
            read(answer).unwrap(),
            BTreeMap::from([(0, Some(42)), (1, None), (2, Some(0))]),
            "v{version}: -1 is no offset, other topics and partitions not asked for are ignored"
        );

        let answer = offset_fetch_answer(version, 16, &[]);
        let (error, message) = broker_error(read(answer));
        assert_eq!(error, ResponseError::NotCoordinator, "v{version}");
        assert!(message.contains("group `g`"), "v{version}: {message}");

        let answer = offset_fetch_answer(version, 0, &[(0, 1, 0), (1, -1, 88), (2, 3, 0)]);
        let (error, message) = broker_error(read(answer));
        assert_eq!(error, ResponseError::UnstableOffsetCommit, "v{version}");
        assert!(message.contains("group `g`, t/1"), "v{version}: {message}");

        let answer = offset_fetch_answer(version, 0, &[(0, 1, 0), (2, 3, 0)]);
        let err = read(answer).unwrap_err();
        assert!(matches!(err, WireError::Protocol { .. }), "v{version}: {err}");
        assert!(err.to_string().contains("t/1"), "v{version}: {err}");
    }
    // v8+ answers for another group only: a protocol error.
    let mut answer = offset_fetch_answer(8, 0, &[(0, 1, 0)]);
    answer.groups[0].group_id = GroupId(StrBytes::from_static_str("h"));
    let err = requests::fetched_offsets(ADDR, "g", "t", &partitions(&[0]), 8, answer).unwrap_err();
    assert!(matches!(err, WireError::Protocol { .. }), "{err}");
}

#[test]
fn reads_listed_offsets() {
    let answer = |partitions: Vec<ListOffsetsPartitionResponse>| {
        let topic = ListOffsetsTopicResponse::default()
            .with_name(name("t"))
            .with_partitions(partitions);
        roundtrip(&ListOffsetsResponse::default().with_topics(vec![topic]), 9)
    };
    let partition = |index: i32, offset: i64, error: i16| {
        ListOffsetsPartitionResponse::default()
            .with_partition_index(index)
            .with_offset(offset)
            .with_error_code(error)
    };
    let asked = partitions(&[0, 1]);
    let listed = requests::listed_offsets(
        ADDR,
        "t",
        &asked,
        answer(vec![partition(0, 12, 0), partition(1, -1, 0)]),
    );
    assert_eq!(listed.unwrap(), BTreeMap::from([(0, Some(12)), (1, None)]));

    let failed = requests::listed_offsets(
        ADDR,
        "t",
        &asked,
        answer(vec![partition(0, 12, 0), partition(1, -1, 6)]),
    );
    let (error, message) = broker_error(failed);
    assert_eq!(error, ResponseError::NotLeaderOrFollower);
    assert!(message.contains("t/1"), "{message}");
    assert!(message.contains("ListOffsets"), "{message}");

    let missing = requests::listed_offsets(ADDR, "t", &asked, answer(vec![partition(0, 12, 0)]));
    assert!(matches!(missing, Err(WireError::Protocol { .. })), "{missing:?}");
}

#[test]
fn reads_offset_commit_answers() {
    let answer = |errors: &[(i32, i16)]| {
        let partitions = errors
            .iter()
            .map(|&(p, e)| {
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p)
                    .with_error_code(e)
            })
            .collect();
        let topic = OffsetCommitResponseTopic::default()
            .with_name(name("t"))
            .with_partitions(partitions);
        roundtrip(&OffsetCommitResponse::default().with_topics(vec![topic]), 8)
    };
    let asked = partitions(&[0, 1]);
    requests::committed(ADDR, "g", "t", &asked, answer(&[(0, 0), (1, 0)])).unwrap();

    let (error, message) = broker_error(requests::committed(ADDR, "g", "t", &asked, answer(&[(0, 0), (1, 22)])));
    assert_eq!(error, ResponseError::IllegalGeneration);
    assert!(message.contains("group `g`, t/1"), "{message}");

    // A coordinator that is not ready says so per partition.
    let (error, _) = broker_error(requests::committed(ADDR, "g", "t", &asked, answer(&[(0, 14), (1, 14)])));
    assert_eq!(error, ResponseError::CoordinatorLoadInProgress);

    let missing = requests::committed(ADDR, "g", "t", &asked, answer(&[(0, 0)]));
    assert!(matches!(missing, Err(WireError::Protocol { .. })), "{missing:?}");
}
