//! `exactly-sqlite`: the `exactly` command with one more sink kind,
//! `[sink.sqlite]`, the example connector of `examples/sqlite-sink`.
//! Everything else — `run` (with `/metrics`, `/health/*`, JSON logs, the
//! progress line), `status`, `checkpoints list/show`, secrets, the
//! built-in sources and sinks — is exactly's own.
//!
//! ```toml
//! [sink.sqlite]
//! path = "out.db"        # relative to the pipeline file's folder
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use exactly::core::SinkFactory;
use exactly::plugins::Connectors;
use exactly_example_sqlite_sink::{Mode, SqliteSinkFactory};

/// `[sink.sqlite]`: unknown keys are refused by name.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SqliteSection {
    /// The database file.
    path: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let connectors = Connectors::default().sink("sqlite", |section: SqliteSection, context| {
        Ok(Arc::new(SqliteSinkFactory {
            path: context.resolve(&section.path),
            mode: Mode::Correct,
        }) as Arc<dyn SinkFactory>)
    });
    exactly::cli::main_with(std::env::args_os(), connectors)
}
