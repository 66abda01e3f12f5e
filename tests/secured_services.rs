//! Secured services through the `exactly` binary: Apache Kafka reached only
//! over its `SASL_SSL` listener (SCRAM, the broker's CA) and a PostgreSQL
//! that accepts TCP only over TLS (`verify-full` with the test CA,
//! scram-sha-256), the passwords coming from `{ env = … }` and
//! `{ file = … }` references of the pipeline file.
//!
//! - Kafka → PostgreSQL killed after a checkpoint is persisted and before
//!   its commit, then during the recovery that commits it: every order
//!   exactly once, no prepared transaction left.
//! - Kafka → Kafka killed after a persist: the restart commits the pending
//!   transactions with exactly-kafka-wire's EndTxn over `SASL_SSL`.
//! - Every misconfiguration of the security settings ends the run quickly
//!   with a fatal error naming the service, the setting and the fix, never
//!   the secret.
//!
//! The test's own set-up and checks use the broker's plaintext listener and
//! PostgreSQL's Unix socket. Each test starts its own broker and server;
//! the tests take turns (one JVM broker at a time).

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::orders::{assert_orders_exactly_once, current_thread_runtime, fresh, order, prepared_of_pipeline};
use common::*;
use exactly_kafka::admin::{KafkaAdmin, ProduceRecord};
use exactly_testkit::kafka::SecuredListener;
use exactly_testkit::postgres::PostgresTls;
use exactly_testkit::{KafkaBroker, PostgresServer};

/// Orders of the Kafka → PostgreSQL test, records of the Kafka → Kafka one.
const RECORDS: i64 = 10_000;
const PARTITIONS: i32 = common::orders::ORDER_PARTITIONS;
/// The SASL mechanism the pipelines use. The broker enables SCRAM only, so
/// PLAIN is a mechanism it does not enable.
const MECHANISM: &str = "SCRAM-SHA-512";
/// The variable the pipelines' PostgreSQL URL (with its password) comes from.
const PG_URL_ENV: &str = "EXACTLY_SECURED_PG_URL";
/// The file, beside the pipeline file, the SASL password comes from.
const KAFKA_PASSWORD_FILE: &str = "kafka-password";
/// How long a misconfigured run may take to fail: its first connections,
/// not a retry loop (the pipelines restart up to 100 times).
const FAIL_WITHIN: Duration = Duration::from_secs(45);

/// A secured broker and a TLS-only PostgreSQL of the calling test's own.
struct Services {
    _turn: MutexGuard<'static, ()>,
    kafka: KafkaBroker,
    pg: PostgresServer,
}

impl Services {
    fn start() -> Services {
        static TURN: Mutex<()> = Mutex::new(());
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let kafka = KafkaBroker::builder()
            .sasl_mechanisms(&["SCRAM-SHA-256", "SCRAM-SHA-512"])
            .start()
            .expect("starting a Kafka broker with a SASL_SSL listener");
        let pg = PostgresServer::start_tls().expect("starting a TLS-only PostgreSQL");
        Services { _turn: turn, kafka, pg }
    }

    fn secured(&self) -> &SecuredListener {
        self.kafka.secured().expect("the SASL_SSL listener")
    }

    fn tls(&self) -> &PostgresTls {
        self.pg.tls().expect("the TLS files")
    }

    /// The pipelines' PostgreSQL URL: `verify-full` with the test CA and
    /// the password.
    fn pg_url(&self) -> String {
        let url = self
            .pg
            .url()
            .replacen("postgres@", &format!("postgres:{}@", self.tls().password), 1);
        assert_ne!(url, self.pg.url(), "the test kit's URL changed shape");
        url
    }

    /// The test's own way into PostgreSQL (Unix socket, no TLS).
    fn admin_url(&self) -> &str {
        &self.tls().admin_url
    }

    /// A fresh topic of [`PARTITIONS`] partitions holding `records`,
    /// produced through the plaintext listener.
    fn topic_with(&self, prefix: &str, records: impl IntoIterator<Item = ProduceRecord>) -> String {
        let topic = fresh(prefix);
        current_thread_runtime().block_on(async {
            let admin = KafkaAdmin::new(self.kafka.bootstrap());
            admin.create_topic(&topic, PARTITIONS).await.expect("creating a topic");
            admin.produce(&topic, records).await.expect("producing");
        });
        topic
    }

    /// The environment of a run: the PostgreSQL URL, and a home without
    /// `~/.postgresql/root.crt` or `~/.pgpass`.
    fn env(&self, home: &Path) -> Vec<(String, String)> {
        vec![
            (PG_URL_ENV.to_string(), self.pg_url()),
            ("HOME".to_string(), home.display().to_string()),
            ("PGPASSWORD".to_string(), String::new()),
        ]
    }
}

/// The `[source.kafka.properties]` (or `[sink.kafka.properties]`) body of a
/// client of `listener`: SASL_SSL, [`MECHANISM`], the broker's CA, the
/// password from [`KAFKA_PASSWORD_FILE`].
fn kafka_properties(listener: &SecuredListener) -> String {
    format!(
        "\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanism\" = \"{MECHANISM}\"\n\
         \"sasl.username\" = \"{}\"\n\"sasl.password\" = {{ file = \"{KAFKA_PASSWORD_FILE}\" }}\n\
         \"ssl.ca.location\" = \"{}\"\n",
        listener.username,
        listener.ca_file.display()
    )
}

/// Where the pipeline's PostgreSQL URL (with the password) comes from.
#[derive(Clone, Copy)]
enum UrlFrom {
    /// `{ env = PG_URL_ENV }` ([`Services::env`] sets it).
    Env,
    /// `{ file = PG_URL_FILE }`, written beside the pipeline file.
    File,
}

/// The file, beside the pipeline file, the URL comes from with [`UrlFrom::File`].
const PG_URL_FILE: &str = "pg-url";

/// Writes `<dir>/pipeline.toml`: pipeline `name` reading `topic` through
/// the secured listener into `table` (URL as `url` says), bounded, fixed
/// restarts; and the SASL password into [`KAFKA_PASSWORD_FILE`].
fn kafka_to_postgres(
    services: &Services,
    dir: &Path,
    (name, topic, table): (&str, &str, &str),
    url: UrlFrom,
) -> PathBuf {
    let listener = services.secured();
    std::fs::write(dir.join(KAFKA_PASSWORD_FILE), format!("{}\n", listener.password)).unwrap();
    let reference = match url {
        UrlFrom::Env => format!("{{ env = \"{PG_URL_ENV}\" }}"),
        UrlFrom::File => {
            std::fs::write(dir.join(PG_URL_FILE), services.pg_url()).unwrap();
            format!("{{ file = \"{PG_URL_FILE}\" }}")
        }
    };
    let sections = exactly::config::orders_sections(&listener.bootstrap, topic, "URL", table);
    let sections = sections.replacen("url = \"URL\"", &format!("url = {reference}"), 1);
    assert!(sections.contains(&reference), "{sections}");
    let file = dir.join("pipeline.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"{name}\"\nguarantee = \"exactly-once\"\nparallelism = 2\nbatch_size = 10\n\n\
             [checkpoint]\ndir = \"checkpoints\"\ninterval = \"50ms\"\n\n\
             [restart]\nstrategy = \"fixed\"\ndelay = \"200ms\"\nmax_attempts = 100\n\n{sections}\n\
             [source.kafka.properties]\n{}",
            kafka_properties(listener)
        ),
    )
    .unwrap();
    file
}

/// `(key, value)` pairs as the `&str` pairs `spawn_with` takes.
fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

#[test]
fn kafka_to_postgres_over_tls_and_sasl_ssl_survives_sigkills_at_every_phase() {
    let services = Services::start();
    let dir = tempfile::tempdir().unwrap();
    let (name, table) = (fresh("secured_pg"), fresh("secured_orders"));
    let topic = services.topic_with("secured_orders", (0..RECORDS).map(order));
    let config = kafka_to_postgres(&services, dir.path(), (&name, &topic, &table), UrlFrom::File);
    let limit = Duration::from_secs(180);

    // Killed while writing, then with a transaction prepared that no
    // checkpoint lists, then with the persisted checkpoint's transactions
    // prepared: the first checkpoint that lists any (an earlier one may
    // come before the first record, a later one after the topic was read to
    // its end, and prepare nothing).
    run_killed_within(&config, "source.after_emit:40", &[], limit);
    run_killed_within(&config, "sink.after_pre_commit:2", &[], limit);
    run_killed_within(&config, "coordinator.after_persist_pending:1", &[], limit);
    let pending = prepared_of_pipeline(services.admin_url(), &name);
    assert!(
        !pending.is_empty(),
        "killed after a persist, before its commit: its transactions must be prepared"
    );
    // Killed again during the recovery that commits them.
    run_killed_within(&config, "recovery.after_commit:1", &[], limit);
    let (status, _, log) = wait(spawn_with(&config, &[], &[]), limit);
    assert!(status.success(), "the last run failed with {status}:\n{log}");
    assert_orders_exactly_once(
        services.admin_url(),
        &table,
        &name,
        RECORDS,
        "SASL_SSL -> TLS PostgreSQL after SIGKILLs",
    );
}

/// The Kafka → Kafka pipeline file: both ends through the secured listener.
fn kafka_to_kafka(services: &Services, dir: &Path, name: &str, input: &str, output: &str) -> PathBuf {
    let listener = services.secured();
    std::fs::write(dir.join(KAFKA_PASSWORD_FILE), &listener.password).unwrap();
    let properties = kafka_properties(listener);
    let file = dir.join("pipeline.toml");
    std::fs::write(
        &file,
        format!(
            "{header}\n[source.kafka]\nbootstrap = \"{bootstrap}\"\ntopic = \"{input}\"\nstop_at_end = true\n\n\
             [source.kafka.properties]\n{properties}\n\
             [sink.kafka]\nbootstrap = \"{bootstrap}\"\ntopic = \"{output}\"\ntransactional_id_prefix = \"{name}\"\n\n\
             [sink.kafka.properties]\n{properties}",
            header = pipeline_header(name, "exactly-once", "strategy = \"none\""),
            bootstrap = listener.bootstrap,
        ),
    )
    .unwrap();
    file
}

#[test]
fn kafka_to_kafka_over_sasl_ssl_commits_pending_transactions_with_end_txn_after_a_sigkill() {
    let services = Services::start();
    let dir = tempfile::tempdir().unwrap();
    let name = fresh("secured_kk");
    let input = services.topic_with(
        "secured_in",
        (0..RECORDS).map(|i| ProduceRecord::new(format!("v-{i}")).to_partition((i % PARTITIONS as i64) as i32)),
    );
    let output = services.topic_with("secured_out", []);
    let config = kafka_to_kafka(&services, dir.path(), &name, &input, &output);
    let limit = Duration::from_secs(180);
    run_killed_within(&config, "coordinator.after_persist_pending:1", &[], limit);
    let (status, _, log) = wait(spawn_with(&config, &[], &[]), limit);
    assert!(status.success(), "the restart failed with {status}:\n{log}");
    assert!(
        log.contains("transaction committed with EndTxn"),
        "recovery was supposed to commit the listed transactions with EndTxn over SASL_SSL:\n{log}"
    );
    let (log_read, consumed) = current_thread_runtime().block_on(async {
        let log = exactly_kafka::wire::WireClient::new(services.kafka.bootstrap())
            .unwrap()
            .read_topic_settled(&output, Duration::from_secs(30))
            .await
            .expect("reading the output's log");
        let consumed = KafkaAdmin::new(services.kafka.bootstrap())
            .read_all(&output)
            .await
            .expect("consuming the output read_committed");
        (log, consumed)
    });
    assert!(
        log_read.open_transactions.is_empty(),
        "{:?}",
        log_read.open_transactions
    );
    let mut values: Vec<String> = consumed
        .iter()
        .map(|r| String::from_utf8(r.value.clone().expect("a value").to_vec()).unwrap())
        .collect();
    assert_eq!(
        values.len(),
        log_read.records.len(),
        "both readers see the same records"
    );
    values.sort();
    let mut expected: Vec<String> = (0..RECORDS).map(|i| format!("v-{i}")).collect();
    expected.sort();
    assert_eq!(values.len(), expected.len(), "committed records (duplicates or loss)");
    assert_eq!(values, expected, "every record exactly once");
}

/// One misconfiguration: what to change in the good pipeline file (or its
/// environment), and what the error must say.
struct Misconfiguration {
    what: &'static str,
    /// Whether the pipeline is Kafka → Kafka, the replacements applying to
    /// the sink's section only (the last occurrence); else Kafka →
    /// PostgreSQL.
    kafka_sink: bool,
    /// `(from, to)` replacements in the pipeline file.
    file: Vec<(String, String)>,
    /// Environment variables set (or replaced).
    env: Vec<(String, String)>,
    /// Texts the error must contain.
    says: Vec<&'static str>,
}

#[test]
fn misconfigured_security_is_a_fatal_error_naming_the_service_the_setting_and_the_fix() {
    let services = Services::start();
    let listener = services.secured().clone();
    let tls = services.tls().clone();
    let home = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let other_ca = exactly_testkit::tls::TestCa::generate(other.path()).unwrap();
    let topic = services.topic_with("secured_misconf", (0..100).map(order));
    let port = services.pg.port();
    let pg_url_with =
        |password: &str, query: &str| format!("postgres://postgres:{password}@localhost:{port}/postgres?{query}");
    let ca = tls.ca_file.display().to_string();
    let kafka_ca = listener.ca_file.display().to_string();
    let protocol = "\"security.protocol\" = \"SASL_SSL\"".to_string();
    let mechanism = format!("\"sasl.mechanism\" = \"{MECHANISM}\"");
    let password_ref = format!("\"sasl.password\" = {{ file = \"{KAFKA_PASSWORD_FILE}\" }}");
    let s = |t: &str| t.to_string();
    let cases = vec![
        Misconfiguration {
            kafka_sink: false,
            what: "a wrong PostgreSQL password",
            file: vec![],
            env: vec![(
                s(PG_URL_ENV),
                pg_url_with("not-the-pg-password", &format!("sslmode=verify-full&sslrootcert={ca}")),
            )],
            says: vec!["PostgreSQL", "password", "PGPASSWORD"],
        },
        Misconfiguration {
            kafka_sink: false,
            what: "a TLS-only PostgreSQL reached with sslmode=disable",
            file: vec![],
            env: vec![(s(PG_URL_ENV), pg_url_with(&tls.password, "sslmode=disable"))],
            says: vec!["PostgreSQL", "only over TLS", "sslmode=require"],
        },
        Misconfiguration {
            kafka_sink: false,
            what: "verify-full without the CA",
            file: vec![],
            env: vec![(s(PG_URL_ENV), pg_url_with(&tls.password, "sslmode=verify-full"))],
            says: vec!["sink.postgres.url", "sslmode=verify-full", "sslrootcert"],
        },
        Misconfiguration {
            kafka_sink: false,
            what: "an untrusted PostgreSQL certificate",
            file: vec![],
            env: vec![(
                s(PG_URL_ENV),
                pg_url_with(
                    &tls.password,
                    &format!("sslmode=verify-full&sslrootcert={}", other_ca.ca_file().display()),
                ),
            )],
            says: vec!["PostgreSQL", "not signed by a trusted CA", "sslrootcert"],
        },
        Misconfiguration {
            kafka_sink: false,
            what: "verify-full to a host name the certificate is not issued for",
            file: vec![],
            env: vec![(
                s(PG_URL_ENV),
                pg_url_with(&tls.password, &format!("sslmode=verify-full&sslrootcert={ca}"))
                    .replace("@localhost:", "@127.0.0.1:"),
            )],
            says: vec!["PostgreSQL", "not issued for the host name", "verify-ca"],
        },
        Misconfiguration {
            kafka_sink: false,
            what: "a wrong SASL password",
            file: vec![(
                password_ref.clone(),
                s("\"sasl.password\" = \"not-the-kafka-password\""),
            )],
            env: vec![],
            says: vec!["Kafka", "sasl.password"],
        },
        Misconfiguration {
            kafka_sink: false,
            what: "a SASL mechanism the listener does not enable",
            file: vec![(mechanism.clone(), s("\"sasl.mechanism\" = \"PLAIN\""))],
            env: vec![],
            says: vec!["Kafka", "PLAIN", "sasl.mechanism", "SCRAM-SHA-512"],
        },
        Misconfiguration {
            kafka_sink: false,
            what: "the TLS listener reached with PLAINTEXT",
            file: vec![(protocol.clone(), s("\"security.protocol\" = \"PLAINTEXT\""))],
            env: vec![],
            says: vec!["Kafka", "security.protocol"],
        },
        Misconfiguration {
            kafka_sink: false,
            what: "the broker's certificate checked against another CA",
            file: vec![(kafka_ca.clone(), other_ca.ca_file().display().to_string())],
            env: vec![],
            says: vec!["Kafka", "not signed by a trusted CA", "ssl.ca.location"],
        },
        Misconfiguration {
            kafka_sink: false,
            what: "the broker reached by a name its certificate is not issued for",
            file: vec![(
                format!("bootstrap = \"{}\"", listener.bootstrap),
                format!(
                    "bootstrap = \"{}\"",
                    listener.bootstrap.replace("localhost:", "127.0.0.1:")
                ),
            )],
            env: vec![],
            says: vec![
                "Kafka",
                "not issued for the host",
                "ssl.endpoint.identification.algorithm",
            ],
        },
        Misconfiguration {
            kafka_sink: true,
            what: "a wrong SASL password of the Kafka sink (its recovery client)",
            file: vec![
                (
                    password_ref.clone(),
                    s("\"sasl.password\" = \"not-the-kafka-password\""),
                ),
                (
                    s("strategy = \"none\""),
                    s("strategy = \"fixed\"\ndelay = \"200ms\"\nmax_attempts = 100"),
                ),
            ],
            env: vec![],
            says: vec!["kafka sink", "sasl.password"],
        },
    ];
    let output_topic = services.topic_with("secured_misconf_out", []);
    let secrets = [
        listener.password.as_str(),
        tls.password.as_str(),
        "not-the-pg-password",
        "not-the-kafka-password",
    ];
    let mut failures = Vec::new();
    for case in cases {
        let dir = tempfile::tempdir().unwrap();
        let (name, table) = (fresh("misconf"), fresh("misconf"));
        let config = if case.kafka_sink {
            kafka_to_kafka(&services, dir.path(), &name, &topic, &output_topic)
        } else {
            kafka_to_postgres(&services, dir.path(), (&name, &topic, &table), UrlFrom::Env)
        };
        let mut text = std::fs::read_to_string(&config).unwrap();
        for (from, to) in &case.file {
            let at = text.rfind(from.as_str());
            let at = at.unwrap_or_else(|| panic!("{}: `{from}` not in\n{text}", case.what));
            text = if case.kafka_sink {
                format!("{}{to}{}", &text[..at], &text[at + from.len()..])
            } else {
                text.replace(from.as_str(), to)
            };
        }
        std::fs::write(&config, text).unwrap();
        let mut env = services.env(home.path());
        env.retain(|(k, _)| !case.env.iter().any(|(c, _)| c == k));
        env.extend(case.env.iter().cloned());
        let started = Instant::now();
        let (status, stdout, stderr) = wait(spawn_with(&config, &[], &pairs(&env)), Duration::from_secs(120));
        let took = started.elapsed();
        let output = format!("{stdout}\n{stderr}");
        let error = final_error(&stderr);
        let mut problems = Vec::new();
        if status.success() {
            problems.push("the run succeeded".to_string());
        }
        if took > FAIL_WITHIN {
            problems.push(format!("it took {took:?} to fail (a retry loop?)"));
        }
        if error.contains("transient") {
            problems.push("the error is transient, not fatal".to_string());
        }
        if output.contains("restarting from its latest complete checkpoint") {
            problems.push("it was retried".to_string());
        }
        for says in &case.says {
            if !error.contains(says) {
                problems.push(format!("the error does not say `{says}`"));
            }
        }
        for secret in secrets {
            if output.contains(secret) {
                problems.push(format!("the output contains the secret `{secret}`"));
            }
        }
        println!("{}: {took:?}: {error}", case.what);
        if !problems.is_empty() {
            failures.push(format!(
                "{}: {}\nerror: {error}\n{stderr}",
                case.what,
                problems.join("; ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The error the run ended with, as an operator reads it: the last
/// `Error: …` line and its `Caused by:` chain (the fix may be named by a
/// cause, which errors keep as their `source`), or else the last `ERROR`
/// log line.
fn final_error(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    match lines.iter().rposition(|l| l.starts_with("Error")) {
        Some(at) => lines[at..]
            .iter()
            .take_while(|l| !l.starts_with("Stack backtrace"))
            .filter(|l| !l.is_empty())
            .copied()
            .collect::<Vec<&str>>()
            .join("\n"),
        None => lines
            .iter()
            .rev()
            .find(|l| l.contains("ERROR"))
            .copied()
            .unwrap_or("")
            .to_string(),
    }
}

/// `GET url`: the body (`None` while nothing answers).
fn get(url: &str) -> Option<String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    agent.get(url).call().ok()?.body_mut().read_to_string().ok()
}

/// `exactly ARGS...` with `env`: its status and output (stdout, then stderr).
fn exactly(args: &[&str], env: &[(String, String)]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_exactly"))
        .args(args)
        .env("RUST_LOG", "debug")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("running the exactly binary");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "exactly {args:?} failed:\n{text}");
    text
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn no_secret_in_logs_checkpoints_commands_or_metrics() {
    let services = Services::start();
    let home = tempfile::tempdir().unwrap();
    let env = services.env(home.path());
    let dir = tempfile::tempdir().unwrap();
    let (name, table) = (fresh("secured_secrets"), fresh("secured_secrets"));
    let orders = 2_000;
    let topic = services.topic_with("secured_secrets", (0..orders).map(order));
    let config = kafka_to_postgres(&services, dir.path(), (&name, &topic, &table), UrlFrom::Env);
    let port = exactly_testkit::free_port().unwrap();
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("stop_at_end = true", "stop_at_end = false");
    std::fs::write(&config, format!("{text}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n")).unwrap();
    // The PostgreSQL password comes from the environment (in the URL), the
    // SASL password from a file; neither is in the pipeline file.
    let pg_password = services.tls().password.clone();
    let kafka_password = services.secured().password.clone();
    let pipeline_text = std::fs::read_to_string(&config).unwrap();
    for secret in [&pg_password, &kafka_password] {
        assert!(secret.len() >= 16, "a distinctive secret");
        assert!(!pipeline_text.contains(secret.as_str()));
    }

    let mut run_env = pairs(&env);
    run_env.push(("RUST_LOG", "debug"));
    let mut run = spawn_with(&config, &[], &run_env);
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while common::orders::committed_orders(services.admin_url(), &table) < orders {
        assert!(run.is_running(), "the pipeline ended early");
        assert!(
            Instant::now() < deadline,
            "the orders were not committed within 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut outputs: Vec<(String, String)> = Vec::new();
    let metrics = get(&format!("{base}/metrics")).expect("the metrics endpoint answers");
    assert!(metrics.contains("exactly_records_written_total"), "{metrics}");
    outputs.push(("/metrics".into(), metrics));
    for path in ["/health/live", "/health/ready"] {
        outputs.push((
            path.into(),
            get(&format!("{base}{path}")).expect("the health endpoints answer"),
        ));
    }
    let file = config.to_str().unwrap();
    outputs.push(("exactly status".into(), exactly(&["status", file], &env)));
    outputs.push((
        "exactly status --json".into(),
        exactly(&["status", file, "--json"], &env),
    ));
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let (status, stdout, stderr) = wait(run, Duration::from_secs(60));
    assert!(
        status.success(),
        "the pipeline did not stop cleanly on SIGTERM:\n{stderr}"
    );
    assert!(stderr.contains("DEBUG"), "the run logged at debug level");
    outputs.push(("the run's stdout".into(), stdout));
    outputs.push(("the run's stderr (RUST_LOG=debug)".into(), stderr));
    outputs.push((
        "exactly checkpoints list".into(),
        exactly(&["checkpoints", "list", file], &env),
    ));
    let checkpoints = dir.path().join("checkpoints");
    let entries = checkpoint_entry_files(&checkpoints.join(&name));
    assert!(!entries.is_empty(), "no checkpoint entry");
    for entry in &entries {
        let shown = exactly(&["checkpoints", "show", entry.to_str().unwrap()], &env);
        outputs.push((format!("exactly checkpoints show {}", entry.display()), shown));
        let json = exactly(&["checkpoints", "show", entry.to_str().unwrap(), "--json"], &env);
        outputs.push((format!("exactly checkpoints show --json {}", entry.display()), json));
    }
    let stored = files_under(&checkpoints);
    assert!(stored.len() > entries.len(), "entries and the folder's other files");
    for path in stored {
        let bytes = std::fs::read(&path).unwrap();
        outputs.push((path.display().to_string(), String::from_utf8_lossy(&bytes).into_owned()));
    }

    // The whole secret, and its random part alone (a partial redaction
    // would still leak).
    let tail = |s: &str| s[s.len() - 16..].to_string();
    let secrets = [
        pg_password.clone(),
        tail(&pg_password),
        kafka_password.clone(),
        tail(&kafka_password),
    ];
    let leaks: Vec<String> = outputs
        .iter()
        .flat_map(|(what, text)| {
            secrets.iter().filter(|s| text.contains(s.as_str())).map(move |s| {
                let at = text.find(s.as_str()).unwrap();
                let line = text[..at].rfind('\n').map_or(0, |i| i + 1);
                let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
                format!("{what}: {}", &text[line..end])
            })
        })
        .collect();
    assert!(leaks.is_empty(), "secrets leaked:\n{}", leaks.join("\n"));
    println!("{} outputs checked, no secret in any", outputs.len());
}
