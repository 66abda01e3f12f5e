//! A progress line on stderr while a pipeline catches up on a backlog
//! (`indicatif`): records/s, lag left and the time it will take. Only when
//! stderr is a terminal — nothing at all otherwise — and only while the
//! lag is at least [`BACKLOG_MIN`] records; it disappears once caught up.
//!
//! Log lines are written around it ([`LogWriter`]), so they never tear it.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::exporter::Observed;

/// Lag (records) from which the progress line shows.
pub const BACKLOG_MIN: i64 = 1000;

/// The progress line on screen, if any (log lines suspend it).
static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Whether a progress line may be drawn: stderr is a terminal.
pub fn enabled() -> bool {
    std::io::stderr().is_terminal()
}

/// Shows the progress line while the lag `observed` reads is a backlog;
/// runs until the task is aborted. Does nothing when stderr is not a terminal.
pub async fn run(observed: Observed) {
    if !enabled() {
        return;
    }
    let style = ProgressStyle::with_template(
        "{spinner} catching up [{bar:30}] {human_pos}/{human_len} records  {per_sec}  {msg}  ETA {eta}",
    )
    .expect("a valid template")
    .progress_chars("=> ");
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let lag: Option<i64> = observed
            .lag
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|l| l.iter().map(|p| p.lag).sum());
        let written = observed.metrics.snapshot().records_out;
        let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        match (lag, active.as_ref()) {
            (Some(lag), None) if lag >= BACKLOG_MIN => {
                let bar = ProgressBar::with_draw_target(Some(written + lag as u64), ProgressDrawTarget::stderr())
                    .with_style(style.clone())
                    .with_position(written);
                bar.set_message(format!("lag {lag}"));
                bar.enable_steady_tick(Duration::from_millis(200));
                *active = Some(bar);
            }
            (Some(lag), Some(bar)) if lag > 0 => {
                bar.set_length(written.max(bar.position()) + lag as u64);
                bar.set_position(written);
                bar.set_message(format!("lag {lag}"));
            }
            (_, Some(_)) => {
                if let Some(bar) = active.take() {
                    bar.finish_and_clear();
                }
            }
            _ => {}
        }
    }
}

/// Clears the progress line (the pipeline is done).
pub fn clear() {
    if let Some(bar) = ACTIVE.lock().unwrap_or_else(|e| e.into_inner()).take() {
        bar.finish_and_clear();
    }
}

/// stderr for log lines: each write hides the progress line for a moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        match active.as_ref() {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(buf)).map(|_| buf.len()),
            None => std::io::stderr().write_all(buf).map(|_| buf.len()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;
    fn make_writer(&'a self) -> LogWriter {
        LogWriter
    }
}
