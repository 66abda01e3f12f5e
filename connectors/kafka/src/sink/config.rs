//! `[sink.kafka]`: the settings of the transactional Kafka sink, with their
//! checks, and the transaction-timeout guardrails as pure functions.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use exactly_core::JsonPointer;
use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::config::{check_bootstrap, check_topic, invalid, KafkaConfigError};
use crate::properties::{check_properties, de_properties, RedactedProperties};

/// Default of `transaction_timeout`: 15 minutes, the default of the
/// brokers' `transaction.max.timeout.ms`.
pub const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Share of `transaction_timeout` after which a transaction still waiting
/// for its checkpoint fails the attempt, so recovery aborts and replays it
/// while the broker has not aborted it yet.
pub const ABORT_AHEAD_SHARE: f64 = 0.8;
/// Largest share of `transaction_timeout` that a checkpoint interval plus
/// the checkpoint timeout may take: a checkpoint that takes its whole timeout
/// must still leave the transactions it lists time to be committed.
pub const CHECKPOINT_SHARE: f64 = 0.5;
/// Default of `pool_size`: one producer writes, one was committed last, up to
/// three hold pre-committed transactions whose checkpoints have not completed.
pub const DEFAULT_POOL_SIZE: usize = 5;
/// Smallest `pool_size` that keeps an exactly-once pipeline going: one writes,
/// one waits for its checkpoint, one was committed last.
pub const MIN_POOL_SIZE: usize = 3;
/// Default of `expected_restart_time`.
pub const DEFAULT_EXPECTED_RESTART_TIME: Duration = Duration::from_secs(30);
/// Default of `timeout_warning_share`.
pub const DEFAULT_TIMEOUT_WARNING_SHARE: f64 = 0.5;

/// librdkafka settings the sink sets itself, and what to use instead.
const RESERVED_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "set `bootstrap` instead"),
    ("metadata.broker.list", "set `bootstrap` instead"),
    (
        "transactional.id",
        "set `transactional_id_prefix` instead; the ids are <prefix>-<subtask>-<slot>",
    ),
    ("transaction.timeout.ms", "set `transaction_timeout` instead"),
    ("enable.idempotence", "transactions need it; it is always on"),
];

/// The settings of the transactional Kafka sink, as written in a pipeline file:
///
/// ```toml
/// [sink.kafka]
/// bootstrap = "127.0.0.1:9092"           # required, `HOST:PORT[,HOST:PORT...]`
/// topic = "orders-copy"                  # required; must exist
/// key = "key"                            # "key" (default: the record's key) | "value" | "none"
///                                        # | a JSON pointer into the value, e.g. "/customer/id"
/// value = "value"                        # "value" (default: the raw value) | a JSON pointer, e.g. "/payload"
/// dead_letter_topic = "orders-dead"      # default: none (a record whose key or value cannot be taken stops the run)
/// transactional_id_prefix = "orders-eos" # default: "exactly-<pipeline name>"
/// transaction_timeout = "15m"            # default: "15m"; at most the broker's transaction.max.timeout.ms,
///                                        # at least twice [checkpoint] interval + timeout
/// pool_size = 5                          # default: 5 transactional producers per subtask
/// on_lost_transaction = "fail"           # "fail" (default) | "warn"
/// expected_restart_time = "30s"          # default: "30s"; only used for a warning
/// timeout_warning_share = 0.5            # default: 0.5; warn when a pending transaction is this old
///
/// [sink.kafka.properties]                # extra librdkafka producer settings
/// "compression.type" = "lz4"
/// ```
///
/// Construct it with serde (TOML, JSON, ...) or [`KafkaSinkConfig::new`], then
/// check it with [`KafkaSinkConfig::validate`] (the factory does so too).
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Bootstrap servers, `HOST:PORT[,HOST:PORT...]`.
    pub bootstrap: String,
    /// The topic written to. It must exist (the sink never creates topics).
    pub topic: String,
    /// Where each message's key comes from.
    #[serde(default)]
    pub key: KeyFrom,
    /// Where each message's value comes from.
    #[serde(default)]
    pub value: ValueFrom,
    /// Where records go whose key or value cannot be taken as `key` /
    /// `value` say (a JSON pointer into a value that is not JSON or lacks
    /// the field): written to this topic unchanged (key, value, timestamp,
    /// headers) with the reason in headers (`exactly.dead_letter.reason`,
    /// `.split`, `.offset`, `.topic`), in the same transaction as the rest
    /// of their interval, and counted. It must exist. Without it such a
    /// record stops the pipeline with an error naming it.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Prefix of the transactional ids, which are
    /// `<prefix>-<subtask>-<slot>`. Default `exactly-<pipeline name>`. Two
    /// pipelines must never share a prefix: each would abort the other's
    /// transactions.
    #[serde(default)]
    pub transactional_id_prefix: Option<String>,
    /// librdkafka's `transaction.timeout.ms`: how long the broker keeps a
    /// transaction open before aborting it. A pre-committed transaction must
    /// outlive its checkpoint *and* a crash with restart, or its records are
    /// lost (reported, never silent). Must not exceed the broker's
    /// `transaction.max.timeout.ms` (checked at start).
    #[serde(
        default = "default_transaction_timeout",
        deserialize_with = "exactly_core::duration::deserialize"
    )]
    pub transaction_timeout: Duration,
    /// Transactional producers (and ids) per sink subtask. One writes the
    /// current interval, one holds the transaction committed last (its id is
    /// not reused until the next checkpoint completes, see the sink's docs),
    /// the others hold pre-committed transactions whose checkpoints have not
    /// completed yet. At least 3; the default 5 rides out two failed
    /// checkpoints in a row. (The checkpoint that completes after failed
    /// ones commits their transactions with its own, and those ids rest
    /// together until the next commit: two runs of failures one completed
    /// checkpoint apart count together.)
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// What to do when the broker refuses to commit a pre-committed
    /// transaction (it timed out, or was fenced): `fail` the pipeline with
    /// a data-loss error, or `warn`, count it and go on.
    #[serde(default)]
    pub on_lost_transaction: OnLostTransaction,
    /// How long a crashed pipeline may take to be running again (restart
    /// delay, supervisor, recovery). Only used to warn when
    /// `transaction_timeout` leaves too little room.
    #[serde(
        default = "default_expected_restart_time",
        deserialize_with = "exactly_core::duration::deserialize"
    )]
    pub expected_restart_time: Duration,
    /// Warn when a pre-committed transaction has waited this share of
    /// `transaction_timeout` (between 0 and 1, default 0.5).
    #[serde(default = "default_timeout_warning_share")]
    pub timeout_warning_share: f64,
    /// Extra librdkafka producer settings (`"compression.type" = "lz4"`);
    /// strings, numbers and booleans are accepted. Settings the sink owns are
    /// rejected by [`validate`](Self::validate).
    #[serde(default, deserialize_with = "de_properties")]
    pub properties: BTreeMap<String, String>,
}

impl fmt::Debug for KafkaSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSinkConfig")
            .field("bootstrap", &self.bootstrap)
            .field("topic", &self.topic)
            .field("key", &self.key)
            .field("value", &self.value)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("transactional_id_prefix", &self.transactional_id_prefix)
            .field("transaction_timeout", &self.transaction_timeout)
            .field("pool_size", &self.pool_size)
            .field("on_lost_transaction", &self.on_lost_transaction)
            .field("expected_restart_time", &self.expected_restart_time)
            .field("timeout_warning_share", &self.timeout_warning_share)
            .field("properties", &RedactedProperties(&self.properties))
            .finish()
    }
}

fn default_transaction_timeout() -> Duration {
    DEFAULT_TRANSACTION_TIMEOUT
}
fn default_pool_size() -> usize {
    DEFAULT_POOL_SIZE
}
fn default_expected_restart_time() -> Duration {
    DEFAULT_EXPECTED_RESTART_TIME
}
fn default_timeout_warning_share() -> f64 {
    DEFAULT_TIMEOUT_WARNING_SHARE
}

/// Where a message's key comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum KeyFrom {
    /// The record's key (none if it has none). Written `"key"`.
    #[default]
    Key,
    /// The record's whole value. Written `"value"`.
    Value,
    /// No key. Written `"none"`.
    None,
    /// The value is JSON; the key is what this JSON pointer (`/customer/id`)
    /// points at: a string's text, or the JSON of anything else.
    Pointer(JsonPointer),
}

/// Where a message's value comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ValueFrom {
    /// The record's raw value. Written `"value"`.
    #[default]
    Value,
    /// The value is JSON; the message's value is what this JSON pointer
    /// points at: a string's text, `null` as no value (a tombstone), or the
    /// JSON of anything else.
    Pointer(JsonPointer),
}

const KEY_EXPECTED: &str = "\"key\", \"value\", \"none\" or a JSON pointer into the value like \"/id\"";
const VALUE_EXPECTED: &str = "\"value\" or a JSON pointer into the value like \"/payload\"";

impl KeyFrom {
    /// Parses `key`, `value`, `none` or a JSON pointer.
    pub fn parse(text: &str) -> Result<KeyFrom, String> {
        match text {
            "key" => Ok(KeyFrom::Key),
            "value" => Ok(KeyFrom::Value),
            "none" => Ok(KeyFrom::None),
            pointer if pointer.starts_with('/') => JsonPointer::parse(pointer)
                .map(KeyFrom::Pointer)
                .map_err(|e| format!("`key`: {e}")),
            other => Err(format!(
                "`key` = \"{other}\" is not a key source; expected {KEY_EXPECTED}"
            )),
        }
    }
}

impl ValueFrom {
    /// Parses `value` or a JSON pointer.
    pub fn parse(text: &str) -> Result<ValueFrom, String> {
        match text {
            "value" => Ok(ValueFrom::Value),
            pointer if pointer.starts_with('/') => JsonPointer::parse(pointer)
                .map(ValueFrom::Pointer)
                .map_err(|e| format!("`value`: {e}")),
            other => Err(format!(
                "`value` = \"{other}\" is not a value source; expected {VALUE_EXPECTED}"
            )),
        }
    }
}

impl fmt::Display for KeyFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFrom::Key => f.write_str("key"),
            KeyFrom::Value => f.write_str("value"),
            KeyFrom::None => f.write_str("none"),
            KeyFrom::Pointer(p) => f.write_str(p.as_str()),
        }
    }
}

impl fmt::Display for ValueFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueFrom::Value => f.write_str("value"),
            ValueFrom::Pointer(p) => f.write_str(p.as_str()),
        }
    }
}

impl<'de> Deserialize<'de> for KeyFrom {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        KeyFrom::parse(&String::deserialize(d)?).map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for ValueFrom {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ValueFrom::parse(&String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// What the sink does when a pre-committed transaction cannot be committed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnLostTransaction {
    /// Stop the pipeline with [`exactly_core::ConnectorError::DataLoss`].
    #[default]
    Fail,
    /// Log the loss at error level, count it
    /// ([`KafkaSinkMetricsSnapshot::lost_transactions`](crate::KafkaSinkMetricsSnapshot)),
    /// and go on.
    Warn,
}

impl KafkaSinkConfig {
    /// Settings for `topic` on `bootstrap`, with every other key at its default.
    pub fn new(bootstrap: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSinkConfig {
            bootstrap: bootstrap.into(),
            topic: topic.into(),
            key: KeyFrom::default(),
            value: ValueFrom::default(),
            dead_letter_topic: None,
            transactional_id_prefix: None,
            transaction_timeout: DEFAULT_TRANSACTION_TIMEOUT,
            pool_size: DEFAULT_POOL_SIZE,
            on_lost_transaction: OnLostTransaction::default(),
            expected_restart_time: DEFAULT_EXPECTED_RESTART_TIME,
            timeout_warning_share: DEFAULT_TIMEOUT_WARNING_SHARE,
            properties: BTreeMap::new(),
        }
    }

    /// The prefix of the transactional ids: `transactional_id_prefix`, or
    /// `exactly-<pipeline>`.
    pub fn prefix_for(&self, pipeline: &str) -> String {
        self.transactional_id_prefix
            .clone()
            .unwrap_or_else(|| format!("exactly-{pipeline}"))
    }

    /// Checks every setting; the error names the key and the fix.
    pub fn validate(&self) -> Result<(), KafkaConfigError> {
        self.check().map_err(KafkaConfigError::in_sink)
    }

    fn check(&self) -> Result<(), KafkaConfigError> {
        check_bootstrap(&self.bootstrap)?;
        check_topic(&self.topic)?;
        if let Some(dead_letters) = &self.dead_letter_topic {
            check_topic(dead_letters).map_err(|e| KafkaConfigError {
                key: "dead_letter_topic".into(),
                ..e
            })?;
            if *dead_letters == self.topic {
                return invalid(
                    "dead_letter_topic",
                    "is the topic written to; name another topic for the records that cannot be written there",
                );
            }
        }
        if let Some(prefix) = &self.transactional_id_prefix {
            if prefix.trim().is_empty() || prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return invalid(
                    "transactional_id_prefix",
                    "must be non-empty without spaces; remove it to use exactly-<pipeline name>",
                );
            }
        }
        if self.transaction_timeout < Duration::from_secs(1) {
            return invalid(
                "transaction_timeout",
                "must be at least 1s (librdkafka's minimum); write e.g. \"60s\"",
            );
        }
        if self.transaction_timeout.as_millis() > i32::MAX as u128 {
            return invalid(
                "transaction_timeout",
                "is longer than librdkafka accepts; write e.g. \"60s\"",
            );
        }
        if self.pool_size < MIN_POOL_SIZE {
            return invalid(
                "pool_size",
                format!(
                    "must be at least {MIN_POOL_SIZE}: one producer writes, one waits for its checkpoint, \
                     one was committed last"
                ),
            );
        }
        if !(self.timeout_warning_share > 0.0 && self.timeout_warning_share <= 1.0) {
            return invalid("timeout_warning_share", "must be above 0 and at most 1; write e.g. 0.5");
        }
        check_properties(&self.properties, RESERVED_PROPERTIES, "sink")
    }
}

/// The guardrail against the broker's limit: `Err` with the fix when
/// `transaction_timeout` exceeds `transaction.max.timeout.ms` as the broker
/// reported it (`None`: the broker does not say, nothing to check).
pub fn check_broker_timeout_limit(transaction_timeout: Duration, broker_max_ms: Option<&str>) -> Result<(), String> {
    let Some(text) = broker_max_ms else {
        return Ok(());
    };
    let max_ms: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("the broker reports transaction.max.timeout.ms = \"{text}\", which is not a number"))?;
    let timeout_ms = transaction_timeout.as_millis();
    if timeout_ms > max_ms as u128 {
        return Err(format!(
            "`transaction_timeout` ({}) is above the broker's transaction.max.timeout.ms ({max_ms} ms): \
             the broker would refuse every transaction. Lower `transaction_timeout` to at most {} \
             or raise transaction.max.timeout.ms on the brokers",
            humantime::format_duration(transaction_timeout),
            humantime::format_duration(Duration::from_millis(max_ms)),
        ));
    }
    Ok(())
}

/// The room a transaction needs: it fills for up to a checkpoint interval,
/// waits up to another for its checkpoint, and may have to survive a crash
/// and restart before it is committed. `transaction_timeout` should be at
/// least 1.5 times that.
pub fn needed_transaction_time(checkpoint_interval: Duration, expected_restart_time: Duration) -> Duration {
    checkpoint_interval * 2 + expected_restart_time
}

/// The guardrail against a too short timeout: a warning when
/// `transaction_timeout` is not comfortably (1.5×) above
/// [`needed_transaction_time`]. Without a known checkpoint interval only the
/// restart time counts.
pub fn timeout_headroom_warning(
    transaction_timeout: Duration,
    checkpoint_interval: Option<Duration>,
    expected_restart_time: Duration,
) -> Option<String> {
    let needed = needed_transaction_time(checkpoint_interval.unwrap_or_default(), expected_restart_time);
    if transaction_timeout.as_secs_f64() >= needed.as_secs_f64() * 1.5 {
        return None;
    }
    let interval =
        checkpoint_interval.map_or_else(|| "unknown".to_string(), |i| humantime::format_duration(i).to_string());
    Some(format!(
        "`transaction_timeout` ({}) leaves little room: a transaction may need two checkpoint intervals \
         (interval {interval}) plus a restart (`expected_restart_time` {}) = {} before it is committed, \
         and the broker aborts it after the timeout, losing its records. Raise `transaction_timeout` \
         to at least {}",
        humantime::format_duration(transaction_timeout),
        humantime::format_duration(expected_restart_time),
        humantime::format_duration(needed),
        humantime::format_duration(Duration::from_secs((needed.as_secs_f64() * 1.5).ceil() as u64)),
    ))
}

/// The guardrail against checkpoints that outlive transactions: `Err` with
/// the fix unless the checkpoint `interval` plus its `timeout` take at most
/// [`CHECKPOINT_SHARE`] of `transaction_timeout`. A transaction fills for up
/// to an interval and then waits up to the timeout for its checkpoint; what
/// is left must cover the commit (or a restart that commits it).
pub fn check_checkpoint_timing(
    transaction_timeout: Duration,
    interval: Duration,
    timeout: Duration,
) -> Result<(), String> {
    let needed = interval + timeout;
    if needed.as_secs_f64() <= transaction_timeout.as_secs_f64() * CHECKPOINT_SHARE {
        return Ok(());
    }
    let round = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs_f64().ceil() as u64));
    let max_timeout = Duration::from_secs_f64(
        (transaction_timeout.as_secs_f64() * CHECKPOINT_SHARE - interval.as_secs_f64()).max(0.0),
    );
    Err(format!(
        "[checkpoint] timeout ({}) plus interval ({}) is more than half of [sink.kafka] transaction_timeout ({}): \
         a checkpoint that takes its whole timeout would leave the Kafka transactions it lists too close to the \
         broker aborting them, and their records would be lost. Lower [checkpoint] timeout to at most {}, or \
         raise transaction_timeout to at least {} (and the brokers' transaction.max.timeout.ms with it)",
        humantime::format_duration(timeout),
        humantime::format_duration(interval),
        humantime::format_duration(transaction_timeout),
        humantime::format_duration(Duration::from_secs(max_timeout.as_secs())),
        round(needed.mul_f64(1.0 / CHECKPOINT_SHARE)),
    ))
}

/// True when a transaction open for `age` has used `share` (0..=1) of
/// `transaction_timeout` or more.
pub fn past_timeout_share(age: Duration, transaction_timeout: Duration, share: f64) -> bool {
    age.as_secs_f64() >= transaction_timeout.as_secs_f64() * share
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_must_take_at_most_half_of_the_transaction_timeout() {
        let s = Duration::from_secs;
        assert!(check_checkpoint_timing(s(900), s(1), s(60)).is_ok(), "the defaults fit");
        assert!(check_checkpoint_timing(s(10), s(1), s(4)).is_ok());
        let e = check_checkpoint_timing(s(60), s(1), s(60)).unwrap_err();
        for part in [
            "[checkpoint] timeout (1m)",
            "interval (1s)",
            "transaction_timeout (1m)",
            "at most 29s",
            "at least 2m 2s",
            "transaction.max.timeout.ms",
        ] {
            assert!(e.contains(part), "{part} missing from: {e}");
        }
    }

    fn parse(body: &str) -> Result<KafkaSinkConfig, String> {
        let config: KafkaSinkConfig = crate::config::parse_section("sink", "out", body)?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, KafkaSinkConfig::new("127.0.0.1:9092", "out"));
        assert_eq!(c.key, KeyFrom::Key);
        assert_eq!(c.value, ValueFrom::Value);
        assert_eq!(c.transaction_timeout, Duration::from_secs(15 * 60));
        assert_eq!(c.pool_size, 5);
        assert_eq!(c.on_lost_transaction, OnLostTransaction::Fail);
        assert_eq!(c.prefix_for("p"), "exactly-p");
    }

    #[test]
    fn every_key() {
        let c = parse(
            r#"
key = "/customer/id"
value = "/payload"
dead_letter_topic = "out-dead"
transactional_id_prefix = "copy"
transaction_timeout = "2m"
pool_size = 7
on_lost_transaction = "warn"
expected_restart_time = "10s"
timeout_warning_share = 0.8
[sink.kafka.properties]
"compression.type" = "lz4"
"linger.ms" = 5
"#,
        )
        .unwrap();
        assert_eq!(c.key, KeyFrom::Pointer(JsonPointer::parse("/customer/id").unwrap()));
        assert_eq!(c.value, ValueFrom::Pointer(JsonPointer::parse("/payload").unwrap()));
        assert_eq!(c.dead_letter_topic.as_deref(), Some("out-dead"));
        assert_eq!(c.prefix_for("p"), "copy");
        assert_eq!(c.transaction_timeout, Duration::from_secs(120));
        assert_eq!(c.pool_size, 7);
        assert_eq!(c.on_lost_transaction, OnLostTransaction::Warn);
        assert_eq!(c.expected_restart_time, Duration::from_secs(10));
        assert_eq!(c.timeout_warning_share, 0.8);
        assert_eq!(c.properties["linger.ms"], "5");
        for (text, key) in [
            ("key", KeyFrom::Key),
            ("value", KeyFrom::Value),
            ("none", KeyFrom::None),
        ] {
            assert_eq!(parse(&format!("key = \"{text}\"")).unwrap().key, key);
            assert_eq!(key.to_string(), text);
        }
    }

    #[test]
    fn errors_name_the_key_and_the_fix() {
        let e = parse("key = \"id\"").unwrap_err();
        assert!(e.contains("`key` = \"id\"") && e.contains("JSON pointer"), "{e}");
        let e = parse("value = \"raw\"").unwrap_err();
        assert!(e.contains("`value` = \"raw\"") && e.contains("\"value\""), "{e}");
        let e = parse("on_lost_transaction = \"ignore\"").unwrap_err();
        assert!(e.contains("ignore") && e.contains("warn"), "{e}");
        let e = parse("transaction_timeout = \"soon\"").unwrap_err();
        assert!(e.contains("soon") && e.contains("duration"), "{e}");
        let e = parse("pool_sizes = 3").unwrap_err();
        assert!(e.contains("pool_sizes"), "{e}");
        let e = parse("pool_size = 2").unwrap_err();
        assert!(e.starts_with("kafka sink: `pool_size` must be at least 3"), "{e}");
        let e = parse("transaction_timeout = \"500ms\"").unwrap_err();
        assert!(e.contains("`transaction_timeout` must be at least 1s"), "{e}");
        let e = parse("timeout_warning_share = 1.5").unwrap_err();
        assert!(e.contains("`timeout_warning_share`"), "{e}");
        let e = parse("dead_letter_topic = \"out\"").unwrap_err();
        assert!(
            e.starts_with("kafka sink: `dead_letter_topic` is the topic written to"),
            "{e}"
        );
        let e = parse("dead_letter_topic = \"a/b\"").unwrap_err();
        assert!(
            e.starts_with("kafka sink: `dead_letter_topic` \"a/b\" contains '/'"),
            "{e}"
        );
        let e = parse("transactional_id_prefix = \"a b\"").unwrap_err();
        assert!(e.contains("`transactional_id_prefix`"), "{e}");
        let e = parse("[sink.kafka.properties]\n\"transactional.id\" = \"x\"").unwrap_err();
        assert!(
            e.contains("`properties.\"transactional.id\"` is set by the sink") && e.contains("transactional_id_prefix"),
            "{e}"
        );
        let mut c = KafkaSinkConfig::new("", "out");
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("kafka sink: `bootstrap` is empty"));
        c.bootstrap = "b:1".into();
        c.topic = "a/b".into();
        assert!(c.validate().unwrap_err().to_string().contains("`topic`"));
    }

    #[test]
    fn malformed_pointers_are_refused_when_parsed() {
        let e = KeyFrom::parse("/a~x").unwrap_err();
        assert!(e.contains("`key`") && e.contains("`~` must be followed"), "{e}");
        let e = ValueFrom::parse("/p~").unwrap_err();
        assert!(e.contains("`value`") && e.contains("`~` must be followed"), "{e}");
        assert_eq!(
            KeyFrom::parse("/a~1b").unwrap(),
            KeyFrom::Pointer(JsonPointer::parse("/a~1b").unwrap())
        );
    }

    #[test]
    fn a_timeout_above_the_broker_limit_is_refused() {
        let minute = Duration::from_secs(60);
        assert_eq!(check_broker_timeout_limit(minute, None), Ok(()));
        assert_eq!(check_broker_timeout_limit(minute, Some("900000")), Ok(()));
        assert_eq!(check_broker_timeout_limit(minute, Some("60000")), Ok(()));
        let e = check_broker_timeout_limit(minute, Some("30000")).unwrap_err();
        assert!(
            e.contains("`transaction_timeout` (1m) is above the broker's transaction.max.timeout.ms (30000 ms)")
                && e.contains("at most 30s"),
            "{e}"
        );
        let e = check_broker_timeout_limit(minute, Some("lots")).unwrap_err();
        assert!(e.contains("not a number"), "{e}");
    }

    #[test]
    fn a_timeout_without_headroom_is_warned_about() {
        let s = Duration::from_secs;
        assert_eq!(needed_transaction_time(s(1), s(30)), s(32));
        assert_eq!(timeout_headroom_warning(s(60), Some(s(1)), s(30)), None);
        assert_eq!(timeout_headroom_warning(s(48), Some(s(1)), s(30)), None);
        let w = timeout_headroom_warning(s(47), Some(s(1)), s(30)).unwrap();
        assert!(
            w.contains("(47s)") && w.contains("= 32s") && w.contains("at least 48s"),
            "{w}"
        );
        let w = timeout_headroom_warning(s(60), Some(s(30)), s(30)).unwrap();
        assert!(w.contains("interval 30s") && w.contains("at least 2m 15s"), "{w}");
        let w = timeout_headroom_warning(s(10), None, s(30)).unwrap();
        assert!(w.contains("interval unknown"), "{w}");
    }

    #[test]
    fn pending_transactions_warn_at_their_share() {
        let s = Duration::from_secs;
        assert!(!past_timeout_share(s(29), s(60), 0.5));
        assert!(past_timeout_share(s(30), s(60), 0.5));
        assert!(!past_timeout_share(s(30), s(60), 0.8));
        assert!(past_timeout_share(s(60), s(60), 1.0));
    }
}
