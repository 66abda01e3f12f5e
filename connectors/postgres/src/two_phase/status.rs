//! For `exactly status`: the pipeline's prepared transactions on the server
//! ([`SinkFactory::prepared_transactions`](exactly_core::SinkFactory::prepared_transactions)).
//!
//! Read-only: one connection of its own (`application_name = "exactly
//! status <pipeline>"`), one query of `pg_prepared_xacts`, no advisory
//! lock, nothing written — safe next to a running pipeline.

use std::time::Duration;

use exactly_core::{CheckpointId, ConnectorError, PreparedTransaction};

use super::gid::gid_prefix;
use crate::config::Settings;
use crate::conn::error::classify;

/// How long connecting and the query may take together.
const STATUS_TIMEOUT: Duration = Duration::from_secs(15);

/// The prepared transactions of pipeline `pipeline` and the table of
/// `settings` in the sink's database, oldest first.
pub(crate) async fn prepared_transactions(
    settings: &Settings,
    pipeline: &str,
) -> Result<Vec<PreparedTransaction>, ConnectorError> {
    let query = async {
        let mut config = settings.pg.clone();
        config.application_name(format!("exactly status {pipeline}"));
        let (client, connection) = crate::conn::tls::connect(&config, &settings.tls, &settings.url).await?;
        let driver = tokio::spawn(connection);
        let prefix = pipeline_prefix(pipeline, &settings.table_label);
        let rows = client
            .query(
                "SELECT gid, (extract(epoch FROM prepared) * 1000)::bigint FROM pg_prepared_xacts \
                     WHERE database = current_database() AND left(gid, length($1)) = $1 ORDER BY prepared, gid",
                &[&prefix],
            )
            .await
            .map_err(|e| classify("postgres sink: listing prepared transactions", &settings.url, e))?;
        drop(client);
        let _ = driver.await;
        Ok(rows
            .iter()
            .map(|row| {
                let gid: String = row.get(0);
                let (subtask, checkpoint) = parse(&gid, &prefix).unzip();
                PreparedTransaction {
                    subtask,
                    checkpoint,
                    prepared_unix_ms: row.get(1),
                    name: gid,
                }
            })
            .collect())
    };
    tokio::time::timeout(STATUS_TIMEOUT, query).await.unwrap_or_else(|_| {
        Err(ConnectorError::transient(
            "postgres sink: listing prepared transactions",
            format!(
                "PostgreSQL at {} did not answer within {} s. Check that the server is running and \
                     reachable at that address and that sink.postgres.url is right",
                settings.url,
                STATUS_TIMEOUT.as_secs()
            ),
        ))
    })
}

/// The gid prefix every subtask of `pipeline` and `table` shares: a
/// subtask's prefix (`exactly:<pipeline>:<table>:<subtask>:`, or its
/// shortened form) without the subtask number.
fn pipeline_prefix(pipeline: &str, table: &str) -> String {
    let first = gid_prefix(pipeline, table, 0);
    first.strip_suffix("0:").unwrap_or(&first).to_string()
}

/// `(subtask, checkpoint)` of a gid that starts with `prefix`.
fn parse(gid: &str, prefix: &str) -> Option<(usize, CheckpointId)> {
    let (subtask, checkpoint) = gid.strip_prefix(prefix)?.split_once(':')?;
    Some((subtask.parse().ok()?, CheckpointId(checkpoint.parse().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::two_phase::gid::gid;

    #[test]
    fn gids_of_every_subtask_share_the_prefix_and_are_read_back() {
        for (pipeline, table) in [("orders-to-pg", "public.orders"), (&*"p".repeat(150), "t")] {
            let prefix = pipeline_prefix(pipeline, table);
            for subtask in [0, 3, 10, 17] {
                let g = gid(&gid_prefix(pipeline, table, subtask), 42);
                assert_eq!(parse(&g, &prefix), Some((subtask, CheckpointId(42))), "{g}");
            }
        }
        let prefix = pipeline_prefix("p", "t");
        assert_eq!(
            parse(&gid(&gid_prefix("p", "t2", 1), 5), &prefix),
            None,
            "another table"
        );
        assert_eq!(parse("exactly:p:t:1", &prefix), None, "no checkpoint");
    }
}
