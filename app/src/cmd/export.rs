//! `allocview export`: an input in another tool's format (pprof, speedscope, Chrome trace,
//! DHAT), for the viewers and backends people already use.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

use crate::export::{ExportQuery, Format, export};
use crate::session::input::load_input;
use crate::session::{InputArgs, PolicyArgs, WindowArgs};

/// Arguments of `allocview export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The input: any file allocview reads.
    pub file: PathBuf,
    /// Where to write.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// The format (`pprof`, `speedscope`, `chrome` or `dhat`; by default the one OUTPUT's name
    /// implies: `.pb.gz`, `.speedscope.json`, `.trace.json`, `.dhat.json`), or, as in every
    /// command, the end of the window to export (a time: see `--from`).
    #[arg(long, value_name = "FORMAT|TIME")]
    pub to: Option<String>,
    /// The moment of a pprof or speedscope export: `peak` (of live bytes), `end`, an event
    /// number, or a time (`1.5s`).
    #[arg(long, default_value = "peak")]
    pub at: String,
    /// Export only the events from this time on: see `allocview stats --help` for times, and
    /// `--to`.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// Export only these events: `A..B`, `A..` or `..B`.
    #[arg(long, value_name = "A..B")]
    pub events: Option<String>,
    /// Skip malformed lines instead of stopping at the first one.
    #[arg(long)]
    pub lenient: bool,
    /// Of a trace recorded in a CPython interpreter, which requests to read (`objects` or
    /// `libc`; default `objects`).
    #[arg(long, value_name = "objects|libc")]
    pub requests: Option<allocview_loaders::Requests>,
    /// Of a PyTorch profiler trace, which device's memory events to read (`cuda:0`, `hip:1`,
    /// `cpu`; default: the GPU with the most events).
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<allocview_loaders::kineto::DeviceChoice>,
    /// Of a trace recorded with `allocview record`, which heap's events to read (`malloc` by
    /// default; `stats` lists a trace's heaps).
    #[arg(long, value_name = "NAME")]
    pub heap: Option<String>,
    /// pprof: keep the frames inside each sample's site (the allocator's, the interpreter's);
    /// by default a stack starts at the frame `sites` names.
    #[arg(long)]
    pub all_frames: bool,
    /// pprof and speedscope: one policy whose allocated bytes (after its rounding) and pinned
    /// free bytes are added; chrome: the policies whose series make the tracks (default:
    /// `compare`'s).
    #[command(flatten)]
    pub policies: PolicyArgs,
}

impl ExportArgs {
    /// The `--to` value when it names a format.
    fn named_format(&self) -> Option<Format> {
        use clap::ValueEnum as _;
        Format::from_str(self.to.as_deref()?, true).ok()
    }

    fn input(&self) -> InputArgs {
        InputArgs {
            lenient: self.lenient,
            requests: self.requests,
            device: self.device,
            heap: self.heap.clone(),
            window: WindowArgs {
                from: self.from.clone(),
                to: self.to.clone().filter(|_| self.named_format().is_none()),
                events: self.events.clone(),
            },
        }
    }
}

/// Runs `allocview export`.
pub fn run(args: &ExportArgs) -> Result<()> {
    if let Some(to) = &args.to
        && args.named_format().is_none()
        && crate::session::window::parse_time_ns(to).is_err()
    {
        bail!(
            "--to {to}: expected a format (pprof, speedscope, chrome or dhat) or the end of a \
             window (a time such as 1.5s or 200ms)"
        );
    }
    let Some(format) = args
        .named_format()
        .or_else(|| Format::from_output_name(&args.output))
    else {
        bail!(
            "{}: say the format with --to pprof|speedscope|chrome|dhat (the name implies none: \
             .pb.gz, .speedscope.json, .trace.json or .dhat.json would)",
            args.output.display()
        );
    };
    crate::safe_write::refuse_if_same_file(&args.file, &args.output)?;
    let input = args.input();
    let loaded = load_input(&args.file, &input)?;
    let query = ExportQuery {
        format,
        at: args.at.clone(),
        policies: args.policies.clone(),
        windowed: input.window.is_set(),
        all_frames: args.all_frames,
    };
    let out = export(&args.file, &loaded, &query)?;
    crate::safe_write::write_bytes(&args.output, &out.bytes, &[args.file.as_path()])
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    outln!(
        "wrote {} ({}, {}): {}",
        args.output.display(),
        format.name(),
        crate::format::bytes(out.bytes.len() as u64),
        out.summary
    );
    Ok(())
}
