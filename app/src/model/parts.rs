//! Moving between parts of a trace shown as a window (`--from/--to/--events`, or the first
//! events of a trace too big to load): the next or previous window of the same length, or the
//! one that holds an event of the whole trace (`g #N`), opened anew by the frontend
//! ([`AppState::reopen`]).

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

/// Goes to event `n` of the whole trace (`g #N`): in the part shown, the cursor moves there
/// (past the carried-in allocations the part's table starts with); elsewhere the part of the
/// same grid that holds it is asked for, with the cursor to go there once it is open. Without
/// parts the whole trace is shown and `n` is the cursor's own numbering.
///
/// # Errors
/// An event past the trace's last.
pub fn goto_trace_event(state: &mut AppState, n: u64) -> Result<(), String> {
    let Some(part) = state.data.as_ref().and_then(|d| d.part) else {
        state.set_cursor(usize::try_from(n).unwrap_or(usize::MAX));
        return Ok(());
    };
    if n >= part.trace_events {
        return Err(format!(
            "the trace has {} events: #0 to #{}",
            format::count(part.trace_events),
            format::count(part.trace_events.saturating_sub(1))
        ));
    }
    if (part.start..part.end).contains(&n) {
        let carried = (state.events() as u64).saturating_sub(part.end - part.start);
        state.set_cursor(usize::try_from(carried + (n - part.start)).unwrap_or(usize::MAX));
        return Ok(());
    }
    let len = i128::from(part.end.saturating_sub(part.start).max(1));
    let from = i128::from(part.start);
    let k = (i128::from(n) - from).div_euclid(len);
    let start = u64::try_from((from + k * len).max(0)).unwrap_or(0);
    let end = u64::try_from(i128::from(start) + len)
        .unwrap_or(u64::MAX)
        .min(part.trace_events);
    state.message = Some(format!(
        "opening events {}..{} of {}, for event #{}",
        format::count(start),
        format::count(end),
        format::count(part.trace_events),
        format::count(n)
    ));
    state.reopen = Some(WindowArgs {
        events: Some(format!("{start}..{end}")),
        ..WindowArgs::default()
    });
    state.reopen_goto = Some(format!("#{n}"));
    Ok(())
}
