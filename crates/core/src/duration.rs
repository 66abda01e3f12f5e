//! Durations in connector configurations, written like `"10s"`, `"500ms"`,
//! `"7days"` (humantime's syntax).
//!
//! The one deserializer of the workspace (the connectors and the `exactly`
//! command use it). Kept instead of `humantime-serde`, which parses with the
//! same `humantime` but answers a bad value with
//! ``invalid value: string "often", expected a duration``: it drops
//! humantime's reason (`unknown time unit "often"`) and shows no example,
//! which this error keeps and gives.

use std::time::Duration;

use serde::{de, Deserialize, Deserializer};

/// Reads a duration written as text, for `#[serde(deserialize_with =
/// "exactly_core::duration::deserialize")]`; the error quotes the text and
/// shows the syntax.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(|e| {
        de::Error::custom(format!(
            "`{text}` is not a duration ({e}); write e.g. \"10s\" or \"500ms\""
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Holder {
        #[serde(deserialize_with = "deserialize")]
        d: Duration,
    }

    #[test]
    fn reads_humantime_text_and_names_bad_values() {
        let h: Holder = serde_json::from_str(r#"{"d": "7days"}"#).unwrap();
        assert_eq!(h.d, Duration::from_secs(7 * 86_400));
        let h: Holder = serde_json::from_str(r#"{"d": "250ms"}"#).unwrap();
        assert_eq!(h.d, Duration::from_millis(250));
        let e = serde_json::from_str::<Holder>(r#"{"d": "often"}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("`often` is not a duration") && e.contains("\"10s\""), "{e}");
    }
}
