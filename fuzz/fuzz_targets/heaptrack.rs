//! Fuzz target: heaptrack data files: the input is loaded as it is (plain text, or a gzip or zstd
//! stream: the seeds are plain heads of real files), in both strictness modes, then the
//! statistics, the sites' lines and a replay.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::Heaptrack, data));
