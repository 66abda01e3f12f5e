//! SQL text: identifier and literal quoting, table names.

use std::fmt;

/// Quotes an identifier: `"a""b"`.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal; backslashes use the `E''` form so the result does
/// not depend on `standard_conforming_strings`.
pub(crate) fn quote_literal(value: &str) -> String {
    let escaped = value.replace('\'', "''");
    if escaped.contains('\\') {
        format!("E'{}'", escaped.replace('\\', "\\\\"))
    } else {
        format!("'{escaped}'")
    }
}

/// Comma-separated quoted identifiers.
pub(crate) fn ident_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names.into_iter().map(quote_ident).collect::<Vec<_>>().join(", ")
}

/// A table name, optionally schema-qualified. Parts are case-sensitive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QualifiedName {
    pub schema: Option<String>,
    pub name: String,
}

impl QualifiedName {
    /// Parses `name`, `schema.name`, with `"..."` around parts that contain dots
    /// (`""` inside quotes is one `"`).
    pub(crate) fn parse(text: &str) -> Result<QualifiedName, String> {
        let mut parts: Vec<String> = Vec::new();
        let mut current = String::new();
        let mut chars = text.chars().peekable();
        let mut quoted_part = false;
        while let Some(c) = chars.next() {
            match c {
                '"' if current.is_empty() && !quoted_part => {
                    quoted_part = true;
                    loop {
                        match chars.next() {
                            Some('"') if chars.peek() == Some(&'"') => {
                                chars.next();
                                current.push('"');
                            }
                            Some('"') => break,
                            Some(c) => current.push(c),
                            None => return Err("unterminated double quote".into()),
                        }
                    }
                    if !matches!(chars.peek(), None | Some('.')) {
                        return Err("text after a closing double quote".into());
                    }
                }
                '.' => {
                    parts.push(std::mem::take(&mut current));
                    quoted_part = false;
                }
                '\0' => return Err("contains NUL".into()),
                c => current.push(c),
            }
        }
        parts.push(current);
        if parts.iter().any(String::is_empty) {
            return Err("empty name part".into());
        }
        match parts.len() {
            1 => Ok(QualifiedName {
                schema: None,
                name: parts.remove(0),
            }),
            2 => {
                let name = parts.pop().expect("two parts");
                Ok(QualifiedName {
                    schema: parts.pop(),
                    name,
                })
            }
            _ => Err("more than two dot-separated parts".into()),
        }
    }

    /// The same schema, `name` + `suffix`.
    pub(crate) fn with_suffix(&self, suffix: &str) -> QualifiedName {
        QualifiedName {
            schema: self.schema.clone(),
            name: format!("{}{suffix}", self.name),
        }
    }

    /// The quoted form for SQL: `"schema"."name"`.
    pub(crate) fn sql(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote_ident(schema), quote_ident(&self.name)),
            None => quote_ident(&self.name),
        }
    }

    /// A quoted index name derived from the table name (indexes live in the
    /// table's schema).
    pub(crate) fn index_name(&self, suffix: &str) -> String {
        quote_ident(&format!("{}{suffix}", self.name))
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |s: &str| {
            if s.contains('.') || s.starts_with('"') {
                quote_ident(s)
            } else {
                s.to_string()
            }
        };
        match &self.schema {
            Some(schema) => write!(f, "{}.{}", part(schema), part(&self.name)),
            None => f.write_str(&part(&self.name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_with_optional_schema_and_quotes() {
        let plain = QualifiedName::parse("orders").unwrap();
        assert_eq!((plain.schema.as_deref(), plain.name.as_str()), (None, "orders"));
        assert_eq!(plain.sql(), "\"orders\"");
        let qualified = QualifiedName::parse("Sales.Orders").unwrap();
        assert_eq!(qualified.sql(), "\"Sales\".\"Orders\"");
        assert_eq!(qualified.to_string(), "Sales.Orders");
        let dotted = QualifiedName::parse("s.\"a.b\"\"c\"").unwrap();
        assert_eq!(dotted.name, "a.b\"c");
        assert_eq!(dotted.sql(), "\"s\".\"a.b\"\"c\"");
        assert_eq!(QualifiedName::parse(&dotted.to_string()).unwrap(), dotted);
        assert_eq!(qualified.with_suffix("_x").sql(), "\"Sales\".\"Orders_x\"");
        for bad in ["", "a.", ".a", "a.b.c", "\"a", "\"a\"b", "a\0"] {
            assert!(QualifiedName::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn literals_are_quoted_safely() {
        assert_eq!(quote_literal("exactly:p:t:0:1"), "'exactly:p:t:0:1'");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("a\\b'"), "E'a\\\\b'''");
        assert_eq!(ident_list(["a", "b\"c"]), "\"a\", \"b\"\"c\"");
    }
}
