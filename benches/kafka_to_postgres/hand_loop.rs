//! The loop a user would write by hand instead of using exactly (issue 15):
//! exactly-once by storing the next offsets in PostgreSQL with the rows.
//!
//! Per task: an rdkafka `StreamConsumer` on its two partitions (explicit
//! assignment at the offsets the offsets table holds, `read_committed`, the
//! Kafka source's prefetch settings), batches of at most [`HAND_BATCH`]
//! records or [`HAND_LINGER`], each batch one transaction: a binary COPY of
//! (partition, offset, key, value as text) and an upsert of the partitions'
//! next offsets into `<table>_offsets`. Two tasks on one runtime, in one
//! process. A crash loses nothing and duplicates nothing: rows and offsets
//! commit together, and a restart resumes from the stored offsets.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;

use crate::baselines::{consumer_config, Args, Progress};
use crate::input::end_offsets;
use crate::services::pg_connect;
use crate::workload::{owned_partitions, PARALLELISM};

/// Most records per transaction.
pub const HAND_BATCH: usize = 5000;
/// Longest a batch waits for more records after its first.
pub const HAND_LINGER: Duration = Duration::from_millis(50);

const COLUMNS: [Type; 4] = [Type::INT4, Type::INT8, Type::TEXT, Type::TEXT];

/// The offsets table of the loop writing `table`.
pub fn offsets_table(table: &str) -> String {
    format!("{table}_offsets")
}

/// Runs both tasks; prints `records=`, `rows=` and `copies=` (transactions).
pub fn run(args: &Args) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let (records, transactions) = rt.block_on(async {
        let offsets = offsets_table(&args.table);
        let setup = pg_connect(&args.pg_url).await?;
        setup
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {offsets} (part integer PRIMARY KEY, next bigint NOT NULL)"
            ))
            .await?;
        let mut tasks = Vec::new();
        for s in 0..PARALLELISM {
            let mut client = pg_connect(&args.pg_url).await?;
            let consumer = assign(args, &client, &owned_partitions(s)).await?;
            let ends = if args.follow {
                Vec::new()
            } else {
                end_offsets(&args.bootstrap, &args.topic, &owned_partitions(s))?
            };
            let (table, follow) = (args.table.clone(), args.follow);
            tasks.push(tokio::spawn(async move {
                task(&consumer, &mut client, &table, &ends, follow).await
            }));
        }
        eprintln!("[baseline] hand loop: assigned and connected");
        println!("ready");
        let (mut records, mut transactions) = (0, 0);
        for t in tasks {
            let (r, n) = t.await.map_err(|_| anyhow!("a task panicked"))??;
            records += r;
            transactions += n;
        }
        anyhow::Ok((records, transactions))
    })?;
    println!("records={records}");
    println!("rows={records}");
    println!("copies={transactions}");
    Ok(())
}

/// A consumer assigned `partitions` at the offsets the table stores (the
/// beginning for a partition without one).
async fn assign(args: &Args, client: &tokio_postgres::Client, partitions: &[i32]) -> Result<StreamConsumer> {
    let stored = client
        .query(
            &format!(
                "SELECT part, next FROM {} WHERE part = ANY($1)",
                offsets_table(&args.table)
            ),
            &[&partitions],
        )
        .await?;
    let stored: BTreeMap<i32, i64> = stored.iter().map(|r| (r.get(0), r.get(1))).collect();
    let consumer: StreamConsumer = consumer_config(&args.bootstrap).create()?;
    let mut list = TopicPartitionList::new();
    for p in partitions {
        let at = stored.get(p).map_or(Offset::Beginning, |o| Offset::Offset(*o));
        list.add_partition_offset(&args.topic, *p, at)?;
    }
    consumer.assign(&list)?;
    Ok(consumer)
}

/// One task: batches until every partition reached its end (or forever
/// when following). Returns (records, transactions).
async fn task(
    consumer: &StreamConsumer,
    client: &mut tokio_postgres::Client,
    table: &str,
    ends: &[(i32, i64)],
    follow: bool,
) -> Result<(u64, u64)> {
    let copy = format!("COPY {table} (part, off, key, value) FROM STDIN (FORMAT binary)");
    let upsert = client
        .prepare(&format!(
            "INSERT INTO {} (part, next) SELECT * FROM unnest($1::int[], $2::bigint[]) \
             ON CONFLICT (part) DO UPDATE SET next = EXCLUDED.next",
            offsets_table(table)
        ))
        .await?;
    let mut progress = Progress::new(ends);
    let (mut records, mut transactions) = (0, 0);
    while follow || !progress.done() {
        let batch = next_batch(consumer).await?;
        if batch.is_empty() {
            continue;
        }
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        let txn = client.transaction().await?;
        let writer = BinaryCopyInWriter::new(txn.copy_in(&copy).await?, &COLUMNS);
        let mut writer = std::pin::pin!(writer);
        for m in &batch {
            let key = m.key().map(std::str::from_utf8).transpose()?;
            let value = m.payload().map(std::str::from_utf8).transpose()?;
            writer
                .as_mut()
                .write(&[&m.partition(), &m.offset(), &key, &value])
                .await?;
            next.insert(m.partition(), m.offset() + 1);
        }
        writer.finish().await?;
        let (parts, offsets): (Vec<i32>, Vec<i64>) = next.iter().map(|(p, o)| (*p, *o)).unzip();
        txn.execute(&upsert, &[&parts, &offsets]).await?;
        txn.commit().await?;
        for (p, o) in next {
            progress.saw(p, o - 1);
        }
        records += batch.len() as u64;
        transactions += 1;
    }
    Ok((records, transactions))
}

/// Up to [`HAND_BATCH`] messages: waits up to a second for the first, then
/// at most [`HAND_LINGER`] for the rest.
async fn next_batch(consumer: &StreamConsumer) -> Result<Vec<BorrowedMessage<'_>>> {
    let mut batch = Vec::new();
    let first = match tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await {
        Ok(m) => m.context("consuming")?,
        Err(_) => return Ok(batch),
    };
    batch.push(first);
    let deadline = tokio::time::Instant::now() + HAND_LINGER;
    while batch.len() < HAND_BATCH {
        match tokio::time::timeout_at(deadline, consumer.recv()).await {
            Ok(m) => batch.push(m.context("consuming")?),
            Err(_) => break,
        }
    }
    Ok(batch)
}
