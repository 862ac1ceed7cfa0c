//! Fuzz target: TensorFlow `__LOG_MEMORY__` logs, then their warnings.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::TfMemlog, data));
