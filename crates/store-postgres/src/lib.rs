//! # exactly-store-postgres
//!
//! exactly's checkpoint store in PostgreSQL ([`PgCheckpointStore`]): the
//! checkpoints of a pipeline where every machine that runs it can reach
//! them, with the compare-and-set contract of
//! [`exactly_core::store::contract`] — every write conditional on its
//! owner's epoch, every failure saying whether it may have taken effect.
//! Chosen in a pipeline file with
//!
//! ```toml
//! [checkpoint]
//! store = { postgres = "postgres://exactly@db:5432/pipelines?sslmode=verify-full&sslrootcert=/etc/ca.pem" }
//! # or the URL from a secret: store = { postgres = { env = "CHECKPOINT_DB" } }
//! ```
//!
//! Entries keep their names (`<fingerprint>-<unix-ms>-<checkpoint-id>`),
//! their JSON envelope and its checksum byte for byte, per pipeline and
//! sequence (`global`, `region-<i>`); to read one with `psql`:
//! `SELECT convert_from(body, 'UTF8') FROM exactly_checkpoints WHERE pipeline = … AND name = …`.
//! The tables (see `schema.rs`) are made on first use.
//!
//! ## Decisions
//!
//! - **One statement per call.** Every conditional write is a single
//!   statement that locks the sequence's row `FOR SHARE` at the expected
//!   epoch (`sequence.rs` says why no write of an older epoch can land
//!   after a newer epoch was taken). A single statement is its own
//!   transaction, so a refused or failed one left nothing behind.
//! - **Errors say what is known** (`session.rs`): a server error or a failed
//!   connect is determinate; a write whose connection broke or whose answer
//!   timed out after it was sent is indeterminate, and the runtime then
//!   neither commits nor aborts but restarts the region, whose fence settles
//!   the write.
//! - **Bounded on both sides**: a client time-out per call (default 30 s)
//!   and `statement_timeout`, `idle_in_transaction_session_timeout` and
//!   `client_connection_check_interval` on every session, so a fence never
//!   waits unboundedly on a writer that vanished.
//! - **One process per pipeline, for now**: [`lock`](exactly_core::CheckpointStore::lock)
//!   is a session-level advisory lock. Several processes sharing the
//!   pipeline's regions under leases are the next step
//!   (`docs/design/several-processes.md`); the leases themselves are here
//!   already ([`PgLeases`], from [`PgCheckpointStore::leases`]), tested
//!   against the rules of the pure ownership model.
//! - **No pool crate**: each sequence has its one connection (a region's
//!   calls are sequential anyway), opened lazily and dropped when broken;
//!   a pool would add a layer between a call and the knowledge of whether
//!   its statement was sent.

mod leases;
mod lock;
mod schema;
mod sequence;
mod session;
mod store;

pub use leases::PgLeases;
pub use store::{ConfigError, PgCheckpointStore};
