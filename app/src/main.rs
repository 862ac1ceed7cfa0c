//! `allocview`: explore memory-allocation traces and replay them through allocator policies.
//!
//! The commands, models and frontends live in the library (`lib.rs`); this is the command line.

#[cfg(feature = "gui")]
use allocview::gui;
use allocview::{cmd, safe_write, tui};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Explore memory-allocation traces and replay them through allocator policies.
///
/// `allocview FILE` opens the terminal explorer: a timeline of live bytes and each policy's
/// footprint, the heap map at the cursor, size classes and the events around it. Inputs are
/// recognised by content: libtracemalloc text traces, plain or gzip.
#[derive(Debug, Parser)]
#[command(name = "allocview", version, about, long_about = None)]
#[command(args_conflicts_with_subcommands = true)]
#[command(after_help = "Examples:
  allocview sample-traces/xz_T2_8KiB_blocks.trace.gz         explore in the terminal
  allocview stats sample-traces/find_usr_include.trace.gz    summary table
  allocview stats trace.gz --json                            summary for scripts
  allocview compare trace.gz --policy bfc,first-fit,buddy --limit 512MiB")]
struct Cli {
    /// A trace to open in the terminal explorer.
    file: Option<PathBuf>,
    /// Open the explorer at this event: an event number, a time (`1.5s`) or `peak`.
    #[arg(long, value_name = "WHERE")]
    goto: Option<String>,
    /// Follow a trace that `allocview record` is still writing: the explorer shows the run as
    /// it happens (`F` follows the newest event again after the cursor was moved).
    #[arg(long)]
    follow: bool,
    #[command(flatten)]
    policies: allocview::session::PolicyArgs,
    #[command(flatten)]
    input: allocview::session::InputArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Summarise a trace: events, threads, peak and final live bytes, size classes.
    Stats(cmd::stats::StatsArgs),
    /// Replay a trace through allocator policies and compare footprint, fragmentation and OOMs.
    Compare(cmd::compare::CompareArgs),
    /// The settings of the input's allocator (PyTorch's, TensorFlow's BFC, glibc's) that make
    /// it fit under a limit, found by a search over the family's keys, each with the line to set.
    Tune(cmd::tune::TuneArgs),
    /// Open the desktop explorer (several files are overlaid on one timeline).
    #[cfg(feature = "gui")]
    Gui(gui::GuiArgs),
    /// Write CSVs and PNG charts (timeline, fragmentation, size classes, heap maps) to a folder.
    Report(cmd::report::ReportArgs),
    /// Measure allocview itself (load, replay, explorer seek and redraw) and print figures.
    Bench(cmd::bench::BenchArgs),
    /// Run a command under the malloc tracer and write its trace (one file per process).
    Record(cmd::record::RecordArgs),
    /// Start or stop recording in a process `record` runs, or put a named mark in its trace.
    Ctl(cmd::ctl::CtlArgs),
    /// Record a running process started without allocview (through ptrace), for a while or
    /// until Ctrl-C, and detach leaving it running (x86-64 Linux).
    Attach(cmd::attach::AttachArgs),
    /// Convert a trace between the text form and allocview's binary form, losslessly, or write
    /// an input's tables as Parquet (`OUT.parquet`).
    Convert(cmd::convert::ConvertArgs),
    /// Write a binary trace of exactly N records spliced from copies of real traces (shifted
    /// in time and address), streaming: for benchmarks on traces larger than memory.
    Splice(cmd::splice::SpliceArgs),
    /// Plan buffers with known lifetimes (a minimalloc CSV, a JSON graph plan, a trace or a TF
    /// memory log) with static planners, against the lower bound.
    Plan(cmd::plan::PlanArgs),
    /// Live bytes and allocations by allocation site at a moment (the stack, function or
    /// module that asked), and the free space each site's blocks pin in a policy's heap.
    Sites(cmd::sites::SitesArgs),
    /// What is live at the end, by site, told apart as leaks (still growing) or caches.
    Leaks(cmd::sites::LeaksArgs),
    /// A flame graph (SVG, or folded stacks) of live or allocated bytes by call stack.
    Flamegraph(cmd::sites::FlamegraphArgs),
    /// Write an input in another tool's format: pprof (`go tool pprof`, Pyroscope), speedscope,
    /// a Chrome trace (Perfetto) or DHAT's JSON (`dh_view`).
    Export(cmd::export::ExportArgs),
    /// Compare two runs: peak live bytes, footprint per policy, and bytes by site.
    Diff(cmd::diff::DiffArgs),
    /// Simulate spilling to disk under a memory limit: bytes spilled and reloaded per eviction
    /// policy, against OS swap and the lower bound (`--sweep`: the curve over limits, as PNG).
    Spill(cmd::spill::SpillArgs),
    /// How predictable the allocation stream is: baselines and order-1..K context models on
    /// the libtracemalloc article's tokens (split, online, cross-run), and the lifetime
    /// predictor of the `predictive` policy.
    Predict(cmd::predict::PredictArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match (cli.command, cli.file) {
        (Some(Command::Stats(args)), _) => cmd::stats::run(&args),
        (Some(Command::Compare(args)), _) => cmd::compare::run(&args),
        (Some(Command::Tune(args)), _) => cmd::tune::run(&args),
        (Some(Command::Bench(args)), _) => cmd::bench::run(&args),
        (Some(Command::Report(args)), _) => cmd::report::run(&args),
        #[cfg(feature = "gui")]
        (Some(Command::Gui(args)), _) => {
            refuse_screenshot_over_input(&args).and_then(|()| gui::run(&args))
        }
        (Some(Command::Record(args)), _) => match cmd::record::run(&args) {
            // The recorded command's own status, once its traces are written.
            Ok(code) if code != 0 => return ExitCode::from(code),
            other => other.map(|_| ()),
        },
        (Some(Command::Ctl(args)), _) => cmd::ctl::run(&args),
        (Some(Command::Attach(args)), _) => cmd::attach::run(&args),
        (Some(Command::Convert(args)), _) => cmd::convert::run(&args),
        (Some(Command::Spill(args)), _) => cmd::spill::run(&args),
        (Some(Command::Splice(args)), _) => cmd::splice::run(&args),
        (Some(Command::Plan(args)), _) => cmd::plan::run(&args),
        (Some(Command::Sites(args)), _) => cmd::sites::run_sites(&args),
        (Some(Command::Export(args)), _) => cmd::export::run(&args),
        (Some(Command::Leaks(args)), _) => cmd::sites::run_leaks(&args),
        (Some(Command::Flamegraph(args)), _) => cmd::sites::run_flamegraph(&args),
        (Some(Command::Predict(args)), _) => cmd::predict::run(&args),
        (Some(Command::Diff(args)), _) => match cmd::diff::run(&args) {
            // The CI gate: the report is printed, the status says it failed.
            Ok(true) => return ExitCode::from(1),
            other => other.map(|_| ()),
        },
        (None, Some(file)) => {
            let launch = allocview::model::state::Launch {
                goto: cli.goto,
                follow: cli.follow.then(allocview::model::live::Follow::default),
            };
            explore(&file, &cli.policies, &cli.input, launch)
        }
        (None, None) => {
            eprintln!("usage: allocview FILE  (or allocview --help)");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `allocview stats ... | head`: the reader has gone; that is not an error.
        Err(err)
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `gui --screenshot PNG` must not replace one of the files it shows.
#[cfg(feature = "gui")]
fn refuse_screenshot_over_input(args: &gui::GuiArgs) -> anyhow::Result<()> {
    if let Some(shot) = &args.screenshot {
        for file in &args.files {
            safe_write::refuse_if_same_file(file, shot)?;
        }
    }
    Ok(())
}

fn explore(
    file: &std::path::Path,
    policies: &allocview::session::PolicyArgs,
    input: &allocview::session::InputArgs,
    launch: allocview::model::state::Launch,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    // Fail before taking over the terminal when the file cannot even be opened (a followed
    // run's file may not be there yet).
    if launch.follow.is_none() {
        std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    } else {
        allocview::model::live::check_follow(input).map_err(anyhow::Error::msg)?;
    }
    let (names, real) = policies.explorer_specs_and_real(Some(file))?;
    let config = policies.config()?;
    let jobs = policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    tui::run(file, &names, &real, config, input, jobs, launch)
}
