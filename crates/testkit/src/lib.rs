//! Real services for exactly's integration tests and demo.
//!
//! Each handle starts a genuine server on a free port of `127.0.0.1` and
//! stops it (and deletes its files) when dropped:
//!
//! - [`PostgresServer`]: a throwaway PostgreSQL cluster with
//!   `max_prepared_transactions = 64`, for two-phase commit
//!   (env override: `EXACTLY_DATABASE_URL`);
//! - [`KafkaBroker`]: an Apache Kafka broker (one KRaft node run from its
//!   jars, or in a container), shared per test process or a test's own
//!   (env override of the shared one: `EXACTLY_KAFKA_BOOTSTRAP`);
//! - [`RedisServer`]: `redis-server` without persistence, or in a
//!   container (env override: `EXACTLY_REDIS_URL`).
//!
//! When the override variable is set, `start()` (and
//! [`KafkaBroker::shared`]) only carry that address and stop nothing. A
//! test that stops, restarts, freezes or reconfigures a service starts its
//! own (`start_own()`, [`KafkaBroker::start`], [`KafkaBroker::builder`]),
//! whatever the variables say; those handles offer `stop()`, `restart()`
//! (same port, same data where the service keeps any), `freeze()` and
//! `thaw()` to simulate outages.
//!
//! # Docker fallback
//!
//! Every service is looked for in this order: the override variable (where
//! it applies), the local programs (for Kafka: `java` and the jars
//! `.ci/install-services.sh` copies, see [`kafka::KAFKA_LIBS_ENV`]), then a
//! Docker container when an engine answers within a few seconds (asked once
//! per process), then an error naming all three. Containers are driven
//! through the `testcontainers` crate (its async runner, on a runtime of the
//! testkit's own, so the synchronous API works inside and outside tokio
//! tests) with the images of `testcontainers-modules` where they fit:
//! PostgreSQL ([`postgres::POSTGRES_IMAGE`], `max_prepared_transactions` set
//! on its command line), Redis ([`redis::REDIS_IMAGE`]); Kafka runs
//! [`kafka::KAFKA_IMAGE`] as a generic image (single-node transaction-log
//! settings, a cluster id of its own). `testcontainers` finds the engine
//! (`DOCKER_HOST`, `~/.testcontainers.properties`, the local socket); the
//! engine must publish ports on this machine's loopback. Published ports
//! are bound to `127.0.0.1`; a container is removed (with its anonymous
//! volumes) when its handle drops.
//! [`DOCKER_MODE_ENV`] (`EXACTLY_TESTKIT_DOCKER`) steers this: `auto` (the
//! default), `never` (no containers) or `always` (skip the local programs,
//! e.g. to exercise the container path:
//! `EXACTLY_TESTKIT_DOCKER=always cargo test -p exactly-testkit -- --ignored docker`).
//! [`Backend`] tells which one a handle got. Containers are named
//! `exactly-testkit-<service>-<pid>-<n>-<random>` and labelled
//! `exactly.testkit=1`; the ones a killed test run left behind can be
//! removed with
//! `docker rm -f -v $(docker ps -aq --filter label=exactly.testkit=1)`.
//!
//! When nothing works, the error is [`TestkitError::BinaryNotFound`]: it
//! names the command that installs the program, why Docker was not used, and
//! the override variable; `.ci/install-services.sh` installs all programs.
//!
//! Every child process (the Kafka JVM included) runs in its own process
//! group; a Kafka broker is also killed by the kernel when the test process
//! ends without dropping its handle.
//!
//! For connector authors, [`crash`] runs a pipeline through SIGKILLs at
//! every crash point of the runtime and checks the output exactly once.
//!
//! ```no_run
//! let pg = exactly_testkit::PostgresServer::start()?;
//! println!("connect to {}", pg.url());
//! # Ok::<(), exactly_testkit::TestkitError>(())
//! ```

#![warn(missing_docs)]

mod container;
pub mod crash;
mod error;
#[macro_use]
mod handle;
pub mod kafka;
pub mod postgres;
mod process;
pub mod redis;
pub mod tls;

pub use container::DOCKER_MODE_ENV;
pub use error::{Result, TestkitError};
pub use handle::Backend;
pub use kafka::{KafkaBroker, KafkaBrokerBuilder, SecuredListener};
pub use postgres::PostgresServer;
pub use process::{free_port, port_accepts};
pub use redis::RedisServer;
