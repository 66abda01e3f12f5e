//! Who works on which region, when several processes run one pipeline: the
//! ownership, lease and epoch decisions as pure code — decisions in, actions
//! out, no I/O and no clock of its own. The runtime (round 2) performs the
//! orders against the shared store; the PostgreSQL store's statements
//! implement the same rules as [`RegionLease`]. See
//! `docs/design/several-processes.md`.
//!
//! Two clocks, two types, never compared with each other:
//! - [`DbTime`]: the database's clock, read inside the store's transactions
//!   (`now()`, `clock_timestamp()`): it judges every lease;
//! - [`MonoTime`]: one worker's own monotonic clock: a worker stops acting on
//!   a region by it, `term − margin` after the moment it *sent* the renewal
//!   that succeeded, before the database can have let the lease expire.
//!
//! Safety does not rest on the leases: every write a region makes carries
//! its [`Epoch`], and the store accepts it only while the epoch is the
//! region's current one ([`RegionLease::accepts_write`]). Leases keep fenced
//! owners rare and failover fast.
//!
//! - [`lease`]: the store's side — claim (which fences), renew, release,
//!   and the epoch check of a write;
//! - [`balance`]: even, sticky shares of the regions among live workers;
//! - [`worker`]: one worker's state machine;
//! - [`shared`]: [`LeaseStore`], the rows in the store every worker reaches.

pub mod balance;
mod clock;
pub mod lease;
pub mod shared;
pub mod worker;

pub use balance::{plan, quota, Plan};
pub use clock::{DbTime, LeaseSettings, MonoTime};
pub use lease::{Claim, Epoch, Member, RegionLease, WorkerId};
pub use shared::LeaseStore;
pub use worker::{Input, Order, View, Worker};
