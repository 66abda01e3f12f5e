//! Several processes, one pipeline, through the binary: `exactly run` with
//! `[workers]` started several times forms one Kafka → PostgreSQL pipeline
//! of parallelism 6 whose regions the workers share under leases in the
//! PostgreSQL checkpoint store. Two workers split the regions; a third
//! joins and takes a share (the others hand theirs over); one is frozen
//! (SIGSTOP) past its lease while records flow, the others take its
//! regions, and once thawed it drops them without writing (its log and
//! metrics say so) and comes back as a worker; one is killed (SIGKILL) and
//! its regions go to the others when its leases run out; a fourth joins;
//! SIGTERM stops them all with their regions handed over. Every order lands
//! exactly once, no prepared transaction is left, and the store holds no
//! checkpoint of an older epoch written after a newer one was taken.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::orders::*;
use common::run::Worker;
use common::scrape::Scrape;
use exactly_testkit::{KafkaBroker, PostgresServer};

const ORDERS: i64 = 6000;
const PARALLELISM: usize = 6;

/// The pipeline file: the orders into `table` at parallelism 6,
/// checkpoints in the PostgreSQL store at `url`, as workers.
fn pipeline(dir: &Path, name: &str, (bootstrap, topic): (&str, &str), (url, table): (&str, &str)) -> PathBuf {
    let file = orders_pipeline(
        dir,
        "pipeline.toml",
        name,
        PARALLELISM,
        "unused",
        "200ms",
        (bootstrap, topic),
        (url, table),
        false,
    );
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("dir = \"unused\"", &format!("store = {{ postgres = \"{url}\" }}"));
    std::fs::write(&file, format!("{text}\n\n[workers]\n")).unwrap();
    file
}

/// The regions each worker owns now, by its metrics (-1 while its
/// endpoint does not answer yet).
fn owned(workers: &mut [&mut Worker]) -> Vec<f64> {
    workers
        .iter_mut()
        .map(|w| Scrape::try_take(&w.base).map_or(-1.0, |s| s.value("exactly_regions_owned")))
        .collect()
}

/// Waits until the workers own the regions as `want` says, each of them
/// running.
fn wait_for_shares(workers: &mut [&mut Worker], want: impl Fn(&[f64]) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let shares = owned(workers);
        if want(&shares) {
            return;
        }
        if Instant::now() > deadline || workers.iter_mut().any(|w| !w.is_running()) {
            let logs: Vec<String> = workers.iter().map(|w| w.log()).collect();
            panic!("{what}: the workers own {shares:?}\n{}", logs.join("\n-----\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the committed rows exceed `above`.
fn wait_for_rows_above(url: &str, table: &str, above: i64, workers: &mut [&mut Worker]) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let rows = committed_orders(url, table);
        if rows > above {
            return rows;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = workers.iter().map(|w| w.log()).collect();
            panic!("no row committed beyond {above}\n{}", logs.join("\n-----\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the store holds against the epochs' promises, for people: a
/// checkpoint written under an epoch after a newer epoch of its region was
/// taken, and a checkpoint id with more than one entry in a region (used
/// twice, by two owners or two attempts).
fn fencing_violations(url: &str, pipeline: &str) -> Vec<String> {
    const LATE: &str =
        "SELECT c.scope || '/' || c.name || ': epoch ' || c.epoch || ' written after epoch ' || e.epoch \
         || ' was taken' FROM exactly_checkpoints c JOIN exactly_epochs e \
         ON e.pipeline = c.pipeline AND e.scope = c.scope AND e.epoch > c.epoch \
         WHERE c.pipeline = $1 AND c.written_at > e.taken_at";
    const REUSED: &str = "SELECT scope || ' checkpoint ' || checkpoint_id || ': ' || count(*) || ' entries' \
         FROM exactly_checkpoints WHERE pipeline = $1 GROUP BY scope, checkpoint_id HAVING count(*) > 1";
    with_postgres(url, async |db| {
        let mut found = Vec::new();
        for sql in [LATE, REUSED] {
            let rows = db.query(sql, &[&pipeline]).await.expect("reading the store");
            found.extend(rows.iter().map(|r| r.get::<_, String>(0)));
        }
        found
    })
}

/// A Kafka → PostgreSQL pipeline for workers: a PostgreSQL of its own, the
/// shared broker, a topic that reaches every subtask fed half its orders at
/// once and then one at a time until [`Scene::finish`] (records flow
/// through every phase of a test), and the pipeline file.
struct Scene {
    pg: PostgresServer,
    kafka: &'static KafkaBroker,
    dir: tempfile::TempDir,
    name: String,
    table: String,
    feed: Feed,
    file: PathBuf,
}

impl Scene {
    fn start(prefix: &str, orders: i64) -> Scene {
        let pg = PostgresServer::start().expect("starting PostgreSQL");
        let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
        let dir = tempfile::tempdir().unwrap();
        let name = fresh(prefix);
        let topic = topic_reaching_every_subtask(prefix, &[PARALLELISM]);
        let table = fresh(&format!("{prefix}_orders"));
        let feed = Feed::start_held(kafka.bootstrap(), &topic, orders);
        let file = pipeline(dir.path(), &name, (kafka.bootstrap(), &topic), (pg.url(), &table));
        Scene {
            pg,
            kafka,
            dir,
            name,
            table,
            feed,
            file,
        }
    }

    fn url(&self) -> &str {
        self.pg.url()
    }

    /// A worker of the pipeline, its log named `tag`.
    fn worker(&self, tag: &str) -> Worker {
        Worker::start(&self.file, self.dir.path(), tag)
    }

    /// Releases the rest of the feed, waits until every order is committed
    /// while `workers` run, stops them with SIGTERM (each must stop cleanly,
    /// leaving the workers), then checks every order exactly once with no
    /// prepared transaction left, no checkpoint of a fenced epoch written
    /// late and no checkpoint id used twice.
    fn finish(self, mut workers: Vec<Worker>, what: &str) {
        self.feed.finish();
        let url = self.pg.url();
        let deadline = Instant::now() + Duration::from_secs(240);
        while committed_orders(url, &self.table) < ORDERS {
            if Instant::now() > deadline || workers.iter_mut().any(|w| !w.is_running()) {
                let logs: Vec<String> = workers.iter().map(|w| w.log()).collect();
                panic!(
                    "{what}: the orders did not all arrive ({} of {ORDERS})\n{}",
                    committed_orders(url, &self.table),
                    logs.join("\n-----\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for w in workers {
            let (ok, log) = w.stop(Duration::from_secs(60));
            assert!(ok, "{what}: a worker did not stop cleanly after SIGTERM:\n{log}");
            assert!(log.contains("left the pipeline's workers"), "{log}");
        }
        assert_orders_exactly_once(url, &self.table, &self.name, ORDERS, what);
        assert_eq!(
            fencing_violations(url, &self.name),
            Vec::<String>::new(),
            "{what}: epochs in the store"
        );
    }
}

#[test]
fn workers_share_a_pipeline_exactly_once_through_a_join_a_freeze_a_kill_and_sigterm() {
    let scene = Scene::start("workers", ORDERS);
    let (url, table, file) = (scene.url(), &scene.table, &scene.file);

    // Two workers split the six regions.
    let mut a = scene.worker("a");
    let mut b = scene.worker("b");
    wait_for_shares(
        &mut [&mut a, &mut b],
        |s| s == [3.0, 3.0],
        "two workers, three regions each",
    );
    let rows = wait_for_rows_above(url, table, 0, &mut [&mut a, &mut b]);

    // A third joins: it takes a share, the others hand one region each over.
    let mut c = scene.worker("c");
    wait_for_shares(
        &mut [&mut a, &mut b, &mut c],
        |s| s == [2.0, 2.0, 2.0],
        "three workers, two regions each",
    );
    for w in [&a, &b] {
        assert!(
            w.log().contains("handing the region over"),
            "a worker above its share hands regions over:\n{}",
            w.log()
        );
    }
    // `exactly status` shows the workers and who owns which region.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_exactly"))
        .args(["status", file.to_str().unwrap()])
        .output()
        .expect("running exactly status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("workers: 3 live"), "{text}");
    for pid in [a.child.id(), b.child.id(), c.child.id()] {
        let owns = text
            .lines()
            .filter(|l| l.contains("owned by") && l.contains(&format!(":{pid}:")))
            .count();
        assert_eq!(owns, 2, "worker {pid} owns two regions:\n{text}");
    }
    let rows = wait_for_rows_above(url, table, rows, &mut [&mut a, &mut b, &mut c]);

    // A is frozen past its lease: the others take its regions while it
    // sleeps and go on writing.
    a.signal(libc::SIGSTOP);
    wait_for_shares(
        &mut [&mut b, &mut c],
        |s| s.iter().sum::<f64>() == PARALLELISM as f64,
        "the frozen worker's regions taken over",
    );
    let rows = wait_for_rows_above(url, table, rows, &mut [&mut b, &mut c]);
    // Thawed, it finds its deadlines passed and drops its regions without
    // a last checkpoint, then joins again and gets a share back.
    a.signal(libc::SIGCONT);
    a.wait_for_log("stopped acting on the region at once", Duration::from_secs(60));
    let scrape = Scrape::take(&a.base);
    assert!(scrape.value("exactly_regions_dropped_total") >= 2.0, "{}", a.log());
    wait_for_shares(
        &mut [&mut a, &mut b, &mut c],
        |s| s == [2.0, 2.0, 2.0],
        "the thawed worker back with a share",
    );

    // B dies: its regions go to the others once its leases run out.
    b.kill();
    wait_for_shares(
        &mut [&mut a, &mut c],
        |s| s == [3.0, 3.0],
        "the killed worker's regions taken over",
    );
    wait_for_rows_above(url, table, rows, &mut [&mut a, &mut c]);

    // A fourth joins.
    let mut d = scene.worker("d");
    wait_for_shares(
        &mut [&mut a, &mut c, &mut d],
        |s| s == [2.0, 2.0, 2.0],
        "a new worker takes a share",
    );

    // Every order, then SIGTERM: each worker hands its regions over.
    scene.finish(vec![a, c, d], "after joins, a freeze, a kill and SIGTERM");
}

/// Occurrences of `what` in the logs of `workers`.
fn count_in_logs(workers: &[&Worker], what: &str) -> usize {
    workers.iter().map(|w| w.log().matches(what).count()).sum()
}

/// A worker frozen past its lease at each phase of a checkpoint — right
/// after a sink subtask's `PREPARE TRANSACTION`, right after a checkpoint
/// listing prepared transactions is persisted, right before `COMMIT
/// PREPARED` — while records flow: the other workers take its regions, and
/// the new owner finds the zombie's prepared transaction holding the
/// subtask's fence row, ends it (commits it when its checkpoint lists it,
/// rolls it back when not) and raises the fence; the zombie, thawed, drops
/// its regions without writing. Every order exactly once, nothing left
/// prepared, no checkpoint of a fenced epoch written late.
#[test]
fn a_worker_frozen_past_its_lease_at_each_phase_drops_its_regions_exactly_once() {
    let scene = Scene::start("frozen", ORDERS);
    let (url, table, file, dir) = (scene.url(), &scene.table, &scene.file, scene.dir.path());
    let mut b = scene.worker("b");
    let mut c = scene.worker("c");
    wait_for_shares(
        &mut [&mut b, &mut c],
        |s| s == [3.0, 3.0],
        "two workers, three regions each",
    );
    let mut rows = wait_for_rows_above(url, table, 0, &mut [&mut b, &mut c]);

    let phases = [
        ("after PREPARE", "sink.after_pre_commit:20"),
        ("after persist", "coordinator.after_persist_pending:10"),
        ("before COMMIT PREPARED", "sink.before_commit:10"),
    ];
    for (phase, point) in phases {
        let fences = count_in_logs(&[&b, &c], "holds the fence: ending it");
        let mut zombie = Worker::start_with(file, dir, "zombie", &[("EXACTLY_STOP_AT", point)]);
        zombie.wait_for_log("EXACTLY_STOP_POINT_REACHED", Duration::from_secs(120));
        // Frozen: its leases run out, the others take its regions (and the
        // transaction it left prepared) and go on.
        wait_for_shares(
            &mut [&mut b, &mut c],
            |s| s.iter().sum::<f64>() == PARALLELISM as f64,
            &format!("{phase}: the frozen worker's regions taken over"),
        );
        rows = wait_for_rows_above(url, table, rows, &mut [&mut b, &mut c]);
        // The new owner of the region whose transaction the zombie left
        // prepared finds it holding the subtask's fence row, and ends it.
        let deadline = Instant::now() + Duration::from_secs(60);
        while count_in_logs(&[&b, &c], "holds the fence: ending it") == fences {
            assert!(
                Instant::now() < deadline,
                "{phase}: no new owner met the zombie's prepared transaction on the fence row:\n{}\n-----\n{}\n-----\n{}",
                b.log(),
                c.log(),
                zombie.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Thawed: its deadlines have passed, it drops its regions at once.
        zombie.signal(libc::SIGCONT);
        zombie.wait_for_log("stopped acting on the region at once", Duration::from_secs(60));
        let dropped = Scrape::take(&zombie.base).value("exactly_regions_dropped_total");
        assert!(dropped >= 1.0, "{phase}: {}", zombie.log());
        let (ok, log) = zombie.stop(Duration::from_secs(60));
        assert!(ok, "{phase}: the thawed worker did not stop cleanly:\n{log}");
        wait_for_shares(
            &mut [&mut b, &mut c],
            |s| s == [3.0, 3.0],
            &format!("{phase}: back to two workers"),
        );
        std::fs::rename(dir.join("zombie.log"), dir.join(format!("zombie {phase}.log"))).unwrap();
    }

    scene.finish(vec![b, c], "after freezes at every phase");
}

/// Kafka → Kafka with two workers on the PostgreSQL store: one freezes right
/// after its sink pre-committed a transaction, past its lease; the other
/// takes its region, and its recovery initializes the zombie's
/// transactional ids again, which fences the zombie's producers (the broker
/// aborts the transaction the zombie left open). Thawed, the zombie drops
/// its region. The output holds every input record exactly once, and no
/// transaction is left open.
#[test]
fn a_frozen_workers_kafka_producers_are_fenced_and_the_copy_is_exact() {
    use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
    use exactly_kafka::wire::WireClient;
    const RECORDS: usize = 4000;
    let pg = PostgresServer::start().expect("starting PostgreSQL");
    let url = pg.url();
    let kafka = KafkaBroker::shared().expect("starting the shared Kafka broker");
    let dir = tempfile::tempdir().unwrap();
    let (input, output, name) = (fresh("workers-in"), fresh("workers-out"), fresh("workers-kk"));
    let produce = |range: std::ops::Range<usize>| {
        current_thread_runtime().block_on(async {
            let records = range.map(|i| {
                ProduceRecord::new(format!("v-{i}"))
                    .with_key(format!("k-{i}"))
                    .to_partition(i as i32 % 2)
            });
            KafkaAdmin::new(kafka.bootstrap())
                .produce(&input, records)
                .await
                .expect("producing the input")
        })
    };
    current_thread_runtime().block_on(async {
        let admin = KafkaAdmin::new(kafka.bootstrap());
        admin.create_topic(&input, 2).await.expect("creating the input topic");
        admin.create_topic(&output, 2).await.expect("creating the output topic");
    });
    produce(0..RECORDS / 2);
    let sink = format!(
        "[sink.kafka]\nbootstrap = \"{}\"\ntopic = \"{output}\"\ntransactional_id_prefix = \"{name}\"\n\n[workers]\n",
        kafka.bootstrap()
    );
    let file = common::kafka_pipeline_file(dir.path(), &name, (kafka.bootstrap(), &input), false, &sink);
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("dir = \"checkpoints\"", &format!("store = {{ postgres = \"{url}\" }}"));
    std::fs::write(&file, text).unwrap();

    let mut a = Worker::start(&file, dir.path(), "a");
    wait_for_shares(&mut [&mut a], |s| s == [2.0], "one worker, both regions");
    let mut zombie = Worker::start_with(
        &file,
        dir.path(),
        "zombie",
        &[("EXACTLY_STOP_AT", "sink.after_pre_commit:2")],
    );
    // Its share comes with records to copy: the second half of the input.
    wait_for_shares(
        &mut [&mut a, &mut zombie],
        |s| s == [1.0, 1.0],
        "two workers, one region each",
    );
    produce(RECORDS / 2..RECORDS);
    zombie.wait_for_log("EXACTLY_STOP_POINT_REACHED", Duration::from_secs(120));
    wait_for_shares(&mut [&mut a], |s| s == [2.0], "the frozen worker's region taken over");
    zombie.signal(libc::SIGCONT);
    zombie.wait_for_log("stopped acting on the region at once", Duration::from_secs(60));

    let read = || {
        current_thread_runtime().block_on(async {
            KafkaAdmin::new(kafka.bootstrap())
                .read_all(&output)
                .await
                .expect("consuming the output read_committed")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while read().len() < RECORDS {
        assert!(
            Instant::now() < deadline && a.is_running(),
            "the copy did not complete:\n{}",
            a.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for w in [a, zombie] {
        let (ok, log) = w.stop(Duration::from_secs(60));
        assert!(ok, "a worker did not stop cleanly after SIGTERM:\n{log}");
    }
    let log = current_thread_runtime().block_on(async {
        WireClient::new(kafka.bootstrap())
            .unwrap()
            .read_topic_settled(&output, Duration::from_secs(30))
            .await
            .expect("reading the output's log")
    });
    assert!(log.open_transactions.is_empty(), "open: {:?}", log.open_transactions);
    assert!(
        log.aborted_records > 0,
        "the zombie's pre-committed transaction was aborted by the fence of its transactional id"
    );
    let values: Vec<String> = read()
        .iter()
        .map(|r| String::from_utf8(r.value.clone().expect("a value").to_vec()).unwrap())
        .collect();
    let distinct: std::collections::BTreeSet<&String> = values.iter().collect();
    assert_eq!(
        (values.len(), distinct.len()),
        (RECORDS, RECORDS),
        "records / distinct records"
    );
    assert!(
        (0..RECORDS).all(|i| distinct.contains(&format!("v-{i}"))),
        "every record"
    );
    assert_eq!(
        fencing_violations(url, &name),
        Vec::<String>::new(),
        "epochs in the store"
    );
}

/// A worker cut off from PostgreSQL and Kafka — it runs in a network
/// namespace of the test's own whose loopback goes down: every packet of
/// its connections dropped, nobody told — while records flow: the other
/// workers take its regions when its leases run out; it stops acting on
/// them by its own clock while still cut off; reconnected, it joins again
/// and gets a share back. Every order exactly once, nothing left prepared,
/// no checkpoint of a fenced epoch written late.
#[test]
fn a_worker_cut_off_by_the_network_and_reconnected_drops_its_regions_exactly_once() {
    let scene = Scene::start("cut", ORDERS);
    let (url, table, file, dir) = (scene.url(), &scene.table, &scene.file, scene.dir.path());
    let port_of = |address: &str| -> u16 {
        let after_host = address.rsplit_once("127.0.0.1:").expect("a loopback address").1;
        after_host
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .expect("a port")
    };
    let netns = common::netns::Netns::create("cut");
    netns.forward(port_of(url));
    netns.forward(port_of(scene.kafka.bootstrap()));
    let mut b = scene.worker("b");
    let mut c = scene.worker("c");
    wait_for_shares(
        &mut [&mut b, &mut c],
        |s| s == [3.0, 3.0],
        "two workers, three regions each",
    );
    // The third runs inside the namespace (its metrics endpoint is there
    // too: it is watched through its log).
    let mut z = Worker::start_inside(&netns, file, dir, "cut-off");
    wait_for_shares(
        &mut [&mut b, &mut c],
        |s| s == [2.0, 2.0],
        "the third worker took a share",
    );
    let rows = wait_for_rows_above(url, table, 0, &mut [&mut b, &mut c]);
    let claimed = |z: &Worker| z.log().matches("claimed the region").count();
    // The others handed two regions over; it claims them on its next look.
    let deadline = Instant::now() + Duration::from_secs(60);
    while claimed(&z) < 2 {
        assert!(Instant::now() < deadline && z.is_running(), "{}", z.log());
        std::thread::sleep(Duration::from_millis(50));
    }

    netns.cut();
    wait_for_shares(
        &mut [&mut b, &mut c],
        |s| s.iter().sum::<f64>() == PARALLELISM as f64,
        "the cut-off worker's regions taken over",
    );
    let rows = wait_for_rows_above(url, table, rows, &mut [&mut b, &mut c]);
    z.wait_for_log("stopped acting on the region at once", Duration::from_secs(60));
    assert!(z.is_running(), "the cut-off worker rides the cut out:\n{}", z.log());

    let before = claimed(&z);
    netns.reconnect();
    wait_for_shares(
        &mut [&mut b, &mut c],
        |s| s == [2.0, 2.0],
        "the reconnected worker back with a share",
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while claimed(&z) < before + 2 {
        assert!(Instant::now() < deadline && z.is_running(), "{}", z.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_for_rows_above(url, table, rows, &mut [&mut b, &mut c]);

    scene.finish(vec![z, b, c], "after a worker was cut off and reconnected");
}

/// Workers and a process running the pipeline alone (without `[workers]`)
/// never run side by side: each is refused while the other runs, naming it
/// and the fix, and touches nothing.
#[test]
fn workers_and_a_process_running_the_pipeline_alone_refuse_each_other() {
    let scene = Scene::start("alone", 600);
    let (workers, dir) = (&scene.file, scene.dir.path());
    let alone = dir.join("alone.toml");
    std::fs::write(
        &alone,
        std::fs::read_to_string(workers).unwrap().replace("[workers]", ""),
    )
    .unwrap();

    let mut w = Worker::start(workers, dir, "worker");
    wait_for_shares(&mut [&mut w], |s| s == [PARALLELISM as f64], "one worker, every region");
    let mut refused = Worker::start(&alone, dir, "alone");
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused.is_running() {
        assert!(Instant::now() < deadline, "{}", refused.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = refused.log();
    assert!(log.contains("[workers]") && log.contains("worker "), "{log}");
    let (ok, log) = w.stop(Duration::from_secs(60));
    assert!(ok, "{log}");

    let mut a = Worker::start(&alone, dir, "alone-2");
    a.wait_for_log("checkpoint complete", Duration::from_secs(120));
    let mut refused = Worker::start(workers, dir, "worker-2");
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused.is_running() {
        assert!(Instant::now() < deadline, "{}", refused.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = refused.log();
    assert!(log.contains("without [workers]"), "{log}");
    assert!(!log.contains("claimed the region"), "{log}");
    let (ok, log) = a.stop(Duration::from_secs(60));
    assert!(ok, "{log}");
    scene.feed.finish();
}
