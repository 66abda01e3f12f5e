//! The workload every run delivers: the records, their partitions, the
//! target table and the binary COPY that fills it.

use std::error::Error as StdError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use tokio_postgres::types::{IsNull, ToSql, Type};

pub const TOPIC: &str = "bench-orders";
pub const PARTITIONS: i32 = 4;
/// Source and sink subtasks of the pipelines; consumers and connections of
/// the baselines.
pub const PARALLELISM: usize = 2;
/// Records per source poll (the pipeline's `batch_size`) and per batch the
/// minimal loop hands from its consumer to its COPY.
pub const BATCH: usize = 500;
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// Record data (values and keys) per COPY: the PostgreSQL sink's segment
/// (`COPY_SEGMENT_BYTES` in `connectors/postgres/src/sink.rs`), which the
/// minimal loop cuts its COPYs by too.
pub const COPY_SEGMENT_BYTES: usize = 512 * 1024;

/// The value of record `id`: a JSON order of about 100 bytes.
pub fn order_json(id: u64) -> String {
    format!(
        r#"{{"id":{id},"customer":"c{:05}","amount":{}.{:02},"currency":"EUR","status":"paid","note":"order {id:08}"}}"#,
        id % 10_007,
        id % 1000,
        id % 100
    )
}

/// Partition of record `id` (round robin, so partition `p` holds ids `p, p+4, ...`
/// at offsets `0, 1, ...`).
pub fn partition_of(id: u64) -> i32 {
    (id % PARTITIONS as u64) as i32
}

/// How many of the first `records` ids go to partition `p` (see
/// [`partition_of`]): its end offset once they are produced.
pub fn records_in_partition(records: u64, p: i32) -> i64 {
    let partitions = PARTITIONS as u64;
    ((records + partitions - 1 - p as u64) / partitions) as i64
}

/// Partitions of subtask `subtask` (the source's rule: partition % parallelism).
pub fn owned_partitions(subtask: usize) -> Vec<i32> {
    (0..PARTITIONS)
        .filter(|p| *p as usize % PARALLELISM == subtask)
        .collect()
}

/// Table or Redis hash of run `name` (`phase` is `tp` or `lat`).
pub fn target_name(name: &str, phase: &str) -> String {
    format!("bench_{}_{phase}", name.replace('-', "_"))
}

/// The two target tables, both one row per record with the primary key
/// (partition, offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableShape {
    /// `(part, off, id, ts, payload jsonb)`: `/id` read from the JSON value,
    /// the value checked as JSON.
    Orders,
    /// `(part, off, key text, value text)`: the hand-written loop's table of
    /// issue 15, no JSON.
    KeyValue,
    /// `(id primary key, version, customer, amount, note)`: one row per
    /// live key of the keyed workloads (`changes.rs`).
    Keyed,
}

impl TableShape {
    /// A column that holds each record's id (the check counts its distinct values).
    pub fn id_column(self) -> &'static str {
        match self {
            TableShape::Orders => "id",
            TableShape::KeyValue => "key",
            TableShape::Keyed => "id",
        }
    }
}

/// The target table of `shape`.
pub fn create_table_sql(table: &str, shape: TableShape) -> String {
    match shape {
        TableShape::Orders => format!(
            "CREATE TABLE {table} (part integer NOT NULL, off bigint NOT NULL, id bigint NOT NULL, \
             ts timestamptz NOT NULL, payload jsonb NOT NULL, PRIMARY KEY (part, off))"
        ),
        TableShape::KeyValue => format!(
            "CREATE TABLE {table} (part integer NOT NULL, off bigint NOT NULL, key text, value text, \
             PRIMARY KEY (part, off))"
        ),
        TableShape::Keyed => crate::changes::create_table_sql(table),
    }
}

pub const COPY_TYPES: [Type; 5] = [Type::INT4, Type::INT8, Type::INT8, Type::TIMESTAMPTZ, Type::JSONB];

pub fn copy_sql(table: &str) -> String {
    format!("COPY {table} (part, off, id, ts, payload) FROM STDIN (FORMAT binary)")
}

/// JSON text sent as `jsonb` without re-serializing it (binary jsonb is a
/// version byte followed by the text), as the sink does with raw values.
#[derive(Debug)]
pub struct RawJsonb<'a>(pub &'a [u8]);

impl ToSql for RawJsonb<'_> {
    fn to_sql(&self, _ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        out.extend_from_slice(&[1]);
        out.extend_from_slice(self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }

    fn to_sql_checked(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        if !Self::accepts(ty) {
            return Err(format!("RawJsonb cannot be sent as {ty}").into());
        }
        self.to_sql(ty, out)
    }
}

pub fn unix_ms_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0
}
