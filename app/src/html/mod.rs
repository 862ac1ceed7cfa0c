//! `report --html` and `diff --html`: one self-contained HTML page (data, script and styles
//! inside, nothing fetched) that a reader opens without allocview or the trace.
//!
//! The page is built from what the explorers draw, never from events: the bucketed series,
//! the heap maps' cells, the top sites and a capped flame graph, so its size is bounded
//! whatever the trace's length. [`Page`] is serialised to JSON and embedded in a template
//! whose script ([`assets/report.js`]) draws it.

mod dump;
mod heap;
mod run;
mod sites;

use std::path::Path;

use anyhow::{Context as _, Result};
use serde::Serialize;

pub use dump::dump_run;
pub use heap::HeapMoment;
pub use run::{RunInput, StreamedInput, build_run, build_streamed_run, diff_run};
pub use sites::SiteDiff;

use crate::theme::{self, Rgb};

const TEMPLATE: &str = include_str!("assets/report.html");
const SCRIPT: &str = include_str!("assets/report.js");
const STYLE: &str = include_str!("assets/report.css");

/// What a page shows: one run (`report`) or two (`diff`, A then B).
#[derive(Debug, Serialize)]
pub struct Page {
    /// `report` or `diff`.
    pub kind: &'static str,
    pub title: String,
    pub version: &'static str,
    pub runs: Vec<Run>,
    /// `diff`'s table of sites, A against B.
    pub sites_diff: Option<Vec<SiteDiff>>,
    /// `diff`'s moment (`peak` or `end`) and how sites are grouped.
    pub diff_at: Option<String>,
    pub palette: Palette,
}

impl Page {
    /// A page of `runs`, coloured as the explorers are.
    #[must_use]
    pub fn new(kind: &'static str, title: String, runs: Vec<Run>) -> Self {
        Self {
            kind,
            title,
            version: env!("CARGO_PKG_VERSION"),
            runs,
            sites_diff: None,
            diff_at: None,
            palette: Palette::of_theme(),
        }
    }
}

/// One input's part of the page; what an input cannot give (a dump has no timeline, a diff
/// no heap maps) is left out.
#[derive(Debug, Default, Serialize)]
pub struct Run {
    pub file: String,
    pub format: String,
    pub events: u64,
    pub duration_s: f64,
    pub peak_live_bytes: u64,
    pub peak_live_t_s: f64,
    /// One row per policy (and measured allocator), as `compare` has them.
    pub rows: Vec<PolicyRow>,
    pub timeline: Option<Timeline>,
    /// Heap maps: every policy at the peak of live bytes, then the first policy at its first
    /// OOM and at the end.
    pub heaps: Vec<HeapMoment>,
    pub sites: Option<sites::Sites>,
    pub flame: Option<sites::FlameNode>,
    pub classes: Option<Classes>,
    /// What the input says of itself beyond its events (a snapshot's segments and settings, a
    /// dump's OOM and diagnosis), one line each.
    pub notes: Vec<String>,
    /// A PyTorch snapshot's phases: `(t_s, stage, name)`.
    pub phases: Vec<(f64, String, String)>,
    /// A PyTorch snapshot's segments at its moment: `[total, allocated, requested]` bytes.
    pub segments: Vec<[u64; 3]>,
    pub segments_left_out: usize,
    /// A BFC dump's bins.
    pub bins: Vec<dump::Bin>,
}

/// A policy's (or a measured allocator's) figures, as `compare`'s row has them.
#[derive(Debug, Serialize)]
pub struct PolicyRow {
    pub name: String,
    pub peak_footprint_bytes: u64,
    pub final_footprint_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub fragmentation_at_peak: f64,
    pub mean_fragmentation: f64,
    pub ooms: u64,
    pub first_oom: Option<String>,
    /// A measurement (a real allocator's resident memory), not a model.
    pub measured: bool,
}

impl PolicyRow {
    fn of(row: &crate::answers::compare::Row, measured: bool) -> Self {
        Self {
            name: row.name.clone(),
            peak_footprint_bytes: row.peak_footprint_bytes,
            final_footprint_bytes: row.final_footprint_bytes,
            peak_allocated_bytes: row.peak_allocated_bytes,
            fragmentation_at_peak: row.fragmentation_at_peak,
            mean_fragmentation: row.mean_fragmentation,
            ooms: row.ooms,
            first_oom: row.first_oom_text.clone(),
            measured,
        }
    }
}

/// The timeline: live bytes and each line's footprint per time bucket (bytes as the
/// bucket's maximum, so peaks survive, as `timeline.csv` has them).
#[derive(Debug, Default, Serialize)]
pub struct Timeline {
    pub t_s: Vec<f64>,
    pub live_bytes: Vec<u64>,
    pub lines: Vec<Line>,
    /// The recorded program's resident memory (or a profiler's reserved bytes):
    /// `(t_s, bytes)`, at most one point per bucket.
    pub recorded: Option<Recorded>,
    /// OOMs: `(line index, t_s)`, the first few of each line.
    pub ooms: Vec<(usize, f64)>,
    /// The run's marks (`allocview ctl PID mark NAME`, where recording stopped and started):
    /// `(t_s, label)`.
    pub marks: Vec<(f64, String)>,
}

/// A policy's footprint over time.
#[derive(Debug, Serialize)]
pub struct Line {
    pub name: String,
    /// Its colour's index in the explorers' palette (1.. = policies).
    pub palette: usize,
    /// Its buckets' times, when they are not the timeline's.
    pub t_s: Option<Vec<f64>>,
    pub footprint_bytes: Vec<u64>,
    pub fragmentation: Vec<f64>,
    pub measured: bool,
}

/// Measured memory, beside the models.
#[derive(Debug, Serialize)]
pub struct Recorded {
    pub label: String,
    pub t_s: Vec<f64>,
    pub bytes: Vec<u64>,
}

/// The size-class heatmap: each class's highest live bytes per bucket.
#[derive(Debug, Serialize)]
pub struct Classes {
    pub t_s: Vec<f64>,
    /// Classes that ever hold live bytes, each with its label and a row per bucket.
    pub rows: Vec<ClassRow>,
}

/// One size class's row of the heatmap.
#[derive(Debug, Serialize)]
pub struct ClassRow {
    pub class: u8,
    pub label: String,
    pub live_bytes: Vec<u64>,
}

/// The explorers' colours, as CSS.
#[derive(Debug, Serialize)]
pub struct Palette {
    pub live: String,
    pub policies: Vec<String>,
    pub recorded: String,
    pub oom: String,
    pub free: String,
    pub dead: String,
    pub waste: String,
    pub selected: String,
    pub fragmentation: String,
    pub phase: String,
    pub mark: String,
    pub cursor: String,
    /// Size classes 0..65 (a live block's colour in a heap map).
    pub classes: Vec<String>,
    /// The heatmap's ramp, 0 (nothing live) to 1, in 17 stops.
    pub heat: Vec<String>,
}

fn css(c: Rgb) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

impl Palette {
    fn of_theme() -> Self {
        Self {
            live: css(theme::LIVE),
            policies: (1..=8).map(|i| css(theme::series(i))).collect(),
            recorded: css(theme::series(usize::MAX - 2)),
            oom: css(theme::OOM),
            free: css(theme::FREE),
            dead: css(theme::DEAD),
            waste: css(theme::WASTE),
            selected: css(theme::SELECTED),
            fragmentation: css(theme::FRAGMENTATION),
            phase: css(theme::PHASE),
            mark: css(theme::MARK),
            cursor: css(theme::CURSOR),
            classes: (0u8..65).map(|c| css(theme::class(c))).collect(),
            heat: (0..=16)
                .map(|i| css(theme::heat(f64::from(i) / 16.0)))
                .collect(),
        }
    }
}

/// The page as HTML: the template with the styles, the script and the data inside.
///
/// # Errors
/// When the data cannot be serialised.
pub fn render(page: &Page) -> Result<String> {
    let json = serde_json::to_string(page).context("serialising the report's data")?;
    // Inside a <script> element only `</script` and `<!--` end or bend the element: escaping
    // every `<` (valid in JSON strings) keeps names from a trace from doing either.
    let json = json.replace('<', "\\u003c");
    let title = html_escape(&page.title);
    fill(
        TEMPLATE,
        &[
            ("TITLE", &title),
            ("STYLE", STYLE),
            ("DATA", &json),
            ("SCRIPT", SCRIPT),
        ],
    )
}

/// `template` with each `{{KEY}}` replaced by its value, in one pass: a value (a name from a
/// trace inside the data) is never searched for keys itself.
fn fill(template: &str, values: &[(&str, &str)]) -> Result<String> {
    let mut out =
        String::with_capacity(template.len() + values.iter().map(|v| v.1.len()).sum::<usize>());
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .context("the page template has an unclosed {{")?;
        let key = &after[..close];
        let value = values
            .iter()
            .find(|(k, _)| *k == key)
            .with_context(|| format!("the page template names an unknown {{{{{key}}}}}"))?;
        out.push_str(value.1);
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Writes `page` to `out` atomically, refusing to overwrite any of `inputs`; returns the
/// page's size in bytes.
///
/// # Errors
/// When the page cannot be rendered or written.
pub fn write(out: &Path, page: &Page, inputs: &[&Path]) -> Result<u64> {
    let html = render(page)?;
    crate::safe_write::write_bytes(out, html.as_bytes(), inputs)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(html.len() as u64)
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A file's name for the page (its directory says nothing to the reader).
#[must_use]
pub fn file_label(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}

/// The page `report --html` writes for `loaded` (read from `path`), replayed through
/// `policies`: what the Python package's notebook view shows too.
///
/// # Errors
/// When the input has no events (but a TF dump, which has its own page) or a policy cannot
/// replay it.
pub fn report_page(
    path: &Path,
    loaded: &allocview_loaders::Loaded,
    policies: &crate::session::PolicyArgs,
) -> Result<Page> {
    use crate::answers::report;
    let title = format!("allocview report: {}", file_label(path));
    if let allocview_loaders::Loaded::TfBfcDump(dump) = loaded {
        return Ok(Page::new("report", title, vec![dump_run(path, dump)]));
    }
    let ev = crate::session::input::require_events(loaded, path, "report")?;
    let view = allocview_loaders::trace_view(ev.events, path)?;
    let r = report::replay(path, loaded, &view, policies)?;
    let done = report::replayed(&r.runs, !r.real.is_empty())?;
    let heaps = if view.is_empty() {
        Vec::new()
    } else {
        report::states_at(&done, &view, r.peak_event, r.jobs)?
    };
    let real: Vec<_> = r.real.iter().map(|(row, series)| (row, series)).collect();
    let run = build_run(&RunInput {
        path,
        loaded,
        view: &view,
        replays: &done,
        real: &real,
        classes: &r.classes,
        peak_heaps: &heaps,
        peak_event: r.peak_event,
    })?;
    Ok(Page::new("report", title, vec![run]))
}
