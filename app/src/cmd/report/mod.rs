//! `allocview report FILE [--policy ...] --out DIR`: CSVs and PNG charts for a bug report or a
//! paper, without any UI. CSVs are written through polars; charts are drawn with plotters.
//! `--html OUT.html`: one self-contained page of the same figures ([`crate::html`]).

mod charts;
mod heapmap;
mod streamed;
mod write;

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

use allocview_loaders::Requests;

use crate::answers::report;
use crate::session::InputArgs;
use crate::session::PolicyArgs;
use crate::session::StreamArgs;
use crate::session::input::{load_input, note_requests, require_events};
use write::{Destination, Gathered, write_report};

/// Arguments of `allocview report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The trace to report on.
    pub file: PathBuf,
    #[command(flatten)]
    pub policies: PolicyArgs,
    /// Directory to write the CSVs and charts into (created if missing).
    #[arg(long, value_name = "DIR", required_unless_present = "html")]
    pub out: Option<PathBuf>,
    /// Write one self-contained HTML page (data, script and styles inside; opens offline in
    /// a browser) with the summary, timeline, heap maps, sites, flame graph and size classes.
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<PathBuf>,
    /// Also write each CSV's table as Parquet beside it (`summary.parquet`, `timeline.parquet`,
    /// `classes.parquet`).
    #[arg(long)]
    pub parquet: bool,
    /// Chart size in pixels, width x height (320x240 to 8192x8192).
    #[arg(long, default_value = "1200x700")]
    pub size: String,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub stream: StreamArgs,
}

impl ReportArgs {
    fn destination<'a>(&'a self, out: &'a std::path::Path) -> Destination<'a> {
        Destination {
            file: &self.file,
            out,
            parquet: self.parquet,
        }
    }
}

/// Runs `allocview report`.
pub fn run(args: &ReportArgs) -> Result<()> {
    let size = chart_size(&args.size)?;
    let (specs, real_specs) = args.policies.specs_and_real()?;
    // The policies replay what the process held: what reached the C library.
    let input = args.input.with_default_requests(Requests::Libc);
    if args.stream.applies(&args.file, &args.input)? {
        if let Some(r) = real_specs.first() {
            bail!(
                "{} replays the trace's calls from memory: it needs the trace loaded, not \
                 streamed (leave out --stream, or take a window with --from/--to/--events)",
                r.label
            );
        }
        let dest = args.out.as_deref().map(|out| args.destination(out));
        return streamed::run(
            &args.file,
            &args.policies,
            &args.input.window,
            input.requests_or(Requests::Libc),
            input.heap_id(&args.file)?,
            &streamed::Outputs {
                dest: dest.as_ref(),
                html: args.html.as_deref(),
                size,
            },
            &specs,
        );
    }
    let loaded = load_input(&args.file, &input)?;
    if let (Some(html), None, allocview_loaders::Loaded::TfBfcDump(dump)) =
        (&args.html, &args.out, &loaded)
    {
        // A dump is a heap at one moment: no events to replay, its own page.
        let run = crate::html::dump_run(&args.file, dump);
        return write_html(html, &args.file, run);
    }
    note_requests(&args.file, &loaded, input.requests_or(Requests::Libc));
    let ev = require_events(&loaded, &args.file, "report")?;
    let view = allocview_loaders::trace_view(ev.events, &args.file)?;
    let r = report::replay(&args.file, &loaded, &view, &args.policies)?;
    let done = report::replayed(&r.runs, !r.real.is_empty())?;
    let heaps = if view.is_empty() {
        // Nothing was replayed, so there is no moment to draw a heap at.
        eprintln!("note: the trace has no events: no heap maps");
        Vec::new()
    } else {
        report::states_at(&done, &view, r.peak_event, r.jobs)?
    };
    let g = Gathered {
        done,
        real: r
            .real
            .into_iter()
            .map(|(row, series)| write::Real { row, series })
            .collect(),
        classes: r.classes,
        max_live: r.max_live,
        peak_event: r.peak_event,
        heaps,
    };
    if let Some(out) = &args.out {
        write_report(&args.destination(out), size, &g)?;
    }
    if let Some(html) = &args.html {
        let real: Vec<_> = g.real.iter().map(|r| (&r.row, &r.series)).collect();
        let run = crate::html::build_run(&crate::html::RunInput {
            path: &args.file,
            loaded: &loaded,
            view: &view,
            replays: &g.done,
            real: &real,
            classes: &g.classes,
            peak_heaps: &g.heaps,
            peak_event: g.peak_event,
        })?;
        write_html(html, &args.file, run)?;
    }
    Ok(())
}

/// Writes the page of `run` (read from `file`) to `out`.
pub(super) fn write_html(
    out: &std::path::Path,
    file: &std::path::Path,
    run: crate::html::Run,
) -> Result<()> {
    let title = format!("allocview report: {}", crate::html::file_label(file));
    let page = crate::html::Page::new("report", title, vec![run]);
    let size_bytes = crate::html::write(out, &page, &[file])?;
    outln!(
        "wrote {} ({})",
        out.display(),
        crate::format::bytes(size_bytes)
    );
    Ok(())
}

/// The smallest chart `--size` takes: below it the charts' fixed margins, labels and colour
/// bar leave no room to draw in (a height of 100 pixels or less made the class chart's colour
/// bar loop over a wrapped height).
const MIN_CHART_SIZE: (u32, u32) = (320, 240);
/// The largest: a chart is one bitmap of 3 bytes a pixel (8192 x 8192 is 192 MiB).
const MAX_CHART_SIDE: u32 = 8192;

/// `--size`, width x height, within [`MIN_CHART_SIZE`] and [`MAX_CHART_SIDE`].
fn chart_size(text: &str) -> Result<(u32, u32)> {
    let (w, h) = text
        .split_once('x')
        .and_then(|(w, h)| Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?)))
        .context("--size must look like 1200x700")?;
    let (min_w, min_h) = MIN_CHART_SIZE;
    if !(min_w..=MAX_CHART_SIDE).contains(&w) || !(min_h..=MAX_CHART_SIDE).contains(&h) {
        bail!(
            "--size {text}: charts are {min_w}x{min_h} to {MAX_CHART_SIDE}x{MAX_CHART_SIDE} pixels"
        );
    }
    Ok((w, h))
}
