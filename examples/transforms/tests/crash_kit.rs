//! The example pipeline with transforms under the crash kit: after SIGKILLs
//! at every crash point of the runtime, the committed output is exactly
//! what the transforms make of the source — filtered records neither
//! replayed nor waited for, a flat_map's two outputs of one input both
//! there, once.

use std::process::Command;

use exactly_crash_kit::{Case, CrashMatrix};
use exactly_example_transforms::{expected_lines, NAME};

#[test]
fn the_transformed_output_is_exactly_once_under_the_crash_matrix() {
    CrashMatrix::new(
        expected_lines(),
        |case: &Case| {
            let mut run = Command::new(env!("CARGO_BIN_EXE_transforms-pipeline"));
            run.arg(case.dir.join("out"))
                .arg(&case.checkpoints)
                .arg(case.guarantee.as_str());
            run
        },
        |case: &Case| exactly_file::read_committed_lines_of(&case.dir.join("out"), NAME).map_err(|e| e.to_string()),
    )
    .random_kills(
        2,
        std::time::Duration::from_millis(200)..std::time::Duration::from_millis(1200),
    )
    .run();
}
