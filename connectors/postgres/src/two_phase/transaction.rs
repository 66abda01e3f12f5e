//! What a two-phase transaction is while open ([`PostgresTransaction`]) and
//! once prepared ([`PostgresCommittable`], which a checkpoint lists).

use std::collections::BTreeSet;

use exactly_core::CheckpointId;
use serde::{Deserialize, Serialize};

/// An open write transaction: the interval that ends with `checkpoint`.
#[derive(Debug)]
pub struct PostgresTransaction {
    pub(super) checkpoint: CheckpointId,
    pub(super) gid: String,
    /// Next staging sequence number (upsert mode: the last row per key wins).
    pub(super) next_seq: i64,
    /// The write connection it is open on (see `Writer::check`).
    pub(super) generation: u64,
    /// Records a replay of it would write a second time (rows and dead
    /// letters; with an upsert key, whose rows merge, the dead letters),
    /// kept on its commit marker: the duplicates of a fallback past it.
    pub(super) records: i64,
    /// With a table per topic and a key: the tables whose staging tables
    /// hold rows of it, merged after its commit.
    pub(super) tables: BTreeSet<String>,
    /// It added columns (`schema_evolution = "add-columns"`): once
    /// prepared, it holds their tables' locks until its commit.
    pub(super) ddl: bool,
}

impl PostgresTransaction {
    /// The checkpoint whose interval this transaction holds.
    pub fn checkpoint(&self) -> CheckpointId {
        self.checkpoint
    }

    /// The gid it will be prepared under.
    pub fn gid(&self) -> &str {
        &self.gid
    }
}

/// A prepared transaction: enough to commit it from any process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostgresCommittable {
    /// The `PREPARE TRANSACTION` identifier.
    pub gid: String,
    /// The checkpoint whose interval it holds.
    pub checkpoint: CheckpointId,
    /// The sink subtask that wrote it.
    pub subtask: usize,
    /// With a table per topic and a key: the tables whose staging tables
    /// hold its rows, which its commit merges into them (empty otherwise,
    /// and then not written into the checkpoint).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checkpoints written by earlier versions list committables of their
    /// form: each form ever written must still deserialize (and today's is
    /// pinned, so a change shows up here first). See docs/connectors.md,
    /// "Versioning a committable".
    #[test]
    fn committables_of_every_version_deserialize_and_todays_form_is_pinned() {
        let before_tables: PostgresCommittable =
            serde_json::from_str(r#"{"gid":"exactly:orders:orders:0:7","checkpoint":7,"subtask":0}"#).unwrap();
        assert_eq!(
            before_tables,
            PostgresCommittable {
                gid: "exactly:orders:orders:0:7".into(),
                checkpoint: CheckpointId(7),
                subtask: 0,
                tables: Vec::new(),
            }
        );
        let today = PostgresCommittable {
            tables: vec!["orders_eu".into()],
            ..before_tables.clone()
        };
        let text = serde_json::to_string(&today).unwrap();
        assert_eq!(
            text,
            r#"{"gid":"exactly:orders:orders:0:7","checkpoint":7,"subtask":0,"tables":["orders_eu"]}"#
        );
        assert_eq!(serde_json::from_str::<PostgresCommittable>(&text).unwrap(), today);
        assert_eq!(
            serde_json::to_string(&before_tables).unwrap(),
            r#"{"gid":"exactly:orders:orders:0:7","checkpoint":7,"subtask":0}"#,
            "without tables the form is the earlier one: older versions read it"
        );
    }
}
