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
//! - [`KafkaCluster`]: several KRaft brokers (three by default) from the
//!   same jars, each of which a test may stop, kill, start, freeze and
//!   thaw, with topics of explicit replica assignments and preferred and
//!   unclean leader elections (local jars only);
//! - [`RedisServer`]: `redis-server` without persistence, or in a
//!   container (env override: `EXACTLY_REDIS_URL`);
//! - [`SchemaRegistry`]: Apicurio Registry serving the Confluent-compatible
//!   schema registry API, run from its jar, shared per test process or a
//!   test's own, with basic authentication and TLS in front on demand
//!   (env override of the shared one: `EXACTLY_SCHEMA_REGISTRY_URL`).
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
//! Only in a build with the kit's `containers` feature (off by default;
//! exactly's tests turn it on, the demo does not, and without it the kit
//! builds none of `testcontainers`, `bollard` and their protocol crates
//! and starts local programs only: the error then says Docker was not
//! tried because of the missing feature).
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
//! every crash point of the runtime and checks the output exactly once. It
//! is the crate `exactly-crash-kit`, re-exported here: a connector's tests
//! that need only the crash kit depend on that crate alone, which builds
//! none of the services' clients.
//!
//! ```no_run
//! let pg = exactly_testkit::PostgresServer::start()?;
//! println!("connect to {}", pg.url());
//! # Ok::<(), exactly_testkit::TestkitError>(())
//! ```

mod container;
pub use exactly_crash_kit as crash;
mod error;
#[macro_use]
mod handle;
pub mod kafka;
pub mod postgres;
mod process;
pub mod redis;
pub mod schema_registry;
pub mod tls;

pub use container::DOCKER_MODE_ENV;
pub use error::{Result, TestkitError};
pub use handle::Backend;
pub use kafka::{KafkaBroker, KafkaBrokerBuilder, KafkaCluster, KafkaClusterBuilder, SecuredListener};
pub use postgres::PostgresServer;
pub use process::{free_port, port_accepts};
pub use redis::RedisServer;
pub use schema_registry::{RegistryFront, SchemaRegistry};
