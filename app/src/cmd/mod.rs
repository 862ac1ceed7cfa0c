//! Headless subcommands: each prints a table for people or JSON for scripts.

/// `println!` that returns the write error instead of panicking, so `allocview stats | head`
/// ends quietly when the pipe closes (`main` treats a broken pipe as success).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?;
    }};
}

pub mod bench;
mod bench_hops;
pub mod compare;
pub mod convert;
pub mod convert_parquet;
pub mod diff;
pub mod flamegraph_svg;
pub mod load;
pub mod min_limit;
pub mod plan;
pub mod predict;
mod predict_stream;
pub mod record;
pub mod record_limit;
pub mod report;
pub mod report_heapmap;
pub mod runs;
pub mod sites;
pub mod spill;
pub mod spill_plot;
pub mod spill_units;
pub mod splice;
pub mod stats;
pub mod stats_pytorch;
pub mod stream;
mod stream_oracle;
pub mod stream_report;
pub mod stream_source;
pub mod window;
