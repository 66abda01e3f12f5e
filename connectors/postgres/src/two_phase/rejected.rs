//! Rows the server refuses in mode `two-phase` (`on_rejected_row =
//! "dead-letter"`), at the end of a COPY of rows.
//!
//! The COPY of rows stays open across the writes of a transaction, so a
//! refusal is seen only when it ends — after rows of several batches went
//! out. The writer started it in a savepoint and kept the records of its
//! rows: the refusal rolls the transaction back to that savepoint (the rows
//! of earlier COPYs stay), and here the kept records are converted again
//! (conversion is deterministic, so into the same rows, with the same
//! staging sequence numbers) and written again in parts, each in a
//! savepoint of its own, until the refused rows are found
//! ([`Isolation`]). They become dead letters
//! with the server's message, in the same transaction; the others are
//! written once.
//!
//! With a key, rows are staged, and the target's constraints are met only
//! at the merge after `COMMIT PREPARED`: there the committer isolates them
//! (see `Committer::merge`).

use exactly_core::{ConnectorError, Record};

use crate::tables::Layout;

use super::sink::{staged, PostgresSink};
use super::transaction::PostgresTransaction;
use crate::conn::reject::{Isolation, Refusal};
use crate::rows::{convert, BadRecord};

impl PostgresSink {
    /// Writes again, in parts, the rows of `records` (with their staging
    /// sequence numbers) whose COPY the server refused with `first`, and
    /// writes the refused ones as dead letters (all of table `layout`).
    pub(super) async fn isolate_segment(
        &mut self,
        txn: &PostgresTransaction,
        layout: &Layout,
        first: Refusal,
        records: Vec<(Record, i64)>,
    ) -> Result<(), ConnectorError> {
        let (converted, bad) = convert(records.iter().map(|(record, _)| record), &layout.shape);
        if !bad.is_empty() {
            return Err(ConnectorError::fatal(
                self.subtask.label("isolating refused rows"),
                "a record converted once did not convert again (a bug in exactly-postgres)",
            ));
        }
        let rows = staged(layout, converted, &txn.gid, |i| records[i].1);
        let mut isolation = Isolation::new(rows.len(), first);
        while let Some(part) = isolation.next() {
            let answer = self
                .writer
                .try_rows(&layout.copy_rows, &layout.row_types, &rows.slice(part))
                .await?;
            isolation.answer(answer);
        }
        let refused = isolation.refused();
        let bad: Vec<BadRecord<'_>> = refused
            .into_iter()
            .map(|(i, refusal)| BadRecord {
                record: rows.source(i),
                error: refusal.message,
            })
            .collect();
        tracing::info!(
            refused = bad.len(),
            rows = rows.len(),
            "isolated the rows the server refused"
        );
        self.write_dead_letters(txn, layout, &bad).await
    }
}
