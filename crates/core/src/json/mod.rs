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

use serde_json::Value;
use smallvec::SmallVec;

mod scan;

use scan::{Scanner, Wanted, Wanted4};

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
        JsonPointer::scan_all(pointers, json).map(|scanned| scanned.found.into_vec())
    }

    /// [`JsonPointer::find_all`], and what else the pass saw.
    pub fn scan_all(pointers: &[&JsonPointer], json: &[u8]) -> Result<Scanned, serde_json::Error> {
        let mut found: Found = pointers.iter().map(|_| None).collect();
        let wanted: Wanted4<'_> = pointers
            .iter()
            .enumerate()
            .map(|(slot, p)| Wanted { slot, rest: &p.tokens })
            .collect();
        let mut scanner = Scanner::new(json, &mut found);
        scanner.document(&wanted)?;
        let facts = scanner.facts;
        Ok(Scanned { found, facts })
    }
}

/// The answers of [`JsonPointer::scan_all`]: on the stack for up to four
/// pointers (no allocation per record for the usual few columns).
pub type Found = SmallVec<[Option<Value>; 4]>;

/// What one pass over a valid JSON document found.
#[derive(Clone, Debug, PartialEq)]
pub struct Scanned {
    /// What each pointer names, in the order they were given (`None`:
    /// nothing there).
    pub found: Found,
    /// What else the pass saw.
    pub facts: JsonFacts,
}

/// What a pass over a valid JSON document saw that a store keeping its
/// text may refuse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JsonFacts {
    /// Whether a string (a key or a value) holds the escape `\u0000`: valid
    /// JSON that PostgreSQL's `jsonb` refuses to store.
    pub nul_escape: bool,
    /// The most digits after the decimal point of any number, once its
    /// exponent is applied (`1.25e-3`: 5; `12e3`: 0; `u64::MAX` for an
    /// exponent of a billion or more): PostgreSQL's `jsonb` stores numbers
    /// as `numeric`, which keeps at most 16,383.
    pub max_scale: u64,
}

/// Checks that `json` is one JSON document that parsing into a
/// [`serde_json::Value`] would accept, without building it.
pub fn validate(json: &[u8]) -> Result<JsonFacts, serde_json::Error> {
    JsonPointer::scan_all(&[], json).map(|scanned| scanned.facts)
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
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

    /// Arrays and objects of `leaf` values nested up to four deep, with
    /// `key` (written JSON strings) as keys; whitespace between tokens.
    fn nested(leaf: BoxedStrategy<String>, key: BoxedStrategy<String>) -> BoxedStrategy<String> {
        leaf.prop_recursive(4, 40, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[ {} ]", items.join(" ,\n"))),
                prop::collection::vec((key.clone(), inner), 0..4).prop_map(|entries| {
                    let fields: Vec<String> = entries.into_iter().map(|(k, v)| format!("{k} :\t{v}")).collect();
                    format!("{{{}}}\r", fields.join(","))
                }),
            ]
        })
        .boxed()
    }

    /// Small JSON documents whose keys and indexes overlap with the tokens
    /// of [`pointer_text`], with repeated keys written into the text, some
    /// keys written with escapes (`\u0061` for `a`, a surrogate pair for
    /// U+1F600) so that decoded keys are compared too.
    fn document() -> BoxedStrategy<String> {
        let key = prop_oneof![
            Just("a"),
            Just("b"),
            Just("0"),
            Just(""),
            Just("a/b"),
            Just("~"),
            Just("é"),
            Just("\u{1F600}")
        ];
        let written_key = (key, any::<bool>()).prop_map(|(key, escaped)| {
            if !escaped {
                return serde_json::to_string(key).expect("a key");
            }
            let units: String = key.encode_utf16().map(|unit| format!("\\u{unit:04x}")).collect();
            format!("\"{units}\"")
        });
        let leaf = prop_oneof![
            Just("null".to_string()),
            any::<i32>().prop_map(|n| n.to_string()),
            Just("\"s\"".to_string()),
            Just("true".to_string()),
            Just("1.5e3".to_string()),
        ];
        nested(leaf.boxed(), written_key.boxed())
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
            Just("01"),
            Just("é"),
            Just("\u{1F600}")
        ];
        prop::collection::vec(token, 0..4)
            .prop_map(|tokens| tokens.iter().map(|t| format!("/{t}")).collect::<String>())
            .boxed()
    }

    #[test]
    fn nesting_is_refused_where_serde_json_refuses_it() {
        for depth in [1, 126, 127, 128, 129] {
            let doc = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let full = serde_json::from_str::<Value>(&doc).is_ok();
            assert_eq!(validate(doc.as_bytes()).is_ok(), full, "{depth} levels");
            let wrapped = format!("{{\"id\":1,\"x\":{doc}}}");
            assert_eq!(
                pointer("/id").find(wrapped.as_bytes()).is_ok(),
                serde_json::from_str::<Value>(&wrapped).is_ok()
            );
        }
    }

    #[test]
    fn numbers_are_checked_like_serde_json_reads_them() {
        for number in [
            "0",
            "-0",
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "1e+",
            "1E-2",
            "-1.5e3",
            "9223372036854775807",
            "9223372036854775808",
            "18446744073709551616",
            "-9223372036854775809",
            "1e308",
            "1e309",
            "-1e400",
            "1e-400",
            &"9".repeat(400),
            "+1",
            "1.5.5",
            "0x10",
            "Infinity",
            "NaN",
            // Near f64::MAX serde_json's rounding differs from an exactly
            // rounded parse: these go to serde_json itself.
            "1.79769313486231597e308",
            "179769313486231597e291",
            "1.7976931348623158e308",
            &format!("17976931348623157{}", "0".repeat(292)),
            &format!("17976931348623157{}", "0".repeat(291)),
            "0e2000000000",
            "1e-2000000000",
        ] {
            let full = serde_json::from_str::<Value>(number);
            assert_eq!(validate(number.as_bytes()).is_ok(), full.is_ok(), "{number}");
            let doc = format!("{{\"n\":{number}}}");
            let ours = pointer("/n").find(doc.as_bytes());
            match serde_json::from_str::<Value>(&doc) {
                Ok(v) => assert_eq!(ours.unwrap().as_ref(), v.pointer("/n"), "{number}"),
                Err(_) => assert!(ours.is_err(), "{number}"),
            }
        }
    }

    #[test]
    fn the_scale_of_numbers_is_reported_as_numeric_would_keep_it() {
        let scale = |doc: &str| validate(doc.as_bytes()).unwrap().max_scale;
        assert_eq!(scale("[1, 2.50, -3.125]"), 3);
        assert_eq!(scale("1.25e-3"), 5);
        assert_eq!(scale("1.25E+1"), 1);
        assert_eq!(scale("12e3"), 0);
        assert_eq!(scale("1e-16384"), 16384);
        assert_eq!(scale(&format!("0.{}", "0".repeat(20_000))), 20_000);
        assert_eq!(scale("0e2000000000"), u64::MAX, "an exponent numeric cannot take");
        assert_eq!(scale("{\"a\": \"1.5\"}"), 0, "strings are not numbers");
    }

    /// Whether valid JSON text holds the escape `\u0000` (backslashes
    /// appear only in strings there, each starting an escape; a key that
    /// repeats counts too, though `Value` keeps only its last occurrence).
    fn holds_nul_escape(json: &[u8]) -> bool {
        let mut i = 0;
        while let Some(at) = json[i..].iter().position(|b| *b == b'\\') {
            let start = i + at;
            if json[start + 1] == b'u' {
                if &json[start + 2..start + 6] == b"0000" {
                    return true;
                }
                i = start + 6;
            } else {
                i = start + 2;
            }
        }
        false
    }

    /// JSON texts that exercise the grammar: escapes (surrogates, `\u0000`),
    /// non-ASCII text, whitespace, numbers of every form.
    fn rich_document() -> BoxedStrategy<String> {
        let string = prop::collection::vec(
            prop_oneof![
                Just("a".to_string()),
                Just("é€😀".to_string()),
                Just("\\n".to_string()),
                Just("\\\"".to_string()),
                Just("\\/".to_string()),
                Just("\\u0041".to_string()),
                Just("\\u0000".to_string()),
                Just("\\ud83d\\ude00".to_string()),
                Just("\\ud800".to_string()),
                Just("\\udc00".to_string()),
                Just("\\ud800\\u0041".to_string()),
                Just("\\x".to_string()),
                Just("\t".to_string()),
            ],
            0..4,
        )
        .prop_map(|parts| format!("\"{}\"", parts.concat()));
        let number = prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| format!("{f:e}")),
            Just("-0".to_string()),
            Just("1e400".to_string()),
            Just("2.5E-3".to_string()),
            Just("123456789012345678901234567890".to_string()),
        ];
        let leaf = prop_oneof![
            string.clone(),
            number,
            Just("true".to_string()),
            Just("false".to_string()),
            Just("null".to_string()),
        ];
        nested(leaf.boxed(), string.boxed())
    }

    /// One byte of `doc` changed: replaced, removed or inserted.
    fn mutated(doc: &str, at: usize, how: u8, byte: u8) -> Vec<u8> {
        let mut bytes = doc.as_bytes().to_vec();
        let at = at % (bytes.len() + 1);
        match how % 3 {
            0 if at < bytes.len() => bytes[at] = byte,
            1 if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => bytes.insert(at, byte),
        }
        bytes
    }

    proptest! {
        #[test]
        fn accepts_exactly_what_serde_json_accepts(
            doc in rich_document(),
            at in any::<usize>(),
            how in any::<u8>(),
            byte in prop::sample::select(b"{}[]\":,\\ -+.eE0123456789tfnu\x00\x01\x7f\xc3\xa9\xff\xc0\xc1\x80\xe0\xed\xf0\xf4\xf5".to_vec()),
        ) {
            for text in [doc.as_bytes().to_vec(), mutated(&doc, at, how, byte)] {
                let full = serde_json::from_slice::<Value>(&text);
                let ours = validate(&text);
                prop_assert_eq!(ours.is_ok(), full.is_ok(), "{} / {:?} vs {:?}", String::from_utf8_lossy(&text), ours, full);
                if let Ok(ours) = ours {
                    prop_assert_eq!(ours.nul_escape, holds_nul_escape(&text), "{}", String::from_utf8_lossy(&text));
                }
            }
        }

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
