//! Transaction names: `exactly:<part>:…:<subtask>:<checkpoint>`, where the
//! parts are the pipeline and whatever else scopes the sink's transactions
//! in its store (a table, a topic).
//!
//! In the parts `%`, `:` and `~` are percent-escaped, so the parts cannot
//! run into each other and `exactly:<parts>:<subtask>:` is a prefix naming
//! exactly one subtask's transactions. Checkpoint ids never repeat (see
//! [`CheckpointId`]), so neither do names.
//!
//! Stores limit names (PostgreSQL gids: 199 bytes). When the longest
//! possible name (largest subtask and checkpoint numbers) would be longer
//! than the limit, every part is cut to an equal share of what is left
//! (at most 60 bytes, on a character boundary) and `~<hash>` is appended
//! after the last part: 16 hex digits of SHA-256 over the full parts (NUL
//! between them). Shortening depends only on the parts, so every name of a
//! subtask keeps the same prefix, and two different sets of parts never
//! share one.

use sha2::{Digest, Sha256};

use crate::record::CheckpointId;

/// Digits of the largest `u64`/`usize`.
const MAX_NUMBER_DIGITS: usize = 20;
/// The most bytes kept of a part when shortening.
const SHORT_PART_BYTES: usize = 60;
/// `~` and 16 hex digits.
const HASH_BYTES: usize = 17;
const START: &str = "exactly:";

/// The transaction names of one sink (pipeline and scope) in one store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransactionNames {
    /// `exactly:<parts>:` (or its shortened form).
    prefix: String,
}

fn escape(part: &str) -> String {
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

/// The first at most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
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
        let escaped: Vec<String> = parts.iter().map(|p| escape(p)).collect();
        let joined = escaped.join(":");
        let numbers = MAX_NUMBER_DIGITS + 1 + MAX_NUMBER_DIGITS;
        let longest = START.len() + joined.len() + 1 + numbers;
        let Some(max) = max_bytes.filter(|max| longest > *max) else {
            return TransactionNames {
                prefix: format!("{START}{joined}:"),
            };
        };
        let separators = parts.len().saturating_sub(1);
        let room = max
            .checked_sub(START.len() + separators + HASH_BYTES + 1 + numbers)
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
        let cut: Vec<&str> = escaped.iter().map(|p| truncate(p, share)).collect();
        TransactionNames {
            prefix: format!("{START}{}~{hash}:", cut.join(":")),
        }
    }

    /// The prefix of every name of every subtask: `exactly:<parts>:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The prefix of every name of `subtask`: `exactly:<parts>:<subtask>:`.
    pub fn subtask_prefix(&self, subtask: usize) -> String {
        format!("{}{subtask}:", self.prefix)
    }

    /// The name of the transaction of `subtask` for `checkpoint`.
    pub fn name(&self, subtask: usize, checkpoint: CheckpointId) -> String {
        format!("{}{subtask}:{checkpoint}", self.prefix)
    }

    /// The subtask and checkpoint of one of these names, `None` for any
    /// other name (another pipeline's, another scope's, not a name).
    pub fn parse(&self, name: &str) -> Option<(usize, CheckpointId)> {
        let (subtask, checkpoint) = name.strip_prefix(&self.prefix)?.split_once(':')?;
        Some((subtask.parse().ok()?, CheckpointId(checkpoint.parse().ok()?)))
    }
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
}
