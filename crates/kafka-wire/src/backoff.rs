//! The one backoff of the Kafka client and connector: a first pause,
//! doubled after each failure in a row, capped, without jitter. The
//! fetcher's per-partition retries (`fetch::state`) ask [`doubling`] for the
//! pause of a failure count; the loops that retry one call until a deadline
//! (the coordinator's not-ready answers, EndTxn, the Kafka sink's commits,
//! recoveries and batch-header reads) hold a [`Backoff`].
//!
//! A function of the failure count rather than `backon`'s
//! `ExponentialBuilder` (its exact match would be `with_min_delay(first)
//! .with_max_delay(cap).with_factor(2.0).without_max_times()`): the fetcher
//! keeps a count per partition inside a state machine that has no I/O and
//! asks for the pause of a count when a Fetch fails, where a `backon`
//! backoff is an iterator held across awaits; the not-ready loop needs the
//! next pause *before* sleeping it, to tell whether it still ends before
//! its deadline. One function keeps the two the same.

use std::time::Duration;

// Tokio's clock, so that tests on paused time see the pauses pass.
use tokio::time::Instant;

/// The pause after `failures` failures in a row (1 for the first): `first`,
/// doubled each time, at most `cap`. Counts past 17 give `cap`'s doubling
/// bound; 0 counts as 1.
pub fn doubling(first: Duration, failures: u32, cap: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    first.saturating_mul(1u32 << doublings).min(cap)
}

/// Retries of one call until a deadline: pauses from `first`, doubled up
/// to `cap`, for as long as the next pause still ends before the deadline.
#[derive(Debug)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    deadline: Instant,
    /// Attempts made so far (1 before the first pause).
    attempts: u32,
}

impl Backoff {
    /// Attempts may go on for `wait` from now, pausing from `first` up to
    /// `cap` between them.
    pub fn new(wait: Duration, first: Duration, cap: Duration) -> Backoff {
        Backoff {
            first,
            cap,
            deadline: Instant::now() + wait,
            attempts: 1,
        }
    }

    /// Attempts made so far, the one under way included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The pause [`pause`](Self::pause) will sleep.
    pub fn next_pause(&self) -> Duration {
        doubling(self.first, self.attempts, self.cap)
    }

    /// Whether another attempt fits: the next pause ends before the
    /// deadline.
    pub fn fits(&self) -> bool {
        Instant::now() + self.next_pause() <= self.deadline
    }

    /// The time left until the deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Sleeps the next pause and counts the attempt to come.
    pub async fn pause(&mut self) {
        tokio::time::sleep(self.next_pause()).await;
        self.attempts += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_first_pause_up_to_the_cap() {
        let ms = Duration::from_millis;
        let pauses: Vec<Duration> = (0..=6).map(|n| doubling(ms(100), n, ms(1_000))).collect();
        assert_eq!(pauses, [100, 100, 200, 400, 800, 1_000, 1_000].map(ms));
        assert_eq!(doubling(ms(100), u32::MAX, ms(1_000)), ms(1_000));
        assert_eq!(
            doubling(Duration::from_secs(u64::MAX / 2), 40, Duration::MAX),
            Duration::MAX
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_backoff_pauses_doubling_while_the_next_pause_fits_before_the_deadline() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(1_000), ms(100), ms(400));
        let mut slept = Vec::new();
        while backoff.fits() {
            slept.push(backoff.next_pause());
            backoff.pause().await;
        }
        assert_eq!(
            slept,
            [100, 200, 400].map(ms),
            "a fourth pause of 400 ms would end past the deadline"
        );
        assert_eq!(backoff.attempts(), 4);
        assert_eq!(backoff.remaining(), ms(300));
        // A pause that ends exactly at the deadline still fits.
        let mut backoff = Backoff::new(ms(700), ms(100), ms(400));
        let mut slept = Vec::new();
        while backoff.fits() {
            slept.push(backoff.next_pause());
            backoff.pause().await;
        }
        assert_eq!(slept, [100, 200, 400].map(ms));
        assert_eq!(backoff.remaining(), Duration::ZERO);
    }
}
