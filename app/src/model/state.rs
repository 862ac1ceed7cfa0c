//! The explorer's single model ([`AppState`]), its messages ([`Msg`]) and [`update`].
//!
//! Frontends turn input into [`Msg`]s and draw [`super::view::ViewModel`]s; they never touch
//! the state directly. Long work (loading, replaying) runs on worker threads that report back
//! with messages, so the window opens at once and the cursor moves while policies replay.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use allocview_sim::classes::ClassSeries;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::spec::PolicySpec;

pub use super::heaps::HeapAt;
use allocview_sim::replay::Replay;
use allocview_sim::series::Bucketing;
use allocview_sim::trace::{EventKind, TraceView};

/// Time buckets of every series the explorer draws.
pub const BUCKETS: usize = 2048;

pub use super::trace_data::{DumpData, PlanData, SnapshotData, TraceData};
pub use super::workers::{load_blocking, start_workers};

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
    /// For a plan file: which of its plans is shown (`p` cycles).
    pub plan_index: usize,
    /// The sites panel: memory by allocation site at the cursor.
    pub sites: super::sites::SitesState,
    /// Another part of the trace to open (a window of the same length, asked for with
    /// [`Msg::OpenPart`]): the frontend starts anew on it.
    pub reopen: Option<crate::session::WindowArgs>,
    /// Where the cursor goes in the part [`Self::reopen`] asks for (`g #N` past this part).
    pub reopen_goto: Option<String>,
    /// Set when the frontend moves on from this state: its workers stop their replays.
    pub cancel: Arc<std::sync::atomic::AtomicBool>,
}

/// Everything that can happen to the model.
#[derive(Clone)]
pub enum Msg {
    /// Move the cursor by events.
    Step(i64),
    /// Move the cursor by time buckets of the visible timeline.
    StepBucket(i64),
    /// Move the cursor by a screen of events.
    StepPage(i64),
    Home,
    End,
    /// Move the cursor to a fraction of the visible timeline (mouse click or drag).
    ScrubTo(f64),
    /// Move the cursor to the first event at or after a time (ns since the first event).
    GotoTime(f64),
    /// Move the cursor to an event.
    GotoEvent(usize),
    /// Next / previous peak or OOM.
    NextMark,
    PrevMark,
    CyclePolicy(i64),
    ToggleCompare,
    /// Open or close the sites panel.
    ToggleSites,
    /// Open the next (+1) or previous (-1) part of the trace, a window of the same length.
    OpenPart(i64),
    /// Go to the event at a fraction of the whole trace (a click on the overview strip of a
    /// trace shown in parts): the part that holds it opens with the cursor on it.
    GotoTraceFraction(f64),
    /// Select the next / previous site of the panel, or a row of it.
    CycleSite(i64),
    SelectSite(usize),
    ZoomIn,
    ZoomOut,
    OpenPrompt(PromptKind),
    PromptInput(char),
    PromptBackspace,
    PromptSubmit,
    PromptCancel,
    /// Export what is on screen to files in the working directory.
    Export,
    ToggleHelp,
    Quit,
    /// Frontend geometry: rows of the event list.
    PageRows(usize),
    /// Worker results.
    Loaded(Result<Arc<TraceData>, String>),
    Classes(Arc<ClassSeries>),
    Replayed(usize, Result<Arc<Replay>, String>),
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
            plan_index: 0,
            sites: super::sites::SitesState::default(),
            reopen: None,
            reopen_goto: None,
            cancel: Arc::default(),
        }
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
        {
            self.sites.refresh(&data.view(), sites, self.cursor);
        }
    }

    /// The visible time window in ns since the first event.
    #[must_use]
    pub fn window_ns(&self) -> (f64, f64) {
        let span = self.bucketing().map_or(1.0, |b| b.span_ns as f64);
        (self.zoom.0 * span, self.zoom.1 * span)
    }

    /// The event at time offset `t_ns` (first event at or after it).
    fn event_at_time(&self, t_ns: f64) -> usize {
        let Some(data) = &self.data else { return 0 };
        let v = data.view();
        let t0 = v.t_ns.first().copied().unwrap_or(0);
        let target = t0 as f64 + t_ns;
        v.t_ns.partition_point(|&t| (t as f64) < target)
    }

    /// Events the marks (`n`/`N`) stop at: OOMs of the selected policy, its peak footprint and
    /// peak live events, and the local maxima of live bytes across the visible buckets.
    #[must_use]
    pub fn marks(&self) -> Vec<usize> {
        let mut marks = Vec::new();
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

/// Moves the cursor to what `text` names: an event of the part shown (or of the whole trace,
/// `#N`, opening its part when it lies elsewhere), `peak`, or a time.
fn goto(state: &mut AppState, text: &str) -> Result<(), String> {
    if let Some(n) = text.trim().strip_prefix('#') {
        let n = n
            .trim()
            .replace([',', '_'], "")
            .parse::<u64>()
            .map_err(|_| format!("expected an event of the whole trace after `#`, found {n:?}"))?;
        return super::parts::goto_trace_event(state, n);
    }
    state.set_cursor(parse_goto(text, state)?);
    Ok(())
}

fn parse_goto(text: &str, state: &AppState) -> Result<usize, String> {
    let t = text.trim();
    if t == "peak" {
        return Ok(peak_live_event(state));
    }
    if let Ok(event) = t.replace([',', '_'], "").parse::<usize>() {
        return Ok(event);
    }
    let t_ns = allocview_sim::units::parse_duration_ns(t)
        .map_err(|e| format!("expected an event number, `peak` or a time: {e}"))?;
    Ok(state.event_at_time(t_ns))
}

/// The first event at which live bytes (of the trace, policy-independent) peak.
fn peak_live_event(state: &AppState) -> usize {
    state.data.as_ref().map_or(0, |d| d.view().peak_live().1)
}

/// Applies one message. Returns a follow-up message, if any.
pub fn update(state: &mut AppState, msg: Msg) -> Option<Msg> {
    let n = state.events();
    match msg {
        Msg::Step(d) => {
            let c = state.cursor as i64 + d;
            state.set_cursor(usize::try_from(c.max(0)).unwrap_or(0));
        }
        Msg::StepPage(d) => {
            let c = state.cursor as i64 + d * state.page_rows.max(1) as i64;
            state.set_cursor(usize::try_from(c.max(0)).unwrap_or(0));
        }
        Msg::StepBucket(d) => {
            if let Some(r) = state.selected_replay().cloned() {
                let s = &r.series;
                let b = s.bucket_of_event(state.cursor) as i64;
                let (lo, hi) = state.zoom;
                let visible = ((hi - lo) * s.len() as f64 / 128.0).max(1.0) as i64;
                let nb = (b + d * visible).clamp(0, s.len() as i64 - 1);
                let nb = usize::try_from(nb).unwrap_or(0);
                let target = if d > 0 {
                    s.first_event.get(nb).copied()
                } else {
                    s.last_event.get(nb).copied()
                };
                // At either end there is no further bucket: a step never moves backwards.
                let target = target.unwrap_or(state.cursor);
                let target = if d > 0 {
                    target.max(state.cursor)
                } else {
                    target.min(state.cursor)
                };
                state.set_cursor(target);
            } else {
                let step = (n / 128).max(1) as i64;
                return Some(Msg::Step(d * step));
            }
        }
        Msg::Home => state.set_cursor(0),
        Msg::End => state.set_cursor(n.saturating_sub(1)),
        Msg::ScrubTo(frac) => {
            let (lo, hi) = state.window_ns();
            let t = lo + frac.clamp(0.0, 1.0) * (hi - lo);
            let e = state.event_at_time(t);
            state.set_cursor(e);
        }
        Msg::GotoTime(t_ns) => {
            let e = state.event_at_time(t_ns.max(0.0));
            state.set_cursor(e);
        }
        Msg::GotoEvent(e) => state.set_cursor(e),
        Msg::NextMark | Msg::PrevMark => {
            let marks = state.marks();
            let forward = matches!(msg, Msg::NextMark);
            let target = if forward {
                marks.iter().copied().find(|&m| m > state.cursor)
            } else {
                marks.iter().rev().copied().find(|&m| m < state.cursor)
            };
            match target {
                Some(t) => {
                    state.set_cursor(t);
                    state.message = Some(describe_mark(state, t));
                }
                None => {
                    state.message = Some(
                        if forward {
                            "no later peak or OOM"
                        } else {
                            "no earlier peak or OOM"
                        }
                        .to_owned(),
                    );
                }
            }
        }
        Msg::CyclePolicy(d) if state.data.as_ref().is_some_and(|x| x.plan.is_some()) => {
            let k = state
                .data
                .as_ref()
                .and_then(|x| x.plan.as_ref())
                .map_or(1, |p| p.plans.len().max(1)) as i64;
            state.plan_index =
                usize::try_from((state.plan_index as i64 + d).rem_euclid(k)).unwrap_or(0);
        }
        Msg::CyclePolicy(d) => {
            let k = state.policies.len().max(1) as i64;
            state.selected =
                usize::try_from((state.selected as i64 + d).rem_euclid(k)).unwrap_or(0);
            state.refresh_heaps();
        }
        Msg::ToggleSites => {
            state.sites.open = !state.sites.open;
            state.refresh_sites();
        }
        Msg::CycleSite(d) => {
            state.sites.cycle(d);
            state.refresh_sites();
        }
        Msg::SelectSite(i) => {
            state.sites.selected = i;
            state.refresh_sites();
        }
        Msg::ToggleCompare => {
            state.mode = match state.mode {
                Mode::Single => Mode::Compare,
                Mode::Compare => Mode::Single,
            };
            state.refresh_heaps();
        }
        Msg::ZoomIn | Msg::ZoomOut => {
            let (lo, hi) = state.zoom;
            let width = if matches!(msg, Msg::ZoomIn) {
                (hi - lo) / 2.0
            } else {
                (hi - lo) * 2.0
            };
            let width = width.clamp(1.0 / BUCKETS as f64 * 8.0, 1.0);
            let span = state.bucketing().map_or(1.0, |b| b.span_ns as f64);
            let centre = state.cursor_t_ns() as f64 / span;
            let lo = (centre - width / 2.0).clamp(0.0, 1.0 - width);
            state.zoom = (lo, lo + width);
        }
        Msg::OpenPrompt(kind) => {
            state.prompt = Some(Prompt {
                kind,
                text: String::new(),
            });
        }
        Msg::PromptInput(c) => {
            if let Some(p) = state.prompt.as_mut() {
                p.text.push(c);
            }
        }
        Msg::PromptBackspace => {
            if let Some(p) = state.prompt.as_mut() {
                p.text.pop();
            }
        }
        Msg::PromptCancel => state.prompt = None,
        Msg::PromptSubmit => {
            if let Some(p) = state.prompt.take() {
                match p.kind {
                    PromptKind::Goto => {
                        if let Err(e) = goto(state, &p.text) {
                            state.message = Some(e);
                        }
                    }
                    PromptKind::Filter => match Filter::parse(&p.text) {
                        Ok(f) => {
                            state.message = Some(if f.is_empty() {
                                "filter cleared".to_owned()
                            } else {
                                format!("filter: {}", f.describe())
                            });
                            state.filter = f;
                        }
                        Err(e) => state.message = Some(e),
                    },
                }
            }
        }
        Msg::Export => {
            state.message = Some(
                match super::export::export_screen(state, &state.export_dir) {
                    Ok(files) => format!("exported {}", files.join(", ")),
                    Err(e) => format!("export failed: {e:#}"),
                },
            );
        }
        Msg::ToggleHelp => state.help = !state.help,
        Msg::OpenPart(step) => super::parts::open_part(state, step),
        // With the help open, the quit keys close it first.
        Msg::Quit if state.help => state.help = false,
        Msg::Quit => state.quit = true,
        Msg::PageRows(r) => state.page_rows = r.max(1),
        Msg::GotoTraceFraction(f) => {
            if let Some(part) = state.data.as_ref().and_then(|d| d.part) {
                let n = (f.clamp(0.0, 1.0) * part.trace_events as f64) as u64;
                let n = n.min(part.trace_events.saturating_sub(1));
                if let Err(e) = super::parts::goto_trace_event(state, n) {
                    state.message = Some(e);
                }
            }
        }
        Msg::Loaded(Ok(data)) => {
            if let Some(w) = data.warnings.first() {
                state.message = Some(format!("warning: {w}"));
            }
            state.data = Some(data);
            state.cursor = 0;
            if let Some(g) = state.initial_goto.take()
                && let Err(e) = goto(state, &g)
            {
                state.message = Some(format!("--goto: {e}"));
            }
            // A panel opened before the data arrived (`--sites`) fills in now.
            state.refresh_sites();
        }
        Msg::Loaded(Err(e)) => state.load_error = Some(e),
        Msg::Classes(c) => state.classes = Some(c),
        Msg::Replayed(i, result) => {
            if let Some(slot) = state.policies.get_mut(i) {
                slot.status = match result {
                    Ok(r) => RunStatus::Done(r),
                    Err(e) => RunStatus::Failed(e),
                };
            }
            state.refresh_heaps();
        }
    }
    None
}

fn describe_mark(state: &AppState, event: usize) -> String {
    let Some(r) = state.selected_replay() else {
        return String::new();
    };
    if let Some(o) = r.ooms.iter().find(|o| o.event == event) {
        return format!(
            "OOM at event {}: {} requested",
            crate::format::count(event as u64),
            crate::format::bytes(o.request.size_bytes)
        );
    }
    if r.summary.peak_footprint_event == Some(event) {
        return format!(
            "peak footprint of {}: {}",
            r.policy_name,
            crate::format::bytes(r.summary.peak_footprint_bytes)
        );
    }
    if r.summary.peak_live_event == Some(event) {
        return format!(
            "peak live bytes: {}",
            crate::format::bytes(r.summary.peak_live_bytes)
        );
    }
    format!(
        "local peak of live bytes at event {}",
        crate::format::count(event as u64)
    )
}
