//! The fuzz targets' one step: the input becomes the file a loader reads
//! (`allocview_loaders::fuzzing::file_bytes`), a file of this process's in a scratch folder
//! the fuzzing processes share, and is loaded and carried on into the statistics
//! (`allocview_loaders::fuzzing::exercise`). An error is a fine outcome; a panic, a hang or a
//! blow-up is a finding.

use std::path::PathBuf;

use allocview_loaders::fuzzing::{Target, exercise, file_bytes};

/// Runs `target` on one input.
pub fn run(target: Target, data: &[u8]) {
    // One folder for every fuzzing process, a file of this process's in it, removed after each
    // input: libFuzzer exits without a hook to clean up, and a folder per process had piled up
    // (ten a CI run). An input that crashes leaves its file; libFuzzer keeps its own copy.
    let dir: PathBuf = std::env::temp_dir().join("allocview-fuzz");
    // A failure to write the scratch file is the machine's problem, not a finding.
    if std::fs::create_dir_all(&dir).is_err() {
        std::process::abort();
    }
    let path = dir.join(format!("{}-{}", std::process::id(), target.file_name()));
    if std::fs::write(&path, file_bytes(target, data)).is_err() {
        std::process::abort();
    }
    std::hint::black_box(exercise(target, &path));
    std::fs::remove_file(&path).ok();
}
