//! Fuzz target: heap profiles, pprof's `profile.proto` (gzipped or not) and DHAT's JSON, told
//! apart by content, then their sites and folded stacks at each moment.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::Profile, data));
