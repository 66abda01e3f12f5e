//! JSON pointers (RFC 6901) read straight from a record's raw value.
//!
//! Sinks map columns, keys and fields from JSON pointers such as `/id`. Doing
//! that with `serde_json::from_slice::<Value>` and `Value::pointer` builds the
//! whole document (a map node and a `String` per key) for every record and
//! re-splits the pointer on every lookup. [`JsonPointer`] splits once, and
//! [`JsonPointer::find_all`] walks the bytes once, reading what no pointer
//! reaches without allocating and building only the values the pointers name.
//! The whole document is checked as strictly as parsing it into a `Value`
//! would (UTF-8, escapes, number range, nesting depth), so a malformed value
//! is an error even when the pointed-at part parses; [`validate`] does only
//! that check.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use smallvec::SmallVec;

/// A parsed JSON pointer: `""` (the whole document) or `/token/token...`,
/// with `~1` standing for `/` and `~0` for `~` inside a token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JsonPointer {
    text: String,
    tokens: Vec<String>,
}

/// A text that is not a JSON pointer; says why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a JSON pointer: {problem} (RFC 6901: `/field/0/inner`, `~1` for `/` and `~0` for `~`)")]
pub struct InvalidPointer {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl JsonPointer {
    /// Parses `text`: empty, or `/` followed by tokens separated by `/`.
    pub fn parse(text: &str) -> Result<JsonPointer, InvalidPointer> {
        let invalid = |problem| InvalidPointer {
            text: text.to_string(),
            problem,
        };
        if text.is_empty() {
            return Ok(JsonPointer {
                text: String::new(),
                tokens: Vec::new(),
            });
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(invalid("it must be empty or start with `/`"));
        };
        let tokens = rest
            .split('/')
            .map(|raw| {
                let mut token = String::with_capacity(raw.len());
                let mut chars = raw.chars();
                while let Some(c) = chars.next() {
                    if c != '~' {
                        token.push(c);
                        continue;
                    }
                    match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => return Err(invalid("`~` must be followed by `0` or `1`")),
                    }
                }
                Ok(token)
            })
            .collect::<Result<Vec<String>, InvalidPointer>>()?;
        Ok(JsonPointer {
            text: text.to_string(),
            tokens,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The unescaped tokens (`/a~1b/0` → `["a/b", "0"]`).
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// The value this pointer names in the JSON document `json`: `Ok(None)`
    /// when there is nothing there, an error when `json` is not valid JSON.
    pub fn find(&self, json: &[u8]) -> Result<Option<Value>, serde_json::Error> {
        Ok(JsonPointer::find_all(&[self], json)?.pop().flatten())
    }

    /// What each of `pointers` names in `json`, in order, reading the
    /// document once. Same answers as parsing `json` into a
    /// [`serde_json::Value`] and calling [`Value::pointer`] for each (a key
    /// that repeats counts with its last occurrence); an error when `json` is
    /// not valid JSON.
    pub fn find_all(pointers: &[&JsonPointer], json: &[u8]) -> Result<Vec<Option<Value>>, serde_json::Error> {
        let mut found = vec![None; pointers.len()];
        let wanted: Wanted4<'_> = pointers
            .iter()
            .enumerate()
            .map(|(slot, p)| Wanted { slot, rest: &p.tokens })
            .collect();
        let mut deserializer = serde_json::Deserializer::from_slice(json);
        Walk {
            wanted: &wanted,
            found: &mut found,
        }
        .deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(found)
    }
}

/// Checks that `json` is one JSON document that parsing into a
/// [`serde_json::Value`] would accept, without building it.
pub fn validate(json: &[u8]) -> Result<(), serde_json::Error> {
    JsonPointer::find_all(&[], json).map(drop)
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The pointers followed below a node: on the stack for up to four (no
/// allocation per document or per object for the usual few columns).
type Wanted4<'p> = SmallVec<[Wanted<'p>; 4]>;

/// A pointer still being followed: where its answer goes and the tokens
/// left below the current node.
#[derive(Clone, Copy)]
struct Wanted<'p> {
    slot: usize,
    rest: &'p [String],
}

/// Walks one node for the pointers in `wanted`; writes their answers.
struct Walk<'w, 'p> {
    wanted: &'w [Wanted<'p>],
    found: &'w mut [Option<Value>],
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        // Parts no pointer reaches are still read through `deserialize_any`
        // (not skipped with `IgnoredAny`, which checks less): strings must be
        // UTF-8 with whole surrogate pairs, numbers in range, nesting at most
        // 128 deep, exactly what parsing into a `Value` refuses.
        if self.wanted.iter().any(|w| w.rest.is_empty()) {
            // Some pointer names this very node: build it once and answer
            // every pointer from it.
            let node = Value::deserialize(deserializer)?;
            for w in self.wanted {
                self.found[w.slot] = lookup(&node, w.rest).cloned();
            }
            return Ok(());
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut below = Wanted4::new();
        while let Some(matched) = map.next_key_seed(KeyMatch { wanted: self.wanted })? {
            below.clear();
            for w in self.wanted.iter().filter(|w| Some(w.rest[0].as_str()) == matched) {
                // The last occurrence of a repeated key wins, as in `Value`.
                self.found[w.slot] = None;
                below.push(Wanted {
                    slot: w.slot,
                    rest: &w.rest[1..],
                });
            }
            map.next_value_seed(Walk {
                wanted: &below,
                found: self.found,
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut below = Wanted4::new();
        let mut index = 0usize;
        loop {
            below.clear();
            below.extend(
                self.wanted
                    .iter()
                    .filter(|w| array_index(&w.rest[0]) == Some(index))
                    .map(|w| Wanted {
                        slot: w.slot,
                        rest: &w.rest[1..],
                    }),
            );
            let walk = Walk {
                wanted: &below,
                found: self.found,
            };
            if seq.next_element_seed(walk)?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    // A scalar has nothing below it: the pointers that go deeper find nothing.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Reads a map key without keeping it: the wanted token equal to it, if any.
struct KeyMatch<'w, 'p> {
    wanted: &'w [Wanted<'p>],
}

impl<'de, 'p> DeserializeSeed<'de> for KeyMatch<'_, 'p> {
    type Value = Option<&'p str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<&'p str>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, 'p> Visitor<'de> for KeyMatch<'_, 'p> {
    type Value = Option<&'p str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Option<&'p str>, E> {
        Ok(self
            .wanted
            .iter()
            .map(|w| w.rest[0].as_str())
            .find(|token| *token == key))
    }
}

/// An array index token as RFC 6901 writes it: `0`, or digits without a
/// leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.is_empty() || token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
        return None;
    }
    token.parse().ok()
}

/// `tokens` followed from `node`, like [`Value::pointer`].
fn lookup<'v>(node: &'v Value, tokens: &[String]) -> Option<&'v Value> {
    tokens.iter().try_fold(node, |node, token| match node {
        Value::Object(map) => map.get(token),
        Value::Array(items) => array_index(token).and_then(|i| items.get(i)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn pointer(text: &str) -> JsonPointer {
        JsonPointer::parse(text).expect("valid pointer")
    }

    /// The reference answer: the whole document and `Value::pointer`.
    fn reference(json: &str, pointers: &[&str]) -> Result<Vec<Option<Value>>, ()> {
        let doc: Value = serde_json::from_str(json).map_err(|_| ())?;
        Ok(pointers.iter().map(|p| doc.pointer(p).cloned()).collect())
    }

    fn streamed(json: &str, pointers: &[&str]) -> Result<Vec<Option<Value>>, ()> {
        let parsed: Vec<JsonPointer> = pointers.iter().map(|p| pointer(p)).collect();
        let refs: Vec<&JsonPointer> = parsed.iter().collect();
        JsonPointer::find_all(&refs, json.as_bytes()).map_err(|_| ())
    }

    #[test]
    fn parses_and_unescapes_tokens() {
        assert!(pointer("").tokens().is_empty());
        assert_eq!(pointer("/a~1b/~0c/0").tokens(), ["a/b", "~c", "0"]);
        assert_eq!(pointer("/").tokens(), [""]);
        assert_eq!(pointer("/a/b").as_str(), "/a/b");
        let e = JsonPointer::parse("id").unwrap_err();
        assert!(e.to_string().contains("start with `/`"), "{e}");
        let e = JsonPointer::parse("/a~2").unwrap_err();
        assert!(e.to_string().contains("`~` must be followed"), "{e}");
    }

    #[test]
    fn answers_like_value_pointer() {
        let doc = r#"{"id": 7, "a": {"b": [10, {"c": "x"}, null], "a/b": 1, "~": 2, "": 3},
                      "n": null, "s": "text", "dup": 1, "dup": {"k": 2}}"#;
        let pointers = [
            "", "/id", "/a", "/a/b", "/a/b/0", "/a/b/1/c", "/a/b/2", "/a/b/3", "/a/b/01", "/a/b/+1", "/a/a~1b",
            "/a/~0", "/a/", "/n", "/n/x", "/s/0", "/missing", "/dup", "/dup/k", "/id/x",
        ];
        assert_eq!(streamed(doc, &pointers), reference(doc, &pointers));
        // One at a time gives the same answers as all at once.
        for p in pointers {
            assert_eq!(streamed(doc, &[p]), reference(doc, &[p]), "{p}");
            assert_eq!(
                pointer(p).find(doc.as_bytes()).unwrap(),
                reference(doc, &[p]).unwrap()[0]
            );
        }
    }

    #[test]
    fn a_repeated_key_counts_with_its_last_occurrence() {
        let doc = r#"{"a": {"b": 1}, "a": {"c": 2}}"#;
        assert_eq!(streamed(doc, &["/a/b", "/a/c"]), reference(doc, &["/a/b", "/a/c"]));
        assert_eq!(streamed(doc, &["/a/b"]).unwrap(), vec![None]);
    }

    #[test]
    fn top_level_scalars_and_arrays() {
        for doc in ["5", "\"s\"", "null", "true", "[1, [2, 3]]"] {
            let pointers = ["", "/0", "/1/1", "/x"];
            assert_eq!(streamed(doc, &pointers), reference(doc, &pointers), "{doc}");
        }
    }

    #[test]
    fn parts_no_pointer_reaches_are_checked_as_strictly_as_a_full_parse() {
        let deep = format!("{{\"id\":1,\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
        let shallow = format!("{{\"id\":1,\"x\":{}{}}}", "[".repeat(100), "]".repeat(100));
        let cases: [&[u8]; 7] = [
            b"{\"id\":1,\"x\":\"\xff\"}",
            b"{\"id\":1,\"\xff\":2}",
            br#"{"id":1,"x":"\ud800"}"#,
            br#"{"id":1,"x":"\udc00\ud800"}"#,
            br#"{"id":1,"x":1e400}"#,
            deep.as_bytes(),
            shallow.as_bytes(),
        ];
        for doc in cases {
            let full = serde_json::from_slice::<Value>(doc).map(|v| v.pointer("/id").cloned());
            let ours = pointer("/id").find(doc);
            assert_eq!(
                ours.is_ok(),
                full.is_ok(),
                "{}: {ours:?} vs {full:?}",
                String::from_utf8_lossy(doc)
            );
            assert_eq!(validate(doc).is_ok(), full.is_ok(), "{}", String::from_utf8_lossy(doc));
        }
        assert!(validate(shallow.as_bytes()).is_ok(), "100 levels are fine");
    }

    #[test]
    fn malformed_documents_are_errors_even_past_the_value_found() {
        for doc in [
            r#"{"id": 1, "x": }"#,
            r#"{"id": 1} trailing"#,
            r#"{"id": 1, "s": "bad \q escape"}"#,
            r#"{"id": 1"#,
            "",
            "{\"id\": 1, \"s\": \"raw \u{1} control\"}",
        ] {
            assert!(streamed(doc, &["/id"]).is_err(), "{doc:?}");
            assert!(reference(doc, &["/id"]).is_err(), "{doc:?}");
        }
    }

    /// Small JSON documents whose keys and indexes overlap with the tokens
    /// of [`pointer_text`], with repeated keys written into the text.
    fn document() -> BoxedStrategy<String> {
        let key = prop_oneof![Just("a"), Just("b"), Just("0"), Just(""), Just("a/b"), Just("~")];
        let leaf = prop_oneof![
            Just("null".to_string()),
            any::<i32>().prop_map(|n| n.to_string()),
            Just("\"s\"".to_string()),
            Just("true".to_string()),
            Just("1.5e3".to_string()),
        ];
        leaf.prop_recursive(4, 40, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((key.clone(), inner), 0..4).prop_map(|entries| {
                    let fields: Vec<String> = entries
                        .into_iter()
                        .map(|(k, v)| format!("{}:{v}", serde_json::to_string(k).expect("a key")))
                        .collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        })
        .boxed()
    }

    fn pointer_text() -> BoxedStrategy<String> {
        let token = prop_oneof![
            Just("a"),
            Just("b"),
            Just("0"),
            Just("1"),
            Just(""),
            Just("a~1b"),
            Just("~0"),
            Just("01")
        ];
        prop::collection::vec(token, 0..4)
            .prop_map(|tokens| tokens.iter().map(|t| format!("/{t}")).collect::<String>())
            .boxed()
    }

    proptest! {
        #[test]
        fn any_document_any_pointers_same_answers_as_value_pointer(
            doc in document(),
            pointers in prop::collection::vec(pointer_text(), 1..5),
        ) {
            let refs: Vec<&str> = pointers.iter().map(String::as_str).collect();
            prop_assert_eq!(streamed(&doc, &refs), reference(&doc, &refs), "{}", doc);
        }
    }
}
