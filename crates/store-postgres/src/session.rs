//! One connection to the store's database, opened on first use and again
//! after it broke, with every call bounded in time and every failure
//! classified: did the call certainly have no effect (`Determinate`), or may
//! it have taken effect (`Indeterminate`)?
//!
//! - A failure to connect, an ERROR the server reported (the statement
//!   rolled back: every call is one statement in its own transaction), and
//!   any failed read are determinate.
//! - A write whose connection broke, whose session the server ended (a
//!   FATAL error: `pg_terminate_backend`, a shutdown — it may come after the
//!   commit), or whose answer did not come within the call's time-out,
//!   after the statement was sent, is indeterminate. The
//!   connection is then dropped, so a statement still running on the server
//!   for a vanished client ends (`client_connection_check_interval`) or
//!   completes; either way the next fence waits for its row lock and sees
//!   the outcome.
//!
//! Session settings keep the server's side bounded too: `statement_timeout`
//! (below the client's time-out, so a slow statement usually fails
//! determinately, on the server), `idle_in_transaction_session_timeout`,
//! and `client_connection_check_interval` where the server has it (14+).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use exactly_core::store::AccessError;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;
use tracing::{debug, warn};

use crate::schema;

/// How long a call may take by default before its outcome is given up as
/// unknown.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a call changes anything (and so may be indeterminate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    Reads,
    Writes,
}

/// Where and how to connect: shared by every session of a store.
pub(crate) struct Target {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) tls: rustls::ClientConfig,
    /// The server without secrets (`postgres://user@host:port/db`).
    pub(crate) server: String,
    pub(crate) call_timeout: Duration,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("server", &self.server)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

/// An open connection and the statements prepared on it.
struct Live {
    client: Client,
    prepared: HashMap<&'static str, Statement>,
}

/// One lazily (re)opened connection; calls on it run one at a time.
pub(crate) struct Session {
    target: Arc<Target>,
    /// `application_name` of the connection (what an operator sees in
    /// `pg_stat_activity`).
    name: String,
    /// For messages: the server and what the session serves.
    location: String,
    live: tokio::sync::Mutex<Option<Live>>,
}

/// PostgreSQL keeps the first 63 bytes of `application_name`.
fn application_name(name: &str) -> String {
    let mut end = name.len().min(63);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

impl Session {
    /// A session to `target` named `name`, for the calls of `location`.
    pub(crate) fn new(target: Arc<Target>, name: &str, location: String) -> Session {
        Session {
            target,
            name: application_name(name),
            location,
            live: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) fn location(&self) -> &str {
        &self.location
    }

    fn determinate(&self, operation: &str, e: impl Into<exactly_core::BoxError>) -> AccessError {
        AccessError::determinate(self.location.clone(), operation, e)
    }

    /// Opens a connection with the session settings, and makes sure the
    /// tables exist.
    pub(crate) async fn connect(target: &Target, name: &str) -> Result<Client, exactly_core::BoxError> {
        let mut config = target.config.clone();
        config.application_name(name);
        let statement_timeout = target
            .call_timeout
            .saturating_sub(Duration::from_secs(1))
            .max(Duration::from_millis(500));
        config.options(format!(
            "-c statement_timeout={}ms -c idle_in_transaction_session_timeout={}ms",
            statement_timeout.as_millis(),
            target.call_timeout.as_millis()
        ));
        config.connect_timeout(target.call_timeout);
        let connect = config.connect(MakeRustlsConnect::new(target.tls.clone()));
        let (client, connection) = tokio::time::timeout(target.call_timeout, connect)
            .await
            .map_err(|_| format!("no connection within {:?}", target.call_timeout))??;
        let server = target.server.clone();
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%server, %error, "checkpoint store connection ended");
            }
        });
        // Not on servers before 14: the store works without it, a
        // statement of a vanished client then ends at its time-out.
        if let Err(error) = client
            .batch_execute("SET client_connection_check_interval = '1s'")
            .await
        {
            debug!(%error, "client_connection_check_interval is not available");
        }
        schema::create(&client).await?;
        Ok(client)
    }

    /// Runs `sql` with `params` as one statement in its own transaction,
    /// within the call time-out.
    pub(crate) async fn query(
        &self,
        operation: &str,
        effect: Effect,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, AccessError> {
        let mut live = self.live.lock().await;
        if live.as_ref().is_none_or(|l| l.client.is_closed()) {
            let client = Self::connect(&self.target, &self.name)
                .await
                .map_err(|e| AccessError::Determinate {
                    location: self.location.clone(),
                    operation: format!("{operation} (connecting to {})", self.target.server),
                    source: e,
                })?;
            *live = Some(Live {
                client,
                prepared: HashMap::new(),
            });
        }
        let conn = live.as_mut().expect("connected above");
        let statement = match conn.prepared.get(sql) {
            Some(statement) => statement.clone(),
            None => {
                let prepared = tokio::time::timeout(self.target.call_timeout, conn.client.prepare(sql)).await;
                match prepared {
                    Ok(Ok(statement)) => {
                        conn.prepared.insert(sql, statement.clone());
                        statement
                    }
                    Ok(Err(e)) => {
                        if !statement_failed(&e) {
                            *live = None;
                        }
                        return Err(self.determinate(operation, e));
                    }
                    Err(elapsed) => {
                        *live = None;
                        return Err(self.determinate(operation, elapsed));
                    }
                }
            }
        };
        let answer = tokio::time::timeout(self.target.call_timeout, conn.client.query(&statement, params)).await;
        let failure: exactly_core::BoxError = match answer {
            Ok(Ok(rows)) => return Ok(rows),
            // The server refused the statement (an ERROR): it rolled back,
            // and the session lives on.
            Ok(Err(e)) if statement_failed(&e) => return Err(self.determinate(operation, e)),
            // FATAL or PANIC (the session was ended: `pg_terminate_backend`,
            // a shutdown), or no answer: the statement may have committed
            // before the end.
            Ok(Err(e)) => e.into(),
            Err(elapsed) => format!("no answer within {:?} ({elapsed})", self.target.call_timeout).into(),
        };
        // The statement was sent; the connection is broken or late. Drop it.
        *live = None;
        Err(match effect {
            Effect::Reads => AccessError::determinate(self.location.clone(), operation, failure),
            Effect::Writes => {
                warn!(location = %self.location, %operation, error = %failure, "a checkpoint store write's outcome is unknown");
                AccessError::indeterminate(self.location.clone(), operation, failure)
            }
        })
    }
}

/// Whether the server answered with an error that ended the statement (and
/// its transaction) but not the session: severity ERROR. A FATAL or PANIC
/// error ends the session and may come after the commit, so it says
/// nothing certain about a write.
fn statement_failed(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        !matches!(
            db.parsed_severity(),
            Some(tokio_postgres::error::Severity::Fatal | tokio_postgres::error::Severity::Panic)
        )
    })
}
