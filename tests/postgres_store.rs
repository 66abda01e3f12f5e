//! The PostgreSQL checkpoint store through the binary: a pipeline whose
//! `[checkpoint] store = { postgres = … }` (the URL from the environment, as
//! a secret) is killed with SIGKILL after a persist and during a recovery,
//! restarted, and ends exactly once; `exactly checkpoints list`, `show` and
//! `status` read the same store, never printing the password; a second run
//! of the pipeline is refused while the first holds the store's lock; a
//! parallelism change, retention and a corrupt newest entry follow the
//! folder store's rules.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use exactly_testkit::PostgresServer;

/// The environment variable the pipeline file names for the store's URL.
const URL_ENV: &str = "EXACTLY_TEST_CHECKPOINT_DB";

/// The server's URL with a password (trust authentication ignores it):
/// what must never be printed.
fn url_with_password(pg: &PostgresServer) -> String {
    pg.url().replacen("://postgres@", "://postgres:hunter2-secret@", 1)
}

fn config(dir: &Path, name: &str) -> PathBuf {
    let file = write_config(dir, name, "exactly-once", 2, &file_sink_into(&dir.join("out")));
    let text = std::fs::read_to_string(&file).unwrap().replace(
        "dir = \"checkpoints\"",
        &format!("store = {{ postgres = {{ env = \"{URL_ENV}\" }} }}"),
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// `exactly <args>` with the store's URL in the environment: (success,
/// stdout, stderr).
fn exactly(args: &[&str], url: &str) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_exactly"))
        .args(args)
        .env(URL_ENV, url)
        .env_remove("EXACTLY_CRASH_AT")
        .output()
        .expect("running exactly");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_pipeline_on_the_postgres_store_survives_kills_and_the_operations_commands_read_it() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let url = url_with_password(&pg);
    let dir = tempfile::tempdir().unwrap();
    let name = format!("pg-store-{}", std::process::id());
    let config = config(dir.path(), &name);
    let env = [(URL_ENV, url.as_str())];

    for point in ["coordinator.after_persist_pending:1", "recovery.after_commit:1"] {
        let (status, log) = run_with_env(&config, Some(point), &[], &env);
        assert_killed_at(point, status, &log);
        assert!(!log.contains("hunter2-secret"), "the password was logged:\n{log}");
    }
    let (status, log) = run_with_env(&config, None, &[], &env);
    assert!(status.success(), "the last run failed:\n{log}");
    assert!(!log.contains("hunter2-secret"), "the password was logged:\n{log}");
    let lines = exactly::file::read_committed_lines(&dir.path().join("out")).unwrap();
    let outcome = outcome_of(&lines);
    assert_eq!(
        (outcome.duplicates, outcome.missing),
        (0, 0),
        "exactly once across the kills: {outcome:?}"
    );
    assert!(!dir.path().join("checkpoints").exists(), "nothing in a folder");

    let config = config.to_str().unwrap();
    let (ok, listing, err) = exactly(&["checkpoints", "list", config], &url);
    assert!(ok, "{err}");
    let entries: Vec<&str> = listing.lines().filter(|l| l.contains(" region=")).collect();
    assert!(entries.len() >= 2, "every region's entries:\n{listing}");
    assert!(
        listing.lines().any(|l| l.contains(" region=0")) && listing.lines().any(|l| l.contains(" region=1")),
        "{listing}"
    );
    assert!(!listing.contains("UNREADABLE"), "{listing}");
    let newest = entries.last().unwrap().split_whitespace().next().unwrap();
    let (ok, shown, err) = exactly(&["checkpoints", "show", config, newest], &url);
    assert!(ok, "{err}");
    assert!(
        shown.contains(&format!("(entry {newest})")) && shown.contains(&name),
        "{shown}"
    );

    let (ok, status, err) = exactly(&["status", config], &url);
    assert!(ok, "{err}");
    assert!(
        status.contains("(checkpoints in postgres://postgres@127.0.0.1:"),
        "the store, without its password:\n{status}"
    );
    assert!(status.contains("not running"), "{status}");
    assert!(status.contains("region 0: latest complete checkpoint"), "{status}");
    assert!(
        status.contains("taken by process ") && status.contains("(epoch "),
        "each region's owner and epoch:\n{status}"
    );
    let (ok, json, err) = exactly(&["status", config, "--json"], &url);
    assert!(ok, "{err}");
    for text in [&listing, &shown, &status, &json, &err] {
        assert!(!text.contains("hunter2-secret"), "the password was printed:\n{text}");
    }
}

#[test]
fn a_second_run_is_refused_while_the_first_holds_the_stores_lock() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let url = url_with_password(&pg);
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &format!("pg-lock-{}", std::process::id()));
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("records_per_split = ", "records_per_split = 1000000 #");
    std::fs::write(&config, text).unwrap();
    let first = spawn_with_env(&config, &[(URL_ENV, url.as_str())]);
    // Wait until the first run has taken the lock: `status` says so.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, status, _) = exactly(&["status", config.to_str().unwrap()], &url);
        if status.contains("running: exactly process") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first run never took the lock:\n{status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, log) = run_with_env(&config, None, &[], &[(URL_ENV, url.as_str())]);
    assert!(!status.success());
    assert!(
        log.contains("is already running") && log.contains("exactly process"),
        "{log}"
    );
    assert!(!log.contains("hunter2-secret"), "{log}");
    // SAFETY: signals the child this test started.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    let (status, _, log) = wait(first, Duration::from_secs(120));
    assert!(status.success(), "the first run ends cleanly on SIGTERM:\n{log}");
}

/// `(scope, name, set aside)` of every entry of pipeline `name` in the
/// store, by scope and checkpoint id.
fn stored_entries(pg: &PostgresServer, name: &str) -> Vec<(String, String, bool)> {
    orders::with_postgres(pg.url(), async |c| {
        c.query(
            "SELECT scope, name, set_aside FROM exactly_checkpoints WHERE pipeline = $1 ORDER BY scope, checkpoint_id",
            &[&name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    })
}

/// A pipeline at parallelism 3 on the PostgreSQL store, with `retain = 2`,
/// written into `dir`.
fn config_at(dir: &Path, name: &str, parallelism: usize) -> PathBuf {
    let file = config(dir, name);
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("parallelism = 2", &format!("parallelism = {parallelism}"))
        .replace("interval = \"50ms\"", "interval = \"50ms\"\nretain = 2");
    assert!(text.contains(&format!("parallelism = {parallelism}")) && text.contains("retain = 2"));
    std::fs::write(&file, text).unwrap();
    file
}

/// Lowering the parallelism on the PostgreSQL store, as on the folder store:
/// refused without the flag, then the old sequences' latest checkpoints are
/// carried over, region 2's sequence set aside under a `retired-` scope, its
/// sink subtask adopted, and every record lands once with nothing pending.
/// Retention keeps at most `retain` entries per sequence.
#[test]
fn lowering_the_parallelism_and_retention_work_on_the_postgres_store() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let url = url_with_password(&pg);
    let env = [(URL_ENV, url.as_str())];
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let name = format!("pg-rescale-{}", std::process::id());
    let at_3 = config_at(dir.path(), &name, 3);
    let point = "coordinator.after_persist_pending@2:1";
    let (status, log) = run_with_env(&at_3, Some(point), &[], &env);
    assert_killed_at(point, status, &log);
    assert!(
        stored_entries(&pg, &name)
            .iter()
            .any(|(scope, _, _)| scope == "region-2"),
        "region 2 has checkpoints before the change"
    );

    let at_2 = config_at(dir.path(), &name, 2);
    let (status, log) = run_with_env(&at_2, None, &[], &env);
    assert!(
        !status.success(),
        "a parallelism change without the flag was accepted:\n{log}"
    );
    assert!(log.contains("allow-parallelism-change"), "{log}");
    let (status, log) = run_with_env(&at_2, None, &["--allow-parallelism-change"], &env);
    assert!(status.success(), "the run at parallelism 2 failed:\n{log}");
    assert!(
        log.contains("taking over the sink subtasks of the higher parallelism"),
        "subtask 2 was not adopted:\n{log}"
    );
    let o = outcome_of(&exactly::file::read_committed_lines(&out).unwrap());
    assert_eq!(
        (o.duplicates, o.missing),
        (0, 0),
        "exactly once across the change: {o:?}"
    );
    assert_eq!(pending_files(&out), Default::default(), "nothing left pending");

    let entries = stored_entries(&pg, &name);
    let live: Vec<&(String, String, bool)> = entries.iter().filter(|(s, _, _)| !s.starts_with("retired-")).collect();
    for scope in ["region-0", "region-1"] {
        let n = live.iter().filter(|(s, _, _)| s == scope).count();
        assert!(
            (1..=2).contains(&n),
            "{scope} keeps 1..=retain entries, has {n}: {entries:?}"
        );
    }
    assert!(
        live.iter().all(|(s, _, _)| s == "region-0" || s == "region-1"),
        "only the new layout's sequences are live: {entries:?}"
    );
    assert!(
        entries
            .iter()
            .any(|(s, _, _)| s.starts_with("retired-") && s.ends_with("region-2")),
        "region 2's sequence is kept, set aside: {entries:?}"
    );
    let (ok, listing, err) = exactly(&["checkpoints", "list", at_2.to_str().unwrap()], &url);
    assert!(ok, "{err}");
    assert!(!listing.contains("region=2"), "{listing}");
}

/// A corrupt newest entry of region 0 in the PostgreSQL store, whose
/// checkpoint the file sink committed: the start is refused naming the entry
/// and the flag, and with `--allow-fallback` the fallback's duplicates are
/// counted, nothing is missing, and the entry is set aside, not deleted.
#[test]
fn a_corrupt_newest_entry_in_the_postgres_store_is_refused_then_set_aside() {
    let pg = PostgresServer::start().expect("PostgreSQL");
    let url = url_with_password(&pg);
    let env = [(URL_ENV, url.as_str())];
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let name = format!("pg-corrupt-{}", std::process::id());
    let config = config(dir.path(), &name);
    for point in ["coordinator.after_persist@0:3", "recovery.after_commit@0:1"] {
        let (status, log) = run_with_env(&config, Some(point), &[], &env);
        assert_killed_at(point, status, &log);
    }
    let entry = stored_entries(&pg, &name)
        .into_iter()
        .filter(|(scope, _, aside)| scope == "region-0" && !aside)
        .map(|(_, entry, _)| entry)
        .next_back()
        .expect("region 0's newest entry");
    let flipped = orders::with_postgres(pg.url(), async |c| {
        c.execute(
            "UPDATE exactly_checkpoints SET body = set_byte(body, 40, get_byte(body, 40) # 1)
             WHERE pipeline = $1 AND scope = 'region-0' AND name = $2",
            &[&name, &entry],
        )
        .await
        .unwrap()
    });
    assert_eq!(flipped, 1);

    let (status, log) = run_with_env(&config, None, &[], &env);
    assert!(!status.success(), "the fallback was accepted:\n{log}");
    for part in [
        entry.as_str(),
        "sink subtask 0 committed transactions up to checkpoint",
        "--allow-fallback",
    ] {
        assert!(log.contains(part), "`{part}` missing from:\n{log}");
    }
    let (ok, listing, err) = exactly(&["checkpoints", "list", config.to_str().unwrap()], &url);
    assert!(ok, "{err}");
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with(&entry) && l.contains("UNREADABLE")),
        "{listing}"
    );

    let (status, log) = run_with_env(&config, None, &["--allow-fallback"], &env);
    assert!(status.success(), "the run with --allow-fallback failed:\n{log}");
    let o = outcome_of(&exactly::file::read_committed_lines(&out).unwrap());
    assert_eq!(o.missing, 0, "{o:?}");
    assert!(
        o.duplicates > 0,
        "the fallback writes the committed checkpoint again: {o:?}"
    );
    let counted = format!("duplicates={} records", o.duplicates);
    assert!(
        strip_ansi(&log).contains(&counted),
        "the log counts them (`{counted}`):\n{log}"
    );
    assert!(
        stored_entries(&pg, &name).contains(&("region-0".into(), entry.clone(), true)),
        "the unreadable entry is kept, set aside"
    );
    assert!(!log.contains("hunter2-secret"), "{log}");
}
