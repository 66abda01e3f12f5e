//! One sink subtask's settings and place: what every mode's connections
//! are named and how their errors are told.

use std::sync::Arc;

use exactly_core::{ConnectorError, SinkContext};

use super::connect::{application_name, owned_application_name};
use super::copy::CopyError;
use super::error::classify;
use crate::config::Settings;

/// The settings and place of one sink subtask: its connections' name and
/// the context and classification of its errors.
#[derive(Clone)]
pub(crate) struct Subtask {
    pub settings: Arc<Settings>,
    pub context: SinkContext,
}

impl Subtask {
    /// The `application_name` of this sink's connections.
    pub(crate) fn application_name(&self) -> String {
        match &self.context.ownership {
            Some(owned) => owned_application_name(&self.context.pipeline, self.context.subtask, owned.epoch.0),
            None => application_name(&self.context.pipeline),
        }
    }

    /// `postgres sink <table> (subtask <n>): <action>`, the context of errors.
    pub(crate) fn label(&self, action: &str) -> String {
        format!(
            "postgres sink {} (subtask {}): {action}",
            self.settings.table_label, self.context.subtask
        )
    }

    /// A PostgreSQL error while doing `action`, classified (see
    /// [`classify`]) and kept as the cause.
    pub(crate) fn pg_error(&self, action: &str, e: tokio_postgres::Error) -> ConnectorError {
        classify(&self.label(action), &self.settings.url, e)
    }

    /// A failed COPY: the server's or connection's error classified as
    /// [`pg_error`](Self::pg_error) does; a value that cannot be encoded
    /// (the conversions check every value against its column first, so this
    /// is a bug) is fatal.
    pub(crate) fn copy_error(&self, action: &str, e: CopyError) -> ConnectorError {
        match e {
            CopyError::Postgres(e) => self.pg_error(action, e),
            other => ConnectorError::fatal(
                self.label(action),
                "a value passed the sink's conversion checks but not the encoder (a bug in exactly-postgres)",
            )
            .caused_by(other),
        }
    }

    /// The connection of an open transaction is gone.
    pub(crate) fn lost_connection(&self, action: &str) -> ConnectorError {
        ConnectorError::transient(
            self.label(action),
            format!(
                "lost the connection to PostgreSQL at {} during the transaction; check that the server is running",
                self.settings.url
            ),
        )
    }

    /// A write before the sink was opened (a bug in the caller).
    pub(crate) fn not_opened(&self, opener: &str) -> ConnectorError {
        ConnectorError::fatal(
            self.label("writing"),
            format!("{opener} must run before any write (the runtime calls it first)"),
        )
    }
}
