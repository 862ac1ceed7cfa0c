//! Fuzz target: TensorFlow BFC allocator dumps, then the blocks, stats, BFC state and diagnosis.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::TfDump, data));
