//! Transaction names, in two forms:
//!
//! - **Transaction ids** ([`TransactionNames::new`]), for stores that name
//!   transactions (PostgreSQL gids, Kafka transactional ids):
//!   `exactly:<part>:…:<subtask>:<checkpoint>`. In the parts `%`, `:` and
//!   `~` are percent-escaped.
//! - **Keys** ([`TransactionNames::for_keys`]), for object keys and file
//!   names: `exactly.<part>.….<subtask>.<checkpoint>` with the subtask
//!   zero-padded to 5 digits and the checkpoint to 20 (every `u64`), so a
//!   listing sorts a subtask's names in checkpoint order. Every byte of a
//!   name is one of `a-z 0-9 . _ -`: safe in S3, GCS and Azure keys without
//!   percent-encoding, in URLs, and in file names on case-insensitive file
//!   systems. In the parts `a-z`, `0-9` and `-` stand for themselves and
//!   every other byte (of the part's UTF-8) is `_` and two lowercase hex
//!   digits: `Orders.v2` → `_4frders_2ev2`. A subtask numbered 100000 or
//!   more takes the digits it needs (its names still parse, and still
//!   sort by checkpoint).
//!
//! In both forms the parts are the pipeline and whatever else scopes the
//! sink's transactions in its store (a table, a topic, a bucket prefix);
//! escaping keeps them from running into each other, so
//! [`TransactionNames::subtask_prefix`] names exactly one subtask's
//! transactions. Checkpoint ids never repeat (see [`CheckpointId`]), so
//! neither do names.
//!
//! Stores limit names (PostgreSQL gids: 199 bytes; file names: 255). When
//! the longest possible name (largest subtask and checkpoint numbers) would
//! be longer than the limit, every part is cut to an equal share of what is
//! left (at most 60 bytes, never inside a character or an escape) and a hash
//! follows the last part: 16 hex digits of SHA-256 over the full parts (NUL
//! between them), as `~<hash>` in ids and as a part `_h<hash>` in keys (no
//! escape starts `_h`). Shortening depends only on the parts, so every name
//! of a subtask keeps the same prefix, and two different sets of parts never
//! share one.

use sha2::{Digest, Sha256};

use crate::record::CheckpointId;

/// Digits of the largest `u64`/`usize`.
const MAX_NUMBER_DIGITS: usize = 20;
/// The most bytes kept of a part when shortening.
const SHORT_PART_BYTES: usize = 60;
/// Digits a key's subtask is padded to.
const KEY_SUBTASK_DIGITS: usize = 5;

/// How names are spelled: separators, escapes and numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `exactly:<parts>:<subtask>:<checkpoint>`.
    Id,
    /// `exactly.<parts>.<subtask:05>.<checkpoint:020>`.
    Key,
}

impl Form {
    fn start(self) -> &'static str {
        match self {
            Form::Id => "exactly:",
            Form::Key => "exactly.",
        }
    }

    fn separator(self) -> char {
        match self {
            Form::Id => ':',
            Form::Key => '.',
        }
    }

    /// The first byte of an escape (`%xx`, `_xx`).
    fn escape_marker(self) -> u8 {
        match self {
            Form::Id => b'%',
            Form::Key => b'_',
        }
    }

    fn escape(self, part: &str) -> String {
        match self {
            Form::Id => escape_id(part),
            Form::Key => escape_key(part),
        }
    }

    /// What follows the shortened parts: `~<hash>` or `.\_h<hash>`.
    fn hash_suffix(self, hash: &str) -> String {
        match self {
            Form::Id => format!("~{hash}"),
            Form::Key => format!("._h{hash}"),
        }
    }

    /// The subtask and checkpoint at the end of a name.
    fn numbers(self, subtask: usize, checkpoint: CheckpointId) -> String {
        match self {
            Form::Id => format!("{subtask}:{checkpoint}"),
            Form::Key => format!("{subtask:0w$}.{:020}", checkpoint.0, w = KEY_SUBTASK_DIGITS),
        }
    }
}

/// The transaction names of one sink (pipeline and scope) in one store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransactionNames {
    /// `exactly:<parts>:` (or its shortened form), `exactly.<parts>.` for keys.
    prefix: String,
    form: Form,
}

/// The escape of a key's part: `a-z 0-9 -` as they are, every other byte
/// `_` and two lowercase hex digits.
fn escape_key(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for b in part.bytes() {
        match b {
            b'a'..=b'z' | b'0'..=b'9' | b'-' => out.push(char::from(b)),
            b => {
                out.push('_');
                out.push_str(&format!("{b:02x}"));
            }
        }
    }
    out
}

fn escape_id(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            '~' => out.push_str("%7E"),
            c => out.push(c),
        }
    }
    out
}

/// The first at most `max` bytes of the escaped part `s`, cut at a
/// character boundary and never inside an escape (`%xx`, `_xx`).
fn truncate(s: &str, max: usize, marker: u8) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let bytes = s.as_bytes();
    if let Some(back) = (1..=2).find(|back| end >= *back && bytes[end - back] == marker) {
        end -= back;
    }
    &s[..end]
}

impl TransactionNames {
    /// The names scoped by `parts` (the pipeline first, e.g.
    /// `[pipeline, table]`), every one at most `max_bytes` long when given.
    ///
    /// Panics when `max_bytes` leaves no room for even a shortened name
    /// (less than about 80 bytes): a programming error of the connector.
    pub fn new(parts: &[&str], max_bytes: Option<usize>) -> TransactionNames {
        TransactionNames::in_form(Form::Id, parts, max_bytes)
    }

    /// The names scoped by `parts` for object keys and file names
    /// (`exactly.<parts>.<subtask:05>.<checkpoint:020>`, only `a-z 0-9 .
    /// _ -`, see the module's docs), every one at most `max_bytes` long
    /// when given (255 for a file name).
    ///
    /// Panics like [`TransactionNames::new`].
    pub fn for_keys(parts: &[&str], max_bytes: Option<usize>) -> TransactionNames {
        TransactionNames::in_form(Form::Key, parts, max_bytes)
    }

    fn in_form(form: Form, parts: &[&str], max_bytes: Option<usize>) -> TransactionNames {
        let start = form.start();
        let sep = form.separator().to_string();
        let escaped: Vec<String> = parts.iter().map(|p| form.escape(p)).collect();
        let joined = escaped.join(&sep);
        let numbers = MAX_NUMBER_DIGITS + 1 + MAX_NUMBER_DIGITS;
        let longest = start.len() + joined.len() + 1 + numbers;
        let Some(max) = max_bytes.filter(|max| longest > *max) else {
            return TransactionNames {
                prefix: format!("{start}{joined}{sep}"),
                form,
            };
        };
        let separators = parts.len().saturating_sub(1);
        let hash_bytes = form.hash_suffix(&"0".repeat(16)).len();
        let room = max
            .checked_sub(start.len() + separators + hash_bytes + 1 + numbers)
            .filter(|room| *room >= parts.len())
            .unwrap_or_else(|| panic!("transaction names of at most {max} bytes leave no room for {parts:?}"));
        let share = (room / parts.len().max(1)).min(SHORT_PART_BYTES);
        let mut hasher = Sha256::new();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                hasher.update([0u8]);
            }
            hasher.update(part.as_bytes());
        }
        let hash = hex::encode(&hasher.finalize()[..8]);
        let cut: Vec<&str> = escaped
            .iter()
            .map(|p| truncate(p, share, form.escape_marker()))
            .collect();
        TransactionNames {
            prefix: format!("{start}{}{}{sep}", cut.join(&sep), form.hash_suffix(&hash)),
            form,
        }
    }

    /// The prefix of every name of every subtask: `exactly:<parts>:`
    /// (keys: `exactly.<parts>.`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The prefix of every name of `subtask`: `exactly:<parts>:<subtask>:`
    /// (keys: `exactly.<parts>.<subtask:05>.`).
    pub fn subtask_prefix(&self, subtask: usize) -> String {
        match self.form {
            Form::Id => format!("{}{subtask}:", self.prefix),
            Form::Key => format!("{}{subtask:0w$}.", self.prefix, w = KEY_SUBTASK_DIGITS),
        }
    }

    /// The name of the transaction of `subtask` for `checkpoint`.
    pub fn name(&self, subtask: usize, checkpoint: CheckpointId) -> String {
        format!("{}{}", self.prefix, self.form.numbers(subtask, checkpoint))
    }

    /// The subtask and checkpoint of one of these names, `None` for any
    /// other name (another pipeline's, another scope's, not a name).
    pub fn parse(&self, name: &str) -> Option<(usize, CheckpointId)> {
        let rest = name.strip_prefix(&self.prefix)?;
        let (subtask, checkpoint) = rest.split_once(self.form.separator())?;
        if !digits(subtask) || !digits(checkpoint) {
            return None;
        }
        Some((subtask.parse().ok()?, CheckpointId(checkpoint.parse().ok()?)))
    }
}

/// Only ASCII digits (`str::parse` also takes a leading `+`).
fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_parts_the_subtask_and_the_checkpoint() {
        let names = TransactionNames::new(&["orders-etl", "public.orders"], Some(199));
        assert_eq!(names.prefix(), "exactly:orders-etl:public.orders:");
        assert_eq!(names.name(3, CheckpointId(42)), "exactly:orders-etl:public.orders:3:42");
        assert_eq!(
            names.parse("exactly:orders-etl:public.orders:3:42"),
            Some((3, CheckpointId(42)))
        );
        assert_eq!(names.parse("exactly:orders-etl:public.orders2:3:42"), None);
        assert_eq!(names.parse("exactly:orders-etl:public.orders:3"), None);
        assert!(names.name(1, CheckpointId(5)).starts_with(&names.subtask_prefix(1)));
        assert!(!names.name(10, CheckpointId(5)).starts_with(&names.subtask_prefix(1)));
    }

    #[test]
    fn separators_are_escaped_so_scopes_never_collide() {
        let a = TransactionNames::new(&["a", "b:1"], None);
        let b = TransactionNames::new(&["a:b", "1"], None);
        assert_ne!(a, b);
        assert_eq!(a.prefix(), "exactly:a:b%3A1:");
        assert_eq!(TransactionNames::new(&["100%~"], None).prefix(), "exactly:100%25%7E:");
    }

    #[test]
    fn long_parts_are_shortened_within_the_limit_and_stay_distinct() {
        for limit in [80, 120, 199] {
            let long = "ü".repeat(100);
            let names = TransactionNames::new(&[&"p".repeat(150), &long], Some(limit));
            let longest = names.name(usize::MAX, CheckpointId(u64::MAX));
            assert!(longest.len() <= limit, "{} > {limit}", longest.len());
            assert!(names.prefix().contains('~'));
            assert_eq!(names.parse(&longest), Some((usize::MAX, CheckpointId(u64::MAX))));
            let other = TransactionNames::new(&[&"p".repeat(150), &format!("{long}x")], Some(limit));
            assert_ne!(names, other, "same first bytes, other parts");
        }
        let fits = TransactionNames::new(&[&"p".repeat(74), &"t".repeat(74)], Some(199));
        assert_eq!(fits.name(usize::MAX, CheckpointId(u64::MAX)).len(), 199);
        assert!(!fits.prefix().contains('~'));
        assert!(TransactionNames::new(&[&"p".repeat(75), &"t".repeat(74)], Some(199))
            .prefix()
            .contains('~'));
    }

    #[test]
    fn keys_use_a_pinned_safe_alphabet() {
        // Pinned: object stores and file sinks already hold names in this
        // form; changing it would orphan their pending objects.
        let names = TransactionNames::for_keys(&["Orders.v2", "s3/prefix:x%_~ü", "a-b"], None);
        assert_eq!(
            names.prefix(),
            "exactly._4frders_2ev2.s3_2fprefix_3ax_25_5f_7e_c3_bc.a-b."
        );
        assert_eq!(
            names.name(3, CheckpointId(42)),
            "exactly._4frders_2ev2.s3_2fprefix_3ax_25_5f_7e_c3_bc.a-b.00003.00000000000000000042"
        );
        let every_byte: String = (1u8..=127).map(char::from).collect::<String>() + "é€";
        let name = TransactionNames::for_keys(&[&every_byte], None).name(usize::MAX, CheckpointId(u64::MAX));
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)),
            "{name}"
        );
        assert_ne!(
            TransactionNames::for_keys(&["A"], None),
            TransactionNames::for_keys(&["a"], None),
            "case-insensitive file systems keep them apart"
        );
        assert_ne!(
            TransactionNames::for_keys(&["a.b", "c"], None),
            TransactionNames::for_keys(&["a", "b.c"], None)
        );
    }

    #[test]
    fn keys_sort_in_checkpoint_order_and_parse_back() {
        let names = TransactionNames::for_keys(&["p"], None);
        let mut listed: Vec<String> = [1u64, 102, 2, 10, u64::MAX]
            .iter()
            .map(|c| names.name(0, CheckpointId(*c)))
            .collect();
        listed.sort();
        let order: Vec<u64> = listed.iter().map(|n| names.parse(n).unwrap().1 .0).collect();
        assert_eq!(order, vec![1, 2, 10, 102, u64::MAX]);
        assert_eq!(
            names.parse(&names.name(123_456, CheckpointId(7))),
            Some((123_456, CheckpointId(7)))
        );
        assert!(names.name(7, CheckpointId(1)).starts_with(&names.subtask_prefix(7)));
        assert!(!names.name(70, CheckpointId(1)).starts_with(&names.subtask_prefix(7)));
        assert_eq!(names.parse("exactly.p.00001.+5"), None);
        assert_eq!(names.parse("exactly.p.00001"), None);
        assert_eq!(TransactionNames::new(&["p"], None).parse("exactly:p:1:+5"), None);
    }

    #[test]
    fn long_keys_fit_a_file_name_and_stay_distinct() {
        let long = "Ü".repeat(200);
        let names = TransactionNames::for_keys(&["pipeline", &long], Some(255));
        let longest = names.name(usize::MAX, CheckpointId(u64::MAX));
        assert!(longest.len() <= 255, "{}", longest.len());
        assert!(names.prefix().contains("._h"), "{}", names.prefix());
        assert_eq!(names.parse(&longest), Some((usize::MAX, CheckpointId(u64::MAX))));
        let other = TransactionNames::for_keys(&["pipeline", &format!("{long}x")], Some(255));
        assert_ne!(names, other);
        // The cut never leaves half an escape.
        for part in names.prefix().split('.') {
            let bytes = part.as_bytes();
            for (i, b) in bytes.iter().enumerate() {
                if *b == b'_' && !part.starts_with("_h") {
                    assert!(i + 2 < bytes.len(), "half an escape in {part}");
                }
            }
        }
    }
}
