//! The name of a source split, shared by every record read from it.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The name of a split (`orders-3`), immutable and cheap to clone: a source
/// builds it once per split and every record of the split shares it, so
/// reading a record allocates nothing for its split. Reads as a `&str`
/// (`Deref`), compares with strings, and serializes as a plain string.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SplitName(Arc<str>);

impl SplitName {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether both are the same allocation (clones are): lets sources
    /// check that they share names instead of building one per record.
    pub fn shares_with(&self, other: &SplitName) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Deref for SplitName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SplitName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SplitName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SplitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SplitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for SplitName {
    fn from(s: &str) -> Self {
        SplitName(Arc::from(s))
    }
}

impl From<String> for SplitName {
    fn from(s: String) -> Self {
        SplitName(Arc::from(s))
    }
}

impl From<&String> for SplitName {
    fn from(s: &String) -> Self {
        SplitName(Arc::from(s.as_str()))
    }
}

impl From<SplitName> for String {
    fn from(s: SplitName) -> Self {
        s.0.to_string()
    }
}

impl PartialEq<str> for SplitName {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for SplitName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for SplitName {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl Serialize for SplitName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SplitName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(SplitName::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_name_and_compare_as_strings() {
        let a = SplitName::from("orders-3");
        let b = a.clone();
        assert!(a.shares_with(&b), "a clone allocates nothing");
        assert!(!a.shares_with(&SplitName::from("orders-3")), "equal but built twice");
        assert_eq!(a, "orders-3");
        assert_eq!(a, "orders-3".to_string());
        assert_eq!(a.rsplit_once('-'), Some(("orders", "3")));
        assert_eq!(format!("{a} {a:?}"), "orders-3 \"orders-3\"");
    }

    #[test]
    fn serializes_as_a_plain_string() {
        let a = SplitName::from("t-0");
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"t-0\"");
        assert_eq!(serde_json::from_str::<SplitName>(&json).unwrap(), a);
    }
}
