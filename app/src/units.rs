//! Parsing byte sizes given on the command line: the simulator's parser, shared with policy
//! parameters (`bfc:limit=2GiB`).

pub use allocview_sim::units::parse_bytes;
