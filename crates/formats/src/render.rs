//! How values of logical types are written in a decoded row: text a JSON
//! consumer and PostgreSQL read without knowing the schema.
//!
//! | logical type | rendered |
//! |---|---|
//! | decimal | a string of the exact number, `"-12.30"` (`numeric` reads it) |
//! | date | `"2024-02-29"` |
//! | time | `"13:45:00.123456"` |
//! | timestamp (an instant) | RFC 3339 in UTC, `"2024-02-29T13:45:00.123456Z"` (`timestamptz` reads it) |
//! | local timestamp | `"2024-02-29T13:45:00.123456"` (no zone) |
//! | uuid | `"8f0c…"` |
//! | bytes (not a decimal) | base64 |

use num_bigint::BigInt;

use crate::schema::TimeUnit;

/// `unscaled × 10^-scale` as exact decimal text.
pub(crate) fn decimal(unscaled: &BigInt, scale: u32) -> String {
    let digits = unscaled.magnitude().to_string();
    let sign = if unscaled.sign() == num_bigint::Sign::Minus {
        "-"
    } else {
        ""
    };
    let scale = scale as usize;
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = if digits.len() <= scale {
        format!("{}{digits}", "0".repeat(scale + 1 - digits.len()))
    } else {
        digits
    };
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// The decimal whose unscaled value is big-endian two's complement `bytes`.
pub(crate) fn decimal_bytes(bytes: &[u8], scale: u32) -> String {
    decimal(&BigInt::from_signed_bytes_be(bytes), scale)
}

/// Days since 1970-01-01 as `YYYY-MM-DD`.
pub(crate) fn date(days: i64) -> Option<String> {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)?;
    let date = epoch.checked_add_signed(chrono::TimeDelta::try_days(days)?)?;
    Some(date.format("%Y-%m-%d").to_string())
}

fn split(count: i64, unit: TimeUnit) -> (i64, u32) {
    let per_second: i64 = match unit {
        TimeUnit::Millis => 1_000,
        TimeUnit::Micros => 1_000_000,
        TimeUnit::Nanos => 1_000_000_000,
    };
    let nanos_per = 1_000_000_000 / per_second;
    (
        count.div_euclid(per_second),
        (count.rem_euclid(per_second) * nanos_per) as u32,
    )
}

fn fraction(unit: TimeUnit) -> &'static str {
    match unit {
        TimeUnit::Millis => "%.3f",
        TimeUnit::Micros => "%.6f",
        TimeUnit::Nanos => "%.9f",
    }
}

/// A time of day counted since midnight.
pub(crate) fn time(count: i64, unit: TimeUnit) -> Option<String> {
    let (seconds, nanos) = split(count, unit);
    let time = chrono::NaiveTime::from_num_seconds_from_midnight_opt(u32::try_from(seconds).ok()?, nanos)?;
    Some(time.format(&format!("%H:%M:%S{}", fraction(unit))).to_string())
}

/// A point in time counted since the epoch: with `Z` when `utc`.
pub(crate) fn timestamp(count: i64, unit: TimeUnit, utc: bool) -> Option<String> {
    let (seconds, nanos) = split(count, unit);
    let at = chrono::DateTime::from_timestamp(seconds, nanos)?.naive_utc();
    let zone = if utc { "Z" } else { "" };
    Some(
        at.format(&format!("%Y-%m-%dT%H:%M:%S{}{zone}", fraction(unit)))
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_dates_times_and_timestamps_render_as_text() {
        assert_eq!(decimal(&BigInt::from(-1230), 2), "-12.30");
        assert_eq!(decimal(&BigInt::from(5), 3), "0.005");
        assert_eq!(decimal(&BigInt::from(-5), 3), "-0.005");
        assert_eq!(decimal(&BigInt::from(42), 0), "42");
        assert_eq!(decimal_bytes(&[0xfb, 0x32], 2), "-12.30");
        assert_eq!(date(19782).as_deref(), Some("2024-02-29"));
        assert_eq!(date(-1).as_deref(), Some("1969-12-31"));
        assert_eq!(
            time(49_500_123_456, TimeUnit::Micros).as_deref(),
            Some("13:45:00.123456")
        );
        assert_eq!(
            timestamp(1_709_214_300_123, TimeUnit::Millis, true).as_deref(),
            Some("2024-02-29T13:45:00.123Z")
        );
        assert_eq!(
            timestamp(-1, TimeUnit::Micros, false).as_deref(),
            Some("1969-12-31T23:59:59.999999")
        );
    }
}
