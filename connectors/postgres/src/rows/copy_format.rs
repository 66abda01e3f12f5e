//! PostgreSQL's binary COPY format, encoded without a connection: a header,
//! per row a field count and each field as length + binary value (length
//! -1 for NULL), a trailer. [`conn::copy`](crate::conn::copy) sends what
//! this encodes.

use bytes::{BufMut, Bytes, BytesMut};
use exactly_core::BoxError;
use tokio_postgres::types::{IsNull, ToSql, Type};

/// The binary COPY signature, then flags and header extension length (both 0).
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// Why a row could not be encoded (no byte of it is kept).
#[derive(Debug, thiserror::Error)]
pub(crate) enum EncodeError {
    /// A value could not be encoded as its column's type.
    #[error("column {column} ({ty}) cannot hold the value")]
    Value {
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

/// Rows of one binary COPY, encoded into a buffer that is taken a chunk at
/// a time.
pub(crate) struct CopyEncoder {
    types: Vec<Type>,
    buf: BytesMut,
}

impl CopyEncoder {
    /// A COPY of columns of `types`, its buffer (of `capacity` bytes) holding
    /// the header.
    pub(crate) fn new(types: &[Type], capacity: usize) -> CopyEncoder {
        let mut buf = BytesMut::with_capacity(capacity);
        buf.put_slice(HEADER);
        CopyEncoder {
            types: types.to_vec(),
            buf,
        }
    }

    /// The columns' types.
    pub(crate) fn types(&self) -> &[Type] {
        &self.types
    }

    /// Encodes one row, its values in column order. On an error the row is
    /// left out whole and the COPY can go on.
    pub(crate) fn push_row<'a, T, I>(&mut self, values: I) -> Result<(), EncodeError>
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

    fn encode_row<'a, T, I>(&mut self, values: I) -> Result<(), EncodeError>
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
            let encoded = value
                .to_sql_checked(ty, &mut self.buf)
                .map_err(|source| EncodeError::Value {
                    column: got,
                    ty: ty.clone(),
                    source,
                })?;
            let len = match encoded {
                IsNull::Yes => -1,
                IsNull::No => i32::try_from(self.buf.len() - at - 4).map_err(|_| EncodeError::Value {
                    column: got,
                    ty: ty.clone(),
                    source: "the value is larger than 2 GiB".into(),
                })?,
            };
            self.buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
            got += 1;
        }
        if got != expected {
            return Err(EncodeError::Width { got, expected });
        }
        Ok(())
    }

    /// Bytes encoded and not taken yet.
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Everything encoded so far (empty when nothing is).
    pub(crate) fn take(&mut self) -> Bytes {
        self.buf.split().freeze()
    }

    /// Appends the trailer that ends the COPY's data.
    pub(crate) fn end(&mut self) {
        self.buf.put_i16(-1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_encoded_between_the_header_and_the_trailer_and_a_bad_row_leaves_nothing() {
        let mut encoder = CopyEncoder::new(&[Type::INT4, Type::TEXT], 64);
        encoder.push_row([&1i32 as &(dyn ToSql + Sync), &"ab"]).unwrap();
        encoder.push_row([&2i32 as &(dyn ToSql + Sync), &None::<&str>]).unwrap();
        let before = encoder.buffered();
        let wrong = encoder.push_row([&"not an int" as &(dyn ToSql + Sync), &"x"]);
        assert!(matches!(wrong, Err(EncodeError::Value { column: 0, .. })), "{wrong:?}");
        let narrow = encoder.push_row([&3i32 as &(dyn ToSql + Sync)]);
        assert!(
            matches!(narrow, Err(EncodeError::Width { got: 1, expected: 2 })),
            "{narrow:?}"
        );
        assert_eq!(encoder.buffered(), before, "failed rows leave no bytes");
        encoder.end();
        let bytes = encoder.take();
        let mut expected = HEADER.to_vec();
        expected.extend([0, 2, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 2, b'a', b'b']);
        expected.extend([0, 2, 0, 0, 0, 4, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xff]);
        expected.extend([0xff, 0xff]);
        assert_eq!(&bytes[..], &expected[..]);
        assert_eq!(encoder.buffered(), 0);
    }
}
