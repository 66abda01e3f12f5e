//! Record → row conversion, done in Rust before any COPY so that one bad
//! record becomes a dead letter instead of failing the whole COPY.

use std::borrow::Cow;

use exactly_core::{JsonFacts, JsonPointer, Record};
use serde_json::Value;

use super::cell::Cell;
use super::numeric::{Decimal, NumericTypmod};
use crate::config::{ColumnType, FieldSource};

/// Seconds between the Unix epoch and PostgreSQL's (2000-01-01 UTC).
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;
/// PostgreSQL's timestamp range, in microseconds since its epoch
/// (`MIN_TIMESTAMP`, `END_TIMESTAMP`: 4714-11-24 BC to 294277-01-01 AD).
const PG_MIN_TIMESTAMP: i64 = -211_813_488_000_000_000;
const PG_END_TIMESTAMP: i64 = 9_223_371_331_200_000_000;

/// What the target column accepts, from the configuration and the table.
#[derive(Clone, Debug)]
pub(crate) struct ColumnSpec {
    pub name: String,
    pub from: FieldSource,
    pub ty: ColumnType,
    pub required: bool,
    /// `varchar(n)` / `char(n)`: most characters.
    pub max_chars: Option<usize>,
    /// `numeric(p, s)`.
    pub numeric: Option<NumericTypmod>,
    /// The column is `NOT NULL`.
    pub not_null: bool,
}

impl ColumnSpec {
    /// A spec without table constraints (before the table was inspected).
    #[cfg(test)]
    pub(crate) fn plain(name: &str, from: &str, ty: ColumnType, required: bool) -> ColumnSpec {
        ColumnSpec {
            name: name.into(),
            from: from.parse().expect("valid source"),
            ty,
            required,
            max_chars: None,
            numeric: None,
            not_null: false,
        }
    }
}

/// A value taken from a record, before conversion to the column type.
#[derive(Debug)]
enum Input<'a> {
    Missing,
    Null,
    Text(&'a str),
    Int(i64),
    Raw(&'a [u8]),
    Json(&'a Value),
    Headers(&'a [(String, Option<Vec<u8>>)]),
    /// Unix milliseconds.
    Millis(i64),
}

/// The JSON pointers of `columns`, in column order: what [`to_row`] needs
/// per record, built once per batch.
pub(crate) fn pointers_of(columns: &[ColumnSpec]) -> Vec<&JsonPointer> {
    columns
        .iter()
        .filter_map(|c| match &c.from {
            FieldSource::Pointer(p) => Some(p),
            _ => None,
        })
        .collect()
}

/// Converts a record into one cell per column, appended to `cells`, or
/// explains every column that does not fit (and leaves `cells` as it was).
/// `pointers`: [`pointers_of`] the columns.
pub(crate) fn to_row<'a>(
    record: &'a Record,
    columns: &[ColumnSpec],
    pointers: &[&JsonPointer],
    cells: &mut Vec<Cell<'a>>,
) -> Result<(), String> {
    // Every pointer is answered in one pass over the value.
    let (pointed, value_json) = match &record.value {
        _ if pointers.is_empty() => (Default::default(), None),
        // A null value (a tombstone) has no fields: every pointer finds
        // null, which a column takes as NULL only when it is not required.
        None => (pointers.iter().map(|_| Some(Value::Null)).collect(), None),
        Some(value) => {
            let scanned = JsonPointer::scan_all(pointers, value)
                .map_err(|e| format!("the value is not valid JSON ({e}), so JSON pointers cannot be read"))?;
            (scanned.found, Some(scanned.facts))
        }
    };
    let mut pointed = pointed.iter();
    let mut key = KeyJson::default();
    fill(cells, columns, |column| {
        // The pointer pass read the whole value as JSON already.
        let known_json = value_json.filter(|_| column.from == FieldSource::Value);
        match column.from {
            // What a pointer found lives only as long as this call: owned.
            FieldSource::Pointer(_) => {
                let input = match pointed.next().expect("one answer per pointer column") {
                    None => Input::Missing,
                    Some(Value::Null) => Input::Null,
                    Some(v) => Input::Json(v),
                };
                convert(input, column, known_json).map(Cell::into_owned)
            }
            ref from => from_record(record, from, column, known_json, &mut key),
        }
    })
}

/// The row of a delete: the key columns (`key`, indexes into `columns`)
/// converted from `record` (a tombstone has nothing else), every other
/// column NULL. Appended to `cells`, or every key column that does not fit
/// explained (and `cells` left as it was).
pub(crate) fn to_key_row<'a>(
    record: &'a Record,
    columns: &[ColumnSpec],
    key: &[usize],
    cells: &mut Vec<Cell<'a>>,
) -> Result<(), String> {
    let mut json = KeyJson::default();
    let mut index = 0;
    fill(cells, columns, |column| {
        index += 1;
        if !key.contains(&(index - 1)) {
            return Ok(Cell::Null);
        }
        match column.from {
            FieldSource::Pointer(_) => Err("a key column of a delete must come from the record key".into()),
            ref from => from_record(record, from, column, None, &mut json),
        }
    })
}

/// Pushes `cell(column)` for every column onto `cells`, or explains every
/// column that does not fit and leaves `cells` as it was.
fn fill<'a>(
    cells: &mut Vec<Cell<'a>>,
    columns: &[ColumnSpec],
    mut cell: impl FnMut(&ColumnSpec) -> Result<Cell<'a>, String>,
) -> Result<(), String> {
    let start = cells.len();
    let mut problems = Vec::new();
    for column in columns {
        match cell(column) {
            Ok(cell) => cells.push(cell),
            Err(problem) => problems.push(format!(
                "column \"{}\" (from {}, {}): {problem}",
                column.name,
                column.from,
                column.ty.config_name()
            )),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        cells.truncate(start);
        Err(problems.join("; "))
    }
}

/// The record key read as JSON, once per record, when a column needs it.
#[derive(Default)]
enum KeyJson {
    #[default]
    Unread,
    /// `None`: no key; an error: the key is not JSON.
    Read(Option<Result<Value, String>>),
}

impl KeyJson {
    fn get(&mut self, record: &Record) -> Option<&Result<Value, String>> {
        if let KeyJson::Unread = self {
            *self = KeyJson::Read(
                record
                    .key
                    .as_deref()
                    .map(|key| serde_json::from_slice(key).map_err(|e| format!("the key is not valid JSON ({e})"))),
            );
        }
        match self {
            KeyJson::Read(read) => read.as_ref(),
            KeyJson::Unread => unreachable!("read above"),
        }
    }
}

/// The cell of a column that is not a JSON pointer into the value.
fn from_record<'a>(
    record: &'a Record,
    from: &FieldSource,
    column: &ColumnSpec,
    known_json: Option<JsonFacts>,
    key: &mut KeyJson,
) -> Result<Cell<'a>, String> {
    match from {
        // What is found in the key lives only as long as this call: owned.
        FieldSource::KeyPointer(pointer) => match key.get(record) {
            None => convert(Input::Missing, column, None),
            Some(Err(e)) => Err(format!("{e}, so JSON pointers into it cannot be read")),
            Some(Ok(value)) => convert(found(value.pointer(pointer.as_str())), column, None).map(Cell::into_owned),
        },
        FieldSource::KeyField(name) => match key.get(record) {
            None => convert(Input::Missing, column, None),
            Some(Ok(Value::Object(fields))) => convert(found(fields.get(name)), column, None).map(Cell::into_owned),
            Some(Ok(scalar)) => convert(found(Some(scalar)), column, None).map(Cell::into_owned),
            // Not JSON: the key's bytes as they are.
            Some(Err(_)) => convert(extract(record, &FieldSource::Key), column, None),
        },
        from => convert(extract(record, from), column, known_json),
    }
}

/// The input of what a JSON pointer found.
fn found(found: Option<&Value>) -> Input<'_> {
    match found {
        None => Input::Missing,
        Some(Value::Null) => Input::Null,
        Some(v) => Input::Json(v),
    }
}

/// The input of a column that is not a JSON pointer.
fn extract<'a>(record: &'a Record, from: &FieldSource) -> Input<'a> {
    match from {
        FieldSource::Topic => Input::Text(record.topic_partition().map_or(record.split.as_str(), |(t, _)| t)),
        FieldSource::Partition => record
            .topic_partition()
            .map_or(Input::Missing, |(_, p)| Input::Int(p.into())),
        FieldSource::Offset => Input::Int(record.offset),
        FieldSource::Key => record.key.as_deref().map_or(Input::Missing, Input::Raw),
        FieldSource::Timestamp => record.timestamp_ms.map_or(Input::Missing, Input::Millis),
        FieldSource::Headers => Input::Headers(&record.headers),
        FieldSource::Header(name) => match record.headers.iter().rev().find(|(n, _)| n == name) {
            None => Input::Missing,
            Some((_, None)) => Input::Null,
            Some((_, Some(bytes))) => Input::Raw(bytes),
        },
        FieldSource::Value => record.value.as_deref().map_or(Input::Null, Input::Raw),
        FieldSource::Pointer(_) | FieldSource::KeyPointer(_) | FieldSource::KeyField(_) => {
            unreachable!("JSON is read by to_row and from_record")
        }
    }
}

/// `known_json`: the input is bytes a pass already read as valid JSON, and
/// what it found.
fn convert<'a>(input: Input<'a>, column: &ColumnSpec, known_json: Option<JsonFacts>) -> Result<Cell<'a>, String> {
    let cell = match input {
        Input::Missing | Input::Null if column.required => {
            return Err(match input {
                Input::Missing => "the record has no such value and the column is required".into(),
                _ => "the value is null and the column is required (set required = false to store NULL)".into(),
            })
        }
        Input::Missing | Input::Null => Cell::Null,
        input => typed(input, column, known_json)?,
    };
    if cell == Cell::Null && column.not_null {
        return Err("no value, but the column is NOT NULL in the table".into());
    }
    Ok(cell)
}

fn typed<'a>(input: Input<'a>, column: &ColumnSpec, known_json: Option<JsonFacts>) -> Result<Cell<'a>, String> {
    Ok(match column.ty {
        ColumnType::SmallInt => Cell::SmallInt(in_range(integer(&input)?, "smallint")?),
        ColumnType::Int => Cell::Int(in_range(integer(&input)?, "int")?),
        ColumnType::BigInt => Cell::BigInt(integer(&input)?),
        ColumnType::Real => {
            let v = float(&input)?;
            let narrow = v as f32;
            if v.is_finite() && !narrow.is_finite() {
                return Err(format!("{v} is out of range for real"));
            }
            Cell::Real(narrow)
        }
        ColumnType::Double => Cell::Double(float(&input)?),
        ColumnType::Numeric => {
            let mut decimal = Decimal::parse(&decimal_text(&input)?)?;
            if let Some(typmod) = column.numeric {
                decimal = decimal.fit(typmod)?;
            }
            Cell::Numeric(decimal.to_binary())
        }
        ColumnType::Text => {
            let text = text(&input)?;
            if text.contains('\0') {
                return Err("text cannot contain NUL characters".into());
            }
            match column.max_chars {
                Some(max) => Cell::Text(
                    within_limit(text, max)
                        .map_err(|chars| format!("{chars} characters do not fit the column's limit of {max}"))?,
                ),
                None => Cell::Text(text),
            }
        }
        ColumnType::Boolean => Cell::Bool(boolean(&input)?),
        ColumnType::Bytea => Cell::Bytes(bytes(&input)),
        ColumnType::Json | ColumnType::Jsonb => {
            let jsonb = column.ty == ColumnType::Jsonb;
            if let Input::Raw(raw) = input {
                // Valid JSON bytes keep their text (key order, spacing),
                // checked without building the document.
                return Ok(Cell::JsonText(Cow::Borrowed(json_text(raw, jsonb, known_json)?)));
            }
            let value = json(&input)?;
            if jsonb && contains_nul(&value) {
                return Err(NUL_IN_JSONB.into());
            }
            Cell::Json(value)
        }
        ColumnType::Timestamptz => Cell::Timestamptz(timestamp(&input)?),
        ColumnType::Uuid => Cell::Uuid(uuid(&input)?),
        ColumnType::Date => Cell::Date(date(&input)?),
        ColumnType::TextArray => Cell::TextArray(array(&input, |element| {
            let text = match element {
                Value::String(s) if s.contains('\0') => return Err("text cannot contain NUL characters".into()),
                Value::String(s) => s.clone(),
                Value::Number(_) | Value::Bool(_) => element.to_string(),
                other => return Err(format!("a text[] element cannot be {}", kind_of(other))),
            };
            // `varchar(n)[]`: the limit holds for every element.
            match column.max_chars {
                Some(max) => within_limit(Cow::Owned(text), max)
                    .map(Cow::into_owned)
                    .map_err(|chars| {
                        format!("an element of {chars} characters does not fit the column's limit of {max}")
                    }),
                None => Ok(text),
            }
        })?),
        ColumnType::BigIntArray => Cell::BigIntArray(array(&input, |element| integer(&Input::Json(element)))?),
    })
}

/// `text` in a `varchar(max)` / `char(max)` column, as PostgreSQL stores
/// it: whole when it fits, cut to `max` characters when everything past
/// them is spaces (PostgreSQL truncates those instead of refusing), else
/// `Err` with its length in characters.
fn within_limit(text: Cow<'_, str>, max: usize) -> Result<Cow<'_, str>, usize> {
    let Some((cut, _)) = text.char_indices().nth(max) else {
        return Ok(text);
    };
    if !text[cut..].bytes().all(|b| b == b' ') {
        return Err(text.chars().count());
    }
    Ok(match text {
        Cow::Borrowed(s) => Cow::Borrowed(&s[..cut]),
        Cow::Owned(mut s) => {
            s.truncate(cut);
            Cow::Owned(s)
        }
    })
}

/// The JSON array `input` holds (as JSON text or a decoded value), each
/// element through `element`, `null` elements as `None`.
fn array<T>(input: &Input<'_>, element: impl Fn(&Value) -> Result<T, String>) -> Result<Vec<Option<T>>, String> {
    let parsed;
    let value = match input {
        Input::Json(value) => *value,
        _ => match as_str(input)? {
            Some(text) => {
                parsed = serde_json::from_str::<Value>(text).map_err(|e| format!("not a JSON array ({e})"))?;
                &parsed
            }
            None => return Err(format!("expected a JSON array, got {}", describe(input))),
        },
    };
    let Value::Array(elements) = value else {
        return Err(format!("expected a JSON array, got {}", kind_of(value)));
    };
    elements
        .iter()
        .enumerate()
        .map(|(i, e)| match e {
            Value::Null => Ok(None),
            e => element(e).map(Some).map_err(|why| format!("element {i}: {why}")),
        })
        .collect()
}

/// What kind of JSON value `value` is, for errors.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array (arrays of arrays are not supported)",
        Value::Object(_) => "an object",
    }
}

/// A UUID from its text.
fn uuid(input: &Input<'_>) -> Result<[u8; 16], String> {
    let text = as_str(input)?.ok_or_else(|| format!("expected a UUID as text, got {}", describe(input)))?;
    uuid::Uuid::try_parse(text.trim())
        .map(|u| u.into_bytes())
        .map_err(|e| format!("{text:?} is not a UUID ({e})"))
}

/// 1970-01-01 as days since PostgreSQL's epoch, 2000-01-01.
const UNIX_EPOCH_PG_DAYS: i64 = -10_957;

/// The dates PostgreSQL's `date` stores, as days since 2000-01-01: from
/// 4713-01-01 BC (Julian day 0) to before Julian day 2,147,483,494.
const PG_DATE_DAYS: std::ops::Range<i64> = -2_451_545..2_145_031_949;

/// A date as days since 2000-01-01, from `YYYY-MM-DD`, days since 1970, or
/// a record's timestamp (its UTC day).
fn date(input: &Input<'_>) -> Result<i32, String> {
    let unix_days = if let Input::Millis(ms) = input {
        ms.div_euclid(86_400_000)
    } else if let Some(text) = as_str(input)? {
        let day = chrono::NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d")
            .map_err(|e| format!("{text:?} is not a date as YYYY-MM-DD ({e})"))?;
        day.signed_duration_since(chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a valid date"))
            .num_days()
    } else {
        integer(input).map_err(|_| format!("expected a date, got {}", describe(input)))?
    };
    unix_days
        .checked_add(UNIX_EPOCH_PG_DAYS)
        .filter(|d| PG_DATE_DAYS.contains(d))
        .and_then(|d| i32::try_from(d).ok())
        .ok_or_else(|| format!("{unix_days} days since 1970-01-01 is out of range for date"))
}

/// The most digits after the decimal point PostgreSQL's `numeric` keeps
/// (`NUMERIC_DSCALE_MAX`).
const NUMERIC_MAX_SCALE: u64 = 16383;

const NUL_IN_JSONB: &str = "jsonb cannot store the character \\u0000";

/// `raw` as JSON text PostgreSQL accepts for `json` (or `jsonb`): valid
/// JSON as strictly as `serde_json::Value` reads it (UTF-8, strings with
/// whole surrogate pairs, numbers in range, at most 127 levels deep) and,
/// for `jsonb`, no `\\u0000` escape. `known_json`: what a pass over these
/// bytes already found.
fn json_text(raw: &[u8], jsonb: bool, known_json: Option<JsonFacts>) -> Result<&[u8], String> {
    let known = match known_json {
        Some(known) => known,
        None => exactly_core::validate_json(raw).map_err(|e| format!("the bytes are not valid JSON ({e})"))?,
    };
    if jsonb && known.nul_escape {
        return Err(NUL_IN_JSONB.into());
    }
    if jsonb && known.max_scale > NUMERIC_MAX_SCALE {
        return Err(format!(
            "jsonb stores numbers as numeric, which keeps at most {NUMERIC_MAX_SCALE} digits after the decimal point; \
             a number here has more (or an exponent of a billion or more); use a json column to keep such text"
        ));
    }
    Ok(raw)
}

fn utf8(raw: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(raw).map_err(|e| format!("the bytes are not valid UTF-8 ({e})"))
}

/// Text a string-like input holds (a JSON string, text, UTF-8 bytes).
fn as_str<'a>(input: &Input<'a>) -> Result<Option<&'a str>, String> {
    Ok(match input {
        Input::Text(s) => Some(s),
        Input::Raw(raw) => Some(utf8(raw)?),
        Input::Json(Value::String(s)) => Some(s),
        _ => None,
    })
}

fn describe(input: &Input<'_>) -> String {
    match input {
        Input::Json(v) => {
            let mut text = v.to_string();
            if text.len() > 60 {
                let mut end = 57;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
                text.push_str("...");
            }
            text
        }
        Input::Headers(_) => "the headers object".into(),
        other => format!("{other:?}"),
    }
}

fn integer(input: &Input<'_>) -> Result<i64, String> {
    if let Some(s) = as_str(input)? {
        return s.trim().parse().map_err(|_| format!("{s:?} is not an integer"));
    }
    match input {
        Input::Int(v) | Input::Millis(v) => Ok(*v),
        Input::Json(Value::Number(n)) => {
            if let Some(v) = n.as_i64() {
                Ok(v)
            } else if n.is_u64() {
                Err(format!("{n} is out of range for bigint"))
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
                    Ok(f as i64)
                } else {
                    Err(format!("{n} is not an integer"))
                }
            }
        }
        other => Err(format!("expected an integer, got {}", describe(other))),
    }
}

fn in_range<T: TryFrom<i64>>(v: i64, type_name: &str) -> Result<T, String> {
    T::try_from(v).map_err(|_| format!("{v} is out of range for {type_name}"))
}

fn float(input: &Input<'_>) -> Result<f64, String> {
    if let Some(s) = as_str(input)? {
        return s.trim().parse().map_err(|_| format!("{s:?} is not a number"));
    }
    match input {
        Input::Int(v) | Input::Millis(v) => Ok(*v as f64),
        Input::Json(Value::Number(n)) => n.as_f64().ok_or_else(|| format!("{n} is not a number")),
        other => Err(format!("expected a number, got {}", describe(other))),
    }
}

fn decimal_text<'a>(input: &Input<'a>) -> Result<Cow<'a, str>, String> {
    if let Some(s) = as_str(input)? {
        return Ok(Cow::Borrowed(s));
    }
    match input {
        Input::Int(v) | Input::Millis(v) => Ok(Cow::Owned(v.to_string())),
        Input::Json(Value::Number(n)) => Ok(Cow::Owned(n.to_string())),
        other => Err(format!("expected a number, got {}", describe(other))),
    }
}

fn text<'a>(input: &Input<'a>) -> Result<Cow<'a, str>, String> {
    if let Some(s) = as_str(input)? {
        return Ok(Cow::Borrowed(s));
    }
    Ok(Cow::Owned(match input {
        Input::Int(v) => v.to_string(),
        Input::Millis(ms) => chrono::DateTime::from_timestamp_millis(*ms)
            .ok_or_else(|| format!("timestamp {ms} ms is out of range"))?
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        Input::Json(v) => v.to_string(),
        Input::Headers(h) => headers_json(h).to_string(),
        Input::Missing | Input::Null | Input::Text(_) | Input::Raw(_) => unreachable!("handled above"),
    }))
}

fn bytes<'a>(input: &Input<'a>) -> Cow<'a, [u8]> {
    match input {
        Input::Raw(raw) => Cow::Borrowed(raw),
        Input::Text(s) => Cow::Borrowed(s.as_bytes()),
        Input::Json(Value::String(s)) => Cow::Borrowed(s.as_bytes()),
        Input::Json(v) => Cow::Owned(v.to_string().into_bytes()),
        Input::Int(v) | Input::Millis(v) => Cow::Owned(v.to_string().into_bytes()),
        Input::Headers(h) => Cow::Owned(headers_json(h).to_string().into_bytes()),
        Input::Missing | Input::Null => Cow::Borrowed(&[]),
    }
}

fn boolean(input: &Input<'_>) -> Result<bool, String> {
    if let Input::Json(Value::Bool(b)) = input {
        return Ok(*b);
    }
    let Some(s) = as_str(input)? else {
        return Err(format!("expected true or false, got {}", describe(input)));
    };
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "t" | "yes" | "y" | "on" | "1" => Ok(true),
        "false" | "f" | "no" | "n" | "off" | "0" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (use true or false)")),
    }
}

fn json(input: &Input<'_>) -> Result<Value, String> {
    Ok(match input {
        Input::Json(v) => (*v).clone(),
        Input::Raw(raw) => serde_json::from_slice(raw).map_err(|e| format!("the bytes are not valid JSON ({e})"))?,
        Input::Text(s) => Value::String((*s).to_string()),
        Input::Int(v) | Input::Millis(v) => Value::from(*v),
        Input::Headers(h) => headers_json(h),
        Input::Missing | Input::Null => Value::Null,
    })
}

/// Headers as a JSON object: UTF-8 values as strings, other values as
/// PostgreSQL bytea hex text (`"\\x00ff"`); a name that repeats maps to an
/// array of its values in order.
pub(crate) fn headers_json(headers: &[(String, Option<Vec<u8>>)]) -> Value {
    let mut object = serde_json::Map::new();
    for (name, raw) in headers {
        let value = match raw.as_deref().map(std::str::from_utf8) {
            None => Value::Null,
            Some(Ok(s)) => Value::String(s.to_string()),
            Some(Err(_)) => Value::String(format!("\\x{}", hex::encode(raw.as_deref().unwrap_or_default()))),
        };
        match object.get_mut(name) {
            None => {
                object.insert(name.clone(), value);
            }
            Some(Value::Array(values)) => values.push(value),
            Some(first) => *first = Value::Array(vec![first.take(), value]),
        }
    }
    Value::Object(object)
}

fn contains_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

/// Microseconds since PostgreSQL's epoch. Numbers are Unix milliseconds,
/// text is RFC 3339 with an offset (`2024-05-01T12:00:00Z`).
fn timestamp(input: &Input<'_>) -> Result<i64, String> {
    let unix_micros = if let Some(s) = as_str(input)? {
        chrono::DateTime::parse_from_rfc3339(s.trim())
            .map_err(|e| format!("{s:?} is not an RFC 3339 timestamp with offset ({e})"))?
            .timestamp_micros()
    } else {
        let millis = match input {
            Input::Millis(ms) | Input::Int(ms) => *ms,
            Input::Json(Value::Number(n)) => n
                .as_i64()
                .ok_or_else(|| format!("{n} is not whole Unix milliseconds"))?,
            other => return Err(format!("expected a timestamp, got {}", describe(other))),
        };
        millis
            .checked_mul(1000)
            .ok_or_else(|| format!("{millis} ms is out of range for timestamptz"))?
    };
    let micros = unix_micros
        .checked_sub(PG_EPOCH_UNIX_MICROS)
        .filter(|m| (PG_MIN_TIMESTAMP..PG_END_TIMESTAMP).contains(m))
        .ok_or_else(|| "out of range for timestamptz".to_string())?;
    Ok(micros)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// [`to_row`] with the pointers of `columns`, the cells owned.
    fn row(record: &Record, columns: &[ColumnSpec]) -> Result<Vec<Cell<'static>>, String> {
        let mut cells = Vec::new();
        to_row(record, columns, &pointers_of(columns), &mut cells)?;
        Ok(cells.into_iter().map(Cell::into_owned).collect())
    }

    fn one(value: &str, from: &str, ty: ColumnType, required: bool) -> Result<Cell<'static>, String> {
        let record = Record::new("orders-3", 17, value.as_bytes().to_vec());
        let column = ColumnSpec::plain("c", from, ty, required);
        row(&record, std::slice::from_ref(&column)).map(|mut cells| cells.remove(0))
    }

    #[test]
    fn uuids_dates_and_arrays_are_parsed_and_their_errors_name_the_problem() {
        let id = [
            0x8f, 0x0c, 0x4a, 0x52, 0x1a, 0x3b, 0x4c, 0x5d, 0x9e, 0x6f, 0x0a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f,
        ];
        for text in [
            "8f0c4a52-1a3b-4c5d-9e6f-0a1b2c3d4e5f",
            "8F0C4A52-1A3B-4C5D-9E6F-0A1B2C3D4E5F",
            "8f0c4a521a3b4c5d9e6f0a1b2c3d4e5f",
        ] {
            assert_eq!(
                one(&format!(r#"{{"u":"{text}"}}"#), "/u", ColumnType::Uuid, true),
                Ok(Cell::Uuid(id)),
                "{text}"
            );
        }
        let err = one(r#"{"u":"8f0c4a52-1a3b"}"#, "/u", ColumnType::Uuid, true).unwrap_err();
        assert!(err.contains("is not a UUID"), "{err}");
        let err = one(r#"{"u":7}"#, "/u", ColumnType::Uuid, true).unwrap_err();
        assert!(err.contains("expected a UUID as text"), "{err}");

        // PostgreSQL counts days from 2000-01-01.
        assert_eq!(
            one(r#"{"d":"2000-01-01"}"#, "/d", ColumnType::Date, true),
            Ok(Cell::Date(0))
        );
        assert_eq!(
            one(r#"{"d":"2024-02-29"}"#, "/d", ColumnType::Date, true),
            Ok(Cell::Date(8825))
        );
        assert_eq!(one(r#"{"d":0}"#, "/d", ColumnType::Date, true), Ok(Cell::Date(-10_957)));
        assert_eq!(
            one(r#"{"d":19782}"#, "/d", ColumnType::Date, true),
            Ok(Cell::Date(8825))
        );
        let err = one(r#"{"d":"2024-02-30"}"#, "/d", ColumnType::Date, true).unwrap_err();
        assert!(err.contains("is not a date as YYYY-MM-DD"), "{err}");
        let err = one(r#"{"d":9223372036854775807}"#, "/d", ColumnType::Date, true).unwrap_err();
        assert!(err.contains("out of range for date"), "{err}");
        // Beyond PostgreSQL's range though within an i32: refused here, not
        // by the server in the middle of a COPY.
        for beyond in [r#"{"d":-2500000}"#, r#"{"d":"-5000-01-01"}"#, r#"{"d":2147483000}"#] {
            let err = one(beyond, "/d", ColumnType::Date, true).unwrap_err();
            assert!(err.contains("out of range for date"), "{beyond}: {err}");
        }
        // The record's timestamp: its UTC day.
        let mut record = Record::new("orders-3", 17, b"{}".to_vec());
        record.timestamp_ms = Some(86_400_000 * 19_782 + 5_000);
        let column = ColumnSpec::plain("d", "timestamp", ColumnType::Date, true);
        assert_eq!(row(&record, std::slice::from_ref(&column)), Ok(vec![Cell::Date(8825)]));

        assert_eq!(
            one(r#"{"a":["x",null,3,true]}"#, "/a", ColumnType::TextArray, true),
            Ok(Cell::TextArray(vec![
                Some("x".into()),
                None,
                Some("3".into()),
                Some("true".into())
            ]))
        );
        assert_eq!(
            one(r#"{"a":[1,"2",null]}"#, "/a", ColumnType::BigIntArray, true),
            Ok(Cell::BigIntArray(vec![Some(1), Some(2), None]))
        );
        // A whole value that is a JSON array, read as text.
        assert_eq!(
            one(r#"[5, 6]"#, "value", ColumnType::BigIntArray, true),
            Ok(Cell::BigIntArray(vec![Some(5), Some(6)]))
        );
        let err = one(r#"{"a":[[1]]}"#, "/a", ColumnType::BigIntArray, true).unwrap_err();
        assert!(err.contains("element 0"), "{err}");
        let err = one(r#"{"a":[{"k":1}]}"#, "/a", ColumnType::TextArray, true).unwrap_err();
        assert!(err.contains("element 0: a text[] element cannot be an object"), "{err}");
        let err = one(r#"{"a":"x"}"#, "/a", ColumnType::TextArray, true).unwrap_err();
        assert!(err.contains("expected a JSON array, got a string"), "{err}");
    }

    #[test]
    fn integers_are_parsed_and_range_checked() {
        assert_eq!(one(r#"{"a":5}"#, "/a", ColumnType::Int, true), Ok(Cell::Int(5)));
        assert_eq!(
            one(r#"{"a":"42"}"#, "/a", ColumnType::BigInt, true),
            Ok(Cell::BigInt(42))
        );
        assert_eq!(
            one(r#"{"a":3.0}"#, "/a", ColumnType::SmallInt, true),
            Ok(Cell::SmallInt(3))
        );
        let err = one(r#"{"a":"abc"}"#, "/a", ColumnType::BigInt, true).unwrap_err();
        assert!(
            err.contains("\"abc\" is not an integer") && err.contains("column \"c\""),
            "{err}"
        );
        let err = one(r#"{"a":3000000000}"#, "/a", ColumnType::Int, true).unwrap_err();
        assert!(err.contains("out of range for int"), "{err}");
        assert!(one(r#"{"a":18446744073709551615}"#, "/a", ColumnType::BigInt, true).is_err());
        assert!(one(r#"{"a":1.5}"#, "/a", ColumnType::BigInt, true).is_err());
        assert!(one(r#"{"a":true}"#, "/a", ColumnType::Int, true).is_err());
        assert_eq!(one("x", "offset", ColumnType::BigInt, true), Ok(Cell::BigInt(17)));
        assert_eq!(one("x", "partition", ColumnType::Int, true), Ok(Cell::Int(3)));
    }

    #[test]
    fn missing_and_null_values_follow_required() {
        let err = one(r#"{"b":1}"#, "/a", ColumnType::Int, true).unwrap_err();
        assert!(err.contains("no such value"), "{err}");
        assert!(one(r#"{"a":null}"#, "/a", ColumnType::Int, true)
            .unwrap_err()
            .contains("null"));
        assert_eq!(one(r#"{"b":1}"#, "/a", ColumnType::Int, false), Ok(Cell::Null));
        assert_eq!(one(r#"{"a":null}"#, "/a", ColumnType::Text, false), Ok(Cell::Null));
        let mut column = ColumnSpec::plain("c", "/a", ColumnType::Int, false);
        column.not_null = true;
        let record = Record::new("s", 0, br#"{}"#.to_vec());
        assert!(row(&record, &[column]).unwrap_err().contains("NOT NULL"));
        // No key / no timestamp / a split that is not <topic>-<partition>.
        assert!(one("x", "key", ColumnType::Bytea, true).is_err());
        assert_eq!(one("x", "timestamp", ColumnType::Timestamptz, false), Ok(Cell::Null));
        let record = Record::new("file.txt", 0, b"x".to_vec());
        let column = ColumnSpec::plain("c", "partition", ColumnType::Int, false);
        assert_eq!(row(&record, &[column]), Ok(vec![Cell::Null]));
    }

    #[test]
    fn a_record_that_does_not_fit_leaves_the_cells_as_they_were() {
        let columns = [
            ColumnSpec::plain("off", "offset", ColumnType::BigInt, true),
            ColumnSpec::plain("id", "/id", ColumnType::BigInt, true),
        ];
        let pointers = pointers_of(&columns);
        let (good, bad) = (
            Record::new("orders-3", 1, r#"{"id":5}"#),
            Record::new("orders-3", 2, r#"{"id":"x"}"#),
        );
        let mut cells = Vec::new();
        to_row(&good, &columns, &pointers, &mut cells).unwrap();
        assert!(to_row(&bad, &columns, &pointers, &mut cells).is_err());
        assert_eq!(cells, [Cell::BigInt(1), Cell::BigInt(5)]);
    }

    #[test]
    fn keys_and_values_are_borrowed_from_the_record() {
        let record = Record::new("orders-3", 17, br#"{"id":5}"#.to_vec()).with_key(b"k-5".to_vec());
        let columns = [
            ColumnSpec::plain("k", "key", ColumnType::Text, true),
            ColumnSpec::plain("v", "value", ColumnType::Jsonb, true),
            ColumnSpec::plain("b", "key", ColumnType::Bytea, true),
            ColumnSpec::plain("id", "/id", ColumnType::BigInt, true),
        ];
        let mut cells = Vec::new();
        to_row(&record, &columns, &pointers_of(&columns), &mut cells).unwrap();
        assert!(matches!(&cells[0], Cell::Text(Cow::Borrowed("k-5"))), "{:?}", cells[0]);
        assert!(
            matches!(&cells[1], Cell::JsonText(Cow::Borrowed(br#"{"id":5}"#))),
            "{:?}",
            cells[1]
        );
        assert!(
            matches!(&cells[2], Cell::Bytes(Cow::Borrowed(b"k-5"))),
            "{:?}",
            cells[2]
        );
        assert_eq!(cells[3], Cell::BigInt(5));
    }

    #[test]
    fn invalid_json_fails_the_whole_record() {
        let err = one("not json", "/a", ColumnType::Int, false).unwrap_err();
        assert!(err.contains("not valid JSON"), "{err}");
        // Without pointers the value is never parsed.
        assert_eq!(
            one("not json", "value", ColumnType::Text, true),
            Ok(Cell::Text("not json".into()))
        );
    }

    #[test]
    fn text_bytes_json_and_booleans() {
        assert_eq!(
            one(r#"{"a":"x"}"#, "/a", ColumnType::Text, true),
            Ok(Cell::Text("x".into()))
        );
        assert_eq!(
            one(r#"{"a":[1,2]}"#, "/a", ColumnType::Text, true),
            Ok(Cell::Text("[1,2]".into()))
        );
        assert_eq!(
            one("x", "topic", ColumnType::Text, true),
            Ok(Cell::Text("orders".into()))
        );
        assert!(one(r#"{"a":"x\u0000"}"#, "/a", ColumnType::Text, true).is_err());
        assert!(one(r#"{"a":"x\u0000"}"#, "/a", ColumnType::Jsonb, true).is_err());
        assert_eq!(
            one(r#"{"a":"x\u0000"}"#, "/a", ColumnType::Json, true),
            Ok(Cell::Json(json!("x\u{0}")))
        );
        assert_eq!(
            one(r#"{"a":"hi"}"#, "/a", ColumnType::Bytea, true),
            Ok(Cell::Bytes(b"hi".to_vec().into()))
        );
        assert_eq!(
            one(r#"{"a":{"b":1}}"#, "/a", ColumnType::Jsonb, true),
            Ok(Cell::Json(json!({"b": 1})))
        );
        assert_eq!(
            one(r#"[1, 2]"#, "value", ColumnType::Jsonb, true),
            Ok(Cell::JsonText(b"[1, 2]".as_slice().into()))
        );
        assert!(one(r#"["\u0000"]"#, "value", ColumnType::Jsonb, true).is_err());
        assert!(one("{", "value", ColumnType::Jsonb, true).is_err());
        assert_eq!(
            one(r#"{"a":true}"#, "/a", ColumnType::Boolean, true),
            Ok(Cell::Bool(true))
        );
        assert_eq!(
            one(r#"{"a":"off"}"#, "/a", ColumnType::Boolean, true),
            Ok(Cell::Bool(false))
        );
        assert!(one(r#"{"a":"maybe"}"#, "/a", ColumnType::Boolean, true).is_err());
        let mut column = ColumnSpec::plain("c", "/a", ColumnType::Text, true);
        column.max_chars = Some(3);
        let record = Record::new("s", 0, br#"{"a":"ab\u00e9"}"#.to_vec());
        assert!(
            row(&record, std::slice::from_ref(&column)).is_ok(),
            "counts characters, not bytes"
        );
        let record = Record::new("s", 0, br#"{"a":"abcd"}"#.to_vec());
        assert!(row(&record, &[column]).unwrap_err().contains("limit of 3"));
        let record = Record::new("s", 0, vec![0xff, 0xfe]);
        let column = ColumnSpec::plain("c", "value", ColumnType::Text, true);
        assert!(row(&record, &[column]).unwrap_err().contains("UTF-8"));
        // varchar(3)[]: every element within the limit.
        let mut column = ColumnSpec::plain("c", "/a", ColumnType::TextArray, true);
        column.max_chars = Some(3);
        let record = Record::new("s", 0, br#"{"a":["ab\u00e9",null,12]}"#.to_vec());
        assert!(row(&record, std::slice::from_ref(&column)).is_ok());
        let record = Record::new("s", 0, br#"{"a":["ab","abcd"]}"#.to_vec());
        assert!(row(&record, std::slice::from_ref(&column))
            .unwrap_err()
            .contains("an element of 4 characters"));
        // Spaces past the limit are cut, as PostgreSQL does.
        let record = Record::new("s", 0, br#"{"a":["abc   ","x "]}"#.to_vec());
        assert_eq!(
            row(&record, &[column]).unwrap(),
            [Cell::TextArray(vec![Some("abc".into()), Some("x ".into())])]
        );
        let mut column = ColumnSpec::plain("c", "/a", ColumnType::Text, true);
        column.max_chars = Some(3);
        let record = Record::new("s", 0, br#"{"a":"ab\u00e9  "}"#.to_vec());
        assert_eq!(row(&record, &[column]).unwrap(), [Cell::Text("ab\u{e9}".into())]);
    }

    #[test]
    fn floats_and_numerics() {
        assert_eq!(
            one(r#"{"a":1.25}"#, "/a", ColumnType::Double, true),
            Ok(Cell::Double(1.25))
        );
        assert_eq!(one(r#"{"a":"2.5"}"#, "/a", ColumnType::Real, true), Ok(Cell::Real(2.5)));
        assert!(one(r#"{"a":1e300}"#, "/a", ColumnType::Real, true).is_err());
        assert!(one(r#"{"a":"x"}"#, "/a", ColumnType::Double, true).is_err());
        let expected = Decimal::parse("12.50").unwrap().to_binary();
        assert_eq!(
            one(r#"{"a":"12.50"}"#, "/a", ColumnType::Numeric, true),
            Ok(Cell::Numeric(expected))
        );
        assert!(one(r#"{"a":"12,5"}"#, "/a", ColumnType::Numeric, true).is_err());
        let mut column = ColumnSpec::plain("c", "/a", ColumnType::Numeric, true);
        column.numeric = Some(NumericTypmod { precision: 4, scale: 2 });
        let record = Record::new("s", 0, br#"{"a":123.4}"#.to_vec());
        assert!(row(&record, &[column]).unwrap_err().contains("numeric(4, 2)"));
    }

    #[test]
    fn timestamps_from_milliseconds_and_rfc3339() {
        let mut record = Record::new("s", 0, br#"{"t":"2000-01-01T00:00:01.5+00:00","m":1000}"#.to_vec());
        record.timestamp_ms = Some(946_684_800_250);
        let columns = [
            ColumnSpec::plain("a", "/t", ColumnType::Timestamptz, true),
            ColumnSpec::plain("b", "timestamp", ColumnType::Timestamptz, true),
            ColumnSpec::plain("c", "/m", ColumnType::Timestamptz, true),
            ColumnSpec::plain("d", "timestamp", ColumnType::Text, true),
            ColumnSpec::plain("e", "timestamp", ColumnType::BigInt, true),
        ];
        assert_eq!(
            row(&record, &columns),
            Ok(vec![
                Cell::Timestamptz(1_500_000),
                Cell::Timestamptz(250_000),
                Cell::Timestamptz(1_000_000 - PG_EPOCH_UNIX_MICROS),
                Cell::Text("2000-01-01T00:00:00.250Z".into()),
                Cell::BigInt(946_684_800_250),
            ])
        );
        assert!(one(r#"{"t":"2024-01-01 10:00"}"#, "/t", ColumnType::Timestamptz, true).is_err());
        assert!(one(r#"{"t":9223372036854776}"#, "/t", ColumnType::Timestamptz, true).is_err());
        let err = one(r#"{"t":-9223372036854775}"#, "/t", ColumnType::Timestamptz, true).unwrap_err();
        assert!(err.contains("out of range"), "{err}");
    }

    #[test]
    fn headers_become_an_object() {
        let mut record = Record::new("s", 0, b"x".to_vec());
        record.headers = vec![
            ("trace".into(), Some(b"abc".to_vec())),
            ("bin".into(), Some(vec![0, 255])),
            ("tag".into(), Some(b"a".to_vec())),
            ("tag".into(), Some(b"b".to_vec())),
            ("tag".into(), Some(b"c".to_vec())),
            ("gone".into(), None),
            ("blank".into(), Some(Vec::new())),
        ];
        let column = ColumnSpec::plain("h", "headers", ColumnType::Jsonb, true);
        assert_eq!(
            row(&record, &[column]),
            Ok(vec![Cell::Json(
                json!({"trace": "abc", "bin": "\\x00ff", "tag": ["a", "b", "c"], "gone": null, "blank": ""})
            )])
        );
    }

    #[test]
    fn a_null_value_is_sql_null_where_a_column_allows_it_and_a_problem_where_it_is_required() {
        let tombstone = Record::tombstone("s", 0).with_key("k");
        let optional = [
            ColumnSpec::plain("v", "value", ColumnType::Jsonb, false),
            ColumnSpec::plain("id", "/id", ColumnType::BigInt, false),
            ColumnSpec::plain("k", "key", ColumnType::Text, true),
        ];
        assert_eq!(
            row(&tombstone, &optional),
            Ok(vec![Cell::Null, Cell::Null, Cell::Text("k".into())])
        );
        let empty = Record::new("s", 1, Vec::new());
        let raw = [ColumnSpec::plain("v", "value", ColumnType::Bytea, false)];
        assert_eq!(
            row(&empty, &raw),
            Ok(vec![Cell::Bytes(Vec::new().into())]),
            "empty is not null"
        );
        let required = [ColumnSpec::plain("v", "value", ColumnType::Jsonb, true)];
        let problem = row(&tombstone, &required).unwrap_err();
        assert!(problem.contains("null"), "{problem}");
    }

    #[test]
    fn every_bad_column_is_reported() {
        let record = Record::new("s", 0, br#"{"a":"x","b":"maybe"}"#.to_vec());
        let columns = [
            ColumnSpec::plain("a", "/a", ColumnType::Int, true),
            ColumnSpec::plain("b", "/b", ColumnType::Boolean, true),
        ];
        let err = row(&record, &columns).unwrap_err();
        assert!(err.contains("column \"a\"") && err.contains("column \"b\""), "{err}");
    }

    /// The raw-value check agrees with parsing the whole document (what
    /// PostgreSQL's json/jsonb input accepts) on escapes of every kind.
    #[test]
    fn raw_json_text_checks_escapes_like_a_full_parse() {
        let reference = |raw: &str, jsonb: bool| -> bool {
            serde_json::from_str::<Value>(raw).is_ok_and(|v| !(jsonb && contains_nul(&v)))
        };
        let cases = [
            r#"{"a":"plain"}"#,
            r#"{"a":"x\u0000"}"#,
            r#"{"a":"x\\u0000"}"#,
            r#"{"a":"\\\u0000"}"#,
            r#"{"a":"\ud83d\ude00"}"#,
            r#"{"a":"\ud83d"}"#,
            r#"{"a":"\ud83dx\ude00"}"#,
            r#"{"a":"\ude00"}"#,
            r#"{"a":"\ud83d\u0041"}"#,
            r#"{"a":"\ud83d\n"}"#,
            r#"{"a":"\ud83d\ud83d\ude00"}"#,
            r#"{"a":"\ud83d","b":"\ude00"}"#,
            r#"["\u00e9\"\/\b\f\n\r\t"]"#,
            r#"{"\u0000":1}"#,
            r#"{"a":"\uZZZZ"}"#,
            r#"{"a":1} x"#,
            "{\"a\":\"\u{1}\"}",
            "[1e400]",
        ];
        for raw in cases {
            for jsonb in [false, true] {
                let ours = json_text(raw.as_bytes(), jsonb, None).is_ok();
                if ours {
                    // What the pointer pass would have found instead.
                    let known = exactly_core::validate_json(raw.as_bytes()).unwrap();
                    assert!(json_text(raw.as_bytes(), jsonb, Some(known)).is_ok(), "{raw}");
                }
                let expected = reference(raw, jsonb);
                assert_eq!(
                    ours,
                    expected,
                    "{raw} (jsonb: {jsonb}): {:?}",
                    json_text(raw.as_bytes(), jsonb, None)
                );
            }
        }
        let error = json_text(b"\"\xff\"", false, None).unwrap_err();
        assert!(error.contains("not valid JSON") && error.contains("UTF-8"), "{error}");
        assert!(
            json_text(b"\xff", false, None).is_err(),
            "bytes outside strings are JSON's ASCII"
        );
        // Nesting PostgreSQL's recursive parser could choke on (and fail the
        // whole COPY) is refused here, so the record becomes a dead letter.
        let deep = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
        let error = json_text(deep.as_bytes(), true, None).unwrap_err();
        assert!(error.contains("recursion limit"), "{error}");
    }
}
