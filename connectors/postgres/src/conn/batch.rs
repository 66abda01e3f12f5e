//! Sending a batch of rows: a binary COPY that ends before it returns, or
//! one statement that takes the rows as one array per column.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, ToStatement};

use super::copy::{BinaryCopy, CopyError};
use crate::rows::Rows;

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
    let columns = rows.into_columns();
    let params: Vec<&(dyn ToSql + Sync)> = columns.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
    client.execute(statement, &params).await
}
