//! The keyed workloads of the upsert and Debezium rows: record `id` is a
//! change to key `id % keys`, so every key changes about four times, in
//! one partition (the key's) and in id order there. Every tenth change is a
//! delete (a tombstone in the upsert workload; an `op = "d"` event in the
//! Debezium one, whose next change of that key is the tombstone Debezium
//! writes after a delete), and the table they end at is computed here from
//! the ids alone, independently of the sink.

use crate::workload::PARTITIONS;

/// The upsert workload's topic: keys as JSON numbers, orders as values,
/// tombstones.
pub const UPSERT_TOPIC: &str = "bench-upserts";
/// The Debezium workload's topic: keys `{"id": …}`, change events as
/// Debezium's JSON converter writes them without the schema wrapper.
pub const DEBEZIUM_TOPIC: &str = "bench-cdc";

/// Which of the two keyed workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Changes {
    Upserts,
    Debezium,
}

/// One record of a keyed workload.
pub struct ChangeRecord {
    pub key: String,
    /// `None`: a tombstone.
    pub value: Option<String>,
    pub partition: i32,
}

/// How many keys `n` changes touch: about `n / 4`, odd and no multiple of
/// five, so that a key's changes (ids `k`, `k + keys`, …) fall on every
/// last digit and every key gets its deletes (with a multiple of ten the
/// same keys would be deleted every time and the others never).
pub fn keys(n: u64) -> u64 {
    let keys = (n / 4).max(1) | 1;
    if keys.is_multiple_of(5) {
        keys + 2
    } else {
        keys
    }
}

/// Whether change `id` deletes its key.
fn deletes(id: u64) -> bool {
    id % 10 == 9
}

/// Whether the change of `id`'s key before `id` was a delete.
fn follows_delete(id: u64, keys: u64) -> bool {
    id >= keys && deletes(id - keys)
}

/// Whether change `id` leaves its key without a row: a delete, or in the
/// Debezium workload the tombstone after one.
fn removes(changes: Changes, id: u64, keys: u64) -> bool {
    deletes(id) || (changes == Changes::Debezium && follows_delete(id, keys))
}

/// The row change `id` writes (the `after` image of a Debezium event).
fn row_json(key: u64, id: u64) -> String {
    format!(
        r#"{{"id":{key},"version":{id},"customer":"c{:05}","amount":"{}.{:02}","note":"order {id:08}"}}"#,
        id % 10_007,
        id % 1000,
        id % 100
    )
}

impl Changes {
    pub fn topic(self) -> &'static str {
        match self {
            Changes::Upserts => UPSERT_TOPIC,
            Changes::Debezium => DEBEZIUM_TOPIC,
        }
    }

    /// Record `id` of `n`.
    pub fn record(self, id: u64, n: u64) -> ChangeRecord {
        let keys = keys(n);
        let key = id % keys;
        let partition = (key % PARTITIONS as u64) as i32;
        let (key_text, value) = match self {
            Changes::Upserts => (key.to_string(), (!deletes(id)).then(|| row_json(key, id))),
            Changes::Debezium => {
                let value = if follows_delete(id, keys) {
                    None
                } else {
                    let ts = 1_767_225_600_000 + id;
                    let source = format!(
                        r#"{{"version":"2.7.3.Final","connector":"postgresql","name":"dbserver1","ts_ms":{ts},"snapshot":"false","db":"shop","sequence":"[null,\"{lsn}\"]","schema":"public","table":"customers","txId":{tx},"lsn":{lsn},"xmin":null}}"#,
                        lsn = 24_000_000 + id * 64,
                        tx = 700 + id
                    );
                    Some(if deletes(id) {
                        format!(
                            r#"{{"before":{{"id":{key},"version":0,"customer":null,"amount":null,"note":null}},"after":null,"source":{source},"op":"d","ts_ms":{ts},"transaction":null}}"#
                        )
                    } else {
                        let op = if id < keys || removes(self, id - keys, keys) {
                            "c"
                        } else {
                            "u"
                        };
                        format!(
                            r#"{{"before":null,"after":{},"source":{source},"op":"{op}","ts_ms":{ts},"transaction":null}}"#,
                            row_json(key, id)
                        )
                    })
                };
                (format!(r#"{{"id":{key}}}"#), value)
            }
        };
        ChangeRecord {
            key: key_text,
            value,
            partition,
        }
    }

    /// How many of the `n` records go to partition `p`: its end offset once
    /// they are produced.
    pub fn records_in_partition(self, n: u64, p: i32) -> i64 {
        (0..n).filter(|id| self.record_partition(*id, n) == p).count() as i64
    }

    fn record_partition(self, id: u64, n: u64) -> i32 {
        ((id % keys(n)) % PARTITIONS as u64) as i32
    }

    /// The table `n` changes end at, as (rows, sum of `version`): every
    /// change replayed in id order (each key's changes are in id order in
    /// its partition), from what each one means, not from the sink.
    pub fn final_state(self, n: u64) -> (i64, i64) {
        let keys = keys(n);
        let mut version: Vec<Option<u64>> = vec![None; keys.min(n) as usize];
        for id in 0..n {
            version[(id % keys) as usize] = (!removes(self, id, keys)).then_some(id);
        }
        version
            .iter()
            .flatten()
            .fold((0, 0), |(rows, sum), v| (rows + 1, sum + *v as i64))
    }
}

/// The keyed workloads' table: one row per live key.
pub fn create_table_sql(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, version bigint NOT NULL, customer text, \
         amount numeric, note text)"
    )
}

/// The sink's settings for the keyed table (`format` for Debezium).
pub fn sink_settings(changes: Changes) -> &'static str {
    match changes {
        Changes::Upserts => "pk.mode = \"record_key\"\npk.fields = [\"id\"]\ndelete.enabled = true\n",
        Changes::Debezium => {
            "format = \"debezium\"\npk.mode = \"record_key\"\npk.fields = [\"id\"]\ndelete.enabled = true\n"
        }
    }
}

/// The sink's columns for the keyed table.
pub const COLUMNS: &str = r#"id = { type = "bigint" }
version = { from = "/version", type = "bigint" }
customer = { from = "/customer", type = "text" }
amount = { from = "/amount", type = "numeric" }
note = { from = "/note", type = "text" }"#;
