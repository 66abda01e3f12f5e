//! Classifying PostgreSQL failures into [`ConnectorError`]s with a fix.

use exactly_core::ConnectorError;
use tokio_postgres::error::SqlState;

/// Turns a PostgreSQL error into a classified connector error that keeps
/// it as its cause.
///
/// `context` says what the sink was doing, `url` is the redacted server.
/// The message says what the server reported (SQLSTATE, message, detail)
/// and the fix, when one is known.
pub(crate) fn classify(context: &str, url: &str, error: tokio_postgres::Error) -> ConnectorError {
    let Some(db) = error.as_db_error() else {
        if error.is_closed() || std::error::Error::source(&error).is_some_and(|s| s.is::<std::io::Error>()) {
            return ConnectorError::transient(
                context,
                format!("lost the connection to PostgreSQL at {url}; check that the server is running and reachable"),
            )
            .caused_by(error);
        }
        return ConnectorError::fatal(context, format!("PostgreSQL client error talking to {url}")).caused_by(error);
    };
    let code = db.code();
    let mut message = format!(
        "PostgreSQL at {url} reported {} ({}): {}",
        code.code(),
        category(code),
        db.message()
    );
    if let Some(detail) = db.detail() {
        message.push_str(&format!(" [{detail}]"));
    }
    if let Some(fix) = fix_for(code) {
        message.push_str(&format!(". Fix: {fix}"));
    }
    let classified = if is_transient(code) {
        ConnectorError::transient(context, message)
    } else {
        ConnectorError::fatal(context, message)
    };
    classified.caused_by(error)
}

/// An error while connecting: unreachable servers are transient; refused
/// logins and unknown databases are fatal. Keeps `error` as its cause.
pub(crate) fn connect_error(url: &str, error: tokio_postgres::Error) -> ConnectorError {
    let context = "postgres sink: connecting";
    if error.as_db_error().is_some() {
        return classify(context, url, error);
    }
    ConnectorError::transient(
        context,
        format!(
            "cannot connect to PostgreSQL at {url}. Check that the server is running and reachable at that \
             address (host, port, firewall) and that sink.postgres.url is right"
        ),
    )
    .caused_by(error)
}

fn category(code: &SqlState) -> &'static str {
    match &code.code()[..2] {
        "08" => "connection exception",
        "22" => "data exception",
        "23" => "integrity constraint violation",
        "25" => "invalid transaction state",
        "28" => "invalid authorization",
        "3D" => "invalid database",
        "3F" => "invalid schema",
        "40" => "transaction rollback",
        "42" => "syntax error or access rule violation",
        "53" => "insufficient resources",
        "55" => "object not in prerequisite state",
        "57" => "operator intervention",
        _ => "error",
    }
}

fn is_transient(code: &SqlState) -> bool {
    if [
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::OBJECT_IN_USE,
        SqlState::IN_FAILED_SQL_TRANSACTION,
    ]
    .contains(code)
    {
        return true;
    }
    matches!(&code.code()[..2], "08" | "40" | "53" | "57" | "58" | "XX")
}

fn fix_for(code: &SqlState) -> Option<&'static str> {
    Some(match code.code() {
        "28000" | "28P01" => {
            "check the user and password in sink.postgres.url and the server's pg_hba.conf rules for this client"
        }
        "3D000" => "create the database (CREATE DATABASE ...) or fix the database name in sink.postgres.url",
        "3F000" => "create the schema (CREATE SCHEMA ...) or fix the schema in the table names",
        "42501" => {
            "grant the sink's user the privileges it needs (GRANT SELECT, INSERT, UPDATE ON <table> TO <user>; \
             CREATE on the schema when it creates tables), or connect as another user"
        }
        "42P01" => "create the table or set sink.postgres.create_table = true",
        "42703" => "add the column to the table (ALTER TABLE ... ADD COLUMN) or remove it from sink.postgres.columns",
        "42P10" => {
            "give the table a unique index or primary key on exactly the sink.postgres.upsert_key columns \
             (ALTER TABLE ... ADD PRIMARY KEY (...))"
        }
        "42804" | "22P03" => "make each sink.postgres.columns.<name>.type match the table's column type",
        "55P03" => {
            "another transaction holds a lock the sink needs for more than the sink's lock timeout; the pipeline \
             restarts and retries (if the holder is a prepared transaction of this sink, it gets committed then)"
        }
        code if code.starts_with("23") => {
            "a row breaks a constraint of the table (in append mode a duplicate key means the data repeats: \
             use sink.postgres.upsert_key, or drop the constraint)"
        }
        code if code.starts_with("53") => {
            "the server is out of a resource (connections, prepared transactions, disk); it is retried, \
             raise the limit if it persists"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_states_are_classified() {
        assert!(is_transient(&SqlState::T_R_SERIALIZATION_FAILURE));
        assert!(is_transient(&SqlState::ADMIN_SHUTDOWN));
        assert!(is_transient(&SqlState::CANNOT_CONNECT_NOW));
        assert!(is_transient(&SqlState::TOO_MANY_CONNECTIONS));
        assert!(is_transient(&SqlState::LOCK_NOT_AVAILABLE));
        assert!(!is_transient(&SqlState::INVALID_PASSWORD));
        assert!(!is_transient(&SqlState::UNDEFINED_TABLE));
        assert!(!is_transient(&SqlState::UNIQUE_VIOLATION));
        assert!(!is_transient(&SqlState::INSUFFICIENT_PRIVILEGE));
        assert!(fix_for(&SqlState::UNDEFINED_TABLE).unwrap().contains("create_table"));
        assert!(fix_for(&SqlState::UNIQUE_VIOLATION).unwrap().contains("upsert_key"));
    }
}
