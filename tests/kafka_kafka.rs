//! Kafka → Kafka end to end, through the `exactly` binary and a pipeline file:
//! `[source.kafka]` reads an input topic, `[sink.kafka]` writes an output topic
//! in transactions, and the run is killed with SIGKILL at every phase of the
//! two-phase commit. The broker is the one exactly-testkit shares among the
//! tests of this binary (or the Kafka of `EXACTLY_KAFKA_BOOTSTRAP`): only
//! pipelines are killed here, never the broker.
//!
//! The output is read twice, by a plain read_committed consumer (librdkafka)
//! and by the log-level committed reader (`exactly_kafka::wire`), which
//! applies the read_committed contract to the raw log itself; both must
//! return the same records before exactly-once is checked on them.
//!
//! Besides the plain input, a compacted input of keyed records with
//! tombstones, null header values, empty values and empty header values is
//! copied to a compacted output under the same crash matrix: every null
//! must come out null and every empty empty, exactly once.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_kafka::wire::{CommittedRead, WireClient};
use exactly_testkit::KafkaBroker;

const PARTITIONS: i32 = 4;
const RECORDS: usize = 20_000;
/// How long a read waits for the markers of the last committed (or aborted)
/// transactions: Kafka writes them after it answers the commit.
const SETTLE: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The shared broker and the input topic every test copies: [`RECORDS`]
/// records `v-<i>` (key `k-<i>`), record `i` in partition `i % PARTITIONS`.
/// Produced once per test binary; each test writes an output topic of its
/// own.
struct Setup {
    kafka: &'static KafkaBroker,
    input: String,
}

/// A name no other test or earlier run against an external Kafka uses.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
        let input = unique("kafka-kafka-in");
        runtime().block_on(async {
            let admin = KafkaAdmin::new(kafka.bootstrap());
            admin
                .create_topic(&input, PARTITIONS)
                .await
                .expect("creating the input topic");
            let records = (0..RECORDS).map(|i| {
                ProduceRecord::new(format!("v-{i}"))
                    .with_key(format!("k-{i}"))
                    .to_partition(i as i32 % PARTITIONS)
            });
            admin.produce(&input, records).await.expect("producing the input");
        });
        Setup { kafka, input }
    })
}

impl Setup {
    fn bootstrap(&self) -> &str {
        self.kafka.bootstrap()
    }

    /// Creates a fresh output topic and writes `<dir>/<name>.toml`: parallelism
    /// 2, checkpoints every 50 ms, the bounded input copied to it. `extra` is
    /// added to `[sink.kafka]`.
    fn pipeline(&self, dir: &Path, name: &str, guarantee: &str, extra: &str) -> (PathBuf, String) {
        self.pipeline_from(&self.input, &[], dir, name, guarantee, extra)
    }

    /// [`pipeline`](Self::pipeline) copying `input` to an output topic
    /// created with `settings` (`cleanup.policy`, ...).
    fn pipeline_from(
        &self,
        input: &str,
        settings: &[(&str, &str)],
        dir: &Path,
        name: &str,
        guarantee: &str,
        extra: &str,
    ) -> (PathBuf, String) {
        let output = unique(&format!("{name}-out"));
        runtime().block_on(async {
            KafkaAdmin::new(self.bootstrap())
                .create_topic_with(&output, PARTITIONS, settings)
                .await
                .expect("creating the output topic")
        });
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(
            &file,
            format!(
                r#"{header}
[source.kafka]
bootstrap = "{bootstrap}"
topic = "{input}"
stop_at_end = true

[sink.kafka]
bootstrap = "{bootstrap}"
topic = "{output}"
transactional_id_prefix = "{prefix}"
{extra}
"#,
                header = pipeline_header(name, guarantee, "strategy = \"none\""),
                bootstrap = self.bootstrap(),
                prefix = unique(name),
            ),
        )
        .unwrap();
        (file, output)
    }

    /// The committed output of `topic`, read by both readers, which must
    /// agree; no transaction may be left open.
    fn output(&self, topic: &str, what: &str) -> Output {
        let (log, consumed) = runtime().block_on(async {
            // First the log, until the markers of the last transactions are
            // there: a consumer stops at the last stable offset, so it would
            // end before records whose COMMIT marker is still on its way.
            let log = WireClient::new(self.bootstrap())
                .unwrap()
                .read_topic_settled(topic, SETTLE)
                .await
                .expect("reading the output topic's log");
            let consumed = KafkaAdmin::new(self.bootstrap())
                .read_all(topic)
                .await
                .expect("consuming the output topic read_committed");
            (log, consumed)
        });
        assert!(
            log.open_transactions.is_empty(),
            "{what}: transactions left open after {SETTLE:?}: {:?}",
            log.open_transactions
        );
        let from_log: Vec<OutputRecord> = log
            .records
            .iter()
            .map(|r| OutputRecord {
                partition: r.partition,
                offset: r.offset,
                timestamp: Some(r.timestamp),
                key: r.key.clone(),
                value: r.value.clone(),
                headers: r.headers.iter().map(|h| (h.key.clone(), h.value.clone())).collect(),
            })
            .collect();
        let from_consumer: Vec<OutputRecord> = consumed
            .into_iter()
            .map(|r| OutputRecord {
                partition: r.topic_partition().expect("split <topic>-<partition>").1,
                offset: r.offset,
                timestamp: r.timestamp_ms,
                key: r.key.map(|k| k.to_vec()),
                value: r.value.map(|v| v.to_vec()),
                headers: r.headers,
            })
            .collect();
        assert_eq!(
            from_consumer.len(),
            from_log.len(),
            "{what}: a read_committed consumer and the log-level reader disagree on the number of records"
        );
        assert!(
            from_consumer == from_log,
            "{what}: a read_committed consumer and the log-level reader disagree; first difference: {:?}",
            from_consumer.iter().zip(&from_log).find(|(c, l)| c != l)
        );
        Output { records: from_log, log }
    }
}

/// One record of the output, as both readers report it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OutputRecord {
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

/// What both readers agree the output holds, ordered by partition and
/// offset, with the log-level reader's account of aborted records.
struct Output {
    records: Vec<OutputRecord>,
    log: CommittedRead,
}

impl Output {
    fn values(&self) -> Vec<String> {
        self.records
            .iter()
            .map(|r| String::from_utf8(r.value.clone().expect("a value")).unwrap())
            .collect()
    }
}

fn expected() -> BTreeSet<String> {
    (0..RECORDS).map(|i| format!("v-{i}")).collect()
}

/// Every input record exactly once (count and set), with its key.
fn assert_exactly_once(output: &Output, what: &str) {
    let values = output.values();
    let set: BTreeSet<String> = values.iter().cloned().collect();
    assert_eq!(values.len(), RECORDS, "{what}: committed records (duplicates or loss)");
    assert_eq!(set, expected(), "{what}: the set of committed values");
    for (r, value) in output.records.iter().zip(&values) {
        let key = value.replacen("v-", "k-", 1);
        assert_eq!(r.key.as_deref(), Some(key.as_bytes()), "{what}: the key of {value}");
    }
}

/// Runs the pipeline killed at each of `points` in turn, then to completion,
/// checks the output and returns the log of the last run.
fn crash_case(setup: &Setup, name: &str, points: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = setup.pipeline(dir.path(), name, "exactly-once", "");
    let log = killed_then_finished(&config, name, points);
    assert_exactly_once(&setup.output(&output, name), name);
    log
}

/// Runs `config` killed at each of `points` in turn, then to completion;
/// returns the log of the last run.
fn killed_then_finished(config: &Path, name: &str, points: &[&str]) -> String {
    for point in points {
        run_killed_at(config, point);
    }
    let (status, log) = run(config, None, &[]);
    assert!(
        status.success(),
        "{name}: the restarted run failed with {status}:\n{log}"
    );
    log
}

fn case(name: &str) -> String {
    let setup = setup();
    let (_, points) = TWO_PHASE_CRASH_CASES
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a known case");
    crash_case(setup, name, points)
}

/// Recovery finished pre-committed transactions with EndTxn.
fn assert_end_txn_recovery(log: &str) {
    assert!(
        log.contains("transaction committed with EndTxn"),
        "recovery was supposed to commit listed transactions with EndTxn:\n{log}"
    );
}

#[test]
fn a_run_without_crash_copies_every_record_once() {
    let setup = setup();
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = setup.pipeline(dir.path(), "no_crash", "exactly-once", "");
    run_to_completion(&config);
    assert_exactly_once(&setup.output(&output, "no crash"), "no crash");
    // A second run finds nothing new and recovers the last checkpoint's
    // transactions again (EndTxn on committed ones is a no-op).
    run_to_completion(&config);
    let what = "no crash, run again";
    assert_exactly_once(&setup.output(&output, what), what);
}

#[test]
fn sigkill_while_writing() {
    case("while_writing");
}

#[test]
fn sigkill_after_pre_commit_before_the_checkpoint_is_persisted() {
    case("after_pre_commit_before_persist");
}

/// The EndTxn recovery path: the checkpoint lists pre-committed transactions
/// no producer will ever commit.
#[test]
fn sigkill_after_the_checkpoint_is_persisted_before_the_commit() {
    assert_end_txn_recovery(&case("after_persist_before_commit"));
}

#[test]
fn sigkill_between_two_subtasks_commits() {
    assert_end_txn_recovery(&case("between_two_subtasks_commits"));
}

#[test]
fn sigkill_during_recovery() {
    assert_end_txn_recovery(&case("during_recovery"));
}

/// Killed inside the EndTxn recovery of a listed transaction (right before
/// its EndTxn goes out), then killed again once the next recovery has
/// committed one: the last recovery finishes what both left.
#[test]
fn sigkill_inside_end_txn_recovery() {
    let log = crash_case(
        setup(),
        "inside_end_txn_recovery",
        &[
            "coordinator.after_persist_pending:1",
            "kafka_sink.before_end_txn:1",
            "recovery.after_commit:1",
        ],
    );
    assert_end_txn_recovery(&log);
}

/// The negative control of the EndTxn path: the same crash as
/// [`sigkill_after_the_checkpoint_is_persisted_before_the_commit`], with
/// recovery aborting the listed transactions instead of committing them,
/// must lose that checkpoint's records — and the check must see it.
#[test]
fn aborting_instead_of_committing_on_recovery_loses_the_checkpoint() {
    let setup = setup();
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = setup.pipeline(dir.path(), "negative", "exactly-once", "");
    run_killed_at(&config, "coordinator.after_persist_pending:1");
    let env = [(exactly::core::fault::ABORT_PENDING_ON_RECOVER_ENV, "1")];
    let (status, log) = run_with_env(&config, None, &[], &env);
    assert!(status.success(), "{log}");
    assert!(log.contains("TEST ONLY"), "the knob announces itself:\n{log}");
    // Both readers still agree on what is committed, and no transaction is
    // left open; only exactly-once must fail.
    let output = setup.output(&output, "negative control");
    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_exactly_once(&output, "negative control")
    }));
    assert!(check.is_err(), "the exactly-once check must fail on this output");
    let values = output.values();
    let set: BTreeSet<String> = values.iter().cloned().collect();
    assert_eq!(set.len(), values.len(), "no duplicates either way");
    assert!(set.is_subset(&expected()));
    assert!(
        values.len() < RECORDS,
        "the transactions of the persisted checkpoint were aborted, yet all {RECORDS} records are committed"
    );
    assert!(output.log.aborted_records > 0, "the lost records were aborted");
    let missing = RECORDS - values.len();
    println!("negative control: {missing} records of the lost checkpoint are missing, as expected");
}

/// The other negative control: at-least-once commits at the barrier, before
/// the checkpoint is persisted, so a crash there replays committed records.
/// `sink.after_pre_commit` comes right after such a commit of an interval
/// with records, before the acknowledgement (so never persisted).
/// The Kafka sink cannot tell whether it committed anything after a
/// checkpoint (`check_replay_after` is `Unknown`), so a corrupt newest
/// entry is refused — here although its transactions were only prepared —
/// naming the entry and the flag; with
/// `--allow-fallback` the run falls back, aborts them and ends exactly once.
#[test]
fn a_corrupt_newest_entry_is_refused_unless_the_fallback_is_accepted() {
    let setup = setup();
    let dir = tempfile::tempdir().unwrap();
    let name = "corrupt_newest";
    let (config, output) = setup.pipeline(dir.path(), name, "exactly-once", "");
    run_killed_at(&config, "coordinator.after_persist_pending@0:1");
    let newest = newest_entry_file(&dir.path().join("checkpoints").join(name), 0);
    flip_one_byte(&newest);

    let (status, log) = run(&config, None, &[]);
    assert!(!status.success(), "the fallback was accepted:\n{log}");
    let entry = newest.file_name().unwrap().to_string_lossy().into_owned();
    for part in [
        entry.as_str(),
        "sink subtask 0 cannot tell whether it committed anything after it",
        "--allow-fallback",
    ] {
        assert!(log.contains(part), "`{part}` missing from:\n{log}");
    }
    assert!(newest.exists(), "the refused run set the entry aside");

    let (status, log) = run(&config, None, &["--allow-fallback"]);
    assert!(status.success(), "the run with --allow-fallback failed:\n{log}");
    assert!(
        log.contains(
            "falling back past unreadable checkpoint entries although later checkpoints may have been committed"
        ),
        "{log}"
    );
    assert!(
        strip_ansi(&log).contains("duplicates=unknown (sink subtasks [0] cannot count theirs)"),
        "the log says the Kafka sink cannot count the duplicates:\n{log}"
    );
    assert_exactly_once(&setup.output(&output, name), name);
}

#[test]
fn at_least_once_shows_duplicates_after_a_crash_before_persist() {
    let setup = setup();
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = setup.pipeline(dir.path(), "alo", "at-least-once", "");
    // The first interval with records: the bounded input may be read in
    // few intervals, so a later one may never come.
    crash_then_finish(&config, &["sink.after_pre_commit:1"]);
    let values = setup.output(&output, "at-least-once").values();
    let set: BTreeSet<String> = values.iter().cloned().collect();
    assert_eq!(set, expected(), "no loss");
    assert!(values.len() > RECORDS, "duplicates expected, found {}", values.len());
}

#[test]
fn the_example_pipeline_parses_and_bad_sink_keys_are_named() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kafka_to_kafka.toml");
    let file = exactly::config::PipelineFile::load(&example).expect("the example parses");
    assert!(matches!(file.sink, exactly::config::SinkSection::Kafka(_)));
    let text = std::fs::read_to_string(&example).unwrap();
    let e = exactly::config::PipelineFile::parse(&text.replace("pool_size = 5", "pool_size = 1"), "x.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`sink.kafka.pool_size` must be at least 3"), "{e}");
    let e = exactly::config::PipelineFile::parse(&text.replace("pool_size", "pool_sise"), "x.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("pool_sise"), "{e}");
}

/// Apache Kafka limits transaction timeouts (transaction.max.timeout.ms,
/// 15 minutes by default): a longer `transaction_timeout` is refused at
/// start, naming both settings and the broker's limit.
#[test]
fn a_transaction_timeout_above_the_broker_limit_is_refused() {
    let setup = setup();
    let limit: u64 = runtime()
        .block_on(exactly_kafka::wire::describe_broker_config(
            setup.bootstrap(),
            "transaction.max.timeout.ms",
        ))
        .expect("DescribeConfigs")
        .expect("the broker reports transaction.max.timeout.ms")
        .parse()
        .expect("a number of milliseconds");
    let dir = tempfile::tempdir().unwrap();
    let too_long = format!("transaction_timeout = \"{}ms\"", limit + 60_000);
    let (config, _) = setup.pipeline(dir.path(), "limit", "exactly-once", &too_long);
    let (status, _, log) = wait(spawn(&config), Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        log.contains("`transaction_timeout`")
            && log.contains(&format!("the broker's transaction.max.timeout.ms ({limit} ms)")),
        "{log}"
    );
}

// ---------------------------------------------------------------------------
// Nulls stay null, empties stay empty: a compacted topic copied under the
// crash matrix.

/// Keys of the compacted input: every key comes back many times, as in a
/// changelog.
const NULL_KEYS: usize = 97;
/// Topic settings of the compacted input and outputs.
const COMPACTED: &[(&str, &str)] = &[("cleanup.policy", "compact")];

/// Record `i` of the compacted input: key `k-<i % NULL_KEYS>`; value null (a
/// tombstone) for `i % 4 == 0`, empty for `i % 4 == 1`, `v-<i>` otherwise;
/// headers `id` = `i`, then a null `n` for `i % 3 == 0`, an empty `e` for
/// `i % 3 == 1`, both (`n` then `e`) otherwise; partition `i % PARTITIONS`.
fn null_record(i: usize) -> OutputRecord {
    let value = match i % 4 {
        0 => None,
        1 => Some(Vec::new()),
        _ => Some(format!("v-{i}").into_bytes()),
    };
    let mut headers = vec![("id".to_string(), Some(i.to_string().into_bytes()))];
    if i % 3 != 1 {
        headers.push(("n".to_string(), None));
    }
    if !i.is_multiple_of(3) {
        headers.push(("e".to_string(), Some(Vec::new())));
    }
    OutputRecord {
        partition: i as i32 % PARTITIONS,
        offset: 0,
        timestamp: None,
        key: Some(format!("k-{}", i % NULL_KEYS).into_bytes()),
        value,
        headers,
    }
}

/// The compacted input: [`RECORDS`] records as [`null_record`] says,
/// produced once per test binary and checked with both readers before any
/// test copies it (so a null or empty that changes is the pipeline's doing).
fn nulls_input() -> &'static str {
    static INPUT: OnceLock<String> = OnceLock::new();
    INPUT.get_or_init(|| {
        let setup = setup();
        let input = unique("kafka-kafka-nulls-in");
        runtime().block_on(async {
            let admin = KafkaAdmin::new(setup.bootstrap());
            admin
                .create_topic_with(&input, PARTITIONS, COMPACTED)
                .await
                .expect("creating the compacted input topic");
            let records = (0..RECORDS).map(|i| {
                let r = null_record(i);
                ProduceRecord {
                    partition: Some(r.partition),
                    key: r.key,
                    value: r.value,
                    timestamp_ms: None,
                    headers: r.headers,
                }
            });
            admin
                .produce(&input, records)
                .await
                .expect("producing the compacted input");
        });
        assert_nulls_exactly_once(&setup.output(&input, "the compacted input"), "the compacted input");
        input
    })
}

/// Every record of the compacted input exactly once (found by its `id`
/// header), with its key, its value and its headers as written: null stays
/// null, empty stays empty, headers in order.
fn assert_nulls_exactly_once(output: &Output, what: &str) {
    let mut seen = vec![false; RECORDS];
    for r in &output.records {
        let id = r
            .headers
            .first()
            .filter(|(name, _)| name == "id")
            .and_then(|(_, value)| value.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("{what}: a record without its id header: {r:?}"));
        assert!(id < RECORDS, "{what}: unknown id {id}");
        assert!(!seen[id], "{what}: record {id} is there twice");
        seen[id] = true;
        let expected = null_record(id);
        assert_eq!(r.key, expected.key, "{what}: the key of record {id}");
        assert_eq!(
            r.value, expected.value,
            "{what}: the value of record {id} (None is a tombstone, Some([]) an empty value)"
        );
        assert_eq!(
            r.headers, expected.headers,
            "{what}: the headers of record {id} (None is a null value, Some([]) an empty one)"
        );
    }
    let missing: Vec<usize> = (0..RECORDS).filter(|&i| !seen[i]).take(10).collect();
    assert!(missing.is_empty(), "{what}: records missing, first ones: {missing:?}");
    let tombstones = output.records.iter().filter(|r| r.value.is_none()).count();
    assert_eq!(tombstones, RECORDS.div_ceil(4), "{what}: tombstones");
}

/// The compacted input copied to a compacted output, killed at `points`
/// first; the output's nulls and empties are checked. Returns the log of
/// the last run.
fn nulls_case(name: &str, points: &[&str]) -> String {
    let setup = setup();
    let input = nulls_input();
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = setup.pipeline_from(input, COMPACTED, dir.path(), name, "exactly-once", "");
    let log = killed_then_finished(&config, name, points);
    assert_nulls_exactly_once(&setup.output(&output, name), name);
    log
}

/// [`nulls_case`] for a case of [`TWO_PHASE_CRASH_CASES`].
fn nulls_crash_case(case: &str) -> String {
    let (_, points) = TWO_PHASE_CRASH_CASES
        .iter()
        .find(|(n, _)| *n == case)
        .expect("a known case");
    nulls_case(&format!("nulls_{case}"), points)
}

#[test]
fn tombstones_and_null_headers_stay_null_without_crash() {
    nulls_case("nulls_no_crash", &[]);
}

#[test]
fn tombstones_and_null_headers_stay_null_after_a_sigkill_while_writing() {
    nulls_crash_case("while_writing");
}

#[test]
fn tombstones_and_null_headers_stay_null_after_a_sigkill_after_pre_commit() {
    nulls_crash_case("after_pre_commit_before_persist");
}

/// Recovery commits these with EndTxn: the records were produced before the
/// crash, nulls and all.
#[test]
fn tombstones_and_null_headers_stay_null_after_a_sigkill_after_persist() {
    assert_end_txn_recovery(&nulls_crash_case("after_persist_before_commit"));
}

#[test]
fn tombstones_and_null_headers_stay_null_after_a_sigkill_between_two_subtasks_commits() {
    assert_end_txn_recovery(&nulls_crash_case("between_two_subtasks_commits"));
}

#[test]
fn tombstones_and_null_headers_stay_null_after_a_sigkill_during_recovery() {
    assert_end_txn_recovery(&nulls_crash_case("during_recovery"));
}

/// The check can fail: a tombstone that came out as an empty value, an
/// empty header value that came out null, or a record twice is caught.
#[test]
fn the_null_check_sees_a_null_turned_empty_and_an_empty_turned_null() {
    let setup = setup();
    let input = nulls_input();
    let good = setup.output(input, "the compacted input");
    let fails = |edit: &dyn Fn(&mut Vec<OutputRecord>)| {
        let mut records = good.records.clone();
        edit(&mut records);
        let output = Output {
            records,
            log: CommittedRead::default(),
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_nulls_exactly_once(&output, "edited")
        }))
        .is_err()
    };
    assert!(fails(&|records| {
        let tombstone = records.iter_mut().find(|r| r.value.is_none()).unwrap();
        tombstone.value = Some(Vec::new());
    }));
    assert!(fails(&|records| {
        let empty = records
            .iter_mut()
            .find(|r| r.value.as_deref() == Some(&[][..]))
            .unwrap();
        empty.value = None;
    }));
    assert!(fails(&|records| {
        let r = records
            .iter_mut()
            .find(|r| r.headers.iter().any(|(name, _)| name == "e"))
            .unwrap();
        r.headers.iter_mut().find(|(name, _)| name == "e").unwrap().1 = None;
    }));
    assert!(fails(&|records| {
        let r = records
            .iter_mut()
            .find(|r| r.headers.iter().any(|(name, _)| name == "n"))
            .unwrap();
        r.headers.iter_mut().find(|(name, _)| name == "n").unwrap().1 = Some(Vec::new());
    }));
    assert!(fails(&|records| {
        let first = records[0].clone();
        records.push(first);
    }));
}

// ---------------------------------------------------------------------------
// Dead letters: records whose value cannot be taken as `value` says go to
// the dead-letter topic in the same transaction.

/// Whether record `i` of the JSON input is bad, and how: not JSON at all
/// (every 97th), or JSON without the `/payload` the sink takes (every 89th
/// of the rest).
fn bad_json(i: usize) -> Option<&'static str> {
    if i.is_multiple_of(97) {
        Some("not JSON")
    } else if i.is_multiple_of(89) {
        Some("nothing at /payload")
    } else {
        None
    }
}

/// Record `i` of the JSON input: key `k-<i>`, header `id` = `i`, value
/// `{"payload":"p-<i>"}`, or the bad values of [`bad_json`]; partition
/// `i % PARTITIONS`.
fn json_record(i: usize) -> ProduceRecord {
    let value = match bad_json(i) {
        Some("not JSON") => format!("not json {i}"),
        Some(_) => format!(r#"{{"other":{i}}}"#),
        None => format!(r#"{{"payload":"p-{i}"}}"#),
    };
    let mut record = ProduceRecord::new(value)
        .with_key(format!("k-{i}"))
        .with_header("id", i.to_string())
        .to_partition(i as i32 % PARTITIONS);
    record.headers.push(("null".to_string(), None));
    record
}

/// The JSON input, produced once per test binary.
fn json_input() -> &'static str {
    static INPUT: OnceLock<String> = OnceLock::new();
    INPUT.get_or_init(|| {
        let setup = setup();
        let input = unique("kafka-kafka-json-in");
        runtime().block_on(async {
            let admin = KafkaAdmin::new(setup.bootstrap());
            admin
                .create_topic(&input, PARTITIONS)
                .await
                .expect("creating the JSON input topic");
            admin
                .produce(&input, (0..RECORDS).map(json_record))
                .await
                .expect("producing the JSON input");
        });
        input
    })
}

/// The id header of an output record.
fn id_of(r: &OutputRecord, what: &str) -> usize {
    r.headers
        .first()
        .filter(|(name, _)| name == "id")
        .and_then(|(_, value)| std::str::from_utf8(value.as_deref()?).ok()?.parse().ok())
        .unwrap_or_else(|| panic!("{what}: a record without its id header: {r:?}"))
}

/// A pipeline copying the JSON input's payloads to a fresh output, with a
/// fresh dead-letter topic; returns (config, output, dead-letter topic).
fn dead_letter_pipeline(dir: &Path, name: &str) -> (PathBuf, String, String) {
    let setup = setup();
    let dead = unique(&format!("{name}-dead"));
    runtime().block_on(async {
        KafkaAdmin::new(setup.bootstrap())
            .create_topic(&dead, PARTITIONS)
            .await
            .expect("creating the dead-letter topic")
    });
    let extra = format!("value = \"/payload\"\ndead_letter_topic = \"{dead}\"");
    let (config, output) = setup.pipeline_from(json_input(), &[], dir, name, "exactly-once", &extra);
    (config, output, dead)
}

/// Every good record's payload exactly once in `output` (key and headers
/// kept), every bad record exactly once in `dead` — unchanged, with the
/// reason, its split and offset and the output topic in headers; returns
/// the number of dead letters.
fn assert_dead_letters_exactly_once(output: &str, dead: &str, what: &str) -> usize {
    let setup = setup();
    let input = json_input();
    let good = setup.output(output, what);
    let mut seen = vec![false; RECORDS];
    for r in &good.records {
        let id = id_of(r, what);
        assert!(bad_json(id).is_none(), "{what}: bad record {id} in the output");
        assert!(!seen[id], "{what}: record {id} twice in the output");
        seen[id] = true;
        assert_eq!(
            r.key.as_deref(),
            Some(format!("k-{id}").as_bytes()),
            "{what}: key of {id}"
        );
        assert_eq!(
            r.value.as_deref(),
            Some(format!("p-{id}").as_bytes()),
            "{what}: value of {id}"
        );
        assert_eq!(
            r.headers[1],
            ("null".to_string(), None),
            "{what}: a null header value stays null"
        );
    }
    let letters = setup.output(dead, what);
    for r in &letters.records {
        let id = id_of(r, what);
        let reason = bad_json(id).unwrap_or_else(|| panic!("{what}: good record {id} is a dead letter"));
        assert!(!seen[id], "{what}: record {id} twice");
        seen[id] = true;
        let original = json_record(id);
        assert_eq!(r.key, original.key, "{what}: the dead letter's key");
        assert_eq!(r.value, original.value, "{what}: the dead letter's value, unchanged");
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| String::from_utf8(v.clone()?).ok())
                .unwrap_or_else(|| panic!("{what}: no {name} header on {r:?}"))
        };
        assert_eq!(&r.headers[..2], &original.headers[..], "{what}: its own headers first");
        assert!(header("exactly.dead_letter.reason").contains(reason), "{what}: {r:?}");
        let split = format!("{input}-{}", id % PARTITIONS as usize);
        assert_eq!(header("exactly.dead_letter.split"), split);
        assert_eq!(
            header("exactly.dead_letter.offset"),
            (id / PARTITIONS as usize).to_string()
        );
        assert_eq!(header("exactly.dead_letter.topic"), output);
    }
    let missing: Vec<usize> = (0..RECORDS).filter(|&i| !seen[i]).take(10).collect();
    assert!(missing.is_empty(), "{what}: records missing, first ones: {missing:?}");
    let expected = (0..RECORDS).filter(|&i| bad_json(i).is_some()).count();
    assert_eq!(letters.records.len(), expected, "{what}: dead letters");
    letters.records.len()
}

#[test]
fn records_that_cannot_be_written_go_to_the_dead_letter_topic_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (config, output, dead) = dead_letter_pipeline(dir.path(), "dead_letters");
    let (status, stdout, log) = wait(spawn(&config), Duration::from_secs(180));
    assert!(status.success(), "{log}");
    let letters = assert_dead_letters_exactly_once(&output, &dead, "dead letters");
    assert!(
        stdout.contains(&format!("\"dead_letters\":{letters}")),
        "the run reports its {letters} dead letters: {stdout}"
    );
}

/// The dead letters of a pre-committed checkpoint are committed with EndTxn
/// with the rest of its transaction; those of unlisted ones are aborted
/// with it and written again: exactly once in both topics.
#[test]
fn dead_letters_are_exactly_once_under_a_sigkill_after_persist() {
    let dir = tempfile::tempdir().unwrap();
    let name = "dead_letters_after_persist";
    let (config, output, dead) = dead_letter_pipeline(dir.path(), name);
    let log = killed_then_finished(&config, name, &["coordinator.after_persist_pending:1"]);
    assert_end_txn_recovery(&log);
    assert_dead_letters_exactly_once(&output, &dead, name);
}

#[test]
fn dead_letters_are_exactly_once_under_a_sigkill_while_writing() {
    let dir = tempfile::tempdir().unwrap();
    let name = "dead_letters_while_writing";
    let (config, output, dead) = dead_letter_pipeline(dir.path(), name);
    killed_then_finished(&config, name, &["source.after_emit:40"]);
    assert_dead_letters_exactly_once(&output, &dead, name);
}

/// Without `dead_letter_topic`, the first such record stops the pipeline
/// with an error naming it and the setting.
#[test]
fn without_a_dead_letter_topic_a_record_that_cannot_be_written_stops_the_run() {
    let setup = setup();
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = setup.pipeline_from(
        json_input(),
        &[],
        dir.path(),
        "no_dead_letters",
        "exactly-once",
        "value = \"/payload\"",
    );
    let (status, _, log) = wait(spawn(&config), Duration::from_secs(180));
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("cannot be written") && log.contains("set `dead_letter_topic`"),
        "{log}"
    );
}
