//! The store's tables, created on first use (under a transaction-level
//! advisory lock, so two processes starting at once do not race on the
//! catalogue), and the names of sequences.
//!
//! ```text
//! exactly_pipelines   one row per pipeline: its layout
//! exactly_sequences   one row per sequence (pipeline, scope): epoch, owner, id watermark,
//!                     committed-through, and the lease columns the workers use
//! exactly_checkpoints one row per entry: name, checkpoint id, writer's epoch, the envelope's
//!                     bytes (as in a folder entry), set aside or not, when it was written
//! exactly_epochs      every epoch taken, with when: for audits
//! exactly_releases    a pipeline whose last lock holder released it cleanly (read and
//!                     cleared by the next holder)
//! ```

use exactly_core::Scope;
use tokio_postgres::Client;

/// Creates the tables that are missing.
pub(crate) async fn create(client: &Client) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(
            "BEGIN;
             SELECT pg_advisory_xact_lock(7318634917243917001);
             CREATE TABLE IF NOT EXISTS exactly_pipelines (
                 pipeline text PRIMARY KEY,
                 layout jsonb
             );
             CREATE TABLE IF NOT EXISTS exactly_sequences (
                 pipeline text NOT NULL,
                 scope text NOT NULL,
                 epoch bigint NOT NULL DEFAULT 0,
                 owner text,
                 id_watermark bigint,
                 committed_through bigint,
                 lease_holder text,
                 lease_expires timestamptz,
                 PRIMARY KEY (pipeline, scope)
             );
             CREATE TABLE IF NOT EXISTS exactly_checkpoints (
                 pipeline text NOT NULL,
                 scope text NOT NULL,
                 name text NOT NULL,
                 checkpoint_id bigint NOT NULL,
                 created_unix_ms bigint NOT NULL,
                 epoch bigint NOT NULL,
                 body bytea NOT NULL,
                 set_aside boolean NOT NULL DEFAULT false,
                 written_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                 PRIMARY KEY (pipeline, scope, name)
             );
             CREATE TABLE IF NOT EXISTS exactly_epochs (
                 pipeline text NOT NULL,
                 scope text NOT NULL,
                 epoch bigint NOT NULL,
                 owner text,
                 taken_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                 PRIMARY KEY (pipeline, scope, epoch)
             );
             CREATE TABLE IF NOT EXISTS exactly_releases (
                 pipeline text PRIMARY KEY,
                 holder text NOT NULL,
                 released_at timestamptz NOT NULL DEFAULT clock_timestamp()
             );
             CREATE TABLE IF NOT EXISTS exactly_workers (
                 pipeline text NOT NULL,
                 worker text NOT NULL,
                 host text,
                 pid integer,
                 started timestamptz,
                 expires timestamptz,
                 PRIMARY KEY (pipeline, worker)
             );
             COMMIT;",
        )
        .await
}

/// Prefix of a region's scope.
pub(crate) const REGION_PREFIX: &str = "region-";

/// The scope column of a sequence: `global` or `region-<i>`.
pub(crate) fn scope_name(scope: Scope) -> String {
    match scope {
        Scope::Global => "global".to_string(),
        Scope::Region(i) => format!("{REGION_PREFIX}{i}"),
    }
}
