//! Real services for exactly's integration tests and demo.
//!
//! Each handle starts a genuine server on a free port of `127.0.0.1` and
//! stops it (and deletes its files) when dropped:
//!
//! - [`PostgresServer`]: a throwaway PostgreSQL cluster with
//!   `max_prepared_transactions = 64`, for two-phase commit
//!   (env override: `EXACTLY_DATABASE_URL`);
//! - [`KafkaBroker`]: a Kafka-compatible broker (Nisshi), in memory or
//!   persistent (env override: `EXACTLY_KAFKA_BOOTSTRAP`);
//! - [`RedisServer`]: `redis-server` without persistence
//!   (env override: `EXACTLY_REDIS_URL`).
//!
//! When the override variable is set, the handle only carries that address
//! and stops nothing. Every handle offers `stop()` and `restart()` (same
//! port, same data where the service keeps any) to simulate outages.
//!
//! Missing programs are reported as [`TestkitError::BinaryNotFound`] with the
//! command that installs them; `.ci/install-services.sh` installs them all.
//!
//! ```no_run
//! let pg = exactly_testkit::PostgresServer::start()?;
//! println!("connect to {}", pg.url());
//! # Ok::<(), exactly_testkit::TestkitError>(())
//! ```

#![warn(missing_docs)]

mod error;
#[macro_use]
mod handle;
pub mod kafka;
pub mod postgres;
mod process;
pub mod redis;

pub use error::{Result, TestkitError};
pub use kafka::KafkaBroker;
pub use postgres::PostgresServer;
pub use process::{free_port, port_accepts};
pub use redis::RedisServer;
