//! Headless subcommands: each prints a table for people or JSON for scripts.

pub mod bench;
pub mod compare;
pub mod convert;
pub mod load;
pub mod record;
pub mod stats;
