//! `malloc` and `free` (reference sections 2.3 to 2.5): the free-block search, the split, new
//! segments under the limit, and the three ways of giving cached memory back before an OOM.

use super::heap::{LARGE, Occupant, PoolKey, SMALL, SegmentRec, pool_index};
use super::rounding::{allocation_size, is_small_pool, round_size, should_split};
use super::{MAX_SEGMENT_BYTES, Pytorch, SEGMENT_ALIGN_BYTES, SegmentOpKind};
use crate::heap::{Addr, FreeError, Placement};

/// PyTorch's `AllocParams`: one request as the allocator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Params {
    pub id: u32,
    /// What the caller asked for (the block's `requested_size`).
    pub orig_bytes: u64,
    /// `round_size(orig_bytes)`: the block size searched for.
    pub size_bytes: u64,
    pub stream: u64,
    pub small_pool: bool,
    /// `get_allocation_size(size_bytes)`: the segment a cudaMalloc would make.
    pub alloc_size_bytes: u64,
}

impl Pytorch {
    /// The request's parameters; `None` when its segment would exceed [`MAX_SEGMENT_BYTES`].
    pub(super) fn params(&self, id: u32, orig_bytes: u64, stream: u64) -> Option<Params> {
        let size_bytes = round_size(orig_bytes, &self.settings);
        let alloc_size_bytes = allocation_size(size_bytes);
        (alloc_size_bytes <= MAX_SEGMENT_BYTES).then_some(Params {
            id,
            orig_bytes,
            size_bytes,
            stream,
            small_pool: is_small_pool(size_bytes),
            alloc_size_bytes,
        })
    }

    /// PyTorch's `malloc`: a cached block, else a new one; `None` is out of memory, and then
    /// nothing has changed.
    pub(super) fn malloc(&mut self, p: &Params) -> Option<Placement> {
        let addr = match self.get_free_block(p) {
            Some(addr) => addr,
            None => self.obtain_new_block(p)?,
        };
        self.alloc_found_block(p, addr)
    }

    /// Garbage collection runs only with a threshold and a limit (`set_fraction`).
    fn gc_active(&self) -> bool {
        self.limit_bytes.is_some() && self.settings.garbage_collection_threshold_ppm > 0
    }

    /// `get_free_block`: the address of the block to serve `p` from, left in its free set.
    pub(super) fn get_free_block(&mut self, p: &Params) -> Option<Addr> {
        let pool = pool_index(p.small_pool);
        if self.gc_active() {
            self.heap.bump_gc_calls(pool);
        }
        let is_expandable = |a: Addr| self.heap.block(a).is_some_and(|b| b.expandable);
        let mut it = self
            .heap
            .free_set(pool)
            .range((p.stream, p.size_bytes, 0)..);
        let mut cur: PoolKey = *it.next()?;
        if cur.0 != p.stream {
            return None;
        }
        if is_expandable(cur.2) {
            if self.settings.expandable_segments {
                // Best fit by the size a block can grow to, not the size it has.
                for &next in it {
                    if !is_expandable(cur.2)
                        || next.0 != p.stream
                        || self.expandable_size(next.2) >= self.expandable_size(cur.2)
                    {
                        break;
                    }
                    cur = next;
                }
            } else {
                // Expandable blocks left over from when the option was on are not reused.
                cur = *it.find(|k| !(k.0 == p.stream && is_expandable(k.2)))?;
                if cur.0 != p.stream {
                    return None;
                }
            }
        }
        if let Some(mss) = self.settings.max_split_size_bytes {
            let oversize_for_small = p.size_bytes < mss && cur.1 >= mss;
            let too_loose = p.size_bytes >= mss
                && cur.1
                    >= p.size_bytes
                        .saturating_add(self.settings.max_non_split_rounding_bytes);
            if oversize_for_small || too_loose {
                return None;
            }
        }
        Some(cur.2)
    }

    /// A block's size plus the unmapped range right after it.
    fn expandable_size(&self, addr: Addr) -> u64 {
        let Some(rec) = self.heap.block(addr) else {
            return 0;
        };
        let unmapped_after = self
            .heap
            .next_of(addr + rec.size_bytes, rec.segment_addr)
            .filter(|(_, n)| n.occupant == Occupant::Unmapped)
            .map_or(0, |(_, n)| n.size_bytes);
        rec.size_bytes + unmapped_after
    }

    /// `alloc_found_block`: the request takes the free block's low address; the remainder is
    /// split off when [`should_split`] says so.
    pub(super) fn alloc_found_block(&mut self, p: &Params, addr: Addr) -> Option<Placement> {
        let rec = self.heap.block(addr)?;
        if rec.occupant != Occupant::Free || rec.size_bytes < p.size_bytes {
            debug_assert!(false, "alloc_found_block on {rec:?}");
            return None;
        }
        self.heap.take(addr);
        let split = should_split(rec.size_bytes, p.size_bytes, rec.small_pool, &self.settings);
        let used_bytes = if split { p.size_bytes } else { rec.size_bytes };
        let used = Occupant::Used {
            id: p.id,
            requested_bytes: p.orig_bytes,
        };
        self.heap.add(addr, rec.with(used_bytes, used));
        if split {
            self.heap.add(
                addr + used_bytes,
                rec.with(rec.size_bytes - used_bytes, Occupant::Free),
            );
        }
        Some(Placement {
            addr,
            reserved_bytes: used_bytes,
        })
    }

    /// Step 4 of `malloc`: GC, cudaMalloc, and the two release-and-retry rounds. Returns the
    /// new block (free, in its set); on failure the heap is as it was: a request that cannot
    /// succeed is refused up front, and one that still fails (expandable segments, whose
    /// pre-check is only a necessary condition) is rolled back.
    fn obtain_new_block(&mut self, p: &Params) -> Option<Addr> {
        if !self.may_succeed_after_release(p) {
            return None;
        }
        self.heap.begin();
        let got = self.release_and_alloc_block(p);
        if got.is_some() {
            self.heap.commit();
        } else {
            self.heap.rollback();
        }
        got
    }

    fn release_and_alloc_block(&mut self, p: &Params) -> Option<Addr> {
        if self.gc_active() {
            self.garbage_collect_cached_blocks(p.id);
        }
        if let Some(addr) = self.alloc_block(p) {
            return Some(addr);
        }
        if self.release_available_cached_blocks(p)
            && let Some(addr) = self.alloc_block(p)
        {
            return Some(addr);
        }
        self.release_cached_blocks(p.id);
        self.alloc_block(p)
    }

    /// Whether `alloc_block` can pass the limit once every cached whole segment (and every
    /// whole free page of expandable segments) is released.
    fn may_succeed_after_release(&self, p: &Params) -> bool {
        let Some(limit) = self.limit_bytes else {
            return true;
        };
        let reserved = self.heap.counters().footprint_bytes;
        let after = reserved.saturating_sub(self.releasable_bytes());
        after.saturating_add(p.alloc_size_bytes) <= limit
    }

    /// Bytes `release_cached_blocks` would give back now.
    fn releasable_bytes(&self) -> u64 {
        let mut total = 0u64;
        for pool in [SMALL, LARGE] {
            for &(_, size_bytes, addr) in self.heap.free_set(pool) {
                let Some(rec) = self.heap.block(addr) else {
                    continue;
                };
                if rec.expandable {
                    total += self
                        .unmappable_range(addr, &rec)
                        .map_or(0, |(begin, end)| end - begin);
                } else if self.heap.is_whole_segment(addr, &rec) {
                    total += size_bytes;
                }
            }
        }
        total
    }

    /// `alloc_block`: a new segment (or mapped pages), unless it would pass the limit.
    fn alloc_block(&mut self, p: &Params) -> Option<Addr> {
        if let Some(limit) = self.limit_bytes
            && self
                .heap
                .counters()
                .footprint_bytes
                .saturating_add(p.alloc_size_bytes)
                > limit
        {
            return None;
        }
        if self.settings.expandable_segments {
            return self.try_allocate_expandable_block(p);
        }
        let (addr, size_bytes) = if self.script.is_some() {
            self.script_segment_place(p)?
        } else {
            let addr = self.heap.lowest_fit(
                self.device_base_addr,
                p.alloc_size_bytes,
                SEGMENT_ALIGN_BYTES,
            )?;
            (addr, p.alloc_size_bytes)
        };
        let seg = SegmentRec {
            size_bytes,
            stream: p.stream,
            small_pool: p.small_pool,
            expandable: false,
        };
        if !self.heap.create_segment(addr, seg, Occupant::Free) {
            return None;
        }
        self.heap.log(p.id, SegmentOpKind::Alloc, addr, size_bytes);
        Some(addr)
    }

    /// `garbage_collect_cached_blocks`: past `threshold × limit` reserved bytes, release
    /// unsplit large-pool blocks at least as old as the mean, round after round, until the
    /// excess is reclaimed or a round frees nothing.
    fn garbage_collect_cached_blocks(&mut self, id: u32) {
        let Some(limit) = self.limit_bytes else {
            return;
        };
        let ppm = u128::from(self.settings.garbage_collection_threshold_ppm);
        let threshold = u64::try_from(u128::from(limit) * ppm / 1_000_000).unwrap_or(u64::MAX);
        let reserved = self.heap.counters().footprint_bytes;
        if reserved <= threshold {
            return;
        }
        let target = reserved - threshold;
        // PyTorch averages over every unsplit block, expandable ones included, but releases
        // only cudaMalloc'd ones.
        let mut total_age: u128 = 0;
        let mut count: u64 = 0;
        for &(_, _, addr) in self.heap.free_set(LARGE) {
            if let Some(rec) = self.heap.block(addr)
                && self.heap.is_whole_segment(addr, &rec)
            {
                total_age += u128::from(self.heap.gc_age(&rec));
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            // The mean is fixed for a round: age >= total / count, in integers.
            let (mean_num, mean_den) = (total_age, u128::from(count));
            freed = false;
            let keys: Vec<PoolKey> = self.heap.free_set(LARGE).iter().copied().collect();
            for (_, _, addr) in keys {
                let Some(rec) = self.heap.block(addr) else {
                    continue;
                };
                let age = u128::from(self.heap.gc_age(&rec));
                if rec.expandable
                    || !self.heap.is_whole_segment(addr, &rec)
                    || age * mean_den < mean_num
                {
                    continue;
                }
                freed = true;
                reclaimed += rec.size_bytes;
                total_age = total_age.saturating_sub(age);
                count = count.saturating_sub(1);
                self.release_block(addr, id);
            }
        }
    }

    /// `release_available_cached_blocks`: with `max_split_size` set, release one cached block
    /// of at least `max(request, max_split_size)` on the request's stream, or, lacking one,
    /// oversize blocks from the largest down until that many bytes are released.
    fn release_available_cached_blocks(&mut self, p: &Params) -> bool {
        let Some(mss) = self.settings.max_split_size_bytes else {
            return false;
        };
        let pool = pool_index(p.small_pool);
        let key_size = p.size_bytes.max(mss);
        let key = (p.stream, key_size, 0);
        let set = self.heap.free_set(pool);
        let first = set.range(key..).next().copied();
        if let Some((stream, _, addr)) = first
            && stream == p.stream
            && self.heap.block(addr).is_some_and(|b| !b.expandable)
        {
            // PyTorch would cudaFree a split block's interior pointer; such a block (only
            // possible with odd settings) is left alone here.
            return self.release_block(addr, p.id);
        }
        let mut cur = match first {
            Some(k) => set.range(..k).next_back().copied(),
            None => set.iter().next_back().copied(),
        };
        let mut released = 0u64;
        while let Some(k) = cur {
            if released >= key_size || k.1 < mss || k.0 != p.stream {
                break;
            }
            cur = self.heap.free_set(pool).range(..k).next_back().copied();
            if self.release_block(k.2, p.id) {
                released += k.1;
            }
        }
        released >= key_size
    }

    /// `release_cached_blocks` (`emptyCache`): every wholly free segment is cudaFree'd, large
    /// pool first; free expandable blocks have their whole pages unmapped, and a reservation
    /// left with nothing mapped is dropped.
    pub(super) fn release_cached_blocks(&mut self, id: u32) {
        for pool in [LARGE, SMALL] {
            let keys: Vec<PoolKey> = self.heap.free_set(pool).iter().copied().collect();
            let mut to_unmap = Vec::new();
            for (_, _, addr) in keys {
                let Some(rec) = self.heap.block(addr) else {
                    continue;
                };
                if rec.expandable {
                    to_unmap.push(addr);
                } else if self.heap.is_whole_segment(addr, &rec) {
                    self.release_block(addr, id);
                }
            }
            for addr in to_unmap {
                if let Some(unmapped) = self.unmap_block(addr, id)
                    && let Some(rec) = self.heap.block(unmapped)
                    && self.heap.is_whole_segment(unmapped, &rec)
                {
                    self.heap.remove_segment(unmapped);
                }
            }
        }
    }

    /// `release_block`: cudaFree of a wholly free cudaMalloc'd segment. False (nothing done)
    /// for anything else.
    pub(super) fn release_block(&mut self, addr: Addr, id: u32) -> bool {
        let Some(rec) = self.heap.block(addr) else {
            return false;
        };
        if rec.expandable
            || rec.occupant != Occupant::Free
            || !self.heap.is_whole_segment(addr, &rec)
        {
            return false;
        }
        self.heap.remove_segment(addr);
        self.heap.log(id, SegmentOpKind::Free, addr, rec.size_bytes);
        true
    }

    /// `free` + `free_block`: the block becomes free and merges with free neighbours of its
    /// segment.
    pub(super) fn free_block(&mut self, addr: Addr) -> Result<(), FreeError> {
        let rec = self
            .heap
            .block(addr)
            .filter(|r| matches!(r.occupant, Occupant::Used { .. }))
            .ok_or(FreeError::UnknownAddr(addr))?;
        self.heap.take(addr);
        self.heap
            .add(addr, rec.with(rec.size_bytes, Occupant::Free));
        self.heap.coalesce(addr);
        Ok(())
    }
}
