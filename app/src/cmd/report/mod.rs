//! `allocview report FILE [--policy ...] --out DIR`: CSVs and PNG charts for a bug report or a
//! paper, without any UI. CSVs are written through polars; charts are drawn with plotters.
//! `--html OUT.html`: one self-contained page of the same figures ([`crate::html`]).

mod charts;
mod heapmap;
mod streamed;
mod write;

use std::path::PathBuf;

use allocview_sim::classes::ClassSeries;
use allocview_sim::heap::Counters;
use allocview_sim::policy::Policy;
use allocview_sim::replay::Replay;
use anyhow::{Context as _, Result, anyhow, bail};

use allocview_loaders::Requests;

use crate::session::InputArgs;
use crate::session::PolicyArgs;
use crate::session::StreamArgs;
use crate::session::input::{load_input, note_requests, require_events};
use crate::session::policies::{config_for_input, with_predictive_features};
use crate::session::runs::{max_live_bytes, run_policies};
use write::{BUCKETS, Destination, Gathered, replayed, write_report};

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
        if args.html.is_some() {
            bail!(
                "--html draws heap maps and sites from the trace loaded: leave out --stream, \
                 or take a window with --from/--to/--events"
            );
        }
        let out = args.out.as_deref().context("--out DIR is needed")?;
        if let Some(r) = real_specs.first() {
            bail!(
                "{} replays the trace's calls from memory: it needs the trace loaded, not \
                 streamed (leave out --stream, or take a window with --from/--to/--events)",
                r.label
            );
        }
        return streamed::run(
            &args.file,
            &args.policies,
            &args.input.window,
            input.requests_or(Requests::Libc),
            &args.destination(out),
            &specs,
            size,
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
    let config = config_for_input(&loaded, args.policies.config()?);
    let ev = require_events(&loaded, &args.file, "report")?;
    let view = allocview_loaders::trace_view(ev.events, &args.file)?;
    // The features `compare` gives `predictive` (each thread's calls, the sites).
    let config = with_predictive_features(config, &specs, &loaded, &view, &args.file)?;
    let jobs = args.policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runs = run_policies(&view, &specs, &config, jobs);
    let done = replayed(&runs, !real_specs.is_empty())?;
    let real = crate::answers::compare::real_rows(&loaded, &args.file, &view, &real_specs)?
        .into_iter()
        .map(|(row, series)| write::Real { row, series })
        .collect();
    let bucketing = allocview_sim::series::Bucketing::for_trace(&view, BUCKETS);
    let classes = ClassSeries::build(&view, bucketing, 16_384);
    let (_, peak) = view.peak_live();
    let heaps = if view.is_empty() {
        // Nothing was replayed, so there is no moment to draw a heap at.
        eprintln!("note: the trace has no events: no heap maps");
        Vec::new()
    } else {
        states_at(&done, &view, peak, jobs)?
    };
    let g = Gathered {
        done,
        real,
        classes,
        max_live: max_live_bytes(&view),
        peak_event: peak,
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
fn write_html(out: &std::path::Path, file: &std::path::Path, run: crate::html::Run) -> Result<()> {
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

/// Each replay's state just after `event`, `jobs` at a time: the replays keep no checkpoints
/// but their first state (`run_policies`), so each seek replays from the start, and the seeks
/// share the cores as the replays did.
fn states_at(
    done: &[(&str, &Replay)],
    view: &allocview_sim::trace::TraceView<'_>,
    event: usize,
    jobs: usize,
) -> Result<Vec<(Box<dyn Policy>, Counters)>> {
    let mut heaps = Vec::with_capacity(done.len());
    for chunk in done.chunks(jobs.max(1)) {
        let found: Vec<Result<_>> = std::thread::scope(|s| {
            let seeks: Vec<_> = chunk
                .iter()
                .map(|&(name, rep)| {
                    s.spawn(move || {
                        rep.state_at(view, event)
                            .map_err(|e| anyhow!("{name}: seeking to event {event}: {e}"))
                    })
                })
                .collect();
            seeks
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("a seek's thread panicked")))
                })
                .collect()
        });
        for heap in found {
            heaps.push(heap?);
        }
    }
    Ok(heaps)
}
