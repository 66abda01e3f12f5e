//! # exactly-formats
//!
//! Record formats for exactly's sinks, decoded by pure functions (no
//! connection, no I/O), and the schema registry client that feeds them:
//!
//! - [`connect`]: Kafka Connect's JSON with schemas (`{"schema": …,
//!   "payload": …}`) as a row and its schema;
//! - [`avro`]: Avro in the Confluent wire format (magic byte, schema id,
//!   datum) as a row and its schema;
//! - [`debezium`]: Debezium's change-event envelope (`before`, `after`,
//!   `op`, `source`), with or without Kafka Connect's JSON schema wrapper
//!   (`{"schema": …, "payload": …}`), as an upsert, a delete or nothing;
//! - [`schema`]: Kafka Connect's schemas as the JSON converter writes them
//!   (or derived from Avro), and which changes between two versions only
//!   add optional fields;
//! - [`registry`]: schemas by id from a Confluent-compatible schema
//!   registry (cached, TLS, basic auth).
//!
//! Values of logical types are rendered as text PostgreSQL reads:
//!
//! | logical type | rendered |
//! |---|---|
//! | decimal | a string of the exact number, `"-12.30"` |
//! | date | `"2024-02-29"` |
//! | time | `"13:45:00.123456"` |
//! | timestamp (an instant) | RFC 3339 in UTC, `"2024-02-29T13:45:00.123456Z"` |
//! | local timestamp | `"2024-02-29T13:45:00.123456"` (no zone) |
//! | uuid | `"8f0c4a52-…"` |
//! | bytes that are no decimal | base64 |
//! | records, arrays, maps | JSON objects and arrays |

pub mod avro;
pub mod connect;
pub mod debezium;
pub mod error;
pub mod registry;
mod render;
pub mod schema;

pub use error::{ErrorClass, FormatError};
