//! Fuzz target: JSON graph plans, then the buffers the planners take.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::GraphJson, data));
