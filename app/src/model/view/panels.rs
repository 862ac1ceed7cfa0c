//! The panels beside and under the heap map: the sites panel, the frames of the cursor's
//! allocation, and the size classes at the cursor and over time.

use allocview_sim::classes::ClassSeries;
use allocview_sim::trace::TraceView;

use super::vm::{ClassRowVm, HeatmapVm, SiteVm, SitesVm, ViewModel, Viewport};
use crate::format;
use crate::model::state::AppState;
use crate::model::trace_data::TraceData;

/// The sites panel, when open.
pub(super) fn sites_panel(state: &AppState, vp: &Viewport) -> Option<SitesVm> {
    if !state.sites.open {
        return None;
    }
    let data = state.data.as_ref()?;
    let kind = data.sites()?.kind.describe();
    // Sampled stacks (`record --stack-sample`): the figures are estimates, said in the title.
    let kind = match data.sites()?.sampling() {
        Some(s) => format!(
            "{kind}, sampled every {}: estimates",
            format::bytes(s.mean_bytes)
        ),
        None => kind.to_owned(),
    };
    let Some(rows) = state.sites.rows() else {
        return Some(SitesVm {
            title: "sites: computing...".to_owned(),
            rows: Vec::new(),
            frames: Vec::new(),
        });
    };
    let live: u64 = rows.iter().map(|r| r.live_bytes).sum();
    // Keep the selected row in view.
    let shown = vp.event_rows.max(4);
    let first = state.sites.selected.saturating_sub(shown - 1);
    let frames = state
        .sites
        .selected_row()
        .zip(data.sites())
        .map(|(r, s)| s.stacks.site_lines(r.stack, 12, true))
        .unwrap_or_default();
    Some(SitesVm {
        title: format!(
            "sites at event {} ({}): {} live in {}",
            format::count(state.cursor as u64),
            kind,
            format::bytes(live),
            format::count(rows.iter().filter(|r| r.live_bytes > 0).count() as u64)
        ),
        rows: rows
            .iter()
            .enumerate()
            .skip(first)
            .take(shown)
            .map(|(i, r)| SiteVm {
                index: i,
                name: r.name.clone(),
                live_label: format::bytes(r.live_bytes),
                blocks: r.live_blocks,
                allocs: r.alloc_count,
                selected: i == state.sites.selected,
            })
            .collect(),
        frames,
    })
}

/// The frames of the allocation the cursor's event belongs to.
pub(super) fn cursor_frames(vm: &mut ViewModel, data: &TraceData, cursor: usize) {
    let view = data.view();
    let id = view.alloc_id.get(cursor).copied().unwrap_or(u32::MAX);
    if id == allocview_sim::trace::NO_ALLOC_ID {
        vm.frames_title = format!("frames (event {cursor} belongs to no allocation)");
        return;
    }
    vm.frames = data.frames_of_alloc(id);
    let carried_in = data
        .snapshot
        .as_ref()
        .is_some_and(|s| id < s.script.carried_in);
    vm.frames_title = if vm.frames.is_empty() && carried_in {
        format!("allocation {id}: live before the trace, no frames")
    } else if vm.frames.is_empty() {
        format!("allocation {id}: no frames recorded")
    } else {
        format!("frames of allocation {id}, from its site outward")
    };
}

/// The live allocations at the cursor by size class, the classes that hold none left out,
/// each with its share of the largest class's bytes; none when the classes cannot be read at
/// the cursor.
pub(super) fn class_rows(
    state: &AppState,
    classes: &ClassSeries,
    view: &TraceView<'_>,
) -> Vec<ClassRowVm> {
    let Ok(h) = classes.histogram_at(view, state.cursor) else {
        return Vec::new();
    };
    let max_bytes = h.live_bytes.iter().copied().max().unwrap_or(0).max(1);
    (0u8..)
        .zip(h.live_count.iter().zip(&h.live_bytes))
        .filter(|&(_, (&c, _))| c > 0)
        .map(|(class, (&count, &bytes))| ClassRowVm {
            class,
            range: format::class_range(class),
            count,
            bytes,
            bytes_label: format::bytes(bytes),
            bar: bytes as f64 / max_bytes as f64,
        })
        .collect()
}

/// The size classes over the visible timeline in `columns` columns: each the log of the
/// highest live bytes of a class in its buckets, against the highest of any.
pub(super) fn heatmap(state: &AppState, classes: &ClassSeries, columns: usize) -> HeatmapVm {
    use allocview_sim::trace::NUM_SIZE_CLASSES;
    let buckets = classes.buckets();
    let (zlo, zhi) = state.zoom;
    let lo = ((zlo * buckets as f64).floor() as usize).min(buckets);
    let hi = ((zhi * buckets as f64).ceil() as usize).clamp(lo, buckets);
    let cols = columns.max(1);
    let per = (hi - lo).div_ceil(cols).max(1);
    // Classes that ever hold live bytes in the window.
    let mut used = [false; NUM_SIZE_CLASSES];
    for b in lo..hi {
        if let Some(row) = classes.live_bytes_peak(b) {
            for (c, &v) in row.iter().enumerate() {
                if v > 0
                    && let Some(u) = used.get_mut(c)
                {
                    *u = true;
                }
            }
        }
    }
    let mut class_list: Vec<u8> = (0u8..)
        .zip(used.iter())
        .filter(|(_, u)| **u)
        .map(|(c, _)| c)
        .collect();
    class_list.reverse();
    let max = (lo..hi)
        .filter_map(|b| classes.live_bytes_peak(b))
        .flat_map(|r| r.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1);
    let log_max = (max as f64).ln_1p();
    let cells = class_list
        .iter()
        .map(|&c| {
            (lo..hi)
                .step_by(per)
                .map(|start| {
                    let end = (start + per).min(hi);
                    let v = (start..end)
                        .filter_map(|b| classes.live_bytes_peak(b))
                        .filter_map(|r| r.get(usize::from(c)).copied())
                        .max()
                        .unwrap_or(0);
                    (v as f64).ln_1p() / log_max
                })
                .collect()
        })
        .collect();
    let cursor_bucket = state
        .bucketing()
        .map(|b| b.bucket_of(state.cursor_t_ns() + b.t0_ns));
    let cursor_col = cursor_bucket
        .filter(|&b| b >= lo && b < hi)
        .map(|b| (b - lo) / per);
    let at = |b: usize| {
        state.bucketing().map_or_else(String::new, |k| {
            format::seconds_fixed((k.start_ns(b) - k.t0_ns) as f64 / 1e9)
        })
    };
    HeatmapVm {
        classes: class_list,
        cells,
        cursor_col,
        time_from: at(lo),
        time_to: at(hi),
    }
}
