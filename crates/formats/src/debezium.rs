//! Debezium change events: the value's envelope (`before`, `after`, `op`,
//! `source`, `ts_ms`) and the key, each with or without Kafka Connect's JSON
//! schema wrapper (`{"schema": …, "payload": …}`, the JSON converter with
//! `schemas.enable=true`).
//!
//! | event | [`Change`] |
//! |---|---|
//! | `op` `c` (insert), `r` (snapshot read), `u` (update) | [`Change::Upsert`] of `after` |
//! | `op` `d` (delete) | [`Change::Delete`] (the row of the key; `before` kept) |
//! | a null value (the tombstone Debezium writes after a delete) | [`Change::Skip`] |
//! | `op` `t` (truncate), `m` (message), anything else | a [`FormatError`] naming it |
//!
//! Order is the source's: Debezium writes every change of one key to one
//! partition, in commit order, so a sink that applies them in offset order
//! per key ends at the source table's state.

use serde_json::{Map, Value};

use crate::error::FormatError;
use crate::schema::ConnectSchema;

/// What one change event asks of a table.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Insert the row, or replace the row of its key (`c`, `r`, `u`).
    Upsert {
        /// The row after the change: column → value.
        after: Map<String, Value>,
    },
    /// Delete the row of the event's key (`d`).
    Delete {
        /// The row before the change, when the source's replica identity
        /// provides it (at least the key columns by default).
        before: Option<Map<String, Value>>,
    },
    /// Nothing: the tombstone that follows a delete (for log compaction).
    Skip,
}

/// A decoded change event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// What it does.
    pub change: Change,
    /// `op` as written (`"c"`, `"u"`, ...); empty for a tombstone.
    pub op: String,
    /// The row's schema (the `after`, else `before`, field of the wrapper's
    /// envelope schema), when the event came with the schema wrapper.
    pub row_schema: Option<ConnectSchema>,
}

const FIX: &str = "read a topic Debezium writes with the JSON converter, or set format = \"json\"";

/// Decodes a change event's value; `None` is a null value (a tombstone).
pub fn decode_value(value: Option<&[u8]>) -> Result<Event, FormatError> {
    let Some(bytes) = value else {
        return Ok(Event {
            change: Change::Skip,
            op: String::new(),
            row_schema: None,
        });
    };
    let json: Value = serde_json::from_slice(bytes).map_err(|source| FormatError::NotJson {
        what: "the value",
        source,
        fix: FIX,
    })?;
    let (schema, payload) = unwrap(json);
    let Value::Object(mut envelope) = payload else {
        return Err(FormatError::shape(
            "the Debezium event",
            "is not a JSON object (with or without the schema wrapper)",
            FIX,
        ));
    };
    let op = match envelope.get("op") {
        Some(Value::String(op)) => op.clone(),
        Some(other) => {
            return Err(FormatError::shape(
                "the Debezium event",
                format!("has \"op\": {other}, not a string"),
                FIX,
            ))
        }
        None => {
            return Err(FormatError::shape(
                "the Debezium event",
                "has no \"op\" (it is not a change event's envelope; an unwrapped row, as \
                 ExtractNewRecordState writes, has no envelope)",
                "read the topic with format = \"json\", or remove the unwrapping transform from the connector",
            ))
        }
    };
    let row =
        |envelope: &mut Map<String, Value>, field: &'static str| -> Result<Option<Map<String, Value>>, FormatError> {
            match envelope.remove(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Object(row)) => Ok(Some(row)),
                Some(other) => Err(FormatError::shape(
                    "the Debezium event",
                    format!("has \"{field}\": {other}, not a row object"),
                    FIX,
                )),
            }
        };
    let change =
        match op.as_str() {
            "c" | "r" | "u" => {
                let after = row(&mut envelope, "after")?.ok_or_else(|| {
                    FormatError::shape(
                        "the Debezium event",
                        format!("of op \"{op}\" has no \"after\" row"),
                        FIX,
                    )
                })?;
                Change::Upsert { after }
            }
            "d" => Change::Delete {
                before: row(&mut envelope, "before")?,
            },
            "t" => return Err(FormatError::shape(
                "the Debezium event",
                "is a truncate (op \"t\"), which the sink does not apply row by row",
                "truncate the target table yourself, or leave \"truncate\" out of the connector's skipped.operations \
                 default",
            )),
            other => {
                return Err(FormatError::shape(
                    "the Debezium event",
                    format!("has op \"{other}\", not one of c, r, u, d"),
                    FIX,
                ))
            }
        };
    let row_schema = match schema {
        Some(schema) => row_schema(&schema)?,
        None => None,
    };
    Ok(Event { change, op, row_schema })
}

/// The key without the schema wrapper: its `payload` re-serialized, or the
/// bytes as they are when there is no wrapper.
pub fn unwrap_key(key: &[u8]) -> Result<Option<Vec<u8>>, FormatError> {
    let Ok(json) = serde_json::from_slice::<Value>(key) else {
        return Ok(None);
    };
    match unwrap(json) {
        (Some(_), payload) => Ok(Some(serde_json::to_vec(&payload).map_err(|source| {
            FormatError::NotJson {
                what: "the key",
                source,
                fix: FIX,
            }
        })?)),
        (None, _) => Ok(None),
    }
}

/// `{"schema": S, "payload": P}` (exactly those two keys) → `(Some(S), P)`;
/// anything else → `(None, itself)`.
fn unwrap(json: Value) -> (Option<Value>, Value) {
    match json {
        Value::Object(mut object)
            if object.len() == 2 && object.contains_key("schema") && object.contains_key("payload") =>
        {
            let schema = object.remove("schema");
            let payload = object.remove("payload").unwrap_or(Value::Null);
            (schema, payload)
        }
        other => (None, other),
    }
}

/// The row schema in an envelope schema: its `after` field, else `before`.
fn row_schema(envelope: &Value) -> Result<Option<ConnectSchema>, FormatError> {
    let envelope = ConnectSchema::from_connect_json(envelope, "schema")?;
    Ok(envelope
        .field("after")
        .or_else(|| envelope.field("before"))
        .map(|field| field.schema.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The row schema Debezium's PostgreSQL connector writes for a
    /// `customers` table of `id serial primary key`, `first_name`,
    /// `last_name`, `email` (varchar not null), plus `extra` when `with_extra`.
    fn row_schema_json(with_extra: bool) -> Value {
        let mut fields = vec![
            json!({"type": "int32", "optional": false, "default": 0, "field": "id"}),
            json!({"type": "string", "optional": false, "field": "first_name"}),
            json!({"type": "string", "optional": false, "field": "last_name"}),
            json!({"type": "string", "optional": false, "field": "email"}),
        ];
        if with_extra {
            fields.push(json!({"type": "string", "optional": true, "field": "extra"}));
        }
        json!({"type": "struct", "fields": fields, "optional": true, "name": "dbserver1.inventory.customers.Value"})
    }

    /// `{"before": …, "after": …, "source": {…}, "op": …, "ts_ms": …}` as the
    /// PostgreSQL connector writes it.
    fn envelope(op: &str, before: Value, after: Value) -> Value {
        json!({
            "before": before,
            "after": after,
            "source": {
                "version": "2.7.0.Final", "connector": "postgresql", "name": "dbserver1",
                "ts_ms": 1_559_033_904_863_i64, "snapshot": "false", "db": "postgres",
                "sequence": "[\"24023119\",\"24023128\"]", "schema": "inventory", "table": "customers",
                "txId": 555, "lsn": 24_023_128, "xmin": null
            },
            "op": op,
            "ts_ms": 1_559_033_904_863_i64
        })
    }

    fn customer(id: i64, email: &str) -> Value {
        json!({"id": id, "first_name": "Anne", "last_name": "Kretchmar", "email": email})
    }

    fn decode(value: &Value) -> Result<Event, FormatError> {
        decode_value(Some(value.to_string().as_bytes()))
    }

    fn wrapped(payload: Value, with_extra: bool) -> Value {
        json!({
            "schema": {
                "type": "struct",
                "fields": [
                    {"type": "struct", "fields": row_schema_json(with_extra)["fields"].clone(), "optional": true,
                     "name": "dbserver1.inventory.customers.Value", "field": "before"},
                    {"type": "struct", "fields": row_schema_json(with_extra)["fields"].clone(), "optional": true,
                     "name": "dbserver1.inventory.customers.Value", "field": "after"},
                    {"type": "struct", "fields": [{"type": "string", "optional": false, "field": "connector"}],
                     "optional": false, "name": "io.debezium.connector.postgresql.Source", "field": "source"},
                    {"type": "string", "optional": false, "field": "op"},
                    {"type": "int64", "optional": true, "field": "ts_ms"}
                ],
                "optional": false,
                "name": "dbserver1.inventory.customers.Envelope"
            },
            "payload": payload
        })
    }

    #[test]
    fn creates_reads_and_updates_are_upserts_of_after() {
        for op in ["c", "r", "u"] {
            let before = if op == "u" {
                customer(1, "old@example.com")
            } else {
                Value::Null
            };
            let event = decode(&envelope(op, before, customer(1, "annek@noanswer.org"))).unwrap();
            assert_eq!(event.op, op);
            let Change::Upsert { after } = event.change else {
                panic!("{op}: {:?}", event.change)
            };
            assert_eq!(after["email"], "annek@noanswer.org");
            assert_eq!(after["id"], 1);
            assert!(event.row_schema.is_none());
        }
    }

    #[test]
    fn a_delete_deletes_and_the_tombstone_after_it_is_skipped() {
        let event = decode(&envelope("d", json!({"id": 1}), Value::Null)).unwrap();
        assert_eq!(
            event.change,
            Change::Delete {
                before: Some(json!({"id": 1}).as_object().unwrap().clone())
            }
        );
        // REPLICA IDENTITY NOTHING: no before at all.
        let event = decode(&envelope("d", Value::Null, Value::Null)).unwrap();
        assert_eq!(event.change, Change::Delete { before: None });
        assert_eq!(decode_value(None).unwrap().change, Change::Skip);
    }

    #[test]
    fn the_schema_wrapper_is_unwrapped_and_gives_the_row_schema() {
        let event = decode(&wrapped(envelope("c", Value::Null, customer(2, "b@x")), true)).unwrap();
        let Change::Upsert { after } = &event.change else {
            panic!()
        };
        assert_eq!(after["id"], 2);
        let schema = event.row_schema.expect("the wrapper's row schema");
        let names: Vec<&str> = schema.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["id", "first_name", "last_name", "email", "extra"]);
        assert!(schema.field("extra").unwrap().schema.optional);
        // A version that adds an optional column is a change a sink can follow.
        let old = decode(&wrapped(envelope("c", Value::Null, customer(2, "b@x")), false))
            .unwrap()
            .row_schema
            .unwrap();
        let added: Vec<&str> = old
            .added_fields(&schema)
            .unwrap()
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(added, ["extra"]);
        // The wrapped delete, and a wrapped key.
        let event = decode(&wrapped(envelope("d", json!({"id": 2}), Value::Null), false)).unwrap();
        assert!(matches!(event.change, Change::Delete { .. }));
        let key = json!({"schema": {"type": "struct", "fields": [{"type": "int32", "optional": false, "field": "id"}],
                          "optional": false, "name": "dbserver1.inventory.customers.Key"},
                         "payload": {"id": 2}});
        assert_eq!(unwrap_key(key.to_string().as_bytes()).unwrap().unwrap(), br#"{"id":2}"#);
        assert_eq!(unwrap_key(br#"{"id":2}"#).unwrap(), None);
        assert_eq!(unwrap_key(b"not json").unwrap(), None);
    }

    #[test]
    fn what_is_not_a_change_event_is_a_clear_error() {
        let cases = [
            (b"not json".to_vec(), "is not JSON"),
            (br#"[1, 2]"#.to_vec(), "not a JSON object"),
            (customer(1, "a").to_string().into_bytes(), "has no \"op\""),
            (
                envelope("t", Value::Null, Value::Null).to_string().into_bytes(),
                "truncate",
            ),
            (
                envelope("m", Value::Null, Value::Null).to_string().into_bytes(),
                "op \"m\"",
            ),
            (
                envelope("c", Value::Null, Value::Null).to_string().into_bytes(),
                "no \"after\" row",
            ),
            (
                envelope("u", Value::Null, json!(5)).to_string().into_bytes(),
                "not a row object",
            ),
            (json!({"op": 1}).to_string().into_bytes(), "not a string"),
        ];
        for (bytes, words) in cases {
            let error = decode_value(Some(&bytes)).unwrap_err();
            let message = error.to_string();
            assert!(
                message.contains(words) && message.contains("Fix:"),
                "{words}: {message}"
            );
            assert_eq!(error.class(), crate::ErrorClass::Record);
        }
    }
}
