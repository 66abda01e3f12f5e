//! The baselines that read the topic as the exactly source does, with
//! exactly-kafka-wire's [`Fetcher`] (read_committed, one Fetch in flight per
//! leader, 4 MiB read ahead): the raw fetch (the source's ceiling) and the
//! reading half of the minimal loop (the machine's ceiling). A ceiling read
//! with librdkafka would sit below what the pipelines read with, and every
//! ratio to it would flatter them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use exactly_kafka::wire::{FetchSettings, Fetcher, WireConfig};

use crate::baselines::{Args, Progress};
use crate::input::end_offsets;
use crate::workload::{owned_partitions, BATCH, PARALLELISM};

/// How long a reader waits for a chunk before it looks at its progress.
const WAIT: Duration = Duration::from_millis(100);

/// A fetcher of subtask `s`'s partitions from their beginning, and unless
/// following, the end offsets it reads up to.
fn open(args: &Args, s: usize) -> Result<(Fetcher, Vec<(i32, i64)>)> {
    let partitions = owned_partitions(s);
    let ends = if args.follow {
        Vec::new()
    } else {
        end_offsets(&args.bootstrap, &args.topic, &partitions)?
    };
    let config = WireConfig::new(&args.bootstrap)?;
    let starts: BTreeMap<i32, i64> = partitions.iter().map(|p| (*p, 0)).collect();
    let fetcher = Fetcher::start(
        config,
        &args.topic,
        starts,
        FetchSettings::default(),
        Default::default(),
    );
    Ok((fetcher, ends))
}

/// The source's ceiling: two fetchers read their partitions to the end,
/// nothing else.
pub fn raw_fetch(args: &Args) -> Result<()> {
    let started = Instant::now();
    let rt = tokio::runtime::Runtime::new()?;
    let (records, bytes) = rt.block_on(async {
        let mut tasks = Vec::new();
        for s in 0..PARALLELISM {
            let (mut fetcher, ends) = open(args, s)?;
            tasks.push(tokio::spawn(async move {
                let mut progress = Progress::new(&ends);
                let (mut records, mut bytes) = (0u64, 0u64);
                while !progress.done() {
                    let Some(chunk) = fetcher.next(WAIT).await? else {
                        continue;
                    };
                    for record in &chunk.records {
                        records += 1;
                        bytes += record.value.as_ref().map_or(0, Bytes::len) as u64;
                    }
                    progress.saw(chunk.partition, chunk.next_offset - 1);
                }
                anyhow::Ok((records, bytes))
            }));
        }
        eprintln!("[baseline] fetch: started after {:.0?}", started.elapsed());
        let (mut records, mut bytes) = (0, 0);
        for t in tasks {
            let (r, b) = t.await.map_err(|_| anyhow!("a fetch task panicked"))??;
            records += r;
            bytes += b;
        }
        anyhow::Ok((records, bytes))
    })?;
    eprintln!("[baseline] fetch: {records} records after {:.0?}", started.elapsed());
    println!("records={records}");
    println!("bytes={bytes}");
    Ok(())
}

/// A row of the orders table, its payload a slice of the fetched answer.
pub struct Row {
    pub part: i32,
    pub off: i64,
    pub id: i64,
    pub ts: SystemTime,
    pub payload: Bytes,
    /// Bytes of value and key: what the sink counts towards its segment.
    pub data_bytes: usize,
}

#[derive(serde::Deserialize)]
struct IdOnly {
    id: i64,
}

/// Starts reading subtask `s`'s partitions for the minimal loop: a task
/// turns records into rows (JSON parsed for the id, as the sink does) and
/// hands them to `tx` in batches of up to [`BATCH`], up to the end offsets
/// (or for ever when following). Its result is the records read.
pub fn spawn_reader(
    rt: &tokio::runtime::Runtime,
    args: &Args,
    s: usize,
    tx: tokio::sync::mpsc::Sender<Vec<Row>>,
) -> Result<tokio::task::JoinHandle<Result<u64>>> {
    let _entered = rt.enter();
    let (mut fetcher, ends) = open(args, s)?;
    let follow = args.follow;
    Ok(rt.spawn(async move {
        let mut progress = Progress::new(&ends);
        let mut records = 0;
        while follow || !progress.done() {
            let Some(chunk) = fetcher.next(WAIT).await? else {
                continue;
            };
            progress.saw(chunk.partition, chunk.next_offset - 1);
            for part in chunk.records.chunks(BATCH) {
                let batch = part
                    .iter()
                    .map(|record| {
                        let payload = record.value.clone().unwrap_or_default();
                        let id = serde_json::from_slice::<IdOnly>(&payload)
                            .with_context(|| {
                                format!(
                                    "record {} of partition {} has no numeric /id",
                                    record.offset, chunk.partition
                                )
                            })?
                            .id;
                        Ok(Row {
                            part: chunk.partition,
                            off: record.offset,
                            id,
                            ts: UNIX_EPOCH + Duration::from_millis(record.timestamp.max(0) as u64),
                            data_bytes: payload.len() + record.key.as_ref().map_or(0, Bytes::len),
                            payload,
                        })
                    })
                    .collect::<Result<Vec<Row>>>()?;
                records += batch.len() as u64;
                if tx.send(batch).await.is_err() {
                    bail!("the COPY task stopped (see its error)");
                }
            }
        }
        Ok(records)
    }))
}
