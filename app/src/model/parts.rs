//! Moving between parts of a trace shown as a window (`--from/--to/--events`, or the first
//! events of a trace too big to load): the next or previous window of the same length, opened
//! anew by the frontend ([`AppState::reopen`]).

use super::state::AppState;
use crate::cmd::window::WindowArgs;
use crate::format;

/// Asks for the part `step` windows after (or before) the one shown, or says why not.
pub fn open_part(state: &mut AppState, step: i64) {
    let Some(part) = state.data.as_ref().and_then(|d| d.part) else {
        state.message = Some(
            "the whole trace is shown: parts are for a window (--from/--to/--events) or a trace \
             too big to load"
                .to_owned(),
        );
        return;
    };
    let len = part.end.saturating_sub(part.start).max(1);
    let start = if step >= 0 {
        part.start
            .saturating_add(len.saturating_mul(step.unsigned_abs()))
    } else {
        part.start
            .saturating_sub(len.saturating_mul(step.unsigned_abs()))
    };
    if start >= part.trace_events || start == part.start {
        state.message = Some(format!(
            "this is the {} part: events {}..{} of {}",
            if step > 0 { "last" } else { "first" },
            format::count(part.start),
            format::count(part.end),
            format::count(part.trace_events)
        ));
        return;
    }
    let end = start.saturating_add(len).min(part.trace_events);
    state.message = Some(format!(
        "opening events {}..{} of {}",
        format::count(start),
        format::count(end),
        format::count(part.trace_events)
    ));
    state.reopen = Some(WindowArgs {
        events: Some(format!("{start}..{end}")),
        ..WindowArgs::default()
    });
}
