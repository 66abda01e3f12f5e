use super::cluster::{check_cluster, checkpointed_partitions, recorded_clusters};
use super::group::SNAPSHOTS_KEPT;
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
    p.set(cluster_marker("orders", "A-1_x"), 0);
    p.set(cluster_marker("other", "B"), 0);
    p.set("orders-x-1", 7);
    let recorded = recorded_clusters(&p, "orders");
    assert_eq!(recorded, ["A-1_x"].into());
    assert_eq!(
        checkpointed_partitions(&p, "orders"),
        [(0, 5)].into(),
        "the marker is no partition"
    );

    let plain = factory(None);
    assert!(check_cluster(&plain.settings, &recorded, Some("A-1_x")).is_ok());
    assert!(
        check_cluster(&plain.settings, &BTreeSet::new(), Some("B")).is_ok(),
        "nothing recorded"
    );
    let refused = check_cluster(&plain.settings, &recorded, Some("B")).unwrap_err();
    assert!(!refused.is_retriable(), "{refused}");
    for part in [
        "cluster `A-1_x`",
        "is cluster `B`",
        "accept_cluster_id = \"B\"",
        "new `name`",
    ] {
        assert!(refused.to_string().contains(part), "`{part}` missing from {refused}");
    }
    let unknown = check_cluster(&plain.settings, &recorded, None).unwrap_err();
    assert!(unknown.is_retriable(), "{unknown}");

    let accepting = factory(Some("B"));
    assert!(check_cluster(&accepting.settings, &recorded, Some("B")).is_ok());
    assert!(
        check_cluster(&accepting.settings, &recorded, Some("C")).is_err(),
        "only the named cluster"
    );
}

#[test]
fn identity_and_ownership() {
    let f = KafkaSourceFactory::new("p", KafkaSourceConfig::new("127.0.0.1:1", "orders")).unwrap();
    assert_eq!(f.identity(), "kafka:topic=orders");
    assert_eq!(f.group_id(), "exactly-p");
    assert!(f.create(2, 2).is_err());
    assert!(owns(4, 0, 2) && owns(5, 1, 2) && owns(5, 0, 1));
    let r = Record::new(split_name("my-topic", 12), 0, "");
    assert_eq!(r.topic_partition(), Some(("my-topic", 12)));
}
