//! Which table a record goes to: one table, or one per topic (`table =
//! "${topic}"`, a template, and/or `tables = { topic = "table" }`, a map).
//! Pure: resolving a topic to a table name needs no connection.

use std::collections::BTreeMap;

use crate::sql::QualifiedName;

/// The placeholder a table template replaces with the record's topic.
pub(crate) const TOPIC_PLACEHOLDER: &str = "${topic}";

/// PostgreSQL's longest identifier (`NAMEDATALEN - 1` bytes); a longer one is
/// silently cut, which could send two topics into one table.
pub(crate) const MAX_IDENTIFIER_BYTES: usize = 63;

/// Where the records of a topic go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Targets {
    /// Every record into `Settings::table` (a `table` without `${topic}` and
    /// no `tables`): the sink as it always was.
    One,
    /// Per topic: the map's table, else the template's.
    ByTopic(ByTopic),
}

/// The table of each topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ByTopic {
    /// `tables`: topic → table.
    pub map: BTreeMap<String, QualifiedName>,
    /// `table`, with or without `${topic}`; `None` when only the map is set.
    pub template: Option<QualifiedName>,
    /// Table names the resolved tables may not take (the commit log, a
    /// configured dead-letter table).
    pub reserved: Vec<QualifiedName>,
    /// `dead_letter_table`, when set: one for every table (else each has
    /// `<table>_dead_letters`).
    pub dead_letters: Option<QualifiedName>,
    /// Suffixes the sink appends to a target's name for its own tables
    /// (`_dead_letters`, `_exactly_staging`), which a target may not end
    /// with, and which must fit in an identifier.
    pub suffixes: Vec<&'static str>,
}

impl ByTopic {
    /// The table of `topic`; the error says why there is none (a topic
    /// outside the map without a template, a name PostgreSQL would cut or
    /// that would collide with the sink's own tables).
    pub(crate) fn resolve(&self, topic: &str) -> Result<QualifiedName, String> {
        let table = match (self.map.get(topic), &self.template) {
            (Some(table), _) => return Ok(table.clone()),
            (None, Some(template)) => fill(template, topic)?,
            (None, None) => {
                return Err(format!(
                    "topic `{topic}` has no table: it is not in sink.postgres.tables and sink.postgres.table is not \
                     set. Fix: add `{topic}` to sink.postgres.tables, or set table = \"${{topic}}\" for the topics \
                     not in the map"
                ))
            }
        };
        self.check(topic, &table)?;
        Ok(table)
    }

    /// A name the template made from `topic` must be one PostgreSQL keeps
    /// as written, in a schema that is not the system's, and not one of the
    /// sink's own tables.
    fn check(&self, topic: &str, table: &QualifiedName) -> Result<(), String> {
        let fix = format!("map the topic to a table of your choosing: sink.postgres.tables.\"{topic}\" = \"...\"");
        let longest = self.suffixes.iter().map(|s| s.len()).max().unwrap_or(0);
        if table.name.len() + longest > MAX_IDENTIFIER_BYTES {
            return Err(format!(
                "topic `{topic}` makes the table name `{}`, which with the sink's suffix `{}` is longer than \
                 PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes (it would be cut, and two topics could share a \
                 table). Fix: {fix}",
                table.name,
                self.suffixes.iter().max_by_key(|s| s.len()).copied().unwrap_or("")
            ));
        }
        if let Some(schema) = &table.schema {
            if schema.len() > MAX_IDENTIFIER_BYTES {
                return Err(format!(
                    "topic `{topic}` makes the schema name `{schema}`, longer than PostgreSQL's \
                     {MAX_IDENTIFIER_BYTES} bytes. Fix: {fix}"
                ));
            }
            if schema.starts_with("pg_") || schema == "information_schema" {
                return Err(format!(
                    "topic `{topic}` makes the schema name `{schema}`, a system schema the sink never writes \
                     into. Fix: {fix}"
                ));
            }
        }
        if let Some(suffix) = self.suffixes.iter().find(|s| table.name.ends_with(*s)) {
            return Err(format!(
                "topic `{topic}` makes the table name `{}`, which ends with `{suffix}` like the sink's own tables \
                 (another topic's could be that very table). Fix: {fix}",
                table.name
            ));
        }
        if let Some(reserved) = self.reserved.iter().find(|r| *r == table) {
            return Err(format!(
                "topic `{topic}` makes the table name `{table}`, which is the sink's table `{reserved}`. Fix: {fix}",
            ));
        }
        Ok(())
    }
}

/// `template` with `${topic}` replaced by `topic` in each part. A topic is
/// one identifier part whatever it holds (a dot in a topic does not make a
/// schema); the sink quotes every identifier it writes.
fn fill(template: &QualifiedName, topic: &str) -> Result<QualifiedName, String> {
    if topic.is_empty() || topic.contains('\0') {
        return Err(format!("topic `{topic}` cannot be part of a table name"));
    }
    Ok(QualifiedName {
        schema: template.schema.as_ref().map(|s| s.replace(TOPIC_PLACEHOLDER, topic)),
        name: template.name.replace(TOPIC_PLACEHOLDER, topic),
    })
}

/// A part of a table name holds `${` other than `${topic}`: a typo such as
/// `${topics}` or `$topic`.
pub(crate) fn unknown_placeholder(text: &str) -> Option<String> {
    let rest = text.replace(TOPIC_PLACEHOLDER, "");
    rest.find("${")
        .map(|at| rest[at..].chars().take_while(|c| *c != '}').collect::<String>() + "}")
        .or_else(|| rest.contains("$topic").then(|| "$topic".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(template: Option<&str>, map: &[(&str, &str)]) -> ByTopic {
        ByTopic {
            map: map
                .iter()
                .map(|(t, n)| (t.to_string(), QualifiedName::parse(n).unwrap()))
                .collect(),
            template: template.map(|t| QualifiedName::parse(t).unwrap()),
            reserved: vec![QualifiedName::parse("exactly_commit_log").unwrap()],
            dead_letters: None,
            suffixes: vec!["_dead_letters", "_exactly_staging"],
        }
    }

    #[test]
    fn a_template_takes_the_topic_as_one_identifier_part() {
        let t = targets(Some("raw_${topic}"), &[]);
        assert_eq!(t.resolve("orders").unwrap().sql(), "\"raw_orders\"");
        // A dot or a dash in the topic stays inside the one quoted part.
        assert_eq!(t.resolve("shop.orders-v2").unwrap().sql(), "\"raw_shop.orders-v2\"");
        let t = targets(Some("sales.${topic}"), &[]);
        assert_eq!(t.resolve("Orders").unwrap().sql(), "\"sales\".\"Orders\"");
        let t = targets(Some("${topic}.events"), &[]);
        assert_eq!(t.resolve("eu").unwrap().sql(), "\"eu\".\"events\"");
        // A quote in a topic (Kafka allows none, but the sink does not rely
        // on it) is doubled by the quoting, never closes the identifier.
        let t = targets(Some("${topic}"), &[]);
        assert_eq!(t.resolve("a\"b").unwrap().sql(), "\"a\"\"b\"");
    }

    #[test]
    fn the_map_wins_over_the_template_and_a_topic_without_either_is_an_error() {
        let t = targets(Some("${topic}"), &[("orders", "sales.orders")]);
        assert_eq!(t.resolve("orders").unwrap().sql(), "\"sales\".\"orders\"");
        assert_eq!(t.resolve("payments").unwrap().sql(), "\"payments\"");
        let t = targets(None, &[("orders", "sales.orders")]);
        let error = t.resolve("payments").unwrap_err();
        assert!(
            error.contains("`payments` has no table") && error.contains("sink.postgres.tables"),
            "{error}"
        );
        // A fixed table beside the map takes the other topics.
        let t = targets(Some("other"), &[("orders", "sales.orders")]);
        assert_eq!(t.resolve("payments").unwrap().sql(), "\"other\"");
    }

    #[test]
    fn names_postgres_would_cut_system_schemas_and_the_sinks_own_tables_are_refused() {
        let t = targets(Some("${topic}"), &[]);
        let long = "t".repeat(MAX_IDENTIFIER_BYTES - "_exactly_staging".len() + 1);
        let error = t.resolve(&long).unwrap_err();
        assert!(error.contains("longer than PostgreSQL's 63 bytes"), "{error}");
        t.resolve(&long[1..]).unwrap();
        for topic in ["orders_dead_letters", "orders_exactly_staging"] {
            let error = t.resolve(topic).unwrap_err();
            assert!(error.contains("like the sink's own tables"), "{error}");
        }
        let error = t.resolve("exactly_commit_log").unwrap_err();
        assert!(error.contains("is the sink's table"), "{error}");
        let t = targets(Some("${topic}.events"), &[]);
        for topic in ["pg_catalog", "information_schema"] {
            let error = t.resolve(topic).unwrap_err();
            assert!(error.contains("system schema"), "{error}");
        }
        // The map is the user's own choice: not checked against the topic.
        let t = targets(None, &[("x", "orders_dead_letters")]);
        t.resolve("x").unwrap();
    }

    #[test]
    fn unknown_placeholders_are_found() {
        assert_eq!(unknown_placeholder("${topic}"), None);
        assert_eq!(unknown_placeholder("a_${topic}_b"), None);
        assert_eq!(unknown_placeholder("${topics}").as_deref(), Some("${topics}"));
        assert_eq!(unknown_placeholder("${partition}_x").as_deref(), Some("${partition}"));
        assert_eq!(unknown_placeholder("$topic").as_deref(), Some("$topic"));
        assert_eq!(unknown_placeholder("plain"), None);
    }
}
