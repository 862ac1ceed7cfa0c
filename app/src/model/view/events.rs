//! The event list: the events around the cursor that pass the filter, one row each.

use std::collections::HashSet;

use allocview_sim::trace::{EventKind, TraceView};

use super::vm::EventRowVm;
use crate::format;
use crate::model::state::{AppState, Filter};
use crate::model::trace_data::TraceData;

/// Events either side of the cursor looked at, at most, for rows that pass the filter: a
/// filter that passes almost nothing leaves the list short rather than scan the trace.
const SCAN_EVENTS_MAX: usize = 1_000_000;

/// `rows` rows around the cursor: half of them before it, the cursor's own (filtered or not),
/// the rest after it. `has_ops`: the input names each event's operation.
pub(super) fn event_rows(
    state: &AppState,
    data: &TraceData,
    view: &TraceView<'_>,
    rows: usize,
    has_ops: bool,
) -> Vec<EventRowVm> {
    let ooms: HashSet<usize> = state
        .selected_replay()
        .map(|r| r.ooms.iter().map(|o| o.event).collect())
        .unwrap_or_default();
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    shown_events(state, data, view, rows.max(1))
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
                op: if has_ops { data.op_at(i) } else { None },
            }
        })
        .collect()
}

/// The events the list shows, in order: up to `rows / 2` that pass the filter before the
/// cursor, then the cursor and those that pass after it, up to `rows` in all.
fn shown_events(
    state: &AppState,
    data: &TraceData,
    view: &TraceView<'_>,
    rows: usize,
) -> Vec<usize> {
    let n = view.len();
    let accepts = |i: usize| state.filter.accepts(data, view, i);
    let mut before = Vec::new();
    let mut i = state.cursor;
    while before.len() < rows / 2 && i > 0 {
        i -= 1;
        if accepts(i) {
            before.push(i);
        }
        if state.cursor - i > SCAN_EVENTS_MAX {
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
        if j - state.cursor > SCAN_EVENTS_MAX {
            break;
        }
    }
    indices
}

/// The list's title, naming the filter when one is set.
pub(super) fn events_title(filter: &Filter) -> String {
    if filter.is_empty() {
        "events".to_owned()
    } else {
        format!("events [{}]", filter.describe())
    }
}
