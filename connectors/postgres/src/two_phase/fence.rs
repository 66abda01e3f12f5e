//! When several worker processes share a pipeline: the epoch fence of each
//! sink subtask, kept in the sink's own database, so that a worker that
//! lost the subtask's region (a zombie: frozen past its lease, or cut off
//! and reconnected) cannot prepare anything once a newer owner recovered.
//!
//! One row per (pipeline, sink table, subtask) in `exactly_fences` (the
//! commit log's schema), holding the highest epoch that recovered it:
//!
//! - **prepare**: every transaction reads its subtask's row `FOR SHARE`
//!   right before its commit marker and `PREPARE TRANSACTION`, and goes on
//!   only when the epoch is its own; the prepared transaction keeps holding
//!   the row lock;
//! - **recover**: the new owner raises the row to its epoch (never lowers
//!   it) under a short `lock_timeout`. An older owner's transaction that
//!   holds the row — prepared, or open and frozen between its read and its
//!   `PREPARE` — makes the raise time out; the new owner then ends what it
//!   may end (commits what its checkpoint lists, rolls back the rest below
//!   its first checkpoint, terminates the older epochs' sessions of this
//!   subtask that sit in an open transaction) and tries again, a bounded
//!   number of times — it never waits unboundedly on a transaction only it
//!   can end. A row already above its epoch means it is the zombie: fenced.
//!
//! A zombie's late recovery is harmless too: when its raise is blocked (a
//! newer owner's prepared transactions hold the rows between their prepare
//! and commit), it reads the rows without locking first and stops when they
//! are above its epoch; and whatever it may still roll back is limited to
//! checkpoints below its own first one, which every newer owner's
//! transactions are above.

use std::time::Duration;

use exactly_core::ConnectorError;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::conn::connect::owned_by;
use crate::conn::subtask::Subtask;
use crate::sql::QualifiedName;

/// How long a raise waits for an older owner's row lock before it ends
/// what holds it.
const RAISE_LOCK_TIMEOUT: &str = "500ms";
/// Tries of the raise before recovery fails (and the region is claimed
/// again): about 20 s of older transactions that will not end.
const RAISE_TRIES: u32 = 40;

/// The fence table beside the commit log.
pub(crate) fn table(subtask: &Subtask) -> QualifiedName {
    QualifiedName {
        schema: subtask.settings.commit_log.schema.clone(),
        name: "exactly_fences".into(),
    }
}

/// Creates the fence table when absent.
pub(crate) async fn create(client: &Client, subtask: &Subtask) -> Result<(), ConnectorError> {
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS {} (pipeline text NOT NULL, sink_table text NOT NULL, subtask integer NOT NULL, \
         epoch bigint NOT NULL, raised_at timestamptz NOT NULL DEFAULT clock_timestamp(), \
         PRIMARY KEY (pipeline, sink_table, subtask))",
        table(subtask).sql()
    );
    match client.batch_execute(&sql).await {
        // Another worker's subtask created it at the same moment (`IF NOT
        // EXISTS` does not serialize two creations): it exists.
        Err(e)
            if [SqlState::UNIQUE_VIOLATION, SqlState::DUPLICATE_TABLE]
                .iter()
                .any(|c| e.code() == Some(c)) =>
        {
            Ok(())
        }
        created => created.map_err(|e| subtask.pg_error("creating the fence table", e)),
    }
}

/// The fenced error: a newer owner recovered the subtask.
pub(crate) fn fenced(subtask: &Subtask, mine: u64, current: i64) -> ConnectorError {
    ConnectorError::transient(
        subtask.label("checking the region's epoch"),
        format!(
            "a newer owner (epoch {current}) recovered this sink subtask, and this worker holds epoch {mine}: it \
             lost the region (a freeze or a cut-off past its lease) and writes nothing more to it. (If the \
             checkpoint store was reset while this sink's database kept its fence rows, every worker is refused \
             so: delete the pipeline's rows from {})",
            table(subtask).sql()
        ),
    )
}

/// The error of a prepare after this worker's deadline on the region
/// passed (its lease may have run out).
pub(crate) fn past_deadline(subtask: &Subtask) -> ConnectorError {
    ConnectorError::transient(
        subtask.label("PREPARE TRANSACTION"),
        "this worker's lease on the region may have run out (its deadline passed): not preparing",
    )
}

/// The highest epoch in the fence rows of `owned` above `mine`, if any:
/// read without locking, so it answers even while a transaction holds a
/// row.
pub(crate) async fn newer(
    client: &Client,
    subtask: &Subtask,
    owned: &[i32],
    mine: u64,
) -> Result<Option<i64>, ConnectorError> {
    let sql = format!(
        "SELECT max(epoch) FROM {} WHERE pipeline = $1 AND sink_table = $2 AND subtask = ANY($3)",
        table(subtask).sql()
    );
    let row = client
        .query_one(
            &sql,
            &[&subtask.context.pipeline, &subtask.settings.table_label, &owned],
        )
        .await
        .map_err(|e| subtask.pg_error("reading the fence rows", e))?;
    Ok(row.get::<_, Option<i64>>(0).filter(|e| *e > mine as i64))
}

/// Reads the subtask's fence row `FOR SHARE` inside the open transaction
/// on `client` and checks it is at `mine`.
pub(crate) async fn check(client: &Client, subtask: &Subtask, mine: u64) -> Result<(), ConnectorError> {
    let sql = format!(
        "SELECT epoch FROM {} WHERE pipeline = $1 AND sink_table = $2 AND subtask = $3 FOR SHARE",
        table(subtask).sql()
    );
    let index = i32::try_from(subtask.context.subtask).unwrap_or(i32::MAX);
    let row = client
        .query_opt(
            &sql,
            &[&subtask.context.pipeline, &subtask.settings.table_label, &index],
        )
        .await
        .map_err(|e| subtask.pg_error("reading the fence row", e))?;
    match row.map(|r| r.get::<_, i64>(0)) {
        Some(current) if current == mine as i64 => Ok(()),
        Some(current) if current > mine as i64 => Err(fenced(subtask, mine, current)),
        // Below this owner's epoch, or gone: changed behind the pipeline's
        // back after this owner's recovery raised it.
        found => Err(ConnectorError::transient(
            subtask.label("checking the region's epoch"),
            format!(
                "this subtask's fence row in {} is {} although this worker's recovery raised it to {mine} (changed \
                 behind the pipeline's back): not preparing; the region is recovered again, which raises it",
                table(subtask).sql(),
                found.map_or_else(|| "missing".to_string(), |e| format!("at epoch {e}"))
            ),
        )),
    }
}

/// What a raise that could not take the row lock found.
pub(crate) enum Raise {
    /// The rows of `owned` are at `mine` now.
    Done,
    /// An older owner's transaction holds a row: end it and try again.
    Blocked,
}

/// Raises the fence rows of `owned` to `mine` (creating them), in one
/// transaction under a short lock timeout.
pub(crate) async fn raise(
    client: &Client,
    subtask: &Subtask,
    owned: &[i32],
    mine: u64,
) -> Result<Raise, ConnectorError> {
    let sql = format!(
        "INSERT INTO {t} AS f (pipeline, sink_table, subtask, epoch) SELECT $1, $2, unnest($3::integer[]), $4 \
         ON CONFLICT (pipeline, sink_table, subtask) DO UPDATE SET epoch = greatest(f.epoch, excluded.epoch), \
         raised_at = clock_timestamp() RETURNING f.epoch",
        t = table(subtask).sql()
    );
    let begun = client
        .batch_execute(&format!("BEGIN; SET LOCAL lock_timeout = '{RAISE_LOCK_TIMEOUT}'"))
        .await;
    begun.map_err(|e| subtask.pg_error("raising the fence", e))?;
    let epoch = mine as i64;
    let raised = client
        .query(
            &sql,
            &[&subtask.context.pipeline, &subtask.settings.table_label, &owned, &epoch],
        )
        .await;
    let rows = match raised {
        Ok(rows) => rows,
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
                return Ok(Raise::Blocked);
            }
            return Err(subtask.pg_error("raising the fence", e));
        }
    };
    if let Some(newer) = rows.iter().map(|r| r.get::<_, i64>(0)).find(|e| *e > epoch) {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(fenced(subtask, mine, newer));
    }
    client
        .batch_execute("COMMIT")
        .await
        .map_err(|e| subtask.pg_error("raising the fence", e))?;
    Ok(Raise::Done)
}

/// Ends the sessions of older owners of this subtask that sit in an open
/// transaction (frozen between their fence read and their `PREPARE`);
/// returns how many.
pub(crate) async fn end_older_sessions(client: &Client, subtask: &Subtask, mine: u64) -> Result<usize, ConnectorError> {
    let rows = client
        .query(
            "SELECT pid, application_name FROM pg_stat_activity WHERE state LIKE 'idle in transaction%' \
             AND application_name LIKE 'exactly %' AND pid <> pg_backend_pid() AND datname = current_database()",
            &[],
        )
        .await
        .map_err(|e| subtask.pg_error("listing older owners' sessions", e))?;
    let mut ended = 0;
    for row in rows {
        let (pid, name): (i32, String) = (row.get(0), row.get(1));
        let older = owned_by(&name, &subtask.context.pipeline, subtask.context.subtask).is_some_and(|e| e < mine);
        if older {
            tracing::warn!(pid, application_name = %name, "ending an older owner's open transaction on this subtask");
            client
                .query_one("SELECT pg_terminate_backend($1)", &[&pid])
                .await
                .map_err(|e| subtask.pg_error("ending an older owner's session", e))?;
            ended += 1;
        }
    }
    Ok(ended)
}

/// How long to wait between raises.
pub(crate) const RAISE_PAUSE: Duration = Duration::from_millis(100);

/// Whether `tries` raises are enough.
pub(crate) fn gave_up(subtask: &Subtask, tries: u32) -> Option<ConnectorError> {
    (tries >= RAISE_TRIES).then(|| {
        ConnectorError::transient(
            subtask.label("raising the fence"),
            format!(
                "an older owner's transaction still holds this subtask's fence row after {tries} tries; the \
                 region is recovered again (see pg_prepared_xacts and pg_stat_activity for what holds it)"
            ),
        )
    })
}
