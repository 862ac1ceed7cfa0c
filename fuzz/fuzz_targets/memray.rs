//! Fuzz target: memray captures: the LZ4 frame, the header, the record stream and its stacks.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::Memray, data));
