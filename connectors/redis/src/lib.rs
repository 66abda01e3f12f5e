//! # exactly-redis
//!
//! A Redis sink for stores without transactions, built on the core's
//! idempotent-sink adapters:
//!
//! - `SET` / `HSET` (upserts by a deterministic key) through the replay-safe
//!   (default) or write-ahead strategy. Replay-safe upserts are exact when each
//!   key is written from one source split (records of a split are replayed in
//!   order); a key written from several splits ends with whichever split wrote
//!   it last, as without a crash — use write-ahead or a fenced counter when that
//!   matters;
//! - `INCRBY` / `HINCRBY` (counters) through the position fence: one Lua script
//!   per batch checks, for every record, the highest offset already applied for
//!   its source split, applies the increment only above it and advances the
//!   fence — atomically, so a replay after a crash never counts twice.
//!
//! Records whose key (or value, or increment) cannot be derived go to the
//! dead-letter hash `exactly:dead-letters:<pipeline>` (field `<split>/<offset>`,
//! so a replay never duplicates a dead letter), with the reason, and are counted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use exactly_core::{
    ConnectorError, DeadLetter, Fenced, FencedSink, FencedSinkFactory, IdempotentSink, IdempotentSinkFactory,
    JsonPointer, Record, ReplaySafe, SinkContext, SinkFactory, WriteAhead, WriteOutcome,
};
use redis::aio::MultiplexedConnection;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

/// The Redis command each record becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisCommand {
    /// `SET key value`.
    Set,
    /// `HSET key field value`.
    Hset,
    /// `INCRBY key increment`.
    Incrby,
    /// `HINCRBY key field increment`.
    Hincrby,
}

impl RedisCommand {
    fn is_increment(self) -> bool {
        matches!(self, RedisCommand::Incrby | RedisCommand::Hincrby)
    }
    fn needs_field(self) -> bool {
        matches!(self, RedisCommand::Hset | RedisCommand::Hincrby)
    }
}

/// How exactly-once effects are obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Write at once, flush at checkpoints; replays rewrite the same keys.
    ReplaySafe,
    /// Hold each checkpoint's records, write them when it completes.
    WriteAhead,
    /// Apply a record only above its split's stored offset (counters).
    Fenced,
}

/// `[sink.redis]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSinkConfig {
    /// `redis://host:port/db` (`redis://:password@host:port/db` with a
    /// password). Held as a secret: `Debug` shows `[REDACTED]`, and errors
    /// and logs show it with the password replaced by `***`.
    pub url: SecretString,
    /// `set`, `hset`, `incrby` or `hincrby`.
    pub command: RedisCommand,
    /// Where the key comes from (see [`Extract`]): `key`, `value`, `split`, `offset`,
    /// a JSON pointer such as `/customer`, or a literal `=total`.
    pub key: String,
    /// Prepended to every key.
    #[serde(default)]
    pub key_prefix: String,
    /// Hash field for `hset` / `hincrby` (same forms as `key`).
    pub field: Option<String>,
    /// Value for `set` / `hset` (default `value`, the raw record value).
    pub value: Option<String>,
    /// Increment for `incrby` / `hincrby` (default `=1`).
    pub increment: Option<String>,
    /// Default: `fenced` for increments, `replay-safe` otherwise.
    pub strategy: Option<Strategy>,
    /// Spill folder for `write-ahead` (required there; must be durable).
    pub spill_dir: Option<PathBuf>,
    /// Accept increments without the fence (they over-count after a crash).
    #[serde(default)]
    pub allow_duplicate_effects: bool,
}

/// A way to take a string from a record.
#[derive(Clone, PartialEq, Eq)]
pub enum Extract {
    /// The record key (UTF-8).
    Key,
    /// The raw value.
    Value,
    /// The split name.
    Split,
    /// The offset.
    Offset,
    /// A JSON pointer into the value parsed as JSON.
    Pointer(JsonPointer),
    /// A constant.
    Literal(String),
}

/// Written as the configuration names it (`Pointer("/amount")`): the text is
/// part of the sink's identity, so checkpoints and fences carry over.
impl std::fmt::Debug for Extract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Extract::Key => f.write_str("Key"),
            Extract::Value => f.write_str("Value"),
            Extract::Split => f.write_str("Split"),
            Extract::Offset => f.write_str("Offset"),
            Extract::Pointer(p) => f.debug_tuple("Pointer").field(&p.as_str()).finish(),
            Extract::Literal(l) => f.debug_tuple("Literal").field(l).finish(),
        }
    }
}

impl Extract {
    /// Parses `key`, `value`, `split`, `offset`, `/pointer` or `=literal`.
    pub fn parse(spec: &str) -> Result<Extract, String> {
        Ok(match spec {
            "key" => Extract::Key,
            "value" => Extract::Value,
            "split" => Extract::Split,
            "offset" => Extract::Offset,
            s if s.starts_with('/') => Extract::Pointer(JsonPointer::parse(s).map_err(|e| e.to_string())?),
            s if s.starts_with('=') => Extract::Literal(s[1..].to_string()),
            other => {
                return Err(format!(
                    "`{other}` is not a source: use key, value, split, offset, a JSON pointer like /id, or =literal"
                ))
            }
        })
    }

    /// The extracted bytes, or why there are none; `answer` is what a
    /// pointer found in the value (see [`Plan::op`], which reads every
    /// pointer of a record in one pass; ignored for the other kinds).
    fn apply(&self, record: &Record, answer: Option<Option<serde_json::Value>>) -> Result<Vec<u8>, String> {
        match self {
            Extract::Key => record
                .key
                .as_deref()
                .map(<[u8]>::to_vec)
                .ok_or_else(|| "the record has no key".to_string()),
            Extract::Value => record
                .value
                .as_deref()
                .map(<[u8]>::to_vec)
                .ok_or_else(|| "the value is null (a tombstone)".to_string()),
            Extract::Split => Ok(record.split.as_bytes().to_vec()),
            Extract::Offset => Ok(record.offset.to_string().into_bytes()),
            Extract::Literal(l) => Ok(l.clone().into_bytes()),
            Extract::Pointer(p) => match answer.flatten() {
                None | Some(serde_json::Value::Null) => Err(format!("field {p} is missing")),
                Some(serde_json::Value::String(s)) => Ok(s.into_bytes()),
                Some(v) => Ok(v.to_string().into_bytes()),
            },
        }
    }
}

/// A record turned into one Redis operation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Op {
    key: Vec<u8>,
    field: Option<Vec<u8>>,
    value: Vec<u8>,
}

#[derive(Debug)]
struct Plan {
    command: RedisCommand,
    key: Extract,
    key_prefix: String,
    field: Option<Extract>,
    value: Extract,
}

impl Plan {
    fn op(&self, record: &Record) -> Result<Op, String> {
        // Every pointer among key, field and value is answered in one pass.
        let parts = [Some(&self.key), self.field.as_ref(), Some(&self.value)];
        let pointers: Vec<&JsonPointer> = parts
            .iter()
            .flatten()
            .filter_map(|e| match e {
                Extract::Pointer(p) => Some(p),
                _ => None,
            })
            .collect();
        let mut answers = if pointers.is_empty() {
            Vec::new()
        } else {
            // Named after the first part that needed the JSON, as each part's
            // own error would be.
            let what = match parts.iter().position(|p| matches!(p, Some(Extract::Pointer(_)))) {
                Some(0) => "no key",
                Some(1) => "no hash field",
                _ if self.command.is_increment() => "no increment",
                _ => "no value",
            };
            let Some(value) = record.value.as_deref() else {
                return Err(format!(
                    "{what}: the value is null (a tombstone), so JSON pointers find nothing"
                ));
            };
            JsonPointer::find_all(&pointers, value).map_err(|e| format!("{what}: the value is not JSON: {e}"))?
        }
        .into_iter();
        let mut answer_for = |e: &Extract| matches!(e, Extract::Pointer(_)).then(|| answers.next().flatten());
        let mut key = self.key_prefix.clone().into_bytes();
        key.extend(
            self.key
                .apply(record, answer_for(&self.key))
                .map_err(|e| format!("no key: {e}"))?,
        );
        let field = match &self.field {
            Some(f) => Some(
                f.apply(record, answer_for(f))
                    .map_err(|e| format!("no hash field: {e}"))?,
            ),
            None => None,
        };
        let value = self.value.apply(record, answer_for(&self.value));
        let value = if self.command.is_increment() {
            let text = value.map_err(|e| format!("no increment: {e}"))?;
            let text = String::from_utf8_lossy(&text);
            text.trim()
                .parse::<i64>()
                .map_err(|_| format!("increment `{text}` is not an integer"))?
                .to_string()
                .into_bytes()
        } else {
            value.map_err(|e| format!("no value: {e}"))?
        };
        Ok(Op { key, field, value })
    }
}

/// Creates the Redis sink; see the crate documentation.
#[derive(Clone, Debug)]
pub struct RedisSinkFactory {
    config: RedisSinkConfig,
    plan: Arc<Plan>,
    strategy: Strategy,
}

impl RedisSinkFactory {
    /// Checks the configuration.
    pub fn new(config: RedisSinkConfig) -> Result<Self, ConnectorError> {
        let bad = |key: &str, e: String| ConnectorError::fatal("[sink.redis]", format!("`{key}`: {e}"));
        redis::Client::open(config.url.expose_secret())
            .map_err(|e| bad("url", "not a Redis URL (write redis://host:port/db)".into()).caused_by(e))?;
        let key = Extract::parse(&config.key).map_err(|e| bad("key", e))?;
        let field = match (&config.field, config.command.needs_field()) {
            (Some(f), true) => Some(Extract::parse(f).map_err(|e| bad("field", e))?),
            (None, true) => return Err(bad("field", format!("{:?} needs a hash field", config.command))),
            (Some(_), false) => return Err(bad("field", format!("{:?} takes no hash field", config.command))),
            (None, false) => None,
        };
        let value = if config.command.is_increment() {
            if config.value.is_some() {
                return Err(bad("value", "increments take `increment`, not `value`".into()));
            }
            Extract::parse(config.increment.as_deref().unwrap_or("=1")).map_err(|e| bad("increment", e))?
        } else {
            if config.increment.is_some() {
                return Err(bad("increment", "only incrby/hincrby take an increment".into()));
            }
            Extract::parse(config.value.as_deref().unwrap_or("value")).map_err(|e| bad("value", e))?
        };
        let strategy = config.strategy.unwrap_or(if config.command.is_increment() {
            Strategy::Fenced
        } else {
            Strategy::ReplaySafe
        });
        if config.command.is_increment() && strategy != Strategy::Fenced && !config.allow_duplicate_effects {
            return Err(bad(
                "strategy",
                "increments are not idempotent: without the fence a replay after a crash counts twice. \
                 Use strategy = \"fenced\" (or set allow_duplicate_effects = true to accept over-counting)"
                    .into(),
            ));
        }
        if strategy == Strategy::WriteAhead && config.spill_dir.is_none() {
            return Err(bad(
                "spill_dir",
                "write-ahead holds records of pending checkpoints in files: set spill_dir to a durable folder \
                 (not a temporary file system), e.g. next to the checkpoint folder"
                    .into(),
            ));
        }
        let plan = Arc::new(Plan {
            command: config.command,
            key,
            key_prefix: config.key_prefix.clone(),
            field,
            value,
        });
        Ok(RedisSinkFactory { config, plan, strategy })
    }

    /// The strategy in use.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The sink factory the runtime drives: this store wrapped in its strategy's adapter.
    pub fn into_sink_factory(self) -> Arc<dyn SinkFactory> {
        match self.strategy {
            Strategy::ReplaySafe => Arc::new(ReplaySafe(self)),
            Strategy::Fenced => Arc::new(Fenced(self)),
            Strategy::WriteAhead => {
                let spill_dir = self.config.spill_dir.clone().expect("checked by new()");
                Arc::new(WriteAhead {
                    factory: self,
                    spill_dir,
                    inline_limit: 1000,
                })
            }
        }
    }

    fn sink(&self, context: &SinkContext) -> Result<RedisSink, ConnectorError> {
        Ok(RedisSink {
            client: redis::Client::open(self.config.url.expose_secret())
                .map_err(|e| ConnectorError::fatal("[sink.redis] url", "not a Redis URL").caused_by(e))?,
            url: shown_url(self.config.url.expose_secret()),
            connection: None,
            plan: self.plan.clone(),
            dead_letter_key: format!("exactly:dead-letters:{}", context.pipeline),
            acting: context.ownership.as_ref().map(|o| o.acting.clone()),
            epoch: context.ownership.as_ref().map(|o| {
                (
                    format!("exactly:epoch:{}:{}", context.pipeline, context.subtask),
                    o.epoch.0,
                )
            }),
        })
    }

    fn describe(&self) -> String {
        format!(
            "redis:url={},command={:?},key={}{},field={:?},value={:?}",
            // The identity names the fence scope and enters the pipeline's
            // fingerprint: it keeps the URL as written, or counters fenced
            // before would start again.
            self.config.url.expose_secret(),
            self.config.command,
            self.config.key_prefix,
            self.config.key,
            self.config.field,
            self.plan.value
        )
    }
}

impl IdempotentSinkFactory for RedisSinkFactory {
    type Sink = RedisSink;
    fn identity(&self) -> String {
        self.describe()
    }
    fn create(&self, context: SinkContext) -> Result<RedisSink, ConnectorError> {
        self.sink(&context)
    }
}

impl FencedSinkFactory for RedisSinkFactory {
    type Sink = RedisSink;
    fn identity(&self) -> String {
        self.describe()
    }
    /// The fence script compares the subtask's epoch key in the same
    /// atomic call that applies a batch, and each new owner raises it.
    fn fences_zombies(&self) -> bool {
        true
    }
    fn create(&self, context: SinkContext) -> Result<RedisSink, ConnectorError> {
        self.sink(&context)
    }
}

/// One subtask's Redis writer.
pub struct RedisSink {
    client: redis::Client,
    /// The URL as messages show it (see [`shown_url`]).
    url: String,
    connection: Option<MultiplexedConnection>,
    plan: Arc<Plan>,
    dead_letter_key: String,
    /// With several workers: the key holding the subtask's epoch, and this
    /// owner's epoch (see [`EPOCH_RAISE_SCRIPT`]).
    epoch: Option<(String, u64)>,
    /// With several workers: until when this worker may act on the region.
    acting: Option<exactly_core::acting::ActingGate>,
}

impl std::fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The fence script: KEYS[1] is the fence hash, KEYS[2] the dead-letter hash;
/// ARGV holds 6 values per record: split, offset, kind (`w` write, `d` dead
/// letter), key, field ('' for none), amount or dead-letter JSON. Keys written
/// by increments are not declared in KEYS, so it runs on standalone Redis (not
/// Redis Cluster).
///
/// With several workers, KEYS[3] is the subtask's epoch key and the last
/// ARGV this owner's epoch: the batch is applied only while the key holds
/// that epoch (a newer owner raised it: `{-1, 0, 0}`, nothing applied).
const FENCE_SCRIPT: &str = r#"
local applied, dead, skipped = 0, 0, 0
local n = #ARGV
if #KEYS >= 3 then
  if redis.call('GET', KEYS[3]) ~= ARGV[n] then return {-1, 0, 0} end
  n = n - 1
end
for i = 1, n, 6 do
  local split, offset, kind = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local key, field, arg = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  local fence = tonumber(redis.call('HGET', KEYS[1], split) or '-1')
  if offset > fence then
    if kind == 'd' then
      redis.call('HSET', KEYS[2], split .. '/' .. ARGV[i + 1], arg)
      dead = dead + 1
    elseif field == '' then
      redis.call('INCRBY', key, arg)
    else
      redis.call('HINCRBY', key, field, arg)
    end
    redis.call('HSET', KEYS[1], split, offset)
    if kind == 'w' then applied = applied + 1 end
  else
    skipped = skipped + 1
  end
end
return {applied, dead, skipped}
"#;

/// A new owner's recovery raises the subtask's epoch key (KEYS[1]) to its
/// epoch (ARGV[1]) unless it holds a higher one already (returned: this
/// owner is the zombie); `-1` when raised. From then on the fence script
/// refuses every batch of an older owner.
const EPOCH_RAISE_SCRIPT: &str = r#"
local held = tonumber(redis.call('GET', KEYS[1]) or '-1')
if held > tonumber(ARGV[1]) then return held end
redis.call('SET', KEYS[1], ARGV[1])
return -1
"#;

/// The error of a write or recovery by an owner whose epoch is older than
/// the subtask's.
fn fenced(mine: u64, held: Option<i64>) -> ConnectorError {
    let newer = held.map_or_else(|| "a newer owner".to_string(), |e| format!("a newer owner (epoch {e})"));
    ConnectorError::transient(
        "redis sink",
        format!(
            "{newer} recovered this sink subtask and this worker holds epoch {mine}: it lost the region (a \
             freeze or a cut-off past its lease) and writes nothing more to it"
        ),
    )
}

/// `url` as errors and logs show it: a password replaced by `***`.
fn shown_url(url: &str) -> String {
    match redis::parse_redis_url(url) {
        Some(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

fn redis_error(url: &str, e: redis::RedisError) -> ConnectorError {
    let error = if e.is_connection_refusal() || e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        ConnectorError::transient(
            "redis sink",
            format!("{url} (is redis-server running and reachable? the pipeline retries)"),
        )
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed {
        ConnectorError::fatal("redis sink", format!("{url} (check the password in the url)"))
    } else if matches!(
        e.kind(),
        redis::ErrorKind::ResponseError | redis::ErrorKind::ExtensionError | redis::ErrorKind::TypeError
    ) {
        // The server refused the command itself (e.g. WRONGTYPE, an increment
        // overflow): retrying the same records would fail the same way.
        ConnectorError::fatal(
            "redis sink",
            format!("{url} refused the write (a key holds another type, or a value does not fit: fix the key mapping or the data)"),
        )
    } else {
        ConnectorError::transient("redis sink", url)
    };
    error.caused_by(e)
}

fn dead_letter_json(record: &Record, reason: &str) -> String {
    serde_json::json!({
        "split": record.split,
        "offset": record.offset,
        "reason": reason,
        "key": record.key.as_deref().map(String::from_utf8_lossy),
        "value": record.value.as_deref().map(String::from_utf8_lossy),
    })
    .to_string()
}

impl RedisSink {
    async fn connection(&mut self) -> Result<MultiplexedConnection, ConnectorError> {
        if let Some(c) = &self.connection {
            return Ok(c.clone());
        }
        let connect = self.client.get_multiplexed_async_connection();
        let c = tokio::time::timeout(Duration::from_secs(5), connect)
            .await
            .map_err(|_| {
                ConnectorError::transient(
                    "redis sink",
                    format!("{}: no answer within 5 s (is redis-server running?)", self.url),
                )
            })?
            .map_err(|e| redis_error(&self.url, e))?;
        self.connection = Some(c.clone());
        Ok(c)
    }

    /// Sends a pipeline; a failed connection is dropped so the next call reconnects.
    async fn send(&mut self, pipe: &redis::Pipeline) -> Result<(), ConnectorError> {
        let mut con = self.connection().await?;
        let result: redis::RedisResult<()> = pipe.query_async(&mut con).await;
        self.check(result)
    }

    /// Runs the fence script; returns (writes applied, dead letters
    /// recorded, skipped), or `-1` applied when the epoch key refused it.
    async fn fence(&mut self, keys: Vec<String>, args: Vec<Vec<u8>>) -> Result<(i64, i64, i64), ConnectorError> {
        let mut con = self.connection().await?;
        let mut invocation = fence_script().prepare_invoke();
        for key in &keys {
            invocation.key(key);
        }
        for a in args {
            invocation.arg(a);
        }
        let result = invocation.invoke_async(&mut con).await;
        self.check(result)
    }

    fn check<T>(&mut self, result: redis::RedisResult<T>) -> Result<T, ConnectorError> {
        result.map_err(|e| {
            self.connection = None;
            redis_error(&self.url, e)
        })
    }
}

fn fence_script() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| redis::Script::new(FENCE_SCRIPT))
}

#[async_trait]
impl IdempotentSink for RedisSink {
    /// Holds no lock: a Redis connection bars nobody.
    async fn close(&mut self) -> Result<exactly_core::Closed, ConnectorError> {
        Ok(exactly_core::Closed::Released)
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        let mut con = self.connection().await?;
        let result: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .query_async(&mut con)
            .await;
        let appendonly: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .query_async(&mut con)
            .await;
        // Best effort: CONFIG may be disabled on managed servers.
        let (appendonly, appendfsync) = match (appendonly, result) {
            (Ok(a), Ok(f)) => (a, f),
            (Err(e), _) | (_, Err(e)) if e.is_io_error() || e.is_connection_refusal() || e.is_timeout() => {
                return Err(self.check::<()>(Err(e)).unwrap_err())
            }
            _ => {
                tracing::debug!(url = %self.url, "CONFIG GET not allowed; durability settings unknown");
                return Ok(());
            }
        };
        match (
            appendonly.get(1).map(String::as_str),
            appendfsync.get(1).map(String::as_str),
        ) {
            (Some("yes"), Some("always")) => {}
            (aof, fsync) => tracing::warn!(
                url = %self.url,
                appendonly = ?aof,
                appendfsync = ?fsync,
                "Redis does not fsync every write (appendonly yes + appendfsync always): after a crash of the \
                 Redis server itself, writes acknowledged before it may be lost while the pipeline's checkpoints \
                 already cover them"
            ),
        }
        Ok(())
    }

    async fn write(&mut self, batch: &[Record]) -> Result<WriteOutcome, ConnectorError> {
        let mut pipe = redis::pipe();
        let mut outcome = WriteOutcome::default();
        for r in batch {
            match self.plan.op(r) {
                Ok(op) => {
                    let name = match self.plan.command {
                        RedisCommand::Set => "SET",
                        RedisCommand::Hset => "HSET",
                        // Only with allow_duplicate_effects: increments without the fence.
                        RedisCommand::Incrby => "INCRBY",
                        RedisCommand::Hincrby => "HINCRBY",
                    };
                    let cmd = pipe.cmd(name).arg(&op.key);
                    if let Some(f) = &op.field {
                        cmd.arg(f);
                    }
                    cmd.arg(&op.value).ignore();
                    outcome.applied += 1;
                }
                Err(reason) => {
                    pipe.cmd("HSET")
                        .arg(&self.dead_letter_key)
                        .arg(format!("{}/{}", r.split, r.offset))
                        .arg(dead_letter_json(r, &reason))
                        .ignore();
                    outcome.dead_letters.push(DeadLetter {
                        split: r.split.to_string(),
                        offset: r.offset,
                        reason,
                    });
                }
            }
        }
        if !batch.is_empty() {
            self.send(&pipe).await?;
        }
        Ok(outcome)
    }
}

#[async_trait]
impl FencedSink for RedisSink {
    /// Holds no lock: a Redis connection bars nobody.
    async fn close(&mut self) -> Result<exactly_core::Closed, ConnectorError> {
        Ok(exactly_core::Closed::Released)
    }

    /// With several workers, also raises the subtask's epoch key to this
    /// owner's epoch (a script that never lowers it): no older owner's
    /// batch is applied after it.
    async fn open(&mut self) -> Result<(), ConnectorError> {
        IdempotentSink::open(self).await?;
        if let Some((key, mine)) = self.epoch.clone() {
            let mut con = self.connection().await?;
            let raised: redis::RedisResult<i64> = redis::Script::new(EPOCH_RAISE_SCRIPT)
                .key(&key)
                .arg(mine)
                .invoke_async(&mut con)
                .await;
            let held = self.check(raised)?;
            if held >= 0 {
                return Err(fenced(mine, Some(held)));
            }
        }
        Ok(())
    }

    async fn write_fenced(&mut self, scope: &str, batch: &[Record]) -> Result<WriteOutcome, ConnectorError> {
        if batch.is_empty() {
            return Ok(WriteOutcome::default());
        }
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(batch.len() * 6);
        let mut dead_letters = Vec::new();
        for r in batch {
            args.push(r.split.as_bytes().to_vec());
            args.push(r.offset.to_string().into_bytes());
            match self.plan.op(r) {
                Ok(op) => {
                    args.push(b"w".to_vec());
                    args.push(op.key);
                    args.push(op.field.unwrap_or_default());
                    args.push(op.value);
                }
                Err(reason) => {
                    args.push(b"d".to_vec());
                    args.push(Vec::new());
                    args.push(Vec::new());
                    args.push(dead_letter_json(r, &reason).into_bytes());
                    dead_letters.push(DeadLetter {
                        split: r.split.to_string(),
                        offset: r.offset,
                        reason,
                    });
                }
            }
        }
        if self.acting.as_ref().is_some_and(|a| !a.holds()) {
            return Err(ConnectorError::transient(
                "redis sink",
                "this worker's lease on the region may have run out (its deadline passed): not writing",
            ));
        }
        let mut keys = vec![format!("exactly:fence:{scope}"), self.dead_letter_key.clone()];
        if let Some((key, mine)) = &self.epoch {
            keys.push(key.clone());
            args.push(mine.to_string().into_bytes());
        }
        let (applied, fresh_dead, skipped) = self.fence(keys, args).await?;
        if applied < 0 {
            return Err(fenced(self.epoch.as_ref().map_or(0, |e| e.1), None));
        }
        let (applied, fresh_dead, skipped) = (applied as usize, fresh_dead as usize, skipped as usize);
        // Dead letters recorded by an earlier attempt were skipped by the fence and
        // are not counted again (the reasons logged are those of the batch).
        dead_letters.truncate(fresh_dead);
        Ok(WriteOutcome {
            applied,
            skipped,
            dead_letters,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(command: &str, extra: &str) -> Result<RedisSinkFactory, String> {
        let text = format!("url = \"redis://127.0.0.1:1/\"\ncommand = \"{command}\"\nkey = \"/id\"\n{extra}");
        let c: RedisSinkConfig = toml::from_str(&text).map_err(|e| e.to_string())?;
        RedisSinkFactory::new(c).map_err(|e| e.to_string())
    }

    #[test]
    fn increments_default_to_the_fence_and_refuse_replay_safe() {
        assert_eq!(config("incrby", "").unwrap().strategy(), Strategy::Fenced);
        let e = config("incrby", "strategy = \"replay-safe\"").unwrap_err();
        assert!(e.contains("counts twice") && e.contains("fenced"), "{e}");
        assert!(config("incrby", "strategy = \"replay-safe\"\nallow_duplicate_effects = true").is_ok());
        assert_eq!(config("set", "").unwrap().strategy(), Strategy::ReplaySafe);
        let e = config("hset", "").unwrap_err();
        assert!(e.contains("`field`"), "{e}");
        let e = config("set", "value = \"id\"").unwrap_err();
        assert!(e.contains("`value`") && e.contains("JSON pointer"), "{e}");
        let e = config("set", "value = \"/a~2\"").unwrap_err();
        assert!(e.contains("`value`") && e.contains("`~` must be followed"), "{e}");
    }

    /// The identity names the sink's checkpoints and its fence scope: it must
    /// not change between versions for the same configuration.
    #[test]
    fn the_password_stays_out_of_debug_and_messages() {
        let c: RedisSinkConfig =
            toml::from_str("url = \"redis://:s3cret@127.0.0.1:1/0\"\ncommand = \"set\"\nkey = \"key\"").unwrap();
        assert!(!format!("{c:?}").contains("s3cret"), "{c:?}");
        assert_eq!(shown_url(c.url.expose_secret()), "redis://:***@127.0.0.1:1/0");
        assert_eq!(shown_url("redis://127.0.0.1:1/"), "redis://127.0.0.1:1/");
    }

    #[test]
    fn the_identity_text_is_stable() {
        let f = config("incrby", "increment = \"/amount\"").unwrap();
        assert_eq!(
            f.describe(),
            "redis:url=redis://127.0.0.1:1/,command=Incrby,key=/id,field=None,value=Pointer(\"/amount\")"
        );
        let f = config("set", "value = \"=x\"").unwrap();
        assert!(f.describe().ends_with("value=Literal(\"x\")"), "{}", f.describe());
    }

    #[test]
    fn operations_are_derived_from_records() {
        let f = config("hincrby", "field = \"/kind\"\nincrement = \"/n\"\nkey_prefix = \"c:\"").unwrap();
        let r = Record::new("s-0", 1, r#"{"id": 7, "kind": "a", "n": 3}"#);
        assert_eq!(
            f.plan.op(&r).unwrap(),
            Op {
                key: b"c:7".to_vec(),
                field: Some(b"a".to_vec()),
                value: b"3".to_vec()
            }
        );
        let e = f.plan.op(&Record::new("s-0", 2, r#"{"kind": "a"}"#)).unwrap_err();
        assert!(e.contains("no key") && e.contains("/id"), "{e}");
        let e = f.plan.op(&Record::new("s-0", 3, "not json")).unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        let e = f
            .plan
            .op(&Record::new("s-0", 4, r#"{"id": 1, "kind": "a", "n": "x"}"#))
            .unwrap_err();
        assert!(e.contains("not an integer"), "{e}");
        let e = f.plan.op(&Record::new("s-0", 3, "not json")).unwrap_err();
        assert!(e.starts_with("no key: the value is not JSON"), "{e}");
    }

    /// Every pointer of a record is answered from one pass; a value that is
    /// not JSON is named after the first part that needed it.
    #[test]
    fn a_non_json_value_is_named_after_the_first_part_that_needed_it() {
        let plan = |text: &str| {
            let c: RedisSinkConfig = toml::from_str(&format!("url = \"redis://127.0.0.1:1/\"\n{text}")).unwrap();
            RedisSinkFactory::new(c).unwrap().plan
        };
        let bad = Record::new("s-0", 1, "not json");
        let set = plan("command = \"set\"\nkey = \"=k\"\nvalue = \"/v\"");
        let e = set.op(&bad).unwrap_err();
        assert!(e.starts_with("no value: the value is not JSON"), "{e}");
        let incr = plan("command = \"hincrby\"\nkey = \"=k\"\nfield = \"split\"\nincrement = \"/n\"");
        let e = incr.op(&bad).unwrap_err();
        assert!(e.starts_with("no increment: the value is not JSON"), "{e}");
        let by_field = plan("command = \"hset\"\nkey = \"=k\"\nfield = \"/f\"\nvalue = \"/v\"");
        let e = by_field.op(&bad).unwrap_err();
        assert!(e.starts_with("no hash field: the value is not JSON"), "{e}");
        let ok = by_field
            .op(&Record::new("s-0", 2, r#"{"f": "a", "v": {"x": 1}}"#))
            .unwrap();
        assert_eq!((ok.field, ok.value), (Some(b"a".to_vec()), br#"{"x":1}"#.to_vec()));
    }
}
