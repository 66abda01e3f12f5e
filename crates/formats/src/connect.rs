//! Kafka Connect's JSON with schemas (`{"schema": …, "payload": …}`, the
//! JSON converter with `schemas.enable=true`): a record's value becomes its
//! row — the payload's fields, with values of logical types rendered as
//! text (see the crate's `render` module) — and the row's schema.

use base64::Engine;
use serde_json::{Map, Value};

use crate::error::FormatError;
use crate::render;
use crate::schema::{ConnectSchema, Logical, SchemaType};

/// A decoded schema'd value: the row and its schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Field → value, logical types rendered.
    pub fields: Map<String, Value>,
    /// The row's schema (a struct).
    pub schema: ConnectSchema,
}

const FIX: &str = "write the topic with Kafka Connect's JsonConverter and schemas.enable=true (a struct value), or \
                   set format = \"json\"";

/// Decodes a value; `None` for a null value or a null payload (a
/// tombstone).
pub fn decode_value(value: Option<&[u8]>) -> Result<Option<Row>, FormatError> {
    let Some(bytes) = value else {
        return Ok(None);
    };
    let json: Value = serde_json::from_slice(bytes).map_err(|source| FormatError::NotJson {
        what: "the value",
        source,
        fix: FIX,
    })?;
    let Value::Object(mut wrapper) = json else {
        return Err(FormatError::shape("the value", "is not a JSON object", FIX));
    };
    let (Some(schema), Some(payload)) = (wrapper.remove("schema"), wrapper.remove("payload")) else {
        return Err(FormatError::shape(
            "the value",
            "has no \"schema\"/\"payload\" wrapper",
            FIX,
        ));
    };
    if payload.is_null() {
        return Ok(None);
    }
    let schema = ConnectSchema::from_connect_json(&schema, "schema")?;
    if schema.kind != SchemaType::Struct {
        return Err(FormatError::schema(
            "schema",
            format!(
                "the value's schema is {}, not a struct, so it has no columns",
                schema.describe()
            ),
            FIX,
        ));
    }
    match render_value(&schema, payload, "payload")? {
        Value::Object(fields) => Ok(Some(Row { fields, schema })),
        other => Err(FormatError::schema(
            "payload",
            format!("a struct's payload is {other}, not an object"),
            FIX,
        )),
    }
}

/// `value` of `schema` with logical types rendered (see the crate's `render` module).
pub fn render_value(schema: &ConnectSchema, value: Value, path: &str) -> Result<Value, FormatError> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    let mismatch = |what: &str| {
        FormatError::schema(
            path,
            format!("the value does not match its schema {} ({what})", schema.describe()),
            FIX,
        )
    };
    if let Some(logical) = &schema.logical {
        let int = value.as_i64();
        let rendered = match logical {
            Logical::Decimal { scale, .. } => match (&value, scale) {
                (Value::String(b64), Some(scale)) => {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .map_err(|_| mismatch("a decimal that is not base64"))?;
                    Some(render::decimal_bytes(&bytes, *scale))
                }
                // decimal.format=NUMERIC writes the number itself.
                (Value::Number(n), _) => Some(n.to_string()),
                (Value::Object(parts), None) => {
                    let scale = parts.get("scale").and_then(Value::as_u64);
                    let digits = parts.get("value").and_then(Value::as_str);
                    match (scale, digits) {
                        (Some(scale), Some(b64)) => {
                            let bytes = base64::engine::general_purpose::STANDARD
                                .decode(b64)
                                .map_err(|_| mismatch("a decimal that is not base64"))?;
                            Some(render::decimal_bytes(&bytes, scale as u32))
                        }
                        _ => return Err(mismatch("a variable-scale decimal without scale and value")),
                    }
                }
                _ => return Err(mismatch("a decimal that is neither base64 bytes nor a number")),
            },
            Logical::Date => Some(
                int.and_then(render::date)
                    .ok_or_else(|| mismatch("a date out of range"))?,
            ),
            Logical::Time(unit) => Some(
                int.and_then(|t| render::time(t, *unit))
                    .ok_or_else(|| mismatch("a time out of range"))?,
            ),
            Logical::Timestamp { unit, utc } => Some(
                int.and_then(|t| render::timestamp(t, *unit, *utc))
                    .ok_or_else(|| mismatch("a timestamp out of range"))?,
            ),
            _ => None,
        };
        if let Some(text) = rendered {
            return Ok(Value::String(text));
        }
    }
    Ok(match (schema.kind, value) {
        (SchemaType::Struct, Value::Object(mut object)) => {
            let mut out = Map::new();
            for field in &schema.fields {
                let value = object.remove(&field.name).unwrap_or(Value::Null);
                let path = format!("{path}.{}", field.name);
                out.insert(field.name.clone(), render_value(&field.schema, value, &path)?);
            }
            Value::Object(out)
        }
        (SchemaType::Array, Value::Array(items)) => {
            let item = schema
                .items
                .as_deref()
                .ok_or_else(|| mismatch("an array without items"))?;
            Value::Array(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| render_value(item, v, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            )
        }
        (SchemaType::Map, Value::Object(entries)) => {
            let values = schema
                .values
                .as_deref()
                .ok_or_else(|| mismatch("a map without values"))?;
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| {
                        let path = format!("{path}.{k}");
                        render_value(values, v, &path).map(|v| (k, v))
                    })
                    .collect::<Result<_, _>>()?,
            )
        }
        (SchemaType::Struct, _) => return Err(mismatch("a struct that is not an object")),
        (_, value) => value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wrapped(fields: Value, payload: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "schema": {"type": "struct", "name": "shop.orders.Value", "optional": false, "fields": fields},
            "payload": payload,
        }))
        .unwrap()
    }

    #[test]
    fn a_wrapped_struct_becomes_its_row_with_logical_types_rendered() {
        let value = wrapped(
            json!([
                {"field": "id", "type": "int64", "optional": false},
                {"field": "price", "type": "bytes", "optional": false, "name": "org.apache.kafka.connect.data.Decimal",
                 "parameters": {"scale": "2"}},
                {"field": "day", "type": "int32", "optional": true, "name": "org.apache.kafka.connect.data.Date"},
                {"field": "at", "type": "int64", "optional": true, "name": "org.apache.kafka.connect.data.Timestamp"},
                {"field": "tags", "type": "array", "items": {"type": "string"}, "optional": true},
                {"field": "note", "type": "string", "optional": true},
            ]),
            json!({"id": 7, "price": "+zI=", "day": 19782, "at": 1_709_214_300_123_i64, "tags": ["a"], "note": null}),
        );
        let row = decode_value(Some(&value)).unwrap().unwrap();
        assert_eq!(
            Value::Object(row.fields),
            json!({"id": 7, "price": "-12.30", "day": "2024-02-29", "at": "2024-02-29T13:45:00.123Z",
                   "tags": ["a"], "note": null})
        );
        assert_eq!(row.schema.fields.len(), 6);
        assert!(row.schema.field("note").unwrap().schema.optional);
    }

    #[test]
    fn tombstones_pass_and_unwrapped_or_mismatched_values_are_errors_with_a_fix() {
        assert_eq!(decode_value(None).unwrap(), None);
        let null_payload = wrapped(json!([{"field": "id", "type": "int64"}]), Value::Null);
        assert_eq!(decode_value(Some(&null_payload)).unwrap(), None);
        let plain = decode_value(Some(br#"{"id": 1}"#)).unwrap_err();
        assert!(plain.to_string().contains("no \"schema\"/\"payload\""), "{plain}");
        assert!(plain.to_string().contains("Fix:"), "{plain}");
        let not_json = decode_value(Some(b"{")).unwrap_err();
        assert!(matches!(not_json, FormatError::NotJson { .. }));
        let scalar = serde_json::to_vec(&json!({"schema": {"type": "string"}, "payload": "x"})).unwrap();
        let error = decode_value(Some(&scalar)).unwrap_err();
        assert!(error.to_string().contains("not a struct"), "{error}");
        let bad_decimal = wrapped(
            json!([{"field": "p", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                    "parameters": {"scale": "2"}}]),
            json!({"p": "%%"}),
        );
        let error = decode_value(Some(&bad_decimal)).unwrap_err();
        assert!(error.to_string().contains("payload.p"), "{error}");
    }
}
