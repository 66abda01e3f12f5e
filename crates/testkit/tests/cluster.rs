//! The three-broker Kafka cluster of the test kit, against the real jars:
//! it forms, a replicated topic survives a broker's SIGKILL, a preferred
//! election moves leadership back after a restart, a frozen broker answers
//! only after its thaw, a controlled shutdown hands leadership over before
//! the broker exits, and the unclean-election recipe truncates a log.
//!
//! The tests share the process's cluster ([`KafkaCluster::shared`]), one at
//! a time, each with topics of its own; a cluster of their own would cost
//! tens of seconds each on a small machine.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use exactly_testkit::kafka::{Acks, KafkaCluster, ResponseError};
use exactly_testkit::{port_accepts, TestkitError};

mod common;
use common::*;

/// Serializes this file's tests, the one that starts a cluster of its own
/// included: two clusters at once would crowd two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn values(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("{prefix}-{i}").into_bytes()).collect()
}

fn slices(values: &[Vec<u8>]) -> Vec<&[u8]> {
    values.iter().map(Vec::as_slice).collect()
}

/// The values read from a partition, from offset 0, as strings.
fn read_values(cluster: &KafkaCluster, topic: &str) -> Vec<String> {
    cluster
        .read(topic, 0, 0)
        .expect("read the partition")
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().expect("a value")).into_owned())
        .collect()
}

#[test]
fn a_cluster_forms_with_three_brokers_and_replicates_three_times() {
    init_tracing();
    let _serial = serial();
    let cluster = KafkaCluster::shared().expect("the shared cluster");
    assert_eq!(cluster.node_ids(), vec![1, 2, 3]);
    assert_eq!(
        cluster.live_brokers().unwrap().into_iter().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let addresses: Vec<String> = cluster.brokers().iter().map(|b| b.address()).collect();
    assert_eq!(cluster.bootstrap(), addresses.join(","));
    for broker in cluster.brokers() {
        assert_eq!(broker, cluster.broker(broker.node_id()));
        assert_eq!(api_versions(broker.port(), 3), (3, 0), "broker {}", broker.node_id());
        let meta = std::fs::read_to_string(
            cluster
                .dir()
                .join(format!("node-{}", broker.node_id()))
                .join("data/meta.properties"),
        )
        .expect("a formatted data folder");
        assert!(
            meta.lines()
                .any(|l| l == format!("cluster.id={}", cluster.cluster_id())),
            "{meta}"
        );
        assert!(
            meta.lines().any(|l| l == format!("node.id={}", broker.node_id())),
            "{meta}"
        );
        let properties =
            std::fs::read_to_string(cluster.log_path(broker.node_id()).with_file_name("server.properties")).unwrap();
        for line in [
            "offsets.topic.replication.factor=3",
            "transaction.state.log.replication.factor=3",
            "transaction.state.log.min.isr=2",
            "unclean.leader.election.enable=false",
            "group.initial.rebalance.delay.ms=0",
        ] {
            assert!(properties.lines().any(|l| l == line), "{line} missing");
        }
    }

    let topic = "cluster-forms";
    cluster
        .create_topic(topic, 3, 3, &[("min.insync.replicas", "2")])
        .expect("create a topic");
    let state = cluster.topic(topic).unwrap();
    assert_eq!(state.partitions.len(), 3);
    for partition in state.partitions.values() {
        assert_eq!(partition.replicas.len(), 3, "{partition:?}");
        assert!(partition.is_fully_replicated(), "{partition:?}");
    }
    let leaders: Vec<i32> = cluster.leaders(topic).unwrap().values().map(|l| l.unwrap()).collect();
    assert_eq!(leaders.len(), 3);
    assert_eq!(cluster.isr(topic).unwrap().len(), 3);
    assert_eq!(cluster.leader_epochs(topic).unwrap().len(), 3);

    // A config set on the topic reaches its leader: records larger than
    // max.message.bytes are refused.
    cluster
        .alter_topic_config(topic, &[("max.message.bytes", "200")])
        .expect("alter the topic's config");
    let large = vec![b'x'; 1000];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match cluster.produce(topic, 0, &[&large], Acks::All) {
            Err(TestkitError::Kafka { source, .. })
                if source.response_error() == Some(ResponseError::MessageTooLarge) =>
            {
                break
            }
            other => assert!(Instant::now() < deadline, "a 1000-byte record still taken: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster
        .produce(topic, 0, &[b"small"], Acks::All)
        .expect("a small record fits");

    cluster.delete_topic(topic).expect("delete it");
    assert!(cluster.topic(topic).is_err(), "the topic is gone");
    cluster.create_topic(topic, 1, 3, &[]).expect("create it again");
    assert_ne!(cluster.topic(topic).unwrap().topic_id, state.topic_id, "a new topic id");
}

#[test]
fn a_topic_of_replication_factor_three_survives_a_broker_sigkill() {
    init_tracing();
    let _serial = serial();
    let mut cluster = KafkaCluster::shared().expect("the shared cluster");
    let topic = "cluster-survives-kill";
    cluster
        .create_topic(topic, 1, 3, &[("min.insync.replicas", "2")])
        .expect("create the topic");
    let before = values("before", 100);
    assert_eq!(cluster.produce(topic, 0, &slices(&before), Acks::All).unwrap(), 0);
    let leader = cluster.leaders(topic).unwrap()[&0].expect("a leader");
    let epoch = cluster.leader_epochs(topic).unwrap()[&0];

    cluster.kill_broker(leader);
    assert!(!cluster.is_running(leader));
    let state = cluster
        .wait_for_topic(topic, "a new leader", |state| {
            state.partitions[&0].leader.is_some_and(|l| l != leader)
        })
        .expect("the controller fences the killed leader and elects another");
    assert!(state.partitions[&0].leader_epoch > epoch, "{state:?}");
    assert!(!cluster.live_brokers().unwrap().contains(&leader));
    let after = values("after", 100);
    assert_eq!(
        cluster.produce(topic, 0, &slices(&after), Acks::All).unwrap(),
        100,
        "two in-sync replicas of three take writes"
    );
    let expected: Vec<String> = before
        .iter()
        .chain(&after)
        .map(|v| String::from_utf8(v.clone()).unwrap())
        .collect();
    assert_eq!(read_values(&cluster, topic), expected);
    assert_eq!(cluster.end_offset(topic, 0).unwrap(), 200);

    cluster.start_broker(leader).expect("start the killed broker again");
    cluster
        .wait_for_topic(topic, "the restarted broker in sync", |state| {
            state.partitions[&0].is_fully_replicated()
        })
        .expect("the restarted broker catches up");
}

#[test]
fn a_controlled_shutdown_hands_leadership_over_before_the_broker_exits() {
    init_tracing();
    let _serial = serial();
    let mut cluster = KafkaCluster::shared().expect("the shared cluster");
    let topic = "cluster-controlled-shutdown";
    let assignment = vec![vec![2, 3, 1], vec![3, 1, 2]];
    cluster
        .create_topic_with_assignment(topic, &assignment, &[("min.insync.replicas", "2")])
        .expect("create the topic");
    cluster
        .wait_for_topic(topic, "every replica in sync", |state| {
            state.partitions.values().all(|p| p.is_fully_replicated())
        })
        .expect("the topic replicates");
    assert_eq!(cluster.leaders(topic).unwrap()[&0], Some(2));

    cluster.shut_down_broker(2).expect("a controlled shutdown of broker 2");
    assert!(!cluster.is_running(2));
    // A SIGKILLed leader keeps leading until the controller fences it
    // (`broker.session.timeout.ms`); a broker shut down by SIGTERM has
    // handed its leaderships over before it exited: right after the
    // shutdown returns, no partition names it as leader.
    let leaders = cluster.leaders(topic).unwrap();
    assert!(
        leaders.values().all(|l| l.is_some() && *l != Some(2)),
        "leaders right after the controlled shutdown of broker 2: {leaders:?}"
    );
    let after = values("after-shutdown", 50);
    assert_eq!(
        cluster.produce(topic, 0, &slices(&after), Acks::All).unwrap(),
        0,
        "the new leader takes writes at once"
    );
    cluster.start_broker(2).expect("start broker 2 again");
    cluster
        .wait_for_topic(topic, "broker 2 back in sync", |state| {
            state.partitions.values().all(|p| p.is_fully_replicated())
        })
        .expect("broker 2 catches up");
}

#[test]
fn a_preferred_election_moves_leadership_back_after_a_restart() {
    init_tracing();
    let _serial = serial();
    let mut cluster = KafkaCluster::shared().expect("the shared cluster");
    let topic = "cluster-preferred";
    let assignment = vec![vec![1, 2, 3], vec![2, 3, 1], vec![3, 1, 2]];
    cluster
        .create_topic_with_assignment(topic, &assignment, &[])
        .expect("create the topic");
    let preferred: BTreeMap<i32, Option<i32>> = BTreeMap::from([(0, Some(1)), (1, Some(2)), (2, Some(3))]);
    assert_eq!(cluster.leaders(topic).unwrap(), preferred);
    assert_eq!(
        cluster.topic(topic).unwrap().partitions[&1].replicas,
        vec![2, 3, 1],
        "the assignment is kept"
    );
    let epoch = cluster.leader_epochs(topic).unwrap()[&0];

    cluster.restart_broker(1).expect("restart broker 1");
    assert!(cluster.live_brokers().unwrap().contains(&1));
    let state = cluster
        .wait_for_topic(topic, "broker 1 back in sync", |state| {
            state.partitions.values().all(|p| p.is_fully_replicated())
        })
        .expect("broker 1 catches up");
    let leader = state.partitions[&0].leader;
    assert!(
        leader.is_some() && leader != Some(1),
        "leadership moved away from the restarted broker and, without the automatic rebalance, stays away: {state:?}"
    );

    cluster.elect_preferred_leaders(topic).expect("preferred election");
    assert_eq!(cluster.leaders(topic).unwrap(), preferred);
    assert!(cluster.leader_epochs(topic).unwrap()[&0] > epoch);
    cluster
        .elect_preferred_leaders(topic)
        .expect("electing preferred leaders that lead already does nothing");
}

#[test]
fn a_frozen_broker_answers_only_after_its_thaw_while_the_others_serve() {
    init_tracing();
    let _serial = serial();
    let mut cluster = KafkaCluster::shared().expect("the shared cluster");
    let topic = "cluster-frozen";
    cluster
        .create_topic_with_assignment(topic, &[vec![1, 2]], &[])
        .expect("create a topic on brokers 1 and 2");
    let port = cluster.broker(3).port();
    cluster.freeze_broker(3).expect("freeze broker 3");
    assert!(cluster.is_frozen(3) && cluster.is_running(3));
    let mut stream = connect(port);
    stream.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    let mut request = Vec::new();
    request.extend_from_slice(&API_API_VERSIONS.to_be_bytes());
    request.extend_from_slice(&0i16.to_be_bytes());
    request.extend_from_slice(&77i32.to_be_bytes());
    put_str(&mut request, "exactly-testkit");
    let mut frame = (request.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&request);
    stream
        .write_all(&frame)
        .expect("the frozen broker's socket takes bytes");
    let mut size = [0u8; 4];
    assert!(stream.read_exact(&mut size).is_err(), "a frozen broker answered");

    let written = values("frozen", 10);
    assert_eq!(
        cluster.produce(topic, 0, &slices(&written), Acks::All).unwrap(),
        0,
        "brokers 1 and 2 serve while 3 is frozen"
    );
    assert_eq!(read_values(&cluster, topic).len(), 10);

    cluster.thaw_broker(3).expect("thaw broker 3");
    assert!(!cluster.is_frozen(3));
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream
        .read_exact(&mut size)
        .expect("the thawed broker answers the pending request");
    assert_eq!(api_versions(port, 9), (9, 0));
}

/// The recipe the source's truncation tests use: records acknowledged by a
/// lone leader are lost when a replica that never had them is elected.
#[test]
fn an_unclean_election_truncates_the_log_below_what_was_written() {
    init_tracing();
    let _serial = serial();
    let mut cluster = KafkaCluster::shared().expect("the shared cluster");
    let topic = "cluster-unclean";
    cluster
        .create_topic_with_assignment(
            topic,
            &[vec![1, 2]],
            &[("min.insync.replicas", "1"), ("unclean.leader.election.enable", "true")],
        )
        .expect("create the topic");
    let kept = values("kept", 10);
    cluster.produce(topic, 0, &slices(&kept), Acks::All).unwrap();

    let lost = values("lost", 50);
    let election = cluster
        .truncate_by_unclean_election(topic, 0, |cluster, lone| {
            assert_eq!((lone.leader, lone.stopped.as_slice()), (1, &[2][..]));
            assert!(!port_accepts(cluster.broker(2).port()), "broker 2 is stopped");
            assert_eq!(cluster.isr(topic)?[&0], vec![1]);
            assert_eq!(cluster.produce(topic, 0, &slices(&lost), Acks::Leader)?, 10);
            assert_eq!(
                cluster.end_offset(topic, 0)?,
                60,
                "consumers see the lone leader's records"
            );
            Ok(())
        })
        .expect("the unclean-election recipe");
    assert_eq!((election.old_leader, election.new_leader), (1, 2));
    assert_eq!(election.end_offset_before, 60);
    assert_eq!(election.end_offset_after, 10, "the log ends below what was written");
    assert_eq!(cluster.end_offset(topic, 0).unwrap(), 10);
    let state = cluster.topic(topic).unwrap();
    assert_eq!(state.partitions[&0].leader, Some(2));
    assert!(
        state.partitions[&0].isr.contains(&1),
        "the old leader is back: {state:?}"
    );

    let new = values("new", 5);
    assert_eq!(
        cluster.produce(topic, 0, &slices(&new), Acks::All).unwrap(),
        10,
        "new records take the offsets of the lost ones"
    );
    let records = cluster.read(topic, 0, 0).unwrap();
    assert!(
        records[10..]
            .iter()
            .all(|r| r.leader_epoch >= election.leader_epoch && r.leader_epoch > records[0].leader_epoch),
        "the new records carry the new leader's epoch: {records:?}"
    );
    let expected: Vec<String> = kept
        .iter()
        .chain(&new)
        .map(|v| String::from_utf8(v.clone()).unwrap())
        .collect();
    assert_eq!(read_values(&cluster, topic), expected);

    // The old leader truncated its own copy: led by it again, the log is
    // the new leader's.
    cluster.elect_preferred_leaders(topic).expect("broker 1 leads again");
    assert_eq!(cluster.leaders(topic).unwrap()[&0], Some(1));
    assert_eq!(cluster.wait_for_end_offset(topic, 0, 15).unwrap(), 15);
    assert_eq!(read_values(&cluster, topic), expected);
}

#[test]
fn an_own_cluster_is_gone_after_drop() {
    init_tracing();
    let _serial = serial();
    let cluster = KafkaCluster::builder()
        .brokers(3)
        .setting("log.retention.hours", 1)
        .start()
        .expect("start a cluster of its own");
    let ports: Vec<u16> = cluster.brokers().iter().map(|b| b.port()).collect();
    let pids: Vec<u32> = cluster.node_ids().iter().filter_map(|id| cluster.pid(*id)).collect();
    assert_eq!(pids.len(), 3);
    let dir = cluster.dir().to_path_buf();
    let properties = std::fs::read_to_string(dir.join("node-2/server.properties")).unwrap();
    assert!(properties.lines().any(|l| l == "log.retention.hours=1"), "{properties}");
    drop(cluster);
    for port in ports {
        assert!(!port_accepts(port), "port {port} still open after drop");
    }
    for pid in pids {
        assert!(
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z ")),
            "node JVM {pid} outlived the cluster"
        );
    }
    assert!(!dir.exists(), "the cluster's folder {dir:?} survived the drop");
}
