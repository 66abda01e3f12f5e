//! Kafka → Kafka end to end, through the `exactly` binary and a pipeline file:
//! `[source.kafka]` reads an input topic, `[sink.kafka]` writes an output topic
//! in transactions, and the run is killed with SIGKILL at every phase of the
//! two-phase commit. The output is checked with the log-level committed reader
//! (`exactly_kafka::wire`, which is `exactly_kafka_wire`): Nisshi writes
//! COMMIT/ABORT markers but does not hide aborted records from read_committed
//! consumers, so a plain consumer cannot be the judge there. Against a real Kafka
//! (`EXACTLY_KAFKA_BOOTSTRAP`, the `#[ignore]`d tests) a plain read_committed
//! consumer must agree.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_kafka::wire::{CommittedRead, WireClient};
use exactly_testkit::KafkaBroker;

const PARTITIONS: i32 = 4;
const RECORDS: usize = 20_000;
const REAL_KAFKA: &str =
    "needs a real Apache Kafka: set EXACTLY_KAFKA_BOOTSTRAP=host:port and run cargo test --test kafka_kafka -- --ignored";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A broker with an input topic of [`RECORDS`] records `v-<i>` (key `k-<i>`).
///
/// The broker is Nisshi with in-memory storage (or the Kafka of
/// `EXACTLY_KAFKA_BOOTSTRAP`). Its SQLite storage is unusable for
/// transactional sinks: InitProducerId leaves the transaction of a crashed
/// producer open, a producer epoch cannot write a second transaction to a
/// partition while an overlapping transaction of another producer is open
/// (it hangs up on AddPartitionsToTxn), and with a fresh epoch per
/// transaction instead, some commits that succeeded for librdkafka wrote no
/// COMMIT marker. The in-memory storage does none of that; it answers
/// ListOffsets(latest) with the base offset of the partition's last batch
/// plus one, so the input is produced one record per batch, which makes that
/// the real end for `stop_at_end`.
struct Setup {
    kafka: KafkaBroker,
    input: String,
}

/// A name no other test or earlier run against an external Kafka uses.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

fn setup(name: &str) -> Setup {
    let kafka = KafkaBroker::start().expect("starting the Kafka broker");
    let input = unique(&format!("{name}-in"));
    runtime().block_on(async {
        let admin = KafkaAdmin::new(kafka.bootstrap()).with_property("batch.num.messages", "1");
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
}

impl Setup {
    fn bootstrap(&self) -> &str {
        self.kafka.bootstrap()
    }

    /// Creates a fresh output topic and writes `<dir>/<name>.toml`: parallelism
    /// 2, checkpoints every 50 ms, the bounded input copied to it. `extra` is
    /// added to `[sink.kafka]`.
    fn pipeline(&self, dir: &Path, name: &str, guarantee: &str, extra: &str) -> (PathBuf, String) {
        let output = unique(&format!("{name}-out"));
        runtime().block_on(async {
            KafkaAdmin::new(self.bootstrap())
                .create_topic(&output, PARTITIONS)
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
                input = self.input,
                prefix = unique(name),
            ),
        )
        .unwrap();
        (file, output)
    }

    /// What a read_committed consumer may see of `topic`, decided from the log.
    fn committed(&self, topic: &str) -> CommittedRead {
        runtime().block_on(async {
            WireClient::new(self.bootstrap())
                .unwrap()
                .read_topic(topic)
                .await
                .expect("reading the output topic")
        })
    }

    /// On a real Kafka: the values a plain read_committed consumer reads.
    fn consumed(&self, topic: &str) -> Vec<String> {
        runtime().block_on(async {
            let records = KafkaAdmin::new(self.bootstrap())
                .read_all(topic)
                .await
                .expect("consuming");
            records
                .into_iter()
                .map(|r| String::from_utf8(r.value).unwrap())
                .collect()
        })
    }
}

fn values(read: &CommittedRead) -> Vec<String> {
    read.records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap_or_default()).unwrap())
        .collect()
}

fn expected() -> BTreeSet<String> {
    (0..RECORDS).map(|i| format!("v-{i}")).collect()
}

/// Every input record exactly once (count and set), with its key, and no
/// transaction left open.
fn assert_exactly_once(setup: &Setup, output: &str, what: &str) {
    let read = setup.committed(output);
    let values = values(&read);
    let set: BTreeSet<String> = values.iter().cloned().collect();
    assert_eq!(values.len(), RECORDS, "{what}: committed records (duplicates or loss)");
    assert_eq!(set, expected(), "{what}: the set of committed values");
    for r in &read.records {
        let value = String::from_utf8(r.value.clone().unwrap()).unwrap();
        let key = value.replacen("v-", "k-", 1);
        assert_eq!(r.key.as_deref(), Some(key.as_bytes()), "{what}: the key of {value}");
    }
    assert!(
        read.open_transactions.is_empty(),
        "{what}: transactions left open: {:?}",
        read.open_transactions
    );
    if setup.kafka.is_external() {
        let mut consumed = setup.consumed(output);
        consumed.sort();
        let mut committed = values;
        committed.sort();
        assert_eq!(consumed, committed, "{what}: a read_committed consumer disagrees");
    }
}

/// Runs the pipeline killed at each of `points` in turn, then to completion,
/// checks the output and returns the log of the last run.
fn crash_case(setup: &Setup, name: &str, points: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = setup.pipeline(dir.path(), name, "exactly-once", "");
    for point in points {
        run_killed_at(&config, point);
    }
    let (status, log) = run(&config, None, &[]);
    assert!(
        status.success(),
        "{name}: the restarted run failed with {status}:\n{log}"
    );
    assert_exactly_once(setup, &output, name);
    log
}

fn case(name: &str) -> String {
    let setup = setup(name);
    let (_, points) = TWO_PHASE_CRASH_CASES
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a known case");
    crash_case(&setup, name, points)
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
    let setup = setup("no_crash");
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = setup.pipeline(dir.path(), "no_crash", "exactly-once", "");
    run_to_completion(&config);
    assert_exactly_once(&setup, &output, "no crash");
    // A second run finds nothing new and recovers the last checkpoint's
    // transactions again (EndTxn on committed ones is a no-op).
    run_to_completion(&config);
    assert_exactly_once(&setup, &output, "no crash, run again");
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

/// The negative control of the EndTxn path: the same crash as
/// [`sigkill_after_the_checkpoint_is_persisted_before_the_commit`], with
/// recovery aborting the listed transactions instead of committing them,
/// must lose that checkpoint's records — and the check must see it.
#[test]
fn aborting_instead_of_committing_on_recovery_loses_the_checkpoint() {
    let setup = setup("negative");
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = setup.pipeline(dir.path(), "negative", "exactly-once", "");
    run_killed_at(&config, "coordinator.after_persist:3");
    let env = [(exactly::core::fault::ABORT_PENDING_ON_RECOVER_ENV, "1")];
    let (status, log) = run_with_env(&config, None, &[], &env);
    assert!(status.success(), "{log}");
    assert!(log.contains("TEST ONLY"), "the knob announces itself:\n{log}");
    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_exactly_once(&setup, &output, "negative control")
    }));
    assert!(check.is_err(), "the exactly-once check must fail on this output");
    let read = setup.committed(&output);
    let values = values(&read);
    let set: BTreeSet<String> = values.iter().cloned().collect();
    assert_eq!(set.len(), values.len(), "no duplicates either way");
    assert!(set.is_subset(&expected()));
    assert!(
        values.len() < RECORDS,
        "the transactions of the persisted checkpoint were aborted, yet all {RECORDS} records are committed"
    );
    assert!(read.aborted_records > 0, "the lost records were aborted");
    let missing = RECORDS - values.len();
    println!("negative control: {missing} records of the lost checkpoint are missing, as expected");
}

/// The other negative control: at-least-once commits at the barrier, before
/// the checkpoint is persisted, so a crash there replays committed records.
#[test]
fn at_least_once_shows_duplicates_after_a_crash_before_persist() {
    let setup = setup("alo");
    let dir = tempfile::tempdir().unwrap();
    let (config, output) = setup.pipeline(dir.path(), "alo", "at-least-once", "");
    crash_then_finish(&config, &["coordinator.before_persist:3"]);
    let values = values(&setup.committed(&output));
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

fn require_real_kafka() {
    assert!(
        std::env::var(exactly_testkit::kafka::KAFKA_BOOTSTRAP_ENV).is_ok(),
        "{REAL_KAFKA}"
    );
}

#[test]
#[ignore = "needs a real Apache Kafka: set EXACTLY_KAFKA_BOOTSTRAP=host:port and run cargo test --test kafka_kafka -- --ignored"]
fn real_kafka_crash_matrix() {
    require_real_kafka();
    let setup = setup("real");
    for (name, points) in TWO_PHASE_CRASH_CASES {
        crash_case(&setup, name, points);
    }
}

#[test]
#[ignore = "needs a real Apache Kafka: set EXACTLY_KAFKA_BOOTSTRAP=host:port and run cargo test --test kafka_kafka -- --ignored"]
fn real_kafka_negative_control_loses_the_checkpoint() {
    require_real_kafka();
    aborting_instead_of_committing_on_recovery_loses_the_checkpoint();
}

/// Apache Kafka limits transaction timeouts (transaction.max.timeout.ms,
/// 15 minutes by default): a longer `transaction_timeout` is refused at
/// start, naming the setting.
#[test]
#[ignore = "needs a real Apache Kafka: set EXACTLY_KAFKA_BOOTSTRAP=host:port and run cargo test --test kafka_kafka -- --ignored"]
fn real_kafka_refuses_a_transaction_timeout_above_the_broker_limit() {
    require_real_kafka();
    let setup = setup("limit");
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = setup.pipeline(dir.path(), "limit", "exactly-once", "transaction_timeout = \"1000h\"");
    let (status, _, log) = wait(spawn(&config), Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        log.contains("`transaction_timeout`") && log.contains("transaction.max.timeout.ms"),
        "{log}"
    );
}
