//! What every screen shows, loaded or not: the status line, the prompt, the help, and the
//! load's progress until the input is in.

use super::vm::{HELP, StatusVm, ViewModel};
use crate::format;
use crate::model::state::{AppState, Mode, PromptKind, RunStatus};
use crate::model::trace_data::TraceData;

/// The view-model with only what every screen shows filled in: the load's error, the file's
/// name on the status line with the message, the prompt, the help and the layout.
pub(super) fn frame(state: &AppState) -> ViewModel {
    ViewModel {
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
            message: state.message.clone().or_else(|| {
                state
                    .live
                    .as_ref()
                    .filter(|_| state.data.is_none())
                    .and_then(|l| l.waiting.clone())
            }),
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
    }
}

/// The load's progress: a label with the bytes read of the file's, and the fraction done.
pub(super) fn loading(state: &AppState) -> (String, f64) {
    // A run followed before its file can be read: why there is nothing yet.
    if let Some(why) = state.live.as_ref().and_then(|l| l.waiting.clone()) {
        return (why, 0.0);
    }
    let read = state
        .load_progress
        .load(std::sync::atomic::Ordering::Relaxed);
    let frac = if state.file_bytes == 0 {
        0.0
    } else {
        read as f64 / state.file_bytes as f64
    };
    (
        format!(
            "loading {} ({} of {})",
            state.path.display(),
            format::bytes(read),
            format::bytes(state.file_bytes)
        ),
        frac.min(1.0),
    )
}

/// The status line's left side: the input, its events, format and part, and the selected
/// policy with how many have replayed.
pub(super) fn status_left(state: &AppState, data: &TraceData, events: usize) -> String {
    let policy = state
        .policies
        .get(state.selected)
        .map_or("-", |p| p.name.as_str());
    let done = state
        .policies
        .iter()
        .filter(|p| matches!(p.status, RunStatus::Done(_)))
        .count();
    format!(
        "{}  {} events{}{}{}  policy {} ({}/{} replayed)",
        data.path.display(),
        format::count(events as u64),
        live_tag(state),
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
    )
}

/// What the status line says of a followed run: whether it is still recorded, and whether
/// the cursor follows its newest event.
fn live_tag(state: &AppState) -> &'static str {
    match &state.live {
        None => "",
        Some(l) if l.ended => "  [recording ended]",
        Some(l) if l.at_head => "  [LIVE, following]",
        Some(_) => "  [LIVE, cursor held: F follows]",
    }
}

/// The status line's right side: the cursor's event and time (`t_cursor_ns` from the first
/// event), and the selected policy's heap there.
pub(super) fn status_right(state: &AppState, events: usize, t_cursor_ns: i64) -> String {
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
    format!(
        "event {}/{}  t={}{}",
        format::count(state.cursor as u64),
        format::count(events.saturating_sub(1) as u64),
        format::seconds_fixed(t_cursor_ns as f64 / 1e9),
        at
    )
}
