//! `greedy-by-size`: TFLite's offset planner (`GreedyBySizeAssignment`, Pisarchyk & Lee 2020,
//! Algorithm 3; the same rule as XLA's spatial `GlobalDecreasingSizeBestFitHeap`).
//!
//! Buffers are taken largest first (a stable sort, so equal sizes keep input order). Each one
//! looks only at the already placed buffers whose lifetimes intersect its own, in increasing
//! offset order, tracking the highest end seen so far (`prev_end`, from 0). Every time the next
//! placed buffer starts at or above `prev_end` (rounded up to the alignment), the hole between is
//! a candidate; the smallest hole that fits wins, the lowest on a tie. If none fits, the buffer
//! goes at the final `prev_end`, on top of everything it meets. The pool is the highest end.
//!
//! TFLite scans every placed buffer for each new one (quadratic). Here an interval index over
//! time ([`super::interval_index`]) returns just the k buffers that intersect, so a buffer costs
//! O((k + 1) log n + k log k) and the plan O(n log n + sum of k log n).

use super::interval_index::IntervalIndex;
use super::units::{Unit, prepare};
use super::{Buffer, Plan, PlanError, align_up};

/// Plans `buffers`; `align_bytes` is the minimum alignment of every buffer (TFLite's
/// `base_addr_align_bytes`).
///
/// # Errors
/// An input error of the buffers ([`super::validate`]'s rules), or a bad alignment option.
pub fn plan(buffers: &[Buffer], align_bytes: u64) -> Result<Plan, PlanError> {
    let units = prepare(buffers, align_bytes)?;
    let offsets = unit_offsets(&units.units)?;
    units.expand(&offsets, 0)
}

/// Greedy-by-size offsets of planning units (shared with `search`, which starts from them).
pub(crate) fn unit_offsets(units: &[Unit]) -> Result<Vec<u64>, PlanError> {
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by(|&a, &b| {
        let size = |i: usize| units.get(i).map_or(0, |u| u.size_bytes);
        size(b).cmp(&size(a))
    });
    let spans: Vec<(u64, u64)> = units.iter().map(|u| (u.lower, u.upper)).collect();
    let mut index = IntervalIndex::new(&spans);
    let mut offsets = vec![0u64; units.len()];
    let mut hits: Vec<u32> = Vec::new();
    let mut stack = Vec::new();
    let mut placed: Vec<(u64, u64)> = Vec::new();
    for i in order {
        let Some(u) = units.get(i) else { continue };
        hits.clear();
        index.overlapping(u.lower, u.upper, &mut hits, &mut stack);
        placed.clear();
        placed.extend(hits.iter().filter_map(|&j| {
            let off = offsets.get(j as usize).copied()?;
            let size = units.get(j as usize)?.size_bytes;
            Some((off, off + size))
        }));
        placed.sort_unstable();
        let offset = best_fit_offset(&placed, u.size_bytes, u.align_bytes)?;
        if let Some(o) = offsets.get_mut(i) {
            *o = offset;
        }
        index.insert(i);
    }
    Ok(offsets)
}

/// The best-fit rule over the `(offset, end)` ranges (sorted by offset) of the placed buffers a
/// new one of `size` meets.
fn best_fit_offset(placed: &[(u64, u64)], size: u64, align: u64) -> Result<u64, PlanError> {
    let mut prev_end: u64 = 0;
    let mut best: Option<(u64, u64)> = None; // (hole size, offset)
    for &(off, end) in placed {
        let start = align_up(prev_end, align).ok_or(PlanError::Overflow)?;
        if off >= start {
            let hole = off - start;
            if hole >= size && best.is_none_or(|(h, _)| hole < h) {
                best = Some((hole, start));
            }
        }
        prev_end = prev_end.max(end);
    }
    match best {
        Some((_, offset)) => Ok(offset),
        None => align_up(prev_end, align).ok_or(PlanError::Overflow),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smallest_fitting_hole_wins_lowest_on_a_tie() {
        // Holes [2,6) (4 B) and [8,11) (3 B): a 3-byte buffer takes the tighter one.
        let placed = [(0, 2), (6, 8), (11, 12)];
        assert_eq!(best_fit_offset(&placed, 3, 1), Ok(8));
        assert_eq!(best_fit_offset(&placed, 4, 1), Ok(2));
        assert_eq!(best_fit_offset(&placed, 5, 1), Ok(12));
        // Two equal holes: the lower one.
        assert_eq!(best_fit_offset(&[(2, 4), (6, 8)], 2, 1), Ok(0));
    }

    #[test]
    fn alignment_rounds_each_hole_start() {
        // With alignment 8 the hole after [0,3) starts at 8: [8,16) fits 8 bytes, [8,12) does not.
        assert_eq!(best_fit_offset(&[(0, 3), (16, 20)], 8, 8), Ok(8));
        assert_eq!(best_fit_offset(&[(0, 3), (12, 20)], 8, 8), Ok(24));
    }
}
