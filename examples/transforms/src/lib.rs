//! Example of exactly's Rust API: a pipeline with transforms between its
//! source and its sink.
//!
//! A sequence source (records `seq-<split>:<offset>`) → a filter dropping
//! the records whose offset is a multiple of 3 → a map upper-casing the
//! value → a flat_map turning each record whose offset is a multiple of 5
//! into two (`…#a`, `…#b`) → the file sink, which accepts several records
//! at one (split, offset) (a flat_map's outputs share their input's).
//!
//! [`pipeline`] builds it; the `transforms-pipeline` binary runs it;
//! [`expected_lines`] computes what the output must hold from the source's
//! definition alone, which the crash test checks after SIGKILLs at every
//! crash point.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use exactly_core::{
    FsCheckpointStore, Guarantee, Pipeline, PipelineConfig, PipelineError, Record, RestartStrategy,
    SequenceSourceFactory, Transform, TransformError,
};
use exactly_file::FileSinkFactory;

/// The pipeline's name (its checkpoint folder, its files' names).
pub const NAME: &str = "transforms-example";

/// The source: 4 splits of 1500 records.
pub fn source() -> SequenceSourceFactory {
    SequenceSourceFactory {
        splits: 4,
        records_per_split: 1500,
        batch: 20,
        delay_per_poll: Duration::from_millis(5),
    }
}

/// The offset a sequence value ends with (`seq-2:41` → 41).
fn offset_in(record: &Record) -> Result<i64, TransformError> {
    let value = std::str::from_utf8(record.value_bytes().unwrap_or_default())
        .map_err(|e| TransformError::new("the value is not UTF-8").caused_by(e))?;
    let (_, offset) = value
        .rsplit_once(':')
        .ok_or_else(|| TransformError::new(format!("`{value}` has no `:<offset>`")))?;
    offset
        .parse()
        .map_err(|e| TransformError::new(format!("`{offset}` is not an offset")).caused_by(e))
}

/// The transforms, in order.
pub fn transforms() -> Vec<Transform> {
    vec![
        Transform::filter("drop-multiples-of-3", |r| Ok(offset_in(r)? % 3 != 0)),
        Transform::map("upper-case", |mut r| {
            let upper = String::from_utf8_lossy(r.value_bytes().unwrap_or_default()).to_uppercase();
            r.value = Some(upper.into());
            Ok(r)
        }),
        // Each output carries the input's split and offset whatever it is
        // built with; what tells the two apart is in the value.
        Transform::flat_map("split-multiples-of-5", |r| {
            if offset_in(&r)? % 5 != 0 {
                return Ok(vec![r]);
            }
            let value = String::from_utf8_lossy(r.value_bytes().unwrap_or_default()).into_owned();
            Ok(vec![
                Record::new(r.split.clone(), r.offset, format!("{value}#a")),
                Record::new(r.split.clone(), r.offset, format!("{value}#b")),
            ])
        }),
    ]
}

/// The lines the output must hold once the source is exhausted, computed
/// from the source's definition without running anything.
pub fn expected_lines() -> Vec<String> {
    let source = source();
    let mut lines = Vec::new();
    for split in 0..source.splits {
        for offset in (0..source.records_per_split).filter(|o| o % 3 != 0) {
            let value = SequenceSourceFactory::value_of(split, offset).to_uppercase();
            if offset % 5 == 0 {
                lines.push(format!("{value}#a"));
                lines.push(format!("{value}#b"));
            } else {
                lines.push(value);
            }
        }
    }
    lines
}

/// The pipeline writing into `out` with its checkpoints under
/// `checkpoints`: parallelism 2, a checkpoint every 50 ms, no restart in
/// the process (whoever runs it restarts it).
pub fn pipeline(out: &Path, checkpoints: &Path, guarantee: Guarantee) -> Result<Pipeline, PipelineError> {
    let mut config = PipelineConfig::new(NAME);
    config.guarantee = guarantee;
    config.parallelism = 2;
    config.checkpoint.interval = Duration::from_millis(50);
    config.restart = RestartStrategy::None;
    let store = FsCheckpointStore::for_pipeline(checkpoints, &config, 3);
    Pipeline::new(
        config,
        Arc::new(source()),
        Arc::new(FileSinkFactory::new(out)),
        Arc::new(store),
    )?
    .with_transforms(transforms())
}
