//! Records → rows → COPY bytes: pure code, no connection.
//!
//! ```text
//! Record ──convert──► Rows (one Cell per column) ──CopyEncoder──► binary COPY bytes
//!        └──────────► BadRecord (the reason) ──DeadLetters──► dead-letter rows
//! ```
//!
//! Every check the server would make on a value of a column (range, length,
//! precision, JSON PostgreSQL refuses) is made here, so one record that does
//! not fit becomes a dead letter instead of failing a COPY of many.

mod batch;
mod cell;
mod convert;
mod copy_format;
mod dead_letter;
pub(crate) mod evolve;
mod numeric;
pub(crate) mod schemad;

pub(crate) use batch::{convert, BadRecord, RowShape, Rows};
pub(crate) use cell::Cell;
pub(crate) use convert::ColumnSpec;
pub(crate) use copy_format::{CopyEncoder, EncodeError};
pub(crate) use dead_letter::{DeadLetters, DEAD_LETTER_COLUMNS};
pub(crate) use numeric::NumericTypmod;
