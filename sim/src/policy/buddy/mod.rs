//! `buddy`: binary buddy allocator over power-of-two blocks.
//!
//! ```text
//! order 2 |               1024               |   top-level block (min 256 B, max order 2)
//! order 1 |       512       |       512       |
//! order 0 |  256   |  256   |  256   |  256   |
//! ```
//!
//! A block of order k is `min_block_bytes << k` bytes and starts at a multiple of its size; its
//! buddy is the other half of its parent (`addr ^ size`). A request takes the smallest order
//! whose block holds `max(size, align)` bytes (a zero-byte request takes an order-0 block), so
//! 3000 B reserves 4096 B. Allocation takes the lowest-address free block of the smallest
//! non-empty order that is large enough and splits it down, freeing the upper halves; a free
//! merges the block with its buddy for as long as the buddy is free. Free blocks of each order
//! sit in a bitmap with one bit per block position of that order and two summary levels (bit j
//! of a summary word says whether word j below holds any bit), so inserting, removing and
//! finding the lowest free block are a few word operations, and a bit mask records the non-empty
//! orders: both paths are O(max_order). The bitmaps cover the footprint: an order-k bitmap
//! costs one bit per `min_block_bytes << k` bytes of it.
//!
//! The arena is a row of top-level blocks (`min_block_bytes << max_order`, 64 MiB by default)
//! at addresses 0, T, 2T, ...; it grows by one top-level block when no free block is large
//! enough, and never shrinks (footprint = number of top-level blocks × T). A request larger
//! than a top-level block gets a dedicated run: its size rounded up to a power of two, made of
//! consecutive wholly free top-level blocks (the lowest such run, else new ones at the end);
//! finding it scans the top-level blocks, which is O(number of top-level blocks). Freed, the
//! run becomes free top-level blocks again. `limit_bytes` caps the footprint. The arena never
//! reaches past [`MAX_ARENA_BYTES`] (2^48, an x86-64 address space): a run that would end
//! beyond it fails as out of memory at once, rather than walking billions of top-level blocks
//! for a request of 2^56 bytes or more.

use std::any::Any;

use crate::heap::{Addr, AllocError, Block, BlockState, Counters, FreeError, Placement, Request};
use crate::policy::Policy;
use crate::policy::config::PolicyConfig;
use crate::policy::fit_common::{AddrMap, oom};

#[derive(Clone, Copy, Debug, Default)]
struct Used {
    /// Reserved bytes: a buddy block, or a whole run of top-level blocks.
    len: u64,
    /// Buddy order, or `None` for a dedicated run of top-level blocks.
    order: Option<u32>,
    id: u32,
    requested_bytes: u64,
}

mod block_set;

use block_set::BlockSet;

/// Binary buddy allocator (see the module docs).
#[derive(Clone, Debug)]
pub struct Buddy {
    min_shift: u32,
    max_order: u32,
    top_block_bytes: u64,
    limit: Option<u64>,
    top_blocks: u64,
    /// Free block addresses per order.
    free: Vec<BlockSet>,
    /// Bit k set when `free[k]` is not empty.
    nonempty: u64,
    used: AddrMap<Used>,
    counters: Counters,
}

impl Buddy {
    /// A buddy allocator with `config.buddy_min_block_bytes`, `config.buddy_max_order` and
    /// `config.limit_bytes`.
    ///
    /// # Errors
    /// When the minimum block is not a power of two or the top-level block would not fit in 63
    /// bits.
    pub fn new(config: &PolicyConfig) -> Result<Self, String> {
        let min = config.buddy_min_block_bytes;
        let max_order = config.buddy_max_order;
        if !min.is_power_of_two() {
            return Err(format!(
                "buddy_min_block_bytes must be a power of two, got {min}"
            ));
        }
        let min_shift = min.trailing_zeros();
        if min_shift + max_order > 62 {
            return Err(format!(
                "buddy top-level block {min} << {max_order} does not fit in 63 bits"
            ));
        }
        Ok(Self {
            min_shift,
            max_order,
            top_block_bytes: min << max_order,
            limit: config.limit_bytes,
            top_blocks: 0,
            free: (0..=max_order)
                .map(|order| BlockSet::new(min.trailing_zeros() + order))
                .collect(),
            nonempty: 0,
            used: AddrMap::default(),
            counters: Counters::default(),
        })
    }

    /// Size of a top-level block.
    #[must_use]
    pub fn top_block_bytes(&self) -> u64 {
        self.top_block_bytes
    }

    fn block_bytes(&self, order: u32) -> u64 {
        1u64 << (self.min_shift + order)
    }

    fn push_free(&mut self, order: u32, addr: Addr) {
        if let Some(set) = self.free.get_mut(order as usize) {
            set.insert(addr);
            self.nonempty |= 1 << order;
        }
        self.counters.free_blocks += 1;
        self.counters.free_bytes += self.block_bytes(order);
    }

    /// Removes `addr` from the free set of `order`; false when it was not there.
    fn take_free(&mut self, order: u32, addr: Addr) -> bool {
        let Some(set) = self.free.get_mut(order as usize) else {
            return false;
        };
        if !set.remove(addr) {
            return false;
        }
        if set.is_empty() {
            self.nonempty &= !(1 << order);
        }
        self.counters.free_blocks -= 1;
        self.counters.free_bytes -= self.block_bytes(order);
        true
    }

    fn pop_lowest(&mut self, order: u32) -> Option<Addr> {
        let addr = self.free.get(order as usize)?.first()?;
        self.take_free(order, addr).then_some(addr)
    }

    fn refresh_largest(&mut self) {
        self.counters.largest_free_bytes = match self.nonempty {
            0 => 0,
            m => self.block_bytes(63 - m.leading_zeros()),
        };
    }

    fn within_limit(&self, top_blocks: u64) -> bool {
        match (top_blocks.checked_mul(self.top_block_bytes), self.limit) {
            (None, _) => false,
            (Some(bytes), Some(limit)) => bytes <= limit,
            (Some(_), None) => true,
        }
    }

    fn grow(&mut self) -> bool {
        if !self.within_limit(self.top_blocks + 1) {
            return false;
        }
        let addr = self.top_blocks * self.top_block_bytes;
        self.top_blocks += 1;
        self.counters.footprint_bytes += self.top_block_bytes;
        self.push_free(self.max_order, addr);
        true
    }

    /// A block of `order`, split from the smallest larger free block; `None` at the limit.
    fn take_block(&mut self, order: u32) -> Option<Addr> {
        let mut avail = self.nonempty & !((1u64 << order) - 1);
        if avail == 0 {
            if !self.grow() {
                return None;
            }
            avail = 1 << self.max_order;
        }
        let mut j = avail.trailing_zeros();
        let addr = self.pop_lowest(j)?;
        while j > order {
            j -= 1;
            self.push_free(j, addr + self.block_bytes(j));
        }
        Some(addr)
    }

    /// Lowest index of `count` consecutive wholly free top-level blocks (new ones past the end
    /// count as free), starting at a multiple of `step`.
    fn find_run(&self, count: u64, step: u64) -> u64 {
        let top_free = self.free.get(self.max_order as usize);
        let is_free = |i: u64| {
            i >= self.top_blocks || top_free.is_some_and(|s| s.contains(i * self.top_block_bytes))
        };
        let mut i = 0;
        while i < self.top_blocks {
            if (i..i + count).all(is_free) {
                return i;
            }
            i += step;
        }
        i
    }

    fn alloc_run(&mut self, req: Request, need: u64) -> Result<Placement, AllocError> {
        let limit = self.limit;
        let err = |c: &Counters| oom(req.size_bytes, c, limit);
        let Some(run_bytes) = need
            .checked_next_power_of_two()
            .filter(|&r| r <= MAX_ARENA_BYTES)
        else {
            return Err(err(&self.counters));
        };
        let count = run_bytes / self.top_block_bytes;
        let step = (req.align_bytes / self.top_block_bytes).max(1);
        let first = self.find_run(count, step);
        let end = first + count;
        if end.saturating_mul(self.top_block_bytes) > MAX_ARENA_BYTES
            || !self.within_limit(end.max(self.top_blocks))
        {
            return Err(err(&self.counters));
        }
        for i in first..end.min(self.top_blocks) {
            self.take_free(self.max_order, i * self.top_block_bytes);
        }
        // Alignment may leave a gap between the old end of the arena and the run.
        while self.top_blocks < first {
            self.grow();
        }
        if end > self.top_blocks {
            self.counters.footprint_bytes += (end - self.top_blocks) * self.top_block_bytes;
            self.top_blocks = end;
        }
        let addr = first * self.top_block_bytes;
        self.finish_alloc(addr, run_bytes, None, req);
        Ok(Placement {
            addr,
            reserved_bytes: run_bytes,
        })
    }

    fn finish_alloc(&mut self, addr: Addr, len: u64, order: Option<u32>, req: Request) {
        self.used.insert(
            addr,
            Used {
                len,
                order,
                id: req.id,
                requested_bytes: req.size_bytes,
            },
        );
        self.counters.live_allocs += 1;
        self.counters.live_bytes += req.size_bytes;
        self.counters.allocated_bytes += len;
        self.refresh_largest();
    }
}

impl Policy for Buddy {
    fn name(&self) -> &'static str {
        "buddy"
    }

    fn alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
        if !req.align_bytes.is_power_of_two() {
            return Err(AllocError::Unsupported(format!(
                "alignment {} is not a power of two",
                req.align_bytes
            )));
        }
        let need = req.size_bytes.max(req.align_bytes).max(1);
        if need > self.top_block_bytes {
            return self.alloc_run(req, need);
        }
        // ceil(log2(need)), then relative to the minimum block.
        let log2 = u64::BITS - (need - 1).leading_zeros();
        let order = log2.saturating_sub(self.min_shift);
        let Some(addr) = self.take_block(order) else {
            return Err(oom(req.size_bytes, &self.counters, self.limit));
        };
        let len = self.block_bytes(order);
        self.finish_alloc(addr, len, Some(order), req);
        Ok(Placement {
            addr,
            reserved_bytes: len,
        })
    }

    fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        let rec = self
            .used
            .remove(&addr)
            .ok_or(FreeError::UnknownAddr(addr))?;
        self.counters.live_allocs -= 1;
        self.counters.live_bytes -= rec.requested_bytes;
        self.counters.allocated_bytes -= rec.len;
        match rec.order {
            None => {
                for i in 0..rec.len / self.top_block_bytes {
                    self.push_free(self.max_order, addr + i * self.top_block_bytes);
                }
            }
            Some(mut order) => {
                let mut addr = addr;
                while order < self.max_order {
                    let buddy = addr ^ self.block_bytes(order);
                    if !self.take_free(order, buddy) {
                        break;
                    }
                    addr = addr.min(buddy);
                    order += 1;
                }
                self.push_free(order, addr);
            }
        }
        self.refresh_largest();
        Ok(())
    }

    fn counters(&self) -> Counters {
        self.counters
    }

    fn blocks(&self, out: &mut Vec<Block>) {
        let first = out.len();
        out.extend(self.used.iter().map(|(&addr, u)| Block {
            addr,
            len_bytes: u.len,
            state: BlockState::Used {
                id: u.id,
                requested_bytes: u.requested_bytes,
            },
        }));
        for (order, set) in (0u32..).zip(&self.free) {
            let len_bytes = self.block_bytes(order);
            out.extend(set.iter().map(|addr| Block {
                addr,
                len_bytes,
                state: BlockState::Free,
            }));
        }
        if let Some(tail) = out.get_mut(first..) {
            tail.sort_unstable_by_key(|b| b.addr);
        }
    }

    fn held_ranges(&self, out: &mut Vec<(Addr, u64)>) -> bool {
        // The arena [0, top-level blocks × T), whose free space is the buddy tiling of the gaps
        // between live blocks (free buddies always merge, below the top level).
        let arena_bytes = self.top_blocks * self.top_block_bytes;
        if arena_bytes > 0 {
            out.push((0, arena_bytes));
        }
        true
    }

    fn held_ranges_epoch(&self) -> u64 {
        self.top_blocks
    }

    fn gap_block_max_bytes(&self) -> Option<u64> {
        Some(self.top_block_bytes)
    }

    fn state_bytes(&self) -> u64 {
        let bitmaps: usize = self.free.iter().map(BlockSet::heap_bytes).sum();
        // The used map's slots are at most half full.
        bitmaps as u64 + self.counters.live_allocs * 2 * 48 + 256
    }

    fn shrink_to_fit(&mut self) {
        self.used.shrink_to_fit();
    }

    fn clone_box(&self) -> Box<dyn Policy> {
        // The address map's copy is sized to its entries (see `AddrMap`'s `Clone`), so a
        // checkpoint keeps only what the live entries need.
        Box::new(self.clone())
    }

    fn check_invariants(&self) -> Result<(), String> {
        let footprint = self.top_blocks * self.top_block_bytes;
        if footprint != self.counters.footprint_bytes {
            return Err("footprint is not the sum of the top-level blocks".to_owned());
        }
        for (order, set) in (0u32..).zip(&self.free) {
            set.check()
                .map_err(|e| format!("free set of order {order}: {e}"))?;
            if set.is_empty() == (self.nonempty & (1 << order) != 0) {
                return Err(format!("non-empty mask wrong for order {order}"));
            }
            let size = self.block_bytes(order);
            for addr in set.iter() {
                if addr % size != 0 || addr + size > footprint {
                    return Err(format!("free block {addr:#x} of order {order} misplaced"));
                }
                if order < self.max_order && set.contains(addr ^ size) {
                    return Err(format!(
                        "free buddies {addr:#x} and {:#x} not merged",
                        addr ^ size
                    ));
                }
            }
        }
        for (&addr, u) in &self.used {
            let ok = match u.order {
                Some(order) => u.len == self.block_bytes(order) && addr % u.len == 0,
                None => {
                    u.len.is_power_of_two()
                        && u.len > self.top_block_bytes
                        && addr % self.top_block_bytes == 0
                }
            };
            if !ok || u.len < u.requested_bytes {
                return Err(format!("used block {addr:#x} has a bad shape"));
            }
        }
        let mut blocks = Vec::new();
        self.blocks(&mut blocks);
        let mut at = 0;
        for b in &blocks {
            if b.addr != at {
                return Err(format!("blocks do not tile the arena at {at:#x}"));
            }
            at = b.end();
        }
        if at != footprint {
            return Err(format!("blocks end at {at:#x}, arena at {footprint:#x}"));
        }
        let expected = Counters::from_blocks(&blocks, footprint);
        if expected != self.counters {
            return Err(format!(
                "counters {:?} but blocks give {expected:?}",
                self.counters
            ));
        }
        if !self.within_limit(self.top_blocks) {
            return Err("arena above the limit".to_owned());
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The most address space the arena may span: 2^48 bytes, what x86-64 gives a process.
pub const MAX_ARENA_BYTES: u64 = 1 << 48;

#[cfg(test)]
mod tests {

    #[test]
    fn block_set_agrees_with_an_ordered_set() {
        let mut ours = BlockSet::new(8);
        let mut model = std::collections::BTreeSet::new();
        let mut x: u64 = 5;
        for step in 0..100_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            // Positions past several summary groups (4096 words each), sparse and dense.
            let addr = ((x >> 33) % 600_000) << 8;
            if (step / 25_000) % 2 == 0 {
                ours.insert(addr);
                model.insert(addr);
            } else {
                assert_eq!(ours.remove(addr), model.remove(&addr));
                if let Some(&low) = model.first() {
                    assert_eq!(ours.remove(low), model.remove(&low));
                }
            }
            assert_eq!(ours.first(), model.first().copied());
            assert_eq!(ours.contains(addr), model.contains(&addr));
        }
        ours.check().unwrap();
        assert!(ours.iter().eq(model.iter().copied()));
    }
    use super::*;

    fn req(id: u32, size_bytes: u64) -> Request {
        Request {
            id,
            size_bytes,
            align_bytes: 16,
        }
    }

    fn small() -> Buddy {
        Buddy::new(&PolicyConfig {
            buddy_min_block_bytes: 256,
            buddy_max_order: 4,
            ..PolicyConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn splits_down_and_merges_back() {
        let mut b = small();
        let a = b.alloc(req(0, 100)).unwrap();
        assert_eq!(
            a,
            Placement {
                addr: 0,
                reserved_bytes: 256
            }
        );
        // Splitting 4096 down to 256 leaves free blocks of 256, 512, 1024 and 2048.
        assert_eq!(b.counters().free_blocks, 4);
        assert_eq!(b.counters().largest_free_bytes, 2048);
        let c = b.alloc(req(1, 600)).unwrap();
        assert_eq!(
            c,
            Placement {
                addr: 1024,
                reserved_bytes: 1024
            }
        );
        b.check_invariants().unwrap();
        b.free(0).unwrap();
        b.free(1024).unwrap();
        b.check_invariants().unwrap();
        assert_eq!(b.counters().free_blocks, 1);
        assert_eq!(b.counters().largest_free_bytes, 4096);
    }

    #[test]
    fn oversize_request_takes_a_run_of_top_level_blocks() {
        let mut b = small();
        b.alloc(req(0, 10)).unwrap();
        // 9000 B > 4096 B: a run of 16384 B = four top-level blocks after the first.
        let run = b.alloc(req(1, 9000)).unwrap();
        assert_eq!(
            run,
            Placement {
                addr: 4096,
                reserved_bytes: 16384
            }
        );
        assert_eq!(b.counters().footprint_bytes, 5 * 4096);
        b.check_invariants().unwrap();
        b.free(4096).unwrap();
        assert_eq!(b.counters().free_blocks, 4 + 4);
        b.check_invariants().unwrap();
        // The freed run is reused, not appended.
        let again = b.alloc(req(2, 8193)).unwrap();
        assert_eq!(again.addr, 4096);
        assert_eq!(b.counters().footprint_bytes, 5 * 4096);
    }

    #[test]
    fn rejects_bad_configs() {
        let bad_min = PolicyConfig {
            buddy_min_block_bytes: 300,
            ..PolicyConfig::default()
        };
        assert!(Buddy::new(&bad_min).is_err());
        let too_big = PolicyConfig {
            buddy_max_order: 60,
            ..PolicyConfig::default()
        };
        assert!(Buddy::new(&too_big).is_err());
    }

    #[test]
    fn requests_past_an_address_space_fail_at_once_and_change_nothing() {
        let mut b = Buddy::new(&PolicyConfig::default()).unwrap();
        let small = b
            .alloc(Request {
                id: 0,
                size_bytes: 100,
                align_bytes: 16,
            })
            .unwrap();
        let before = b.counters();
        for (id, size_bytes) in [
            (1, 1u64 << 56),
            (2, 1 << 63),
            (3, u64::MAX),
            (4, (1 << 48) + 1),
        ] {
            let r = b.alloc(Request {
                id,
                size_bytes,
                align_bytes: 16,
            });
            assert!(
                matches!(r, Err(AllocError::OutOfMemory { .. })),
                "{size_bytes}: {r:?}"
            );
        }
        assert_eq!(b.counters(), before);
        b.check_invariants().unwrap();
        b.free(small.addr).unwrap();
        // The largest run that fits is still served.
        let big = b
            .alloc(Request {
                id: 5,
                size_bytes: 1 << 40,
                align_bytes: 16,
            })
            .unwrap();
        assert_eq!(big.reserved_bytes, 1 << 40);
    }
}
