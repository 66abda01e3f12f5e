//! The commit connection of a two-phase sink subtask: `COMMIT PREPARED`
//! (idempotent, with the commit marker deciding when the gid is gone), the
//! merge of staged rows, the deletion of old markers, and the reads of
//! recovery and of the replay check. Any process can commit a prepared
//! transaction, so none of this needs the write connection's session.

use exactly_core::{CheckpointId, ConnectorError, Record, ReplayCheck};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::gid::checkpoint_of;
use super::transaction::PostgresCommittable;
use crate::conn::batch::copy_in;
use crate::conn::connect::connect;
use crate::conn::copy::CopyError;
use crate::conn::error::classify;
use crate::conn::reject::{refusal, Isolation};
use crate::conn::subtask::Subtask;
use crate::rows::{BadRecord, DeadLetters};
use crate::sql::quote_literal;
use crate::tables::Layout;

/// The commit connection, connected on first use and again after it was
/// lost.
pub(super) struct Committer {
    subtask: Subtask,
    client: Option<Client>,
}

impl Committer {
    pub(super) fn new(subtask: Subtask) -> Self {
        Committer { subtask, client: None }
    }

    /// The connection, (re)connected if needed.
    pub(super) async fn client(&mut self) -> Result<&Client, ConnectorError> {
        connected(&mut self.client, &self.subtask).await
    }

    /// The connection, if it is up (the crash points watch the server
    /// through it).
    pub(super) fn if_up(&self) -> Option<&Client> {
        self.client.as_ref().filter(|c| !c.is_closed())
    }

    /// Checks that the server can prepare transactions at all.
    pub(super) async fn check_prepared_transactions(&mut self) -> Result<(), ConnectorError> {
        let url = &self.subtask.settings.url;
        let context = "postgres sink: reading server settings";
        let rows = connected(&mut self.client, &self.subtask)
            .await?
            .simple_query("SHOW max_prepared_transactions")
            .await
            .map_err(|e| classify(context, url, e))?;
        let value = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        });
        match value.as_deref().map(str::parse::<u64>) {
            Some(Ok(n)) if n > 0 => Ok(()),
            Some(Ok(_)) => Err(ConnectorError::fatal(
                "postgres sink: checking server settings",
                format!(
                    "PostgreSQL at {url} has max_prepared_transactions = 0, which disables PREPARE TRANSACTION: the \
                     exactly-once sink cannot work. Fix: set max_prepared_transactions = 64 in postgresql.conf (or run \
                     ALTER SYSTEM SET max_prepared_transactions = 64) and restart the server; it must be at least the \
                     number of sink subtasks times the checkpoints that can wait for their commit"
                ),
            )),
            _ => Err(ConnectorError::fatal(
                "postgres sink: checking server settings",
                format!("PostgreSQL at {url} returned no usable max_prepared_transactions ({value:?})"),
            )),
        }
    }

    /// `COMMIT PREPARED`, or, when the gid is no longer prepared, success if
    /// its marker says it was committed.
    pub(super) async fn commit_prepared(&mut self, c: &PostgresCommittable) -> Result<(), ConnectorError> {
        let subtask = &self.subtask;
        let (url, log) = (&subtask.settings.url, &subtask.settings.commit_log);
        let client = connected(&mut self.client, subtask).await?;
        let committed = client
            .batch_execute(&format!("COMMIT PREPARED {}", quote_literal(&c.gid)))
            .await;
        let error = match committed {
            Ok(()) => None,
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => Some(e),
            Err(e) => return Err(subtask.pg_error("COMMIT PREPARED", e)),
        };
        if let Some(error) = &error {
            tracing::debug!(gid = %c.gid, %error, "not prepared; looking for its commit marker");
        }
        // The marker's commit time, which retention counts from (each commit
        // of the same gid renews it); no marker after a gid-not-found means
        // the transaction is gone.
        let marker = client
            .query_opt(
                &format!(
                    "UPDATE {} SET committed_at = now() WHERE gid = $1 RETURNING 1",
                    log.sql()
                ),
                &[&c.gid],
            )
            .await
            .map_err(|e| subtask.pg_error("stamping the commit marker", e))?;
        if error.is_none() || marker.is_some() {
            let how = if error.is_none() {
                "committed prepared transaction"
            } else {
                "already committed"
            };
            tracing::debug!(gid = %c.gid, checkpoint = %c.checkpoint, "{how}");
            return Ok(());
        }
        Err(ConnectorError::DataLoss {
            context: subtask.label("commit"),
            checkpoint: c.checkpoint,
            message: format!(
                "prepared transaction '{}' (checkpoint {}) does not exist on {url} and its marker is not in {log}: \
                 it was rolled back outside the pipeline (ROLLBACK PREPARED, a restored backup, or a different \
                 database in sink.postgres.url), and its records were not written; or the checkpoint being \
                 committed is older than sink.postgres.commit_log_retention, whose markers are deleted, and it was \
                 committed long ago",
                c.gid, c.checkpoint
            ),
        })
    }

    /// Upsert mode: moves the committed rows of `gid` from the staging table
    /// into the target with the layout's merge (one statement, which deletes
    /// them from the staging table). Idempotent.
    ///
    /// When the server refuses a row and the layout isolates refused rows,
    /// the gid's rows are merged in ranges of their sequence numbers, each
    /// range one statement (in order, so the last row per key still wins),
    /// found by an [`Isolation`]; a refused row is taken out of the staging table
    /// and written to the dead-letter table in one transaction, with the
    /// server's message. A crash in between leaves the rest staged, and the
    /// next merge (recovery merges what is left) goes on from there.
    pub(super) async fn merge(&mut self, layout: &Layout, gid: &str) -> Result<(), ConnectorError> {
        let merge = layout.merge.as_deref().expect("merge() is called with a key");
        let subtask = &self.subtask;
        let action = "merging staged rows into the table";
        let result = connected(&mut self.client, subtask)
            .await?
            .execute(merge, &[&gid])
            .await;
        let first = match result {
            Ok(rows) => {
                tracing::debug!(gid, rows, "merged staged rows");
                return Ok(());
            }
            Err(e) => match refusal(&e).filter(|_| layout.merge_range.is_some()) {
                Some(first) => first,
                None => return Err(subtask.pg_error(action, e)),
            },
        };
        tracing::info!(gid, refusal = %first.message,
            "the server refused a staged row: merging in parts to find the refused ones");
        let client = connected(&mut self.client, subtask).await?;
        let bounds = format!(
            "SELECT min(exactly_seq), max(exactly_seq) FROM {} WHERE exactly_gid = $1",
            layout.staging.sql()
        );
        let row = client
            .query_one(&bounds, &[&gid])
            .await
            .map_err(|e| subtask.pg_error(action, e))?;
        let (Some(low), Some(high)) = (row.get::<_, Option<i64>>(0), row.get::<_, Option<i64>>(1)) else {
            return Ok(());
        };
        let range = layout.merge_range.as_deref().expect("checked above");
        let len = usize::try_from(high - low + 1).unwrap_or(0);
        let mut isolation = Isolation::new(len, first);
        while let Some(part) = isolation.next() {
            let (from, to) = (low + part.start as i64, low + part.end as i64);
            let answer = match client.execute(range, &[&gid, &from, &to]).await {
                Ok(_) => None,
                Err(e) => match refusal(&e) {
                    Some(refused) => Some(refused),
                    None => return Err(subtask.pg_error(action, e)),
                },
            };
            isolation.answer(answer);
        }
        let refused = isolation.refused();
        let checkpoint = checkpoint_of(gid).map_or(0, |c| i64::try_from(c).unwrap_or(i64::MAX));
        for (i, refused) in &refused {
            let seq = low + *i as i64;
            dead_letter_staged(client, subtask, layout, (gid, seq), checkpoint, &refused.message).await?;
        }
        if !refused.is_empty() {
            subtask.context.metrics.add_dead_letters(refused.len() as u64);
        }
        Ok(())
    }

    /// Deletes the commit markers of the subtasks `owned` at or below
    /// checkpoint `floor` committed longer ago than `retention`, skipping
    /// rows another transaction holds. Best effort: a failure is logged.
    pub(super) async fn prune_markers(&mut self, owned: &[i32], floor: u64, retention: std::time::Duration) {
        let subtask = &self.subtask;
        let log = subtask.settings.commit_log.sql();
        let sql = format!(
            "DELETE FROM {log} WHERE gid IN (SELECT gid FROM {log} WHERE pipeline = $1 AND sink_table = $2 \
             AND subtask = ANY($3) AND checkpoint <= $4 \
             AND coalesce(committed_at, prepared_at) < now() - make_interval(secs => $5) FOR UPDATE SKIP LOCKED)"
        );
        let floor = i64::try_from(floor).unwrap_or(i64::MAX);
        let client = match connected(&mut self.client, subtask).await {
            Ok(client) => client,
            Err(error) => {
                tracing::warn!(%error, "deleting old commit markers failed; trying again after a later commit");
                return;
            }
        };
        let pruned = client
            .execute(
                &sql,
                &[
                    &subtask.context.pipeline,
                    &subtask.settings.table_label,
                    &owned,
                    &floor,
                    &retention.as_secs_f64(),
                ],
            )
            .await;
        match pruned {
            Ok(0) => {}
            Ok(deleted) => tracing::debug!(
                deleted,
                floor,
                "deleted commit markers older than commit_log_retention that no restorable checkpoint lists"
            ),
            Err(error) => {
                tracing::warn!(%error, "deleting old commit markers failed; trying again after a later commit")
            }
        }
    }

    /// What the commit log says about the commits of this subtask (and of
    /// every subtask `j` with `j % parallelism` equal to it) after
    /// `checkpoint`: see
    /// [`check_replay_after`](exactly_core::TwoPhaseCommitSink::check_replay_after).
    pub(super) async fn committed_after(&mut self, checkpoint: CheckpointId) -> Result<ReplayCheck, ConnectorError> {
        let subtask = &self.subtask;
        let log = subtask.settings.commit_log.sql();
        let filter =
            format!("FROM {log} WHERE pipeline = $1 AND sink_table = $2 AND subtask % $3 = $4 AND checkpoint > $5");
        let counted = format!("SELECT max(checkpoint), sum(records)::bigint, count(*) = count(records) {filter}");
        let uncounted = format!("SELECT max(checkpoint), NULL::bigint, false {filter}");
        let parallelism = i32::try_from(subtask.context.parallelism.max(1)).unwrap_or(i32::MAX);
        let own = i32::try_from(subtask.context.subtask).unwrap_or(i32::MAX);
        let after = checkpoint_i64(checkpoint);
        let params: [&(dyn ToSql + Sync); 5] = [
            &subtask.context.pipeline,
            &subtask.settings.table_label,
            &parallelism,
            &own,
            &after,
        ];
        let client = connected(&mut self.client, subtask).await?;
        let mut later = client.query_one(&counted, &params).await;
        if matches!(&later, Err(e) if e.code() == Some(&SqlState::UNDEFINED_COLUMN)) {
            // A commit log from before markers counted records.
            later = client.query_one(&uncounted, &params).await;
        }
        match later {
            Ok(row) => Ok(match row.get::<_, Option<i64>>(0) {
                Some(later) => ReplayCheck::CommittedLater {
                    checkpoint: CheckpointId(u64::try_from(later).unwrap_or(0)),
                    records: row
                        .get::<_, bool>(2)
                        .then(|| row.get::<_, Option<i64>>(1))
                        .flatten()
                        .map(|n| u64::try_from(n).unwrap_or(0)),
                },
                None => ReplayCheck::Safe,
            }),
            // No commit log: nothing to tell from.
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(ReplayCheck::Unknown),
            Err(e) => Err(subtask.pg_error("reading the commit markers", e)),
        }
    }
}

/// Moves the staged row `(gid, seq)` (its record) to the dead-letter table
/// with `error`, in one transaction. Nothing when it is gone.
async fn dead_letter_staged(
    client: &Client,
    subtask: &Subtask,
    layout: &Layout,
    (gid, seq): (&str, i64),
    checkpoint: i64,
    error: &str,
) -> Result<(), ConnectorError> {
    let take = layout.take_staged.as_deref().expect("with merge_range");
    let action = "writing a refused staged row to the dead-letter table";
    let moved = async {
        client.batch_execute("BEGIN").await?;
        let Some(row) = client.query_opt(take, &[&gid, &seq]).await? else {
            client.batch_execute("COMMIT").await?;
            return Ok(());
        };
        let split: Option<String> = row.get(0);
        let record = Record {
            split: split.unwrap_or_default().into(),
            offset: row.get::<_, Option<i64>>(1).unwrap_or_default(),
            key: row.get::<_, Option<Vec<u8>>>(2).map(Into::into),
            value: row.get::<_, Option<Vec<u8>>>(3).map(Into::into),
            timestamp_ms: None,
            headers: Vec::new(),
        };
        let bad = [BadRecord {
            record: &record,
            error: error.to_string(),
        }];
        let dead_letters = DeadLetters {
            pipeline: &subtask.context.pipeline,
            table: &subtask.settings.table_label,
            null_values: layout.dead_letter_null_values,
        };
        let rows = dead_letters.rows(&bad, checkpoint);
        copy_in(client, &layout.copy_dead_letters, &layout.dead_letter_types, &rows).await?;
        client.batch_execute("COMMIT").await?;
        tracing::warn!(split = %record.split, offset = record.offset, error,
            "staged row sent to the dead-letter table {}", layout.dead_letters);
        Ok::<_, CopyError>(())
    }
    .await;
    if let Err(e) = moved {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(subtask.copy_error(action, e));
    }
    Ok(())
}

/// `client`, (re)connected for `subtask` if needed.
async fn connected<'c>(client: &'c mut Option<Client>, subtask: &Subtask) -> Result<&'c Client, ConnectorError> {
    if client.as_ref().is_none_or(Client::is_closed) {
        *client = Some(connect(&subtask.settings, &subtask.application_name()).await?);
    }
    Ok(client.as_ref().expect("connected above"))
}

/// A checkpoint id as the commit log stores it.
pub(super) fn checkpoint_i64(checkpoint: CheckpointId) -> i64 {
    i64::try_from(checkpoint.0).unwrap_or(i64::MAX)
}
