//! The crate's one error type, and what a sink should do with each error.
//!
//! Every message names the problem and the fix.

use std::fmt;

/// What a sink should do with a [`FormatError`] (see
/// [`FormatError::class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// This record cannot be decoded (not the format, a payload that does
    /// not match its schema): a dead letter, or a stop, as the sink is
    /// configured. Retrying does not help.
    Record,
    /// The configuration is wrong: stop the pipeline with the message.
    Config,
}

/// A record that cannot be decoded, or a configuration that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The bytes are not JSON.
    #[error("{what} is not JSON: {source}. Fix: {fix}")]
    NotJson {
        /// `the value`, `the key`.
        what: &'static str,
        /// The parser's complaint (line, column).
        #[source]
        source: serde_json::Error,
        /// What to configure instead.
        fix: &'static str,
    },

    /// JSON of the wrong shape for the configured format.
    #[error("{what} {problem}. Fix: {fix}")]
    Shape {
        /// `the value`, `the key`, `the Debezium event`.
        what: &'static str,
        /// What is wrong, e.g. `has no "schema"/"payload" wrapper`.
        problem: String,
        /// What to configure or change.
        fix: String,
    },

    /// A Kafka Connect schema (the wrapper's `schema`, or one derived from
    /// an Avro schema) that cannot be understood, or a payload that does not
    /// match it.
    #[error("schema problem at {path}: {problem}. Fix: {fix}")]
    Schema {
        /// Where in the schema or payload (`after.price`).
        path: String,
        /// What is wrong.
        problem: String,
        /// How to fix it.
        fix: &'static str,
    },

    /// The format's settings cannot work.
    #[error("{key}: {problem}. Fix: {fix}")]
    Config {
        /// The setting (`registry.ca_file`).
        key: String,
        /// What is wrong.
        problem: String,
        /// How to fix it.
        fix: String,
        /// The underlying error (an unreadable file, ...).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl FormatError {
    /// What a sink should do with this error; see [`ErrorClass`].
    pub fn class(&self) -> ErrorClass {
        match self {
            FormatError::Config { .. } => ErrorClass::Config,
            FormatError::NotJson { .. } | FormatError::Shape { .. } | FormatError::Schema { .. } => ErrorClass::Record,
        }
    }

    /// A [`FormatError::Config`] without a cause (for a sink's settings of
    /// a format).
    pub fn config(key: impl Into<String>, problem: impl fmt::Display, fix: impl fmt::Display) -> FormatError {
        FormatError::Config {
            key: key.into(),
            problem: problem.to_string(),
            fix: fix.to_string(),
            source: None,
        }
    }

    /// A [`FormatError::Shape`].
    pub(crate) fn shape(what: &'static str, problem: impl fmt::Display, fix: impl fmt::Display) -> FormatError {
        FormatError::Shape {
            what,
            problem: problem.to_string(),
            fix: fix.to_string(),
        }
    }

    /// A [`FormatError::Schema`].
    pub(crate) fn schema(path: impl fmt::Display, problem: impl fmt::Display, fix: &'static str) -> FormatError {
        FormatError::Schema {
            path: path.to_string(),
            problem: problem.to_string(),
            fix,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_names_a_fix_and_a_class() {
        let shape = FormatError::shape("the Debezium event", "has no \"op\"", "read a Debezium topic");
        assert_eq!(shape.class(), ErrorClass::Record);
        assert!(shape.to_string().contains("Fix:"), "{shape}");
        let config = FormatError::config("format", "unknown", "write \"debezium\"");
        assert_eq!(config.class(), ErrorClass::Config);
    }
}
