//! Fuzz target: tracer spools: the input is everything after the 10-byte header (written by the target),
//! loaded in both strictness modes (the streams' merge included), then the statistics.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::Spool, data));
