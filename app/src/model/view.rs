//! The view-model: plain data computed from [`AppState`] for a given screen geometry. Both
//! frontends draw only from it; numbers are formatted here once so every output agrees.

use allocview_sim::heap::Counters;
use allocview_sim::trace::EventKind;

use super::heapmap::{self, HeapMap};
use super::state::{AppState, Mode, PromptKind, RunStatus};
use crate::format;

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
    pub overview: Option<super::overview::OverviewVm>,
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
    pub grid: super::plan_view::PlanGrid,
    pub title: String,
    /// What one unit of time is ("operator", "event").
    pub time_unit: &'static str,
    /// Totals, bound and ratios, one line each.
    pub lines: Vec<String>,
}

/// Keys and what they do, for the help overlay (and the book's terminal guide).
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
    ("n / N", "next / previous peak or OOM"),
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
    ("mouse", "click or drag on the timeline to scrub"),
    ("?", "this help"),
    ("q / Esc", "quit"),
];

fn counters_caption(c: &Counters) -> String {
    format!(
        "live {}  allocated {}  footprint {}  free {} in {} blocks  frag {:.1}%",
        format::bytes(c.live_bytes),
        format::bytes(c.allocated_bytes),
        format::bytes(c.footprint_bytes),
        format::bytes(c.free_bytes),
        format::count(c.free_blocks),
        100.0 * allocview_sim::metrics::fragmentation(c)
    )
}

/// Builds the view-model.
#[must_use]
pub fn view_model(state: &AppState, vp: &Viewport) -> ViewModel {
    let mut vm = ViewModel {
        loading: None,
        error: state.load_error.clone(),
        timeline: None,
        heaps: Vec::new(),
        bins: None,
        classes: Vec::new(),
        heatmap: None,
        events: Vec::new(),
        events_title: String::new(),
        status: StatusVm {
            left: state.path.display().to_string(),
            right: String::new(),
            message: state.message.clone(),
        },
        prompt: state.prompt.as_ref().map(|p| {
            let label = match p.kind {
                PromptKind::Goto => "go to (event or time)",
                PromptKind::Filter => "filter (thread=N size=MIN..MAX class=N)",
            };
            format!("{label}: {}", p.text)
        }),
        help: state.help.then(|| HELP.to_vec()),
        compare: state.mode == Mode::Compare,
        dump_lines: Vec::new(),
        has_ops: false,
        plan: None,
        frames: Vec::new(),
        frames_title: String::new(),
        sites: None,
        overview: None,
    };
    let Some(data) = state.data.as_ref() else {
        if vm.error.is_none() {
            let read = state
                .load_progress
                .load(std::sync::atomic::Ordering::Relaxed);
            let frac = if state.file_bytes == 0 {
                0.0
            } else {
                read as f64 / state.file_bytes as f64
            };
            vm.loading = Some((
                format!(
                    "loading {} ({} of {})",
                    state.path.display(),
                    format::bytes(read),
                    format::bytes(state.file_bytes)
                ),
                frac.min(1.0),
            ));
        }
        return vm;
    };
    if data.is_empty() {
        if let Some(d) = &data.dump {
            dump_screen(&mut vm, d, data, vp);
        }
        if let Some(p) = &data.plan {
            plan_screen(&mut vm, p, state, vp);
        }
        return vm;
    }
    if let Some(d) = &data.dump {
        // A memory log that ends in a dump: say what the dump said.
        vm.dump_lines = d.lines.clone();
    }
    if let Some(s) = &data.snapshot {
        vm.dump_lines = s.lines.clone();
        cursor_frames(&mut vm, data, state.cursor);
    }
    vm.has_ops = data.events.column("kernel").is_ok();
    let view = data.view();
    let n = view.len();
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    let t_cursor = view.t_ns.get(state.cursor).copied().unwrap_or(t0) - t0;

    vm.timeline = Some(super::view_timeline::timeline(state, vp));
    vm.overview = data
        .scan
        .as_ref()
        .zip(data.part)
        .map(|(scan, part)| super::overview::OverviewVm::new(&scan.overview(), part));

    vm.sites = sites_panel(state, vp);
    let highlighted = state.sites.highlighted();
    // Heap maps: the selected policy, or every policy in compare mode.
    let shown: Vec<usize> = match state.mode {
        Mode::Single => vec![state.selected],
        Mode::Compare => (0..state.policies.len()).collect(),
    };
    for i in shown {
        let Some(slot) = state.policies.get(i) else {
            continue;
        };
        let heap = state.heaps.get(i).and_then(Option::as_ref);
        let (map, caption, note) = match (&slot.status, heap) {
            (RunStatus::Done(_), Some(h)) => {
                let mut map = h.raster(0, h.held_bytes, vp.heap_cells);
                h.mark_selected(&mut map, 0, &highlighted);
                (Some(map), counters_caption(&h.counters), None)
            }
            (RunStatus::Done(_), None) => (None, String::new(), Some("seeking...".to_owned())),
            (RunStatus::Pending, _) => {
                use std::sync::atomic::Ordering::Relaxed;
                let done = slot.progress.load(Relaxed);
                let (placed, to_place) = (
                    slot.preparing.done.load(Relaxed),
                    slot.preparing.total.load(Relaxed),
                );
                let note = if done == 0 && to_place > 0 && placed < to_place {
                    format!(
                        "planning every allocation before the replay: {} of {} placed ({:.0}%)",
                        format::count(placed as u64),
                        format::count(to_place as u64),
                        100.0 * placed as f64 / to_place as f64
                    )
                } else if done == 0 && to_place > 0 {
                    "planned; starting the replay...".to_owned()
                } else if done == 0 {
                    "waiting to replay...".to_owned()
                } else {
                    format!(
                        "replaying: {} of {} events ({:.0}%)",
                        format::count(done as u64),
                        format::count(n as u64),
                        100.0 * done as f64 / n.max(1) as f64
                    )
                };
                (None, String::new(), Some(note))
            }
            (RunStatus::Failed(e), _) => (None, String::new(), Some(format!("failed: {e}"))),
        };
        vm.heaps.push(HeapVm {
            policy: slot.name.to_owned(),
            map,
            caption,
            note,
        });
    }

    // BFC bins of the selected policy.
    if state.mode == Mode::Single
        && let Some(bins) = state
            .heaps
            .get(state.selected)
            .and_then(Option::as_ref)
            .and_then(|h| h.bins.as_ref())
    {
        vm.bins = Some(
            bins.iter()
                .enumerate()
                .map(|(b, info)| {
                    let free_bytes: u64 = info.free_chunks.iter().map(|c| c.1).sum();
                    let largest = info.free_chunks.iter().map(|c| c.1).max().unwrap_or(0);
                    BinVm {
                        bin: b,
                        size_label: format::bytes_compact(info.bin_size_bytes),
                        free_chunks: info.free_chunks.len(),
                        free_bytes_label: format::bytes(free_bytes),
                        largest_label: format::bytes(largest),
                        in_use_chunks: info.chunks_in_use,
                    }
                })
                .collect(),
        );
    }

    // Size classes at the cursor and over time.
    if let Some(classes) = &state.classes {
        if let Ok(h) = classes.histogram_at(&view, state.cursor) {
            let max_bytes = h.live_bytes.iter().copied().max().unwrap_or(0).max(1);
            vm.classes = (0u8..)
                .zip(h.live_count.iter().zip(&h.live_bytes))
                .filter(|&(_, (&c, _))| c > 0)
                .map(|(class, (&count, &bytes))| ClassRowVm {
                    class,
                    range: format::class_range(class),
                    count,
                    bytes,
                    bytes_label: format::bytes(bytes),
                    bar: bytes as f64 / max_bytes as f64,
                })
                .collect();
        }
        vm.heatmap = Some(heatmap(state, classes, vp.heat_columns));
    }

    // Event list around the cursor, honouring the filter.
    let rows = vp.event_rows.max(1);
    let ooms: std::collections::HashSet<usize> = state
        .selected_replay()
        .map(|r| r.ooms.iter().map(|o| o.event).collect())
        .unwrap_or_default();
    let accepts = |i: usize| state.filter.accepts(data, &view, i);
    let mut before = Vec::new();
    let mut i = state.cursor;
    while before.len() < rows / 2 && i > 0 {
        i -= 1;
        if accepts(i) {
            before.push(i);
        }
        if state.cursor - i > 1_000_000 {
            break;
        }
    }
    before.reverse();
    let mut indices = before;
    let mut j = state.cursor;
    while indices.len() < rows && j < n {
        if j == state.cursor || accepts(j) {
            indices.push(j);
        }
        j += 1;
        if j - state.cursor > 1_000_000 {
            break;
        }
    }
    vm.events = indices
        .into_iter()
        .map(|i| {
            let kind = view.kind_at(i).unwrap_or(EventKind::Alloc);
            let id = view.alloc_id.get(i).copied().unwrap_or(u32::MAX);
            EventRowVm {
                index: i,
                time: format::seconds_fixed(
                    (view.t_ns.get(i).copied().unwrap_or(t0) - t0) as f64 / 1e9,
                ),
                thread: data.thread_at(i),
                kind: kind.name(),
                size: format::count(view.size_bytes.get(i).copied().unwrap_or(0)),
                address: format!("{:#x}", data.address_at(i)),
                alloc_id: if id == allocview_sim::trace::NO_ALLOC_ID {
                    "-".to_owned()
                } else {
                    id.to_string()
                },
                is_cursor: i == state.cursor,
                is_oom: ooms.contains(&i),
                op: if vm.has_ops { data.op_at(i) } else { None },
            }
        })
        .collect();
    vm.events_title = if state.filter.is_empty() {
        "events".to_owned()
    } else {
        format!("events [{}]", state.filter.describe())
    };

    // Status line.
    let policy = state
        .policies
        .get(state.selected)
        .map_or("-", |p| p.name.as_str());
    let done = state
        .policies
        .iter()
        .filter(|p| matches!(p.status, RunStatus::Done(_)))
        .count();
    vm.status.left = format!(
        "{}  {} events{}{}  policy {} ({}/{} replayed)",
        data.path.display(),
        format::count(n as u64),
        if data.format == "malloc-trace" {
            String::new()
        } else {
            format!(" ({})", data.format)
        },
        data.part.map_or_else(String::new, |p| format!(
            " (part {}..{} of {}; {{ }} for the others)",
            format::count(p.start),
            format::count(p.end),
            format::count(p.trace_events)
        )),
        policy,
        done,
        state.policies.len()
    );
    let at = state
        .heaps
        .get(state.selected)
        .and_then(Option::as_ref)
        .map(|h| {
            format!(
                "  live {}  footprint {}  frag {:.1}%",
                format::bytes(h.counters.live_bytes),
                format::bytes(h.counters.footprint_bytes),
                100.0 * allocview_sim::metrics::fragmentation(&h.counters)
            )
        })
        .unwrap_or_default();
    vm.status.right = format!(
        "event {}/{}  t={}{}",
        format::count(state.cursor as u64),
        format::count(n.saturating_sub(1) as u64),
        format::seconds_fixed(t_cursor as f64 / 1e9),
        at
    );
    vm
}

/// A memory plan: the picture of the selected plan, the bound, and how the plans compare.
fn plan_screen(vm: &mut ViewModel, p: &super::state::PlanData, state: &AppState, vp: &Viewport) {
    let Some((name, plan)) = p
        .plans
        .get(state.plan_index.min(p.plans.len().saturating_sub(1)))
    else {
        return;
    };
    // The picture takes the heap map's room; the frontend passes cells as width x height.
    let width = vp.plan_size.0.max(1);
    let height = vp.plan_size.1.max(1);
    let grid =
        super::plan_view::rasterise(&p.buffers, plan, p.lower_bound_bytes, None, width, height);
    let ratio = |t: u64| {
        if p.lower_bound_bytes == 0 {
            0.0
        } else {
            t as f64 / p.lower_bound_bytes as f64
        }
    };
    let mut lines = vec![format!(
        "{} buffers; lower bound (max live) {}; sum of sizes {}",
        format::count(p.buffers.len() as u64),
        format::bytes(p.lower_bound_bytes),
        format::bytes(p.naive_bytes)
    )];
    for (n, pl) in &p.plans {
        lines.push(format!(
            "{}{n}: {} ({:.3} x the bound)",
            if n == name { "> " } else { "  " },
            format::bytes(pl.total_bytes),
            ratio(pl.total_bytes)
        ));
    }
    lines.push("p: next plan   allocview plan FILE runs every planner".to_owned());
    vm.plan = Some(PlanVm {
        grid,
        time_unit: p.time_unit,
        title: format!(
            "plan: {name}, {} of pool (time across in {}s, address up)",
            format::bytes(plan.total_bytes),
            p.time_unit
        ),
        lines,
    });
    vm.events_title = "a plan has no events".to_owned();
    vm.status.left = format!("{}  memory plan", state.path.display());
    vm.status.right = format!(
        "{}: {} = {:.3} x the lower bound",
        name,
        format::bytes(plan.total_bytes),
        ratio(plan.total_bytes)
    );
}

/// A BFC dump has no history: its heap map, bins and what it says about the OOM.
fn dump_screen(
    vm: &mut ViewModel,
    d: &super::state::DumpData,
    data: &super::state::TraceData,
    vp: &Viewport,
) {
    vm.heaps.push(HeapVm {
        policy: format!("TensorFlow dump of {}", d.allocator),
        map: Some(heapmap::rasterise(&d.blocks, vp.heap_cells)),
        caption: d
            .lines
            .get(usize::from(d.lines.len() > 1))
            .cloned()
            .unwrap_or_default(),
        note: None,
    });
    vm.bins = d.bins.as_ref().map(|bins| {
        bins.iter()
            .enumerate()
            .map(|(b, info)| BinVm {
                bin: b,
                size_label: format::bytes_compact(info.bin_size_bytes),
                free_chunks: info.free_chunks.len(),
                free_bytes_label: format::bytes(info.free_chunks.iter().map(|c| c.1).sum()),
                largest_label: format::bytes(
                    info.free_chunks.iter().map(|c| c.1).max().unwrap_or(0),
                ),
                in_use_chunks: info.chunks_in_use,
            })
            .collect()
    });
    vm.dump_lines = d.lines.clone();
    vm.events_title = "a BFC dump is one moment of the heap: no events".to_owned();
    vm.status.left = format!("{}  TensorFlow BFC dump", data.path.display());
    vm.status.right = d.lines.first().cloned().unwrap_or_default();
}

/// Palette index of the selected site's line on the timeline (`theme::SELECTED`).
pub const SITE_PALETTE: usize = usize::MAX - 1;

/// The sites panel, when open.
fn sites_panel(state: &AppState, vp: &Viewport) -> Option<SitesVm> {
    if !state.sites.open {
        return None;
    }
    let data = state.data.as_ref()?;
    let kind = data.sites()?.kind;
    let Some(rows) = state.sites.rows() else {
        return Some(SitesVm {
            title: "sites: computing...".to_owned(),
            rows: Vec::new(),
            frames: Vec::new(),
        });
    };
    let live: u64 = rows.iter().map(|r| r.live_bytes).sum();
    // Keep the selected row in view.
    let shown = vp.event_rows.max(4);
    let first = state.sites.selected.saturating_sub(shown - 1);
    let frames = state
        .sites
        .selected_row()
        .zip(data.sites())
        .map(|(r, s)| s.stacks.site_lines(r.stack, 12, true))
        .unwrap_or_default();
    Some(SitesVm {
        title: format!(
            "sites at event {} ({}): {} live in {}",
            format::count(state.cursor as u64),
            kind.describe(),
            format::bytes(live),
            format::count(rows.iter().filter(|r| r.live_bytes > 0).count() as u64)
        ),
        rows: rows
            .iter()
            .enumerate()
            .skip(first)
            .take(shown)
            .map(|(i, r)| SiteVm {
                index: i,
                name: r.name.clone(),
                live_label: format::bytes(r.live_bytes),
                blocks: r.live_blocks,
                allocs: r.alloc_count,
                selected: i == state.sites.selected,
            })
            .collect(),
        frames,
    })
}

/// The frames of the allocation the cursor's event belongs to.
fn cursor_frames(vm: &mut ViewModel, data: &super::state::TraceData, cursor: usize) {
    let view = data.view();
    let id = view.alloc_id.get(cursor).copied().unwrap_or(u32::MAX);
    if id == allocview_sim::trace::NO_ALLOC_ID {
        vm.frames_title = format!("frames (event {cursor} belongs to no allocation)");
        return;
    }
    vm.frames = data.frames_of_alloc(id);
    let carried_in = data
        .snapshot
        .as_ref()
        .is_some_and(|s| id < s.script.carried_in);
    vm.frames_title = if vm.frames.is_empty() && carried_in {
        format!("allocation {id}: live before the trace, no frames")
    } else if vm.frames.is_empty() {
        format!("allocation {id}: no frames recorded")
    } else {
        format!("frames of allocation {id}, from its site outward")
    };
}

fn heatmap(
    state: &AppState,
    classes: &allocview_sim::classes::ClassSeries,
    columns: usize,
) -> HeatmapVm {
    use allocview_sim::trace::NUM_SIZE_CLASSES;
    let buckets = classes.buckets();
    let (zlo, zhi) = state.zoom;
    let lo = ((zlo * buckets as f64).floor() as usize).min(buckets);
    let hi = ((zhi * buckets as f64).ceil() as usize).clamp(lo, buckets);
    let cols = columns.max(1);
    let per = (hi - lo).div_ceil(cols).max(1);
    // Classes that ever hold live bytes in the window.
    let mut used = [false; NUM_SIZE_CLASSES];
    for b in lo..hi {
        if let Some(row) = classes.live_bytes_peak(b) {
            for (c, &v) in row.iter().enumerate() {
                if v > 0
                    && let Some(u) = used.get_mut(c)
                {
                    *u = true;
                }
            }
        }
    }
    let mut class_list: Vec<u8> = (0u8..)
        .zip(used.iter())
        .filter(|(_, u)| **u)
        .map(|(c, _)| c)
        .collect();
    class_list.reverse();
    let max = (lo..hi)
        .filter_map(|b| classes.live_bytes_peak(b))
        .flat_map(|r| r.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1);
    let log_max = (max as f64).ln_1p();
    let cells = class_list
        .iter()
        .map(|&c| {
            (lo..hi)
                .step_by(per)
                .map(|start| {
                    let end = (start + per).min(hi);
                    let v = (start..end)
                        .filter_map(|b| classes.live_bytes_peak(b))
                        .filter_map(|r| r.get(usize::from(c)).copied())
                        .max()
                        .unwrap_or(0);
                    (v as f64).ln_1p() / log_max
                })
                .collect()
        })
        .collect();
    let cursor_bucket = state
        .bucketing()
        .map(|b| b.bucket_of(state.cursor_t_ns() + b.t0_ns));
    let cursor_col = cursor_bucket
        .filter(|&b| b >= lo && b < hi)
        .map(|b| (b - lo) / per);
    let at = |b: usize| {
        state.bucketing().map_or_else(String::new, |k| {
            format::seconds_fixed((k.start_ns(b) - k.t0_ns) as f64 / 1e9)
        })
    };
    HeatmapVm {
        classes: class_list,
        cells,
        cursor_col,
        time_from: at(lo),
        time_to: at(hi),
    }
}

/// The hover text over cell `(col, row)` of the plan picture `vm` shows: the buffer there.
#[must_use]
pub fn plan_hover(state: &AppState, vm: &PlanVm, col: usize, row: usize) -> Option<String> {
    let data = state.data.as_ref()?;
    let p = data.plan.as_ref()?;
    let (_, plan) = p
        .plans
        .get(state.plan_index.min(p.plans.len().saturating_sub(1)))?;
    super::plan_view::describe_cell(&p.buffers, plan, &vm.grid, col, row, vm.time_unit)
}
