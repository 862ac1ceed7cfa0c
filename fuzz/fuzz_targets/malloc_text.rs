//! Fuzz target: libtracemalloc text traces (plain), both strictness modes, then the statistics.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::MallocText, data));
