//! Shared by the end-to-end tests: runs the real `exactly` binary on a pipeline
//! file, optionally killing itself with SIGKILL at a crash point.
// `pub` is how the test files that share these helpers reach them.
#![allow(dead_code, unreachable_pub)]

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use exactly::core::SequenceSourceFactory;

/// Input of every crash test: 4 splits of 1500 records, slow enough that
/// checkpoints (every 50 ms) happen mid-stream.
pub const SPLITS: usize = 4;
pub const PER_SPLIT: i64 = 1500;
pub const TOTAL: usize = SPLITS * PER_SPLIT as usize;

pub fn expected_values() -> Vec<String> {
    SequenceSourceFactory {
        splits: SPLITS,
        records_per_split: PER_SPLIT,
        batch: 1,
        delay_per_poll: Default::default(),
    }
    .expected_values()
}

/// Writes `<dir>/pipeline.toml` with the sequence source and `sink` (a TOML
/// `[sink.<kind>]` section).
pub fn write_config(dir: &Path, name: &str, guarantee: &str, parallelism: usize, sink: &str) -> PathBuf {
    let file = dir.join("pipeline.toml");
    std::fs::write(
        &file,
        format!(
            r#"name = "{name}"
guarantee = "{guarantee}"
parallelism = {parallelism}
[checkpoint]
dir = "checkpoints"
interval = "50ms"
[restart]
strategy = "none"
[source.sequence]
splits = {SPLITS}
records_per_split = {PER_SPLIT}
batch = 20
delay_per_poll = "5ms"
{sink}
"#
        ),
    )
    .unwrap();
    file
}

pub fn run(config: &Path, crash_at: Option<&str>, extra: &[&str]) -> (ExitStatus, String) {
    run_with_env(config, crash_at, extra, &[])
}

/// [`run`] with extra environment variables (e.g. the negative controls of
/// `exactly_core::fault`).
pub fn run_with_env(
    config: &Path,
    crash_at: Option<&str>,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (ExitStatus, String) {
    let mut env: Vec<(&str, &str)> = env.to_vec();
    if let Some(point) = crash_at {
        // `<crash point>+<delay point>=<duration>`: the delay holds another
        // subtask back so the crash lands where its name says (see
        // TWO_PHASE_CRASH_CASES).
        match point.split_once('+') {
            Some((crash, delay)) => env.extend([("EXACTLY_CRASH_AT", crash), ("EXACTLY_DELAY_AT", delay)]),
            None => env.push(("EXACTLY_CRASH_AT", point)),
        };
    }
    // A crash point never reached (an unbounded source that caught up) or a
    // run that stalls fails the test with its log instead of hanging it.
    let (status, _, stderr) = wait(spawn_with(config, extra, &env), RUN_TIMEOUT);
    (status, stderr)
}

/// How long [`run`] waits for a run to end (by itself or at its crash
/// point) before it kills it and fails the test with the run's log: far
/// above what any run of the suite takes on a loaded two-core machine.
pub const RUN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs the pipeline until it kills itself at `point` (see
/// [`run_with_env`] for the `+<delay>` form), and checks from its log that
/// it died at that very point (and subtask).
pub fn run_killed_at(config: &Path, point: &str) {
    run_killed_at_with(config, point, &[]);
}

/// [`run_killed_at`] with extra arguments of `exactly run` (e.g.
/// `--allow-parallelism-change`); returns the run's log.
pub fn run_killed_at_with(config: &Path, point: &str, extra: &[&str]) -> String {
    let (status, log) = run(config, Some(point), extra);
    assert_killed_at(point, status, &log);
    log
}

/// [`run_killed_at_with`] in the background: a run still going after
/// `timeout` (its crash point never reached, as with an unbounded source)
/// is killed and fails the test with its log, instead of hanging it.
pub fn run_killed_within(config: &Path, point: &str, extra: &[&str], timeout: std::time::Duration) -> String {
    let env: Vec<(&str, &str)> = match point.split_once('+') {
        Some((crash, delay)) => vec![("EXACTLY_CRASH_AT", crash), ("EXACTLY_DELAY_AT", delay)],
        None => vec![("EXACTLY_CRASH_AT", point)],
    };
    let (status, _, log) = wait(spawn_with(config, extra, &env), timeout);
    assert_killed_at(point, status, &log);
    log
}

/// Checks that a run ended by SIGKILL at `point` (and its subtask and hit),
/// from its exit status and log.
pub fn assert_killed_at(point: &str, status: ExitStatus, log: &str) {
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the run was supposed to be killed at {point}; it ended with {status}:\n{log}"
    );
    let crash = point.split_once('+').map_or(point, |(crash, _)| crash);
    let (name, nth) = crash.rsplit_once(':').unwrap_or((crash, "1"));
    let (name, subtask) = match name.split_once('@') {
        Some((name, subtask)) => (name, Some(subtask)),
        None => (name, None),
    };
    let line = log
        .lines()
        .find(|l| l.contains("crash point reached"))
        .unwrap_or_else(|| panic!("the log of the run killed at {point} does not say where it crashed:\n{log}"));
    let plain: String = strip_ansi(line);
    assert!(
        plain.contains(&format!("point=\"{name}\"")) || plain.contains(&format!("point={name}")),
        "killed elsewhere than {point}: {plain}"
    );
    assert!(
        plain.contains(&format!("hit={nth}")),
        "killed at another hit than {point}: {plain}"
    );
    if let Some(subtask) = subtask {
        assert!(
            plain.contains(&format!("subtask=Some({subtask})")),
            "killed in another subtask than {point}: {plain}"
        );
    }
}

/// `text` without terminal colour codes.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub fn run_to_completion(config: &Path) {
    let (status, log) = run(config, None, &[]);
    assert!(status.success(), "restart failed with {status}:\n{log}");
}

/// Kills the pipeline at each point in turn (each on a run restarted after the
/// previous crash), then lets it finish.
pub fn crash_then_finish(config: &Path, points: &[&str]) {
    for point in points {
        run_killed_at(config, point);
    }
    run_to_completion(config);
}

/// An `exactly run` in the background. Its stdout and stderr are drained by
/// threads as it runs: a child that logs more than a pipe holds would
/// otherwise block on its next log line.
pub struct Background {
    child: std::process::Child,
    stdout: std::thread::JoinHandle<Vec<u8>>,
    stderr: std::thread::JoinHandle<Vec<u8>>,
}

impl Background {
    /// The process id (to signal it).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

fn drain(mut pipe: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// Runs `exactly run` in the background.
pub fn spawn(config: &Path) -> Background {
    spawn_with_env(config, &[])
}

/// [`spawn`] with extra environment variables (e.g. `EXACTLY_DELAY_AT`).
pub fn spawn_with_env(config: &Path, env: &[(&str, &str)]) -> Background {
    spawn_with(config, &[], env)
}

/// [`spawn_with_env`] with extra arguments of `exactly run` (e.g.
/// `--allow-parallelism-change`).
pub fn spawn_with(config: &Path, extra: &[&str], env: &[(&str, &str)]) -> Background {
    let mut child = Command::new(env!("CARGO_BIN_EXE_exactly"))
        .arg("run")
        .arg(config)
        .args(extra)
        .env("RUST_LOG", "info")
        .env_remove("EXACTLY_CRASH_AT")
        .env_remove("EXACTLY_DELAY_AT")
        .env_remove(exactly::core::fault::FAIL_AT_ENV)
        .env_remove(exactly::core::fault::ABORT_PENDING_ON_RECOVER_ENV)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting the exactly binary");
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = drain(child.stderr.take().expect("piped"));
    Background { child, stdout, stderr }
}

/// Waits for a background run (at most `timeout`, then kills it and panics
/// with its log) and returns its status, stdout, stderr.
pub fn wait(mut run: Background, timeout: std::time::Duration) -> (ExitStatus, String, String) {
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        if let Some(status) = run.child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = run.child.kill();
            let _ = run.child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let text = |h: std::thread::JoinHandle<Vec<u8>>| String::from_utf8_lossy(&h.join().unwrap()).into_owned();
    let (stdout, stderr) = (text(run.stdout), text(run.stderr));
    match status {
        Some(status) => (status, stdout, stderr),
        None => panic!("the pipeline did not finish within {timeout:?}:\n{stderr}"),
    }
}

/// The start of a pipeline file shared by the Kafka end-to-end tests: name,
/// guarantee, parallelism 2, small batches, checkpoints every 50 ms, and the
/// `[restart]` body given.
pub fn pipeline_header(name: &str, guarantee: &str, restart: &str) -> String {
    format!(
        "name = \"{name}\"\nguarantee = \"{guarantee}\"\nparallelism = 2\nbatch_size = 10\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval = \"50ms\"\n\n[restart]\n{restart}\n"
    )
}

/// Writes `<dir>/<name>-<bounded>.toml`: pipeline `name` ([`pipeline_header`],
/// exactly-once, fixed restarts every 200 ms up to 100 times) reading `topic`
/// from its beginning — up to the end it has at start when `bounded` — then
/// `sink`: the `[sink.…]` sections and whatever follows them.
pub fn kafka_pipeline_file(
    dir: &std::path::Path,
    name: &str,
    (bootstrap, topic): (&str, &str),
    bounded: bool,
    sink: &str,
) -> std::path::PathBuf {
    let file = dir.join(format!("{name}-{bounded}.toml"));
    let header = pipeline_header(
        name,
        "exactly-once",
        "strategy = \"fixed\"\ndelay = \"200ms\"\nmax_attempts = 100",
    );
    let text = format!(
        "{header}\n[source.kafka]\nbootstrap = \"{bootstrap}\"\ntopic = \"{topic}\"\nstart = \"earliest\"\n\
         stop_at_end = {bounded}\n\n{sink}"
    );
    std::fs::write(&file, text).expect("writing the pipeline file");
    file
}

/// [`kafka_pipeline_file`] into PostgreSQL at `url`: `table` is the sink's
/// `table` (a name, or a `${topic}` template) and `sink` the rest of the
/// `[sink.postgres]` section — its other keys, its columns, and whatever
/// follows (`[[transform]]`s).
pub fn postgres_pipeline_file(
    dir: &std::path::Path,
    name: &str,
    (bootstrap, topic): (&str, &str),
    (url, table): (&str, &str),
    bounded: bool,
    sink: &str,
) -> std::path::PathBuf {
    let section = format!("[sink.postgres]\nurl = \"{url}\"\ntable = \"{table}\"\n{sink}");
    kafka_pipeline_file(dir, name, (bootstrap, topic), bounded, &section)
}

/// The SIGKILL points every two-phase end-to-end matrix covers, by name: while
/// writing, after pre-commit before the checkpoint is persisted, after it is
/// persisted before the commit, between two subtasks' commits, and during
/// recovery (after a crash that leaves something to recover). The kills
/// after a pre-commit and after a persist come at the first pre-commit and
/// the first checkpoint that lists pre-committed transactions, and the kill
/// between commits at the first commits: a
/// fast source reads a bounded input to its end within an interval or two
/// (10,000 records of Kafka in the first 50 ms), so a later checkpoint may
/// list nothing and a later commit never come.
pub const TWO_PHASE_CRASH_CASES: &[(&str, &[&str])] = &[
    ("while_writing", &["source.after_emit:40"]),
    ("after_pre_commit_before_persist", &["sink.after_pre_commit:1"]),
    ("after_persist_before_commit", &["coordinator.after_persist_pending:1"]),
    // Subtask 1 waits before its first commit while subtask 0 makes its
    // first and dies: one committed its checkpoint, the other did not.
    (
        "between_two_subtasks_commits",
        &["sink.after_commit@0:1+sink.before_commit@1:1=3s"],
    ),
    (
        "during_recovery",
        &["coordinator.after_persist_pending:1", "recovery.after_commit:1"],
    ),
];

/// Every point of [`TWO_PHASE_CRASH_CASES`], one after the other on one
/// pipeline: each run is killed at its point and the next recovers from
/// what the kill left. For a feed that keeps trickling records until the
/// test is done ([`orders::Feed::start_held`]): the points after a
/// pre-commit, a persist listing transactions and a commit need intervals
/// with records (a sink opens no transaction for an empty one), and every
/// run gets some.
pub const TWO_PHASE_CRASH_SEQUENCE: &[&str] = &[
    "source.after_emit:40",
    "sink.after_pre_commit:1",
    "coordinator.after_persist_pending:1",
    "sink.after_commit@0:1+sink.before_commit@1:1=3s",
    "coordinator.after_persist_pending:1",
    "recovery.after_commit:1",
];

/// What an output holds compared with [`expected_values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Lines in the output.
    pub lines: usize,
    /// Lines beyond the first of each value.
    pub duplicates: usize,
    /// Expected values absent from the output.
    pub missing: usize,
}

/// Counts `lines` against [`expected_values`]; panics on a value the source
/// never produced.
pub fn outcome_of(lines: &[String]) -> Outcome {
    let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for l in lines {
        *counts.entry(l.as_str()).or_default() += 1;
    }
    let expected = expected_values();
    let known: std::collections::HashSet<&str> = expected.iter().map(String::as_str).collect();
    let unexpected: Vec<&&str> = counts.keys().filter(|k| !known.contains(**k)).take(5).collect();
    assert!(
        unexpected.is_empty(),
        "output holds values the source never produced: {unexpected:?}"
    );
    Outcome {
        lines: lines.len(),
        duplicates: counts.values().map(|c| c - 1).sum(),
        missing: expected.iter().filter(|e| !counts.contains_key(e.as_str())).count(),
    }
}

/// The names of the pending files (`*.pending`) in the file sink's folder
/// `out`.
pub fn pending_files(out: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(out)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".pending"))
                .collect()
        })
        .unwrap_or_default()
}

/// A `[sink.file]` section writing into `out` (an absolute path).
pub fn file_sink_into(out: &Path) -> String {
    format!("[sink.file]\ndir = {:?}", out.display().to_string())
}

/// Kafka → PostgreSQL orders: topics, a feed, pipeline files, table checks.
pub mod orders;
/// A run of the binary in the background.
pub mod run;

/// A network namespace to cut a process off and reconnect it.
pub mod netns;

/// `/metrics` and the health endpoints of a run.
pub mod scrape;

/// The folders of every checkpoint sequence of the pipeline whose folder is
/// `pipeline_dir` (`<checkpoint dir>/<name>`): its `region-<i>` folders in
/// region failover, the folder itself in global failover.
pub fn checkpoint_sequences(pipeline_dir: &Path) -> Vec<PathBuf> {
    let mut regions: Vec<PathBuf> = std::fs::read_dir(pipeline_dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.is_dir()
                        && p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("region-"))
                })
                .collect()
        })
        .unwrap_or_default();
    regions.sort();
    if regions.is_empty() {
        vec![pipeline_dir.to_path_buf()]
    } else {
        regions
    }
}

/// The newest checkpoint entry file of sequence `index` (see
/// [`checkpoint_sequences`]: region `index` in region failover) of the
/// pipeline whose folder is `pipeline_dir`.
pub fn newest_entry_file(pipeline_dir: &Path, index: usize) -> PathBuf {
    let folder = &checkpoint_sequences(pipeline_dir)[index];
    let newest = std::fs::read_dir(folder)
        .unwrap()
        .flatten()
        .filter_map(|e| exactly::core::EntryName::parse(&e.file_name().to_string_lossy()))
        .max_by_key(|n| (n.id, n.created_unix_ms))
        .unwrap_or_else(|| panic!("no checkpoint entry in {}", folder.display()));
    folder.join(newest.file_name)
}

/// Flips one bit of the byte in the middle of the file at `path` (a
/// checkpoint entry then fails its checksum).
pub fn flip_one_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

/// Every checkpoint entry file of the pipeline whose folder is
/// `pipeline_dir`, in every checkpoint sequence, sorted by path.
pub fn checkpoint_entry_files(pipeline_dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = checkpoint_sequences(pipeline_dir)
        .iter()
        .flat_map(|folder| std::fs::read_dir(folder).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| exactly::core::EntryName::parse(&p.file_name().unwrap().to_string_lossy()).is_some())
        .collect();
    entries.sort();
    entries
}

/// The folders of the checkpoint stores of pipeline `name` under
/// `checkpoints`: the pipeline's folder and every folder inside it (with
/// failover regions, each region keeps its entries in one of its own).
pub fn checkpoint_store_folders(checkpoints: &Path, name: &str) -> Vec<PathBuf> {
    let dir = checkpoints.join(name);
    let mut folders = vec![dir.clone()];
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut inner: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        inner.sort();
        folders.extend(inner);
    }
    folders
}

/// The latest readable checkpoint entry of every checkpoint store of
/// pipeline `name` under `checkpoints` (see [`checkpoint_store_folders`]).
pub fn latest_entries(checkpoints: &Path, name: &str) -> Vec<exactly::core::CheckpointEntry> {
    checkpoint_store_folders(checkpoints, name)
        .into_iter()
        .filter_map(|folder| {
            let parent = folder.parent()?.to_path_buf();
            let store = exactly::core::FsCheckpointStore::new(parent, &folder.file_name()?.to_string_lossy(), 3);
            store.latest().ok().flatten()
        })
        .collect()
}
