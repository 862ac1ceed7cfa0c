//! What allocview works out from a loaded input, as opposed to reading it: the formats' parsers
//! live in their own folders, and this is where their tables are studied.
//!
//! - [`stats`]: whole-trace statistics (`allocview stats`), and the running ones of a recording;
//! - [`site_stats`]: memory by allocation site (live bytes, growth, folded stacks);
//! - [`profile_sites`]: the same of a heap profile's samples;
//! - [`sampling`]: the weights of allocations whose stacks were sampled by bytes;
//! - [`tf_fidelity`]: the `bfc` policy replayed against a TensorFlow memory log, every
//!   allocation's address and chunk size checked against TensorFlow's.

pub mod profile_sites;
pub mod sampling;
pub mod site_stats;
pub mod stats;
pub mod tf_fidelity;
