//! `exactly status pipeline.toml`: what a pipeline's checkpoint folder, its
//! sink and its source say about it, without running it and without taking
//! its lock.
//!
//! - every checkpoint sequence (the pipeline's, or one per region): the
//!   latest complete checkpoint (id, age, per-split positions), what it
//!   lists as pending, newer entries that cannot be read;
//! - whether a process holds the pipeline's lock (read from `/proc/locks`,
//!   never by locking), and who wrote it;
//! - the sink's prepared transactions of this pipeline, each marked with
//!   what the next recovery does to it (commit: the checkpoint lists it;
//!   roll back: it does not);
//! - the consumer lag per partition (Kafka source).
//!
//! A part that cannot be read (an unreachable database or broker) is
//! reported as a problem, with the rest; the command then fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use exactly_core::{CheckpointEntry, Checkpoints, PreparedTransaction, Scope, SplitPositions};
use serde::Serialize;

use super::lag::{KafkaLagProbe, PartitionLag};

/// How long `exactly status` waits for the brokers' end offsets.
const LAG_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
use super::redact::redact;
use crate::config::{PipelineFile, SourceSection, StoreSection};

/// One sequence of checkpoints: the pipeline's own, or a region's
/// (`<dir>/<pipeline>/region-<i>/` in the folder store).
#[derive(Clone, Debug)]
pub struct Sequence {
    /// `None`: the pipeline's own sequence.
    pub region: Option<usize>,
    /// Its checkpoints, in whichever store the pipeline file names.
    pub checkpoints: Checkpoints,
}

/// The pipeline's checkpoint sequences: the regions' when the store has
/// any (region failover), else the pipeline's own. Empty when the store
/// cannot be used.
pub async fn sequences(file: &PipelineFile) -> Vec<Sequence> {
    let Ok(store) = file.checkpoint_store() else {
        return Vec::new();
    };
    let regions = store.regions().await.unwrap_or_default();
    let own = Checkpoints::new(store.sequence(Scope::Global), store.retain());
    let own_has_entries = own.list().await.is_ok_and(|l| !l.is_empty());
    let mut out = Vec::new();
    if regions.is_empty() || own_has_entries {
        out.push(Sequence {
            region: None,
            checkpoints: own,
        });
    }
    for r in regions {
        out.push(Sequence {
            region: Some(r),
            checkpoints: Checkpoints::new(store.sequence(Scope::Region(r)), store.retain()),
        });
    }
    out
}

/// The positions of the latest complete checkpoint of every sequence,
/// merged (`None`: no sequence has one).
pub async fn latest_positions(sequences: &[Sequence]) -> Option<SplitPositions> {
    let mut merged: Option<SplitPositions> = None;
    for s in sequences {
        if let Ok(Some(entry)) = s.checkpoints.latest().await {
            merged
                .get_or_insert_with(Default::default)
                .merge(&entry.checkpoint.positions);
        }
    }
    merged
}

/// The whole report (`--json` prints it as is).
#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// The pipeline's name.
    pub pipeline: String,
    /// Its checkpoint folder.
    pub folder: String,
    /// Whether a process holds the pipeline's lock now.
    pub running: Running,
    /// Per checkpoint sequence.
    pub checkpoints: Vec<SequenceStatus>,
    /// The sink's prepared transactions of this pipeline (`None`: the sink
    /// cannot list them, or it could not be asked).
    pub prepared_transactions: Option<Vec<PreparedStatus>>,
    /// Per partition (`None`: not a Kafka source, or the brokers could not
    /// be asked).
    pub consumer_lag: Option<Vec<PartitionLag>>,
    /// The sum of `consumer_lag`.
    pub total_lag: Option<i64>,
    /// With `[workers]`: the live workers and who leases which region
    /// (`None` without `[workers]`, or when the leases cannot be read).
    pub workers: Option<WorkersStatus>,
    /// What could not be read, with the fix.
    pub problems: Vec<String>,
}

/// The workers of a pipeline with `[workers]`, as the store's clock sees
/// them.
#[derive(Debug, Serialize)]
pub struct WorkersStatus {
    /// Every membership row: the worker (`host:pid:tag`) and the seconds
    /// until its membership runs out (negative: ran out, a dead worker).
    pub members: Vec<(String, f64)>,
    /// Per region: its lease.
    pub regions: Vec<LeaseStatus>,
}

/// One region's lease.
#[derive(Debug, Serialize)]
pub struct LeaseStatus {
    /// The region.
    pub region: usize,
    /// The worker holding the lease (`None`: free, released or never
    /// claimed).
    pub owner: Option<String>,
    /// The region's epoch (raised by every claim).
    pub epoch: u64,
    /// Seconds until the lease runs out on the store's clock (negative:
    /// ran out; its next claimant fences the owner).
    pub expires_in_seconds: f64,
}

/// Who holds the pipeline's lock.
#[derive(Debug, Serialize)]
pub struct Running {
    /// `Some(true)`: a process holds it; `None`: unknown (no `/proc/locks`).
    pub locked: Option<bool>,
    /// What the latest holder wrote into the lock file.
    pub holder: Option<String>,
}

/// One checkpoint sequence.
#[derive(Debug, Serialize)]
pub struct SequenceStatus {
    /// `None`: the pipeline's own sequence.
    pub region: Option<usize>,
    /// Its folder.
    pub folder: String,
    /// The latest complete checkpoint.
    pub latest: Option<CheckpointSummary>,
    /// Entries newer than it that cannot be read: `(name, why)`.
    pub unreadable: Vec<(String, String)>,
    /// The highest checkpoint every sink has committed (`committed-through`).
    pub committed_through: Option<u64>,
    /// Checkpoint ids reserved so far (`id-watermark`).
    pub id_watermark: Option<u64>,
    /// Who last took the sequence (its epoch's owner), where the store
    /// records it (the PostgreSQL store; the folder store's live in the
    /// running process).
    pub owner: Option<String>,
    /// The sequence's epoch, with `owner`.
    pub epoch: Option<u64>,
}

/// A checkpoint, for people.
#[derive(Debug, Serialize)]
pub struct CheckpointSummary {
    /// Its id.
    pub id: u64,
    /// Its entry's file name.
    pub entry: String,
    /// When it was written, Unix ms.
    pub created_unix_ms: u64,
    /// Seconds since.
    pub age_seconds: f64,
    /// Next offset per split.
    pub positions: BTreeMap<String, i64>,
    /// Per sink subtask: the committables it lists (committed on recovery).
    pub pending: BTreeMap<usize, Vec<PendingSummary>>,
}

/// A pending committable of a checkpoint.
#[derive(Debug, Serialize)]
pub struct PendingSummary {
    /// The checkpoint whose transaction it is.
    pub checkpoint: u64,
    /// The sink's committable (a gid, a transactional id, a file name...).
    pub committable: serde_json::Value,
}

/// A prepared transaction, and what the next recovery does to it.
#[derive(Debug, Serialize)]
pub struct PreparedStatus {
    /// As the sink reports it.
    #[serde(flatten)]
    pub transaction: PreparedTransaction,
    /// The latest checkpoint lists it as pending.
    pub listed: bool,
    /// `"commit"` (listed) or `"roll back"`.
    pub on_recovery: &'static str,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Reads everything. Fails only when the pipeline file cannot be used;
/// what cannot be read otherwise lands in [`StatusReport::problems`].
pub async fn status(file: &PipelineFile) -> anyhow::Result<StatusReport> {
    let store = file
        .checkpoint_store()
        .map_err(|e| anyhow::anyhow!(redact(&e.to_string())))?;
    let sequences = sequences(file).await;
    let mut problems = Vec::new();
    let folder = store.location();
    let on_folder = file.checkpoint.store.is_none();
    if on_folder && !file.store().dir().exists() {
        problems.push(format!(
            "the checkpoint folder {folder} does not exist: the pipeline has never run with this [checkpoint] dir \
             and name (check both in the pipeline file)"
        ));
    }
    let mut checkpoints = Vec::new();
    for s in &sequences {
        checkpoints.push(sequence_status(s, &mut problems).await);
    }
    let listed: Vec<&serde_json::Value> = checkpoints
        .iter()
        .filter_map(|s| s.latest.as_ref())
        .flat_map(|l| l.pending.values().flatten().map(|p| &p.committable))
        .collect();

    let (sink, _) = file
        .sink_factory()
        .map_err(|e| anyhow::anyhow!(redact(&e.to_string())))?;
    let prepared = match sink.prepared_transactions(&file.name).await {
        Ok(None) => None,
        Ok(Some(list)) => Some(
            list.into_iter()
                .map(|transaction| {
                    let is_listed = listed.iter().any(|c| names(c, &transaction.name));
                    PreparedStatus {
                        transaction,
                        listed: is_listed,
                        on_recovery: if is_listed { "commit" } else { "roll back" },
                    }
                })
                .collect(),
        ),
        Err(e) => {
            problems.push(format!(
                "cannot list the sink's prepared transactions: {}",
                redact(&e.to_string())
            ));
            None
        }
    };

    let consumer_lag = match &file.source {
        SourceSection::Kafka(k) => {
            let mut probe = KafkaLagProbe::new(k);
            let positions = latest_positions(&sequences).await;
            let reading = tokio::time::timeout(LAG_TIMEOUT, probe.lag(positions.as_ref())).await;
            match reading.unwrap_or_else(|_| Err(format!("no answer from Kafka within {LAG_TIMEOUT:?}"))) {
                Ok(lag) => Some(lag),
                Err(e) => {
                    problems.push(format!("cannot read the consumer lag: {}", redact(&e)));
                    None
                }
            }
        }
        SourceSection::Sequence(_) | SourceSection::Plugin(_) => None,
    };
    let workers = match (&file.workers, store.leases()) {
        (Some(_), Some(leases)) => match leases.view(file.parallelism).await {
            Ok(view) => Some(workers_status(&view)),
            Err(e) => {
                problems.push(format!("cannot read the workers' leases: {}", redact(&e.to_string())));
                None
            }
        },
        _ => None,
    };
    Ok(StatusReport {
        workers,
        pipeline: file.name.clone(),
        folder,
        running: match &file.checkpoint.store {
            None => running(file.store().dir()),
            Some(StoreSection::Postgres(url)) => running_on_postgres(url, &file.name).await,
        },
        checkpoints,
        prepared_transactions: prepared,
        total_lag: consumer_lag.as_ref().map(|l| l.iter().map(|p| p.lag).sum()),
        consumer_lag,
        problems,
    })
}

/// The membership and lease rows as seconds from the store's `now`.
fn workers_status(view: &exactly_core::membership::View) -> WorkersStatus {
    let from_now = |t: exactly_core::membership::DbTime| (t.0 as f64 - view.now.0 as f64) / 1000.0;
    WorkersStatus {
        members: view
            .members
            .iter()
            .map(|m| (m.worker.0.clone(), from_now(m.expires)))
            .collect(),
        regions: view
            .leases
            .iter()
            .enumerate()
            .map(|(region, lease)| LeaseStatus {
                region,
                owner: lease.owner.as_ref().map(|w| w.0.clone()),
                epoch: lease.epoch.0,
                expires_in_seconds: from_now(lease.expires),
            })
            .collect(),
    }
}

/// Whether `value` holds the string `name` anywhere (a committable naming
/// the transaction).
fn names(value: &serde_json::Value, name: &str) -> bool {
    match value {
        serde_json::Value::String(s) => s == name,
        serde_json::Value::Array(items) => items.iter().any(|v| names(v, name)),
        serde_json::Value::Object(fields) => fields.values().any(|v| names(v, name)),
        _ => false,
    }
}

async fn sequence_status(s: &Sequence, problems: &mut Vec<String>) -> SequenceStatus {
    let folder = s.checkpoints.location();
    let head = s.checkpoints.head().await.ok();
    let mut status = SequenceStatus {
        region: s.region,
        folder: folder.clone(),
        latest: None,
        unreadable: Vec::new(),
        committed_through: head.as_ref().and_then(|h| h.committed_through).map(|c| c.0),
        id_watermark: head.as_ref().and_then(|h| h.id_watermark).map(|c| c.0),
        owner: head.as_ref().and_then(|h| h.owner.clone()),
        epoch: head.as_ref().filter(|h| h.owner.is_some()).map(|h| h.epoch.0),
    };
    let names = match s.checkpoints.list().await {
        Ok(names) => names,
        Err(e) => {
            problems.push(format!(
                "cannot list the checkpoints in {folder}: {}",
                redact(&e.to_string())
            ));
            return status;
        }
    };
    for name in names.iter().rev() {
        match s.checkpoints.read(&name.file_name).await {
            Ok(entry) => {
                status.latest = Some(summary(&entry));
                break;
            }
            Err(why) => status.unreadable.push((name.file_name.clone(), why.kind.to_string())),
        }
    }
    status
}

/// A readable form of an entry.
pub fn summary(entry: &CheckpointEntry) -> CheckpointSummary {
    CheckpointSummary {
        id: entry.checkpoint.id.0,
        entry: entry.file_name(),
        created_unix_ms: entry.created_unix_ms,
        age_seconds: now_ms().saturating_sub(entry.created_unix_ms) as f64 / 1000.0,
        positions: entry.checkpoint.positions.0.clone(),
        pending: entry
            .checkpoint
            .pending
            .iter()
            .map(|(subtask, list)| {
                let list = list
                    .iter()
                    .map(|p| PendingSummary {
                        checkpoint: p.checkpoint.0,
                        committable: p.committable.clone(),
                    })
                    .collect();
                (*subtask, list)
            })
            .collect(),
    }
}

/// Who holds the pipeline's lock on the PostgreSQL store (its advisory
/// lock), asked without taking it.
async fn running_on_postgres(url: &str, pipeline: &str) -> Running {
    let Ok(store) = exactly_store_postgres::PgCheckpointStore::new(url, pipeline, 1) else {
        return Running {
            locked: None,
            holder: None,
        };
    };
    match store.holder().await {
        Ok(holder) => Running {
            locked: Some(holder.is_some()),
            holder,
        },
        Err(_) => Running {
            locked: None,
            holder: None,
        },
    }
}

/// Reads the lock file and `/proc/locks` (an `flock` on the file's inode
/// means a process holds it); never locks anything.
fn running(dir: &Path) -> Running {
    let path = dir.join(exactly_core::store::LOCK_FILE);
    let holder = std::fs::read_to_string(&path)
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    let locked = lock_held(&path);
    Running { locked, holder }
}

fn lock_held(path: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let inode = match std::fs::metadata(path) {
        Ok(m) => m.ino(),
        Err(_) => return Some(false),
    };
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    // `1: FLOCK  ADVISORY  WRITE 1234 08:01:123456 0 EOF`
    Some(locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&"FLOCK")
            && fields
                .iter()
                .find(|f| f.matches(':').count() == 2)
                .and_then(|f| f.rsplit(':').next())
                .and_then(|i| i.parse::<u64>().ok())
                == Some(inode)
    }))
}

fn age(seconds: f64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(seconds.max(0.0) as u64)).to_string()
}

/// The report as text.
pub fn render_text(r: &StatusReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "pipeline {}  (checkpoints in {})", r.pipeline, r.folder);
    let running = match (r.running.locked, &r.running.holder) {
        (Some(true), Some(h)) => format!("running: {h}"),
        (Some(true), None) => "running: yes".into(),
        (Some(false), Some(h)) => format!("not running (last run: {h})"),
        (Some(false), None) => "not running".into(),
        (None, _) => "running: unknown (no /proc/locks, or the store cannot be asked)".into(),
    };
    let _ = writeln!(out, "{running}");
    if let Some(w) = &r.workers {
        let live = w.members.iter().filter(|(_, left)| *left >= 0.0).count();
        let _ = writeln!(out, "workers: {live} live");
        for (worker, left) in &w.members {
            let state = if *left >= 0.0 { "live" } else { "gone" };
            let _ = writeln!(out, "  {worker:<40} {state} (membership {left:+.1} s)");
        }
        for l in &w.regions {
            let _ = match &l.owner {
                Some(owner) if l.expires_in_seconds >= 0.0 => writeln!(
                    out,
                    "  region {}: owned by {owner}, epoch {}, lease runs out in {:.1} s",
                    l.region, l.epoch, l.expires_in_seconds
                ),
                Some(owner) => writeln!(
                    out,
                    "  region {}: lease of {owner} ran out {:.1} s ago (epoch {}): the next claim fences it",
                    l.region, -l.expires_in_seconds, l.epoch
                ),
                None => writeln!(out, "  region {}: free (epoch {})", l.region, l.epoch),
            };
        }
    }
    for s in &r.checkpoints {
        let scope = s.region.map_or_else(String::new, |i| format!("region {i}: "));
        match &s.latest {
            None => {
                let _ = writeln!(out, "\n{scope}no complete checkpoint in {}", s.folder);
            }
            Some(l) => {
                let _ = writeln!(
                    out,
                    "\n{scope}latest complete checkpoint {}  ({} ago, entry {})",
                    l.id,
                    age(l.age_seconds),
                    l.entry
                );
                let _ = writeln!(out, "  positions (next offset per split):");
                for (split, offset) in &l.positions {
                    let _ = writeln!(out, "    {split:<40} {offset}");
                }
                let listed: usize = l.pending.values().map(Vec::len).sum();
                if listed == 0 {
                    let _ = writeln!(out, "  pending: nothing (every transaction it covers is committed)");
                } else {
                    let _ = writeln!(out, "  pending (committed by the next recovery if not yet):");
                    write_pending(&mut out, &l.pending);
                }
            }
        }
        for (name, why) in &s.unreadable {
            let _ = writeln!(out, "  UNREADABLE newer entry {name}: {why}");
        }
        if let Some(c) = s.committed_through {
            let _ = writeln!(out, "  committed through checkpoint {c}");
        }
        if let (Some(owner), Some(epoch)) = (&s.owner, s.epoch) {
            let _ = writeln!(out, "  taken by {owner} (epoch {epoch})");
        }
    }
    match &r.prepared_transactions {
        None => {}
        Some(list) if list.is_empty() => {
            let _ = writeln!(out, "\nprepared transactions of this pipeline in the sink: none");
        }
        Some(list) => {
            let _ = writeln!(
                out,
                "\nprepared transactions of this pipeline in the sink: {}",
                list.len()
            );
            for p in list {
                let t = &p.transaction;
                let subtask = t.subtask.map_or("?".into(), |s| s.to_string());
                let checkpoint = t.checkpoint.map_or("?".into(), |c| c.to_string());
                let what = if p.listed {
                    "listed in the checkpoint: recovery commits it"
                } else {
                    "not listed: recovery rolls it back"
                };
                let _ = writeln!(
                    out,
                    "    {}  subtask {subtask}  checkpoint {checkpoint}  {what}",
                    t.name
                );
            }
        }
    }
    if let Some(lag) = &r.consumer_lag {
        let _ = writeln!(out, "\nconsumer lag (end offset - checkpointed position):");
        for p in lag {
            let position = p.position.map_or("-".into(), |o| o.to_string());
            let _ = writeln!(
                out,
                "    {}  partition {:<3}  position {position:>10}  end {:>10}  lag {:>10}",
                p.topic, p.partition, p.end, p.lag
            );
        }
        let _ = writeln!(out, "    total lag {}", r.total_lag.unwrap_or_default());
    }
    for p in &r.problems {
        let _ = writeln!(out, "\nPROBLEM: {p}");
    }
    out
}

/// The folder of an entry given by path: `(checkpoint root, pipeline or
/// region folder name, entry name)`.
pub fn split_entry_path(path: &Path) -> Option<(PathBuf, String, String)> {
    let name = path.file_name()?.to_str()?.to_string();
    let folder = path.parent()?;
    let pipeline = folder.file_name()?.to_str()?.to_string();
    let root = folder.parent().unwrap_or(Path::new("")).to_path_buf();
    Some((root, pipeline, name))
}

/// One line per pending committable (secrets redacted), as `status` and
/// `checkpoints show` print them.
pub(super) fn write_pending(out: &mut String, pending: &BTreeMap<usize, Vec<PendingSummary>>) {
    use std::fmt::Write as _;
    for (subtask, list) in pending {
        for p in list {
            let _ = writeln!(
                out,
                "    sink subtask {subtask}  checkpoint {}  {}",
                p.checkpoint,
                redact(&p.committable.to_string())
            );
        }
    }
}
