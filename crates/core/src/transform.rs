//! Transforms: a stage between a pipeline's source and its sink (see
//! [`Transform`]).

use std::fmt;
use std::sync::Arc;

use crate::error::{BoxError, ConnectorError};
use crate::record::Record;
use crate::split_name::SplitName;

/// Why a transform could not handle a record: a message, and the error
/// that caused it when there is one.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct TransformError {
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl TransformError {
    /// An error saying what is wrong with the record.
    pub fn new(message: impl ToString) -> Self {
        TransformError {
            message: message.to_string(),
            source: None,
        }
    }

    /// Keeps `cause` (e.g. a JSON parser's error) as this error's source.
    pub fn caused_by(mut self, cause: impl Into<BoxError>) -> Self {
        self.source = Some(cause.into());
        self
    }
}

/// What a transform's error does to the pipeline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnTransformError {
    /// The pipeline stops with a fatal error naming the transform, the
    /// record and the reason (the default).
    #[default]
    Fail,
    /// The record is skipped, logged at `warn` with the reason and counted
    /// as a transform dead letter.
    DeadLetter,
}

impl OnTransformError {
    /// `fail` / `dead-letter`.
    pub fn as_str(&self) -> &'static str {
        match self {
            OnTransformError::Fail => "fail",
            OnTransformError::DeadLetter => "dead-letter",
        }
    }
}

type MapFn = dyn Fn(Record) -> Result<Record, TransformError> + Send + Sync;
type FilterFn = dyn Fn(&Record) -> Result<bool, TransformError> + Send + Sync;
type FlatMapFn = dyn Fn(Record) -> Result<Vec<Record>, TransformError> + Send + Sync;

#[derive(Clone)]
enum Step {
    Map(Arc<MapFn>),
    Filter(Arc<FilterFn>),
    FlatMap(Arc<FlatMapFn>),
}

impl Step {
    fn kind(&self) -> &'static str {
        match self {
            Step::Map(_) => "map",
            Step::Filter(_) => "filter",
            Step::FlatMap(_) => "flat_map",
        }
    }
}

/// One per-record transform of a pipeline: a stage between its source and
/// its sink that maps, filters or expands each record.
///
/// Transforms run in the source subtask, on every batch the source returns,
/// before the records are routed to the sinks: a region stays a forward
/// chain (nothing is exchanged that was not before) and the positions a
/// checkpoint stores stay the source's own. The source has read a record
/// whatever a transform makes of it, so a record a filter drops still counts
/// as passed: a restart after a checkpoint neither replays it nor skips the
/// records after it.
///
/// # Coordinates
///
/// Every record a transform returns carries the split and offset of the
/// record it was made from: the runtime sets them on each output, whatever
/// the closure put there. Sinks route records by split, fences compare
/// offsets with stored positions and dead letters name `split@offset`, so a
/// transform can change a record's key, value, headers and timestamp but
/// never where it came from.
///
/// A [`Transform::flat_map`] is the one transform whose outputs can share a
/// coordinate: all records made from one input carry its `(split, offset)`.
/// They are emitted together, in the order returned, in the same batch and
/// so in the same checkpoint interval. A sink that keys what it writes on
/// `(split, offset)` — a fence applying only offsets above the last one
/// applied, a primary key made of the Kafka coordinates — would keep one of
/// them and lose the others, so a pipeline with a flat_map is refused unless
/// its sink says several records at one coordinate are safe
/// ([`SinkFactory::accepts_repeated_coordinates`](crate::SinkFactory::accepts_repeated_coordinates)).
///
/// # Errors
///
/// A transform returns a [`TransformError`] for a record it cannot handle.
/// What happens then is the transform's [`OnTransformError`]: by default the
/// pipeline stops with a fatal error naming the transform and the record;
/// with [`OnTransformError::DeadLetter`] the record is skipped, logged at
/// `warn` with the transform, its coordinates and the reason, and counted in
/// [`MetricsSnapshot::transform_dead_letters`](crate::MetricsSnapshot::transform_dead_letters).
/// Nothing is dropped silently: records a filter drops are counted in
/// [`MetricsSnapshot::records_filtered`](crate::MetricsSnapshot::records_filtered).
///
/// # Identity
///
/// `name` is the transform's identity: it goes into the pipeline's
/// fingerprint (with the kind and the error policy), so a checkpoint taken
/// with other transforms is not resumed without
/// `allow_fingerprint_change`. Name a transform after what it does, and
/// give it a new name when what it does changes.
#[derive(Clone)]
pub struct Transform {
    name: String,
    step: Step,
    on_error: OnTransformError,
}

impl fmt::Debug for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transform")
            .field("kind", &self.step.kind())
            .field("name", &self.name)
            .field("on_error", &self.on_error)
            .finish()
    }
}

impl Transform {
    fn new(name: impl Into<String>, step: Step) -> Self {
        Transform {
            name: name.into(),
            step,
            on_error: OnTransformError::Fail,
        }
    }

    /// Replaces each record with what `f` makes of it: one record in, one
    /// out. The output keeps the input's split and offset (the runtime sets
    /// them); everything else is `f`'s.
    pub fn map(
        name: impl Into<String>,
        f: impl Fn(Record) -> Result<Record, TransformError> + Send + Sync + 'static,
    ) -> Self {
        Transform::new(name, Step::Map(Arc::new(f)))
    }

    /// Keeps the records for which `f` answers `true`. A dropped record is
    /// counted in `records_filtered`; its offset still counts as passed, so
    /// it is neither replayed nor waited for after a restart.
    pub fn filter(
        name: impl Into<String>,
        f: impl Fn(&Record) -> Result<bool, TransformError> + Send + Sync + 'static,
    ) -> Self {
        Transform::new(name, Step::Filter(Arc::new(f)))
    }

    /// Replaces each record with the records `f` returns, in that order
    /// (none drops it, counted in `records_filtered` like a filter's).
    ///
    /// **Contract.** Every output carries the input's split and offset (the
    /// runtime sets them on each, whatever `f` put there); the outputs of
    /// one input are emitted together, in one batch, so one checkpoint
    /// interval holds all of them or none, and a replay after a restart
    /// makes them again, all of them. Several records then share one
    /// `(split, offset)`: a pipeline with a flat_map is refused
    /// ([`Pipeline::with_transforms`](crate::Pipeline::with_transforms))
    /// unless its sink declares it keys on something else
    /// ([`SinkFactory::accepts_repeated_coordinates`](crate::SinkFactory::accepts_repeated_coordinates));
    /// a sink that keys rows or fences on the coordinates would keep one
    /// output of each input and lose the rest. To tell the outputs apart
    /// downstream, put what distinguishes them in the key, the value or a
    /// header (e.g. the output's index).
    pub fn flat_map(
        name: impl Into<String>,
        f: impl Fn(Record) -> Result<Vec<Record>, TransformError> + Send + Sync + 'static,
    ) -> Self {
        Transform::new(name, Step::FlatMap(Arc::new(f)))
    }

    /// Sets what an error of this transform does (default
    /// [`OnTransformError::Fail`]).
    pub fn on_error(mut self, policy: OnTransformError) -> Self {
        self.on_error = policy;
        self
    }

    /// The name given at creation.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is a [`flat_map`](Self::flat_map), whose outputs can
    /// share a coordinate.
    pub fn is_flat_map(&self) -> bool {
        matches!(self.step, Step::FlatMap(_))
    }

    /// Runs this transform alone on `record` as the runtime does: what it
    /// makes of it (none for a record a filter drops), each output with
    /// the input's split and offset. For testing a transform; the error is
    /// the transform's own (what it does to a pipeline is the
    /// [`on_error`](Self::on_error) policy's).
    pub fn apply(&self, record: Record) -> Result<Vec<Record>, TransformError> {
        let (split, offset) = (record.split.clone(), record.offset);
        let mut outputs = match &self.step {
            Step::Map(f) => vec![f(record)?],
            Step::Filter(f) => match f(&record)? {
                true => vec![record],
                false => Vec::new(),
            },
            Step::FlatMap(f) => f(record)?,
        };
        for output in &mut outputs {
            output.split = split.clone();
            output.offset = offset;
        }
        Ok(outputs)
    }

    /// What the pipeline's fingerprint holds of this transform:
    /// `<kind>:<name>`, with `,on_error=dead-letter` when so set.
    pub fn identity(&self) -> String {
        match self.on_error {
            OnTransformError::Fail => format!("{}:{}", self.step.kind(), self.name),
            other => format!("{}:{},on_error={}", self.step.kind(), self.name, other.as_str()),
        }
    }
}

/// What applying the transforms to a batch dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Records a filter (or a flat_map returning nothing) dropped.
    pub(crate) filtered: u64,
    /// Records skipped after a transform error (`dead-letter`).
    pub(crate) dead_letters: u64,
}

/// The transforms of a pipeline, in order, as the source subtasks run them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Chain {
    steps: Arc<[Transform]>,
}

impl Chain {
    pub(crate) fn new(steps: Vec<Transform>) -> Self {
        Chain { steps: steps.into() }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    pub(crate) fn steps(&self) -> &[Transform] {
        &self.steps
    }

    /// Runs every record of `records` through the transforms, in order:
    /// what comes out, and what was dropped in `tally`. A transform's error
    /// under [`OnTransformError::Fail`] is a fatal [`ConnectorError`].
    pub(crate) fn apply(&self, records: Vec<Record>, tally: &mut Tally) -> Result<Vec<Record>, ConnectorError> {
        if self.steps.is_empty() {
            return Ok(records);
        }
        let mut out = Vec::with_capacity(records.len());
        for record in records {
            self.run(0, record, &mut out, tally)?;
        }
        Ok(out)
    }

    /// Runs `record` through the transforms from `from` on, into `out`.
    fn run(
        &self,
        from: usize,
        mut record: Record,
        out: &mut Vec<Record>,
        tally: &mut Tally,
    ) -> Result<(), ConnectorError> {
        for (i, transform) in self.steps.iter().enumerate().skip(from) {
            let (split, offset) = (record.split.clone(), record.offset);
            match &transform.step {
                Step::Map(f) => match f(record) {
                    Ok(mut mapped) => {
                        mapped.split = split;
                        mapped.offset = offset;
                        record = mapped;
                    }
                    Err(e) => return failed(transform, &split, offset, e, tally),
                },
                Step::Filter(f) => match f(&record) {
                    Ok(true) => {}
                    Ok(false) => {
                        tally.filtered += 1;
                        return Ok(());
                    }
                    Err(e) => return failed(transform, &split, offset, e, tally),
                },
                Step::FlatMap(f) => match f(record) {
                    Ok(outputs) => {
                        if outputs.is_empty() {
                            tally.filtered += 1;
                        }
                        for mut output in outputs {
                            output.split = split.clone();
                            output.offset = offset;
                            self.run(i + 1, output, out, tally)?;
                        }
                        return Ok(());
                    }
                    Err(e) => return failed(transform, &split, offset, e, tally),
                },
            }
        }
        out.push(record);
        Ok(())
    }
}

/// `transform` failed on the record at `split@offset`: a fatal error, or a
/// counted and logged dead letter.
fn failed(
    transform: &Transform,
    split: &SplitName,
    offset: i64,
    error: TransformError,
    tally: &mut Tally,
) -> Result<(), ConnectorError> {
    match transform.on_error {
        OnTransformError::Fail => Err(ConnectorError::fatal(
            format!("transform `{}`", transform.name),
            format!(
                "record {split}@{offset}: {error}. Fix: correct the record or the transform, or set the transform's \
                 on_error to dead-letter to count and skip such records"
            ),
        )
        .caused_by(error)),
        OnTransformError::DeadLetter => {
            tracing::warn!(transform = %transform.name, %split, offset, error = %crate::error::ErrorChain(&error),
                "transform failed on a record: skipped as a dead letter");
            tally.dead_letters += 1;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(range: std::ops::Range<i64>) -> Vec<Record> {
        range.map(|o| Record::new("s-0", o, o.to_string())).collect()
    }

    fn number(r: &Record) -> i64 {
        std::str::from_utf8(r.value_bytes().unwrap()).unwrap().parse().unwrap()
    }

    #[test]
    fn transforms_run_in_order_and_outputs_keep_their_inputs_coordinates() {
        let chain = Chain::new(vec![
            Transform::filter("even", |r| Ok(number(r) % 2 == 0)),
            Transform::map("moved", |r| {
                // A closure that builds a new record somewhere else.
                let value = format!("x{}", number(&r));
                Ok(Record::new("elsewhere", 99, value))
            }),
            Transform::flat_map("twice", |r| Ok(vec![r.clone(), r.with_key("second")])),
        ]);
        let mut tally = Tally::default();
        let out = chain.apply(batch(0..5), &mut tally).unwrap();
        let seen: Vec<(String, i64, String, bool)> = out
            .iter()
            .map(|r| {
                (
                    r.split.to_string(),
                    r.offset,
                    String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap(),
                    r.key.is_some(),
                )
            })
            .collect();
        let expected: Vec<(String, i64, String, bool)> = [0i64, 2, 4]
            .iter()
            .flat_map(|o| [false, true].map(|k| ("s-0".to_string(), *o, format!("x{o}"), k)))
            .collect();
        assert_eq!(seen, expected);
        assert_eq!(
            tally,
            Tally {
                filtered: 2,
                dead_letters: 0
            }
        );
    }

    #[test]
    fn a_failing_transform_stops_the_pipeline_naming_it_and_the_record_unless_it_dead_letters() {
        let bad = |r: Record| {
            if number(&r) == 3 {
                Err(TransformError::new("three is not allowed").caused_by(std::fmt::Error))
            } else {
                Ok(r)
            }
        };
        let fatal = Chain::new(vec![Transform::map("no-threes", bad)]);
        let error = fatal.apply(batch(0..5), &mut Tally::default()).unwrap_err();
        assert!(!error.is_retriable());
        let text = error.to_string();
        for part in ["transform `no-threes`", "s-0@3", "three is not allowed", "dead-letter"] {
            assert!(text.contains(part), "`{part}` missing from {text}");
        }
        assert!(std::error::Error::source(&error).is_some(), "the cause is kept");

        let counted = Chain::new(vec![
            Transform::map("no-threes", bad).on_error(OnTransformError::DeadLetter)
        ]);
        let mut tally = Tally::default();
        let out = counted.apply(batch(0..5), &mut tally).unwrap();
        assert_eq!(out.iter().map(|r| r.offset).collect::<Vec<_>>(), [0, 1, 2, 4]);
        assert_eq!(
            tally,
            Tally {
                filtered: 0,
                dead_letters: 1
            }
        );
    }

    #[test]
    fn a_flat_map_with_no_output_counts_as_filtered_and_identities_name_kind_and_policy() {
        let chain = Chain::new(vec![Transform::flat_map("none", |_| Ok(Vec::new()))]);
        let mut tally = Tally::default();
        assert!(chain.apply(batch(0..3), &mut tally).unwrap().is_empty());
        assert_eq!(tally.filtered, 3);
        assert_eq!(Transform::map("m", Ok).identity(), "map:m");
        assert_eq!(
            Transform::filter("f", |_| Ok(true))
                .on_error(OnTransformError::DeadLetter)
                .identity(),
            "filter:f,on_error=dead-letter"
        );
        let double = Transform::flat_map("x", |r| Ok(vec![Record::new("y", 0, "a"), r]));
        assert!(double.is_flat_map());
        let out = double.apply(Record::new("s-0", 4, "b")).unwrap();
        assert!(out.iter().all(|r| r.split == "s-0" && r.offset == 4) && out.len() == 2);
    }
}
