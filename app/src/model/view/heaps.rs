//! The heap maps at the cursor, with their captions or what their replay is doing, and the
//! BFC bins.

use allocview_sim::heap::Counters;
use allocview_sim::policy::bfc::BinInfo;

use super::vm::{BinVm, HeapVm, Viewport};
use crate::format;
use crate::model::state::{AppState, Mode, PolicySlot, RunStatus};

/// The heap map of the selected policy, or of every policy in compare mode, at `vp`'s size,
/// the selected site's blocks marked; a note instead while its replay runs or when it failed.
/// `events`: the trace's, for the replay's progress.
pub(super) fn heap_panels(state: &AppState, vp: &Viewport, events: usize) -> Vec<HeapVm> {
    let highlighted = state.sites.highlighted();
    let shown: Vec<usize> = match state.mode {
        Mode::Single => vec![state.selected],
        Mode::Compare => (0..state.policies.len()).collect(),
    };
    let mut heaps = Vec::new();
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
            (RunStatus::Pending, _) => (None, String::new(), Some(pending_note(slot, events))),
            (RunStatus::Failed(e), _) => (None, String::new(), Some(format!("failed: {e}"))),
        };
        heaps.push(HeapVm {
            policy: slot.name.to_owned(),
            map,
            caption,
            note,
        });
    }
    heaps
}

/// What a policy whose replay is not done is doing: planning (the oracle), waiting, or
/// replaying, with how far it has got of `events`.
fn pending_note(slot: &PolicySlot, events: usize) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let done = slot.progress.load(Relaxed);
    let (placed, to_place) = (
        slot.preparing.done.load(Relaxed),
        slot.preparing.total.load(Relaxed),
    );
    if done == 0 && to_place > 0 && placed < to_place {
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
            format::count(events as u64),
            100.0 * done as f64 / events.max(1) as f64
        )
    }
}

/// A heap map's caption: its counters.
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

/// The BFC bins of the selected policy at the cursor, in single mode.
pub(super) fn selected_bins(state: &AppState) -> Option<Vec<BinVm>> {
    if state.mode != Mode::Single {
        return None;
    }
    let bins = state
        .heaps
        .get(state.selected)
        .and_then(Option::as_ref)
        .and_then(|h| h.bins.as_ref())?;
    Some(bin_rows(bins))
}

/// One row a bin: its size, its free chunks with their bytes and the largest, and its chunks
/// in use.
pub(super) fn bin_rows(bins: &[BinInfo]) -> Vec<BinVm> {
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
        .collect()
}
