//! [`Cell`]: one value of a row, in PostgreSQL's binary format.

use std::borrow::Cow;
use std::error::Error;

use bytes::{BufMut, BytesMut};
use serde_json::Value;
use tokio_postgres::types::{to_sql_checked, IsNull, Json, ToSql, Type};

/// One value of a row, encoded in PostgreSQL's binary format by [`ToSql`].
/// Text and bytes borrow from the record they came from where they can (a
/// key or value sent as is), so converting copies nothing.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cell<'a> {
    Null,
    SmallInt(i16),
    Int(i32),
    BigInt(i64),
    Real(f32),
    Double(f64),
    /// Already in binary `numeric` format.
    Numeric(Vec<u8>),
    Text(Cow<'a, str>),
    /// Checked JSON text sent as is (`json`, or `jsonb` with its version
    /// byte); valid JSON is valid UTF-8, so it stays bytes.
    JsonText(Cow<'a, [u8]>),
    Bool(bool),
    Bytes(Cow<'a, [u8]>),
    Json(Value),
    /// Microseconds since 2000-01-01 UTC.
    Timestamptz(i64),
    Uuid([u8; 16]),
    /// Days since 2000-01-01.
    Date(i32),
    TextArray(Vec<Option<String>>),
    BigIntArray(Vec<Option<i64>>),
}

impl Cell<'_> {
    /// The same cell, owning its text and bytes.
    pub(crate) fn into_owned(self) -> Cell<'static> {
        match self {
            Cell::Text(v) => Cell::Text(Cow::Owned(v.into_owned())),
            Cell::JsonText(v) => Cell::JsonText(Cow::Owned(v.into_owned())),
            Cell::Bytes(v) => Cell::Bytes(Cow::Owned(v.into_owned())),
            Cell::Null => Cell::Null,
            Cell::SmallInt(v) => Cell::SmallInt(v),
            Cell::Int(v) => Cell::Int(v),
            Cell::BigInt(v) => Cell::BigInt(v),
            Cell::Real(v) => Cell::Real(v),
            Cell::Double(v) => Cell::Double(v),
            Cell::Numeric(v) => Cell::Numeric(v),
            Cell::Bool(v) => Cell::Bool(v),
            Cell::Json(v) => Cell::Json(v),
            Cell::Timestamptz(v) => Cell::Timestamptz(v),
            Cell::Uuid(v) => Cell::Uuid(v),
            Cell::Date(v) => Cell::Date(v),
            Cell::TextArray(v) => Cell::TextArray(v),
            Cell::BigIntArray(v) => Cell::BigIntArray(v),
        }
    }
}

impl ToSql for Cell<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match self {
            Cell::Null => Ok(IsNull::Yes),
            Cell::SmallInt(v) => v.to_sql(ty, out),
            Cell::Int(v) => v.to_sql(ty, out),
            Cell::BigInt(v) => v.to_sql(ty, out),
            Cell::Real(v) => v.to_sql(ty, out),
            Cell::Double(v) => v.to_sql(ty, out),
            Cell::Text(v) => v.as_ref().to_sql(ty, out),
            Cell::Bool(v) => v.to_sql(ty, out),
            Cell::Bytes(v) => v.as_ref().to_sql(ty, out),
            Cell::Json(v) => Json(v).to_sql(ty, out),
            Cell::JsonText(text) => {
                if *ty == Type::JSONB {
                    out.put_u8(1);
                }
                out.put_slice(text);
                Ok(IsNull::No)
            }
            Cell::Numeric(bytes) => {
                out.put_slice(bytes);
                Ok(IsNull::No)
            }
            Cell::Timestamptz(micros) => {
                out.put_i64(*micros);
                Ok(IsNull::No)
            }
            Cell::Uuid(bytes) => {
                out.put_slice(bytes);
                Ok(IsNull::No)
            }
            Cell::Date(days) => {
                out.put_i32(*days);
                Ok(IsNull::No)
            }
            // tokio-postgres writes the array format (dimensions, element
            // type, null bitmap by length -1) for the column's array type.
            Cell::TextArray(v) => v.to_sql(ty, out),
            Cell::BigIntArray(v) => v.to_sql(ty, out),
        }
    }

    /// The sink checks column types against the table before it writes.
    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}
