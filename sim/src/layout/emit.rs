//! The layout index's output side: [`BlockSink`], which receives a heap's blocks in address
//! order, and the [`Emitter`] that lays live blocks into the held ranges with the gaps between
//! them as free blocks, counting as it goes. A gap is one free block, or, for a buddy
//! allocator ([`crate::policy::Policy::gap_block_max_bytes`]), the largest aligned
//! power-of-two blocks that tile it: with every pair of free buddies merged, as a buddy
//! allocator keeps them, that tiling is the only one.

use crate::heap::{Addr, Block, BlockState, Counters};

/// Receives a heap's blocks in address order (see [`super::LayoutIndex::fold_blocks_at`]).
pub trait BlockSink {
    fn block(&mut self, b: Block);

    /// Whole held ranges with nothing live in them, in address order: each is one free block
    /// (none for an empty range), and together they lie back to back in the held space.
    #[inline]
    fn free_ranges(&mut self, ranges: &[(Addr, u64)]) {
        for &(addr, len_bytes) in ranges {
            if len_bytes > 0 {
                self.block(Block {
                    addr,
                    len_bytes,
                    state: BlockState::Free,
                });
            }
        }
    }
}

impl BlockSink for Vec<Block> {
    #[inline]
    fn block(&mut self, b: Block) {
        self.push(b);
    }
}

impl<T: BlockSink + ?Sized> BlockSink for &mut T {
    #[inline]
    fn block(&mut self, b: Block) {
        (**self).block(b);
    }

    #[inline]
    fn free_ranges(&mut self, ranges: &[(Addr, u64)]) {
        (**self).free_ranges(ranges);
    }
}

/// A sink that drops the blocks: their counters only.
impl BlockSink for () {
    #[inline]
    fn block(&mut self, _: Block) {}

    #[inline]
    fn free_ranges(&mut self, _: &[(Addr, u64)]) {}
}

/// Lays live blocks, in address order, into the held ranges, with the gaps as free blocks.
pub(super) struct Emitter<'a, S: BlockSink + ?Sized> {
    ranges: &'a [(Addr, u64)],
    out: &'a mut S,
    /// The range being filled.
    r: usize,
    /// Start of the space not yet emitted in range `r`.
    cursor: Addr,
    /// [`Counters::from_blocks`] of `out`, kept as it grows (one pass fewer over millions).
    counters: Counters,
    /// Largest free block of a buddy allocator's tiling of the gaps; `None`: a gap is one block.
    gap_max: Option<u64>,
}

impl<'a, S: BlockSink + ?Sized> Emitter<'a, S> {
    pub(super) fn new(ranges: &'a [(Addr, u64)], out: &'a mut S, gap_max: Option<u64>) -> Self {
        let cursor = ranges.first().map_or(0, |&(a, _)| a);
        Self {
            ranges,
            out,
            r: 0,
            cursor,
            counters: Counters::default(),
            gap_max,
        }
    }

    /// `None` when the block is outside every range or overlaps the previous one.
    #[inline]
    pub(super) fn used(&mut self, b: Block) -> Option<()> {
        // Close the range being filled if it ends before this block, and pass the whole
        // ranges between as they are (free).
        if let Some(&(ra, rl)) = self.ranges.get(self.r)
            && b.addr >= ra.saturating_add(rl)
        {
            self.close(ra + rl);
            self.skip_empty(b.addr);
        }
        let &(ra, rl) = self.ranges.get(self.r)?;
        if b.addr < ra.max(self.cursor) || b.addr + b.len_bytes > ra + rl {
            return None;
        }
        self.free(b.addr);
        self.cursor = b.addr + b.len_bytes;
        if let BlockState::Used {
            requested_bytes, ..
        } = b.state
        {
            self.counters.live_allocs += 1;
            self.counters.live_bytes += requested_bytes;
            self.counters.allocated_bytes += b.len_bytes;
        }
        self.out.block(b);
        Some(())
    }

    /// Emits the gap from the cursor to `to`, if any, as free blocks.
    fn free(&mut self, to: Addr) {
        let Some(max) = self.gap_max else {
            if to > self.cursor {
                self.free_block(self.cursor, to - self.cursor);
            }
            return;
        };
        let mut at = self.cursor;
        while at < to {
            let len_bytes = buddy_block_bytes(at, to - at, max);
            self.free_block(at, len_bytes);
            at += len_bytes;
        }
    }

    fn free_block(&mut self, addr: Addr, len_bytes: u64) {
        self.count_free(len_bytes);
        self.out.block(Block {
            addr,
            len_bytes,
            state: BlockState::Free,
        });
    }

    fn count_free(&mut self, len_bytes: u64) {
        self.counters.free_bytes += len_bytes;
        self.counters.free_blocks += 1;
        self.counters.largest_free_bytes = self.counters.largest_free_bytes.max(len_bytes);
    }

    fn close(&mut self, range_end: Addr) {
        self.free(range_end);
        self.r += 1;
        self.cursor = self.ranges.get(self.r).map_or(0, |&(a, _)| a);
    }

    /// Passes the whole ranges from the current one that end at or before `before` (none of
    /// them holds a live block) to the sink at once. A snapshot of two million segments has
    /// most of them empty at most events; they are found by galloping, so a block that skips
    /// none costs one comparison.
    fn skip_empty(&mut self, before: Addr) {
        let rest = self.ranges.get(self.r..).unwrap_or(&[]);
        let ends_before = |i: usize| {
            rest.get(i)
                .is_some_and(|&(a, l)| a.saturating_add(l) <= before)
        };
        if !ends_before(0) {
            return;
        }
        let mut hi = 1;
        while ends_before(hi) {
            hi *= 2;
        }
        let lo = hi / 2;
        let n = lo
            + rest.get(lo..hi.min(rest.len())).map_or(0, |w| {
                w.partition_point(|&(a, l)| a.saturating_add(l) <= before)
            });
        let empty = rest.get(..n).unwrap_or(&[]);
        if self.gap_max.is_some() {
            // Each range in buddy blocks, not whole.
            for &(a, l) in empty {
                self.cursor = a;
                self.free(a.saturating_add(l));
            }
        } else {
            for &(_, l) in empty {
                if l > 0 {
                    self.count_free(l);
                }
            }
            self.out.free_ranges(empty);
        }
        self.r += n;
        self.cursor = self.ranges.get(self.r).map_or(0, |&(a, _)| a);
    }

    /// Closes the remaining ranges; the counters of the blocks, but the footprint.
    pub(super) fn finish(mut self) -> Counters {
        if let Some(&(ra, rl)) = self.ranges.get(self.r) {
            self.cursor = self.cursor.max(ra);
            self.close(ra + rl);
            self.skip_empty(Addr::MAX);
        }
        self.counters
    }
}

/// The free block a buddy allocator holds at `addr` in a gap of `room` bytes from there: the
/// largest power of two that `addr` is aligned to, that fits, and is at most `max` (its
/// top-level block). Gaps lie between blocks of at least the buddy's smallest size, so this is
/// never below it; `room` is at least 1.
fn buddy_block_bytes(addr: Addr, room: u64, max: u64) -> u64 {
    let aligned = if addr == 0 {
        u64::MAX
    } else {
        1 << addr.trailing_zeros()
    };
    let fits = 1 << room.ilog2();
    aligned.min(fits).min(max.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buddy_gaps_tile_into_their_largest_aligned_blocks() {
        let mut out: Vec<Block> = Vec::new();
        // One range of 4 top blocks of 1 KiB; a live 64 B block at 0x140.
        let ranges = [(0, 4096)];
        let mut e = Emitter::new(&ranges, &mut out, Some(1024));
        e.used(Block {
            addr: 0x140,
            len_bytes: 64,
            state: BlockState::Used {
                id: 1,
                requested_bytes: 50,
            },
        });
        let c = e.finish();
        let blocks: Vec<(Addr, u64)> = out.iter().map(|b| (b.addr, b.len_bytes)).collect();
        assert_eq!(
            blocks,
            vec![
                (0, 256),
                (256, 64),
                (320, 64),
                (384, 128),
                (512, 512),
                (1024, 1024),
                (2048, 1024),
                (3072, 1024)
            ]
        );
        assert_eq!(
            (c.free_blocks, c.free_bytes, c.largest_free_bytes),
            (7, 4032, 1024)
        );
        assert_eq!(
            (c.live_allocs, c.live_bytes, c.allocated_bytes),
            (1, 50, 64)
        );
    }
}
