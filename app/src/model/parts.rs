//! Moving between parts of a trace shown as a window (`--from/--to/--events`, or the first
//! events of a trace too big to load): the next or previous window of the same length, or the
//! one that holds an event of the whole trace (`g #N`), opened anew by the frontend
//! ([`AppState::reopen`]).

use super::state::AppState;
use super::trace_data::Part;
use crate::format;
use crate::session::WindowArgs;

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
    let len = grid_len(state, part);
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
    state.reopen = Some(grid_window(start, len));
}

/// The length of the parts' grid: that of the window asked for (`--events A..B`, kept
/// unclamped when a part is asked for here, so a short last part keeps the grid), else the
/// part shown's.
fn grid_len(state: &AppState, part: Part) -> u64 {
    let asked = state.window.events.as_deref().and_then(|e| {
        let (a, b) = e.split_once("..")?;
        let (a, b) = (a.trim().parse::<u64>().ok()?, b.trim().parse::<u64>().ok()?);
        b.checked_sub(a)
    });
    asked
        .filter(|&l| l > 0)
        .unwrap_or_else(|| part.end.saturating_sub(part.start))
        .max(1)
}

/// The part of the grid from `start`, its end left past the trace's last event when it is
/// the short last part (the window ends there).
fn grid_window(start: u64, len: u64) -> WindowArgs {
    WindowArgs {
        events: Some(format!("{start}..{}", start.saturating_add(len))),
        ..WindowArgs::default()
    }
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
    let grid = grid_len(state, part);
    let len = i128::from(grid);
    let from = i128::from(part.start);
    let k = (i128::from(n) - from).div_euclid(len);
    let start = u64::try_from((from + k * len).max(0)).unwrap_or(0);
    let end = start.saturating_add(grid).min(part.trace_events);
    state.message = Some(format!(
        "opening events {}..{} of {}, for event #{}",
        format::count(start),
        format::count(end),
        format::count(part.trace_events),
        format::count(n)
    ));
    state.reopen = Some(grid_window(start, grid));
    state.reopen_goto = Some(format!("#{n}"));
    Ok(())
}
