//! The explorer's single model ([`AppState`]) and what it answers of itself; its messages
//! and [`update`] are in [`super::update`].
//!
//! Frontends turn input into [`super::update::Msg`]s and draw [`super::view::ViewModel`]s; they never touch
//! the state directly. Long work (loading, replaying) runs on worker threads that report back
//! with messages, so the window opens at once and the cursor moves while policies replay.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use allocview_sim::classes::ClassSeries;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::spec::PolicySpec;

use super::heap_at::HeapAt;
use allocview_sim::replay::Replay;
use allocview_sim::series::Bucketing;
use allocview_sim::trace::{EventKind, TraceView};

/// Time buckets of every series the explorer draws.
pub const BUCKETS: usize = 2048;

use super::trace_data::TraceData;
// The commands' benchmark reaches the messages and the workers through this module.

/// How an explorer opens its input, beyond the input's options.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// `--goto`: the event, time or `peak` to open at.
    pub goto: Option<String>,
    /// `--follow`: the input is a run being recorded, followed as it grows.
    pub follow: Option<super::live::Follow>,
}

/// Where one policy's replay stands.
#[derive(Clone)]
pub enum RunStatus {
    Pending,
    Done(Arc<Replay>),
    Failed(String),
}

/// One policy of the session.
#[derive(Clone)]
pub struct PolicySlot {
    /// The label: the policy name, with its parameters for a variant.
    pub name: String,
    pub spec: PolicySpec,
    pub status: RunStatus,
    /// Events replayed so far (updated by the worker while the replay runs).
    pub progress: Arc<std::sync::atomic::AtomicUsize>,
    /// How far the policy's preparation has got before the replay (the oracle's plan).
    pub preparing: Arc<allocview_sim::plan::greedy_by_size::Progress>,
}

impl PolicySlot {
    /// The replay, once done.
    #[must_use]
    pub fn replay(&self) -> Option<&Arc<Replay>> {
        match &self.status {
            RunStatus::Done(r) => Some(r),
            _ => None,
        }
    }
}

/// A real-allocator row of the session (`real-jemalloc`, ...): the trace's calls replayed
/// through the library itself ([`crate::real`]); its measured RSS is a line of the timeline.
/// It has no heap to show.
#[derive(Clone)]
pub struct RealSlot {
    pub name: String,
    pub spec: crate::real::RealSpec,
    pub status: RealStatus,
}

/// Where a real row's replay stands.
#[derive(Clone)]
pub enum RealStatus {
    Pending,
    /// Its series (the footprint: the measured RSS) on the session's buckets.
    Done(Arc<allocview_sim::series::Series>),
    Failed(String),
}

/// The layout the view-model is shown in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One policy: its heap map, bins and histogram.
    Single,
    /// Every replayed policy side by side at the same cursor.
    Compare,
}

/// What a text prompt asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptKind {
    /// An event number, or a time with a unit (`1.5s`, `20ms`).
    Goto,
    /// An event filter: `thread=N`, `size=MIN..MAX`, `class=N`, space-separated; empty clears.
    Filter,
}

/// A text prompt being typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    pub kind: PromptKind,
    pub text: String,
}

/// Which events the event list and `n`/`N` consider.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub thread: Option<u16>,
    pub min_size_bytes: Option<u64>,
    pub max_size_bytes: Option<u64>,
    pub class: Option<u8>,
}

impl Filter {
    /// Parses `thread=N size=MIN..MAX class=N` (any subset, any order; sizes take units).
    ///
    /// # Errors
    /// A message naming the term that could not be read.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut f = Self::default();
        for term in text.split_whitespace() {
            let (key, value) = term
                .split_once('=')
                .ok_or_else(|| format!("expected key=value, got {term:?}"))?;
            match key {
                "thread" | "t" => {
                    f.thread = Some(value.parse().map_err(|_| format!("bad thread {value:?}"))?);
                }
                "class" | "c" => {
                    f.class = Some(value.parse().map_err(|_| format!("bad class {value:?}"))?);
                }
                "size" | "s" => {
                    let (lo, hi) = value.split_once("..").unwrap_or((value, value));
                    if !lo.is_empty() {
                        f.min_size_bytes = Some(crate::units::parse_bytes(lo)?);
                    }
                    if !hi.is_empty() {
                        f.max_size_bytes = Some(crate::units::parse_bytes(hi)?);
                    }
                }
                other => {
                    return Err(format!(
                        "unknown filter {other:?}: use thread=N, size=MIN..MAX, class=N"
                    ));
                }
            }
        }
        Ok(f)
    }

    /// True when no term is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Whether event `i` passes.
    #[must_use]
    pub fn accepts(&self, data: &TraceData, view: &TraceView<'_>, i: usize) -> bool {
        let size = view.size_bytes.get(i).copied().unwrap_or(0);
        self.thread.is_none_or(|t| data.thread_at(i) == t)
            && self.min_size_bytes.is_none_or(|m| size >= m)
            && self.max_size_bytes.is_none_or(|m| size <= m)
            && self
                .class
                .is_none_or(|c| allocview_sim::trace::size_class(size) == c)
    }

    /// The filter as text, for the status line.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.thread {
            parts.push(format!("thread={t}"));
        }
        if self.min_size_bytes.is_some() || self.max_size_bytes.is_some() {
            parts.push(format!(
                "size={}..{}",
                self.min_size_bytes
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                self.max_size_bytes
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            ));
        }
        if let Some(c) = self.class {
            parts.push(format!("class={c}"));
        }
        parts.join(" ")
    }
}

/// Everything the explorer knows.
pub struct AppState {
    pub path: PathBuf,
    pub file_bytes: u64,
    pub load_progress: Arc<AtomicU64>,
    pub data: Option<Arc<TraceData>>,
    pub load_error: Option<String>,
    pub classes: Option<Arc<ClassSeries>>,
    pub policies: Vec<PolicySlot>,
    /// The real-allocator rows, drawn on the timeline after the policies.
    pub real: Vec<RealSlot>,
    pub selected: usize,
    pub mode: Mode,
    /// Current event (the state shown is the one just after it).
    pub cursor: usize,
    /// The visible part of the timeline, as fractions of the trace's time span.
    pub zoom: (f64, f64),
    pub filter: Filter,
    pub prompt: Option<Prompt>,
    pub help: bool,
    pub message: Option<String>,
    pub quit: bool,
    /// Rows the event list shows (set by the frontend), for page steps.
    pub page_rows: usize,
    /// Heaps at the cursor, one per policy slot.
    pub heaps: Vec<Option<HeapAt>>,
    pub config: PolicyConfig,
    /// Where `e` writes its files (the working directory by default).
    pub export_dir: PathBuf,
    /// Where to put the cursor once loaded (`--goto`: an event, a time or `peak`).
    pub initial_goto: Option<String>,
    /// `--from`/`--to`/`--events`: the window of the trace to load.
    pub window: crate::session::WindowArgs,
    /// `--device`: which device's events of a PyTorch profiler trace to load.
    pub device: Option<allocview_loaders::kineto::DeviceChoice>,
    /// `--heap`: which heap's events of a binary trace to load (`None`: malloc's).
    pub heap: Option<String>,
    /// For a plan file: which of its plans is shown (`p` cycles).
    pub plan_index: usize,
    /// The sites panel: memory by allocation site at the cursor.
    pub sites: super::sites::SitesState,
    /// Another part of the trace to open (a window of the same length, asked for with
    /// [`super::update::Msg::OpenPart`]): the frontend starts anew on it.
    pub reopen: Option<crate::session::WindowArgs>,
    /// Where the cursor goes in the part [`Self::reopen`] asks for (`g #N` past this part).
    pub reopen_goto: Option<String>,
    /// Set when the frontend moves on from this state: its workers stop their replays.
    pub cancel: Arc<std::sync::atomic::AtomicBool>,
    /// `tune` was asked for ([`super::update::Msg::Tune`]): the frontend starts its search
    /// ([`super::workers::start_tune`]) and clears this.
    pub tune_requested: bool,
    /// A `tune` search is asked for or running (until its [`super::update::Msg::Tuned`]).
    pub tune_running: bool,
    /// A run followed while it is recorded (`--follow`, `record --live`): the worker reads the
    /// growing file ([`super::follow`]) instead of loading it once.
    pub live: Option<super::live::Live>,
}

impl AppState {
    /// A state for `path` before anything is loaded.
    #[must_use]
    pub fn new(path: &Path, policies: &[PolicySpec], config: PolicyConfig) -> Self {
        let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Self {
            path: path.to_path_buf(),
            file_bytes,
            load_progress: Arc::new(AtomicU64::new(0)),
            data: None,
            load_error: None,
            classes: None,
            policies: policies
                .iter()
                .map(|spec| PolicySlot {
                    name: spec.label(),
                    spec: spec.clone(),
                    status: RunStatus::Pending,
                    progress: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
                    preparing: Arc::default(),
                })
                .collect(),
            selected: 0,
            mode: Mode::Single,
            cursor: 0,
            zoom: (0.0, 1.0),
            filter: Filter::default(),
            prompt: None,
            help: false,
            message: None,
            quit: false,
            page_rows: 10,
            heaps: policies.iter().map(|_| None).collect(),
            config,
            export_dir: PathBuf::from("."),
            initial_goto: None,
            window: crate::session::WindowArgs::default(),
            device: None,
            heap: None,
            plan_index: 0,
            sites: super::sites::SitesState::default(),
            reopen: None,
            reopen_goto: None,
            cancel: Arc::default(),
            real: Vec::new(),
            tune_requested: false,
            tune_running: false,
            live: None,
        }
    }

    /// The session as `launch` opens it: at an event (`--goto`), following a run being
    /// recorded (`--follow`: the cursor on the newest event).
    #[must_use]
    pub fn launched(mut self, launch: Launch) -> Self {
        self.initial_goto = launch.goto;
        if let Some(from) = launch.follow {
            self.live = Some(super::live::Live {
                at_head: true,
                from,
                ..super::live::Live::default()
            });
        }
        self
    }

    /// The session with the real-allocator rows `specs` besides its policies.
    #[must_use]
    pub fn with_real(mut self, specs: &[crate::real::RealSpec]) -> Self {
        self.real = specs
            .iter()
            .map(|spec| RealSlot {
                name: spec.label.clone(),
                spec: spec.clone(),
                status: RealStatus::Pending,
            })
            .collect();
        self
    }

    /// Number of events (0 until loaded).
    #[must_use]
    pub fn events(&self) -> usize {
        self.data.as_ref().map_or(0, |d| d.len())
    }

    /// The selected policy's replay, once done.
    #[must_use]
    pub fn selected_replay(&self) -> Option<&Arc<Replay>> {
        self.policies
            .get(self.selected)
            .and_then(PolicySlot::replay)
    }

    /// The bucketing shared by every series (needs the trace).
    #[must_use]
    pub fn bucketing(&self) -> Option<Bucketing> {
        // A followed run's series grow with it: theirs, not the trace's span cut in BUCKETS.
        if let Some(b) = self.live.as_ref().and_then(|l| l.bucketing) {
            return Some(b);
        }
        self.data
            .as_ref()
            .map(|d| Bucketing::for_trace(&d.view(), BUCKETS))
    }

    /// Time of the cursor's event, in ns since the first event.
    #[must_use]
    pub fn cursor_t_ns(&self) -> i64 {
        self.data.as_ref().map_or(0, |d| {
            let v = d.view();
            let t0 = v.t_ns.first().copied().unwrap_or(0);
            v.t_ns.get(self.cursor).copied().unwrap_or(t0) - t0
        })
    }

    /// Whether the whole trace is still being read in the background (a trace shown in parts).
    #[must_use]
    pub fn scanning(&self) -> bool {
        self.data
            .as_ref()
            .and_then(|d| d.scan.as_ref())
            .is_some_and(|s| s.running())
    }

    pub(super) fn set_cursor(&mut self, event: usize) {
        let n = self.events();
        self.cursor = event.min(n.saturating_sub(1));
        self.refresh_heaps();
        self.refresh_sites();
    }

    /// Recomputes the sites panel if it is open and stale.
    pub fn refresh_sites(&mut self) {
        if let Some(data) = self.data.clone()
            && self.sites.open
            && let Some(sites) = data.sites()
            && let Some(bucketing) = self.bucketing()
        {
            self.sites
                .refresh(&data.view(), sites, self.cursor, bucketing);
        }
    }

    /// The visible time window in ns since the first event.
    #[must_use]
    pub fn window_ns(&self) -> (f64, f64) {
        let span = self.bucketing().map_or(1.0, |b| b.span_ns as f64);
        (self.zoom.0 * span, self.zoom.1 * span)
    }

    /// The event at time offset `t_ns` (first event at or after it).
    pub(super) fn event_at_time(&self, t_ns: f64) -> usize {
        let Some(data) = &self.data else { return 0 };
        let v = data.view();
        let t0 = v.t_ns.first().copied().unwrap_or(0);
        let target = t0 as f64 + t_ns;
        v.t_ns.partition_point(|&t| (t as f64) < target)
    }

    /// The first event at or after each of the run's marks (`allocview ctl PID mark NAME`,
    /// where recording stopped and started), with the mark.
    #[must_use]
    pub fn run_marks(&self) -> Vec<(usize, &allocview_loaders::binary::Mark)> {
        let Some(data) = &self.data else {
            return Vec::new();
        };
        let v = data.view();
        data.marks
            .iter()
            .map(|m| (v.t_ns.partition_point(|&t| t < m.t_ns), m))
            .filter(|&(e, _)| e < v.len())
            .collect()
    }

    /// Events the marks (`n`/`N`) stop at: the run's marks, OOMs of the selected policy, its
    /// peak footprint and peak live events, and the local maxima of live bytes across the
    /// visible buckets.
    #[must_use]
    pub fn marks(&self) -> Vec<usize> {
        let mut marks: Vec<usize> = self.run_marks().into_iter().map(|(e, _)| e).collect();
        if let Some(r) = self.selected_replay() {
            marks.extend(r.ooms.iter().map(|o| o.event));
            marks.extend(r.summary.peak_footprint_event);
            marks.extend(r.summary.peak_live_event);
            let s = &r.series;
            let n = s.len();
            let radius = (n / 64).max(2);
            for b in 0..n {
                let v = s.live_bytes.max.get(b).copied().unwrap_or(0);
                if v == 0 || s.event_count.get(b).copied().unwrap_or(0) == 0 {
                    continue;
                }
                let lo = b.saturating_sub(radius);
                let hi = (b + radius + 1).min(n);
                let is_peak = (lo..hi).all(|o| {
                    let w = s.live_bytes.max.get(o).copied().unwrap_or(0);
                    w < v || (w == v && o >= b)
                });
                if is_peak && let Some(e) = self.peak_event_in_bucket(r, b) {
                    marks.push(e);
                }
            }
        }
        marks.sort_unstable();
        marks.dedup();
        marks
    }

    /// The event of a bucket where live bytes reach the bucket's maximum.
    fn peak_event_in_bucket(&self, r: &Replay, b: usize) -> Option<usize> {
        let data = self.data.as_ref()?;
        let v = data.view();
        let s = &r.series;
        let first = *s.first_event.get(b)?;
        let last = *s.last_event.get(b)?;
        let target = *s.live_bytes.max.get(b)?;
        let mut live = if b == 0 {
            0
        } else {
            *s.live_bytes.last.get(b - 1)?
        };
        // Under a limit the policy's live bytes skip failed allocations: follow them.
        let failed: std::collections::HashSet<usize> = r
            .ooms
            .iter()
            .map(|o| o.event)
            .filter(|&e| e >= first && e <= last)
            .collect();
        for i in first..=last {
            let size = v.size_bytes.get(i).copied().unwrap_or(0);
            match v.kind_at(i) {
                Some(EventKind::Alloc) if !failed.contains(&i) => live += size,
                Some(EventKind::Free)
                    if r.addr_of(v.alloc_id.get(i).copied().unwrap_or(0)).is_some() =>
                {
                    live = live.saturating_sub(size);
                }
                _ => {}
            }
            if live == target {
                return Some(i);
            }
        }
        Some(last)
    }
}
