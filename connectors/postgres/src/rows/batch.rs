//! A batch of records as rows: [`convert`] turns records into [`Rows`] of
//! cells for the good ones and [`BadRecord`]s (with the reason) for the
//! others, following a [`RowShape`].

use std::ops::Range;

use exactly_core::Record;

use super::cell::Cell;
use super::convert::{pointers_of, to_key_row, to_row, ColumnSpec};
use crate::config::Tombstones;

/// Why a tombstone is a dead letter when tombstones neither delete nor are
/// written.
pub(crate) const TOMBSTONE_REFUSED: &str = "the record is a tombstone (its value is null), which this sink does \
     not write. Fix: set delete.enabled = true (with pk.mode = \"record_key\") to delete the row of its key, or \
     on_tombstone = \"write\" to write it as a row";

/// A record that could not be written, with the reason.
pub(crate) struct BadRecord<'a> {
    pub record: &'a Record,
    pub error: String,
}

/// How records become rows: the columns (with what the table allows), the
/// key, and what a tombstone does.
#[derive(Clone, Debug)]
pub(crate) struct RowShape {
    /// The columns, in order.
    pub columns: Vec<ColumnSpec>,
    /// Indexes of the key columns, if the rows have a key.
    pub key: Option<Vec<usize>>,
    /// What a tombstone (a null value) does.
    pub tombstones: Tombstones,
}

impl RowShape {
    /// Rows end with a delete flag (`true` for the row of a tombstone that
    /// deletes its key): tombstones delete.
    pub(crate) fn deletes(&self) -> bool {
        self.tombstones == Tombstones::Delete
    }

    /// Cells per row: one per column, and the delete flag.
    pub(crate) fn width(&self) -> usize {
        self.columns.len() + usize::from(self.deletes())
    }
}

/// Rows of the same width, their cells one after the other in one
/// vector: one allocation per batch instead of one per row. Rows made by
/// [`convert`] know the record each came from.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Rows<'a> {
    cells: Vec<Cell<'a>>,
    width: usize,
    /// The record of each row (empty for rows not made from records).
    sources: Vec<&'a Record>,
}

impl<'a> Rows<'a> {
    /// No rows yet, each to have `width` cells.
    pub(crate) fn new(width: usize) -> Rows<'a> {
        Rows {
            cells: Vec::new(),
            width,
            sources: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.cells.len().checked_div(self.width).unwrap_or(0)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// The rows, each a slice of `width` cells.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[Cell<'a>]> {
        self.cells.chunks_exact(self.width.max(1))
    }

    /// The record row `i` came from.
    pub(crate) fn source(&self, i: usize) -> &'a Record {
        self.sources[i]
    }

    /// The records of the rows, in order.
    pub(crate) fn sources(&self) -> &[&'a Record] {
        &self.sources
    }

    /// Rows `range` (copied).
    pub(crate) fn slice(&self, range: Range<usize>) -> Rows<'a> {
        Rows {
            cells: self.cells[range.start * self.width..range.end * self.width].to_vec(),
            width: self.width,
            sources: self.sources.get(range).map(<[_]>::to_vec).unwrap_or_default(),
        }
    }

    /// The same rows, each between the cells `before` and `after` push for
    /// row `i` (every row the same number).
    pub(crate) fn framed(
        self,
        mut before: impl FnMut(usize, &mut Vec<Cell<'a>>),
        mut after: impl FnMut(usize, &mut Vec<Cell<'a>>),
    ) -> Rows<'a> {
        let rows = self.len();
        let mut cells = Vec::with_capacity(rows * (self.width + 6));
        let mut old = self.cells.into_iter();
        for i in 0..rows {
            before(i, &mut cells);
            cells.extend(old.by_ref().take(self.width));
            after(i, &mut cells);
        }
        let width = cells.len().checked_div(rows).unwrap_or(self.width);
        Rows {
            cells,
            width,
            sources: self.sources,
        }
    }

    /// The cells column by column: the first cell of every row, then the
    /// second, ... (what a statement taking one array per column needs).
    pub(crate) fn into_columns(self) -> Vec<Vec<Cell<'a>>> {
        let (width, height) = (self.width, self.len());
        let mut columns: Vec<Vec<Cell<'a>>> = (0..width).map(|_| Vec::with_capacity(height)).collect();
        for (i, cell) in self.cells.into_iter().enumerate() {
            columns[i % width].push(cell);
        }
        columns
    }
}

/// Rows from whole rows; the first one gives the width.
impl<'a> FromIterator<Vec<Cell<'a>>> for Rows<'a> {
    fn from_iter<I: IntoIterator<Item = Vec<Cell<'a>>>>(rows: I) -> Rows<'a> {
        let mut all = Rows::default();
        for row in rows {
            assert!(all.cells.is_empty() || row.len() == all.width, "rows of one width");
            all.width = row.len();
            all.cells.extend(row);
        }
        all
    }
}

/// Converts every record as `shape` says: rows for the good ones
/// (borrowing from the records), the reason for the others. A tombstone is
/// a dead letter, a row like any other, or the row of a delete (its key,
/// NULL elsewhere, the delete flag set).
pub(crate) fn convert<'a>(
    records: impl IntoIterator<Item = &'a Record>,
    shape: &RowShape,
) -> (Rows<'a>, Vec<BadRecord<'a>>) {
    let columns = &shape.columns;
    let pointers = pointers_of(columns);
    let records = records.into_iter();
    let mut rows = Rows::new(shape.width());
    rows.cells.reserve(records.size_hint().0 * shape.width());
    let mut bad = Vec::new();
    for record in records {
        let converted = match (&record.value, shape.tombstones, &shape.key) {
            (None, Tombstones::DeadLetter, _) => Err(TOMBSTONE_REFUSED.to_string()),
            (None, Tombstones::Delete, Some(key)) => to_key_row(record, columns, key, &mut rows.cells).map(|()| true),
            _ => to_row(record, columns, &pointers, &mut rows.cells).map(|()| false),
        };
        match converted {
            Ok(delete) => {
                if shape.deletes() {
                    rows.cells.push(Cell::Bool(delete));
                }
                rows.sources.push(record);
            }
            Err(error) => bad.push(BadRecord { record, error }),
        }
    }
    (rows, bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ColumnType;

    #[test]
    fn rows_share_one_vector_and_take_frames() {
        let rows: Rows<'_> = vec![vec![Cell::Int(1), Cell::Int(2)], vec![Cell::Int(3), Cell::Int(4)]]
            .into_iter()
            .collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows.iter().collect::<Vec<_>>(),
            [&[Cell::Int(1), Cell::Int(2)][..], &[Cell::Int(3), Cell::Int(4)][..]]
        );
        let framed = rows.framed(
            |i, cells| cells.push(Cell::BigInt(i as i64)),
            |_, cells| cells.push(Cell::Null),
        );
        assert_eq!(
            framed.iter().collect::<Vec<_>>(),
            [
                &[Cell::BigInt(0), Cell::Int(1), Cell::Int(2), Cell::Null][..],
                &[Cell::BigInt(1), Cell::Int(3), Cell::Int(4), Cell::Null][..]
            ]
        );
        assert_eq!(
            framed.slice(1..2).iter().collect::<Vec<_>>(),
            [&[Cell::BigInt(1), Cell::Int(3), Cell::Int(4), Cell::Null][..]]
        );
        assert!(Rows::new(3).is_empty());
        assert_eq!(Rows::new(3).len(), 0);
    }

    fn shape(tombstones: Tombstones) -> RowShape {
        RowShape {
            columns: vec![
                ColumnSpec::plain("id", "key", ColumnType::BigInt, true),
                ColumnSpec::plain("v", "/v", ColumnType::Text, true),
            ],
            key: Some(vec![0]),
            tombstones,
        }
    }

    #[test]
    fn tombstones_are_dead_letters_rows_or_deletes_of_their_key() {
        let records = [
            Record::new("t-0", 0, r#"{"v":"a"}"#).with_key("1"),
            Record::tombstone("t-0", 1).with_key("1"),
            Record::tombstone("t-0", 2),
        ];
        let (rows, bad) = convert(&records, &shape(Tombstones::DeadLetter));
        assert_eq!(rows.len(), 1);
        assert_eq!((bad.len(), bad[0].error.as_str()), (2, TOMBSTONE_REFUSED));
        assert_eq!(rows.source(0).offset, 0);

        let (rows, bad) = convert(&records, &shape(Tombstones::Write));
        assert_eq!(
            rows.len(),
            1,
            "v is required, so a tombstone written as a row does not fit"
        );
        assert_eq!(bad.len(), 2);
        assert!(bad.iter().all(|b| b.error.contains("null")), "{:?}", bad[0].error);

        let (rows, bad) = convert(&records, &shape(Tombstones::Delete));
        assert_eq!(
            rows.iter().collect::<Vec<_>>(),
            [
                &[Cell::BigInt(1), Cell::Text("a".into()), Cell::Bool(false)][..],
                &[Cell::BigInt(1), Cell::Null, Cell::Bool(true)][..]
            ]
        );
        assert_eq!(rows.sources().iter().map(|r| r.offset).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(bad.len(), 1, "a tombstone without a key deletes nothing");
        assert!(bad[0].error.contains("no such value"), "{}", bad[0].error);
    }
}
