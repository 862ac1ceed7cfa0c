//! The allocator's memory as PyTorch keeps it: segments (one cudaMalloc each, or one expandable
//! VA reservation), the blocks that tile each segment, and per pool the free blocks ordered by
//! `(stream, size, address)` and the unmapped ranges ordered by `(stream, address)`.
//!
//! PyTorch links a segment's blocks through `prev`/`next` pointers; here the blocks live in one
//! address-ordered map and carry their segment's base, so a block's neighbours are the map
//! entries beside it that share that base, and "is split" means "is not the whole segment".
//! Every change goes through [`Heap::add`] and [`Heap::take`], which keep the pool sets, the
//! free-size multiset and the [`Counters`] in step with the map, and which an open transaction
//! journals so that [`Heap::rollback`] can undo a request that failed after releasing memory.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use super::{ScriptSegment, SegmentEvent, SegmentOp, SegmentOpKind};
use crate::heap::{Block, BlockState, Counters};

/// Index of the small pool in the per-pool arrays.
pub(super) const SMALL: usize = 0;
/// Index of the large pool in the per-pool arrays.
pub(super) const LARGE: usize = 1;

/// The per-pool array index of a pool.
pub(super) fn pool_index(small_pool: bool) -> usize {
    if small_pool { SMALL } else { LARGE }
}

/// What a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Occupant {
    /// Mapped and cached: in its pool's free set.
    Free,
    /// Mapped and handed out.
    Used { id: u32, requested_bytes: u64 },
    /// Reserved address space of an expandable segment with no memory behind it.
    Unmapped,
}

/// One block. Stream, pool and expandability are the segment's, copied so that a lookup needs
/// no second map access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BlockRec {
    pub size_bytes: u64,
    pub segment_addr: u64,
    pub stream: u64,
    pub small_pool: bool,
    pub expandable: bool,
    pub occupant: Occupant,
    /// The pool's `get_free_block` call count when the block entered the free set
    /// (`gc_count_base`); its age for garbage collection is the count now minus this.
    pub gc_base: u64,
}

impl BlockRec {
    /// The same block with another size and occupant.
    pub(super) fn with(self, size_bytes: u64, occupant: Occupant) -> Self {
        Self {
            size_bytes,
            occupant,
            ..self
        }
    }
}

/// One segment: a cudaMalloc'd range, or an expandable segment's whole VA reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SegmentRec {
    pub size_bytes: u64,
    pub stream: u64,
    pub small_pool: bool,
    pub expandable: bool,
}

/// A free-set key: `(stream, size, address)`, PyTorch's `BlockComparatorSize`.
pub(super) type PoolKey = (u64, u64, u64);

/// One journaled change, undone by its inverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Undo {
    Added(u64),
    Taken(u64, BlockRec),
    SegmentAdded(u64),
    SegmentRemoved(u64, SegmentRec),
}

/// An open transaction: the changes since [`Heap::begin`] and the event count then.
#[derive(Clone, Debug, Default)]
struct Journal {
    undo: Vec<Undo>,
    events_len: usize,
}

/// Segments, blocks and their indexes.
#[derive(Clone, Debug, Default)]
pub(super) struct Heap {
    blocks: BTreeMap<u64, BlockRec>,
    segments: BTreeMap<u64, SegmentRec>,
    free: [BTreeSet<PoolKey>; 2],
    unmapped: [BTreeSet<(u64, u64)>; 2],
    /// Multiset of free block sizes, for the largest free block in O(log n).
    free_sizes: BTreeMap<u64, u64>,
    /// `get_free_blocks_call_count` of each pool.
    gc_calls: [u64; 2],
    counters: Counters,
    events: Vec<SegmentEvent>,
    /// Bumped by every segment operation and every rollback, so observers can tell when the
    /// segments may have changed.
    segment_ops: u64,
    journal: Option<Journal>,
}

impl Heap {
    /// Starts journaling changes (a no-op when a transaction is already open).
    pub(super) fn begin(&mut self) {
        if self.journal.is_none() {
            self.journal = Some(Journal {
                undo: Vec::new(),
                events_len: self.events.len(),
            });
        }
    }

    /// Keeps every change since [`Self::begin`].
    pub(super) fn commit(&mut self) {
        self.journal = None;
    }

    /// Undoes every change since [`Self::begin`], events included.
    pub(super) fn rollback(&mut self) {
        let Some(journal) = self.journal.take() else {
            return;
        };
        for undo in journal.undo.into_iter().rev() {
            match undo {
                Undo::Added(addr) => {
                    self.take(addr);
                }
                Undo::Taken(addr, rec) => self.insert(addr, rec),
                Undo::SegmentAdded(addr) => {
                    self.segments.remove(&addr);
                }
                Undo::SegmentRemoved(addr, seg) => {
                    self.segments.insert(addr, seg);
                }
            }
        }
        self.events.truncate(journal.events_len);
        self.segment_ops += 1;
    }

    fn record(&mut self, undo: Undo) {
        if let Some(j) = &mut self.journal {
            j.undo.push(undo);
        }
    }

    pub(super) fn counters(&self) -> Counters {
        self.counters
    }

    pub(super) fn segment_ops(&self) -> u64 {
        self.segment_ops
    }

    pub(super) fn events(&self) -> &[SegmentEvent] {
        &self.events
    }

    /// Forgets the events from index `from` on that `drop` matches (a segment the policy made
    /// and then gave back unused).
    pub(super) fn forget_events(&mut self, from: usize, drop: impl Fn(&SegmentEvent) -> bool) {
        let tail = self.events.split_off(from.min(self.events.len()));
        self.events.extend(tail.into_iter().filter(|e| !drop(e)));
    }

    /// Records one cudaMalloc/cudaFree/map/unmap on behalf of request `alloc_id`.
    pub(super) fn log(&mut self, alloc_id: u32, kind: SegmentOpKind, addr: u64, size_bytes: u64) {
        self.segment_ops += 1;
        self.events.push(SegmentEvent {
            alloc_id,
            op: SegmentOp {
                kind,
                addr,
                size_bytes,
            },
        });
    }

    pub(super) fn block(&self, addr: u64) -> Option<BlockRec> {
        self.blocks.get(&addr).copied()
    }

    /// Free blocks of one pool in `(stream, size, address)` order.
    pub(super) fn free_set(&self, pool: usize) -> &BTreeSet<PoolKey> {
        &self.free[pool.min(LARGE)]
    }

    /// Unmapped ranges of one pool in `(stream, address)` order.
    pub(super) fn unmapped_set(&self, pool: usize) -> &BTreeSet<(u64, u64)> {
        &self.unmapped[pool.min(LARGE)]
    }

    /// Counts one `get_free_block` call on a pool (only while garbage collection is on).
    pub(super) fn bump_gc_calls(&mut self, pool: usize) {
        if let Some(c) = self.gc_calls.get_mut(pool) {
            *c += 1;
        }
    }

    /// `gc_count()`: `get_free_block` calls on the block's pool since it became free.
    pub(super) fn gc_age(&self, rec: &BlockRec) -> u64 {
        let calls = self
            .gc_calls
            .get(pool_index(rec.small_pool))
            .copied()
            .unwrap_or(0);
        calls.saturating_sub(rec.gc_base)
    }

    /// Inserts a block and indexes it by its occupant. A free block's age starts now.
    pub(super) fn add(&mut self, addr: u64, mut rec: BlockRec) {
        if rec.occupant == Occupant::Free {
            rec.gc_base = self
                .gc_calls
                .get(pool_index(rec.small_pool))
                .copied()
                .unwrap_or(0);
        }
        self.insert(addr, rec);
    }

    /// [`Self::add`] keeping the block's recorded age.
    fn insert(&mut self, addr: u64, rec: BlockRec) {
        self.record(Undo::Added(addr));
        let pool = pool_index(rec.small_pool);
        let c = &mut self.counters;
        match rec.occupant {
            Occupant::Free => {
                self.free[pool].insert((rec.stream, rec.size_bytes, addr));
                *self.free_sizes.entry(rec.size_bytes).or_insert(0) += 1;
                c.free_bytes += rec.size_bytes;
                c.free_blocks += 1;
                c.footprint_bytes += rec.size_bytes;
            }
            Occupant::Used {
                requested_bytes, ..
            } => {
                c.live_allocs += 1;
                c.live_bytes += requested_bytes;
                c.allocated_bytes += rec.size_bytes;
                c.footprint_bytes += rec.size_bytes;
            }
            Occupant::Unmapped => {
                self.unmapped[pool].insert((rec.stream, addr));
            }
        }
        self.blocks.insert(addr, rec);
        self.refresh_largest();
    }

    /// Removes the block at `addr` and unindexes it.
    pub(super) fn take(&mut self, addr: u64) -> Option<BlockRec> {
        let rec = self.blocks.remove(&addr)?;
        self.record(Undo::Taken(addr, rec));
        let pool = pool_index(rec.small_pool);
        let c = &mut self.counters;
        match rec.occupant {
            Occupant::Free => {
                self.free[pool].remove(&(rec.stream, rec.size_bytes, addr));
                if let Some(n) = self.free_sizes.get_mut(&rec.size_bytes) {
                    *n -= 1;
                    if *n == 0 {
                        self.free_sizes.remove(&rec.size_bytes);
                    }
                }
                c.free_bytes -= rec.size_bytes;
                c.free_blocks -= 1;
                c.footprint_bytes -= rec.size_bytes;
            }
            Occupant::Used {
                requested_bytes, ..
            } => {
                c.live_allocs -= 1;
                c.live_bytes -= requested_bytes;
                c.allocated_bytes -= rec.size_bytes;
                c.footprint_bytes -= rec.size_bytes;
            }
            Occupant::Unmapped => {
                self.unmapped[pool].remove(&(rec.stream, addr));
            }
        }
        self.refresh_largest();
        Some(rec)
    }

    fn refresh_largest(&mut self) {
        self.counters.largest_free_bytes = self.free_sizes.keys().next_back().copied().unwrap_or(0);
    }

    /// The block that contains `addr`, if any.
    pub(super) fn containing(&self, addr: u64) -> Option<(u64, BlockRec)> {
        let (&a, rec) = self.blocks.range(..=addr).next_back()?;
        (addr - a < rec.size_bytes).then_some((a, *rec))
    }

    /// The block of segment `segment_addr` that ends at `addr` (PyTorch's `prev`).
    pub(super) fn prev_of(&self, addr: u64, segment_addr: u64) -> Option<(u64, BlockRec)> {
        let (&a, rec) = self.blocks.range(..addr).next_back()?;
        (rec.segment_addr == segment_addr && a + rec.size_bytes == addr).then_some((a, *rec))
    }

    /// The block of segment `segment_addr` that starts at `end` (PyTorch's `next`).
    pub(super) fn next_of(&self, end: u64, segment_addr: u64) -> Option<(u64, BlockRec)> {
        let rec = self.blocks.get(&end)?;
        (rec.segment_addr == segment_addr).then_some((end, *rec))
    }

    /// True when the block is its segment's only block (PyTorch: `!prev && !next`).
    pub(super) fn is_whole_segment(&self, addr: u64, rec: &BlockRec) -> bool {
        addr == rec.segment_addr
            && self
                .segments
                .get(&addr)
                .is_some_and(|s| s.size_bytes == rec.size_bytes)
    }

    /// Merges the free (or unmapped) block at `addr` with a previous and a next neighbour of
    /// the same occupant in its segment, as `try_merge_blocks` does with `prev` then `next`;
    /// returns the merged block's address. The merged block re-enters its set, so a free one
    /// is young again.
    pub(super) fn coalesce(&mut self, addr: u64) -> u64 {
        let Some(rec) = self.take(addr) else {
            return addr;
        };
        let mut start = addr;
        let mut size_bytes = rec.size_bytes;
        if let Some((pa, prev)) = self.prev_of(addr, rec.segment_addr)
            && prev.occupant == rec.occupant
        {
            self.take(pa);
            start = pa;
            size_bytes += prev.size_bytes;
        }
        if let Some((na, next)) = self.next_of(addr + rec.size_bytes, rec.segment_addr)
            && next.occupant == rec.occupant
        {
            self.take(na);
            size_bytes += next.size_bytes;
        }
        self.add(start, rec.with(size_bytes, rec.occupant));
        start
    }

    /// Adds a segment made of one block (free for a cudaMalloc, unmapped for a VA
    /// reservation). False, changing nothing, when the range is empty, wraps or overlaps a
    /// segment.
    pub(super) fn create_segment(
        &mut self,
        addr: u64,
        seg: SegmentRec,
        occupant: Occupant,
    ) -> bool {
        if seg.size_bytes == 0 || !self.range_is_unused(addr, seg.size_bytes) {
            return false;
        }
        self.segments.insert(addr, seg);
        self.record(Undo::SegmentAdded(addr));
        self.add(
            addr,
            BlockRec {
                size_bytes: seg.size_bytes,
                segment_addr: addr,
                stream: seg.stream,
                small_pool: seg.small_pool,
                expandable: seg.expandable,
                occupant,
                gc_base: 0,
            },
        );
        true
    }

    /// Removes a segment that is a single free or unmapped block.
    pub(super) fn remove_segment(&mut self, addr: u64) -> Option<SegmentRec> {
        let rec = self.block(addr)?;
        if !self.is_whole_segment(addr, &rec) || matches!(rec.occupant, Occupant::Used { .. }) {
            return None;
        }
        self.take(addr);
        let seg = self.segments.remove(&addr)?;
        self.record(Undo::SegmentRemoved(addr, seg));
        Some(seg)
    }

    /// True when `[addr, addr + len)` is a valid range that overlaps no segment.
    pub(super) fn range_is_unused(&self, addr: u64, len_bytes: u64) -> bool {
        let Some(end) = addr.checked_add(len_bytes) else {
            return false;
        };
        let below_clear = self
            .segments
            .range(..=addr)
            .next_back()
            .is_none_or(|(&a, s)| a + s.size_bytes <= addr);
        let above_clear = self
            .segments
            .range((Bound::Excluded(addr), Bound::Unbounded))
            .next()
            .is_none_or(|(&a, _)| a >= end);
        below_clear && above_clear
    }

    /// The lowest `align_bytes`-aligned address at or above `base` where `len_bytes` fit
    /// between segments (cudaMalloc and VA reservations as first fit over the device).
    pub(super) fn lowest_fit(&self, base: u64, len_bytes: u64, align_bytes: u64) -> Option<u64> {
        let mut candidate = base.checked_next_multiple_of(align_bytes)?;
        for (&a, s) in &self.segments {
            let end = a + s.size_bytes;
            if end <= candidate {
                continue;
            }
            if a >= candidate.checked_add(len_bytes)? {
                break;
            }
            candidate = end.checked_next_multiple_of(align_bytes)?;
        }
        candidate.checked_add(len_bytes).map(|_| candidate)
    }

    /// One past the highest segment end (0 without segments).
    pub(super) fn highest_end(&self) -> u64 {
        self.segments
            .iter()
            .next_back()
            .map_or(0, |(&a, s)| a + s.size_bytes)
    }

    /// Start of the first segment above `addr`, if any.
    pub(super) fn next_segment_start(&self, addr: u64) -> Option<u64> {
        self.segments
            .range((Bound::Excluded(addr), Bound::Unbounded))
            .next()
            .map(|(&a, _)| a)
    }

    /// Appends the mapped blocks (free and used) in address order.
    pub(super) fn append_blocks(&self, out: &mut Vec<Block>) {
        out.extend(self.blocks.iter().filter_map(|(&addr, rec)| {
            let state = match rec.occupant {
                Occupant::Free => BlockState::Free,
                Occupant::Used {
                    id,
                    requested_bytes,
                } => BlockState::Used {
                    id,
                    requested_bytes,
                },
                Occupant::Unmapped => return None,
            };
            Some(Block {
                addr,
                len_bytes: rec.size_bytes,
                state,
            })
        }));
    }

    /// Segments as a snapshot reports them: one per cudaMalloc, and one per maximal mapped
    /// range of an expandable segment.
    pub(super) fn segment_list(&self) -> Vec<ScriptSegment> {
        let mut out: Vec<ScriptSegment> = Vec::new();
        for (&addr, seg) in &self.segments {
            let describe = |a: u64, size_bytes: u64| ScriptSegment {
                addr: a,
                size_bytes,
                small_pool: seg.small_pool,
                stream: seg.stream,
                expandable: seg.expandable,
            };
            if !seg.expandable {
                out.push(describe(addr, seg.size_bytes));
                continue;
            }
            let mut run: Option<(u64, u64)> = None;
            for (&a, rec) in self.blocks.range(addr..addr + seg.size_bytes) {
                match (rec.occupant, &mut run) {
                    (Occupant::Unmapped, _) => {
                        if let Some((s, len)) = run.take() {
                            out.push(describe(s, len));
                        }
                    }
                    (_, Some((_, len))) => *len += rec.size_bytes,
                    (_, None) => run = Some((a, rec.size_bytes)),
                }
            }
            if let Some((s, len)) = run {
                out.push(describe(s, len));
            }
        }
        out
    }

    /// Full self-check: blocks tile their segments, each index holds exactly the blocks it
    /// should, and the counters agree with the blocks.
    pub(super) fn check(&self, page_bytes: impl Fn(bool) -> u64) -> Result<(), String> {
        self.check_tiling(page_bytes)?;
        let mut free: [BTreeSet<PoolKey>; 2] = Default::default();
        let mut unmapped: [BTreeSet<(u64, u64)>; 2] = Default::default();
        let mut sizes: BTreeMap<u64, u64> = BTreeMap::new();
        for (&a, rec) in &self.blocks {
            let pool = pool_index(rec.small_pool);
            match rec.occupant {
                Occupant::Free => {
                    free[pool].insert((rec.stream, rec.size_bytes, a));
                    *sizes.entry(rec.size_bytes).or_insert(0) += 1;
                }
                Occupant::Unmapped => {
                    unmapped[pool].insert((rec.stream, a));
                }
                Occupant::Used { .. } => {}
            }
        }
        if free != self.free {
            return Err("free sets disagree with the free blocks".to_owned());
        }
        if unmapped != self.unmapped {
            return Err("unmapped sets disagree with the unmapped blocks".to_owned());
        }
        if sizes != self.free_sizes {
            return Err("free-size multiset disagrees with the free blocks".to_owned());
        }
        let mut blocks = Vec::new();
        self.append_blocks(&mut blocks);
        let footprint_bytes = blocks.iter().map(|b| b.len_bytes).sum();
        let expected = Counters::from_blocks(&blocks, footprint_bytes);
        if expected != self.counters {
            return Err(format!(
                "counters {:?} but blocks give {expected:?}",
                self.counters
            ));
        }
        Ok(())
    }

    /// Blocks tile each segment exactly, carry its attributes, and (expandable) mapped ranges
    /// are whole pages.
    fn check_tiling(&self, page_bytes: impl Fn(bool) -> u64) -> Result<(), String> {
        let mut expected_next: Option<(u64, u64)> = None; // (segment, next block address)
        let mut prev_seg_end = 0u64;
        for (&addr, seg) in &self.segments {
            if addr < prev_seg_end {
                return Err(format!("segment {addr:#x} overlaps the one before it"));
            }
            prev_seg_end = addr + seg.size_bytes;
        }
        for (&a, rec) in &self.blocks {
            let seg = self
                .segments
                .get(&rec.segment_addr)
                .ok_or_else(|| format!("block {a:#x} names no segment"))?;
            let attrs = (seg.stream, seg.small_pool, seg.expandable);
            if attrs != (rec.stream, rec.small_pool, rec.expandable) || rec.size_bytes == 0 {
                return Err(format!("block {a:#x} disagrees with its segment"));
            }
            let start_ok = match expected_next {
                Some((s, next)) if s == rec.segment_addr => a == next,
                _ => a == rec.segment_addr,
            };
            if !start_ok {
                return Err(format!(
                    "block {a:#x} leaves a gap or overlaps in its segment"
                ));
            }
            let end = a + rec.size_bytes;
            if end > rec.segment_addr + seg.size_bytes {
                return Err(format!("block {a:#x} runs past its segment"));
            }
            if seg.expandable && rec.occupant == Occupant::Unmapped {
                let page = page_bytes(seg.small_pool).max(1);
                if (a - rec.segment_addr) % page != 0 || rec.size_bytes % page != 0 {
                    return Err(format!("unmapped range {a:#x} is not whole pages"));
                }
            }
            expected_next = Some((rec.segment_addr, end));
        }
        for (&addr, seg) in &self.segments {
            let last = self.blocks.range(addr..addr + seg.size_bytes).next_back();
            if last.is_none_or(|(&a, r)| a + r.size_bytes != addr + seg.size_bytes) {
                return Err(format!("segment {addr:#x} is not tiled to its end"));
            }
        }
        Ok(())
    }
}
