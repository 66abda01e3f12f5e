//! Opening the sink's connections: the connection string's settings, TLS,
//! and an `application_name` that names the pipeline and this process.

use std::sync::OnceLock;

use exactly_core::ConnectorError;
use tokio_postgres::Client;

use crate::config::Settings;

/// How long a write waits for a row or table lock before the checkpoint
/// fails (instead of waiting forever behind a lock the sink itself must
/// release later).
pub(crate) const LOCK_TIMEOUT: &str = "60s";

/// PostgreSQL keeps the first 63 bytes of `application_name`.
const MAX_APPLICATION_NAME: usize = 63;

/// Connects as `application_name` (see [`application_name`]) and drives
/// the connection on its own task.
pub(crate) async fn connect(settings: &Settings, application_name: &str) -> Result<Client, ConnectorError> {
    let mut config = settings.pg.clone();
    config.application_name(application_name);
    let (client, connection) = super::tls::connect(&config, &settings.tls, &settings.url).await?;
    let url = settings.url.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(%url, error = %e, "PostgreSQL connection ended with an error");
        }
    });
    Ok(client)
}

/// `pid=<pid>.<6 hex digits>`: this process, told apart from another with
/// the same pid (on another machine, or in another container).
fn process_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded randomly per process.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(std::time::SystemTime::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_nanos()));
        format!("pid={}.{:06x}", std::process::id(), hasher.finish() & 0xff_ffff)
    })
}

/// The `application_name` of the sink's connections:
/// `exactly <pipeline> pid=<pid>.<tag>`, printable ASCII (other characters
/// become `?`) and at most 63 bytes (the pipeline name is cut), so the server
/// keeps it as it is and a lock holder is recognisable in `pg_stat_activity`.
pub(crate) fn application_name(pipeline: &str) -> String {
    named(pipeline, "")
}

/// The `application_name` of a worker's connections for sink subtask
/// `subtask` owned under `epoch`: `exactly s<subtask>e<epoch>h<hash>
/// <pipeline> pid=<pid>.<tag>`, where `<hash>` is 8 hex digits of the
/// SHA-256 of the whole pipeline name (the name itself may be cut to fit
/// 63 bytes, and other characters than printable ASCII shown as `?`): a
/// newer owner tells this pipeline's zombie sessions apart by it
/// ([`owned_by`]).
pub(crate) fn owned_application_name(pipeline: &str, subtask: usize, epoch: u64) -> String {
    named(pipeline, &format!("s{subtask}e{epoch}h{} ", pipeline_hash(pipeline)))
}

/// 8 hex digits of the SHA-256 of `pipeline`.
fn pipeline_hash(pipeline: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(pipeline.as_bytes())[..4])
}

/// The epoch of a worker's session of sink subtask `subtask` of
/// `pipeline`, read from its `application_name` (see
/// [`owned_application_name`]).
pub(crate) fn owned_by(name: &str, pipeline: &str, subtask: usize) -> Option<u64> {
    let rest = name.strip_prefix(&format!("exactly s{subtask}e"))?;
    let (mark, _) = rest.split_once(' ')?;
    let (epoch, hash) = mark.split_once('h')?;
    (hash == pipeline_hash(pipeline)).then_some(())?;
    epoch.parse().ok()
}

/// `pipeline` with every character that is not printable ASCII as `?`.
fn printable(pipeline: &str) -> String {
    pipeline
        .chars()
        .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
        .collect()
}

fn named(pipeline: &str, mark: &str) -> String {
    let head = format!("exactly {mark}");
    let suffix = format!(" {}", process_tag());
    let room = MAX_APPLICATION_NAME - head.len() - suffix.len();
    let name: String = printable(pipeline).chars().take(room).collect();
    format!("{head}{name}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_application_name_names_exactly_the_pipeline_and_this_process_within_63_ascii_bytes() {
        let name = application_name("orders-to-pg");
        assert!(name.starts_with("exactly orders-to-pg pid="), "{name}");
        assert!(name.contains(&format!("pid={}.", std::process::id())), "{name}");
        let long = application_name(&"ü".repeat(100));
        assert!(long.len() <= MAX_APPLICATION_NAME, "{} bytes", long.len());
        assert!(long.is_ascii() && long.starts_with("exactly ???"), "{long}");
        assert!(long.ends_with(process_tag()), "the tag survives the cut: {long}");
    }

    #[test]
    fn a_workers_session_names_its_subtask_and_epoch_whatever_the_pipelines_length() {
        let name = owned_application_name("orders-to-pg", 3, 17);
        assert!(name.starts_with("exactly s3e17h"), "{name}");
        assert!(name.contains(" orders-to-pg pid="), "{name}");
        assert_eq!(owned_by(&name, "orders-to-pg", 3), Some(17));
        assert_eq!(owned_by(&name, "orders-to-pg", 4), None, "another subtask");
        assert_eq!(owned_by(&name, "orders", 3), None, "another pipeline");
        assert_eq!(
            owned_by(&name, "orders-to-pg-2", 3),
            None,
            "a pipeline whose name it begins"
        );
        assert_eq!(owned_by(&application_name("orders-to-pg"), "orders-to-pg", 3), None);
        assert_eq!(
            owned_by(&application_name("s3e5 foo"), "foo", 3),
            None,
            "a pipeline named like a mark"
        );
        for length in [20, 30, 33, 40, 100] {
            let pipeline = "p".repeat(length);
            for epoch in [9, 12_345, u64::MAX] {
                let name = owned_application_name(&pipeline, 5, epoch);
                assert!(name.len() <= MAX_APPLICATION_NAME, "{name}");
                assert_eq!(owned_by(&name, &pipeline, 5), Some(epoch), "{name}");
                assert_eq!(owned_by(&name, &format!("{pipeline}-2"), 5), None, "{name}");
            }
        }
        // Cut to the same text, told apart by the hash.
        let (west1, west2) = (
            "acme-orders-to-postgres-eu-west-1-x",
            "acme-orders-to-postgres-eu-west-2-x",
        );
        let a = owned_application_name(&format!("{}{west1}", "p".repeat(40)), 0, 7);
        assert_eq!(owned_by(&a, &format!("{}{west2}", "p".repeat(40)), 0), None, "{a}");
        assert_eq!(owned_by(&owned_application_name("ü-x", 0, 7), "ö-x", 0), None);
    }
}
