//! `[[transform]]`: the single-message transforms of the pipeline file,
//! each one [`exactly_core::Transform`] run in the source subtasks on JSON
//! values.
//!
//! | `type` | keys | what it does |
//! |---|---|---|
//! | `rename` | `field`, `to` | moves the value at `field` to `to` |
//! | `drop` | `field` | removes `field` |
//! | `insert` | `field`, `value` | sets `field` to a static value |
//! | `header` | `header`, `field` | sets `field` to the header's value (text; `null` when absent or null) |
//! | `route` | `field` | the PostgreSQL sink writes the record to the table of the field's value, as if it were the topic |
//! | `drop-if` | `field`, `equals` | drops records whose `field` equals `equals` (counted) |
//!
//! Fields are JSON pointers (`/id`, `/customer/name`). A record with a null
//! value (a tombstone) passes every transform unchanged except `route`,
//! which needs its field. A value that is not JSON, a `field` under
//! something that is not an object, a `route` field that is missing or not
//! text or a number: an error of the transform, which stops the pipeline
//! naming the transform and the record, or with `on_error = "dead-letter"`
//! skips the record, logged and counted.

use exactly_core::{JsonPointer, OnTransformError, Record, Transform, TransformError};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{ConfigError, SinkSection};

/// One `[[transform]]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformSection {
    /// `rename`, `drop`, `insert`, `header`, `route` or `drop-if`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The JSON pointer the transform reads or writes.
    pub field: Option<String>,
    /// `rename`: where the field goes (a JSON pointer).
    pub to: Option<String>,
    /// `insert`: the value set.
    pub value: Option<toml::Value>,
    /// `header`: the header whose value is set.
    pub header: Option<String>,
    /// `drop-if`: records whose field equals this are dropped.
    pub equals: Option<toml::Value>,
    /// `"fail"` (default) or `"dead-letter"`.
    #[serde(default)]
    pub on_error: OnTransformError,
}

/// The kinds, with the keys each needs besides `field` (every kind needs
/// `field`).
const KINDS: [(&str, &[&str]); 6] = [
    ("rename", &["to"]),
    ("drop", &[]),
    ("insert", &["value"]),
    ("header", &["header"]),
    ("route", &[]),
    ("drop-if", &["equals"]),
];

/// A checked `[[transform]]`, ready to become a core transform.
#[derive(Clone, Debug)]
enum Step {
    Rename { from: JsonPointer, to: JsonPointer },
    Drop(JsonPointer),
    Insert { at: JsonPointer, value: Value },
    Header { header: String, at: JsonPointer },
    Route(JsonPointer),
    DropIf { at: JsonPointer, equals: Value },
}

impl TransformSection {
    /// Checks the table at `transform[index]`; the error names the key and
    /// the fix.
    fn step(&self, index: usize, origin: &str) -> Result<Step, ConfigError> {
        let invalid = |key: &str, problem: String| ConfigError::Invalid {
            path: origin.to_string(),
            key: format!("transform[{index}].{key}"),
            problem,
        };
        let kinds = KINDS.map(|(k, _)| format!("\"{k}\"")).join(", ");
        let Some((kind, needs)) = KINDS.iter().find(|(k, _)| *k == self.kind) else {
            return Err(invalid(
                "type",
                format!("is `{}`, which is not a transform: use one of {kinds}", self.kind),
            ));
        };
        let given = [
            ("to", self.to.is_some()),
            ("value", self.value.is_some()),
            ("header", self.header.is_some()),
            ("equals", self.equals.is_some()),
        ];
        for (key, set) in given {
            if set && !needs.contains(&key) {
                return Err(invalid(
                    key,
                    format!(
                        "does not apply to a `{kind}` transform: remove it (a `{kind}` takes field{})",
                        { needs.iter().map(|n| format!(", {n}")).collect::<String>() }
                    ),
                ));
            }
            if !set && needs.contains(&key) {
                return Err(invalid(key, format!("is missing: a `{kind}` transform needs it")));
            }
        }
        let pointer = |key: &str, text: Option<&String>| -> Result<JsonPointer, ConfigError> {
            let Some(text) = text else {
                return Err(invalid(
                    key,
                    format!("is missing: a `{kind}` transform needs the JSON pointer of a field, e.g. \"/id\""),
                ));
            };
            let p = JsonPointer::parse(text).map_err(|e| invalid(key, e.to_string()))?;
            if p.tokens().is_empty() {
                return Err(invalid(
                    key,
                    "names the whole value: name a field of it, e.g. \"/id\"".into(),
                ));
            }
            Ok(p)
        };
        let json = |key: &str, v: &toml::Value| -> Result<Value, ConfigError> {
            serde_json::to_value(v).map_err(|e| invalid(key, format!("cannot be written as JSON ({e})")))
        };
        let field = pointer("field", self.field.as_ref())?;
        Ok(match *kind {
            "rename" => Step::Rename {
                to: pointer("to", self.to.as_ref())?,
                from: field,
            },
            "drop" => Step::Drop(field),
            "insert" => Step::Insert {
                at: field,
                value: json("value", self.value.as_ref().expect("checked"))?,
            },
            "header" => Step::Header {
                header: self.header.clone().expect("checked"),
                at: field,
            },
            "route" => Step::Route(field),
            _ => Step::DropIf {
                at: field,
                equals: json("equals", self.equals.as_ref().expect("checked"))?,
            },
        })
    }
}

/// Checks every `[[transform]]` against the sink: a `route` needs the
/// PostgreSQL sink with a table per topic.
pub(super) fn check(transforms: &[TransformSection], sink: &SinkSection, origin: &str) -> Result<(), ConfigError> {
    for (i, t) in transforms.iter().enumerate() {
        if let Step::Route(_) = t.step(i, origin)? {
            let per_topic = match sink {
                SinkSection::Postgres(p) => p.table.contains("${topic}") || !p.tables.is_empty(),
                _ => false,
            };
            if !per_topic {
                return Err(ConfigError::Invalid {
                    path: origin.to_string(),
                    key: format!("transform[{i}].type"),
                    problem: "is `route`, which chooses a table of the PostgreSQL sink, and the sink has no table \
                              per topic. Fix: set sink.postgres.table = \"${topic}\" (the field's value takes the \
                              topic's place) and/or sink.postgres.tables = { value = \"table\" }, or remove the \
                              transform"
                        .into(),
                });
            }
        }
    }
    Ok(())
}

/// The core transforms of the file's `[[transform]]` list, in order.
pub(super) fn build(transforms: &[TransformSection], origin: &str) -> Result<Vec<Transform>, ConfigError> {
    transforms
        .iter()
        .enumerate()
        .map(|(i, t)| Ok(transform(i, t.step(i, origin)?).on_error(t.on_error)))
        .collect()
}

/// The core transform of `step`, named `transform[i] <what it does>` (the
/// name is its identity in the fingerprint).
fn transform(i: usize, step: Step) -> Transform {
    match step {
        Step::Rename { from, to } => Transform::map(format!("transform[{i}] rename {from} to {to}"), move |r| {
            edit(r, |object| {
                if let Some(value) = remove(object, &from)? {
                    set(object, &to, value)?;
                }
                Ok(())
            })
        }),
        Step::Drop(at) => Transform::map(format!("transform[{i}] drop {at}"), move |r| {
            edit(r, |object| remove(object, &at).map(drop))
        }),
        Step::Insert { at, value } => Transform::map(format!("transform[{i}] insert {at} = {value}"), move |r| {
            let value = value.clone();
            edit(r, |object| set(object, &at, value))
        }),
        Step::Header { header, at } => Transform::map(format!("transform[{i}] header {header} to {at}"), move |r| {
            let value = match r.headers.iter().rev().find(|(name, _)| *name == header) {
                Some((_, Some(bytes))) => Value::String(String::from_utf8_lossy(bytes).into_owned()),
                Some((_, None)) | None => Value::Null,
            };
            edit(r, |object| set(object, &at, value))
        }),
        Step::Route(at) => Transform::map(format!("transform[{i}] route by {at}"), move |mut r| {
            let Some(bytes) = r.value_bytes() else {
                return Err(TransformError::new(format!(
                    "a null value (a tombstone) has no field {at} to route by"
                )));
            };
            let route = match at.find(bytes) {
                Ok(Some(Value::String(s))) => s,
                Ok(Some(Value::Number(n))) => n.to_string(),
                Ok(Some(other)) => {
                    return Err(TransformError::new(format!(
                        "the field {at} to route by is {other}, not text or a number"
                    )))
                }
                Ok(None) => return Err(TransformError::new(format!("the value has no field {at} to route by"))),
                Err(e) => return Err(TransformError::new("the value is not JSON").caused_by(e)),
            };
            r.headers.retain(|(name, _)| name != exactly_postgres::ROUTE_HEADER);
            r.headers
                .push((exactly_postgres::ROUTE_HEADER.to_string(), Some(route.into_bytes())));
            Ok(r)
        }),
        Step::DropIf { at, equals } => Transform::filter(format!("transform[{i}] drop if {at} = {equals}"), move |r| {
            let Some(bytes) = r.value_bytes() else {
                return Ok(true);
            };
            match at.find(bytes) {
                Ok(found) => Ok(!found.is_some_and(|v| same(&v, &equals))),
                Err(e) => Err(TransformError::new("the value is not JSON").caused_by(e)),
            }
        }),
    }
}

/// Equal JSON values, numbers compared by value (`3` equals `3.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64().is_some_and(|x| Some(x) == y.as_f64()),
        _ => a == b,
    }
}

/// Applies `change` to the JSON object of `record`'s value and writes it
/// back; a null value passes unchanged.
fn edit(
    mut record: Record,
    change: impl FnOnce(&mut Map<String, Value>) -> Result<(), TransformError>,
) -> Result<Record, TransformError> {
    let Some(bytes) = record.value_bytes() else {
        return Ok(record);
    };
    let mut value: Value =
        serde_json::from_slice(bytes).map_err(|e| TransformError::new("the value is not JSON").caused_by(e))?;
    let Value::Object(object) = &mut value else {
        return Err(TransformError::new("the value is not a JSON object"));
    };
    change(object)?;
    record.value = Some(serde_json::to_vec(&value).expect("a JSON value serializes").into());
    Ok(record)
}

/// The object holding the last token of `at`, if the path to it is there.
fn parent<'a>(
    object: &'a mut Map<String, Value>,
    at: &JsonPointer,
) -> Result<Option<&'a mut Map<String, Value>>, TransformError> {
    let tokens = at.tokens();
    let mut current = object;
    for token in &tokens[..tokens.len() - 1] {
        match current.get_mut(token) {
            None => return Ok(None),
            Some(Value::Object(inner)) => current = inner,
            Some(_) => {
                return Err(TransformError::new(format!(
                    "{at} goes through `{token}`, which is not a JSON object"
                )))
            }
        }
    }
    Ok(Some(current))
}

/// Removes the field at `at`: its value, `None` when it is not there.
fn remove(object: &mut Map<String, Value>, at: &JsonPointer) -> Result<Option<Value>, TransformError> {
    let last = at.tokens().last().expect("checked non-empty");
    Ok(parent(object, at)?.and_then(|p| p.remove(last)))
}

/// Sets the field at `at`, creating the objects on its way.
fn set(object: &mut Map<String, Value>, at: &JsonPointer, value: Value) -> Result<(), TransformError> {
    let tokens = at.tokens();
    let mut current = object;
    for token in &tokens[..tokens.len() - 1] {
        let next = current
            .entry(token.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(inner) = next else {
            return Err(TransformError::new(format!(
                "{at} goes through `{token}`, which is not a JSON object"
            )));
        };
        current = inner;
    }
    current.insert(tokens[tokens.len() - 1].clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Vec<TransformSection> {
        #[derive(Deserialize)]
        struct File {
            transform: Vec<TransformSection>,
        }
        toml::from_str::<File>(toml_text).unwrap().transform
    }

    fn apply_map(t: &Transform, r: Record) -> Result<Record, String> {
        t.apply(r).map_err(|e| e.to_string()).map(|mut v| v.remove(0))
    }

    fn apply_filter(t: &Transform, r: &Record) -> Result<bool, String> {
        t.apply(r.clone()).map_err(|e| e.to_string()).map(|v| !v.is_empty())
    }

    fn value(r: &Record) -> Value {
        serde_json::from_slice(r.value_bytes().unwrap()).unwrap()
    }

    #[test]
    fn each_kind_does_what_the_table_says() {
        let sections = parse(
            r#"
[[transform]]
type = "rename"
field = "/amount"
to = "/money/total"
[[transform]]
type = "drop"
field = "/internal"
[[transform]]
type = "insert"
field = "/source"
value = { shop = "eu", n = 1 }
[[transform]]
type = "header"
header = "trace"
field = "/trace"
[[transform]]
type = "route"
field = "/region"
[[transform]]
type = "drop-if"
field = "/status"
equals = "test"
"#,
        );
        let ts = build(&sections, "p.toml").unwrap();
        let mut r = Record::new(
            "orders-0",
            7,
            r#"{"amount":3,"internal":true,"region":"eu","status":"paid"}"#.to_string(),
        );
        r.headers.push(("trace".into(), Some(b"t-1".to_vec())));
        for t in &ts[..5] {
            r = apply_map(t, r).unwrap();
        }
        assert_eq!(
            value(&r),
            serde_json::json!({"money":{"total":3},"region":"eu","status":"paid","source":{"shop":"eu","n":1},"trace":"t-1"})
        );
        assert!(r
            .headers
            .contains(&(exactly_postgres::ROUTE_HEADER.to_string(), Some(b"eu".to_vec()))));
        assert!(apply_filter(&ts[5], &r).unwrap());
        let test = Record::new("orders-0", 8, r#"{"status":"test"}"#.to_string());
        assert!(!apply_filter(&ts[5], &test).unwrap());
        // Tombstones pass, except through a route.
        let tombstone = Record::tombstone("orders-0", 9);
        assert_eq!(apply_map(&ts[0], tombstone.clone()).unwrap(), tombstone);
        assert!(apply_filter(&ts[5], &tombstone).unwrap());
        assert_eq!(ts[4].name(), "transform[4] route by /region");
        let e = apply_map(&ts[4], tombstone).unwrap_err();
        assert!(e.contains("no field /region to route by"), "{e}");
        let e = apply_map(&ts[1], Record::new("orders-0", 10, "not json")).unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
    }

    #[test]
    fn bad_tables_name_the_key_and_the_fix() {
        let cases = [
            ("type = \"upper\"\nfield = \"/a\"", "transform[0].type", "\"rename\""),
            ("type = \"rename\"\nfield = \"/a\"", "transform[0].to", "is missing"),
            (
                "type = \"drop\"\nfield = \"/a\"\nto = \"/b\"",
                "transform[0].to",
                "does not apply",
            ),
            ("type = \"drop\"\nfield = \"a\"", "transform[0].field", "start with `/`"),
            ("type = \"drop\"\nfield = \"\"", "transform[0].field", "whole value"),
            ("type = \"drop\"", "transform[0].field", "is missing"),
            ("type = \"insert\"\nfield = \"/a\"", "transform[0].value", "is missing"),
        ];
        for (table, key, fix) in cases {
            let sections = parse(&format!("[[transform]]\n{table}\n"));
            let e = build(&sections, "p.toml").unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(fix), "{table}: {e}");
        }
    }
}
