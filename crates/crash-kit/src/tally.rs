//! Counting what a sink holds against the inputs: every input exactly
//! once, and when not, the first record missing or duplicated.

use std::collections::{HashMap, HashSet};
use std::fmt;

/// What the verifier's records are, compared with the inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tally {
    /// Number of inputs.
    pub inputs: usize,
    /// Number of records the verifier returned.
    pub seen: usize,
    /// Inputs the output does not hold.
    pub missing: usize,
    /// Records beyond the first of each value.
    pub duplicates: usize,
    /// The first input (in input order) the output does not hold.
    pub first_missing: Option<String>,
    /// The first record (in the verifier's order) seen more than once.
    pub first_duplicate: Option<String>,
    /// Records that are no input at all (at most five of them).
    pub unexpected: Vec<String>,
}

impl Tally {
    /// Counts `seen` against `inputs`.
    pub fn of(inputs: &[String], seen: &[String]) -> Tally {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        let mut first_duplicate = None;
        for record in seen {
            let count = counts.entry(record.as_str()).or_default();
            *count += 1;
            if *count == 2 && first_duplicate.is_none() {
                first_duplicate = Some(record.clone());
            }
        }
        let known: HashSet<&str> = inputs.iter().map(String::as_str).collect();
        let mut unexpected: Vec<String> = seen
            .iter()
            .filter(|r| !known.contains(r.as_str()))
            .take(5)
            .cloned()
            .collect();
        unexpected.dedup();
        let mut absent = inputs.iter().filter(|i| !counts.contains_key(i.as_str()));
        let first_missing = absent.next().cloned();
        let missing = first_missing.iter().count() + absent.count();
        Tally {
            inputs: inputs.len(),
            seen: seen.len(),
            missing,
            duplicates: counts.values().map(|c| c - 1).sum(),
            first_missing,
            first_duplicate,
            unexpected,
        }
    }

    /// Every input exactly once, nothing else.
    pub fn is_exact(&self) -> bool {
        self.missing == 0 && self.duplicates == 0 && self.unexpected.is_empty()
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} records for {} inputs: {} missing",
            self.seen, self.inputs, self.missing
        )?;
        if let Some(first) = &self.first_missing {
            write!(f, " (first: `{first}`)")?;
        }
        write!(f, ", {} duplicated", self.duplicates)?;
        if let Some(first) = &self.first_duplicate {
            write!(f, " (first: `{first}`)")?;
        }
        if !self.unexpected.is_empty() {
            write!(f, ", records that are no input: {:?}", self.unexpected)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Tally;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_the_first_missing_and_duplicated_record() {
        let inputs = strings(&["a", "b", "c", "d"]);
        let exact = Tally::of(&inputs, &strings(&["d", "c", "b", "a"]));
        assert!(exact.is_exact(), "{exact}");
        let t = Tally::of(&inputs, &strings(&["a", "d", "a", "d", "d"]));
        assert_eq!((t.missing, t.duplicates), (2, 3));
        assert_eq!(t.first_missing.as_deref(), Some("b"));
        assert_eq!(t.first_duplicate.as_deref(), Some("a"));
        assert!(!t.is_exact());
        assert_eq!(
            t.to_string(),
            "5 records for 4 inputs: 2 missing (first: `b`), 3 duplicated (first: `a`)"
        );
        let t = Tally::of(&inputs, &strings(&["a", "b", "c", "d", "x"]));
        assert_eq!(t.unexpected, strings(&["x"]));
        assert!(!t.is_exact());
    }
}
