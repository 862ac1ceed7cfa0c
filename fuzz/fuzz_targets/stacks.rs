//! Fuzz target: the binary trace's stack tables (MODULES, LOCATIONS, STACKS, SYMBOLS frames) after an event
//! block naming four stacks: see `allocview_loaders::fuzzing::file_bytes`.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::Stacks, data));
