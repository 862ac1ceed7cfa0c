//! The view-model's types: plain data, one struct a part of the screen, that both frontends
//! draw from.

use crate::model::heapmap::HeapMap;

/// How much of each part the frontend has room for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Viewport {
    /// Points across the timeline.
    pub timeline_points: usize,
    /// Cells of one heap map.
    pub heap_cells: usize,
    /// Rows of the event list.
    pub event_rows: usize,
    /// Columns of the class heatmap.
    pub heat_columns: usize,
    /// Cells of a plan picture, width x height.
    pub plan_size: (usize, usize),
}

/// One line of the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct LineVm {
    pub label: String,
    /// Index into the frontend's series palette (0 = live bytes).
    pub palette: usize,
    /// `(x in 0..1 of the visible window, y)`; y in bytes, or a fraction for fragmentation.
    pub points: Vec<(f64, f64)>,
}

/// The timeline across the top.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineVm {
    pub byte_lines: Vec<LineVm>,
    /// Fragmentation (0..1) of the selected policy, on the second scale.
    pub fragmentation: Option<LineVm>,
    pub y_max_bytes: f64,
    pub y_max_label: String,
    /// Times at the window's ends, formatted.
    pub t_start_label: String,
    pub t_end_label: String,
    /// Cursor position in 0..1 of the window, when visible.
    pub cursor_x: Option<f64>,
    /// OOM events of the selected policy in the window (x in 0..1).
    pub oom_x: Vec<f64>,
    /// Annotated phases (a PyTorch snapshot's `external_annotations`) overlapping the window:
    /// `(x start, x end, name)` in 0..1 of the window, clipped. Empty when more are in view
    /// than can be marked apart (see `phases_in_view`).
    pub phases: Vec<(f64, f64, String)>,
    /// Phases overlapping the window, marked or not.
    pub phases_in_view: usize,
    /// The run's marks in the window (`allocview ctl PID mark NAME`, where recording stopped
    /// and started): `(x in 0..1 of the window, label)`, in time order.
    pub marks: Vec<(f64, String)>,
    pub title: String,
}

/// One heap map with its caption.
#[derive(Clone, Debug, PartialEq)]
pub struct HeapVm {
    pub policy: String,
    pub map: Option<HeapMap>,
    pub caption: String,
    /// Set while the replay is still running or failed.
    pub note: Option<String>,
}

/// One bin of the BFC bins view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinVm {
    pub bin: usize,
    pub size_label: String,
    pub free_chunks: usize,
    pub free_bytes_label: String,
    pub largest_label: String,
    pub in_use_chunks: u64,
}

/// One size class row of the histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassRowVm {
    pub class: u8,
    pub range: String,
    pub count: u64,
    pub bytes: u64,
    pub bytes_label: String,
    /// Share of the largest row's bytes, 0..1, for bars.
    pub bar: f64,
}

/// The class-over-time heatmap: `cells[row][col]` in 0..1 (log of live bytes), top row is the
/// highest class.
#[derive(Clone, Debug, PartialEq)]
pub struct HeatmapVm {
    pub classes: Vec<u8>,
    pub cells: Vec<Vec<f64>>,
    pub cursor_col: Option<usize>,
    /// Times of the first and last column's start, from the trace's start.
    pub time_from: String,
    pub time_to: String,
}

/// One row of the event list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRowVm {
    pub index: usize,
    pub time: String,
    pub thread: u16,
    pub kind: &'static str,
    pub size: String,
    pub address: String,
    pub alloc_id: String,
    pub is_cursor: bool,
    pub is_oom: bool,
    /// The kernel or operation (TensorFlow memory logs).
    pub op: Option<String>,
}

/// The status line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusVm {
    pub left: String,
    pub right: String,
    pub message: Option<String>,
}

/// Everything on screen.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewModel {
    /// Set until the trace is loaded: a label and a fraction done.
    pub loading: Option<(String, f64)>,
    pub error: Option<String>,
    pub timeline: Option<TimelineVm>,
    pub heaps: Vec<HeapVm>,
    pub bins: Option<Vec<BinVm>>,
    pub classes: Vec<ClassRowVm>,
    pub heatmap: Option<HeatmapVm>,
    pub events: Vec<EventRowVm>,
    pub events_title: String,
    pub status: StatusVm,
    pub prompt: Option<String>,
    pub help: Option<Vec<(&'static str, &'static str)>>,
    pub compare: bool,
    /// For a BFC dump: its OOM request, figures and diagnosis, one line each.
    pub dump_lines: Vec<String>,
    /// True when the events carry operation names (a column to show).
    pub has_ops: bool,
    /// For a memory plan: the offset-by-time picture.
    pub plan: Option<PlanVm>,
    /// The call stack of the allocation the cursor's event belongs to, innermost first, with
    /// a title naming it; empty when the input records no stacks.
    pub frames: Vec<String>,
    pub frames_title: String,
    /// The sites panel, when open.
    pub sites: Option<SitesVm>,
    /// The whole trace, for a trace too big to load shown in parts.
    pub overview: Option<crate::model::overview::OverviewVm>,
}

/// One row of the sites panel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteVm {
    /// Row of the whole table (for selecting it).
    pub index: usize,
    pub name: String,
    pub live_label: String,
    pub blocks: u64,
    pub allocs: u64,
    pub selected: bool,
}

/// The sites panel: memory by allocation site at the cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SitesVm {
    pub title: String,
    pub rows: Vec<SiteVm>,
    /// The selected site's stack, from its site outward.
    pub frames: Vec<String>,
}

/// The offset-by-time picture of a plan (time across, address up) with its bound.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanVm {
    pub grid: crate::model::plan_view::PlanGrid,
    pub title: String,
    /// What one unit of time is ("operator", "event").
    pub time_unit: &'static str,
    /// Totals, bound and ratios, one line each.
    pub lines: Vec<String>,
}

/// Keys and what they do, for the help overlay (and the README).
pub const HELP: &[(&str, &str)] = &[
    ("←/→  h/l", "step one event"),
    ("PgUp/PgDn  j/k", "step a screen of events (k/j: up/down)"),
    ("[ / ]", "step a time bucket of the timeline"),
    ("{ / }", "previous / next part (a window's length)"),
    ("Home / End", "first / last event"),
    (
        "g",
        "go to an event, a time (1.5s), or #N: event N of the whole trace",
    ),
    ("n / N", "next / previous mark, peak or OOM"),
    (
        "F",
        "follow the newest event of a run being recorded (--follow, record --live)",
    ),
    ("p / P", "next / previous policy"),
    ("c", "comparison view: every policy at the cursor"),
    ("+ / -", "zoom the timeline in / out around the cursor"),
    ("/", "filter events: thread=N size=MIN..MAX class=N"),
    ("e", "export the visible series (CSV) and heap maps (text)"),
    (
        "s",
        "sites panel: live bytes by allocation site at the cursor",
    ),
    (
        "< / >",
        "select the previous / next site (its blocks are # in the heap map)",
    ),
    (
        "T",
        "tune: search the allocator's settings (under --limit) and add the best as a policy",
    ),
    ("mouse", "click or drag on the timeline to scrub"),
    ("?", "this help"),
    ("q / Esc", "quit"),
];

/// Palette index of the selected site's line on the timeline (`theme::SELECTED`).
pub const SITE_PALETTE: usize = usize::MAX - 1;
/// Palette index of the recorded program's resident memory on the timeline
/// (`theme::RECORDED`).
pub const RECORDED_PALETTE: usize = usize::MAX - 2;
