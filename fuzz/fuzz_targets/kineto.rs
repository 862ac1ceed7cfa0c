//! Fuzz target: PyTorch profiler (Kineto) traces, then the statistics and a replay.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::Kineto, data));
