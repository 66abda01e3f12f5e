//! The Docker fallback: the official `apache/kafka` image as one KRaft node,
//! for machines without a Java runtime or the broker's jars, started through
//! `testcontainers`.
//!
//! A [`GenericImage`] rather than the Kafka image of `testcontainers-modules`:
//! the module fixes the cluster id (every fresh broker here gets one of its
//! own, so tests can tell clusters apart) and its listener layout, and its
//! start script cannot be told to keep a bind-mounted data folder deletable.
//! The broker listens on the published port inside the container too, so
//! the advertised `127.0.0.1:PORT` is right on both sides, with the same
//! single-node transaction-log settings as a local broker.

use std::path::Path;
#[cfg(feature = "containers")]
use std::{fs, os::unix::fs::PermissionsExt, path::PathBuf};

use tempfile::TempDir;

#[cfg(feature = "containers")]
use super::install::KAFKA_VERSION;
#[cfg(feature = "containers")]
use super::jvm::{new_cluster_id, CLUSTER_ID, LOG_FILE, TEST_SETTINGS};
#[cfg(feature = "containers")]
use super::ready;
#[cfg(feature = "containers")]
use testcontainers::core::{ContainerPort, WaitFor};
#[cfg(feature = "containers")]
use testcontainers::{GenericImage, ImageExt};

#[cfg(feature = "containers")]
use crate::container::{self, ContainerSpec};
use crate::container::{Container, Engine};
use crate::error::Result;
#[cfg(feature = "containers")]
use crate::error::TestkitError;
#[cfg(feature = "containers")]
use crate::process;

/// The image's name (its tag is [`KAFKA_VERSION`]).
#[cfg(feature = "containers")]
const KAFKA_IMAGE_NAME: &str = "apache/kafka";

/// Expands to the Apache Kafka image of the Docker fallback (a macro so that
/// `concat!` can use it); the same release as [`KAFKA_VERSION`].
macro_rules! kafka_image {
    () => {
        "apache/kafka:4.1.1"
    };
}

/// The image the testkit runs when it starts Kafka in a Docker container.
pub const KAFKA_IMAGE: &str = kafka_image!();

/// Name of the directory, inside the one given to
/// [`KafkaBroker::start_persistent`](super::KafkaBroker::start_persistent),
/// where a persistent container broker keeps its Kafka log dirs.
pub const CONTAINER_DATA_DIR: &str = "kafka-data";

#[cfg(feature = "containers")]
const SERVICE: &str = "Kafka broker (container)";
#[cfg(feature = "containers")]
const FIX_CONTAINER: &str = concat!(
    "read the container log above; check that the Docker engine can pull ",
    kafka_image!(),
    " and publish ports on 127.0.0.1; or install the broker's jars (`bash .ci/install-services.sh`), \
     or set EXACTLY_KAFKA_BOOTSTRAP to use a running Kafka"
);
/// Where a container broker keeps its data (a volume of the image).
#[cfg(feature = "containers")]
const CONTAINER_LOG_DIRS: &str = "/var/lib/kafka/data";

/// A container broker and the temp dir of its log (when not persistent).
pub(crate) struct Started {
    pub(crate) container: Container,
    pub(crate) temp_dir: Option<TempDir>,
}

/// A single-node KRaft Kafka container listening on the same port inside
/// and outside, so that the advertised `127.0.0.1:PORT` is right on both
/// sides. `persistent_dir` (absolute) keeps its data across containers.
#[cfg(feature = "containers")]
pub(crate) fn start(engine: &Engine, persistent_dir: Option<&Path>, settings: &[(String, String)]) -> Result<Started> {
    assert!(
        KAFKA_IMAGE.ends_with(KAFKA_VERSION),
        "the image is the release the kit runs"
    );
    let io = |action: String| {
        move |source| TestkitError::Io {
            service: SERVICE,
            action,
            fix: "pass a writable directory, and make sure /tmp is writable",
            source,
        }
    };
    let (temp_dir, log, mount): (Option<TempDir>, PathBuf, Option<PathBuf>) = match persistent_dir {
        Some(dir) => {
            let data = dir.join(CONTAINER_DATA_DIR);
            fs::create_dir_all(&data).map_err(io(format!("creating {}", data.display())))?;
            // The image runs Kafka as its own user (`appuser`).
            fs::set_permissions(&data, fs::Permissions::from_mode(0o777))
                .map_err(io(format!("making {} writable for the container", data.display())))?;
            (None, dir.join(LOG_FILE), Some(data))
        }
        None => {
            let dir = process::service_temp_dir(SERVICE, "exactly-kafka-")?;
            let log = dir.path().join(LOG_FILE);
            (Some(dir), log, None)
        }
    };
    let persistent = mount.is_some();
    let settings = settings.to_vec();
    // A cluster of its own, except where a data folder is reused (see
    // `CLUSTER_ID`); kept across restarts of this broker.
    let cluster_id = if persistent {
        CLUSTER_ID.to_string()
    } else {
        new_cluster_id()
    };
    let request = container::create(move |port: u16| {
        let image = GenericImage::new(KAFKA_IMAGE_NAME, KAFKA_VERSION)
            .with_exposed_port(ContainerPort::Tcp(port))
            .with_wait_for(WaitFor::message_on_either_std("Kafka Server started"));
        // Files Kafka creates in a bind mount belong to the image's user;
        // umask 0 lets the caller delete them afterwards. The image's own
        // start script (its default command) does the rest.
        let image = if persistent {
            image.with_entrypoint("/bin/sh")
        } else {
            image
        };
        let mut request = image.with_mapped_port(port, ContainerPort::Tcp(port));
        if persistent {
            request = request.with_cmd(["-c", "umask 0000 && exec /etc/kafka/docker/run"]);
        }
        if let Some(data) = &mount {
            request = request.with_mount(container::bind(data, CONTAINER_LOG_DIRS));
        }
        for (name, value) in kafka_env(port, &cluster_id, &settings) {
            request = request.with_env_var(name, value);
        }
        request
    });
    let container = Container::start(
        engine,
        ContainerSpec {
            service: SERVICE,
            slug: "kafka",
            image: KAFKA_IMAGE,
            inner_port: None,
            request,
            ready: |container| ready::metadata_answered(container.port()).is_some(),
            fresh_on_restart: !persistent,
            before_remove: None,
            log,
            fix: FIX_CONTAINER,
        },
    )?;
    Ok(Started { container, temp_dir })
}

/// `KAFKA_*` variables (the image turns them into broker properties) for a
/// combined broker and controller on `port`, with the test settings and the
/// caller's.
#[cfg(feature = "containers")]
fn kafka_env(port: u16, cluster_id: &str, settings: &[(String, String)]) -> Vec<(String, String)> {
    // The controller listener is not published; it only has to differ from
    // the client port.
    let controller = if port == 9093 { 9094 } else { 9093 };
    let mut env: Vec<(String, String)> = [
        ("CLUSTER_ID", cluster_id.to_string()),
        ("KAFKA_NODE_ID", "1".into()),
        ("KAFKA_PROCESS_ROLES", "broker,controller".into()),
        ("KAFKA_CONTROLLER_QUORUM_VOTERS", format!("1@127.0.0.1:{controller}")),
        (
            "KAFKA_LISTENERS",
            format!("PLAINTEXT://:{port},CONTROLLER://:{controller}"),
        ),
        ("KAFKA_ADVERTISED_LISTENERS", format!("PLAINTEXT://127.0.0.1:{port}")),
        (
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT".into(),
        ),
        ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER".into()),
        ("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT".into()),
        ("KAFKA_LOG_DIRS", CONTAINER_LOG_DIRS.into()),
        ("KAFKA_HEAP_OPTS", "-Xmx512m -Xms512m".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let caller = settings.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    for (key, value) in TEST_SETTINGS.iter().copied().chain(caller) {
        let name = env_name(key);
        env.retain(|(existing, _)| *existing != name);
        env.push((name, value.to_string()));
    }
    env
}

/// The image's variable for a broker property: `KAFKA_` and the key in
/// capitals, `.` as `_`, `_` as `__`, `-` as `___`.
#[cfg(feature = "containers")]
fn env_name(key: &str) -> String {
    let mut name = String::from("KAFKA_");
    for c in key.chars() {
        match c {
            '.' => name.push('_'),
            '_' => name.push_str("__"),
            '-' => name.push_str("___"),
            c => name.push(c.to_ascii_uppercase()),
        }
    }
    name
}

/// No container in a build without the `containers` feature (no engine
/// either, so this is never called).
#[cfg(not(feature = "containers"))]
pub(crate) fn start(
    engine: &Engine,
    _persistent_dir: Option<&Path>,
    _settings: &[(String, String)],
) -> Result<Started> {
    match *engine {}
}

#[cfg(all(test, feature = "containers"))]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn the_container_advertises_the_published_port_and_allows_transactions() {
        let env: HashMap<_, _> = kafka_env(41234, CLUSTER_ID, &[]).into_iter().collect();
        assert_eq!(env["KAFKA_ADVERTISED_LISTENERS"], "PLAINTEXT://127.0.0.1:41234");
        assert_eq!(env["KAFKA_LISTENERS"], "PLAINTEXT://:41234,CONTROLLER://:9093");
        assert_eq!(env["KAFKA_CONTROLLER_QUORUM_VOTERS"], "1@127.0.0.1:9093");
        for var in [
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        ] {
            assert_eq!(env[var], "1", "{var}");
        }
        let clash: HashMap<_, _> = kafka_env(9093, CLUSTER_ID, &[]).into_iter().collect();
        assert_eq!(clash["KAFKA_LISTENERS"], "PLAINTEXT://:9093,CONTROLLER://:9094");
    }

    #[test]
    fn the_image_is_the_release_the_kit_runs() {
        assert_eq!(KAFKA_IMAGE, format!("{KAFKA_IMAGE_NAME}:{KAFKA_VERSION}"));
    }

    #[test]
    fn settings_become_the_images_variables_and_the_callers_win() {
        let settings = vec![
            ("transaction.max.timeout.ms".to_string(), "5000".to_string()),
            ("num.partitions".to_string(), "3".to_string()),
        ];
        let env = kafka_env(41234, CLUSTER_ID, &settings);
        let values: Vec<_> = env.iter().filter(|(k, _)| k == "KAFKA_NUM_PARTITIONS").collect();
        assert_eq!(values.len(), 1);
        assert_eq!(values[0].1, "3");
        assert!(env.contains(&("KAFKA_TRANSACTION_MAX_TIMEOUT_MS".into(), "5000".into())));
        assert_eq!(env_name("a_b-c.d"), "KAFKA_A__B___C_D");
    }
}
