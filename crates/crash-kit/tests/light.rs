//! The crash kit stays light: a connector crate that depends only on the
//! core and the crash kit builds none of the services' clients and
//! containers (issue 26: the kit used to live in the test kit, which pulled
//! in testcontainers, bollard, axum, rdkafka and 58 more crates).

use std::collections::BTreeSet;
use std::process::Command;

/// Crates that belong to services or containers, never to the crash kit.
const HEAVY: &[&str] = &[
    "testcontainers",
    "testcontainers-modules",
    "bollard",
    "axum",
    "tonic",
    "rdkafka",
    "rdkafka-sys",
    "tokio-postgres",
    "redis",
    "kafka-protocol",
    "rcgen",
    "hyper",
    "exactly-testkit",
];

/// `cargo tree` of one package: the names of every crate a build of it
/// compiles (normal and build dependencies, for this platform).
fn tree(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_crash_kit_and_the_core_build_no_service_client_or_container() {
    let crates = tree("exactly-crash-kit");
    assert!(crates.contains("exactly-core"), "the tree was read: {crates:?}");
    let heavy: Vec<&&str> = HEAVY.iter().filter(|name| crates.contains(**name)).collect();
    assert!(
        heavy.is_empty(),
        "the crash kit now builds {heavy:?}; its tree: {crates:?}"
    );
}

#[test]
fn the_example_connector_tests_with_the_crash_kit_alone() {
    // The SQLite example is what an author copies: its build (the library
    // and its pipeline binary) stays as light as the kit.
    let crates = tree("exactly-example-sqlite-sink");
    let heavy: Vec<&&str> = HEAVY.iter().filter(|name| crates.contains(**name)).collect();
    assert!(heavy.is_empty(), "the example now builds {heavy:?}");
}
