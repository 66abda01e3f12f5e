//! Leader elections of a [`KafkaCluster`] (ElectLeaders, through any
//! broker to the controller), and the recipe that truncates a partition's
//! log by an unclean election.
//!
//! Kafka's own `kafka-leader-election.sh` sends this very request (its
//! `--election-type PREFERRED` / `UNCLEAN` are the election types below);
//! the kit sends it itself because the tool is a JVM start (seconds on two
//! busy cores) per election and prints its outcome as text to parse, where
//! the response names each partition's error.

use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::{ElectLeadersRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::topics::missing;
use super::{kafka_error, request_to, KafkaCluster, Step, Versioned};
use crate::error::{Result, TestkitError};
use crate::kafka::wire::KafkaRequestError;

/// ElectLeaders' election types.
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

impl Versioned for ElectLeadersRequest {
    const VERSION: i16 = 2;
}

/// A partition whose leader is its only replica running: see
/// [`KafkaCluster::isolate_leader`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoneLeader {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Its leader, now its only in-sync replica.
    pub leader: i32,
    /// Its other replicas, stopped.
    pub stopped: Vec<i32>,
}

/// What [`KafkaCluster::replace_lone_leader`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UncleanElection {
    /// The leader that was replaced, running again as a follower with its
    /// log truncated to the new leader's.
    pub old_leader: i32,
    /// The leader elected without being in sync.
    pub new_leader: i32,
    /// The new leader's epoch.
    pub leader_epoch: i32,
    /// The partition's end offset (high watermark) on the old leader just
    /// before it was stopped.
    pub end_offset_before: i64,
    /// The end offset on the new leader right after the election: below
    /// `end_offset_before` when records were written while the leader was
    /// alone.
    pub end_offset_after: i64,
}

impl KafkaCluster {
    /// Moves the leadership of every partition of `topic` to its preferred
    /// replica (the first of its replicas) and waits until every running
    /// broker's Metadata shows it there. A preferred replica not yet back
    /// in sync (a broker just restarted) is waited for.
    pub fn elect_preferred_leaders(&self, topic: &str) -> Result<()> {
        let action = format!("electing the preferred leaders of {topic}");
        self.wait_until(&action, |cluster| {
            let state = match cluster.topic(topic) {
                Ok(state) => state,
                Err(err) => return Ok(Step::NotYet(err.to_string())),
            };
            let pending: Vec<i32> = state
                .partitions
                .iter()
                .filter(|(_, p)| !p.is_led_by_preferred())
                .map(|(index, _)| *index)
                .collect();
            if pending.is_empty() {
                return Ok(Step::Done(()));
            }
            match cluster.elect(&action, PREFERRED, topic, &pending)? {
                Some(err) => Ok(Step::NotYet(format!("{err}; leaders {state:?}"))),
                None => Ok(Step::NotYet(format!("elected for {pending:?}; Metadata not there yet"))),
            }
        })?;
        self.wait_on_every_broker(topic, "led by its preferred replicas", |state| {
            state.partitions.values().all(|p| p.is_led_by_preferred())
        })?;
        tracing::info!(topic, "preferred leaders elected");
        Ok(())
    }

    /// Makes sure a partition has a leader, electing one of its running
    /// replicas even if it is not in sync when it has none (an unclean
    /// election: the records only the old leader had are lost, whatever
    /// `unclean.leader.election.enable` says), and returns the leader.
    ///
    /// A partition whose leader the cluster still lists keeps it: a broker
    /// killed a moment ago leads until the controller fences it
    /// (`broker.session.timeout.ms`); wait until its leader is gone first,
    /// as [`replace_lone_leader`](Self::replace_lone_leader) does.
    pub fn elect_unclean_leader(&self, topic: &str, partition: i32) -> Result<i32> {
        let action = format!("electing a leader of {topic}/{partition}, in sync or not");
        let leader = self.wait_until(&action, |cluster| {
            let (live, state) = match (cluster.live_brokers(), cluster.topic(topic)) {
                (Ok(live), Ok(state)) => (live, state),
                (Err(err), _) | (_, Err(err)) => return Ok(Step::NotYet(err.to_string())),
            };
            let Some(current) = state.partitions.get(&partition) else {
                return Err(kafka_error(&action, missing(&format!("partition {partition}"))));
            };
            if let Some(leader) = current.leader.filter(|leader| live.contains(leader)) {
                return Ok(Step::Done(leader));
            }
            match cluster.elect(&action, UNCLEAN, topic, &[partition])? {
                Some(err) => Ok(Step::NotYet(format!("{err}; {current:?}, live brokers {live:?}"))),
                None => Ok(Step::NotYet(format!("elected; Metadata still shows {current:?}"))),
            }
        })?;
        tracing::info!(topic, partition, leader, "leader elected, in sync or not");
        Ok(leader)
    }

    /// Step 1 of the unclean-election recipe (see
    /// [`truncate_by_unclean_election`](Self::truncate_by_unclean_election)):
    /// stops (SIGKILL) every replica of the partition but its leader and
    /// waits until the controller has fenced them and the leader is the
    /// partition's only in-sync replica. Records written now are
    /// acknowledged by the leader alone (`acks=1`, or `acks=all` with
    /// `min.insync.replicas=1`), and consumers read them.
    ///
    /// A majority of the cluster's nodes must keep running (the controller
    /// quorum shrinks the ISR): on three brokers, a partition of
    /// replication factor 2.
    pub fn isolate_leader(&mut self, topic: &str, partition: i32) -> Result<LoneLeader> {
        let state = self.topic(topic)?;
        let current = state.partitions.get(&partition).cloned().ok_or_else(|| {
            kafka_error(
                &format!("isolating the leader of {topic}"),
                missing(&format!("partition {partition}")),
            )
        })?;
        let leader = current.leader.ok_or_else(|| TestkitError::InvalidSetting {
            var: "KafkaCluster::isolate_leader",
            value: format!("{topic}/{partition}: {current:?}"),
            fix: "isolate the leader of a partition that has one",
        })?;
        let stopped: Vec<i32> = current.replicas.iter().copied().filter(|id| *id != leader).collect();
        let mut running_after = 0;
        for node_id in self.node_ids() {
            if !stopped.contains(&node_id) && self.is_running(node_id) {
                running_after += 1;
            }
        }
        if running_after * 2 <= self.nodes.len() {
            return Err(TestkitError::InvalidSetting {
                var: "KafkaCluster::isolate_leader",
                value: format!("{topic}/{partition} with replicas {:?}", current.replicas),
                fix: "isolating a leader stops its other replicas, and a majority of the cluster's nodes \
                      must keep running: use a partition of replication factor 2 on three brokers",
            });
        }
        for node_id in &stopped {
            self.stop_broker(*node_id)?;
        }
        self.wait_for_topic(topic, "the leader alone in sync", |state| {
            state
                .partitions
                .get(&partition)
                .is_some_and(|p| p.leader == Some(leader) && p.isr == [leader])
        })?;
        tracing::info!(topic, partition, leader, ?stopped, "leader isolated");
        Ok(LoneLeader {
            topic: topic.to_string(),
            partition,
            leader,
            stopped,
        })
    }

    /// Step 2 of the unclean-election recipe: stops (SIGKILL) the lone
    /// leader, starts the replicas [`isolate_leader`](Self::isolate_leader)
    /// stopped, waits until the controller has fenced the old leader (the
    /// partition is then offline, or led by a started replica if the topic
    /// enables `unclean.leader.election.enable`), elects one of them
    /// ([`elect_unclean_leader`](Self::elect_unclean_leader)), and starts the
    /// old leader again, which truncates its log to the new leader's and
    /// returns to the in-sync replicas (waited for).
    pub fn replace_lone_leader(&mut self, lone: LoneLeader) -> Result<UncleanElection> {
        let LoneLeader {
            topic,
            partition,
            leader: old_leader,
            stopped,
        } = lone;
        let end_offset_before = self.end_offset(&topic, partition)?;
        self.stop_broker(old_leader)?;
        self.start_brokers(&stopped)?;
        self.wait_for_topic(&topic, "the old leader fenced", |state| {
            state
                .partitions
                .get(&partition)
                .is_some_and(|p| p.leader != Some(old_leader))
        })?;
        let new_leader = self.elect_unclean_leader(&topic, partition)?;
        let end_offset_after = self.end_offset(&topic, partition)?;
        let leader_epoch = self
            .topic(&topic)?
            .partitions
            .get(&partition)
            .map_or(-1, |p| p.leader_epoch);
        self.start_broker(old_leader)?;
        self.wait_for_topic(&topic, "the old leader back in sync", |state| {
            state
                .partitions
                .get(&partition)
                .is_some_and(|p| p.isr.contains(&old_leader))
        })?;
        let election = UncleanElection {
            old_leader,
            new_leader,
            leader_epoch,
            end_offset_before,
            end_offset_after,
        };
        tracing::info!(
            topic,
            partition,
            ?election,
            "lone leader replaced by an unclean election"
        );
        Ok(election)
    }

    /// Truncates a partition's log by an unclean election, reproducibly:
    ///
    /// 1. [`isolate_leader`](Self::isolate_leader): the partition's other
    ///    replicas are stopped and its leader L is alone in sync;
    /// 2. `write` runs: whatever it writes (with `acks=1`, or `acks=all`
    ///    and `min.insync.replicas=1`) exists on L only, and consumers
    ///    (a pipeline that checkpoints past it) read it;
    /// 3. [`replace_lone_leader`](Self::replace_lone_leader): L is stopped,
    ///    the other replicas start, a replica without those records is
    ///    elected, L starts again and truncates its log to the new
    ///    leader's.
    ///
    /// Afterwards the records `write` wrote are gone: the partition's end
    /// offset is back where it was before step 2 (below, if the new leader
    /// had fallen behind earlier), and the next records written get the
    /// offsets the lost ones had. Use a partition of replication factor 2
    /// on three brokers (see `isolate_leader`), e.g.
    /// `create_topic_with_assignment(t, &[vec![1, 2]],
    /// &[("min.insync.replicas", "1"), ("unclean.leader.election.enable",
    /// "true")])`. Takes about three times `broker.session.timeout.ms`
    /// plus two broker starts.
    pub fn truncate_by_unclean_election(
        &mut self,
        topic: &str,
        partition: i32,
        write: impl FnOnce(&KafkaCluster, &LoneLeader) -> Result<()>,
    ) -> Result<UncleanElection> {
        let lone = self.isolate_leader(topic, partition)?;
        write(self, &lone)?;
        self.replace_lone_leader(lone)
    }

    /// Sends one ElectLeaders request; `Ok(Some(err))` for an error that
    /// passes (or a partition that needs no election), `Ok(None)` when
    /// every partition was elected, `Err` for an error that will not pass.
    fn elect(
        &self,
        action: &str,
        election_type: i8,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Option<KafkaRequestError>> {
        let request = ElectLeadersRequest::default()
            .with_election_type(election_type)
            .with_topic_partitions(Some(vec![TopicPartitions::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(partitions.to_vec())]))
            .with_timeout_ms(30_000);
        let response = self.any_broker(action, |port| request_to(port, &request))?;
        let results = response
            .replica_election_results
            .iter()
            .flat_map(|result| result.partition_result.iter())
            .map(|p| KafkaRequestError::from_code(p.error_code, p.error_message.as_ref()));
        let mut passing = KafkaRequestError::from_code(response.error_code, None);
        for err in std::iter::once(passing.take()).chain(results).flatten() {
            let needless = err.response_error() == Some(ResponseError::ElectionNotNeeded);
            if !needless && !err.is_retriable() {
                return Err(kafka_error(action, err));
            }
            passing = Some(err);
        }
        Ok(passing)
    }
}
