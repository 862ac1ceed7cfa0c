//! The layout index's output side: [`BlockSink`], which receives a heap's blocks in address
//! order, and the [`Emitter`] that lays live blocks into the held ranges with the gaps between
//! them as free blocks, counting as it goes.

use crate::policy::{Addr, Block, BlockState, Counters};

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
}

impl<'a, S: BlockSink + ?Sized> Emitter<'a, S> {
    pub(super) fn new(ranges: &'a [(Addr, u64)], out: &'a mut S) -> Self {
        let cursor = ranges.first().map_or(0, |&(a, _)| a);
        Self {
            ranges,
            out,
            r: 0,
            cursor,
            counters: Counters::default(),
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

    /// Emits the gap from the cursor to `to`, if any, as a free block.
    fn free(&mut self, to: Addr) {
        if to > self.cursor {
            let len_bytes = to - self.cursor;
            self.counters.free_bytes += len_bytes;
            self.counters.free_blocks += 1;
            self.counters.largest_free_bytes = self.counters.largest_free_bytes.max(len_bytes);
            self.out.block(Block {
                addr: self.cursor,
                len_bytes,
                state: BlockState::Free,
            });
        }
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
        for &(_, l) in empty {
            if l > 0 {
                self.counters.free_bytes += l;
                self.counters.free_blocks += 1;
                self.counters.largest_free_bytes = self.counters.largest_free_bytes.max(l);
            }
        }
        self.out.free_ranges(empty);
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
