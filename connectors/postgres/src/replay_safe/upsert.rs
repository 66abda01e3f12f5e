//! Mode `upsert`: every batch upserted at once, replays rewriting the same
//! keys.

use async_trait::async_trait;
use exactly_core::{ConnectorError, IdempotentSink, Record, WriteOutcome};

use super::session::Session;
use crate::conn::subtask::Subtask;
use crate::rows::convert;

/// A subtask of mode `upsert`, driven by [`ReplaySafe`](exactly_core::ReplaySafe):
/// each batch is one `INSERT ... SELECT DISTINCT ON (key) ... FROM unnest($1,
/// $2, ...) ... ON CONFLICT (key) DO UPDATE` in its own (implicit)
/// transaction, visible at once; the last record per key in the batch wins.
///
/// After a crash the records since the last checkpoint are written again in
/// the same order, so every key ends with the value of its last record. (A key
/// that several source splits write has no single order across splits: keep
/// each key in one split, as Kafka's key partitioning does.) Dead letters are
/// inserted unless the table holds the same record already, so a replay does
/// not repeat them.
///
/// The batch travels as one array per column rather than through a binary
/// COPY into a temporary table and an `INSERT ... SELECT` from it: one round
/// trip instead of four, measured 1.6 to 20 times faster at 20–500 records
/// per batch (the gap narrows as batches grow). A multi-row `VALUES` insert
/// was as fast, but needs a statement per batch size and stops at 65535
/// parameters.
pub struct PostgresUpsertSink {
    session: Session,
}

impl std::fmt::Debug for PostgresUpsertSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresUpsertSink")
            .field("url", &self.session.subtask.settings.url)
            .field("table", &self.session.subtask.settings.table_label)
            .finish_non_exhaustive()
    }
}

impl PostgresUpsertSink {
    pub(crate) fn new(subtask: Subtask) -> Self {
        PostgresUpsertSink {
            session: Session::new(subtask),
        }
    }
}

#[async_trait]
impl IdempotentSink for PostgresUpsertSink {
    /// Connects, creates the missing tables and checks them (no prepared
    /// transactions are needed).
    async fn open(&mut self) -> Result<(), ConnectorError> {
        self.session.open().await
    }

    /// Lets the subtask locks go (see `Session::release`).
    async fn close(&mut self) -> Result<exactly_core::Closed, ConnectorError> {
        self.session.release().await
    }

    async fn write(&mut self, batch: &[Record]) -> Result<WriteOutcome, ConnectorError> {
        let (rows, mut bad) = convert(batch, &self.session.layout()?.shape);
        let mut applied = rows.len();
        if !rows.is_empty() {
            let refused = self.session.write_rows(rows, false).await?;
            applied -= refused.len();
            bad.extend(refused);
        }
        self.session.write_dead_letters(&bad, true).await?;
        Ok(self.session.outcome(applied, 0, &bad))
    }
}
