//! The inspecting commands: `exactly status`, `exactly checkpoints list`
//! and `exactly checkpoints show`. None runs the pipeline or takes its
//! lock.

use std::path::Path;

use anyhow::{bail, Result};

use crate::config::PipelineFile;
use crate::core::{Checkpoints, Scope};
use crate::ops;
use crate::plugins::Connectors;

/// Loads a pipeline file for an inspecting command; a missing file's error
/// says what to pass.
fn load_for(command: &str, file: &Path, connectors: &Connectors) -> Result<PipelineFile> {
    PipelineFile::load_with(file, connectors).map_err(|e| match e {
        crate::config::ConfigError::Read { .. } => anyhow::anyhow!(
            "{e}. Fix: pass the pipeline's TOML file, the one `exactly run` runs (`exactly {command} pipeline.toml`)"
        ),
        other => other.into(),
    })
}

pub(super) fn status(file: &Path, json: bool, connectors: &Connectors) -> Result<()> {
    let config = load_for("status", file, connectors)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(ops::status::status(&config))?;
    if json {
        println!("{}", ops::redact::redact(&serde_json::to_string_pretty(&report)?));
    } else {
        print!("{}", ops::status::render_text(&report));
    }
    if !report.problems.is_empty() {
        bail!(
            "{} part(s) of the status could not be read:\n{}",
            report.problems.len(),
            report.problems.join("\n")
        );
    }
    Ok(())
}

pub(super) fn show_checkpoint(entry: &Path, name: Option<&str>, json: bool, connectors: &Connectors) -> Result<()> {
    let entry = match name {
        None => ops::show::read_entry(entry)?,
        Some(name) => {
            let config = load_for("checkpoints show", entry, connectors)?;
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(ops::show::find_entry(&config, name))?
        }
    };
    if json {
        println!("{}", ops::redact::redact(&serde_json::to_string_pretty(&entry)?));
    } else {
        print!("{}", ops::show::render_text(&entry));
    }
    Ok(())
}

/// Every checkpoint sequence's entries, oldest first: the pipeline's own
/// (global failover) and every region's, each line naming its region, in
/// whichever store the pipeline file names.
pub(super) fn list_checkpoints(file: &Path, connectors: &Connectors) -> Result<()> {
    let config = load_for("checkpoints list", file, connectors)?;
    let store = config
        .checkpoint_store()
        .map_err(|e| anyhow::anyhow!(ops::redact::redact(&e.to_string())))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut sequences = vec![(None, Scope::Global)];
        for region in store.regions().await? {
            sequences.push((Some(region), Scope::Region(region)));
        }
        let mut listed = 0;
        for (region, scope) in sequences {
            let label = region.map(|r| format!(" region={r}")).unwrap_or_default();
            let sequence = Checkpoints::new(store.sequence(scope), store.retain());
            for n in sequence.list().await? {
                listed += 1;
                match sequence.read(&n.file_name).await {
                    Ok(e) => {
                        let pending: usize = e.checkpoint.pending.values().map(Vec::len).sum();
                        println!(
                            "{}{label}  id={} splits={} pending_transactions={}",
                            n.file_name,
                            n.id,
                            // Not the sources' own bookkeeping (a Kafka source's
                            // `<topic>@cluster:<id>`).
                            e.checkpoint
                                .positions
                                .0
                                .keys()
                                .filter(|split| !split.contains('@'))
                                .count(),
                            pending
                        );
                    }
                    Err(problem) => println!("{}{label}  UNREADABLE: {}", n.file_name, problem.kind),
                }
            }
        }
        if listed == 0 {
            println!("no checkpoints in {}", ops::redact::redact(&store.location()));
        }
        anyhow::Ok(())
    })
}
