//! One pass over a JSON document's bytes: checks it is a document parsing
//! into a [`serde_json::Value`] would accept, and builds only the nodes the
//! wanted pointers name.
//!
//! Why not `serde_json`'s own walk: through its `Deserializer` every string
//! is checked as UTF-8 on its own and every node goes through a visitor;
//! here strings are scanned eight bytes at a time, UTF-8 is checked only
//! where a byte is not ASCII, and the grammar is read by a byte loop. What it accepts is exactly what
//! `serde_json::from_slice::<Value>` accepts: the grammar of RFC 8259,
//! escapes with whole surrogate pairs, numbers whose value `serde_json`
//! finds finite as an `f64` (the few near the limit are handed to it), at
//! most 127 nested arrays and objects. The tests of the parent
//! module hold it to that with random documents.

use serde::de::Error as _;
use serde_json::Value;
use smallvec::SmallVec;

use super::JsonFacts;

/// The pointers followed below a node: on the stack for up to four (no
/// allocation per document or per object for the usual few columns).
pub(super) type Wanted4<'p> = SmallVec<[Wanted<'p>; 4]>;

/// A pointer still being followed: where its answer goes and the tokens
/// left below the current node.
#[derive(Clone, Copy)]
pub(super) struct Wanted<'p> {
    pub slot: usize,
    pub rest: &'p [String],
}

const BILLION: u64 = 1_000_000_000;

/// Nesting `serde_json` refuses: its 128th array or object inside another.
const MAX_DEPTH: usize = 127;

/// Reads one document.
pub(super) struct Scanner<'j, 'f> {
    json: &'j [u8],
    at: usize,
    depth: usize,
    /// What the document holds besides the answers.
    pub facts: JsonFacts,
    found: &'f mut [Option<Value>],
}

type Result<T> = std::result::Result<T, serde_json::Error>;

impl<'j, 'f> Scanner<'j, 'f> {
    /// A scanner of `json` whose answers go to `found` (one slot per pointer).
    pub(crate) fn new(json: &'j [u8], found: &'f mut [Option<Value>]) -> Scanner<'j, 'f> {
        Scanner {
            json,
            at: 0,
            depth: 0,
            facts: JsonFacts::default(),
            found,
        }
    }

    /// Reads the whole document, following `wanted` from its root.
    pub(crate) fn document(&mut self, wanted: &[Wanted<'_>]) -> Result<()> {
        self.value(wanted)?;
        self.skip_whitespace();
        if self.at < self.json.len() {
            return Err(self.error("trailing characters"));
        }
        Ok(())
    }

    fn error(&self, what: &str) -> serde_json::Error {
        serde_json::Error::custom(format_args!("{what} at byte {}", self.at))
    }

    fn peek(&self) -> Option<u8> {
        self.json.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Skips whitespace and the byte `expected`, or names what was wanted.
    fn expect(&mut self, expected: u8, what: &str) -> Result<()> {
        self.skip_whitespace();
        if self.peek() != Some(expected) {
            return Err(self.error(what));
        }
        self.at += 1;
        Ok(())
    }

    /// One value (after whitespace), following `wanted` into it.
    fn value(&mut self, wanted: &[Wanted<'_>]) -> Result<()> {
        self.skip_whitespace();
        let start = self.at;
        if wanted.iter().any(|w| w.rest.is_empty()) {
            // A pointer names this very node: read it, build it once and
            // answer every pointer at or below it from it.
            self.value(&[])?;
            let node = node_value(&self.json[start..self.at])?;
            for w in wanted {
                self.found[w.slot] = super::lookup(&node, w.rest).cloned();
            }
            return Ok(());
        }
        match self.peek() {
            Some(b'{') => self.nested(|s| s.object(wanted)),
            Some(b'[') => self.nested(|s| s.array(wanted)),
            Some(b'"') => self.string().map(drop),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(_) => Err(self.error("expected a JSON value")),
            None => Err(self.error("EOF while parsing a value")),
        }
    }

    /// An array or object, one level deeper.
    fn nested(&mut self, read: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        if self.depth == MAX_DEPTH {
            return Err(self.error("recursion limit exceeded"));
        }
        self.depth += 1;
        self.at += 1;
        read(self)?;
        self.depth -= 1;
        Ok(())
    }

    /// Whether the container just opened ends at once (its `close` is
    /// next, and is read).
    fn closes_at_once(&mut self, close: u8) -> bool {
        self.skip_whitespace();
        let empty = self.peek() == Some(close);
        self.at += usize::from(empty);
        empty
    }

    /// After a member of a container: `,` (another follows: true) or its
    /// `close` (it ends: false).
    fn another(&mut self, close: u8, what: &str) -> Result<bool> {
        self.skip_whitespace();
        match self.peek() {
            Some(b',') => {
                self.at += 1;
                Ok(true)
            }
            Some(b) if b == close => {
                self.at += 1;
                Ok(false)
            }
            _ => Err(self.error(what)),
        }
    }

    /// The members of an object whose `{` was read.
    fn object(&mut self, wanted: &[Wanted<'_>]) -> Result<()> {
        if self.closes_at_once(b'}') {
            return Ok(());
        }
        let mut below = Wanted4::new();
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a string key"));
            }
            let key_start = self.at;
            let escaped = self.string()?;
            below.clear();
            if !wanted.is_empty() {
                let key = &self.json[key_start + 1..self.at - 1];
                let decoded;
                let key: &[u8] = if escaped {
                    decoded = serde_json::from_slice::<String>(&self.json[key_start..self.at])?;
                    decoded.as_bytes()
                } else {
                    key
                };
                for w in wanted.iter().filter(|w| w.rest[0].as_bytes() == key) {
                    // The last occurrence of a repeated key wins, as in `Value`.
                    self.found[w.slot] = None;
                    below.push(Wanted {
                        slot: w.slot,
                        rest: &w.rest[1..],
                    });
                }
            }
            self.expect(b':', "expected `:`")?;
            self.value(&below)?;
            if !self.another(b'}', "expected `,` or `}`")? {
                return Ok(());
            }
        }
    }

    /// The elements of an array whose `[` was read.
    fn array(&mut self, wanted: &[Wanted<'_>]) -> Result<()> {
        if self.closes_at_once(b']') {
            return Ok(());
        }
        let mut below = Wanted4::new();
        let mut index = 0usize;
        loop {
            below.clear();
            below.extend(
                wanted
                    .iter()
                    .filter(|w| super::array_index(&w.rest[0]) == Some(index))
                    .map(|w| Wanted {
                        slot: w.slot,
                        rest: &w.rest[1..],
                    }),
            );
            self.value(&below)?;
            if !self.another(b']', "expected `,` or `]`")? {
                return Ok(());
            }
            index += 1;
        }
    }

    /// A string whose `"` is next; whether it held an escape.
    fn string(&mut self) -> Result<bool> {
        self.at += 1;
        let mut escaped = false;
        loop {
            self.at = plain_end(self.json, self.at);
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    self.at += 1;
                    self.escape()?;
                }
                Some(lead @ 0x80..) => self.non_ascii(lead)?,
                Some(_) => return Err(self.error("control character in a string")),
                None => return Err(self.error("EOF while parsing a string")),
            }
        }
    }

    /// One UTF-8 encoded character whose first byte `lead` is next.
    fn non_ascii(&mut self, lead: u8) -> Result<()> {
        let width = match lead {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => 0,
        };
        match self.json.get(self.at..self.at + width) {
            // `from_utf8` refuses overlong forms, surrogates and values
            // past U+10FFFF.
            Some(char) if width > 0 && std::str::from_utf8(char).is_ok() => {
                self.at += width;
                Ok(())
            }
            _ => Err(self.error("invalid UTF-8")),
        }
    }

    /// The escape after a `\`.
    fn escape(&mut self) -> Result<()> {
        let Some(b) = self.peek() else {
            return Err(self.error("EOF while parsing a string"));
        };
        self.at += 1;
        match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(()),
            b'u' => {
                let unit = self.hex4()?;
                match unit {
                    0 => self.facts.nul_escape = true,
                    0xDC00..=0xDFFF => return Err(self.error("lone trailing surrogate in a \\u escape")),
                    0xD800..=0xDBFF => {
                        if self.json.get(self.at..self.at + 2) != Some(b"\\u") {
                            return Err(self.error("lone leading surrogate in a \\u escape"));
                        }
                        self.at += 2;
                        if !(0xDC00..=0xDFFF).contains(&self.hex4()?) {
                            return Err(self.error("lone leading surrogate in a \\u escape"));
                        }
                    }
                    _ => {}
                }
                Ok(())
            }
            _ => Err(self.error("invalid escape")),
        }
    }

    /// Four hex digits of a `\u` escape.
    fn hex4(&mut self) -> Result<u16> {
        let Some(digits) = self.json.get(self.at..self.at + 4) else {
            return Err(self.error("EOF while parsing a \\u escape"));
        };
        let mut unit = 0u16;
        for &d in digits {
            let Some(v) = (d as char).to_digit(16) else {
                return Err(self.error("invalid \\u escape"));
            };
            unit = unit << 4 | v as u16;
        }
        self.at += 4;
        Ok(unit)
    }

    /// A number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    /// whose value is finite as an `f64`.
    fn number(&mut self) -> Result<()> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.error("invalid number")),
        }
        let integer_digits = self.at - start - usize::from(self.json[start] == b'-');
        let mut fraction_digits = 0;
        if self.peek() == Some(b'.') {
            self.at += 1;
            let fraction = self.at;
            self.some_digits()?;
            fraction_digits = self.at - fraction;
        }
        let mut exponent = None;
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            let negative = match self.peek() {
                Some(sign @ (b'+' | b'-')) => {
                    self.at += 1;
                    sign == b'-'
                }
                _ => false,
            };
            let digits = self.at;
            self.some_digits()?;
            let magnitude = self.json[digits..self.at]
                .iter()
                .fold(0i64, |e, d| e.saturating_mul(10).saturating_add(i64::from(d - b'0')));
            exponent = Some(if negative { -magnitude } else { magnitude });
        }
        // The digits after the decimal point PostgreSQL's `numeric` would
        // keep (its display scale).
        // An exponent of a billion or more is out of `numeric`'s range
        // whatever the digits (`0e2000000000` is 0 to `serde_json`): the
        // largest scale stands for it.
        let scale = match exponent {
            Some(e) if e.unsigned_abs() >= BILLION => u64::MAX,
            _ => u64::try_from((fraction_digits as i64).saturating_sub(exponent.unwrap_or(0))).unwrap_or(0),
        };
        self.facts.max_scale = self.facts.max_scale.max(scale);
        // Without an exponent, fewer than 309 integer digits are below
        // f64::MAX (1.8e308), however many decimals follow: finite. The
        // rest is read by `serde_json` itself, whose rounding near f64::MAX
        // differs from an exactly rounded parse (an integer out of the i64
        // and u64 ranges becomes an f64 too).
        if exponent.is_none() && integer_digits <= 308 {
            return Ok(());
        }
        match serde_json::from_slice::<Value>(&self.json[start..self.at]) {
            Ok(_) => Ok(()),
            Err(_) => Err(serde_json::Error::custom(format_args!(
                "number out of range at byte {start}"
            ))),
        }
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    /// One digit or more.
    fn some_digits(&mut self) -> Result<()> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.error("invalid number"));
        }
        self.digits();
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Result<()> {
        if self.json.get(self.at..self.at + word.len()) != Some(word) {
            return Err(self.error("expected a JSON value"));
        }
        self.at += word.len();
        Ok(())
    }
}

/// Where the plain part of a string that goes on at `at` ends: the first
/// byte that is `"`, `\\`, a control character (below 0x20) or not ASCII,
/// or the end. Eight bytes at a time: each test below marks the high bit of
/// the first byte that matches it exactly (a borrow can only mark bytes
/// after it), so the lowest mark of their union is the first such byte.
fn plain_end(json: &[u8], mut at: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |w: u64| w.wrapping_sub(ONES) & !w & HIGH;
    while let Some(chunk) = json.get(at..at + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let marks = zero_byte(w ^ (ONES * b'"' as u64))
            | zero_byte(w ^ (ONES * b'\\' as u64))
            | (w.wrapping_sub(ONES * 0x20) & !w & HIGH)
            | (w & HIGH);
        if marks != 0 {
            return at + (marks.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + json[at..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || !(0x20..0x80).contains(&b))
        .unwrap_or(json.len() - at)
}

/// The value of a node the scanner has checked: small integers directly,
/// the rest through `serde_json`.
fn node_value(text: &[u8]) -> Result<Value> {
    if !text.is_empty()
        && text.len() <= 18
        && text
            .iter()
            .enumerate()
            .all(|(i, b)| b.is_ascii_digit() || (i == 0 && *b == b'-'))
    {
        let text = std::str::from_utf8(text).expect("ASCII");
        match text.parse::<i64>() {
            // `serde_json` reads `-0` as the float -0.0.
            Ok(0) if text.starts_with('-') => {}
            Ok(n) => return Ok(Value::from(n)),
            Err(_) => {}
        }
    }
    serde_json::from_slice(text)
}
