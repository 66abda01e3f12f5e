//! The input: the preloaded topic every throughput run reads, and the steady
//! stream of the latency phases.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use exactly_kafka::admin::KafkaAdmin;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use crate::changes::Changes;
use crate::workload::{order_json, partition_of, records_in_partition, unix_ms_now, PARTITIONS};

pub async fn create_topic(bootstrap: &str, topic: &str) -> Result<()> {
    KafkaAdmin::new(bootstrap)
        .create_topic(topic, PARTITIONS)
        .await
        .with_context(|| {
            format!("creating topic `{topic}` ({PARTITIONS} partitions); on an external Kafka it must not exist yet")
        })
}

/// Creates `topic` and produces records `0..n` into it (idempotent,
/// `acks=all`), then checks that the broker's end offsets are the records
/// produced: the ends the bounded pipelines and the baselines read up to.
pub fn preload(rt: &tokio::runtime::Runtime, bootstrap: &str, topic: &str, n: u64, linger_ms: u64) -> Result<()> {
    let order = |id: u64| (id.to_string(), Some(order_json(id)), partition_of(id));
    preload_with(rt, (bootstrap, topic), n, linger_ms, order, |p| {
        records_in_partition(n, p)
    })
}

/// [`preload`] of a keyed workload's topic (the upsert and Debezium rows).
pub fn preload_changes(
    rt: &tokio::runtime::Runtime,
    bootstrap: &str,
    changes: Changes,
    n: u64,
    linger_ms: u64,
) -> Result<()> {
    let record = |id: u64| {
        let r = changes.record(id, n);
        (r.key, r.value, r.partition)
    };
    preload_with(rt, (bootstrap, changes.topic()), n, linger_ms, record, |p| {
        changes.records_in_partition(n, p)
    })
}

/// Produces `record(id)` (key, value or tombstone, partition) for `id` in
/// `0..n` into a new `topic` and checks its end offsets against `ends`.
fn preload_with(
    rt: &tokio::runtime::Runtime,
    (bootstrap, topic): (&str, &str),
    n: u64,
    linger_ms: u64,
    record: impl Fn(u64) -> (String, Option<String>, i32),
    ends: impl Fn(i32) -> i64,
) -> Result<()> {
    rt.block_on(async {
        create_topic(bootstrap, topic).await?;
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", linger_ms.to_string())
            .set("batch.size", "1000000")
            .set("message.timeout.ms", "300000")
            .create()?;
        let mut pending = Vec::new();
        for id in 0..n {
            let (key, value, partition) = record(id);
            let mut message = FutureRecord::to(topic).key(key.as_bytes()).partition(partition);
            if let Some(value) = &value {
                message = message.payload(value.as_bytes());
            }
            loop {
                match producer.send_result(message) {
                    Ok(delivery) => break pending.push(delivery),
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        message = r;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => bail!("producing record {id}: {e}"),
                }
            }
            if pending.len() >= 50_000 || id + 1 == n {
                for delivery in pending.drain(..) {
                    delivery
                        .await
                        .map_err(|_| anyhow!("the producer was dropped"))?
                        .map_err(|(e, _)| anyhow!("delivery failed: {e}"))?;
                }
            }
        }
        anyhow::Ok(())
    })?;
    let offsets = end_offsets(bootstrap, topic, &(0..PARTITIONS).collect::<Vec<_>>())?;
    for (p, end) in offsets {
        let produced = ends(p);
        if end != produced {
            bail!(
                "partition {p} of `{topic}` ends at offset {end}, but {produced} records were produced into it: \
                 the broker lost or duplicated records (is another producer writing to `{topic}`?)"
            );
        }
    }
    Ok(())
}

/// The end offset (high watermark) of each of `partitions`, as the source
/// reads it for `stop_at_end`.
pub fn end_offsets(bootstrap: &str, topic: &str, partitions: &[i32]) -> Result<Vec<(i32, i64)>> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    partitions
        .iter()
        .map(|&p| {
            let (_, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(30))
                .with_context(|| format!("reading the end offset of partition {p} of `{topic}`"))?;
            Ok((p, high))
        })
        .collect()
}

/// One produced record: partition, offset, produce time and time its
/// delivery was acknowledged (Unix ms).
pub type Produced = (i32, i64, f64, f64);

/// Produces `rate` records/s for `secs` seconds into `topic`, each with its
/// produce time as the Kafka timestamp, and returns where each landed.
pub fn produce_steadily(bootstrap: &str, topic: &str, rate: u64, secs: u64) -> Result<Vec<Produced>> {
    // The deliveries are awaited on the worker thread as they come, so their
    // acknowledgement times are exact.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .create()?;
        let total = rate * secs;
        let started = Instant::now();
        let mut pending = Vec::with_capacity(total as usize);
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut sent = 0u64;
        while sent < total {
            tick.tick().await;
            let due = ((started.elapsed().as_secs_f64() * rate as f64) as u64 + 1).min(total);
            while sent < due {
                let now = unix_ms_now();
                let value = order_json(sent);
                let key = sent.to_string();
                let record = FutureRecord::to(topic)
                    .payload(value.as_bytes())
                    .key(key.as_bytes())
                    .partition(partition_of(sent))
                    .timestamp(now as i64);
                let delivery = producer
                    .send_result(record)
                    .map_err(|(e, _)| anyhow!("producing the latency records: {e}"))?;
                let ts = now.floor();
                pending.push(tokio::spawn(async move {
                    let outcome = delivery.await;
                    (ts, unix_ms_now(), outcome)
                }));
                sent += 1;
            }
        }
        let mut produced = Vec::with_capacity(pending.len());
        for task in pending {
            let (ts, acked, outcome) = task.await?;
            let d = outcome
                .map_err(|_| anyhow!("the producer was dropped"))?
                .map_err(|(e, _)| anyhow!("delivery failed: {e}"))?;
            produced.push((d.partition, d.offset, ts, acked));
        }
        anyhow::Ok(produced)
    })
}
