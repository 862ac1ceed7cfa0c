//! One step of a TensorFlow memory log as a plan: what a static plan would have needed for the
//! tensors BFC served during that step.
//!
//! The buffers are the allocations (tensor and raw) the log attributes to the step (`step_id`),
//! from the allocator whose records the memory-log loader kept. Kernels run in the order their
//! records appear, so time is the position among the events that concern those allocations
//! (their allocations and deallocations, in log order): a buffer lives from its allocation to
//! its deallocation, or to the end of the window when the log does not free it. Each buffer is
//! the request's size, aligned to 64 bytes like every TensorFlow allocation
//! (`Allocator::kAllocatorAlignment`); BFC's own 256-byte rounding is what the plan is compared
//! against, not part of it. The id is `<kernel>#<TF allocation id>`.
//!
//! By default the step with the most allocations is planned (training logs have one per
//! iteration; they are alike). TensorFlow's special step ids (-1 constant folding, -2 kernel
//! construction, -3 external tensors, -4 network and -5 proto buffers, -6 unknown:
//! `log_memory.h`) are no steps: they are chosen by default only when the log has no real one
//! (a training log's set-up under -6 has twenty times more allocations than an iteration).

use std::collections::HashMap;
use std::path::Path;

use allocview_sim::trace::{EventKind, NO_ALLOC_ID};

use super::{FrameColumns, MemoryPlan, PlanFormat, PlanRow, rows_frame};
use crate::error::LoadError;
use crate::tf::memlog::TfMemoryLog;

/// TensorFlow's allocation alignment (`Allocator::kAllocatorAlignment`).
pub const TF_ALIGN_BYTES: u64 = 64;

/// Allocations per step id, in order of first appearance.
#[must_use]
pub fn step_allocations(log: &TfMemoryLog) -> Vec<(i64, u64)> {
    let mut counts: Vec<(i64, u64)> = Vec::new();
    let mut at: HashMap<i64, usize> = HashMap::new();
    for r in &log.records {
        if !r.record.is_allocation() || r.alloc_id == NO_ALLOC_ID {
            continue;
        }
        let Some(step) = r.step else { continue };
        let slot = *at.entry(step).or_insert_with(|| {
            counts.push((step, 0));
            counts.len() - 1
        });
        if let Some(c) = counts.get_mut(slot) {
            c.1 += 1;
        }
    }
    counts
}

/// True for TensorFlow's special step ids (`LogMemory`'s -1 to -6), which name no step.
#[must_use]
pub fn is_special_step(step: i64) -> bool {
    (-6..=-1).contains(&step)
}

/// The plan of one step (`step`, or by default the real step with the most allocations, the
/// first such on a tie; a special step id only when there is no real step).
///
/// # Errors
/// When the log has no step with allocations, or `step` is not one of its steps.
pub fn plan_from_memory_log(
    log: &TfMemoryLog,
    step: Option<i64>,
    path: &Path,
) -> Result<MemoryPlan, LoadError> {
    let steps = step_allocations(log);
    let chosen = match step {
        Some(s) => steps
            .iter()
            .find(|(id, _)| *id == s)
            .copied()
            .ok_or_else(|| {
                let mut known: Vec<(i64, u64)> = steps.clone();
                known.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
                let list: Vec<String> = known
                    .iter()
                    .take(10)
                    .map(|(id, n)| format!("{id} ({n} allocations)"))
                    .collect();
                LoadError::format(
                    path,
                    format!(
                        "the memory log has no allocations in step {s}; its steps: {}{}",
                        list.join(", "),
                        if known.len() > 10 { ", ..." } else { "" }
                    ),
                )
            })?,
        None => steps
            .iter()
            .copied()
            .reduce(|best, x| {
                let key = |(s, n): (i64, u64)| (!is_special_step(s), n);
                if key(x) > key(best) { x } else { best }
            })
            .ok_or_else(|| {
                LoadError::format(
                    path,
                    "the memory log has no tensor allocation with a step id to plan",
                )
            })?,
    };
    let (step_id, _) = chosen;

    // alloc_id -> row index of the step's buffers.
    let mut row_of: HashMap<u32, usize> = HashMap::new();
    let mut rows: Vec<PlanRow> = Vec::new();
    let mut open: Vec<bool> = Vec::new();
    let mut time = 0u64;
    for r in &log.records {
        if r.alloc_id == NO_ALLOC_ID {
            continue;
        }
        match r.kind {
            EventKind::Alloc if r.record.is_allocation() && r.step == Some(step_id) => {
                let kernel = r.kernel.as_deref().unwrap_or("?");
                let mut row = PlanRow::new(
                    format!("{kernel}#{}", r.tf_alloc_id),
                    r.requested_bytes,
                    time,
                    time,
                );
                row.align_bytes = TF_ALIGN_BYTES;
                row_of.insert(r.alloc_id, rows.len());
                rows.push(row);
                open.push(true);
                time += 1;
            }
            EventKind::Free => {
                if let Some(&i) = row_of.get(&r.alloc_id)
                    && let (Some(row), Some(o)) = (rows.get_mut(i), open.get_mut(i))
                    && *o
                {
                    row.upper = time;
                    *o = false;
                    time += 1;
                }
            }
            _ => {}
        }
    }
    let mut still_live = 0u64;
    for (row, o) in rows.iter_mut().zip(&open) {
        if *o {
            row.upper = time;
            still_live += 1;
        }
    }
    // TF allocation ids are unique per allocator; should two clash, the dense id tells apart.
    let mut seen: HashMap<String, u32> = HashMap::new();
    for row in &mut rows {
        let n = seen.entry(row.id.clone()).or_insert(0);
        *n += 1;
        if *n > 1 {
            row.id = format!("{}~{n}", row.id);
        }
    }
    let notes = vec![format!(
        "step {step_id} of {} steps: {} allocations of allocator {:?} ({still_live} not freed \
         in the log: live to the end of the window)",
        steps.len(),
        rows.len(),
        log.allocator
    )];
    let buffers = rows_frame(&rows, FrameColumns { align: true })?;
    Ok(MemoryPlan {
        path: path.to_path_buf(),
        format: PlanFormat::TfMemoryLog,
        buffers,
        time_unit: "step event",
        notes,
        load_seconds: 0.0,
    })
}
