//! Fuzz target: PyTorch memory snapshots: the pickle decoder, the snapshot model and the rebuilt tables.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::Pickle, data));
