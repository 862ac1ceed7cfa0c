//! The view-model: plain data computed from [`AppState`] for a given screen geometry. Both
//! frontends draw only from it; numbers are formatted here once so every output agrees.
//!
//! - `vm`: the view-model's types, re-exported here;
//! - `status`: what every screen shows (the status line, the prompt, the help, the load);
//! - `timeline`: the series over the zoomed window;
//! - `heaps`: the heap maps and the BFC bins at the cursor;
//! - `panels`: the sites panel, the cursor's frames and the size classes;
//! - `events`: the event list around the cursor;
//! - `screens`: a memory plan's and a BFC dump's own screens.

mod events;
mod heaps;
mod panels;
mod screens;
mod status;
mod timeline;
mod vm;

pub use vm::{
    BinVm, ClassRowVm, EventRowVm, HELP, HeapVm, HeatmapVm, LineVm, PlanVm, SITE_PALETTE, SiteVm,
    SitesVm, StatusVm, TimelineVm, ViewModel, Viewport,
};

use super::state::AppState;

/// Builds the view-model.
#[must_use]
pub fn view_model(state: &AppState, vp: &Viewport) -> ViewModel {
    let mut vm = status::frame(state);
    let Some(data) = state.data.as_ref() else {
        if vm.error.is_none() {
            vm.loading = Some(status::loading(state));
        }
        return vm;
    };
    if data.is_empty() {
        if let Some(d) = &data.dump {
            screens::dump_screen(&mut vm, d, data, vp);
        }
        if let Some(p) = &data.plan {
            screens::plan_screen(&mut vm, p, state, vp);
        }
        return vm;
    }
    if let Some(d) = &data.dump {
        // A memory log that ends in a dump: say what the dump said.
        vm.dump_lines = d.lines.clone();
    }
    if let Some(s) = &data.snapshot {
        vm.dump_lines = s.lines.clone();
        panels::cursor_frames(&mut vm, data, state.cursor);
    }
    vm.has_ops = data.events.column("kernel").is_ok();
    let view = data.view();
    let n = view.len();
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    let t_cursor = view.t_ns.get(state.cursor).copied().unwrap_or(t0) - t0;

    vm.timeline = Some(timeline::timeline(state, vp));
    vm.overview = data
        .scan
        .as_ref()
        .zip(data.part)
        .map(|(scan, part)| super::overview::OverviewVm::new(&scan.overview(), part));
    vm.sites = panels::sites_panel(state, vp);
    vm.heaps = heaps::heap_panels(state, vp, n);
    vm.bins = heaps::selected_bins(state);
    if let Some(classes) = &state.classes {
        vm.classes = panels::class_rows(state, classes, &view);
        vm.heatmap = Some(panels::heatmap(state, classes, vp.heat_columns));
    }
    vm.events = events::event_rows(state, data, &view, vp.event_rows, vm.has_ops);
    vm.events_title = events::events_title(&state.filter);
    vm.status.left = status::status_left(state, data, n);
    vm.status.right = status::status_right(state, n, t_cursor);
    vm
}

/// The hover text over cell `(col, row)` of the plan picture `vm` shows: the buffer there.
#[must_use]
pub fn plan_hover(state: &AppState, vm: &PlanVm, col: usize, row: usize) -> Option<String> {
    let data = state.data.as_ref()?;
    let p = data.plan.as_ref()?;
    let (_, plan) = p
        .plans
        .get(state.plan_index.min(p.plans.len().saturating_sub(1)))?;
    super::plan_view::describe_cell(&p.buffers, plan, &vm.grid, col, row, vm.time_unit)
}
