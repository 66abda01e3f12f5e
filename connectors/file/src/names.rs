//! The names of the sink's files, and reading them back.
//!
//! One transaction is one file with the stem
//! `part-<pipeline>-<subtask>-<checkpoint>-<run>`: hidden while pending
//! (`.<stem>.pending`), visible once committed (`<stem>.<ext>`). The
//! checkpoint has ten digits, the run is a hex tag, and neither they nor the
//! subtask contain `-`, so a name is parsed from its end and the pipeline is
//! whatever is left, even when the pipeline's name contains `-` itself.
//!
//! Files written before names carried the pipeline,
//! `part-<subtask>-<checkpoint>-<run>`, are still recognised: their
//! [`PartName::pipeline`] is `None`.

/// Prefix of every stem.
const PART: &str = "part";
/// Suffix of a pending file.
const PENDING_SUFFIX: &str = ".pending";

/// What a file name of the sink says about its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PartName {
    /// The pipeline that wrote it; `None` for a name of the older form
    /// without it.
    pub(crate) pipeline: Option<String>,
    /// The sink subtask that wrote it.
    pub(crate) subtask: usize,
    /// The checkpoint whose interval it holds.
    pub(crate) checkpoint: u64,
}

/// `part-<pipeline>-<subtask>-<checkpoint>-<run>`.
pub(crate) fn stem(pipeline: &str, subtask: usize, checkpoint: u64, run: &str) -> String {
    format!("{PART}-{pipeline}-{subtask}-{checkpoint:010}-{run}")
}

/// The hidden name of a pending file of `stem`.
pub(crate) fn pending(stem: &str) -> String {
    format!(".{stem}{PENDING_SUFFIX}")
}

/// The name a committed file of `stem` gets.
pub(crate) fn committed(stem: &str, extension: &str) -> String {
    format!("{stem}.{extension}")
}

/// Reads a pending file's name; `None` when it is not one.
pub(crate) fn parse_pending(name: &str) -> Option<PartName> {
    parse_stem(name.strip_prefix('.')?.strip_suffix(PENDING_SUFFIX)?)
}

/// Reads a committed file's name; `None` when it is not one.
pub(crate) fn parse_committed(name: &str) -> Option<PartName> {
    let (stem, extension) = name.rsplit_once('.')?;
    if extension.is_empty() || extension == &PENDING_SUFFIX[1..] || name.starts_with('.') {
        return None;
    }
    parse_stem(stem)
}

fn parse_stem(stem: &str) -> Option<PartName> {
    let mut fields = stem.rsplitn(4, '-');
    let run = fields.next()?;
    let checkpoint = fields.next()?;
    let subtask = fields.next()?;
    let head = fields.next()?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if run.is_empty() || !digits(checkpoint) || !digits(subtask) {
        return None;
    }
    let pipeline = match head.strip_prefix(PART)? {
        "" => None,
        rest => Some(rest.strip_prefix('-').filter(|p| !p.is_empty())?.to_string()),
    };
    Some(PartName {
        pipeline,
        subtask: subtask.parse().ok()?,
        checkpoint: checkpoint.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(pipeline: Option<&str>, subtask: usize, checkpoint: u64) -> Option<PartName> {
        Some(PartName {
            pipeline: pipeline.map(String::from),
            subtask,
            checkpoint,
        })
    }

    #[test]
    fn names_read_back_whatever_the_pipeline_is_called() {
        for pipeline in ["p", "orders-to-files", "a-0-0000000001-ff", "with.dots", "émoji ok"] {
            let stem = stem(pipeline, 12, 345, "0a1b2c3d");
            assert_eq!(parse_pending(&pending(&stem)), part(Some(pipeline), 12, 345), "{stem}");
            assert_eq!(
                parse_committed(&committed(&stem, "jsonl")),
                part(Some(pipeline), 12, 345),
                "{stem}"
            );
        }
        assert_eq!(
            pending(&stem("p", 0, 7, "r")),
            ".part-p-0-0000000007-r.pending",
            "readable"
        );
    }

    #[test]
    fn names_of_the_older_form_have_no_pipeline() {
        assert_eq!(parse_pending(".part-1-0000000003-0a1b2c3d.pending"), part(None, 1, 3));
        assert_eq!(parse_committed("part-1-0000000003-0a1b2c3d.txt"), part(None, 1, 3));
    }

    #[test]
    fn other_files_are_not_parts() {
        for name in [
            ".exactly-p.lock",
            "part-p-0-0000000003-r",
            ".part-p-0-0000000003-r.txt",
            "part-p-0-0000000003-r.pending",
            ".part-p-x-0000000003-r.pending",
            ".part-p-0-3a-r.pending",
            ".part--0-0000000003-r.pending",
            ".parts-0-0000000003-r.pending",
            "notes.txt",
        ] {
            assert_eq!(parse_pending(name).or_else(|| parse_committed(name)), None, "{name}");
        }
    }
}
