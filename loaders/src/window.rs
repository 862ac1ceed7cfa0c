//! A window of an event table: the events `start..end`, preceded by the allocations live at
//! the window's start ("carried in"), so that replaying the window starts from the set of
//! live allocations a replay of the whole trace has there.
//!
//! The carried-in allocations are `alloc` rows, in their original order (allocation order),
//! with every column as in the file except `t_ns`, which is the window's first event's time
//! (so the window's time axis starts at the window), and `alloc_id`, renumbered densely
//! (carried-in allocations first, then the window's own, both in their original order), as
//! the simulator requires. A free in the window of a carried-in allocation ends it.
//!
//! Exact by construction: the live allocations (ids, sizes, addresses, stacks) at the
//! window's start and after every event of it, hence live bytes and everything derived from
//! the live set (sites, leaks, size classes). Not exact: a policy's heap layout at the window's
//! start, since the carried-in allocations are placed into an empty heap one after another
//! rather than by replaying the prefix with its frees; footprints and fragmentation in the
//! window are what the policy gives for "these blocks live, then this window".

use allocview_sim::trace::{EventKind, NO_ALLOC_ID};
use polars::prelude::*;

/// What [`window`] cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowInfo {
    /// First event of the window, in the whole trace's numbering.
    pub start: usize,
    /// One past the window's last event.
    pub end: usize,
    /// Allocations live at the window's start: the window table's first rows.
    pub carried_in: u32,
}

/// Why a window cannot be cut.
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    #[error("the window {start}..{end} is not within the {events} events of the trace")]
    OutOfRange {
        start: usize,
        end: usize,
        events: usize,
    },
    #[error(
        "event {event}: free of allocation {id}, which is neither live at the window's start \
         nor allocated in the window"
    )]
    FreeNotLive { event: usize, id: u32 },
    #[error(transparent)]
    Polars(#[from] PolarsError),
}

/// The events `start..end` of `events` (any event table with `t_ns`, `kind` and `alloc_id`;
/// other columns are carried along), after the allocations live at `start`.
///
/// # Errors
/// When the range is empty or out of bounds, a column is missing or mistyped, or a free in the
/// window ends an allocation that is not live (a table the loader would not produce).
pub fn window(
    events: &DataFrame,
    start: usize,
    end: usize,
) -> Result<(DataFrame, WindowInfo), WindowError> {
    let n = events.height();
    if start >= end || end > n {
        return Err(WindowError::OutOfRange {
            start,
            end,
            events: n,
        });
    }
    let kind: Vec<u8> = events.column("kind")?.u8()?.into_no_null_iter().collect();
    let ids = events.column("alloc_id")?.u32()?;
    let ids: Vec<u32> = ids.iter().map(|v| v.unwrap_or(NO_ALLOC_ID)).collect();
    let carried = live_rows_at(&kind, &ids, start);
    // Allocation ids are dense in allocation order: the carried-in ones all precede the
    // window's, which are consecutive from the window's first allocation.
    let carried_ids: Vec<u32> = carried.iter().map(|&row| ids[row]).collect();
    let first_window_id = (start..end)
        .find(|&i| kind[i] == EventKind::Alloc as u8)
        .map_or(u32::MAX, |i| ids[i]);
    let k = u32::try_from(carried.len()).unwrap_or(u32::MAX);
    let renumber = |event: usize, id: u32| -> Result<u32, WindowError> {
        if id == NO_ALLOC_ID {
            Ok(id)
        } else if id >= first_window_id {
            Ok(k + (id - first_window_id))
        } else {
            carried_ids
                .binary_search(&id)
                .map(|pos| pos as u32)
                .map_err(|_| WindowError::FreeNotLive { event, id })
        }
    };
    let mut new_ids: Vec<u32> = (0..k).collect();
    new_ids.reserve(end - start);
    for (i, &id) in ids.iter().enumerate().take(end).skip(start) {
        new_ids.push(renumber(i, id)?);
    }
    let rows: Vec<IdxSize> = carried
        .iter()
        .copied()
        .chain(start..end)
        .map(|r| r as IdxSize)
        .collect();
    let mut out = events.take(&IdxCa::from_vec("rows".into(), rows))?;
    let t_start = events.column("t_ns")?.i64()?.get(start).unwrap_or(0);
    let t_ns: Vec<i64> = out
        .column("t_ns")?
        .i64()?
        .iter()
        .enumerate()
        .map(|(row, t)| {
            if row < carried.len() {
                t_start
            } else {
                t.unwrap_or(t_start)
            }
        })
        .collect();
    out.with_column(Int64Chunked::from_vec("t_ns".into(), t_ns).into_column())?;
    out.with_column(crate::sites::stack_id_column("alloc_id", new_ids))?;
    out.rechunk_mut();
    Ok((
        out,
        WindowInfo {
            start,
            end,
            carried_in: k,
        },
    ))
}

/// Rows of the `alloc` events whose allocation is live just before event `start`, in order.
fn live_rows_at(kind: &[u8], ids: &[u32], start: usize) -> Vec<usize> {
    let mut row_of: Vec<usize> = Vec::new();
    const DEAD: usize = usize::MAX;
    for (row, (&k, &id)) in kind.iter().zip(ids).take(start).enumerate() {
        if id == NO_ALLOC_ID {
            continue;
        }
        let id = id as usize;
        if k == EventKind::Alloc as u8 {
            if row_of.len() <= id {
                row_of.resize(id + 1, DEAD);
            }
            row_of[id] = row;
        } else if k == EventKind::Free as u8
            && let Some(slot) = row_of.get_mut(id)
        {
            *slot = DEAD;
        }
    }
    row_of.into_iter().filter(|&r| r != DEAD).collect()
}
