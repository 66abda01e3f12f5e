//! What the fetcher's task knows of one partition, and the decisions about
//! it that need no I/O: whether it may be fetched now and from which
//! broker, what a new leader means for it, what an epoch check found.

use tokio::time::Instant;

use super::settings::{FetchSettings, OnTruncation};
use super::FetchPosition;
use crate::consumer_client::{EpochEnd, Leader};

/// Where the fetcher's task stands with one partition.
#[derive(Debug)]
pub(super) struct PartitionState {
    /// The next offset to fetch.
    pub(super) position: i64,
    /// The leader epoch of the last record (or batch) before `position`,
    /// when known: what the position is checked with (KIP-320).
    pub(super) epoch: Option<i32>,
    /// Bytes it may contribute to an answer; raised after an answer cut
    /// its next batch.
    pub(super) max_bytes: i32,
    /// Its leader, as the metadata names it.
    pub(super) leader: Option<Leader>,
    /// A replica the leader named to fetch from instead (KIP-392), until
    /// the given time.
    pub(super) replica: Option<(Leader, Instant)>,
    /// The id of the Fetch holding it, while one is in flight.
    pub(super) in_flight: Option<u64>,
    /// Whether its position must be checked against the leader's log
    /// before it is fetched again.
    pub(super) check: Check,
    /// The leader epoch the position was last checked under (or fetched
    /// under: records fetched from the current leader are its log).
    pub(super) checked_under: Option<i32>,
    /// An out-of-range position's bounds are being looked up.
    pub(super) resetting: bool,
    /// The position was found past the log's end after a check that found
    /// no divergence: a second such answer is final.
    pub(super) past_end_checked: bool,
    /// Failures in a row (reset by an answer for it).
    pub(super) failures: u32,
    /// Not fetched again before then, after a failure.
    pub(super) retry_at: Option<Instant>,
}

/// The epoch check of a partition's position (KIP-320).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Nothing to check: the position was checked under the current
    /// leader epoch, or it has no epoch to check with.
    Done,
    /// To be asked of the leader before the next Fetch.
    Needed,
    /// Asked; the answer is awaited.
    Running,
}

/// What an epoch check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checked {
    /// The log holds what the position passed: fetch on.
    Valid,
    /// The log diverges below the position, at `divergence` (epoch
    /// `epoch`), or at an unknown place (`None`).
    Truncated { divergence: Option<(i64, i32)> },
}

impl PartitionState {
    pub(super) fn new(start: FetchPosition, settings: &FetchSettings) -> PartitionState {
        PartitionState {
            position: start.offset,
            epoch: start.epoch,
            max_bytes: settings.partition_max_bytes,
            leader: None,
            replica: None,
            in_flight: None,
            check: if start.epoch.is_some() {
                Check::Needed
            } else {
                Check::Done
            },
            checked_under: None,
            resetting: false,
            past_end_checked: false,
            failures: 0,
            retry_at: None,
        }
    }

    /// Whether a Fetch may include it now: a leader known, nothing in
    /// flight, no check or lookup pending, no backoff running.
    pub(super) fn fetchable(&self, now: Instant) -> bool {
        self.leader.is_some()
            && self.in_flight.is_none()
            && self.check == Check::Done
            && !self.resetting
            && self.retry_at.is_none_or(|at| at <= now)
    }

    /// The broker to fetch it from: the replica the leader named while
    /// that holds, else the leader.
    pub(super) fn source(&self, now: Instant) -> Option<&Leader> {
        match &self.replica {
            Some((replica, until)) if *until > now => Some(replica),
            _ => self.leader.as_ref(),
        }
    }

    /// The leader the metadata names now. A new leader, or a new epoch of
    /// the same one, abandons the Fetch in flight (its answer is ignored)
    /// and drops a read replica; a position with an epoch is checked again
    /// under the new leader epoch before the next Fetch. Whether the
    /// leader changed.
    pub(super) fn lead(&mut self, leader: Option<Leader>) -> bool {
        if self.leader == leader {
            return false;
        }
        let had_one = self.leader.is_some();
        let new_epoch = leader.as_ref().map(|l| l.epoch);
        self.leader = leader;
        self.replica = None;
        self.in_flight = None;
        if self.epoch.is_some()
            && new_epoch.is_some()
            && new_epoch != self.checked_under
            && self.check != Check::Running
        {
            self.check = Check::Needed;
        }
        had_one
    }

    /// Records fetched under the current leader epoch moved the position
    /// to `next` (the last of them of epoch `epoch`).
    pub(super) fn advance(&mut self, next: i64, epoch: Option<i32>) {
        self.position = next;
        if epoch.is_some() {
            self.epoch = epoch;
        }
        self.checked_under = self.leader.as_ref().map(|l| l.epoch);
        self.past_end_checked = false;
    }

    /// Backs it off after a failure.
    pub(super) fn failed(&mut self, now: Instant, settings: &FetchSettings) {
        self.failures += 1;
        self.in_flight = None;
        self.retry_at = Some(now + backoff(settings, self.failures));
    }
}

/// What the leader's answer `end` to the check of `position` (epoch
/// `epoch`) means (Kafka's consumer reads it the same way): a leader that
/// knows no epoch at or below the asked one cannot tell where its log
/// diverges; one whose epoch ends below the position has truncated what
/// the position passed.
pub(super) fn judge(position: i64, end: EpochEnd) -> Checked {
    match (end.epoch, end.end_offset) {
        (Some(epoch), Some(end)) if end < position => Checked::Truncated {
            divergence: Some((end, epoch)),
        },
        (Some(_), Some(_)) => Checked::Valid,
        _ => Checked::Truncated { divergence: None },
    }
}

/// What the fetcher does about a truncation under `policy`: go on at the
/// divergence (`Some`), or stop (`None`).
pub(super) fn resume_at(policy: OnTruncation, divergence: Option<(i64, i32)>) -> Option<(i64, i32)> {
    match policy {
        OnTruncation::Resume => divergence,
        OnTruncation::Fail => None,
    }
}

/// The pause after `failures` failures in a row: the first backoff,
/// doubled each time, at most the longest.
pub(super) fn backoff(settings: &FetchSettings, failures: u32) -> std::time::Duration {
    crate::backoff::doubling(settings.backoff, failures, settings.max_backoff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(node: i32, epoch: i32) -> Leader {
        Leader {
            node,
            address: format!("broker-{node}:9092"),
            epoch,
        }
    }

    fn at(offset: i64, epoch: Option<i32>) -> PartitionState {
        PartitionState::new(FetchPosition { offset, epoch }, &FetchSettings::default())
    }

    #[test]
    fn a_position_with_an_epoch_is_checked_before_its_first_fetch_and_after_every_new_leader_epoch() {
        let now = Instant::now();
        let mut state = at(100, Some(3));
        state.lead(Some(leader(1, 5)));
        assert_eq!(state.check, Check::Needed, "checked before the first fetch");
        assert!(!state.fetchable(now));
        state.check = Check::Done;
        state.checked_under = Some(5);
        assert!(state.fetchable(now));
        assert!(!state.lead(Some(leader(1, 5))), "the same leader is no change");
        assert_eq!(state.check, Check::Done);
        state.in_flight = Some(7);
        assert!(state.lead(Some(leader(2, 6))), "a new leader");
        assert_eq!(state.in_flight, None, "the Fetch to the old leader is abandoned");
        assert_eq!(state.check, Check::Needed, "checked again under epoch 6");
    }

    #[test]
    fn a_position_without_an_epoch_is_fetched_at_once_and_gains_one_from_its_records() {
        let mut state = at(0, None);
        state.lead(Some(leader(1, 2)));
        assert_eq!(state.check, Check::Done);
        state.advance(10, Some(2));
        assert_eq!(
            (state.position, state.epoch, state.checked_under),
            (10, Some(2), Some(2))
        );
        state.lead(Some(leader(2, 3)));
        assert_eq!(state.check, Check::Needed, "now it has an epoch to check");
        state.advance(12, None);
        assert_eq!(state.epoch, Some(2), "markers only: the epoch stays");
    }

    #[test]
    fn a_leader_epoch_ending_below_the_position_is_a_truncation() {
        let end = |epoch, end_offset| EpochEnd { epoch, end_offset };
        assert_eq!(judge(100, end(Some(4), Some(100))), Checked::Valid, "ends right at it");
        assert_eq!(judge(100, end(Some(4), Some(250))), Checked::Valid);
        assert_eq!(
            judge(100, end(Some(3), Some(60))),
            Checked::Truncated {
                divergence: Some((60, 3))
            }
        );
        assert_eq!(
            judge(100, end(None, None)),
            Checked::Truncated { divergence: None },
            "a leader that knows no such epoch cannot tell where"
        );
        assert_eq!(resume_at(OnTruncation::Fail, Some((60, 3))), None);
        assert_eq!(resume_at(OnTruncation::Resume, Some((60, 3))), Some((60, 3)));
        assert_eq!(resume_at(OnTruncation::Resume, None), None, "nowhere to resume");
    }

    #[test]
    fn a_read_replica_is_used_until_its_time_is_up_or_the_leader_changes() {
        let now = Instant::now();
        let mut state = at(0, None);
        state.lead(Some(leader(1, 2)));
        state.replica = Some((leader(3, 2), now + std::time::Duration::from_secs(60)));
        assert_eq!(state.source(now).map(|l| l.node), Some(3));
        assert_eq!(
            state.source(now + std::time::Duration::from_secs(61)).map(|l| l.node),
            Some(1)
        );
        state.lead(Some(leader(2, 3)));
        assert_eq!(state.source(now).map(|l| l.node), Some(2), "a new leader drops it");
    }

    #[test]
    fn backoff_doubles_up_to_the_longest() {
        let settings = FetchSettings::default();
        let pauses: Vec<u128> = (1..=6).map(|n| backoff(&settings, n).as_millis()).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(&settings, u32::MAX), settings.max_backoff);
    }
}
