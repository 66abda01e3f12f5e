//! How a [`Fetcher`](super::Fetcher) fetches, and the consumer properties
//! (librdkafka's and the Java client's names) that set it.

use std::time::Duration;

use crate::error::WireError;

/// Where a partition whose position is out of range (its records were
/// deleted by retention, or the topic was recreated) continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffsetReset {
    /// At its first record (`auto.offset.reset = earliest`), with a
    /// warning naming what was skipped.
    #[default]
    Earliest,
    /// At its end (`latest`), with a warning.
    Latest,
    /// Nowhere: the fetcher stops with an error (`error`).
    Error,
}

/// What a [`Fetcher`](super::Fetcher) does when a partition's log was
/// truncated below the position it read (an unclean leader election): see
/// [`WireError::LogTruncated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnTruncation {
    /// Stop with [`WireError::LogTruncated`]: nothing is skipped or read
    /// twice silently.
    #[default]
    Fail,
    /// Go on at the offset where the log diverges, with a warning and a
    /// count of the offsets read that no longer exist
    /// ([`FetchCounters::truncated_offsets`](super::FetchCounters::truncated_offsets)),
    /// and a [`FetchedChunk::truncation`](super::FetchedChunk::truncation)
    /// telling the consumer. The records now at those offsets are read.
    /// Where the leader cannot tell the divergence, the fetcher stops as
    /// with `Fail`.
    Resume,
}

/// How a [`Fetcher`](super::Fetcher) fetches. [`from_properties`](Self::from_properties)
/// reads them from consumer properties; the defaults suit a pipeline that
/// reads as fast as it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchSettings {
    /// How long a broker may hold a Fetch while it has less than
    /// `min_bytes` to send (`fetch.wait.max.ms`, default 500 ms): the
    /// longest a new record waits at the broker.
    pub max_wait: Duration,
    /// Bytes a broker waits for before it answers (`fetch.min.bytes`,
    /// default 1: answer as soon as there is anything).
    pub min_bytes: i32,
    /// Bytes one Fetch answer may hold (`fetch.max.bytes`, default 4 MiB):
    /// room for several partitions' shares. A record batch larger than this
    /// still comes, alone.
    pub max_bytes: i32,
    /// Bytes one partition may contribute to an answer
    /// (`max.partition.fetch.bytes`, default 1 MiB); raised for a
    /// partition whose next batch is larger, up to `max_bytes`.
    pub partition_max_bytes: i32,
    /// Bytes fetched and not yet taken by the consumer before the fetcher
    /// waits (`queued.max.messages.kbytes` × 1024, default 4 MiB). With
    /// one answer in flight per leader, this plus `max_bytes` per leader
    /// bounds what a fetcher holds.
    pub queued_max_bytes: usize,
    /// Where a partition whose position is out of range continues
    /// (`auto.offset.reset`, default `earliest`).
    pub offset_reset: OffsetReset,
    /// First pause before a failed request or a partition whose leader
    /// moved is tried again (`fetch.error.backoff.ms`, default 100 ms);
    /// doubled after each failure in a row, up to `max_backoff`.
    pub backoff: Duration,
    /// Longest pause between retries (`reconnect.backoff.max.ms`, default
    /// 1 s).
    pub max_backoff: Duration,
    /// How old the partitions' leaders may get before they are read again
    /// (`metadata.max.age.ms`, default 5 minutes as Kafka's consumer): a
    /// moved leader is usually found sooner, by the error or the fenced
    /// epoch its old broker answers with.
    pub metadata_max_age: Duration,
    /// The consumer's rack (`client.rack`): a leader that knows racks may
    /// then name a replica of this rack to fetch from instead (KIP-392).
    pub rack: Option<String>,
    /// How long the topic may be missing from the metadata (deleted) before
    /// the fetcher stops with [`WireError::TopicMissing`] (default 60 s;
    /// set by the source, not a Kafka property).
    pub missing_topic_timeout: Duration,
    /// What happens when a partition's log was truncated below the
    /// position read (default [`OnTruncation::Fail`]; set by the source).
    pub on_truncation: OnTruncation,
}

impl Default for FetchSettings {
    fn default() -> Self {
        FetchSettings {
            max_wait: Duration::from_millis(500),
            min_bytes: 1,
            max_bytes: 4 * 1024 * 1024,
            partition_max_bytes: 1024 * 1024,
            queued_max_bytes: 4 * 1024 * 1024,
            offset_reset: OffsetReset::Earliest,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            metadata_max_age: Duration::from_secs(300),
            rack: None,
            missing_topic_timeout: Duration::from_secs(60),
            on_truncation: OnTruncation::Fail,
        }
    }
}

/// The consumer properties [`FetchSettings::from_properties`] reads.
pub const FETCH_PROPERTIES: [&str; 11] = [
    "fetch.wait.max.ms",
    "fetch.max.wait.ms",
    "fetch.min.bytes",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "queued.max.messages.kbytes",
    "auto.offset.reset",
    "fetch.error.backoff.ms",
    "reconnect.backoff.max.ms",
    "metadata.max.age.ms",
    "client.rack",
];

impl FetchSettings {
    /// The defaults, changed by the [`FETCH_PROPERTIES`] among
    /// `properties` (librdkafka's names; the Java client's
    /// `fetch.max.wait.ms` too). Other keys are not looked at. A value that
    /// is not a number, out of range, or an unknown `auto.offset.reset` is
    /// a [`WireError::InvalidConfig`] naming the key.
    pub fn from_properties<'a, I, K, V>(properties: I) -> Result<FetchSettings, WireError>
    where
        I: IntoIterator<Item = (&'a K, &'a V)>,
        K: AsRef<str> + ?Sized + 'a,
        V: AsRef<str> + ?Sized + 'a,
    {
        let mut settings = FetchSettings::default();
        for (key, value) in properties {
            settings.apply(key.as_ref(), value.as_ref().trim())?;
        }
        if settings.partition_max_bytes > settings.max_bytes {
            settings.partition_max_bytes = settings.max_bytes;
        }
        Ok(settings)
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<(), WireError> {
        let invalid = |message: String| WireError::InvalidConfig {
            key: key.to_string(),
            message,
        };
        let number = |min: u64, max: u64| -> Result<u64, WireError> {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| invalid(format!("`{value}` is not a whole number from {min} to {max}")))
        };
        let bytes = |min: u64| number(min, i32::MAX as u64).map(|n| n as i32);
        match key {
            "fetch.wait.max.ms" | "fetch.max.wait.ms" => self.max_wait = Duration::from_millis(number(0, 300_000)?),
            "fetch.min.bytes" => self.min_bytes = bytes(1)?,
            "fetch.max.bytes" => self.max_bytes = bytes(1024)?,
            "max.partition.fetch.bytes" => self.partition_max_bytes = bytes(1)?,
            "queued.max.messages.kbytes" => self.queued_max_bytes = number(1, 2_097_151)? as usize * 1024,
            "fetch.error.backoff.ms" => self.backoff = Duration::from_millis(number(0, 300_000)?),
            "reconnect.backoff.max.ms" => self.max_backoff = Duration::from_millis(number(0, 3_600_000)?),
            "metadata.max.age.ms" => self.metadata_max_age = Duration::from_millis(number(1, 86_400_000)?),
            "client.rack" => self.rack = (!value.is_empty()).then(|| value.to_string()),
            "auto.offset.reset" => {
                self.offset_reset = match value {
                    "earliest" | "smallest" | "beginning" => OffsetReset::Earliest,
                    "latest" | "largest" | "end" => OffsetReset::Latest,
                    "error" | "none" => OffsetReset::Error,
                    other => return Err(invalid(format!("`{other}` is not one of earliest, latest, error"))),
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<FetchSettings, WireError> {
        FetchSettings::from_properties(pairs.iter().map(|(k, v)| (*k, *v)))
    }

    #[test]
    fn properties_set_what_they_name() {
        let s = settings(&[
            ("fetch.wait.max.ms", "20"),
            ("fetch.min.bytes", "10"),
            ("fetch.max.bytes", "2048"),
            ("max.partition.fetch.bytes", "4096"),
            ("queued.max.messages.kbytes", "64"),
            ("auto.offset.reset", "error"),
            ("fetch.error.backoff.ms", "5"),
            ("reconnect.backoff.max.ms", "50"),
            ("metadata.max.age.ms", "1500"),
            ("client.rack", "eu-1a"),
            ("sasl.password", "not looked at"),
        ])
        .unwrap();
        assert_eq!(s.max_wait, Duration::from_millis(20));
        assert_eq!((s.min_bytes, s.max_bytes), (10, 2048));
        assert_eq!(s.partition_max_bytes, 2048, "never above fetch.max.bytes");
        assert_eq!(s.queued_max_bytes, 64 * 1024);
        assert_eq!(s.offset_reset, OffsetReset::Error);
        assert_eq!(
            (s.backoff, s.max_backoff),
            (Duration::from_millis(5), Duration::from_millis(50))
        );
        assert_eq!(s.metadata_max_age, Duration::from_millis(1500));
        assert_eq!(s.rack.as_deref(), Some("eu-1a"));
        assert_eq!(settings(&[]).unwrap(), FetchSettings::default());
    }

    #[test]
    fn bad_values_name_the_key() {
        for (key, value) in [
            ("fetch.max.bytes", "lots"),
            ("fetch.min.bytes", "0"),
            ("queued.max.messages.kbytes", "-1"),
            ("auto.offset.reset", "sometimes"),
        ] {
            let error = settings(&[(key, value)]).unwrap_err().to_string();
            assert!(error.contains(key) && error.contains(value), "{error}");
        }
    }
}
