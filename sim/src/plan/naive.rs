//! `naive`: no reuse at all. Every buffer (every overwrite chain) gets its own slot, laid end to
//! end in input order, so the pool is the sum of the sizes (plus alignment padding). This is
//! TFLite's `NAIVE` strategy and the "bump allocator" baseline of memory-planning papers: the
//! figure planning is measured against. O(n).

use super::units::prepare;
use super::{Buffer, Plan, PlanError, SharedObjects, objects_plan};

/// One object per buffer; returns the plan and that (trivial) grouping.
///
/// # Errors
/// An input error of the buffers ([`super::validate()`]'s rules), or a bad alignment option.
pub fn plan(buffers: &[Buffer], align_bytes: u64) -> Result<(Plan, SharedObjects), PlanError> {
    let units = prepare(buffers, align_bytes)?;
    let unit_object: Vec<usize> = (0..units.units.len()).collect();
    let sizes = units.units.iter().map(|u| u.size_bytes).collect();
    objects_plan(&units, &unit_object, sizes)
}
