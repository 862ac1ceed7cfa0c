//! Lookups of one place in a layout: the top of a heap held up to its highest live allocation
//! ([`crate::policy::Policy::held_up_to_tops`]) and the live allocations on either side of an
//! address, found by searching the tiers rather than laying out the heap.

use super::{CHUNK, LayoutIndex};
use crate::heap::{Addr, Block};

impl LayoutIndex {
    /// The end of the highest allocation live at `pos` in `[base, below)` (`base` when none
    /// is): the long tier, in address order, is searched down from `below`, passing over the
    /// runs all unborn or all dead at `pos` (the others entry by entry, so a heap that shrank
    /// below many long-lived allocations of other times costs a scan of them), and the short
    /// tier's allocations born within its life span are looked at.
    pub(super) fn top_at(&self, pos: u32, base: Addr, below: Addr) -> Addr {
        let (s, l) = (&self.short, &self.long);
        let short_top = self
            .live_short_unsorted(pos, base..below)
            .map(|(a, j)| a + s.lengths.get(j).0)
            .max();
        let within = l.addr.first_at_or_above(base)..l.addr.first_at_or_above(below);
        let long_top = self
            .first_live_long(pos, within, true)
            .map(|i| l.addr.at(i) + l.lengths.get(i).0);
        short_top.max(long_top).unwrap_or(base)
    }

    /// The live allocation at `pos` that starts highest at or below `addr`, and the start of
    /// the lowest one above `addr`, among those starting in `within`.
    pub(super) fn live_around(
        &self,
        pos: u32,
        addr: Addr,
        within: std::ops::Range<Addr>,
    ) -> (Option<Block>, Option<Addr>) {
        let short = self.live_short(pos, within.clone());
        let k = short.partition_point(|&(a, _)| a <= addr);
        let short_below = k
            .checked_sub(1)
            .and_then(|k| short.get(k))
            .map(|&(_, j)| self.short.block(j));
        let short_above = short.get(k).map(|&(a, _)| a);
        let l = &self.long;
        let split = l.addr.first_at_or_above(addr.saturating_add(1));
        let lo = l.addr.first_at_or_above(within.start);
        let hi = l.addr.first_at_or_above(within.end);
        let long_below = self
            .first_live_long(pos, lo..split.min(hi), true)
            .map(|i| l.block(i));
        let long_above = self
            .first_live_long(pos, split.max(lo)..hi, false)
            .map(|i| l.addr.at(i));
        let below = match (short_below, long_below) {
            (Some(a), Some(b)) => Some(if a.addr > b.addr { a } else { b }),
            (a, b) => a.or(b),
        };
        let above = match (short_above, long_above) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        (below, above)
    }

    /// The lowest (or, `downward`, the highest) long-lived allocation of `range` live at
    /// `pos`, passing over the runs all unborn or all dead then at once.
    fn first_live_long(
        &self,
        pos: u32,
        range: std::ops::Range<usize>,
        downward: bool,
    ) -> Option<usize> {
        let l = &self.long;
        let live = |j: usize| l.birth.at(j) <= pos && l.death.get(j).is_some_and(|&d| pos < d);
        let run_live = |c: usize| {
            matches!((self.chunk_birth.get(c), self.chunk_death.get(c)),
                (Some(&cb), Some(&cd)) if cb <= pos && pos < cd)
        };
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            // The run holding the next index to look at, clipped to what is left.
            let c = if downward {
                (hi - 1) / CHUNK
            } else {
                lo / CHUNK
            };
            let (from, to) = ((c * CHUNK).max(lo), ((c + 1) * CHUNK).min(hi));
            if run_live(c) {
                let found = if downward {
                    (from..to).rev().find(|&j| live(j))
                } else {
                    (from..to).find(|&j| live(j))
                };
                if found.is_some() {
                    return found;
                }
            }
            if downward {
                hi = from;
            } else {
                lo = to;
            }
        }
        None
    }
}
