//! The inputs without a history, shown on screens of their own: a memory plan and a BFC
//! dump.

use super::heaps::bin_rows;
use super::vm::{HeapVm, PlanVm, ViewModel, Viewport};
use crate::format;
use crate::model::heapmap;
use crate::model::state::AppState;
use crate::model::trace_data::{DumpData, PlanData, TraceData};

/// A memory plan: the picture of the selected plan, the bound, and how the plans compare.
pub(super) fn plan_screen(vm: &mut ViewModel, p: &PlanData, state: &AppState, vp: &Viewport) {
    let Some((name, plan)) = p
        .plans
        .get(state.plan_index.min(p.plans.len().saturating_sub(1)))
    else {
        return;
    };
    // The picture takes the heap map's room; the frontend passes cells as width x height.
    let width = vp.plan_size.0.max(1);
    let height = vp.plan_size.1.max(1);
    let grid = crate::model::plan_view::rasterise(
        &p.buffers,
        plan,
        p.lower_bound_bytes,
        None,
        width,
        height,
    );
    let ratio = |t: u64| {
        if p.lower_bound_bytes == 0 {
            0.0
        } else {
            t as f64 / p.lower_bound_bytes as f64
        }
    };
    let mut lines = vec![format!(
        "{} buffers; lower bound (max live) {}; sum of sizes {}",
        format::count(p.buffers.len() as u64),
        format::bytes(p.lower_bound_bytes),
        format::bytes(p.naive_bytes)
    )];
    for (n, pl) in &p.plans {
        lines.push(format!(
            "{}{n}: {} ({:.3} x the bound)",
            if n == name { "> " } else { "  " },
            format::bytes(pl.total_bytes),
            ratio(pl.total_bytes)
        ));
    }
    lines.push("p: next plan   allocview plan FILE runs every planner".to_owned());
    vm.plan = Some(PlanVm {
        grid,
        time_unit: p.time_unit,
        title: format!(
            "plan: {name}, {} of pool (time across in {}s, address up)",
            format::bytes(plan.total_bytes),
            p.time_unit
        ),
        lines,
    });
    vm.events_title = "a plan has no events".to_owned();
    vm.status.left = format!("{}  memory plan", state.path.display());
    vm.status.right = format!(
        "{}: {} = {:.3} x the lower bound",
        name,
        format::bytes(plan.total_bytes),
        ratio(plan.total_bytes)
    );
}

/// A BFC dump has no history: its heap map, bins and what it says about the OOM.
pub(super) fn dump_screen(vm: &mut ViewModel, d: &DumpData, data: &TraceData, vp: &Viewport) {
    vm.heaps.push(HeapVm {
        policy: format!("TensorFlow dump of {}", d.allocator),
        map: Some(heapmap::rasterise(&d.blocks, vp.heap_cells)),
        caption: d
            .lines
            .get(usize::from(d.lines.len() > 1))
            .cloned()
            .unwrap_or_default(),
        note: None,
    });
    vm.bins = d.bins.as_deref().map(bin_rows);
    vm.dump_lines = d.lines.clone();
    vm.events_title = "a BFC dump is one moment of the heap: no events".to_owned();
    vm.status.left = format!("{}  TensorFlow BFC dump", data.path.display());
    vm.status.right = d.lines.first().cloned().unwrap_or_default();
}
