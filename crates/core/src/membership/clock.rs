//! The two clocks of the ownership model, and the lease settings.

use std::fmt;
use std::time::Duration;

/// A time on the database's clock, in milliseconds since the Unix epoch, as
/// read inside one of the store's transactions. Only the database's
/// readings are ever compared with each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DbTime(pub u64);

impl DbTime {
    /// `self + d`.
    pub fn after(self, d: Duration) -> DbTime {
        DbTime(self.0.saturating_add(d.as_millis() as u64))
    }
}

impl fmt::Display for DbTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "db@{}ms", self.0)
    }
}

/// A reading of one worker's own monotonic clock, in milliseconds since an
/// origin of that worker's choosing. Readings of two workers mean nothing
/// to each other; the clock must keep counting while the process is
/// stopped or the machine sleeps (`CLOCK_BOOTTIME` on Linux).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonoTime(pub u64);

impl MonoTime {
    /// `self + d`.
    pub fn after(self, d: Duration) -> MonoTime {
        MonoTime(self.0.saturating_add(d.as_millis() as u64))
    }
}

impl fmt::Display for MonoTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mono@{}ms", self.0)
    }
}

/// How leases are granted and kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// How long a lease runs on the database's clock after it was granted
    /// or renewed (default 3 s). Bounds the failover time after a worker
    /// dies.
    pub term: Duration,
    /// How often a worker renews its membership and its leases (default
    /// 1 s): well inside `term − margin`, so one slow or lost renewal loses
    /// nothing.
    pub renew_every: Duration,
    /// How much earlier than the lease a worker stops acting, by its own
    /// clock (default 500 ms): covers the difference of clock rates over a
    /// term and scheduling delays.
    pub margin: Duration,
    /// How often a worker reads the leases to claim free regions (default
    /// 250 ms; a released lease is announced at once besides).
    pub poll: Duration,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        LeaseSettings {
            term: Duration::from_secs(3),
            renew_every: Duration::from_secs(1),
            margin: Duration::from_millis(500),
            poll: Duration::from_millis(250),
        }
    }
}

impl LeaseSettings {
    /// How long after a renewal (or claim) was sent the worker may act:
    /// `term − margin`.
    pub fn acting_window(&self) -> Duration {
        self.term.saturating_sub(self.margin)
    }

    /// Checks that the settings can work: a positive margin shorter than
    /// the term, and renewals (and polls) more frequent than the acting
    /// window, so a healthy worker never reaches its deadline.
    pub fn validate(&self) -> Result<(), String> {
        let named = [
            ("term", self.term),
            ("renewal interval", self.renew_every),
            ("margin", self.margin),
            ("poll interval", self.poll),
        ];
        if let Some((what, d)) = named.iter().find(|(_, d)| d.as_millis() == 0 && !d.is_zero()) {
            return Err(format!(
                "the lease {what} ({d:?}) is below a millisecond, the unit leases are kept in: write at least 1ms"
            ));
        }
        if self.margin.is_zero() || self.margin >= self.term {
            return Err(format!(
                "the lease margin ({:?}) must be above 0 and below the lease term ({:?})",
                self.margin, self.term
            ));
        }
        if self.renew_every.is_zero() || self.renew_every >= self.acting_window() {
            return Err(format!(
                "leases must be renewed more often ({:?}) than term − margin ({:?})",
                self.renew_every,
                self.acting_window()
            ));
        }
        if self.poll.is_zero() {
            return Err("the lease poll interval must be above 0".into());
        }
        Ok(())
    }
}
