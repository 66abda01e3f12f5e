//! Until when a worker may act on a region it owns, by its own clock.
//!
//! A worker (see [`crate::membership`]) may act on a region only until
//! `term − margin` after it sent the renewal the database granted; its
//! event loop stops the region's runner at that deadline. What the runner
//! already handed to other threads — a sink's call on a blocking thread, a
//! client library's queue — can outlive that stop. An [`ActingGate`] is the
//! deadline those places ask right before an action that no store refuses
//! by the region's epoch (a Kafka producer's initialization, which fences
//! whoever initialized the same transactional id before): after it closes,
//! they do not start one.
//!
//! The clock is `CLOCK_BOOTTIME`, which keeps counting while the machine
//! sleeps or the VM is paused (`std::time::Instant` does not).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Milliseconds of `CLOCK_BOOTTIME`.
pub(crate) fn boot_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on
    // every Linux this runs on.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
    ts.tv_sec as u64 * 1_000 + ts.tv_nsec as u64 / 1_000_000
}

/// The deadline of one ownership of a region, shared by the worker's loop
/// (which moves it with every granted renewal and closes it when it stops
/// the region) and the region's subtasks (which ask it). A process that
/// runs the pipeline alone has no deadline: [`ActingGate::unlimited`].
#[derive(Clone, Debug)]
pub struct ActingGate(Arc<AtomicU64>);

impl ActingGate {
    /// No deadline: one process runs the pipeline under the store's lock.
    pub fn unlimited() -> ActingGate {
        ActingGate(Arc::new(AtomicU64::new(u64::MAX)))
    }

    /// A gate open until `boot_ms` (milliseconds of `CLOCK_BOOTTIME`).
    pub(crate) fn until(boot_ms: u64) -> ActingGate {
        ActingGate(Arc::new(AtomicU64::new(boot_ms)))
    }

    /// Whether the owner may still act: its deadline has not passed on
    /// this machine's boot clock.
    pub fn holds(&self) -> bool {
        boot_ms() < self.0.load(Ordering::Acquire)
    }

    /// Moves the deadline to `boot_ms` (never reopens a closed gate).
    pub(crate) fn extend(&self, boot_ms: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| (now != 0).then_some(boot_ms));
    }

    /// Closes the gate for good: the ownership ended.
    pub(crate) fn close(&self) {
        self.0.store(0, Ordering::Release);
    }
}

impl Default for ActingGate {
    fn default() -> Self {
        ActingGate::unlimited()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_holds_until_its_deadline_and_never_reopens_once_closed() {
        assert!(ActingGate::unlimited().holds());
        let gate = ActingGate::until(boot_ms() + 60_000);
        assert!(gate.holds());
        gate.extend(boot_ms().saturating_sub(1));
        assert!(!gate.holds(), "a deadline in the past");
        gate.extend(boot_ms() + 60_000);
        assert!(gate.holds());
        gate.close();
        assert!(!gate.holds());
        gate.extend(boot_ms() + 60_000);
        assert!(!gate.holds(), "a closed gate stays closed");
    }
}
