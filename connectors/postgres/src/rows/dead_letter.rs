//! Dead-letter rows: a record the sink cannot write, with the reason, as a
//! row of the dead-letter table.

use tokio_postgres::types::Type;

use super::batch::{BadRecord, Rows};
use super::cell::Cell;

/// Columns of the dead-letter table the sink fills, in COPY order (then
/// `dead_lettered_at`, which defaults to `now()`). `checkpoint` is the
/// checkpoint of the transaction in mode `two-phase`, and 0 in modes `upsert`
/// and `fenced`, which write before the checkpoint's id is known.
pub(crate) const DEAD_LETTER_COLUMNS: [(&str, Type); 10] = [
    ("pipeline", Type::TEXT),
    ("sink_table", Type::TEXT),
    ("split", Type::TEXT),
    ("topic", Type::TEXT),
    ("partition", Type::INT4),
    ("offset", Type::INT8),
    ("key", Type::BYTEA),
    ("value", Type::BYTEA),
    ("error", Type::TEXT),
    ("checkpoint", Type::INT8),
];

/// Where dead letters come from and how the table stores them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeadLetters<'s> {
    /// The pipeline's name.
    pub pipeline: &'s str,
    /// The target table as configured.
    pub table: &'s str,
    /// The table's `value` column takes NULL (see
    /// `Layout::dead_letter_null_values`); otherwise a null value is stored
    /// as empty bytes and the error says it was null.
    pub null_values: bool,
}

impl DeadLetters<'_> {
    /// The dead-letter rows of `bad` (columns of [`DEAD_LETTER_COLUMNS`]),
    /// written in the transaction of `checkpoint`.
    pub(crate) fn rows<'a>(&self, bad: &[BadRecord<'a>], checkpoint: i64) -> Rows<'a> {
        bad.iter().map(|b| self.row(b, checkpoint)).collect()
    }

    /// The dead-letter row of `bad`.
    pub(crate) fn row<'a>(&self, bad: &BadRecord<'a>, checkpoint: i64) -> Vec<Cell<'a>> {
        let record = bad.record;
        let (value, error) = match &record.value {
            Some(value) => (Cell::Bytes(value[..].into()), bad.error.replace('\0', "\\0")),
            None if self.null_values => (Cell::Null, bad.error.replace('\0', "\\0")),
            None => (
                Cell::Bytes(Default::default()),
                format!("(the value was null) {}", bad.error.replace('\0', "\\0")),
            ),
        };
        let (topic, partition) = match record.topic_partition() {
            Some((topic, partition)) => (Cell::Text(topic.into()), Cell::Int(partition)),
            None => (Cell::Null, Cell::Null),
        };
        vec![
            Cell::Text(self.pipeline.to_string().into()),
            Cell::Text(self.table.to_string().into()),
            Cell::Text(record.split.as_str().into()),
            topic,
            partition,
            Cell::BigInt(record.offset),
            record.key.as_deref().map_or(Cell::Null, |k| Cell::Bytes(k.into())),
            value,
            Cell::Text(error.into()),
            Cell::BigInt(checkpoint),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exactly_core::Record;

    #[test]
    fn a_dead_letter_row_keeps_the_record_and_says_when_its_value_was_null() {
        let record = Record::new("orders-3", 7, "x\0y").with_key("k");
        let bad = BadRecord {
            record: &record,
            error: "bad\0".into(),
        };
        let origin = DeadLetters {
            pipeline: "p",
            table: "t",
            null_values: true,
        };
        let row = origin.row(&bad, 9);
        assert_eq!(row.len(), DEAD_LETTER_COLUMNS.len());
        assert_eq!(row[3], Cell::Text("orders".into()));
        assert_eq!(row[4], Cell::Int(3));
        assert_eq!(row[8], Cell::Text("bad\\0".into()));
        assert_eq!(row[9], Cell::BigInt(9));

        let tombstone = Record::tombstone("file", 1);
        let bad = BadRecord {
            record: &tombstone,
            error: "no".into(),
        };
        assert_eq!(origin.row(&bad, 0)[7], Cell::Null);
        let old_table = DeadLetters {
            null_values: false,
            ..origin
        };
        let row = old_table.row(&bad, 0);
        assert_eq!((&row[3], &row[4]), (&Cell::Null, &Cell::Null));
        assert_eq!(row[7], Cell::Bytes(Vec::new().into()));
        assert_eq!(row[8], Cell::Text("(the value was null) no".into()));
    }
}
