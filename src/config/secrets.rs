//! Secrets kept out of pipeline files: any string value may be written as
//! `{ env = "NAME" }` (the value of an environment variable) or
//! `{ file = "/run/secrets/name" }` (a file's content, without its final
//! line break; a relative path is relative to the pipeline file):
//!
//! ```toml
//! [sink.postgres]
//! url = { env = "ORDERS_PG_URL" }
//!
//! [source.kafka.properties]
//! "sasl.password" = { file = "/run/secrets/kafka-password" }
//! ```
//!
//! They are resolved once, when the file is read. A reference that cannot
//! be resolved is an error naming the key and the variable or file (never
//! a value).

use std::path::Path;

use super::ConfigError;

/// Whether `value` holds a `{ env = … }` or `{ file = … }` anywhere.
pub fn has_references(value: &toml::Value) -> bool {
    match value {
        toml::Value::Table(table) => reference(table).is_some() || table.values().any(has_references),
        toml::Value::Array(items) => items.iter().any(has_references),
        _ => false,
    }
}

/// Replaces every `{ env = … }` / `{ file = … }` in `value` by the string
/// it names. `origin` names the pipeline file in errors, `base` is its
/// folder (for relative file paths).
pub fn resolve(value: &mut toml::Value, origin: &str, base: Option<&Path>) -> Result<(), ConfigError> {
    resolve_at(value, "", origin, base)
}

/// A one-key table naming where a string comes from.
enum Reference<'a> {
    Env(&'a str),
    File(&'a str),
}

fn reference(table: &toml::Table) -> Option<Reference<'_>> {
    if table.len() != 1 {
        return None;
    }
    let (key, value) = table.iter().next()?;
    let text = value.as_str()?;
    match key.as_str() {
        "env" => Some(Reference::Env(text)),
        "file" => Some(Reference::File(text)),
        _ => None,
    }
}

fn resolve_at(value: &mut toml::Value, key: &str, origin: &str, base: Option<&Path>) -> Result<(), ConfigError> {
    let invalid = |problem: String| ConfigError::Invalid {
        path: origin.to_string(),
        key: key.to_string(),
        problem,
    };
    match value {
        toml::Value::Table(table) => {
            let resolved = match reference(table) {
                Some(Reference::Env(name)) => Some(std::env::var(name).map_err(|e| {
                    invalid(match e {
                        std::env::VarError::NotPresent => format!(
                            "reads the environment variable {name}, which is not set; set it for the `exactly` \
                             process, or write the value another way"
                        ),
                        std::env::VarError::NotUnicode(_) => {
                            format!("reads the environment variable {name}, whose value is not UTF-8")
                        }
                    })
                })?),
                Some(Reference::File(file)) => {
                    let path = match base {
                        Some(base) if Path::new(file).is_relative() => base.join(file),
                        _ => Path::new(file).to_path_buf(),
                    };
                    let text = std::fs::read_to_string(&path).map_err(|e| {
                        invalid(format!(
                            "reads the file {}, which cannot be read ({e}); create it or fix the path (relative \
                             paths are relative to the pipeline file)",
                            path.display()
                        ))
                    })?;
                    Some(
                        text.strip_suffix('\n')
                            .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t))
                            .to_string(),
                    )
                }
                None => None,
            };
            if let Some(text) = resolved {
                *value = toml::Value::String(text);
                return Ok(());
            }
            for (name, item) in table.iter_mut() {
                let child = if key.is_empty() {
                    quoted(name)
                } else {
                    format!("{key}.{}", quoted(name))
                };
                resolve_at(item, &child, origin, base)?;
            }
            Ok(())
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                resolve_at(item, &format!("{key}[{i}]"), origin, base)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A key as TOML writes it (`"sasl.password"` in quotes).
fn quoted(name: &str) -> String {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        name.to_string()
    } else {
        format!("\"{name}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(text: &str, base: Option<&Path>) -> Result<toml::Value, ConfigError> {
        let mut value: toml::Value = toml::from_str(text).unwrap();
        resolve(&mut value, "p.toml", base)?;
        Ok(value)
    }

    #[test]
    fn env_and_file_references_become_strings() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "file-secret\n").unwrap();
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::set_var("EXACTLY_SECRETS_TEST_URL", "postgres://u:env-secret@h/d") };
        let value = resolved(
            r#"
[sink.postgres]
url = { env = "EXACTLY_SECRETS_TEST_URL" }
[source.kafka.properties]
"sasl.password" = { file = "pw" }
"sasl.username" = "exactly"
[sink.file]
dir = "out"
"#,
            Some(dir.path()),
        )
        .unwrap();
        assert_eq!(
            value["sink"]["postgres"]["url"].as_str(),
            Some("postgres://u:env-secret@h/d")
        );
        assert_eq!(
            value["source"]["kafka"]["properties"]["sasl.password"].as_str(),
            Some("file-secret")
        );
        assert_eq!(
            value["source"]["kafka"]["properties"]["sasl.username"].as_str(),
            Some("exactly")
        );
        // A one-key table whose value is not a string is left alone.
        assert_eq!(value["sink"]["file"]["dir"].as_str(), Some("out"));
        assert!(!has_references(&value));
    }

    #[test]
    fn unresolvable_references_name_the_key_and_the_source() {
        let e = resolved("[a]\nb = { env = \"EXACTLY_SECRETS_TEST_UNSET\" }\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`a.b`") && e.contains("EXACTLY_SECRETS_TEST_UNSET") && e.contains("not set"),
            "{e}"
        );
        let e = resolved("[p]\n\"sasl.password\" = { file = \"/nonexistent/pw\" }\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("p.\"sasl.password\"") && e.contains("/nonexistent/pw"),
            "{e}"
        );
        let value: toml::Value = toml::from_str("x = [{ env = \"A\" }]").unwrap();
        assert!(has_references(&value));
    }
}
