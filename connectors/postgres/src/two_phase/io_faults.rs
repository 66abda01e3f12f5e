//! Crash points inside the sink's PostgreSQL I/O, for the crash tests (see
//! [`exactly_core::fault`]):
//!
//! Both are points of a subtask: `postgres_sink.mid_copy@1:3` is the third
//! hit in subtask 1.
//!
//! | point | where |
//! |---|---|
//! | `postgres_sink.mid_copy` | a COPY of rows is open and has streamed at least [`MID_COPY_BYTES`] of record data (the server has received rows), before it is finished |
//! | `postgres_sink.before_prepare_answer` | `PREPARE TRANSACTION` was sent and the server has prepared the transaction, before the sink reads the answer |
//!
//! A crash point kills the process at once, which may be before the
//! connection's task has put the bytes on the wire. When `EXACTLY_CRASH_AT`
//! names one of these points, the sink therefore first waits (at most
//! [`SERVER_WAIT`], on its commit connection) until the server shows the
//! state the point is about: COPY progress in `pg_stat_progress_copy`, the
//! gid in `pg_prepared_xacts`. Without the variable nothing waits and a
//! point costs an atomic load.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use exactly_core::fault;
use tokio_postgres::Client;

use crate::conn::copy::BinaryCopy;

/// See the module documentation.
pub(super) const MID_COPY: &str = "postgres_sink.mid_copy";
/// See the module documentation.
pub(super) const BEFORE_PREPARE_ANSWER: &str = "postgres_sink.before_prepare_answer";

/// Record data a COPY has taken when [`MID_COPY`] is reached (a row takes at
/// least its value's bytes encoded when the value is a column, as in the
/// usual mappings). A planned crash first sends what the COPY still buffers,
/// so rows have left the process, and waits for the server to show them.
pub(super) const MID_COPY_BYTES: usize = 4 * 1024 + 512;

/// How long a planned crash waits for the server to show its state.
const SERVER_WAIT: Duration = Duration::from_secs(5);

/// Whether `EXACTLY_CRASH_AT` (`<point>[@<subtask>][:<nth>]`) names `point`,
/// for any subtask and hit (never in a build without fault injection).
pub(super) fn planned(point: &str) -> bool {
    fault::planned_crash_point() == Some(point)
}

/// Runs `request`; when `point` is planned, hands the statement to the
/// connection first, then runs `between` (which waits and crashes), and
/// only then waits for the answer.
pub(super) async fn after_sending<F: Future>(request: F, point: &str, between: impl Future<Output = ()>) -> F::Output {
    if !planned(point) {
        return request.await;
    }
    let mut request = pin!(request);
    // tokio-postgres queues the statement for its connection task on the
    // first poll.
    let first = std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
    if let Poll::Ready(output) = first {
        return output;
    }
    between.await;
    request.await
}

/// [`MID_COPY`]: a COPY of rows (`copy`) is open on the write connection
/// (backend `writer_pid`) and has streamed [`MID_COPY_BYTES`] or more;
/// `watcher` (the commit connection) sees the server's state.
pub(super) async fn mid_copy(
    copy: Option<&mut BinaryCopy>,
    watcher: Option<&Client>,
    writer_pid: Option<i32>,
    subtask: usize,
) {
    if planned(MID_COPY) {
        // Rows still in the COPY's buffer have not left the process.
        if let Some(copy) = copy {
            if let Err(error) = copy.send_all().await {
                tracing::warn!(%error, "sending the buffered rows before a planned crash failed; crashing anyway");
            }
        }
        if let (Some(watcher), Some(pid)) = (watcher, writer_pid) {
            wait_for(
                watcher,
                "SELECT count(*) FROM pg_stat_progress_copy WHERE pid = $1 AND bytes_processed > 0",
                pid,
            )
            .await;
        }
    }
    fault::point_at(MID_COPY, subtask);
}

/// [`BEFORE_PREPARE_ANSWER`]: `PREPARE TRANSACTION '<gid>'` was sent;
/// `watcher` (the commit connection) sees the server's state.
pub(super) async fn before_prepare_answer(watcher: Option<&Client>, gid: &str, subtask: usize) {
    if let Some(watcher) = watcher {
        wait_for(
            watcher,
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1 AND database = current_database()",
            gid,
        )
        .await;
    }
    fault::point_at(BEFORE_PREPARE_ANSWER, subtask);
}

/// Polls `count_sql` (one parameter) until it counts a row, at most
/// [`SERVER_WAIT`]; errors end the wait (a server without
/// `pg_stat_progress_copy`, before PostgreSQL 14).
async fn wait_for<P: tokio_postgres::types::ToSql + Sync>(client: &Client, count_sql: &str, param: P) {
    let deadline = Instant::now() + SERVER_WAIT;
    while Instant::now() < deadline {
        match client.query_one(count_sql, &[&param]).await {
            Ok(row) if row.get::<_, i64>(0) > 0 => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(error) => {
                tracing::warn!(%error, "cannot see the server's state before a planned crash; crashing anyway");
                return;
            }
        }
    }
    tracing::warn!("the server did not show the state of the planned crash point in time; crashing anyway");
}
