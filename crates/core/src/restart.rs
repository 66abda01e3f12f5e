//! When and how often a failed pipeline is restarted from its last complete
//! checkpoint.
//!
//! # Why not `backon`
//!
//! Kept as a pure function of the attempt number rather than `backon`'s
//! `ExponentialBuilder`, for two reasons:
//!
//! - the pipeline restarts its count at 1 after a checkpoint completes (a
//!   region that made progress starts over): [`RestartStrategy::delay`]
//!   takes the attempt, where a `backon` backoff is an iterator to rebuild;
//! - `restart.jitter` is documented as the share of a delay *removed* at
//!   random (`0.2`: each delay lies in `[0.8 d, d]`, never above the cap);
//!   `backon`'s jitter *adds* up to its minimum delay to each delay, which
//!   would change what operators configured.
//!
//! The Kafka client's and connector's retries (the coordinator's not-ready
//! backoff, EndTxn's, the fetcher's, the Kafka sink's) are one plain
//! doubling with a cap and no jitter, `exactly_kafka_wire::backoff`, whose
//! documentation says why it is not `backon` either.

use std::time::Duration;

use rand::{Rng, RngExt};

/// A restart strategy. Pure: [`RestartStrategy::delay`] says how long to wait
/// before attempt `n`, or `None` to give up.
#[derive(Clone, Debug, PartialEq)]
pub enum RestartStrategy {
    /// Never restart; the first failure ends the pipeline.
    None,
    /// Wait `delay` before each restart, at most `max_attempts` restarts in a row.
    FixedDelay {
        /// The wait before each restart.
        delay: Duration,
        /// Restarts in a row before giving up.
        max_attempts: u32,
    },
    /// Wait `initial * multiplier^(n-1)`, capped at `max`, with up to `jitter`
    /// (0.0..=1.0) of it randomly removed, at most `max_attempts` restarts in a row.
    ExponentialBackoff {
        /// The wait before the first restart.
        initial: Duration,
        /// The longest wait.
        max: Duration,
        /// Growth of the wait from one restart to the next.
        multiplier: f64,
        /// Share of each wait removed at random (0.0..=1.0).
        jitter: f64,
        /// Restarts in a row before giving up.
        max_attempts: u32,
    },
}

impl Default for RestartStrategy {
    fn default() -> Self {
        RestartStrategy::ExponentialBackoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(30),
            multiplier: 2.0,
            jitter: 0.2,
            max_attempts: 10,
        }
    }
}

impl RestartStrategy {
    /// Delay before restart attempt `attempt` (1-based), or `None` to give up.
    pub fn delay(&self, attempt: u32) -> Option<Duration> {
        self.delay_with(attempt, &mut rand::rng())
    }

    /// [`delay`](Self::delay) with an explicit random source.
    pub fn delay_with(&self, attempt: u32, rng: &mut impl Rng) -> Option<Duration> {
        match self {
            RestartStrategy::None => None,
            RestartStrategy::FixedDelay { delay, max_attempts } => (attempt <= *max_attempts).then_some(*delay),
            RestartStrategy::ExponentialBackoff {
                initial,
                max,
                multiplier,
                jitter,
                max_attempts,
            } => {
                if attempt > *max_attempts {
                    return None;
                }
                let exp = multiplier.powi(attempt.saturating_sub(1).min(64) as i32);
                let base = (initial.as_secs_f64() * exp).min(max.as_secs_f64());
                let cut = base * jitter.clamp(0.0, 1.0) * rng.random::<f64>();
                Some(Duration::from_secs_f64(base - cut))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_delay_gives_up_after_max_attempts() {
        let s = RestartStrategy::FixedDelay {
            delay: Duration::from_millis(5),
            max_attempts: 2,
        };
        assert_eq!(s.delay(1), Some(Duration::from_millis(5)));
        assert_eq!(s.delay(2), Some(Duration::from_millis(5)));
        assert_eq!(s.delay(3), None);
        assert_eq!(RestartStrategy::None.delay(1), None);
    }

    #[test]
    fn backoff_grows_is_capped_and_jitter_only_shortens() {
        let s = RestartStrategy::ExponentialBackoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            multiplier: 2.0,
            jitter: 0.5,
            max_attempts: 20,
        };
        for attempt in 1..=20 {
            let full = (100.0 * 2f64.powi(attempt as i32 - 1)).min(1000.0);
            let d = s.delay(attempt).unwrap().as_secs_f64() * 1000.0;
            assert!(
                d <= full + 1e-6 && d >= full * 0.5 - 1e-6,
                "attempt {attempt}: {d} vs {full}"
            );
        }
        assert_eq!(s.delay(21), None);
    }
}
