//! The command line's subcommands, one file or folder each: each parses its own arguments,
//! asks the session ([`crate::session`]) and the answers ([`crate::answers`]) for its figures,
//! and prints a table for people or JSON for scripts, or writes files. Nothing outside `main.rs`
//! imports this folder, and no command imports another.

/// `println!` that returns the write error instead of panicking, so `allocview stats | head`
/// ends quietly when the pipe closes (`main` treats a broken pipe as success).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?;
    }};
}

pub mod attach;
pub mod bench;
pub mod compare;
pub mod convert;
pub mod ctl;
pub mod diff;
pub mod export;
pub mod plan;
pub mod predict;
pub mod record;
pub mod report;
pub mod sites;
pub mod spill;
pub mod splice;
pub mod stats;
pub mod tune;
