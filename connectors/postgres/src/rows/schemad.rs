//! `format = "connect-json"` and `format = "avro"`, and the schemas of
//! `format = "debezium"`: records become the records the rest of the sink
//! knows — the value replaced by its row as a JSON object (logical types
//! rendered as text, see `exactly_formats`), the columns' pointers reading
//! it — each with the row's schema, which `schema_evolution` compares with
//! the table. Pure: Avro schemas are looked up by id in what the registry
//! client fetched before.

use std::sync::Arc;

use exactly_core::Record;
use exactly_formats::avro::{self, AvroSchema};
use exactly_formats::connect;
use exactly_formats::debezium::{self, Change};
use exactly_formats::schema::ConnectSchema;
use serde_json::{Map, Value};

use crate::config::Format;

/// A record as the sink writes it, with its row's schema when the format
/// has one.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub record: Record,
    pub schema: Option<Arc<ConnectSchema>>,
}

/// The schema ids of the Avro values of `batch` (to fetch first).
pub(crate) fn avro_ids(batch: &[Record]) -> Vec<u32> {
    let mut ids: Vec<u32> = batch
        .iter()
        .filter_map(|r| r.value.as_deref())
        .filter_map(|v| avro::frame(v).ok().map(|(id, _)| id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The records of `batch` decoded in `format`, in order (a Debezium
/// tombstone after a delete is dropped), and the index and reason of each
/// record that does not decode (a dead letter). `schema_of(id)`: the Avro
/// schema of an id, fetched before.
pub(crate) fn decode(
    batch: &[Record],
    format: Format,
    schema_of: impl Fn(u32) -> Option<Arc<AvroSchema>>,
) -> (Vec<Decoded>, Vec<(usize, String)>) {
    let mut decoded = Vec::with_capacity(batch.len());
    let mut bad = Vec::new();
    for (i, record) in batch.iter().enumerate() {
        match decode_one(record, format, &schema_of) {
            Ok(Some(one)) => decoded.push(one),
            Ok(None) => {}
            Err(error) => bad.push((i, error)),
        }
    }
    (decoded, bad)
}

fn with_value(record: &Record, value: Option<Map<String, Value>>, key: Option<bytes::Bytes>) -> Result<Record, String> {
    let value = match value {
        Some(row) => Some(
            serde_json::to_vec(&row)
                .map_err(|e| format!("the decoded row does not serialize: {e}"))?
                .into(),
        ),
        None => None,
    };
    Ok(Record {
        split: record.split.clone(),
        offset: record.offset,
        key,
        value,
        timestamp_ms: record.timestamp_ms,
        headers: record.headers.clone(),
    })
}

fn decode_one(
    record: &Record,
    format: Format,
    schema_of: &impl Fn(u32) -> Option<Arc<AvroSchema>>,
) -> Result<Option<Decoded>, String> {
    match format {
        Format::Json => Ok(Some(Decoded {
            record: record.clone(),
            schema: None,
        })),
        Format::ConnectJson => {
            let row = connect::decode_value(record.value.as_deref())
                .map_err(|e| format!("not Kafka Connect JSON with a schema: {e}"))?;
            let key = unwrapped_key(record)?;
            Ok(Some(match row {
                Some(row) => Decoded {
                    record: with_value(record, Some(row.fields), key)?,
                    schema: Some(Arc::new(row.schema)),
                },
                None => Decoded {
                    record: with_value(record, None, key)?,
                    schema: None,
                },
            }))
        }
        Format::Avro => {
            let Some(value) = record.value.as_deref() else {
                return Ok(Some(Decoded {
                    record: record.clone(),
                    schema: None,
                }));
            };
            let (id, datum) = avro::frame(value).map_err(|e| format!("not Avro in the Confluent wire format: {e}"))?;
            let schema = schema_of(id).ok_or_else(|| format!("the schema of id {id} was not fetched"))?;
            let row = avro::decode(&schema, datum).map_err(|e| format!("Avro of schema id {id}: {e}"))?;
            Ok(Some(Decoded {
                record: with_value(record, Some(row.fields), record.key.clone())?,
                schema: Some(Arc::new(row.schema)),
            }))
        }
        Format::Debezium => {
            let event = debezium::decode_value(record.value.as_deref())
                .map_err(|e| format!("not a Debezium change event: {e}"))?;
            let value = match event.change {
                Change::Skip => return Ok(None),
                Change::Upsert { after } => Some(after),
                Change::Delete { .. } => None,
            };
            let key = unwrapped_key(record)?;
            Ok(Some(Decoded {
                record: with_value(record, value, key)?,
                schema: event.row_schema.map(Arc::new),
            }))
        }
    }
}

/// The key without Kafka Connect's schema wrapper, when it has one.
fn unwrapped_key(record: &Record) -> Result<Option<bytes::Bytes>, String> {
    Ok(match record.key.as_deref() {
        Some(key) => match debezium::unwrap_key(key).map_err(|e| e.to_string())? {
            Some(unwrapped) => Some(unwrapped.into()),
            None => record.key.clone(),
        },
        None => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(op: &str, before: &str, after: &str) -> String {
        format!(
            r#"{{"before":{before},"after":{after},"source":{{"connector":"postgresql","table":"customers","lsn":1}},"op":"{op}","ts_ms":1}}"#
        )
    }

    fn none(_: u32) -> Option<Arc<AvroSchema>> {
        None
    }

    #[test]
    fn debezium_events_become_upserts_deletes_or_nothing_in_order() {
        let key = r#"{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"}],"optional":false},"payload":{"id":7}}"#;
        let batch = vec![
            Record::new("customers-0", 0, event("c", "null", r#"{"id":7,"email":"a"}"#)).with_key(key),
            Record::new("customers-0", 1, event("u", r#"{"id":7}"#, r#"{"id":7,"email":"b"}"#)).with_key(key),
            Record::new("customers-0", 2, event("d", r#"{"id":7}"#, "null")).with_key(key),
            Record::tombstone("customers-0", 3).with_key(key),
            Record::new("customers-0", 4, "garbage").with_key(key),
        ];
        let (records, bad) = decode(&batch, Format::Debezium, none);
        let offsets: Vec<i64> = records.iter().map(|r| r.record.offset).collect();
        assert_eq!(offsets, [0, 1, 2], "the tombstone after the delete is skipped");
        assert_eq!(
            records[0].record.value.as_deref(),
            Some(&br#"{"email":"a","id":7}"#[..])
        );
        assert_eq!(
            records[1].record.value.as_deref(),
            Some(&br#"{"email":"b","id":7}"#[..])
        );
        assert!(records[2].record.is_tombstone(), "a delete is a tombstone of its key");
        assert!(records
            .iter()
            .all(|r| r.record.key.as_deref() == Some(&br#"{"id":7}"#[..])));
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].0, 4);
        assert!(bad[0].1.contains("not a Debezium change event"), "{}", bad[0].1);
    }

    #[test]
    fn connect_json_values_become_their_rows_with_the_schema() {
        let value = r#"{"schema":{"type":"struct","fields":[{"field":"id","type":"int64"},
            {"field":"day","type":"int32","optional":true,"name":"org.apache.kafka.connect.data.Date"}]},
            "payload":{"id":3,"day":19782}}"#;
        let batch = vec![
            Record::new("t-0", 0, value),
            Record::tombstone("t-0", 1),
            Record::new("t-0", 2, r#"{"id":1}"#),
        ];
        let (records, bad) = decode(&batch, Format::ConnectJson, none);
        assert_eq!(records.len(), 2);
        assert_eq!(
            records[0].record.value.as_deref(),
            Some(&br#"{"day":"2024-02-29","id":3}"#[..])
        );
        assert_eq!(records[0].schema.as_ref().unwrap().fields.len(), 2);
        assert!(records[1].record.is_tombstone() && records[1].schema.is_none());
        assert_eq!(bad.len(), 1);
        assert!(bad[0].1.contains("schema"), "{}", bad[0].1);
    }

    #[test]
    fn avro_values_need_their_schema_and_the_magic_byte() {
        let schema = Arc::new(
            AvroSchema::parse(r#"{"type":"record","name":"R","fields":[{"name":"id","type":"long"}]}"#).unwrap(),
        );
        let batch = vec![
            Record::new("t-0", 0, &[0u8, 0, 0, 0, 5, 14][..]),
            Record::new("t-0", 1, &[0u8, 0, 0, 0, 6, 14][..]),
            Record::new("t-0", 2, &b"{\"id\":1}"[..]),
        ];
        assert_eq!(avro_ids(&batch), [5, 6]);
        let (records, bad) = decode(&batch, Format::Avro, |id| (id == 5).then(|| schema.clone()));
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].record.value.as_deref(), Some(&br#"{"id":7}"#[..]));
        assert_eq!(bad.iter().map(|b| b.0).collect::<Vec<_>>(), [1, 2]);
    }
}
