//! The SQLite sink through `exactly-sqlite`, exactly's command line with the
//! sink registered: `run` (with `/metrics` and `/health/*` while it runs)
//! delivers every record once, then `status` and `checkpoints list/show`
//! read the pipeline like a built-in one's; a typo in `[sink.sqlite]` is
//! refused by name, and a sink kind nobody registered says where to
//! register it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use exactly_core::SequenceSourceFactory;

const BIN: &str = env!("CARGO_BIN_EXE_exactly-sqlite");

/// The source of the test's pipeline: 4 splits × 600 records at 10 per
/// poll with a pause after each, so the run lasts a few seconds and spans
/// many checkpoints.
fn source() -> SequenceSourceFactory {
    SequenceSourceFactory {
        splits: 4,
        records_per_split: 600,
        batch: 10,
        delay_per_poll: Duration::from_millis(30),
    }
}

fn pipeline_file(dir: &Path, sink: &str) -> PathBuf {
    let s = source();
    let file = dir.join("pipeline.toml");
    std::fs::write(
        &file,
        format!(
            r#"name = "sqlite-cli"
parallelism = 2

[checkpoint]
dir = "checkpoints"
interval = "100ms"

[source.sequence]
splits = {}
records_per_split = {}
batch = {}
delay_per_poll = "30ms"

{sink}
"#,
            s.splits, s.records_per_split, s.batch
        ),
    )
    .unwrap();
    file
}

fn exactly_sqlite(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "info")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("running exactly-sqlite")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `GET url`: status and body (`None` while nothing listens).
fn get(url: &str) -> Option<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut response = agent.get(url).call().ok()?;
    let status = response.status().as_u16();
    Some((status, response.body_mut().read_to_string().ok()?))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn run_status_checkpoints_metrics_and_health_work_for_a_registered_sink() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline_file(dir.path(), "[sink.sqlite]\npath = \"out.db\"");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut run = Command::new(BIN)
        .args([
            "run",
            file.to_str().unwrap(),
            "--metrics-listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting exactly-sqlite run");

    // While it runs: live, then ready once a checkpoint completed, and the
    // metrics name the pipeline.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut ready = None;
    let mut scraped = None;
    while Instant::now() < deadline && (ready.is_none() || scraped.is_none()) {
        if run.try_wait().unwrap().is_some() {
            break;
        }
        if let Some((200, body)) = get(&format!("{base}/health/ready")) {
            ready.get_or_insert(body);
        }
        if let Some((200, body)) = get(&format!("{base}/metrics")) {
            if body.contains("exactly_checkpoints_completed_total") && ready.is_some() {
                scraped = Some(body);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = run.wait_with_output().unwrap();
    let log = text(&output.stderr);
    assert!(output.status.success(), "the run failed:\n{log}");
    let ready = ready.unwrap_or_else(|| panic!("/health/ready never answered 200 while the run went on:\n{log}"));
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["pipeline"], "sqlite-cli");
    let metrics = scraped.unwrap_or_else(|| panic!("/metrics never answered while the run went on:\n{log}"));
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("exactly_checkpoints_completed_total") && l.contains("sqlite-cli")),
        "{metrics}"
    );

    // Every record once, in the file the section named relative to the
    // pipeline file, and nothing left staged.
    let db = dir.path().join("out.db");
    let mut got = exactly_example_sqlite_sink::read_records(&db).unwrap();
    got.sort();
    let mut expected = source().expected_values();
    expected.sort();
    assert_eq!(got.len(), expected.len(), "records in out.db");
    assert!(got == expected, "out.db does not hold every record exactly once");
    assert!(exactly_example_sqlite_sink::staged_transactions(&db)
        .unwrap()
        .is_empty());
    // The run printed its summary like the exactly binary does.
    let summary: serde_json::Value = serde_json::from_str(text(&output.stdout).trim()).unwrap();
    assert_eq!(summary["records_out"], expected.len() as u64, "{summary}");

    let status = exactly_sqlite(&["status", file.to_str().unwrap(), "--json"]);
    assert!(status.status.success(), "status failed:\n{}", text(&status.stderr));
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(report["pipeline"], "sqlite-cli", "{report}");

    let list = exactly_sqlite(&["checkpoints", "list", file.to_str().unwrap()]);
    assert!(
        list.status.success(),
        "checkpoints list failed:\n{}",
        text(&list.stderr)
    );
    let listed = text(&list.stdout);
    // Entry names: `<fingerprint>-<unix-ms>-<checkpoint id>`, oldest first.
    let is_entry = |w: &&str| {
        let parts: Vec<&str> = w.split('-').collect();
        parts.len() == 3
            && !parts[0].is_empty()
            && parts[1..]
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    let newest = listed
        .split_whitespace()
        .rfind(is_entry)
        .unwrap_or_else(|| panic!("no entry name in the listing:\n{listed}"))
        .to_string();
    let show = exactly_sqlite(&["checkpoints", "show", file.to_str().unwrap(), &newest, "--json"]);
    assert!(
        show.status.success(),
        "checkpoints show failed:\n{}",
        text(&show.stderr)
    );
    let entry: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert!(
        entry.to_string().contains("sqlite"),
        "the entry names the sink: {entry}"
    );
}

#[test]
fn a_typo_in_the_section_and_an_unregistered_kind_are_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline_file(dir.path(), "[sink.sqlite]\npth = \"out.db\"");
    let out = exactly_sqlite(&["run", file.to_str().unwrap()]);
    let error = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        error.contains("sink.sqlite") && error.contains("unknown field `pth`"),
        "{error}"
    );
    assert!(!dir.path().join("out.db").exists() && !dir.path().join("pth").exists());

    let file = pipeline_file(dir.path(), "[sink.duckdb]\npath = \"out.db\"");
    let out = exactly_sqlite(&["status", file.to_str().unwrap()]);
    let error = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        error.contains("unknown sink kind `duckdb`") && error.contains("exactly::plugins::Connectors"),
        "{error}"
    );
}
