//! Client properties under librdkafka's names (`[source.kafka.properties]`,
//! `[sink.kafka.properties]`), shared by the source and the sink: how they
//! are read from a pipeline file, checked, and shown.
//!
//! **One redaction.** Whatever shows a property — `Debug` of either
//! config, an error that names a setting librdkafka refused — goes through
//! [`shown_value`] (or [`RedactedProperties`] for the whole map), so a
//! secret (`sasl.password`, `ssl.key.password`, OAuth client secrets, ...)
//! is `***` everywhere. The values stay plain `String`s rather than
//! `secrecy::SecretString`: which value is secret depends on its key, the
//! map is handed to librdkafka and to `exactly-kafka-wire` as strings, and
//! a map of wrapped values would only move the same key test elsewhere.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::config::{invalid, KafkaConfigError};

/// What `Debug` output and error messages show instead of a secret.
pub(crate) const REDACTED: &str = "***";

/// Whether the librdkafka setting `key` holds a secret (`sasl.password`,
/// `ssl.key.password`, `ssl.key.pem`, OAuth client secrets, ...), which
/// `Debug` output and error messages show as `***`.
pub(crate) fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password") || key.contains("secret") || key == "ssl.key.pem" || key == "sasl.oauthbearer.config"
}

/// `value` of the setting `key` as it may be shown: `***` for a secret.
pub(crate) fn shown_value<'a>(key: &str, value: &'a str) -> &'a str {
    if is_secret_property(key) {
        REDACTED
    } else {
        value
    }
}

/// `properties` for `Debug`, secrets shown as `***`.
pub(crate) struct RedactedProperties<'a>(pub(crate) &'a BTreeMap<String, String>);

impl fmt::Debug for RedactedProperties<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, shown_value(k, v))))
            .finish()
    }
}

/// A librdkafka setting value: librdkafka wants strings, TOML users write numbers too.
struct PropertyValue(String);

impl<'de> Deserialize<'de> for PropertyValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ValueVisitor;

        impl Visitor<'_> for ValueVisitor {
            type Value = PropertyValue;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number or boolean librdkafka setting")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PropertyValue, E> {
                Ok(PropertyValue(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<PropertyValue, E> {
                Ok(PropertyValue(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PropertyValue, E> {
                Ok(PropertyValue(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PropertyValue, E> {
                Ok(PropertyValue(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<PropertyValue, E> {
                Ok(PropertyValue(v.to_string()))
            }
        }

        d.deserialize_any(ValueVisitor)
    }
}

/// Deserializes a `properties` table: strings, numbers and booleans, all
/// kept as strings.
pub(crate) fn de_properties<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let map = BTreeMap::<String, PropertyValue>::deserialize(d)?;
    Ok(map.into_iter().map(|(k, v)| (k, v.0)).collect())
}

/// Extra librdkafka settings: none of `reserved` (setting, what to use
/// instead), which the `owner` (`source`, `sink`) sets itself.
pub(crate) fn check_properties(
    properties: &BTreeMap<String, String>,
    reserved: &[(&str, &str)],
    owner: &str,
) -> Result<(), KafkaConfigError> {
    for (key, value) in properties {
        if let Some((_, fix)) = reserved.iter().find(|(k, _)| k == key) {
            return invalid(
                format!("properties.\"{key}\""),
                format!("is set by the {owner} and cannot be overridden: {fix}"),
            );
        }
        if key.trim().is_empty() || value.contains('\0') {
            return invalid(format!("properties.\"{key}\""), "is not a valid librdkafka setting");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_shown_as_stars_and_the_rest_as_is() {
        for secret in [
            "sasl.password",
            "ssl.key.password",
            "SSL.Keystore.Password",
            "ssl.key.pem",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
        ] {
            assert_eq!(shown_value(secret, "hunter2"), "***", "{secret}");
        }
        for plain in ["sasl.username", "security.protocol", "ssl.ca.location", "linger.ms"] {
            assert_eq!(shown_value(plain, "visible"), "visible", "{plain}");
        }
        let properties = BTreeMap::from([
            ("sasl.password".to_string(), "hunter2".to_string()),
            ("sasl.username".to_string(), "ada".to_string()),
        ]);
        let text = format!("{:?}", RedactedProperties(&properties));
        assert_eq!(text, r#"{"sasl.password": "***", "sasl.username": "ada"}"#);
    }
}
