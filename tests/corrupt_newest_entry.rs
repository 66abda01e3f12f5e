//! A corrupt newest checkpoint entry, through the `exactly` binary on
//! Apache Kafka and a real PostgreSQL (issue 16). A Kafka → PostgreSQL
//! pipeline (parallelism 2, region failover: entries in
//! `<checkpoints>/<name>/region-<i>/`) is SIGKILLed, one byte of region 0's
//! newest entry is flipped while it is down, and it is started again:
//!
//! - the newest checkpoint's transactions were committed (by the recovery
//!   after a crash between persist and commit, killed right after that
//!   commit): the start is refused, naming the entry, the commit and the
//!   flag; no row of region 0 is written and its prepared transactions stay;
//!   with `--allow-fallback` it starts, warns, and the table holds exactly
//!   the duplicates of that checkpoint's interval;
//! - the newest checkpoint's transactions were only prepared (killed between
//!   persist and commit): it falls back, rolls them back, and ends with
//!   every order exactly once;
//! - the entries from the newest committed checkpoint on are deleted (not
//!   damaged) while it is down: `committed-through` shows a commit after the
//!   newest entry left, so the start is refused the same way, and with
//!   `--allow-fallback` the duplicates are exactly that checkpoint's
//!   interval, counted in the log.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::orders::*;
use common::*;
use exactly::core::{CheckpointEntry, EntryName, FsCheckpointStore};
use exactly_testkit::{KafkaBroker, PostgresServer};

/// A feed of at least 5 s (50 orders every 25 ms).
const ORDERS: i64 = 10_000;

/// The checkpoint interval: long enough that every interval of a region
/// holds records of the feed even when the machine stalls it for a moment
/// (the tests need the killed checkpoint's interval to have written some).
const INTERVAL: &str = "150ms";

/// Longest a run may take.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Logs without colour codes, so fields read `name=value`.
const PLAIN: &[(&str, &str)] = &[("NO_COLOR", "1")];

/// The pipeline's parallelism: regions 0 and 1.
const PARALLELISM: usize = 2;

/// One test's services, names and pipeline files.
struct Case {
    kafka: &'static KafkaBroker,
    pg: PostgresServer,
    dir: tempfile::TempDir,
    name: String,
    table: String,
    topic: String,
}

impl Case {
    fn new(prefix: &str) -> Case {
        Case {
            kafka: KafkaBroker::shared().expect("starting the shared Kafka broker"),
            pg: PostgresServer::start().expect("starting PostgreSQL"),
            dir: tempfile::tempdir().unwrap(),
            name: fresh(prefix),
            table: fresh(prefix),
            topic: topic_reaching_every_subtask(prefix, &[PARALLELISM]),
        }
    }

    /// A case whose feed of orders runs while the pipeline, reading it as
    /// it grows, persists region 0's 12th checkpoint that lists prepared
    /// transactions (an interval in which the region read nothing prepares
    /// none) and is SIGKILLed before committing it; the feed is still
    /// running.
    fn killed_between_persist_and_commit(prefix: &str) -> (Case, Feed) {
        let case = Case::new(prefix);
        let feed = Feed::start(case.kafka.bootstrap(), &case.topic, ORDERS);
        run_killed_within(
            &case.pipeline(false),
            "coordinator.after_persist_pending@0:12",
            &[],
            TIMEOUT,
        );
        assert!(feed.is_running(), "the input was complete before the crash");
        (case, feed)
    }

    fn url(&self) -> &str {
        self.pg.url()
    }

    /// The pipeline file: reading the topic as it grows, or (`bounded`) up
    /// to the end it has at start.
    fn pipeline(&self, bounded: bool) -> PathBuf {
        orders_pipeline(
            self.dir.path(),
            &format!("pipeline-{bounded}.toml"),
            &self.name,
            PARALLELISM,
            "checkpoints",
            INTERVAL,
            (self.kafka.bootstrap(), &self.topic),
            (self.url(), &self.table),
            bounded,
        )
    }

    /// Region `region`'s checkpoint store.
    fn store(&self, region: usize) -> FsCheckpointStore {
        let sequences = checkpoint_sequences(&self.dir.path().join("checkpoints").join(&self.name));
        let folder = &sequences[region];
        assert!(
            folder.ends_with(format!("region-{region}")),
            "region failover keeps a folder per region: {sequences:?}"
        );
        FsCheckpointStore::new(
            folder.parent().unwrap(),
            &folder.file_name().unwrap().to_string_lossy(),
            3,
        )
    }

    /// Region `region`'s entries, oldest first.
    fn entries(&self, region: usize) -> Vec<EntryName> {
        let mut names = self.store(region).list().expect("listing the entries");
        names.sort_by_key(|n| (n.id, n.created_unix_ms));
        names
    }

    /// The newest and the one before it of region `region`, read.
    fn newest_two(&self, region: usize) -> (CheckpointEntry, CheckpointEntry) {
        let store = self.store(region);
        let names = self.entries(region);
        assert!(names.len() >= 2, "at least two entries: {names:?}");
        let read = |n: &EntryName| store.read(&n.file_name).expect("a readable entry");
        (read(&names[names.len() - 1]), read(&names[names.len() - 2]))
    }

    /// The path of entry `entry` of region `region`.
    fn entry_path(&self, region: usize, entry: &CheckpointEntry) -> PathBuf {
        checkpoint_sequences(&self.dir.path().join("checkpoints").join(&self.name))[region].join(entry.file_name())
    }

    /// The highest checkpoint sink subtask `subtask` committed, from the
    /// sink's commit markers.
    fn committed_marker(&self, subtask: i32) -> Option<i64> {
        with_postgres(self.url(), async |db| {
            db.query_one(
                "SELECT max(checkpoint) FROM exactly_commit_log WHERE pipeline = $1 AND subtask = $2",
                &[&self.name, &subtask],
            )
            .await
            .expect("reading the commit markers")
            .get(0)
        })
    }

    /// Rows of the partitions region `region` writes: all of them, and the
    /// distinct (partition, offset) among them.
    fn rows_of_region(&self, region: usize) -> (i64, i64) {
        let sql = format!(
            "SELECT count(*), count(DISTINCT (part, off)) FROM {} WHERE part % {PARALLELISM} = {region}",
            self.table
        );
        with_postgres(self.url(), async |db| {
            let row = db.query_one(&sql, &[]).await.expect("counting rows");
            (row.get(0), row.get(1))
        })
    }

    /// What region 0 holds now, to compare after a refused start.
    fn region_0_state(&self) -> ((i64, i64), Vec<String>) {
        (self.rows_of_region(0), self.prepared_of(0))
    }

    /// A refused start left region 0 as `before` (from
    /// [`region_0_state`](Self::region_0_state)).
    fn assert_region_0_untouched(&self, before: &((i64, i64), Vec<String>)) {
        let (rows, prepared) = self.region_0_state();
        assert_eq!(rows, before.0, "rows written by the refused run");
        assert_eq!(prepared, before.1, "prepared transactions touched by the refused run");
    }

    /// After an accepted fallback in region 0: its table rows hold exactly
    /// `duplicates` duplicates, region 1's none, and every order is there.
    fn assert_fallback_duplicated(&self, duplicates: i64, interval: &str) {
        let (rows, distinct) = self.rows_of_region(0);
        assert_eq!(rows - distinct, duplicates, "duplicates in region 0: {interval}");
        let (rows1, distinct1) = self.rows_of_region(1);
        assert_eq!(rows1, distinct1, "region 1 was not touched by the fallback");
        assert_eq!(
            distinct + distinct1,
            ORDERS,
            "every order is there (distinct partition, offset)"
        );
    }

    /// The pipeline's prepared transactions of sink subtask `subtask`.
    fn prepared_of(&self, subtask: usize) -> Vec<String> {
        prepared_of_pipeline(self.url(), &self.name)
            .into_iter()
            .filter(|gid| subtask_of_gid(gid) == subtask)
            .collect()
    }
}

/// Records of region `region`'s splits between checkpoint `older` and
/// `newer` (next offsets per split): what the interval of `newer` wrote.
fn records_between(older: &CheckpointEntry, newer: &CheckpointEntry, topic: &str, region: usize) -> i64 {
    (0..ORDER_PARTITIONS)
        .filter(|p| *p as usize % PARALLELISM == region)
        .map(|p| {
            let split = exactly::kafka::split_name(topic, p);
            let at = |e: &CheckpointEntry| e.checkpoint.positions.get(&split).unwrap_or(0);
            at(newer) - at(older)
        })
        .sum()
}

fn assert_log_names(log: &str, parts: &[&str]) {
    for part in parts {
        assert!(log.contains(part), "`{part}` missing from:\n{log}");
    }
}

#[test]
fn a_corrupt_newest_entry_whose_transactions_were_committed_is_refused_unless_the_duplicates_are_accepted() {
    // The next run's recovery commits what the persisted checkpoint lists
    // and dies right after.
    let (case, feed) = Case::killed_between_persist_and_commit("corrupt_committed");
    run_killed_within(&case.pipeline(false), "recovery.after_commit@0:1", &[], TIMEOUT);
    assert!(feed.is_running(), "the input was complete before the crashes");
    let (newest, before) = case.newest_two(0);
    assert_eq!(
        case.committed_marker(0),
        Some(newest.checkpoint.id.0 as i64),
        "the newest entry's transaction of sink subtask 0 is committed"
    );
    let duplicates = records_between(&before, &newest, &case.topic, 0);
    assert!(duplicates > 0, "the newest checkpoint's interval wrote records");

    let newest_path = case.entry_path(0, &newest);
    flip_one_byte(&newest_path);
    let listing = std::process::Command::new(env!("CARGO_BIN_EXE_exactly"))
        .args(["checkpoints", "list"])
        .arg(case.pipeline(true))
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    let marked: Vec<&str> = listing.lines().filter(|l| l.contains("UNREADABLE")).collect();
    assert!(
        marked.len() == 1 && marked[0].contains(&newest.file_name()),
        "checkpoints list marks the corrupt entry, and only it:\n{listing}"
    );
    let before_refusal = case.region_0_state();

    // Refused: restoring the entry before it would write the newest
    // checkpoint's records again.
    let (status, _, log) = wait(spawn_with(&case.pipeline(true), &[], PLAIN), TIMEOUT);
    assert!(!status.success(), "the fallback was accepted:\n{log}");
    assert_log_names(
        &log,
        &[
            &newest.file_name(),
            &format!("the newest readable one is checkpoint {}", before.checkpoint.id),
            &format!(
                "sink subtask 0 committed transactions up to checkpoint {} holding {duplicates} records",
                newest.checkpoint.id
            ),
            "allow_fallback = true",
            "--allow-fallback",
        ],
    );
    case.assert_region_0_untouched(&before_refusal);
    assert!(newest_path.exists(), "the refused run set the entry aside");

    // Accepted with the flag: the newest interval is written again, and
    // nothing else is.
    feed.finish();
    let (status, _, log) = wait(spawn_with(&case.pipeline(true), &["--allow-fallback"], PLAIN), TIMEOUT);
    assert!(status.success(), "the run with --allow-fallback failed:\n{log}");
    assert_log_names(
        &log,
        &[
            "falling back past unreadable checkpoint entries although later checkpoints may have been committed",
            &newest.file_name(),
            &format!(
                "sink subtask 0 committed transactions up to checkpoint {} holding {duplicates} records",
                newest.checkpoint.id
            ),
            // The count the log gives is the one the table shows below.
            &format!("duplicates={duplicates} records"),
        ],
    );
    case.assert_fallback_duplicated(
        duplicates,
        &format!("the records of checkpoint {}'s interval", newest.checkpoint.id),
    );
    assert!(
        !newest_path.exists()
            && newest_path
                .with_file_name(format!("{}.unreadable", newest.file_name()))
                .exists(),
        "the unreadable entry is set aside as .unreadable"
    );
    assert_eq!(prepared_of_pipeline(case.url(), &case.name), Vec::<String>::new());
}

#[test]
fn a_corrupt_newest_entry_whose_transactions_were_only_prepared_falls_back_exactly_once() {
    let (case, feed) = Case::killed_between_persist_and_commit("corrupt_prepared");
    let (newest, before) = case.newest_two(0);
    let id = newest.checkpoint.id.0 as i64;
    assert!(
        case.committed_marker(0).is_none_or(|c| c < id),
        "the newest checkpoint is not committed"
    );
    let prepared = case.prepared_of(0);
    assert!(
        prepared.iter().any(|gid| gid.ends_with(&format!(":{id}"))),
        "the newest checkpoint's transaction of sink subtask 0 is prepared: {prepared:?}"
    );
    let newest_path = case.entry_path(0, &newest);
    flip_one_byte(&newest_path);

    feed.finish();
    let (status, _, log) = wait(spawn_with(&case.pipeline(true), &[], PLAIN), TIMEOUT);
    assert!(status.success(), "the fallback was refused:\n{log}");
    assert_log_names(
        &log,
        &[
            "falling back past unreadable checkpoint entries: the sinks prove nothing after the restored checkpoint was committed",
            &newest.file_name(),
            &format!("checkpoint={}", before.checkpoint.id),
        ],
    );
    assert_orders_exactly_once(case.url(), &case.table, &case.name, ORDERS, "after the fallback");
    assert!(
        newest_path
            .with_file_name(format!("{}.unreadable", newest.file_name()))
            .exists(),
        "the unreadable entry is set aside as .unreadable"
    );
}

#[test]
fn deleted_entries_of_committed_checkpoints_are_refused_unless_the_duplicates_are_accepted() {
    let (case, feed) = Case::killed_between_persist_and_commit("deleted_committed");

    // Every entry from the newest committed checkpoint on goes.
    let store = case.store(0);
    let through = store.committed_through().unwrap().expect("region 0 recorded a commit");
    let entries = case.entries(0);
    let left = entries
        .iter()
        .rfind(|n| n.id < through)
        .expect("an entry before the newest committed one")
        .clone();
    let committed = entries.iter().find(|n| n.id == through).expect("its entry");
    let read = |n: &EntryName| store.read(&n.file_name).expect("a readable entry");
    let duplicates = records_between(&read(&left), &read(committed), &case.topic, 0);
    assert!(duplicates > 0, "checkpoint {through}'s interval wrote records");
    for gone in entries.iter().filter(|n| n.id >= through) {
        std::fs::remove_file(case.entry_path(0, &read(gone))).unwrap();
    }
    let before_refusal = case.region_0_state();

    let (status, _, log) = wait(spawn_with(&case.pipeline(true), &[], PLAIN), TIMEOUT);
    assert!(!status.success(), "the fallback was accepted:\n{log}");
    assert_log_names(
        &log,
        &[
            &format!("the entry of checkpoint {through} is gone"),
            &format!("the newest readable one is checkpoint {}", left.id),
            &format!("sink subtask 0 committed transactions up to checkpoint {through} holding {duplicates} records"),
            "--allow-fallback",
        ],
    );
    case.assert_region_0_untouched(&before_refusal);

    feed.finish();
    let (status, _, log) = wait(spawn_with(&case.pipeline(true), &["--allow-fallback"], PLAIN), TIMEOUT);
    assert!(status.success(), "the run with --allow-fallback failed:\n{log}");
    assert_log_names(&log, &[&format!("duplicates={duplicates} records")]);
    case.assert_fallback_duplicated(duplicates, &format!("checkpoint {through}'s interval"));
    assert_eq!(prepared_of_pipeline(case.url(), &case.name), Vec::<String>::new());
}
