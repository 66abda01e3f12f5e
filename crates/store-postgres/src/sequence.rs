//! One checkpoint sequence in PostgreSQL: its row in `exactly_sequences`
//! and its entries in `exactly_checkpoints`.
//!
//! Every conditional call is one statement whose `WITH` part reads the
//! sequence's row `FOR SHARE` at the expected epoch. Under READ COMMITTED a
//! fence (an `UPDATE` of that row) that committed first makes the re-checked
//! row miss the condition, so nothing is written; a fence that comes later
//! waits for the writer's lock, so its reader sees the write. There is no
//! third order: no write of an older epoch is accepted after a newer one
//! was taken.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use exactly_core::membership::Epoch;
use exactly_core::store::{AccessError, Cas, Head, Listed, Marks, Removal, SequenceStore};
use exactly_core::{CheckpointId, EntryName};
use tokio_postgres::Row;

use crate::session::{Effect, Session};

/// A sequence of the PostgreSQL store.
pub(crate) struct PgSequence {
    pub(crate) session: Session,
    pub(crate) pipeline: String,
    pub(crate) scope: String,
    /// Its row exists (made once by the first call).
    ensured: AtomicBool,
}

const ENSURE: &str =
    "INSERT INTO exactly_sequences (pipeline, scope) VALUES ($1, $2) ON CONFLICT (pipeline, scope) DO NOTHING";
const HEAD: &str =
    "SELECT epoch, owner, id_watermark, committed_through FROM exactly_sequences WHERE pipeline = $1 AND scope = $2";
const EPOCH: &str = "SELECT epoch FROM exactly_sequences WHERE pipeline = $1 AND scope = $2";
const FENCE: &str = "WITH taken AS (
        UPDATE exactly_sequences SET epoch = epoch + 1, owner = $4
        WHERE pipeline = $1 AND scope = $2 AND epoch = $3
        RETURNING epoch, owner, id_watermark, committed_through),
    logged AS (
        INSERT INTO exactly_epochs (pipeline, scope, epoch, owner) SELECT $1, $2, epoch, owner FROM taken)
    SELECT epoch, owner, id_watermark, committed_through FROM taken";
const ADVANCE: &str = "UPDATE exactly_sequences
    SET id_watermark = GREATEST(id_watermark, $4), committed_through = GREATEST(committed_through, $5)
    WHERE pipeline = $1 AND scope = $2 AND epoch = $3
    RETURNING epoch, owner, id_watermark, committed_through";
const LIST: &str = "SELECT name, set_aside FROM exactly_checkpoints WHERE pipeline = $1 AND scope = $2";
const READ: &str =
    "SELECT body FROM exactly_checkpoints WHERE pipeline = $1 AND scope = $2 AND name = $3 AND NOT set_aside";
const WRITE: &str = "WITH owner AS (
        SELECT 1 FROM exactly_sequences WHERE pipeline = $1 AND scope = $2 AND epoch = $3 FOR SHARE),
    written AS (
        INSERT INTO exactly_checkpoints (pipeline, scope, name, checkpoint_id, created_unix_ms, epoch, body)
        SELECT $1, $2, $4, $5, $6, $3, $7 FROM owner
        ON CONFLICT (pipeline, scope, name) DO UPDATE
        SET body = EXCLUDED.body, epoch = EXCLUDED.epoch, set_aside = false, written_at = clock_timestamp())
    SELECT count(*) FROM owner";
const DELETE: &str = "WITH owner AS (
        SELECT 1 FROM exactly_sequences WHERE pipeline = $1 AND scope = $2 AND epoch = $3 FOR SHARE),
    deleted AS (
        DELETE FROM exactly_checkpoints
        WHERE pipeline = $1 AND scope = $2 AND name = $4 AND NOT set_aside AND EXISTS (SELECT 1 FROM owner))
    SELECT count(*) FROM owner";
const SET_ASIDE: &str = "WITH owner AS (
        SELECT 1 FROM exactly_sequences WHERE pipeline = $1 AND scope = $2 AND epoch = $3 FOR SHARE),
    aside AS (
        UPDATE exactly_checkpoints SET set_aside = true
        WHERE pipeline = $1 AND scope = $2 AND name = $4 AND EXISTS (SELECT 1 FROM owner))
    SELECT count(*) FROM owner";

/// An id or epoch as PostgreSQL's `bigint`.
fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn head(row: &Row) -> Head {
    let id = |v: Option<i64>| v.map(|n| CheckpointId(n as u64));
    Head {
        epoch: Epoch(row.get::<_, i64>(0) as u64),
        owner: row.get(1),
        id_watermark: id(row.get(2)),
        committed_through: id(row.get(3)),
    }
}

impl PgSequence {
    pub(crate) fn new(session: Session, pipeline: String, scope: String) -> PgSequence {
        PgSequence {
            session,
            pipeline,
            scope,
            ensured: AtomicBool::new(false),
        }
    }

    /// Makes the sequence's row, once.
    async fn ensure(&self) -> Result<(), AccessError> {
        if self.ensured.load(Ordering::Acquire) {
            return Ok(());
        }
        self.session
            .query(
                "creating the sequence",
                Effect::Writes,
                ENSURE,
                &[&self.pipeline, &self.scope],
            )
            .await?;
        self.ensured.store(true, Ordering::Release);
        Ok(())
    }

    /// The epoch now (after a refused call).
    async fn epoch(&self) -> Result<Epoch, AccessError> {
        let rows = self
            .session
            .query(
                "reading the epoch",
                Effect::Reads,
                EPOCH,
                &[&self.pipeline, &self.scope],
            )
            .await?;
        Ok(Epoch(rows.first().map_or(0, |r| r.get::<_, i64>(0) as u64)))
    }

    /// `Done` when the statement's `count(*)` of the owner's row is 1.
    async fn conditional(&self, rows: Vec<Row>) -> Result<Cas<()>, AccessError> {
        if rows.first().is_some_and(|r| r.get::<_, i64>(0) == 1) {
            Ok(Cas::Done(()))
        } else {
            Ok(Cas::Moved(self.epoch().await?))
        }
    }
}

#[async_trait]
impl SequenceStore for PgSequence {
    fn location(&self) -> String {
        self.session.location().to_string()
    }

    async fn head(&self) -> Result<Head, AccessError> {
        self.ensure().await?;
        let rows = self
            .session
            .query("reading the head", Effect::Reads, HEAD, &[&self.pipeline, &self.scope])
            .await?;
        Ok(rows.first().map(head).unwrap_or_default())
    }

    async fn fence(&self, expected: Epoch, owner: &str) -> Result<Cas<Head>, AccessError> {
        self.ensure().await?;
        let rows = self
            .session
            .query(
                "fencing",
                Effect::Writes,
                FENCE,
                &[&self.pipeline, &self.scope, &big(expected.0), &owner],
            )
            .await?;
        match rows.first() {
            Some(row) => Ok(Cas::Done(head(row))),
            None => Ok(Cas::Moved(self.epoch().await?)),
        }
    }

    async fn advance(&self, epoch: Epoch, marks: Marks) -> Result<Cas<Head>, AccessError> {
        self.ensure().await?;
        let mark = |m: Option<CheckpointId>| m.map(|id| big(id.0));
        let rows = self
            .session
            .query(
                "raising the id watermark or committed-through",
                Effect::Writes,
                ADVANCE,
                &[
                    &self.pipeline,
                    &self.scope,
                    &big(epoch.0),
                    &mark(marks.id_watermark),
                    &mark(marks.committed_through),
                ],
            )
            .await?;
        match rows.first() {
            Some(row) => Ok(Cas::Done(head(row))),
            None => Ok(Cas::Moved(self.epoch().await?)),
        }
    }

    async fn list(&self) -> Result<Vec<Listed>, AccessError> {
        let rows = self
            .session
            .query("listing entries", Effect::Reads, LIST, &[&self.pipeline, &self.scope])
            .await?;
        let mut listed: Vec<Listed> = rows
            .iter()
            .filter_map(|r| {
                Some(Listed {
                    name: EntryName::parse(r.get(0))?,
                    set_aside: r.get(1),
                })
            })
            .collect();
        listed.sort_by_key(|l| (l.name.id, l.name.created_unix_ms, l.set_aside));
        Ok(listed)
    }

    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>, AccessError> {
        let rows = self
            .session
            .query(
                &format!("reading {name}"),
                Effect::Reads,
                READ,
                &[&self.pipeline, &self.scope, &name],
            )
            .await?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    async fn write(&self, epoch: Epoch, name: &str, bytes: Vec<u8>) -> Result<Cas<()>, AccessError> {
        let operation = format!("writing {name}");
        let Some(parsed) = EntryName::parse(name) else {
            return Err(AccessError::determinate(
                self.location(),
                operation,
                format!("`{name}` is not an entry name (<fingerprint>-<unix-ms>-<checkpoint-id>)"),
            ));
        };
        self.ensure().await?;
        let rows = self
            .session
            .query(
                &operation,
                Effect::Writes,
                WRITE,
                &[
                    &self.pipeline,
                    &self.scope,
                    &big(epoch.0),
                    &name,
                    &big(parsed.id.0),
                    &big(parsed.created_unix_ms),
                    &bytes,
                ],
            )
            .await?;
        self.conditional(rows).await
    }

    async fn remove(&self, epoch: Epoch, name: &str, how: Removal) -> Result<Cas<()>, AccessError> {
        self.ensure().await?;
        let (operation, sql) = match how {
            Removal::Delete => (format!("deleting {name}"), DELETE),
            Removal::SetAside => (format!("setting {name} aside"), SET_ASIDE),
        };
        let rows = self
            .session
            .query(
                &operation,
                Effect::Writes,
                sql,
                &[&self.pipeline, &self.scope, &big(epoch.0), &name],
            )
            .await?;
        self.conditional(rows).await
    }
}

/// Shares a sequence.
pub(crate) fn shared(sequence: PgSequence) -> Arc<dyn SequenceStore> {
    Arc::new(sequence)
}
