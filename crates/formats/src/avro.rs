//! Avro in the Confluent wire format: a magic byte `0`, the writer schema's
//! registry id as a big-endian `u32`, then the datum in Avro's binary
//! encoding. [`frame`] reads the first two; [`AvroSchema::parse`] reads a
//! schema the registry returns (and derives its [`ConnectSchema`], for the
//! sink's columns); [`decode`] turns a datum into its row, with logical
//! types rendered as text (see the crate's `render` module). All pure: fetching a
//! schema by id is [`crate::registry`]'s.

use std::collections::HashMap;

use apache_avro::schema::{Schema, UnionSchema};
use apache_avro::types::Value as Avro;
use base64::Engine;
use serde_json::{Map, Value};

use crate::connect::Row;
use crate::error::FormatError;
use crate::render;
use crate::schema::{ConnectSchema, Field, Logical, SchemaType, TimeUnit};

/// The first byte of every value in the Confluent wire format.
pub const MAGIC: u8 = 0;

const FIX: &str = "write the topic with a Confluent-compatible Avro serializer (KafkaAvroSerializer: magic byte 0, \
                   the schema id, the Avro datum), or set the format the topic is written in";

/// The schema id and the Avro datum of a value in the Confluent wire
/// format.
pub fn frame(value: &[u8]) -> Result<(u32, &[u8]), FormatError> {
    match value {
        [MAGIC, a, b, c, d, datum @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), datum)),
        [MAGIC, ..] => Err(FormatError::shape(
            "the value",
            format!("is {} bytes, too short for the magic byte and a schema id", value.len()),
            FIX,
        )),
        [first, ..] => Err(FormatError::shape(
            "the value",
            format!("starts with byte {first:#04x}, not the wire format's magic byte 0"),
            FIX,
        )),
        [] => Err(FormatError::shape("the value", "is empty", FIX)),
    }
}

/// A writer schema: as Avro reads it, and as the sink's columns see it.
#[derive(Clone, Debug)]
pub struct AvroSchema {
    avro: Schema,
    connect: ConnectSchema,
    /// Named types by full name, for `Ref`s.
    names: HashMap<String, Schema>,
}

impl AvroSchema {
    /// Parses the schema's JSON text (what a registry returns in
    /// `"schema"`). A schema that is not a record has no columns: an error.
    pub fn parse(text: &str) -> Result<AvroSchema, FormatError> {
        let avro = Schema::parse_str(text).map_err(|e| {
            FormatError::schema(
                "the Avro schema",
                format!("it does not parse ({e})"),
                "register a valid Avro schema",
            )
        })?;
        let mut names = HashMap::new();
        collect_names(&avro, &mut names);
        let connect = to_connect(&avro, &names, "the Avro schema", 0)?;
        if connect.kind != SchemaType::Struct {
            return Err(FormatError::schema(
                "the Avro schema",
                format!("it is {}, not a record, so it has no columns", connect.describe()),
                "write records whose value schema is an Avro record",
            ));
        }
        Ok(AvroSchema { avro, connect, names })
    }

    /// The schema as Kafka Connect's model sees it (a struct).
    pub fn connect(&self) -> &ConnectSchema {
        &self.connect
    }
}

/// Decodes `datum` (what follows the schema id) written with `schema`.
pub fn decode(schema: &AvroSchema, datum: &[u8]) -> Result<Row, FormatError> {
    let mut reader = datum;
    let value = apache_avro::reader::datum::GenericDatumReader::builder(&schema.avro)
        .build()
        .and_then(|datum_reader| datum_reader.read_value(&mut reader))
        .map_err(|e| {
            FormatError::schema(
                "the Avro datum",
                format!("it does not decode with its writer schema ({e})"),
                FIX,
            )
        })?;
    if !reader.is_empty() {
        return Err(FormatError::schema(
            "the Avro datum",
            format!("{} bytes are left after the record", reader.len()),
            FIX,
        ));
    }
    match render_avro(&schema.avro, value, &schema.names, "value")? {
        Value::Object(fields) => Ok(Row {
            fields,
            schema: schema.connect.clone(),
        }),
        other => Err(FormatError::schema(
            "value",
            format!("a record decoded as {other}"),
            FIX,
        )),
    }
}

fn collect_names(schema: &Schema, names: &mut HashMap<String, Schema>) {
    match schema {
        Schema::Record(record) => {
            names.insert(record.name.fullname(None), schema.clone());
            for field in &record.fields {
                collect_names(&field.schema, names);
            }
        }
        Schema::Enum(e) => {
            names.insert(e.name.fullname(None), schema.clone());
        }
        Schema::Fixed(f) | Schema::Duration(f) => {
            names.insert(f.name.fullname(None), schema.clone());
        }
        Schema::Array(a) => collect_names(&a.items, names),
        Schema::Map(m) => collect_names(&m.types, names),
        Schema::Union(u) => u.variants().iter().for_each(|v| collect_names(v, names)),
        _ => {}
    }
}

/// How deep named types may nest through references (a recursive schema
/// would otherwise never end).
const MAX_DEPTH: usize = 64;

fn resolve<'a>(schema: &'a Schema, names: &'a HashMap<String, Schema>, path: &str) -> Result<&'a Schema, FormatError> {
    match schema {
        Schema::Ref { name } => names.get(&name.fullname(None)).ok_or_else(|| {
            FormatError::schema(
                path,
                format!("it refers to {}, which the schema does not define", name.fullname(None)),
                "register the schema with its referenced types inline",
            )
        }),
        other => Ok(other),
    }
}

fn to_connect(
    schema: &Schema,
    names: &HashMap<String, Schema>,
    path: &str,
    depth: usize,
) -> Result<ConnectSchema, FormatError> {
    if depth > MAX_DEPTH {
        return Err(FormatError::schema(
            path,
            "the schema nests (or recurses) too deep for columns",
            "use a schema without recursive types",
        ));
    }
    let schema = resolve(schema, names, path)?;
    let logical = |kind: SchemaType, logical: Logical| {
        let mut out = ConnectSchema::of(kind);
        out.logical = Some(logical);
        out
    };
    Ok(match schema {
        Schema::Null => {
            let mut out = ConnectSchema::of(SchemaType::String);
            out.optional = true;
            out
        }
        Schema::Boolean => ConnectSchema::of(SchemaType::Boolean),
        Schema::Int => ConnectSchema::of(SchemaType::Int32),
        Schema::Long => ConnectSchema::of(SchemaType::Int64),
        Schema::Float => ConnectSchema::of(SchemaType::Float32),
        Schema::Double => ConnectSchema::of(SchemaType::Float64),
        Schema::Bytes | Schema::Fixed(_) => ConnectSchema::of(SchemaType::Bytes),
        Schema::String => ConnectSchema::of(SchemaType::String),
        Schema::Enum(e) => {
            let mut out = logical(SchemaType::String, Logical::Enum);
            out.name = Some(e.name.fullname(None));
            out
        }
        Schema::Array(a) => {
            let mut out = ConnectSchema::of(SchemaType::Array);
            out.items = Some(Box::new(to_connect(&a.items, names, &format!("{path}[]"), depth + 1)?));
            out
        }
        Schema::Map(m) => {
            let mut out = ConnectSchema::of(SchemaType::Map);
            out.keys = Some(Box::new(ConnectSchema::of(SchemaType::String)));
            out.values = Some(Box::new(to_connect(
                &m.types,
                names,
                &format!("{path}{{}}"),
                depth + 1,
            )?));
            out
        }
        Schema::Record(record) => {
            let mut out = ConnectSchema::of(SchemaType::Struct);
            out.name = Some(record.name.fullname(None));
            for field in &record.fields {
                let field_path = format!("{path}.{}", field.name);
                let mut schema = to_connect(&field.schema, names, &field_path, depth + 1)?;
                schema.default = field.default.clone();
                out.fields.push(Field {
                    name: field.name.clone(),
                    schema,
                });
            }
            out
        }
        Schema::Union(union) => union_to_connect(union, names, path, depth)?,
        Schema::Decimal(d) => logical(
            SchemaType::Bytes,
            Logical::Decimal {
                scale: u32::try_from(d.scale).ok(),
                precision: u32::try_from(d.precision).ok(),
            },
        ),
        Schema::BigDecimal => logical(
            SchemaType::Bytes,
            Logical::Decimal {
                scale: None,
                precision: None,
            },
        ),
        Schema::Uuid(_) => logical(SchemaType::String, Logical::Uuid),
        Schema::Date => logical(SchemaType::Int32, Logical::Date),
        Schema::TimeMillis => logical(SchemaType::Int32, Logical::Time(TimeUnit::Millis)),
        Schema::TimeMicros => logical(SchemaType::Int64, Logical::Time(TimeUnit::Micros)),
        Schema::TimestampMillis => timestamp(TimeUnit::Millis, true),
        Schema::TimestampMicros => timestamp(TimeUnit::Micros, true),
        Schema::TimestampNanos => timestamp(TimeUnit::Nanos, true),
        Schema::LocalTimestampMillis => timestamp(TimeUnit::Millis, false),
        Schema::LocalTimestampMicros => timestamp(TimeUnit::Micros, false),
        Schema::LocalTimestampNanos => timestamp(TimeUnit::Nanos, false),
        Schema::Duration(_) => logical(SchemaType::Bytes, Logical::Duration),
        Schema::Ref { .. } => unreachable!("resolved above"),
    })
}

fn timestamp(unit: TimeUnit, utc: bool) -> ConnectSchema {
    let mut out = ConnectSchema::of(SchemaType::Int64);
    out.logical = Some(Logical::Timestamp { unit, utc });
    out
}

/// `["null", T]` is an optional `T`; a union of several other types is a
/// [`SchemaType::Union`] of them.
fn union_to_connect(
    union: &UnionSchema,
    names: &HashMap<String, Schema>,
    path: &str,
    depth: usize,
) -> Result<ConnectSchema, FormatError> {
    let nullable = union.variants().iter().any(|v| matches!(v, Schema::Null));
    let others: Vec<&Schema> = union.variants().iter().filter(|v| !matches!(v, Schema::Null)).collect();
    let mut out = match others.as_slice() {
        [] => ConnectSchema::of(SchemaType::String),
        [one] => to_connect(one, names, path, depth + 1)?,
        many => {
            let mut out = ConnectSchema::of(SchemaType::Union);
            for branch in many {
                out.branches.push(to_connect(branch, names, path, depth + 1)?);
            }
            out
        }
    };
    out.optional = nullable;
    Ok(out)
}

fn render_avro(
    schema: &Schema,
    value: Avro,
    names: &HashMap<String, Schema>,
    path: &str,
) -> Result<Value, FormatError> {
    let schema = resolve(schema, names, path)?;
    let out_of_range = |what: &str| FormatError::schema(path, format!("{what} is out of range"), FIX);
    let b64 = |bytes: &[u8]| Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    Ok(match value {
        Avro::Null => Value::Null,
        Avro::Boolean(b) => Value::Bool(b),
        Avro::Int(i) => Value::from(i),
        Avro::Long(l) => Value::from(l),
        Avro::Float(f) => Value::from(f64::from(f)),
        Avro::Double(d) => Value::from(d),
        Avro::Bytes(bytes) | Avro::Fixed(_, bytes) => match schema {
            Schema::Decimal(d) => Value::String(render::decimal_bytes(&bytes, d.scale as u32)),
            _ => b64(&bytes),
        },
        Avro::String(s) | Avro::Enum(_, s) => Value::String(s),
        Avro::Union(index, inner) => {
            let Schema::Union(union) = schema else {
                return Err(FormatError::schema(
                    path,
                    "a union value for a schema that is no union",
                    FIX,
                ));
            };
            let branch = union
                .variants()
                .get(index as usize)
                .ok_or_else(|| FormatError::schema(path, format!("union branch {index} does not exist"), FIX))?;
            render_avro(branch, *inner, names, path)?
        }
        Avro::Array(items) => {
            let Schema::Array(array) = schema else {
                return Err(FormatError::schema(path, "an array for a schema that is no array", FIX));
            };
            Value::Array(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| render_avro(&array.items, v, names, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            )
        }
        Avro::Map(entries) => {
            let Schema::Map(map) = schema else {
                return Err(FormatError::schema(path, "a map for a schema that is no map", FIX));
            };
            let mut sorted: Vec<(String, Avro)> = entries.into_iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = Map::new();
            for (key, v) in sorted {
                let rendered = render_avro(&map.types, v, names, &format!("{path}.{key}"))?;
                out.insert(key, rendered);
            }
            Value::Object(out)
        }
        Avro::Record(fields) => {
            let Schema::Record(record) = schema else {
                return Err(FormatError::schema(
                    path,
                    "a record for a schema that is no record",
                    FIX,
                ));
            };
            let mut out = Map::new();
            for ((name, v), field) in fields.into_iter().zip(&record.fields) {
                let rendered = render_avro(&field.schema, v, names, &format!("{path}.{name}"))?;
                out.insert(name, rendered);
            }
            Value::Object(out)
        }
        Avro::Date(days) => Value::String(render::date(days.into()).ok_or_else(|| out_of_range("a date"))?),
        Avro::Decimal(decimal) => {
            let scale = match schema {
                Schema::Decimal(d) => d.scale as u32,
                _ => 0,
            };
            Value::String(render::decimal(&num_bigint::BigInt::from(decimal), scale))
        }
        Avro::BigDecimal(decimal) => Value::String(decimal.to_string()),
        Avro::TimeMillis(t) => time(t.into(), TimeUnit::Millis, path)?,
        Avro::TimeMicros(t) => time(t, TimeUnit::Micros, path)?,
        Avro::TimestampMillis(t) => stamp(t, TimeUnit::Millis, true, path)?,
        Avro::TimestampMicros(t) => stamp(t, TimeUnit::Micros, true, path)?,
        Avro::TimestampNanos(t) => stamp(t, TimeUnit::Nanos, true, path)?,
        Avro::LocalTimestampMillis(t) => stamp(t, TimeUnit::Millis, false, path)?,
        Avro::LocalTimestampMicros(t) => stamp(t, TimeUnit::Micros, false, path)?,
        Avro::LocalTimestampNanos(t) => stamp(t, TimeUnit::Nanos, false, path)?,
        Avro::Duration(d) => serde_json::json!({
            "months": u32::from(d.months()),
            "days": u32::from(d.days()),
            "millis": u32::from(d.millis()),
        }),
        Avro::Uuid(uuid) => Value::String(uuid.to_string()),
    })
}

fn time(count: i64, unit: TimeUnit, path: &str) -> Result<Value, FormatError> {
    render::time(count, unit)
        .map(Value::String)
        .ok_or_else(|| FormatError::schema(path, "a time of day is out of range", FIX))
}

fn stamp(count: i64, unit: TimeUnit, utc: bool, path: &str) -> Result<Value, FormatError> {
    render::timestamp(count, unit, utc)
        .map(Value::String)
        .ok_or_else(|| FormatError::schema(path, "a timestamp is out of range", FIX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::types::Record;
    use serde_json::json;

    const V1: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"}]}},
        {"name": "billing", "type": ["null", "Customer"], "default": null},
        {"name": "tags", "type": {"type": "array", "items": "string"}}
    ]}"#;

    const V2: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": null}
    ]}"#;

    fn framed(id: u32, datum: Vec<u8>) -> Vec<u8> {
        let mut bytes = vec![MAGIC];
        bytes.extend(id.to_be_bytes());
        bytes.extend(datum);
        bytes
    }

    #[test]
    fn a_framed_record_decodes_to_its_row_with_logical_types_rendered() {
        let schema = AvroSchema::parse(V1).unwrap();
        let mut record = Record::new(&schema.avro).unwrap();
        record.put("id", 7_i64);
        record.put("price", Avro::Decimal(apache_avro::Decimal::from(vec![0xfb_u8, 0x32])));
        record.put(
            "ref",
            Avro::Uuid("8f0c4a52-1a3b-4c5d-9e6f-0a1b2c3d4e5f".parse().unwrap()),
        );
        record.put("at", Avro::TimestampMicros(1_709_214_300_123_456));
        record.put("placed", Avro::TimestampMillis(1_709_214_300_123));
        record.put("day", Avro::Date(19782));
        record.put(
            "customer",
            Avro::Record(vec![("name".into(), Avro::String("Ada".into()))]),
        );
        record.put("billing", Avro::Union(0, Box::new(Avro::Null)));
        record.put("tags", Avro::Array(vec![Avro::String("a".into())]));
        let datum = apache_avro::writer::datum::GenericDatumWriter::builder(&schema.avro)
            .build()
            .unwrap()
            .write_value_to_vec(record)
            .unwrap();
        let bytes = framed(3, datum);
        let (id, datum) = frame(&bytes).unwrap();
        assert_eq!(id, 3);
        let row = decode(&schema, datum).unwrap();
        assert_eq!(
            Value::Object(row.fields),
            json!({"id": 7, "price": "-12.30", "ref": "8f0c4a52-1a3b-4c5d-9e6f-0a1b2c3d4e5f",
                   "at": "2024-02-29T13:45:00.123456Z", "placed": "2024-02-29T13:45:00.123Z",
                   "day": "2024-02-29", "customer": {"name": "Ada"}, "billing": null, "tags": ["a"]})
        );
        let connect = schema.connect();
        assert_eq!(connect.kind, SchemaType::Struct);
        let billing = &connect.field("billing").unwrap().schema;
        assert!(billing.optional && billing.kind == SchemaType::Struct, "{billing:?}");
        assert_eq!(
            connect.field("price").unwrap().schema.logical,
            Some(Logical::Decimal {
                scale: Some(2),
                precision: Some(10)
            })
        );
    }

    #[test]
    fn a_version_that_adds_an_optional_field_is_only_additions() {
        let v1 = AvroSchema::parse(
            r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
            {"name": "id", "type": "long"}]}"#,
        )
        .unwrap();
        let v2 = AvroSchema::parse(V2).unwrap();
        let added = v1.connect().added_fields(v2.connect()).unwrap();
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].name, "note");
        assert!(added[0].schema.optional);
        let mut record = Record::new(&v2.avro).unwrap();
        record.put("id", 8_i64);
        record.put("note", Avro::Union(1, Box::new(Avro::String("gift".into()))));
        let datum = apache_avro::writer::datum::GenericDatumWriter::builder(&v2.avro)
            .build()
            .unwrap()
            .write_value_to_vec(record)
            .unwrap();
        let row = decode(&v2, &datum).unwrap();
        assert_eq!(Value::Object(row.fields), json!({"id": 8, "note": "gift"}));
    }

    #[test]
    fn frames_and_data_that_do_not_fit_are_errors_with_a_fix() {
        for bad in [&b""[..], &[1, 0, 0, 0, 1][..], &[0, 0, 1][..]] {
            let error = frame(bad).unwrap_err();
            assert!(error.to_string().contains("Fix:"), "{error}");
        }
        let schema = AvroSchema::parse(V2).unwrap();
        let error = decode(&schema, &[]).unwrap_err();
        assert!(error.to_string().contains("does not decode"), "{error}");
        let error = decode(&schema, &[2, 0, 9]).unwrap_err();
        assert!(error.to_string().contains("left after"), "{error}");
        assert!(AvroSchema::parse(r#""string""#)
            .unwrap_err()
            .to_string()
            .contains("not a record"));
        assert!(AvroSchema::parse("{").is_err());
    }
}
