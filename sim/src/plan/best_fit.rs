//! `pushdown-best-fit`: MegEngine's `BEST_FIT` static allocator (`StaticMemAllocBestFit`), the
//! address-level sibling of [`super::pushdown`]: the same event sweep (frees, then allocations,
//! at each time), but addresses are chosen directly and never pushed down afterwards.
//!
//! Free chunks are indexed by address (for merging) and by (usable size, address), where the
//! usable size is what remains after rounding the chunk's start up to the alignment. An
//! allocation takes the free chunk with the smallest usable size that fits, lowest address on a
//! tie, and splits it into alignment padding, the allocation and the rest, the outer two staying
//! free. If no chunk fits, it bumps the top of the pool (the padding up to the next aligned top
//! becomes a free chunk). A free chunk touching the top is never grown into, as in MegEngine.
//! Frees merge with free neighbours by address. One alignment serves every buffer: the largest of
//! the option and the buffers' own. O(log n) per step, O(n log n) in all.

use std::collections::{BTreeMap, BTreeSet};

use super::pushdown::{Step, event_order};
use super::units::{Unit, prepare};
use super::{Buffer, Plan, PlanError, align_up};

/// Plans `buffers`; `align_bytes` is the minimum alignment of every buffer.
///
/// # Errors
/// An input error of the buffers ([`super::validate()`]'s rules), or a bad alignment option.
pub fn plan(buffers: &[Buffer], align_bytes: u64) -> Result<Plan, PlanError> {
    let units = prepare(buffers, align_bytes)?;
    let offsets = unit_offsets(&units.units)?;
    units.expand(&offsets, 0)
}

struct FreeChunks {
    align: u64,
    /// start -> end.
    by_addr: BTreeMap<u64, u64>,
    /// (usable size, start).
    by_size: BTreeSet<(u64, u64)>,
}

impl FreeChunks {
    fn usable(&self, start: u64, end: u64) -> u64 {
        align_up(start, self.align).map_or(0, |a| end.saturating_sub(a))
    }

    fn insert(&mut self, start: u64, end: u64) {
        if start < end {
            self.by_addr.insert(start, end);
            self.by_size.insert((self.usable(start, end), start));
        }
    }

    fn remove(&mut self, start: u64) -> Option<u64> {
        let end = self.by_addr.remove(&start)?;
        self.by_size.remove(&(self.usable(start, end), start));
        Some(end)
    }

    /// Frees `[start, end)`, merging with free neighbours.
    fn release(&mut self, mut start: u64, mut end: u64) {
        if let Some((&ps, &pe)) = self.by_addr.range(..start).next_back()
            && pe == start
        {
            self.remove(ps);
            start = ps;
        }
        if let Some(ne) = self.by_addr.get(&end).copied() {
            self.remove(end);
            end = ne;
        }
        self.insert(start, end);
    }
}

/// BEST_FIT offsets of planning units.
pub(crate) fn unit_offsets(units: &[Unit]) -> Result<Vec<u64>, PlanError> {
    let align = units.iter().map(|u| u.align_bytes).max().unwrap_or(1);
    let mut chunks = FreeChunks {
        align,
        by_addr: BTreeMap::new(),
        by_size: BTreeSet::new(),
    };
    let mut top: u64 = 0;
    let mut offsets = vec![0u64; units.len()];
    for step in event_order(units) {
        match step {
            Step::Alloc(i) => {
                let size = units.get(i).map_or(0, |u| u.size_bytes);
                let fit = chunks.by_size.range((size, 0)..).next().copied();
                let at = match fit {
                    Some((_, start)) => {
                        let end = chunks.remove(start).unwrap_or(start);
                        let at = align_up(start, align).ok_or(PlanError::Overflow)?;
                        chunks.insert(start, at);
                        chunks.insert(at + size, end);
                        at
                    }
                    None => {
                        let at = top;
                        let end = top.checked_add(size).ok_or(PlanError::Overflow)?;
                        top = align_up(end, align).ok_or(PlanError::Overflow)?;
                        chunks.insert(end, top);
                        at
                    }
                };
                if let Some(o) = offsets.get_mut(i) {
                    *o = at;
                }
            }
            Step::Free(i) => {
                let start = offsets.get(i).copied().unwrap_or(0);
                let size = units.get(i).map_or(0, |u| u.size_bytes);
                chunks.release(start, start + size);
            }
        }
    }
    Ok(offsets)
}
