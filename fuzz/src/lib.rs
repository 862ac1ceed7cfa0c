//! The fuzz targets' one step: the input becomes the file a loader reads
//! (`allocview_loaders::fuzzing::file_bytes`), in a scratch folder of this process, and is
//! loaded and carried on into the statistics (`allocview_loaders::fuzzing::exercise`). An
//! error is a fine outcome; a panic, a hang or a blow-up is a finding.

use std::path::PathBuf;

use allocview_loaders::fuzzing::{Target, exercise, file_bytes};

/// Runs `target` on one input.
pub fn run(target: Target, data: &[u8]) {
    let dir: PathBuf = std::env::temp_dir().join(format!("allocview-fuzz-{}", std::process::id()));
    // A failure to write the scratch file is the machine's problem, not a finding.
    if std::fs::create_dir_all(&dir).is_err() {
        std::process::abort();
    }
    let path = dir.join(target.file_name());
    if std::fs::write(&path, file_bytes(target, data)).is_err() {
        std::process::abort();
    }
    std::hint::black_box(exercise(target, &path));
}
