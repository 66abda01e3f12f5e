//! Binary `COPY ... FROM STDIN` that hands rows to the connection in large
//! messages.
//!
//! tokio-postgres's `BinaryCopyInWriter` sends a `CopyData` message every
//! 4 KiB of encoded rows and waits until the connection task has taken it:
//! about 40 hand-overs between the writing task and the connection task per
//! 1,000 rows of 150 bytes, each of which may wake a parked runtime worker.
//! [`BinaryCopy`] encodes rows into one buffer (with the pure encoder of
//! [`rows::copy_format`](crate::rows)) and sends it only when
//! [`CHUNK_BYTES`] are ready (PostgreSQL's own COPY reads 64 KiB at a time),
//! so the same rows cost two or three hand-overs.

use std::pin::Pin;

use bytes::Bytes;
use exactly_core::BoxError;
use futures_util::SinkExt;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, CopyInSink};

use crate::rows::{CopyEncoder, EncodeError};

/// Encoded rows that are sent to the connection as one message.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Why a binary COPY failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The server or the connection refused it.
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
    /// A value could not be encoded as its column's type (no row of it was
    /// sent).
    #[error("column {column} ({ty}) cannot hold the value")]
    Encode {
        /// Its position in the row, from 0.
        column: usize,
        /// The column's type.
        ty: Type,
        /// What the type's encoder said.
        #[source]
        source: BoxError,
    },
    /// A row had another number of values than the COPY has columns.
    #[error("a row of {got} values for a COPY of {expected} columns")]
    Width {
        /// Values in the row.
        got: usize,
        /// Columns of the COPY.
        expected: usize,
    },
}

impl From<EncodeError> for CopyError {
    fn from(error: EncodeError) -> Self {
        match error {
            EncodeError::Value { column, ty, source } => CopyError::Encode { column, ty, source },
            EncodeError::Width { got, expected } => CopyError::Width { got, expected },
        }
    }
}

/// A binary COPY in progress. It must be ended with [`finish`]; dropped
/// before that, the COPY fails (the client sends `CopyFail`), and so does
/// the transaction it is part of.
///
/// [`finish`]: BinaryCopy::finish
pub struct BinaryCopy {
    sink: Pin<Box<CopyInSink<Bytes>>>,
    rows: CopyEncoder,
}

impl BinaryCopy {
    /// Starts `statement` (a `COPY ... FROM STDIN (FORMAT binary)`) whose
    /// columns have `types`.
    pub async fn start(client: &Client, statement: &str, types: &[Type]) -> Result<BinaryCopy, CopyError> {
        let sink = client.copy_in(statement).await?;
        Ok(BinaryCopy {
            sink: Box::pin(sink),
            rows: CopyEncoder::new(types, CHUNK_BYTES + CHUNK_BYTES / 4),
        })
    }

    /// Encodes one row, its values in column order, into the buffer (nothing
    /// is sent; see [`send_full`](Self::send_full)). On an error the row is
    /// left out whole and the COPY can go on.
    pub fn push_row<'a, T, I>(&mut self, values: I) -> Result<(), CopyError>
    where
        T: ToSql + ?Sized + 'a,
        I: IntoIterator<Item = &'a T>,
    {
        Ok(self.rows.push_row(values)?)
    }

    /// Bytes encoded and not sent yet.
    pub fn buffered(&self) -> usize {
        self.rows.buffered()
    }

    /// Sends the buffer when it holds at least [`CHUNK_BYTES`]; waits while
    /// the connection has not taken the previous message.
    pub async fn send_full(&mut self) -> Result<(), CopyError> {
        if self.rows.buffered() >= CHUNK_BYTES {
            self.send_all().await?;
        }
        Ok(())
    }

    /// Sends everything encoded so far (a crash point that must see rows
    /// on the server uses it; writers use [`send_full`](Self::send_full)).
    pub async fn send_all(&mut self) -> Result<(), CopyError> {
        if self.rows.buffered() > 0 {
            let chunk = self.rows.take();
            self.sink.send(chunk).await?;
        }
        Ok(())
    }

    /// Sends the rest and the trailer, ends the COPY and returns the rows
    /// PostgreSQL stored.
    pub async fn finish(mut self) -> Result<u64, CopyError> {
        self.rows.end();
        self.send_all().await?;
        Ok(self.sink.as_mut().finish().await?)
    }
}

impl std::fmt::Debug for BinaryCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinaryCopy")
            .field("types", &self.rows.types())
            .field("buffered", &self.rows.buffered())
            .finish_non_exhaustive()
    }
}
