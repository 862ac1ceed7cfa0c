//! `lower-bound`: what no plan can beat.
//!
//! - **Max live** (the offset problem's bound, Pisarchyk & Lee's "breadth"): the maximum over
//!   time of the bytes held. A sweep over starts and ends, ends first at equal times. An overwrite
//!   chain holds the bytes of its outermost live member (`units::live_pieces`), which is
//!   what any valid plan must give it. O(n log n).
//! - **Positional maximums** (the shared-object bound of TFLite's `internal.cc`): at each moment
//!   sort the live sizes in decreasing order; `posmax[k]` is the largest k-th size over time, and
//!   no set of shared objects totals less than `sum(posmax)`, because the k largest buffers live
//!   together need k distinct objects. Only the moments just before an end can hold a maximal live
//!   set, so only those are visited. O(n log n + sum of the live counts at those moments).
//!   Computed over planning units (overwrite chains held whole), as the shared-object planners see
//!   them.

use std::collections::BTreeMap;

use super::units::{live_pieces, prepare, structure};
use super::{Buffer, PlanError};

/// Both bounds of a buffer set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// No offset plan is smaller.
    pub max_live_bytes: u64,
    /// No shared-object plan is smaller.
    pub positional_max_bytes: u64,
}

/// Both bounds.
///
/// # Errors
/// An input error of the buffers ([`super::validate()`]'s rules).
pub fn lower_bound(buffers: &[Buffer]) -> Result<Bounds, PlanError> {
    Ok(Bounds {
        max_live_bytes: max_live_bytes(buffers)?,
        positional_max_bytes: positional_max_bytes(buffers)?,
    })
}

/// The maximum over time of the bytes that must be held.
///
/// # Errors
/// An input error of the buffers, or [`PlanError::Overflow`].
pub fn max_live_bytes(buffers: &[Buffer]) -> Result<u64, PlanError> {
    let s = structure(buffers)?;
    let pieces = live_pieces(buffers, &s);
    let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(pieces.len() * 2);
    for p in &pieces {
        let size = buffers.get(p.buffer).map_or(0, |b| b.size_bytes);
        events.push((p.lower, true, size));
        events.push((p.upper, false, size));
    }
    events.sort_unstable();
    let mut live: u64 = 0;
    let mut max: u64 = 0;
    for (_, is_start, size) in events {
        if is_start {
            live = live.checked_add(size).ok_or(PlanError::Overflow)?;
            max = max.max(live);
        } else {
            live = live.saturating_sub(size);
        }
    }
    Ok(max)
}

/// The most buffers live at one time (half-open lifetimes: one ending where another starts
/// does not count with it). Planners that compare a buffer with every object hold at least
/// this many objects, so it prices them before they run.
#[must_use]
pub fn max_live_buffers(buffers: &[Buffer]) -> usize {
    let mut events: Vec<(u64, bool)> = Vec::with_capacity(buffers.len() * 2);
    for b in buffers {
        events.push((b.lower, true));
        events.push((b.upper, false));
    }
    // Ends before starts at the same time.
    events.sort_unstable();
    let (mut live, mut max) = (0usize, 0usize);
    for (_, is_start) in events {
        if is_start {
            live += 1;
            max = max.max(live);
        } else {
            live = live.saturating_sub(1);
        }
    }
    max
}

/// The sum of the positional maximums.
///
/// # Errors
/// An input error of the buffers, or [`PlanError::Overflow`].
pub fn positional_max_bytes(buffers: &[Buffer]) -> Result<u64, PlanError> {
    let units = prepare(buffers, 1)?;
    let posmax = positional_maximums(units.units.iter().map(|u| (u.lower, u.upper, u.size_bytes)));
    posmax
        .iter()
        .try_fold(0u64, |acc, &x| acc.checked_add(x))
        .ok_or(PlanError::Overflow)
}

/// `posmax[k]` = the largest k-th largest live size over time, for `(lower, upper, size)`
/// intervals.
pub(crate) fn positional_maximums(items: impl Iterator<Item = (u64, u64, u64)>) -> Vec<u64> {
    let mut events: Vec<(u64, bool, u64)> = Vec::new();
    for (lower, upper, size) in items {
        if lower < upper {
            events.push((lower, true, size));
            events.push((upper, false, size));
        }
    }
    events.sort_unstable();
    // Multiset of live sizes: size -> count.
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    let mut posmax: Vec<u64> = Vec::new();
    let mut grew = false;
    for (_, is_start, size) in events {
        if is_start {
            *live.entry(size).or_insert(0) += 1;
            grew = true;
            continue;
        }
        if grew {
            // The live set just before this end is maximal: fold it into posmax.
            let mut k = 0;
            for (&s, &count) in live.iter().rev() {
                for _ in 0..count {
                    match posmax.get_mut(k) {
                        Some(p) => *p = (*p).max(s),
                        None => posmax.push(s),
                    }
                    k += 1;
                }
            }
            grew = false;
        }
        if let Some(c) = live.get_mut(&size) {
            *c -= 1;
            if *c == 0 {
                live.remove(&size);
            }
        }
    }
    posmax
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_live_buffers_counts_overlaps_not_touches() {
        let b = |lower, upper| Buffer::new(8, lower, upper);
        assert_eq!(max_live_buffers(&[]), 0);
        assert_eq!(max_live_buffers(&[b(0, 2), b(2, 4), b(4, 6)]), 1);
        assert_eq!(max_live_buffers(&[b(0, 10), b(1, 3), b(2, 5), b(5, 6)]), 3);
    }

    #[test]
    fn max_live_counts_touching_lifetimes_once() {
        let bufs = [
            Buffer::new(4, 0, 3),
            Buffer::new(5, 3, 9),
            Buffer::new(2, 2, 4),
        ];
        assert_eq!(max_live_bytes(&bufs), Ok(7));
    }

    #[test]
    fn overwrite_chain_holds_its_outermost_member() {
        // Parent 16 B over [0,3), child 4 B inside it over [2,8): from t=3 only 4 B are held,
        // so a 12 B buffer over [3,8) brings the peak to 16, not 28.
        let bufs = [
            Buffer::new(16, 0, 3),
            Buffer::new(4, 2, 8).overwriting(0, 0),
            Buffer::new(12, 3, 8),
        ];
        assert_eq!(max_live_bytes(&bufs), Ok(16));
    }

    #[test]
    fn positional_maximums_by_rank() {
        // t=0: {8, 2}; t=1: {5, 4, 3}. posmax = [8, 4, 3].
        let items = [(0, 1, 8), (0, 1, 2), (1, 2, 5), (1, 2, 4), (1, 2, 3)];
        assert_eq!(positional_maximums(items.into_iter()), vec![8, 4, 3]);
    }
}
