//! Connections: TLS, opening connections, the subtask locks, sending rows,
//! and classifying what the server answers. The connection string is read
//! by [`crate::url`].
//!
//! ```text
//! tls ──► connect ──► lock (one writer per pipeline, table, subtask)
//!                         └─► copy / batch (rows from `rows/` on the wire)
//! error: every failure the server or the driver reports, classified, with its cause kept
//! reject: a row the server refuses, and finding it in a batch by trying parts again
//! ```

pub(crate) mod batch;
pub(crate) mod connect;
pub(crate) mod copy;
pub(crate) mod error;
pub(crate) mod lock;
pub(crate) mod reject;
pub(crate) mod subtask;
pub(crate) mod tls;
