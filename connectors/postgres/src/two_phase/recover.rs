//! Recovery of a two-phase sink subtask: commit what the restored checkpoint
//! lists, roll back every other prepared transaction of the subtasks it owns.
//!
//! The subtasks a sink owns:
//!
//! - its own;
//! - after a lowering of the parallelism, the old subtasks it adopts
//!   ([`SinkContext::adopted`](exactly_core::SinkContext::adopted): old `j`
//!   goes to `j % parallelism`), whose listed transactions come with its own;
//! - orphans: subtasks `j >= parallelism` with `j % parallelism` equal to
//!   its own that are not adopted but still have prepared transactions. An
//!   attempt at a higher parallelism that crashed before its first
//!   checkpoint completed leaves those behind; the restored checkpoint was
//!   taken at a lower parallelism, so no checkpoint that could be restored
//!   lists them, and nobody else would ever roll them back (they would hold
//!   a `max_prepared_transactions` slot and the server's xmin horizon
//!   forever).
//!
//! The write connection holds the lock of every owned subtask (see
//! [`crate::conn::lock`]) before recovery touches anything of it.

use exactly_core::{plan_recovery, ConnectorError};
use tokio_postgres::error::SqlState;

use super::gid::{checkpoint_of, subtask_of, table_prefix};
use super::sink::PostgresSink;
use super::transaction::PostgresCommittable;
use crate::sql::quote_literal;
use crate::tables::Layout;

/// A prepared transaction of this pipeline and table.
struct Prepared {
    gid: String,
    subtask: usize,
}

impl PostgresSink {
    /// Everything `recover` does once the tables are checked: see the module
    /// documentation.
    pub(crate) async fn recover_owned(&mut self, pending: &[PostgresCommittable]) -> Result<(), ConnectorError> {
        let prepared = self.prepared_of_table().await?;
        let (subtask, parallelism) = (self.subtask.context.subtask, self.subtask.context.parallelism.max(1));
        let mut orphans: Vec<usize> = prepared
            .iter()
            .map(|p| p.subtask)
            .filter(|j| *j >= parallelism && j % parallelism == subtask && !self.owned.contains(j))
            .collect();
        orphans.sort_unstable();
        orphans.dedup();
        if !orphans.is_empty() {
            tracing::info!(
                ?orphans,
                "taking over the prepared transactions of subtasks above the parallelism that no checkpoint lists"
            );
            self.writer.lock_more(&orphans).await?;
            self.owned.extend_from_slice(&orphans);
        }

        // A worker rolls back only transactions below its first checkpoint:
        // a newer owner's are above it (see `fence`).
        let first = self.subtask.context.ownership.as_ref().map(|o| o.first_checkpoint.0);
        let owned: Vec<String> = prepared
            .iter()
            .filter(|p| self.owned.contains(&p.subtask))
            .filter(|p| first.is_none_or(|first| checkpoint_of(&p.gid).is_some_and(|c| c < first)))
            .map(|p| p.gid.clone())
            .collect();
        let plan = plan_recovery(pending, |c| c.gid.clone(), owned);
        for gid in &plan.abort {
            tracing::info!(%gid, "rolling back a prepared transaction the checkpoint does not list");
            let rolled_back = self
                .committer
                .client()
                .await?
                .batch_execute(&format!("ROLLBACK PREPARED {}", quote_literal(gid)))
                .await;
            match rolled_back {
                Err(e) if e.code() != Some(&SqlState::UNDEFINED_OBJECT) => {
                    return Err(self.subtask.pg_error("ROLLBACK PREPARED", e))
                }
                _ => {}
            }
        }
        for c in plan.commit {
            tracing::info!(gid = %c.gid, checkpoint = %c.checkpoint, "committing a transaction the checkpoint lists");
            self.commit_and_merge(c).await?;
        }
        let committed = self.highest_committed_marker().await?;
        let listed = pending.iter().map(|c| c.checkpoint.0).max();
        self.markers.recovered(committed.max(listed));
        self.merge_leftovers().await
    }

    /// The prepared transactions of every subtask of this pipeline and table
    /// in this database, oldest first.
    async fn prepared_of_table(&mut self) -> Result<Vec<Prepared>, ConnectorError> {
        let base = table_prefix(&self.subtask.context.pipeline, &self.subtask.settings.table_label);
        let rows = self
            .committer
            .client()
            .await?
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() \
                 AND left(gid, length($1)) = $1 ORDER BY prepared",
                &[&base],
            )
            .await
            .map_err(|e| self.subtask.pg_error("listing prepared transactions", e))?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let gid: String = r.get(0);
                let subtask = subtask_of(&gid, &base)?;
                Some(Prepared { gid, subtask })
            })
            .collect())
    }

    /// The highest checkpoint of a commit marker of the owned subtasks: every
    /// marker the server shows belongs to a committed transaction (the marker
    /// is written inside it), and after recovery nothing of them is pending.
    async fn highest_committed_marker(&mut self) -> Result<Option<u64>, ConnectorError> {
        let sql = format!(
            "SELECT max(checkpoint) FROM {} WHERE pipeline = $1 AND sink_table = $2 AND subtask = ANY($3)",
            self.subtask.settings.commit_log.sql()
        );
        let owned = self.owned_i32();
        let row = self
            .committer
            .client()
            .await?
            .query_one(
                &sql,
                &[
                    &self.subtask.context.pipeline,
                    &self.subtask.settings.table_label,
                    &owned,
                ],
            )
            .await
            .map_err(|e| self.subtask.pg_error("reading the commit markers", e))?;
        Ok(row.get::<_, Option<i64>>(0).and_then(|c| u64::try_from(c).ok()))
    }

    /// Upsert mode: merges committed staged rows of the owned subtasks that
    /// no commit moved yet (left by a crash between commit and merge), oldest
    /// checkpoint first, in every table prepared so far (with a table per
    /// topic, the others are merged when their topic first comes, see
    /// `layout_of`).
    async fn merge_leftovers(&mut self) -> Result<(), ConnectorError> {
        let layouts: Vec<_> = self.layouts.values().cloned().collect();
        for layout in layouts {
            self.merge_leftovers_of(&layout).await?;
        }
        Ok(())
    }

    /// [`merge_leftovers`](Self::merge_leftovers) of one table.
    pub(super) async fn merge_leftovers_of(&mut self, layout: &Layout) -> Result<(), ConnectorError> {
        if layout.merge.is_none() {
            return Ok(());
        }
        let base = table_prefix(&self.subtask.context.pipeline, &self.subtask.settings.table_label);
        let sql = format!(
            "SELECT DISTINCT exactly_gid FROM {} WHERE left(exactly_gid, length($1)) = $1",
            layout.staging.sql()
        );
        let result = self.committer.client().await?.query(&sql, &[&base]).await;
        let rows = result.map_err(|e| self.subtask.pg_error("listing staged rows", e))?;
        let mut gids: Vec<String> = rows
            .iter()
            .map(|r| r.get::<_, String>(0))
            .filter(|g| subtask_of(g, &base).is_some_and(|s| self.owned.contains(&s)))
            .collect();
        gids.sort_by_key(|g| checkpoint_of(g));
        for gid in gids {
            tracing::info!(%gid, table = %layout.table, "merging committed staged rows left by an interrupted commit");
            self.merge(layout, &gid).await?;
        }
        Ok(())
    }
}
