use std::collections::BTreeSet;

use exactly_kafka_wire::TopicId;

use super::cluster::{check_cluster, check_topic_id};
use super::group::SNAPSHOTS_KEPT;
use super::positions::{checkpointed_partitions, record_cluster, recorded_clusters, Position};
use super::*;

fn at(n: i64) -> SplitPositions {
    let mut p = SplitPositions::default();
    p.set("t-0", n);
    p
}

#[test]
fn completed_checkpoints_map_to_their_snapshot() {
    let mut progress = Progress::default();
    progress.record(CheckpointId(8), at(1));
    progress.record(CheckpointId(9), at(2));
    assert_eq!(progress.completed(CheckpointId(8)), Some(at(1)));
    assert_eq!(progress.completed(CheckpointId(8)), None, "repeated");
    progress.record(CheckpointId(10), at(3));
    progress.record(CheckpointId(11), at(4));
    assert_eq!(progress.completed(CheckpointId(10)), Some(at(3)));
    assert_eq!(progress.completed(CheckpointId(9)), None, "going back");
    assert_eq!(progress.completed(CheckpointId(11)), Some(at(4)));
    assert!(progress.recent.is_empty());
}

#[test]
fn old_snapshots_are_dropped() {
    let mut progress = Progress::default();
    for n in 0..200 {
        progress.record(CheckpointId(n as u64 + 1), at(n));
    }
    assert_eq!(progress.recent.len(), SNAPSHOTS_KEPT);
    assert_eq!(progress.completed(CheckpointId(1)), None, "snapshot 1 is gone");
    assert_eq!(progress.completed(CheckpointId(200)), Some(at(199)));
}

#[test]
fn positions_name_their_cluster_and_another_one_is_refused() {
    let factory = |accept: Option<&str>| {
        let mut config = KafkaSourceConfig::new("127.0.0.1:1", "orders");
        config.accept_cluster_id = accept.map(String::from);
        KafkaSourceFactory::new("p", config).unwrap()
    };
    let mut p = at(3);
    p.set("orders-0", 5);
    record_cluster(&mut p, "orders", "A-1_x");
    record_cluster(&mut p, "other", "B");
    p.set("orders-x-1", 7);
    let recorded = recorded_clusters(&p, "orders");
    assert_eq!(recorded, ["A-1_x"].into());
    assert_eq!(
        checkpointed_partitions(&p, "orders"),
        [(0, Position::at(5))].into(),
        "the marker is no partition"
    );

    let plain = factory(None);
    assert!(check_cluster(&plain.settings, "orders", &recorded, Some("A-1_x")).is_ok());
    assert!(
        check_cluster(&plain.settings, "orders", &BTreeSet::new(), Some("B")).is_ok(),
        "nothing recorded"
    );
    let refused = check_cluster(&plain.settings, "orders", &recorded, Some("B")).unwrap_err();
    assert!(!refused.is_retriable(), "{refused}");
    for part in [
        "cluster `A-1_x`",
        "is cluster `B`",
        "accept_cluster_id = \"B\"",
        "new `name`",
    ] {
        assert!(refused.to_string().contains(part), "`{part}` missing from {refused}");
    }
    let unknown = check_cluster(&plain.settings, "orders", &recorded, None).unwrap_err();
    assert!(unknown.is_retriable(), "{unknown}");

    let accepting = factory(Some("B"));
    assert!(check_cluster(&accepting.settings, "orders", &recorded, Some("B")).is_ok());
    assert!(
        check_cluster(&accepting.settings, "orders", &recorded, Some("C")).is_err(),
        "only the named cluster"
    );
}

#[test]
fn a_recreated_topic_is_refused_naming_both_ids_unless_its_new_id_is_accepted() {
    let (old, new) = (TopicId([1; 16]), TopicId([2; 16]));
    let factory = |accept: Option<TopicId>| {
        let mut config = KafkaSourceConfig::new("127.0.0.1:1", "orders");
        config.accept_topic_id = accept.map(|id| id.to_string());
        KafkaSourceFactory::new("p", config).unwrap()
    };
    let recorded: BTreeSet<TopicId> = [old].into();
    let plain = factory(None);
    assert_eq!(
        check_topic_id(&plain.settings, "orders", &recorded, Some(old)).ok(),
        Some(true)
    );
    assert_eq!(
        check_topic_id(&plain.settings, "orders", &BTreeSet::new(), Some(new)).ok(),
        Some(true)
    );
    assert_eq!(
        check_topic_id(&plain.settings, "orders", &recorded, None).ok(),
        Some(true),
        "a broker that names no id cannot tell"
    );
    let refused = check_topic_id(&plain.settings, "orders", &recorded, Some(new)).unwrap_err();
    assert!(!refused.is_retriable(), "{refused}");
    for part in [old.to_string(), new.to_string(), format!("accept_topic_id = \"{new}\"")] {
        assert!(refused.to_string().contains(&part), "`{part}` missing from {refused}");
    }
    let accepting = factory(Some(new));
    assert_eq!(
        check_topic_id(&accepting.settings, "orders", &recorded, Some(new)).ok(),
        Some(false),
        "read the new topic from its beginning"
    );
    assert!(check_topic_id(&accepting.settings, "orders", &recorded, Some(TopicId([3; 16]))).is_err());
}

#[test]
fn identity_and_ownership() {
    let f = KafkaSourceFactory::new("p", KafkaSourceConfig::new("127.0.0.1:1", "orders")).unwrap();
    assert_eq!(f.identity(), "kafka:topic=orders");
    assert_eq!(f.group_id(), "exactly-p");
    assert!(f.create(2, 2).is_err());
    let one = f.subscription();
    assert_eq!(
        (
            one.owner("orders", 4, 2),
            one.owner("orders", 5, 2),
            one.owner("orders", 5, 1)
        ),
        (0, 1, 0)
    );
    let r = Record::new(split_name("my-topic", 12), 0, "");
    assert_eq!(r.topic_partition(), Some(("my-topic", 12)));
}

#[test]
fn several_topics_spread_over_the_subtasks_and_identify_the_source_by_what_it_reads() {
    let mut config = KafkaSourceConfig::new("127.0.0.1:1", "");
    config.topics = vec!["b".into(), "a".into()];
    let f = KafkaSourceFactory::new("p", config).unwrap();
    assert_eq!(
        f.identity(),
        "kafka:topics=a,b",
        "sorted: the order written does not matter"
    );
    let mut config = KafkaSourceConfig::new("127.0.0.1:1", "");
    config.topic_regex = Some("orders-.*".into());
    let r = KafkaSourceFactory::new("p", config).unwrap();
    assert_eq!(r.identity(), "kafka:topic_regex=^(?:orders-.*)$");
    let subscription = r.subscription();
    assert!(
        subscription.matches("orders-eu") && !subscription.matches("xorders-eu"),
        "anchored"
    );
    assert!(!subscription.matches("__consumer_offsets"));
    // Topics of one partition each land on every subtask, not all on 0.
    let owners: BTreeSet<usize> = (0..40)
        .map(|i| subscription.owner(&format!("orders-{i}"), 0, 4))
        .collect();
    assert_eq!(owners, (0..4).collect());
    // Each topic's partitions go round every subtask once.
    let owners: BTreeSet<usize> = (0..4).map(|p| subscription.owner("orders-eu", p, 4)).collect();
    assert_eq!(owners, (0..4).collect());
    for bad in [
        |c: &mut KafkaSourceConfig| c.topics = vec!["a".into()],
        |c: &mut KafkaSourceConfig| c.topic_regex = Some("(".into()),
    ] {
        let mut config = KafkaSourceConfig::new("127.0.0.1:1", "orders");
        bad(&mut config);
        assert!(config.validate().is_err(), "{config:?}");
    }
    let mut none = KafkaSourceConfig::new("127.0.0.1:1", "");
    assert!(none.validate().unwrap_err().to_string().contains("topic_regex"));
    none.topics = vec!["a".into(), "a".into()];
    assert!(none.validate().unwrap_err().to_string().contains("twice"));
}

#[test]
fn position_entries_are_told_apart_by_topic() {
    for (key, topic, of) in [
        ("orders-3", "orders", true),
        ("orders-3@leader-epoch", "orders", true),
        ("orders@cluster:abc", "orders", true),
        ("orders-eu-3", "orders", false),
        ("orders-eu@topic-id:x", "orders", false),
        ("orders-eu-3", "orders-eu", true),
    ] {
        assert_eq!(entry_of(key, topic), of, "{key} of {topic}");
    }
}
