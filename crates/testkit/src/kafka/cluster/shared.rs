//! One [`KafkaCluster`] per test process, lent to one test at a time: a
//! cluster costs tens of seconds to start on a small machine, and the tests
//! that need one stop, freeze and elect, so they cannot use it at once.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, Once, TryLockError};

use super::KafkaCluster;
use crate::error::Result;

static SHARED: Mutex<Option<KafkaCluster>> = Mutex::new(None);

/// The process's shared cluster, lent to the holder until dropped; see
/// [`KafkaCluster::shared`].
pub struct SharedCluster {
    guard: MutexGuard<'static, Option<KafkaCluster>>,
}

impl KafkaCluster {
    /// The cluster the tests of this process share, started
    /// ([`KafkaCluster::start`]) on first use, lent to one caller at a time
    /// (the others wait) and [`heal`](Self::heal)ed before each loan: every
    /// broker runs and none is frozen, whatever the last borrower did (a
    /// test that panicked included). Topics stay: use names of your own.
    /// The cluster lives until the process exits (the kernel kills its
    /// nodes, an exit hook removes its folder). A cluster that cannot be
    /// healed is replaced by a new one.
    pub fn shared() -> Result<SharedCluster> {
        let mut guard = SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(cluster) = guard.as_mut() {
            match cluster.heal() {
                Ok(()) => return Ok(SharedCluster { guard }),
                Err(err) => {
                    tracing::warn!(%err, "the shared Kafka cluster cannot be healed; starting a new one");
                    *guard = None;
                }
            }
        }
        *guard = Some(KafkaCluster::start()?);
        static EXIT_HOOK: Once = Once::new();
        // SAFETY: registering a plain `extern "C"` function.
        EXIT_HOOK.call_once(|| unsafe {
            libc::atexit(remove_shared_cluster);
        });
        Ok(SharedCluster { guard })
    }
}

impl Deref for SharedCluster {
    type Target = KafkaCluster;

    fn deref(&self) -> &KafkaCluster {
        self.guard.as_ref().expect("a loaned shared cluster is started")
    }
}

impl DerefMut for SharedCluster {
    fn deref_mut(&mut self) -> &mut KafkaCluster {
        self.guard.as_mut().expect("a loaned shared cluster is started")
    }
}

impl std::fmt::Debug for SharedCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedCluster").field(self.deref()).finish()
    }
}

/// Exit hook: kills the shared cluster's nodes and removes its folder,
/// unless a test still holds it (then the kernel kills the nodes, and a
/// later run removes the folder).
extern "C" fn remove_shared_cluster() {
    let cluster = match SHARED.try_lock() {
        Ok(mut guard) => guard.take(),
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner().take(),
        Err(TryLockError::WouldBlock) => None,
    };
    drop(cluster);
}
