//! Headless subcommands: each prints a table for people or JSON for scripts.

pub mod compare;
pub mod load;
pub mod stats;
