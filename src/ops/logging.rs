//! Log output of the `exactly` command: text (the default) or one JSON
//! object per line (`--log-format json`, tracing-subscriber's JSON layer),
//! on stderr, filtered by `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

use super::progress::LogWriter;

/// `--log-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields` (with
    /// `message`), `target`, and the current span with its fields.
    Json,
}

/// Installs the process's log subscriber.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(LogWriter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).init(),
    }
}
