//! Binary `COPY ... FROM STDIN` that hands rows to the connection in large
//! messages.
//!
//! tokio-postgres's `BinaryCopyInWriter` sends a `CopyData` message every
//! 4 KiB of encoded rows and waits until the connection task has taken it:
//! about 40 hand-overs between the writing task and the connection task per
//! 1,000 rows of 150 bytes, each of which may wake a parked runtime worker.
//! [`BinaryCopy`] encodes rows into one buffer and sends it only when
//! [`CHUNK_BYTES`] are ready (PostgreSQL's own COPY reads 64 KiB at a time),
//! so the same rows cost two or three hand-overs. The format is
//! PostgreSQL's binary COPY format: a header, per row a field count and
//! each field as length + binary value (length -1 for NULL), a trailer.

use std::pin::Pin;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::SinkExt;
use tokio_postgres::types::{IsNull, ToSql, Type};
use tokio_postgres::{Client, CopyInSink};

/// Encoded rows that are sent to the connection as one message.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// The binary COPY signature, then flags and header extension length (both 0).
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// Why a binary COPY failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The server or the connection refused it.
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
    /// A value could not be encoded as its column's type (no row of it was
    /// sent).
    #[error("column {column} ({ty}) cannot hold the value: {reason}")]
    Encode {
        /// Its position in the row, from 0.
        column: usize,
        /// The column's type.
        ty: Type,
        /// What the type's encoder said.
        reason: String,
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

/// A binary COPY in progress. It must be ended with [`finish`]; dropped
/// before that, the COPY fails (the client sends `CopyFail`), and so does
/// the transaction it is part of.
///
/// [`finish`]: BinaryCopy::finish
pub struct BinaryCopy {
    sink: Pin<Box<CopyInSink<Bytes>>>,
    types: Vec<Type>,
    buf: BytesMut,
}

impl BinaryCopy {
    /// Starts `statement` (a `COPY ... FROM STDIN (FORMAT binary)`) whose
    /// columns have `types`.
    pub async fn start(client: &Client, statement: &str, types: &[Type]) -> Result<BinaryCopy, CopyError> {
        let sink = client.copy_in(statement).await?;
        let mut buf = BytesMut::with_capacity(CHUNK_BYTES + CHUNK_BYTES / 4);
        buf.put_slice(HEADER);
        Ok(BinaryCopy {
            sink: Box::pin(sink),
            types: types.to_vec(),
            buf,
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
        let start = self.buf.len();
        let result = self.encode_row(values);
        if result.is_err() {
            self.buf.truncate(start);
        }
        result
    }

    fn encode_row<'a, T, I>(&mut self, values: I) -> Result<(), CopyError>
    where
        T: ToSql + ?Sized + 'a,
        I: IntoIterator<Item = &'a T>,
    {
        let expected = self.types.len();
        self.buf.put_i16(i16::try_from(expected).unwrap_or(i16::MAX));
        let mut got = 0;
        for (value, ty) in values.into_iter().zip(self.types.iter()) {
            let at = self.buf.len();
            self.buf.put_i32(0);
            let encoded = value.to_sql_checked(ty, &mut self.buf).map_err(|e| CopyError::Encode {
                column: got,
                ty: ty.clone(),
                reason: e.to_string(),
            })?;
            let len = match encoded {
                IsNull::Yes => -1,
                IsNull::No => i32::try_from(self.buf.len() - at - 4).map_err(|_| CopyError::Encode {
                    column: got,
                    ty: ty.clone(),
                    reason: "the value is larger than 2 GiB".into(),
                })?,
            };
            self.buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
            got += 1;
        }
        if got != expected {
            return Err(CopyError::Width { got, expected });
        }
        Ok(())
    }

    /// Bytes encoded and not sent yet.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Sends the buffer when it holds at least [`CHUNK_BYTES`]; waits while
    /// the connection has not taken the previous message.
    pub async fn send_full(&mut self) -> Result<(), CopyError> {
        if self.buf.len() >= CHUNK_BYTES {
            self.send_all().await?;
        }
        Ok(())
    }

    /// Sends everything encoded so far (a crash point that must see rows
    /// on the server uses it; writers use [`send_full`](Self::send_full)).
    pub async fn send_all(&mut self) -> Result<(), CopyError> {
        if !self.buf.is_empty() {
            let chunk = self.buf.split().freeze();
            self.sink.send(chunk).await?;
        }
        Ok(())
    }

    /// Sends the rest and the trailer, ends the COPY and returns the rows
    /// PostgreSQL stored.
    pub async fn finish(mut self) -> Result<u64, CopyError> {
        self.buf.put_i16(-1);
        self.send_all().await?;
        Ok(self.sink.as_mut().finish().await?)
    }
}

impl std::fmt::Debug for BinaryCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinaryCopy")
            .field("types", &self.types)
            .field("buffered", &self.buf.len())
            .finish_non_exhaustive()
    }
}
