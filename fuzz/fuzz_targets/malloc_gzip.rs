//! Fuzz target: libtracemalloc text traces in gzip: a gzip input (the seeds) is loaded as it is, so headers,
//! blocks and trailers are fuzzed; any other input is compressed first, so the text behind a
//! valid stream is fuzzed too.
#![no_main]
use allocview_fuzz::run;
use allocview_loaders::fuzzing::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| run(Target::MallocGzip, data));
