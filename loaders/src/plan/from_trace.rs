//! A malloc trace as a plan: what an allocator that knew the future could have done.
//!
//! One buffer per allocation, in allocation-id order: its lifetime is `[index of its alloc
//! event, index of its free event)`, or up to the number of events when it is never freed, so
//! the time unit is the event. Its size is the request; a zero-byte request is planned as one
//! byte, because `malloc(0)` hands out an address of its own. This is exactly the conversion
//! the `oracle` policy (`allocview_sim::policy::oracle`) plans at its construction: that module
//! keeps it private, so it is written again here, and a test checks that greedy-by-size plans
//! both to the same size.

use std::path::Path;

use allocview_sim::plan::Buffer;
use allocview_sim::trace::TraceView;

use super::{FrameColumns, MemoryPlan, PlanFormat, PlanRow, rows_frame};
use crate::error::LoadError;

/// One buffer per allocation of `trace`, indexed by allocation id: the simulator's
/// conversion, the one the `oracle` policy plans.
#[must_use]
pub fn trace_buffers(trace: &TraceView<'_>) -> Vec<Buffer> {
    allocview_sim::plan::trace_buffers(trace)
}

/// The plan of a trace: ids are the allocation ids.
///
/// # Errors
/// A polars error building the DataFrame.
pub fn plan_from_trace(trace: &TraceView<'_>, path: &Path) -> Result<MemoryPlan, LoadError> {
    let rows: Vec<PlanRow> = trace_buffers(trace)
        .into_iter()
        .enumerate()
        .map(|(id, b)| PlanRow::new(id.to_string(), b.size_bytes, b.lower, b.upper))
        .collect();
    let never_freed = rows
        .iter()
        .filter(|r| r.upper == trace.len() as u64)
        .count();
    let buffers = rows_frame(&rows, FrameColumns::default())?;
    Ok(MemoryPlan {
        path: path.to_path_buf(),
        format: PlanFormat::MallocTrace,
        buffers,
        time_unit: "event",
        notes: vec![format!(
            "{} allocations over {} events ({never_freed} never freed: live to the end)",
            rows.len(),
            trace.len()
        )],
        load_seconds: 0.0,
    })
}
