//! `allocview`: explore memory-allocation traces and replay them through allocator policies.
//!
//! This binary holds the command line (`cmd/`), shared formatting (`format`) and, later, the
//! view-model and the frontends. Domain logic lives in `allocview_sim` and `allocview_loaders`.

mod cmd;
mod format;
mod progress;
mod units;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Explore memory-allocation traces and replay them through allocator policies.
///
/// Inputs are recognised by content: libtracemalloc text traces (plain or gzip).
#[derive(Debug, Parser)]
#[command(name = "allocview", version, about, long_about = None)]
#[command(
    after_help = "Examples:\n  allocview stats sample-traces/find_usr_include.trace.gz\n  \
                        allocview stats trace.gz --json"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Summarise a trace: events, threads, peak and final live bytes, size classes.
    Stats(cmd::stats::StatsArgs),
    /// Replay a trace through allocator policies and compare footprint, fragmentation and OOMs.
    Compare(cmd::compare::CompareArgs),
    /// Run a command under the malloc tracer and write its trace (one file per process).
    Record(cmd::record::RecordArgs),
    /// Convert a trace between the text form and allocview's binary form, losslessly.
    Convert(cmd::convert::ConvertArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Stats(args) => cmd::stats::run(&args),
        Command::Compare(args) => cmd::compare::run(&args),
        Command::Record(args) => cmd::record::run(&args),
        Command::Convert(args) => cmd::convert::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
