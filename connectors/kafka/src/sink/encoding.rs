//! What the sink writes for a record: the message's key and value, taken
//! as `key` / `value` say, its timestamp and its headers — or, when they
//! cannot be taken, the dead letter. Pure: no client, no I/O.
//!
//! Nulls stay null and empties stay empty: a record with a null value (a
//! tombstone) becomes a message with a null value, a null header value a
//! null header value, and an empty value or header value stays empty —
//! compaction treats the two differently (a null value deletes the key).

use std::borrow::Cow;

use exactly_core::{JsonPointer, Record};
use rdkafka::message::{Header, OwnedHeaders};

use super::config::{KeyFrom, ValueFrom};

/// Bytes of a message's key or value, borrowed from the record where
/// possible; `None` is null.
pub(crate) type Part<'r> = Option<Cow<'r, [u8]>>;

/// The message written for one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message<'r> {
    /// The key (`None`: no key).
    pub key: Part<'r>,
    /// The value (`None`: a tombstone).
    pub value: Part<'r>,
}

/// Why a record's key or value cannot be taken as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EncodingError {
    /// A JSON pointer is configured but the value is not JSON.
    #[error("the value is not JSON ({0}), so JSON pointers cannot be used")]
    NotJson(String),
    /// The JSON pointer of `setting` finds nothing in the value.
    #[error("`{setting}`: the value has nothing at {pointer}")]
    Missing {
        /// `key` or `value`.
        setting: &'static str,
        /// The pointer, as written.
        pointer: String,
    },
}

/// What `pointer` found (`answer`): a string's text, `None` for null, the
/// JSON text of anything else.
fn pointed<'r>(
    answer: Option<serde_json::Value>,
    pointer: &JsonPointer,
    setting: &'static str,
) -> Result<Part<'r>, EncodingError> {
    match answer {
        None => Err(EncodingError::Missing {
            setting,
            pointer: pointer.as_str().to_string(),
        }),
        Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(Cow::Owned(s.into_bytes()))),
        Some(other) => Ok(Some(Cow::Owned(other.to_string().into_bytes()))),
    }
}

/// The key and value of the message written for `record`.
pub(crate) fn message_of<'r>(
    record: &'r Record,
    key: &KeyFrom,
    value: &ValueFrom,
) -> Result<Message<'r>, EncodingError> {
    // Both pointers are answered in one pass over the value.
    let key_pointer = match key {
        KeyFrom::Pointer(p) => Some(p),
        _ => None,
    };
    let value_pointer = match value {
        ValueFrom::Pointer(p) => Some(p),
        ValueFrom::Value => None,
    };
    let pointers: Vec<&JsonPointer> = key_pointer.into_iter().chain(value_pointer).collect();
    let mut answers = match record.value.as_deref() {
        _ if pointers.is_empty() => Vec::new(),
        // A null value has no fields: every pointer finds null (no key,
        // a tombstone), as a pointer to a null field does.
        None => pointers.iter().map(|_| Some(serde_json::Value::Null)).collect(),
        Some(value) => JsonPointer::find_all(&pointers, value).map_err(|e| EncodingError::NotJson(e.to_string()))?,
    }
    .into_iter();
    // A null value stays null: a tombstone is written as a tombstone.
    let key_bytes = match key {
        KeyFrom::Key => record.key.as_deref().map(Cow::Borrowed),
        KeyFrom::Value => record.value.as_deref().map(Cow::Borrowed),
        KeyFrom::None => None,
        KeyFrom::Pointer(p) => pointed(answers.next().flatten(), p, "key")?,
    };
    let value_bytes = match value {
        ValueFrom::Value => record.value.as_deref().map(Cow::Borrowed),
        ValueFrom::Pointer(p) => pointed(answers.next().flatten(), p, "value")?,
    };
    Ok(Message {
        key: key_bytes,
        value: value_bytes,
    })
}

/// Header of a dead letter: why the record could not be written.
pub(crate) const DEAD_LETTER_REASON: &str = "exactly.dead_letter.reason";
/// Header of a dead letter: the record's split (`<topic>-<partition>` for
/// a Kafka source).
pub(crate) const DEAD_LETTER_SPLIT: &str = "exactly.dead_letter.split";
/// Header of a dead letter: the record's offset in its split.
pub(crate) const DEAD_LETTER_OFFSET: &str = "exactly.dead_letter.offset";
/// Header of a dead letter: the topic it was to be written to.
pub(crate) const DEAD_LETTER_TOPIC: &str = "exactly.dead_letter.topic";

/// The dead letter of `record`: its key and value unchanged (a null stays
/// null).
pub(crate) fn dead_letter_of(record: &Record) -> Message<'_> {
    Message {
        key: record.key.as_deref().map(Cow::Borrowed),
        value: record.value.as_deref().map(Cow::Borrowed),
    }
}

/// The headers of `record`'s dead letter: its own, in order, then why it
/// could not be written to `topic` and where it came from.
pub(crate) fn dead_letter_headers(
    record: &Record,
    reason: &EncodingError,
    topic: &str,
) -> Vec<(String, Option<Vec<u8>>)> {
    let mut headers = record.headers.clone();
    for (name, value) in [
        (DEAD_LETTER_REASON, reason.to_string()),
        (DEAD_LETTER_SPLIT, record.split.to_string()),
        (DEAD_LETTER_OFFSET, record.offset.to_string()),
        (DEAD_LETTER_TOPIC, topic.to_string()),
    ] {
        headers.push((name.to_string(), Some(value.into_bytes())));
    }
    headers
}

/// `headers` as librdkafka takes them, in order, repeated names kept; a
/// `None` value is a null header value, an empty one stays empty.
pub(crate) fn kafka_headers(headers: &[(String, Option<Vec<u8>>)]) -> OwnedHeaders {
    headers
        .iter()
        .fold(OwnedHeaders::new_with_capacity(headers.len()), |h, (key, value)| {
            h.insert(Header {
                key,
                value: value.as_deref(),
            })
        })
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Headers;

    use super::*;

    /// A message's key and value, owned.
    type Parts = (Option<Vec<u8>>, Option<Vec<u8>>);

    fn parts(record: &Record, k: &str, v: &str) -> Result<Parts, String> {
        message_of(record, &KeyFrom::parse(k).unwrap(), &ValueFrom::parse(v).unwrap())
            .map(|m| (m.key.map(|k| k.into_owned()), m.value.map(|v| v.into_owned())))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn keys_and_values_come_from_the_configured_place() {
        let record = Record::new("in-0", 7, r#"{"id":42,"name":"ada","tags":["x"],"gone":null}"#).with_key("k");
        let text = |s: &str| Some(s.as_bytes().to_vec());
        let value = record.value.as_deref().map(<[u8]>::to_vec);
        assert_eq!(parts(&record, "key", "value"), Ok((text("k"), value.clone())));
        assert_eq!(parts(&record, "value", "value").unwrap().0, value);
        assert_eq!(parts(&record, "none", "value").unwrap().0, None);
        assert_eq!(parts(&record, "/id", "/name"), Ok((text("42"), text("ada"))));
        assert_eq!(parts(&record, "/name", "/tags"), Ok((text("ada"), text(r#"["x"]"#))));
        assert_eq!(
            parts(&record, "/gone", "/gone"),
            Ok((None, None)),
            "null: no key, a tombstone"
        );
        let tombstone = Record::tombstone("in-0", 8).with_key("k");
        assert_eq!(
            parts(&tombstone, "key", "value"),
            Ok((text("k"), None)),
            "a null value stays a tombstone"
        );
        assert_eq!(
            parts(&tombstone, "key", "/name"),
            Ok((text("k"), None)),
            "a pointer into null finds null"
        );
        let e = parts(&record, "/missing", "value").unwrap_err();
        assert!(e.contains("`key`") && e.contains("/missing"), "{e}");
        let e = parts(&record, "key", "/missing").unwrap_err();
        assert!(e.contains("`value`"), "{e}");
        let plain = Record::new("in-0", 8, "not json");
        let e = message_of(
            &plain,
            &KeyFrom::Pointer(JsonPointer::parse("/id").unwrap()),
            &ValueFrom::Value,
        )
        .unwrap_err();
        assert!(
            matches!(e, EncodingError::NotJson(_)) && e.to_string().contains("not JSON"),
            "{e}"
        );
        assert!(
            message_of(&plain, &KeyFrom::Key, &ValueFrom::Value).is_ok(),
            "no JSON needed"
        );
    }

    #[test]
    fn an_empty_value_stays_empty_and_a_null_one_null() {
        let empty = Record::new("in-0", 1, "").with_key("");
        assert_eq!(
            parts(&empty, "key", "value"),
            Ok((Some(Vec::new()), Some(Vec::new()))),
            "empty is not null"
        );
        let tombstone = Record::tombstone("in-0", 2);
        assert_eq!(parts(&tombstone, "key", "value"), Ok((None, None)));
    }

    #[test]
    fn a_dead_letter_keeps_the_record_and_says_why() {
        let mut record = Record::new("in-3", 17, "not json").with_key("k");
        record.headers.push(("trace".to_string(), Some(b"t-1".to_vec())));
        let error = message_of(&record, &KeyFrom::Key, &ValueFrom::parse("/payload").unwrap()).unwrap_err();
        let letter = dead_letter_of(&record);
        assert_eq!(letter.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(letter.value.as_deref(), Some(&b"not json"[..]));
        let headers = dead_letter_headers(&record, &error, "out");
        let text = |s: &str| Some(s.as_bytes().to_vec());
        assert_eq!(headers[0], ("trace".to_string(), text("t-1")), "its own headers first");
        assert_eq!(headers[1].0, DEAD_LETTER_REASON);
        assert!(String::from_utf8_lossy(headers[1].1.as_deref().unwrap()).contains("not JSON"));
        assert_eq!(headers[2], (DEAD_LETTER_SPLIT.to_string(), text("in-3")));
        assert_eq!(headers[3], (DEAD_LETTER_OFFSET.to_string(), text("17")));
        assert_eq!(headers[4], (DEAD_LETTER_TOPIC.to_string(), text("out")));
        let tombstone = Record::tombstone("in-0", 1);
        assert_eq!(dead_letter_of(&tombstone).value, None, "a null stays null");
    }

    #[test]
    fn header_values_keep_null_and_empty_apart() {
        let headers = vec![
            ("null".to_string(), None),
            ("empty".to_string(), Some(Vec::new())),
            ("text".to_string(), Some(b"x".to_vec())),
            ("text".to_string(), Some(b"y".to_vec())),
        ];
        let kafka = kafka_headers(&headers);
        let back: Vec<(String, Option<Vec<u8>>)> = kafka
            .iter()
            .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
            .collect();
        assert_eq!(back, headers);
    }
}
