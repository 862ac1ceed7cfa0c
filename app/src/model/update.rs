//! The explorer's messages ([`Msg`]) and [`update`], which applies them to the model
//! ([`AppState`]).
//!
//! Frontends turn input into messages; worker threads report with them. Each message has its
//! own step below, grouped as the dispatch lists them: moving the cursor, the views and
//! panels, the prompt, and the workers' reports.

use std::sync::Arc;

use allocview_sim::classes::ClassSeries;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::replay::Replay;

use super::state::{AppState, BUCKETS, Filter, Mode, Prompt, PromptKind, RunStatus};
use super::trace_data::TraceData;

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
    /// Next / previous mark, peak or OOM.
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
    /// Search the allocator's settings under the session's limit and add the best as a policy.
    Tune,
    /// The search's default and best settings, replayed (policies to add, and what to say),
    /// or why not.
    Tuned(Result<TunedPolicies, String>),
    /// A real-allocator row's series (its measured RSS), or why it did not run.
    RealReplayed(usize, Result<Arc<allocview_sim::series::Series>, String>),
    /// A followed run has grown ([`super::follow`]).
    Grown(Box<super::live::Grown>),
    /// A followed run has nothing to show yet, and why.
    LiveWaiting(String),
    /// The cursor follows the newest event of a followed run again (`F`).
    FollowHead,
}

/// Applies one message. Returns a follow-up message, if any.
pub fn update(state: &mut AppState, msg: Msg) -> Option<Msg> {
    let n = state.events();
    let by_hand = moves_cursor(state, &msg);
    if let Some(live) = state.live.as_mut() {
        match msg {
            // The last event of a run that goes on is its newest: following it.
            Msg::End => live.at_head = true,
            // Going back in time while the run goes on: the cursor stays where it is put.
            _ if by_hand => live.at_head = false,
            _ => {}
        }
    }
    match msg {
        // Moving the cursor.
        Msg::Step(d) => step(state, d),
        Msg::StepPage(d) => step(state, d * state.page_rows.max(1) as i64),
        Msg::StepBucket(d) => return step_bucket(state, d).map(Msg::Step),
        Msg::Home => state.set_cursor(0),
        Msg::End => state.set_cursor(n.saturating_sub(1)),
        Msg::ScrubTo(frac) => scrub_to(state, frac),
        Msg::GotoTime(t_ns) => {
            let e = state.event_at_time(t_ns.max(0.0));
            state.set_cursor(e);
        }
        Msg::GotoEvent(e) => state.set_cursor(e),
        Msg::NextMark => jump_to_mark(state, true),
        Msg::PrevMark => jump_to_mark(state, false),
        Msg::ZoomIn => zoom(state, 0.5),
        Msg::ZoomOut => zoom(state, 2.0),
        Msg::OpenPart(step) => super::parts::open_part(state, step),
        Msg::GotoTraceFraction(f) => goto_trace_fraction(state, f),
        // The views and panels.
        Msg::CyclePolicy(d) => cycle_policy(state, d),
        Msg::ToggleCompare => {
            state.mode = match state.mode {
                Mode::Single => Mode::Compare,
                Mode::Compare => Mode::Single,
            };
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
        Msg::Export => export(state),
        Msg::ToggleHelp => state.help = !state.help,
        // With the help open, the quit keys close it first.
        Msg::Quit if state.help => state.help = false,
        Msg::Quit => state.quit = true,
        Msg::PageRows(r) => state.page_rows = r.max(1),
        // The prompt.
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
        Msg::PromptSubmit => submit_prompt(state),
        // The workers' reports.
        Msg::Loaded(Ok(data)) => loaded(state, data),
        Msg::Loaded(Err(e)) => state.load_error = Some(e),
        Msg::Classes(c) => state.classes = Some(c),
        Msg::Replayed(i, result) => replayed(state, i, result),
        Msg::Tune => {
            if !state.tune_running {
                state.tune_requested = true;
                state.tune_running = true;
                state.message = Some("tune: searching the allocator's settings…".to_owned());
            }
        }
        Msg::Tuned(result) => {
            state.tune_running = false;
            tuned(state, result);
        }
        Msg::Grown(g) => grown(state, *g),
        Msg::LiveWaiting(why) => {
            if let Some(live) = state.live.as_mut() {
                live.waiting = Some(why.clone());
            }
            // Over a run already shown (it stopped growing, say why).
            if state.data.is_some() {
                state.message = Some(why);
            }
        }
        Msg::FollowHead => follow_head(state),
        Msg::RealReplayed(i, result) => {
            if let Some(slot) = state.real.get_mut(i) {
                slot.status = match result {
                    Ok(series) => super::state::RealStatus::Done(series),
                    Err(e) => super::state::RealStatus::Failed(e),
                };
            }
        }
    }
    None
}

/// Whether `msg` moves the cursor by the user's hand.
fn moves_cursor(state: &AppState, msg: &Msg) -> bool {
    match msg {
        Msg::Step(_)
        | Msg::StepBucket(_)
        | Msg::StepPage(_)
        | Msg::Home
        | Msg::ScrubTo(_)
        | Msg::GotoTime(_)
        | Msg::GotoEvent(_)
        | Msg::NextMark
        | Msg::PrevMark => true,
        Msg::PromptSubmit => state
            .prompt
            .as_ref()
            .is_some_and(|p| p.kind == PromptKind::Goto),
        _ => false,
    }
}

/// Moves the cursor by `d` events, stopping at the first.
fn step(state: &mut AppState, d: i64) {
    let c = state.cursor as i64 + d;
    state.set_cursor(usize::try_from(c.max(0)).unwrap_or(0));
}

/// Moves the cursor by `d` time buckets of the visible timeline (a 128th of its width), to
/// the first event of the bucket stepped to forward, its last backward. Without a replay done
/// there are no buckets: returns the events to step instead.
fn step_bucket(state: &mut AppState, d: i64) -> Option<i64> {
    let Some(r) = state.selected_replay().cloned() else {
        let step = (state.events() / 128).max(1) as i64;
        return Some(d * step);
    };
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
    None
}

/// Moves the cursor to the event at `frac` of the visible timeline.
fn scrub_to(state: &mut AppState, frac: f64) {
    let (lo, hi) = state.window_ns();
    let t = lo + frac.clamp(0.0, 1.0) * (hi - lo);
    let e = state.event_at_time(t);
    state.set_cursor(e);
}

/// Moves the cursor to the next (`forward`) or previous mark, saying what it is, or that
/// there is none.
fn jump_to_mark(state: &mut AppState, forward: bool) {
    let marks = state.marks();
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
                    "no later mark, peak or OOM"
                } else {
                    "no earlier mark, peak or OOM"
                }
                .to_owned(),
            );
        }
    }
}

/// Scales the visible timeline's width by `factor` around the cursor, between eight buckets
/// and the whole trace.
fn zoom(state: &mut AppState, factor: f64) {
    let (lo, hi) = state.zoom;
    let width = ((hi - lo) * factor).clamp(1.0 / BUCKETS as f64 * 8.0, 1.0);
    let span = state.bucketing().map_or(1.0, |b| b.span_ns as f64);
    let centre = state.cursor_t_ns() as f64 / span;
    let lo = (centre - width / 2.0).clamp(0.0, 1.0 - width);
    state.zoom = (lo, lo + width);
}

/// Goes to the event at fraction `f` of the whole trace, for a trace shown in parts.
fn goto_trace_fraction(state: &mut AppState, f: f64) {
    if let Some(part) = state.data.as_ref().and_then(|d| d.part) {
        let n = (f.clamp(0.0, 1.0) * part.trace_events as f64) as u64;
        let n = n.min(part.trace_events.saturating_sub(1));
        if let Err(e) = super::parts::goto_trace_event(state, n) {
            state.message = Some(e);
        }
    }
}

/// Selects the policy `d` places on, wrapping; for a plan file, the plan shown instead.
fn cycle_policy(state: &mut AppState, d: i64) {
    if let Some(plan) = state.data.as_ref().and_then(|x| x.plan.as_ref()) {
        let k = plan.plans.len().max(1) as i64;
        state.plan_index =
            usize::try_from((state.plan_index as i64 + d).rem_euclid(k)).unwrap_or(0);
        return;
    }
    let k = state.policies.len().max(1) as i64;
    state.selected = usize::try_from((state.selected as i64 + d).rem_euclid(k)).unwrap_or(0);
    state.refresh_heaps();
}

/// Writes what is on screen to files ([`super::export::export_screen`]), saying which.
fn export(state: &mut AppState) {
    state.message = Some(
        match super::export::export_screen(state, &state.export_dir) {
            Ok(files) => format!("exported {}", files.join(", ")),
            Err(e) => format!("export failed: {e:#}"),
        },
    );
}

/// Closes the prompt and does what it asked: go somewhere, or set the filter.
fn submit_prompt(state: &mut AppState) {
    let Some(p) = state.prompt.take() else {
        return;
    };
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

/// Takes the loaded input: its first warning said, the cursor at its start or where
/// `--goto` asks.
fn loaded(state: &mut AppState, data: Arc<TraceData>) {
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

/// Takes policy `i`'s replay, or why it failed.
fn replayed(state: &mut AppState, i: usize, result: Result<Arc<Replay>, String>) {
    if let Some(slot) = state.policies.get_mut(i) {
        slot.status = match result {
            Ok(r) => RunStatus::Done(r),
            Err(e) => RunStatus::Failed(e),
        };
    }
    state.refresh_heaps();
}

/// What `tune` adds to a session: the default and the best settings, replayed, and what to
/// say of them.
#[derive(Clone)]
pub struct TunedPolicies {
    pub replayed: Vec<(PolicySpec, Arc<Replay>)>,
    pub said: String,
}

/// Adds the search's default and best settings as policies, replayed, shows them side by side
/// (the comparison view) and says what to set.
fn tuned(state: &mut AppState, result: Result<TunedPolicies, String>) {
    match result {
        Ok(t) => {
            for (spec, replay) in t.replayed {
                if state.policies.iter().any(|p| p.spec == spec) {
                    continue;
                }
                state.policies.push(super::state::PolicySlot {
                    name: spec.label(),
                    spec,
                    status: RunStatus::Done(replay),
                    progress: Arc::default(),
                    preparing: Arc::default(),
                });
                state.heaps.push(None);
            }
            state.mode = Mode::Compare;
            state.refresh_heaps();
            state.message = Some(t.said);
        }
        Err(e) => state.message = Some(format!("tune: {e}")),
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

/// The event `text` names in the part shown: `peak`, an event number, or a time.
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

/// What the mark at `event` is, for the message line: an OOM, a peak of the selected policy,
/// or a local peak of live bytes.
fn describe_mark(state: &AppState, event: usize) -> String {
    if let Some((_, m)) = state.run_marks().into_iter().find(|&(e, _)| e == event) {
        return match m.kind {
            allocview_loaders::binary::MarkKind::User => format!("mark \"{}\"", m.name),
            kind => kind.label().to_owned(),
        };
    }
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

/// Takes a round of the follower: the longer trace, the policies' replays of it (a policy
/// replayed before keeps showing its last replay until the next arrives), the size classes;
/// the cursor stays where it was unless it follows the newest event.
fn grown(state: &mut AppState, g: super::live::Grown) {
    let Some(live) = state.live.as_mut() else {
        return;
    };
    live.bucketing = Some(g.bucketing);
    live.ended = g.ended;
    live.waiting = None;
    let at_head = live.at_head;
    // A recording that replaced one that failed to load.
    state.load_error = None;
    // The sites' table and series were computed on the shorter trace.
    state.sites.invalidate();
    if g.restarted {
        if let Some(w) = g.data.warnings.first() {
            state.message = Some(format!("warning: {w}"));
        }
        state.cursor = 0;
        state.heaps = state.policies.iter().map(|_| None).collect();
    }
    state.data = Some(g.data);
    state.classes = Some(g.classes);
    for (slot, r) in state.policies.iter_mut().zip(g.replays) {
        match r {
            Some(Ok(r)) => slot.status = RunStatus::Done(r),
            Some(Err(e)) => slot.status = RunStatus::Failed(e),
            None => {}
        }
    }
    let last = state.events().saturating_sub(1);
    if at_head {
        state.set_cursor(last);
        // A zoomed timeline slides with the newest event.
        let (lo, hi) = state.zoom;
        if hi < 1.0 {
            state.zoom = (1.0 - (hi - lo), 1.0);
        }
    } else {
        state.set_cursor(state.cursor.min(last));
    }
    state.refresh_sites();
    state.refresh_heaps();
}

/// `F`: the cursor goes to the newest event and follows it.
fn follow_head(state: &mut AppState) {
    let Some(live) = state.live.as_mut() else {
        state.message = Some("F follows a run being recorded (--follow, record --live)".to_owned());
        return;
    };
    live.at_head = true;
    let last = state.events().saturating_sub(1);
    state.set_cursor(last);
}
