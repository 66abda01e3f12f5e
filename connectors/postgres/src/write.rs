//! What the three modes share: the connection, record → row conversion,
//! binary COPY, statements that take a batch as one array per column, and
//! dead-letter rows.

use std::sync::Arc;

use exactly_core::{ConnectorError, Record, SinkContext};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, ToStatement};

use crate::config::Settings;
use crate::convert::{pointers_of, to_row, Cell, ColumnSpec};
use crate::copy::{BinaryCopy, CopyError};
use crate::error::classify;
use crate::lock;

/// Connects as `application_name` (see [`lock::application_name`]) and
/// drives the connection on its own task.
pub(crate) async fn connect(settings: &Settings, application_name: &str) -> Result<Client, ConnectorError> {
    let mut config = settings.pg.clone();
    config.application_name(application_name);
    let (client, connection) = crate::tls::connect(&config, &settings.tls, &settings.url).await?;
    let url = settings.url.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(%url, error = %e, "PostgreSQL connection ended with an error");
        }
    });
    Ok(client)
}

/// A record that could not be converted, with the reason.
pub(crate) struct BadRecord<'a> {
    pub record: &'a Record,
    pub error: String,
}

/// Rows of the same width, their cells one after the other in one
/// vector: one allocation per batch instead of one per row.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Rows<'a> {
    cells: Vec<Cell<'a>>,
    width: usize,
}

impl<'a> Rows<'a> {
    /// No rows yet, each to have `width` cells.
    pub fn new(width: usize) -> Rows<'a> {
        Rows {
            cells: Vec::new(),
            width,
        }
    }

    pub fn len(&self) -> usize {
        self.cells.len().checked_div(self.width).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// The rows, each a slice of `width` cells.
    pub fn iter(&self) -> impl Iterator<Item = &[Cell<'a>]> {
        self.cells.chunks_exact(self.width.max(1))
    }

    /// The same rows, each starting with the cells `prefix` returns for it.
    pub fn prefixed<const N: usize>(self, mut prefix: impl FnMut() -> [Cell<'a>; N]) -> Rows<'a> {
        let rows = self.len();
        let mut cells = Vec::with_capacity(rows * (self.width + N));
        let mut old = self.cells.into_iter();
        for _ in 0..rows {
            cells.extend(prefix());
            cells.extend(old.by_ref().take(self.width));
        }
        Rows {
            cells,
            width: self.width + N,
        }
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

/// Converts every record: rows for the good ones (borrowing from the
/// records), the reason for the others.
pub(crate) fn convert<'a>(
    records: impl IntoIterator<Item = &'a Record>,
    columns: &[ColumnSpec],
) -> (Rows<'a>, Vec<BadRecord<'a>>) {
    let pointers = pointers_of(columns);
    let records = records.into_iter();
    let mut rows = Rows::new(columns.len());
    rows.cells.reserve(records.size_hint().0 * columns.len());
    let mut bad = Vec::new();
    for record in records {
        if let Err(error) = to_row(record, columns, &pointers, &mut rows.cells) {
            bad.push(BadRecord { record, error });
        }
    }
    (rows, bad)
}

/// COPYs rows in binary format, in one COPY that ends before this returns.
pub(crate) async fn copy_in(client: &Client, sql: &str, types: &[Type], rows: &Rows<'_>) -> Result<u64, CopyError> {
    let mut copy = BinaryCopy::start(client, sql, types).await?;
    push_rows(&mut copy, rows).await?;
    copy.finish().await
}

/// Encodes rows into a COPY in progress, sending whole chunks as they fill.
pub(crate) async fn push_rows(copy: &mut BinaryCopy, rows: &Rows<'_>) -> Result<(), CopyError> {
    for row in rows.iter() {
        copy.push_row(row)?;
        copy.send_full().await?;
    }
    Ok(())
}

/// Runs `statement` with the rows sent as one array per column (`$1` is the
/// array of every row's first cell, ...): one round trip per batch.
pub(crate) async fn execute_columns<T: ?Sized + ToStatement>(
    client: &Client,
    statement: &T,
    rows: Rows<'_>,
) -> Result<u64, tokio_postgres::Error> {
    let (width, height) = (rows.width, rows.len());
    let mut columns: Vec<Vec<Cell<'_>>> = (0..width).map(|_| Vec::with_capacity(height)).collect();
    for (i, cell) in rows.cells.into_iter().enumerate() {
        columns[i % width].push(cell);
    }
    let params: Vec<&(dyn ToSql + Sync)> = columns.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    client.execute(statement, &params).await
}

/// The settings and place of one sink subtask: messages and dead-letter rows.
#[derive(Clone)]
pub(crate) struct Subtask {
    pub settings: Arc<Settings>,
    pub context: SinkContext,
}

impl Subtask {
    /// The `application_name` of this sink's connections.
    pub fn application_name(&self) -> String {
        lock::application_name(&self.context.pipeline)
    }

    /// `postgres sink <table> (subtask <n>): <action>`, the context of errors.
    pub fn label(&self, action: &str) -> String {
        format!(
            "postgres sink {} (subtask {}): {action}",
            self.settings.table_label, self.context.subtask
        )
    }

    pub fn pg_error(&self, action: &str, e: &tokio_postgres::Error) -> ConnectorError {
        classify(&self.label(action), &self.settings.url, e)
    }

    /// A failed COPY: the server's or connection's error classified as
    /// [`pg_error`](Self::pg_error) does; a value that cannot be encoded
    /// (the conversions check every value against its column first, so this
    /// is a bug) is fatal.
    pub fn copy_error(&self, action: &str, e: &CopyError) -> ConnectorError {
        match e {
            CopyError::Postgres(e) => self.pg_error(action, e),
            other => ConnectorError::fatal(
                self.label(action),
                format!("{other}: a value passed the sink's conversion checks but not the encoder (a bug in exactly-postgres)"),
            ),
        }
    }

    /// The connection of an open transaction is gone.
    pub fn lost_connection(&self, action: &str) -> ConnectorError {
        ConnectorError::transient(
            self.label(action),
            format!(
                "lost the connection to PostgreSQL at {} during the transaction; check that the server is running",
                self.settings.url
            ),
        )
    }

    /// A write before the sink was opened (a bug in the caller).
    pub fn not_opened(&self, opener: &str) -> ConnectorError {
        ConnectorError::fatal(
            self.label("writing"),
            format!("{opener} must run before any write (the runtime calls it first)"),
        )
    }

    /// The dead-letter row of `bad` (columns of `DEAD_LETTER_COLUMNS`).
    pub fn dead_letter_row<'a>(&self, bad: &BadRecord<'a>, checkpoint: i64) -> Vec<Cell<'a>> {
        let record = bad.record;
        let (topic, partition) = match record.topic_partition() {
            Some((topic, partition)) => (Cell::Text(topic.into()), Cell::Int(partition)),
            None => (Cell::Null, Cell::Null),
        };
        vec![
            Cell::Text(self.context.pipeline.clone().into()),
            Cell::Text(self.settings.table_label.clone().into()),
            Cell::Text(record.split.as_str().into()),
            topic,
            partition,
            Cell::BigInt(record.offset),
            record.key.as_deref().map_or(Cell::Null, |k| Cell::Bytes(k.into())),
            Cell::Bytes(record.value[..].into()),
            Cell::Text(bad.error.replace('\0', "\\0").into()),
            Cell::BigInt(checkpoint),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_share_one_vector_and_take_prefixes() {
        let rows: Rows<'_> = vec![vec![Cell::Int(1), Cell::Int(2)], vec![Cell::Int(3), Cell::Int(4)]]
            .into_iter()
            .collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows.iter().collect::<Vec<_>>(),
            [&[Cell::Int(1), Cell::Int(2)][..], &[Cell::Int(3), Cell::Int(4)][..]]
        );
        let mut seq = 0;
        let prefixed = rows.prefixed(|| {
            seq += 1;
            [Cell::BigInt(seq)]
        });
        assert_eq!(
            prefixed.iter().collect::<Vec<_>>(),
            [
                &[Cell::BigInt(1), Cell::Int(1), Cell::Int(2)][..],
                &[Cell::BigInt(2), Cell::Int(3), Cell::Int(4)][..]
            ]
        );
        assert!(Rows::new(3).is_empty());
        assert_eq!(Rows::new(3).len(), 0);
    }
}
