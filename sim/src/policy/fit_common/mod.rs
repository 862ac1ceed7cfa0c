//! Shared machinery of the simulated policies: alignment helpers, and the
//! boundary-tag heap that `first-fit` and `best-fit` share, with their one `Policy` impl
//! ([`FitPolicy`], over each one's free index).
//!
//! [`FitHeap`] keeps every block below the heap top (used and free) as a record in a slab,
//! linked to its physical neighbours (boundary tags), so freeing finds and coalesces both
//! neighbours in O(1) without looking anything up. Only used blocks are keyed by address (the
//! one lookup `free(addr)` needs). Free blocks are also kept in a [`FreeIndex`], the one thing
//! that differs between the fit policies: it answers "which free block should a request of n
//! bytes take" in O(log n) and hands back the block's record.
//!
//! Heap top: the blocks tile `[0, top)` exactly and the block that ends at `top` is always in
//! use. A request that no hole can serve is carved at the top, which grows (the footprint is the
//! top). Freeing the last block, after coalescing with a free block below it, lowers the top, as
//! `sbrk` trimming would.

pub(crate) use crate::policy::addr_map::AddrMap;

mod addr_chunks;
mod policy;
use crate::heap::{Addr, AllocError, Block, BlockState, Counters, FreeError, Placement, Request};
use crate::policy::config::PolicyConfig;
pub use addr_chunks::AddrChunks;
pub(crate) use policy::FitIndex;
pub use policy::FitPolicy;

/// `x` rounded up to a multiple of `align` (a power of two); `None` on overflow.
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    let mask = align - 1;
    x.checked_add(mask).map(|v| v & !mask)
}

/// Validates the alignment of a [`PolicyConfig`].
pub(crate) fn check_align(config: &PolicyConfig) -> Result<u64, String> {
    if config.align_bytes.is_power_of_two() {
        Ok(config.align_bytes)
    } else {
        Err(format!(
            "align_bytes must be a power of two, got {}",
            config.align_bytes
        ))
    }
}

/// The out-of-memory error, filled from the policy's counters.
pub(crate) fn oom(requested_bytes: u64, counters: &Counters, limit: Option<u64>) -> AllocError {
    AllocError::OutOfMemory {
        requested_bytes,
        largest_free_bytes: counters.largest_free_bytes,
        footprint_bytes: counters.footprint_bytes,
        limit_bytes: limit,
    }
}

/// Ordered set of free blocks that picks the block for a request. Each entry carries the
/// heap's handle of the block (its slot in the record slab), so a search leads straight to the
/// block's record without an address lookup.
pub(crate) trait FreeIndex: Clone + Send + Sync + 'static {
    fn insert(&mut self, addr: Addr, len: u64, handle: u32);
    fn remove(&mut self, addr: Addr, len: u64, handle: u32);
    /// Changes block `handle`'s address and/or length; its handle stays. The caller guarantees
    /// that no other free block lies between the old and the new address, so an
    /// address-ordered index may update in place.
    fn relocate(&mut self, handle: u32, old_addr: Addr, old_len: u64, new_addr: Addr, new_len: u64);
    /// The block a request of at least `min_len` bytes takes, if any: `(addr, len, handle)`.
    fn find(&mut self, min_len: u64) -> Option<(Addr, u64, u32)>;
    /// Length of the largest free block (0 when empty).
    fn largest(&self) -> u64;
    /// Every `(addr, len, handle)` in address order (for invariant checks).
    fn entries(&self) -> Vec<(Addr, u64, u32)>;
    /// Renumbers the handles after the heap compacted its slab: `new_of[old]` is the new one.
    fn remap_handles(&mut self, new_of: &[u32]);
    /// Self-check of the index's own structure.
    fn check(&self) -> Result<(), String>;
}

/// No block (an end of the physical list, or an empty heap).
const NIL: u32 = u32::MAX;

/// Who holds a block, in eight bytes (records are the heap's hot data): a used block keeps its
/// allocation id and its slack, the bytes it holds beyond the request (under the base
/// alignment, which is at most 2 GiB, so 32 bits hold it); [`FREE`] marks a free block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tag {
    id: u32,
    slack: u32,
}

const FREE: Tag = Tag {
    id: 0,
    slack: u32::MAX,
};

/// Largest base alignment the fit heaps accept (see [`Tag`]).
const MAX_BASE_ALIGN: u64 = 1 << 31;

impl Tag {
    fn is_free(self) -> bool {
        self.slack == u32::MAX
    }
}

/// One block below the heap top, used or free: a boundary tag. The blocks form a doubly linked
/// list in address order, so a free finds both physical neighbours without any lookup.
#[derive(Clone, Copy, Debug)]
struct Rec {
    addr: Addr,
    len: u64,
    /// Slab slot of the block physically before this one, or [`NIL`] for the block at 0.
    prev: u32,
    /// Slab slot of the block physically after this one, or [`NIL`] for the topmost block.
    next: u32,
    tag: Tag,
}

/// The boundary-tag heap of the fit policies, generic over how a free block is chosen.
///
/// Records live in a slab (a vector with recycled slots) linked in address order. Only the
/// used blocks are keyed by address, since `free(addr)` is the one operation that starts from an
/// address: a free block is reached through its neighbours' links or through the index, which
/// hands back its slot. An allocation/free pair thus costs one hash insertion and one removal,
/// plus the index's work.
#[derive(Clone, Debug)]
pub(crate) struct FitHeap<I> {
    slab: Vec<Rec>,
    spare: Vec<u32>,
    used: AddrMap<u32>,
    index: I,
    base_align: u64,
    limit: Option<u64>,
    top: u64,
    /// Slot of the block that ends at `top`, or [`NIL`] when the heap is empty.
    last: u32,
    counters: Counters,
}

impl<I: FreeIndex> FitHeap<I> {
    pub(crate) fn new(config: &PolicyConfig, index: I) -> Result<Self, String> {
        let base_align = check_align(config)?;
        if base_align > MAX_BASE_ALIGN {
            return Err(format!(
                "align_bytes above {MAX_BASE_ALIGN} is not supported, got {base_align}"
            ));
        }
        Ok(Self {
            slab: Vec::new(),
            spare: Vec::new(),
            used: AddrMap::default(),
            index,
            base_align,
            limit: config.limit_bytes,
            top: 0,
            last: NIL,
            counters: Counters::default(),
        })
    }

    /// Renumbers the slab densely in address order and drops spare capacity. A clone copies
    /// the whole slab, which never shrinks after the heap's busiest moment: replay checkpoints
    /// call this so each costs memory for its current blocks only.
    pub(crate) fn compact(&mut self) {
        let order = self.order();
        let mut new_of = vec![NIL; self.slab.len()];
        let mut slab = Vec::with_capacity(order.len());
        for (new, &old) in order.iter().enumerate() {
            if let (Some(slot), Some(&r)) =
                (new_of.get_mut(old as usize), self.slab.get(old as usize))
            {
                *slot = new as u32;
                slab.push(r);
            }
        }
        let remap = |h: u32| new_of.get(h as usize).copied().unwrap_or(NIL);
        for r in &mut slab {
            r.prev = remap(r.prev);
            r.next = remap(r.next);
        }
        for h in self.used.values_mut() {
            *h = remap(*h);
        }
        self.index.remap_handles(&new_of);
        self.last = remap(self.last);
        self.slab = slab;
        self.spare = Vec::new();
    }

    /// Slots of every block in address order.
    fn order(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.slab.len() - self.spare.len());
        let mut h = self.last;
        while let Some(r) = self.slab.get(h as usize) {
            out.push(h);
            h = r.prev;
        }
        out.reverse();
        out
    }

    /// Gives back the address map's spare room (see [`crate::policy::Policy::shrink_to_fit`]).
    pub(crate) fn shrink_to_fit(&mut self) {
        self.used.shrink_to_fit();
    }

    /// Changes the footprint limit (a policy that shares one limit between heaps gives each
    /// what the others leave). The caller keeps it at or above the current top.
    pub(crate) fn set_limit(&mut self, limit: Option<u64>) {
        self.limit = limit;
    }

    pub(crate) fn counters(&self) -> Counters {
        self.counters
    }

    fn rec(&self, h: u32) -> Option<&Rec> {
        self.slab.get(h as usize)
    }

    fn rec_mut(&mut self, h: u32) -> Option<&mut Rec> {
        self.slab.get_mut(h as usize)
    }

    /// Stores a record in a recycled or new slot.
    fn new_rec(&mut self, r: Rec) -> u32 {
        if let Some(h) = self.spare.pop()
            && let Some(slot) = self.slab.get_mut(h as usize)
        {
            *slot = r;
            return h;
        }
        // More than u32::MAX - 1 blocks would need more than 150 GiB of records; saturating
        // keeps this total without a panic path.
        let h = u32::try_from(self.slab.len()).unwrap_or(NIL);
        self.slab.push(r);
        h
    }

    /// Links a new record between `prev` and `next` (either may be [`NIL`]).
    #[inline]
    fn insert_between(&mut self, prev: u32, next: u32, addr: Addr, len: u64, tag: Tag) -> u32 {
        let h = self.new_rec(Rec {
            addr,
            len,
            prev,
            next,
            tag,
        });
        if let Some(p) = self.rec_mut(prev) {
            p.next = h;
        }
        if let Some(n) = self.rec_mut(next) {
            n.prev = h;
        }
        h
    }

    /// Unlinks a record and recycles its slot.
    #[inline]
    fn unlink(&mut self, h: u32) {
        let Some(&r) = self.rec(h) else { return };
        if let Some(p) = self.rec_mut(r.prev) {
            p.next = r.next;
        }
        if let Some(n) = self.rec_mut(r.next) {
            n.prev = r.prev;
        }
        if self.last == h {
            self.last = r.prev;
        }
        self.spare.push(h);
    }

    /// Bytes reserved for a request: its size rounded up to the base alignment, at least one
    /// alignment unit (so a zero-byte request still owns a distinct address).
    fn reserved_for(&self, size_bytes: u64) -> Option<u64> {
        align_up(size_bytes.max(1), self.base_align)
    }

    pub(crate) fn alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
        if !req.align_bytes.is_power_of_two() {
            return Err(AllocError::Unsupported(format!(
                "alignment {} is not a power of two",
                req.align_bytes
            )));
        }
        let align = req.align_bytes.max(self.base_align);
        let limit = self.limit;
        let oom = |c: &Counters| oom(req.size_bytes, c, limit);
        let Some(reserved) = self.reserved_for(req.size_bytes) else {
            return Err(oom(&self.counters));
        };
        let tag = Tag {
            id: req.id,
            // Below the base alignment (or equal, for a zero-byte request): fits, see `Tag`.
            slack: u32::try_from(reserved - req.size_bytes).unwrap_or(u32::MAX - 1),
        };
        // Every block starts at a multiple of the base alignment, so an over-aligned request
        // needs at most `align - base_align` bytes of padding: searching for the padded length
        // guarantees that the chosen hole fits, at the price of skipping holes that would
        // have fitted only because they happen to be aligned.
        let Some(search_len) = reserved.checked_add(align - self.base_align) else {
            return Err(oom(&self.counters));
        };
        let (addr, handle) = match self.index.find(search_len) {
            Some((hole, hole_len, h)) => self.carve(h, hole, hole_len, align, reserved, tag),
            None => match self.extend(align, reserved, tag) {
                Some(placed) => placed,
                None => return Err(oom(&self.counters)),
            },
        };
        self.used.insert(addr, handle);
        self.counters.live_allocs += 1;
        self.counters.live_bytes += req.size_bytes;
        self.counters.allocated_bytes += reserved;
        self.counters.largest_free_bytes = self.index.largest();
        Ok(Placement {
            addr,
            reserved_bytes: reserved,
        })
    }

    /// Places `reserved` bytes in the free block `h` = `[hole, hole + hole_len)`, which the
    /// search guaranteed to be large enough after alignment padding. Returns the address and
    /// slot of the new used block.
    fn carve(
        &mut self,
        h: u32,
        hole: Addr,
        hole_len: u64,
        align: u64,
        reserved: u64,
        tag: Tag,
    ) -> (Addr, u32) {
        let start = align_up(hole, align).unwrap_or(hole);
        let pad = start - hole;
        let end = start + reserved;
        let rest = hole + hole_len - end;
        let Some(&r) = self.rec(h) else {
            return (start, NIL);
        };
        let used = match (pad > 0, rest > 0) {
            (false, false) => {
                // The allocation takes the hole's record whole.
                self.index.remove(hole, hole_len, h);
                self.counters.free_blocks -= 1;
                if let Some(r) = self.rec_mut(h) {
                    r.tag = tag;
                }
                h
            }
            (false, true) => {
                // The hole's record keeps the remainder above the allocation.
                self.index.relocate(h, hole, hole_len, end, rest);
                if let Some(r) = self.rec_mut(h) {
                    r.addr = end;
                    r.len = rest;
                }
                self.insert_between(r.prev, h, start, reserved, tag)
            }
            (true, false) => {
                // The padding stays free in the hole's record.
                self.index.relocate(h, hole, hole_len, hole, pad);
                if let Some(r) = self.rec_mut(h) {
                    r.len = pad;
                }
                self.insert_between(h, r.next, start, reserved, tag)
            }
            (true, true) => {
                self.index.relocate(h, hole, hole_len, hole, pad);
                if let Some(r) = self.rec_mut(h) {
                    r.len = pad;
                }
                let used = self.insert_between(h, r.next, start, reserved, tag);
                let free = self.insert_between(used, r.next, end, rest, FREE);
                self.index.insert(end, rest, free);
                self.counters.free_blocks += 1;
                used
            }
        };
        self.counters.free_bytes -= reserved;
        (start, used)
    }

    /// Places `reserved` bytes at the heap top; `None` when the limit forbids it.
    fn extend(&mut self, align: u64, reserved: u64, tag: Tag) -> Option<(Addr, u32)> {
        let start = align_up(self.top, align)?;
        let new_top = start.checked_add(reserved)?;
        if self.limit.is_some_and(|limit| new_top > limit) {
            return None;
        }
        let pad = start - self.top;
        if pad > 0 {
            let h = self.insert_between(self.last, NIL, self.top, pad, FREE);
            self.index.insert(self.top, pad, h);
            self.counters.free_bytes += pad;
            self.counters.free_blocks += 1;
            self.last = h;
        }
        let h = self.insert_between(self.last, NIL, start, reserved, tag);
        self.last = h;
        self.top = new_top;
        self.counters.footprint_bytes = new_top;
        Some((start, h))
    }

    /// `h` if it is a free block.
    fn free_rec(&self, h: u32) -> Option<Rec> {
        self.rec(h).filter(|r| r.tag.is_free()).copied()
    }

    pub(crate) fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        let Some(h) = self.used.remove(&addr) else {
            return Err(FreeError::UnknownAddr(addr));
        };
        let rec = match self.rec(h) {
            Some(&r) if r.addr == addr => r,
            _ => return Err(FreeError::UnknownAddr(addr)),
        };
        if rec.tag.is_free() {
            return Err(FreeError::UnknownAddr(addr));
        }
        let requested_bytes = rec.len - u64::from(rec.tag.slack);
        self.counters.live_allocs -= 1;
        self.counters.live_bytes -= requested_bytes;
        self.counters.allocated_bytes -= rec.len;

        let prev = self.free_rec(rec.prev);
        if rec.next == NIL {
            // The topmost block: give it back by lowering the top, with the free block below
            // it if any (a free block never touches the top, so nothing lies above).
            let mut new_top = addr;
            self.unlink(h);
            if let Some(p) = prev {
                self.index.remove(p.addr, p.len, rec.prev);
                self.counters.free_bytes -= p.len;
                self.counters.free_blocks -= 1;
                new_top = p.addr;
                self.unlink(rec.prev);
            }
            self.top = new_top;
            self.counters.footprint_bytes = new_top;
        } else {
            let next = self.free_rec(rec.next);
            match (prev, next) {
                (None, None) => {
                    self.index.insert(addr, rec.len, h);
                    self.counters.free_blocks += 1;
                    if let Some(r) = self.rec_mut(h) {
                        r.tag = FREE;
                    }
                }
                (Some(p), None) => {
                    self.index
                        .relocate(rec.prev, p.addr, p.len, p.addr, p.len + rec.len);
                    if let Some(r) = self.rec_mut(rec.prev) {
                        r.len += rec.len;
                    }
                    self.unlink(h);
                }
                (None, Some(n)) => {
                    self.index
                        .relocate(rec.next, n.addr, n.len, addr, n.len + rec.len);
                    if let Some(r) = self.rec_mut(rec.next) {
                        r.addr = addr;
                        r.len += rec.len;
                    }
                    self.unlink(h);
                }
                (Some(p), Some(n)) => {
                    self.index.remove(n.addr, n.len, rec.next);
                    self.index
                        .relocate(rec.prev, p.addr, p.len, p.addr, p.len + rec.len + n.len);
                    if let Some(r) = self.rec_mut(rec.prev) {
                        r.len += rec.len + n.len;
                    }
                    self.unlink(rec.next);
                    self.unlink(h);
                    self.counters.free_blocks -= 1;
                }
            }
            self.counters.free_bytes += rec.len;
        }
        self.counters.largest_free_bytes = self.index.largest();
        Ok(())
    }

    pub(crate) fn blocks(&self, out: &mut Vec<Block>) {
        let order = self.order();
        out.reserve(order.len());
        out.extend(order.iter().filter_map(|&h| self.rec(h)).map(|r| Block {
            addr: r.addr,
            len_bytes: r.len,
            state: if r.tag.is_free() {
                BlockState::Free
            } else {
                BlockState::Used {
                    id: r.tag.id,
                    requested_bytes: r.len - u64::from(r.tag.slack),
                }
            },
        }));
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let order = self.order();
        let mut addr: Addr = 0;
        let mut prev = NIL;
        let mut prev_free = false;
        let mut free_entries = Vec::new();
        let mut used_count = 0usize;
        for &h in &order {
            let r = self
                .rec(h)
                .ok_or_else(|| format!("slot {h} out of the slab"))?;
            if r.addr != addr {
                return Err(format!("block at {:#x}, expected one at {addr:#x}", r.addr));
            }
            if r.len == 0
                || !r.len.is_multiple_of(self.base_align)
                || !addr.is_multiple_of(self.base_align)
            {
                return Err(format!("block {addr:#x}+{} is misaligned or empty", r.len));
            }
            if r.prev != prev {
                return Err(format!("block {addr:#x}: broken prev link"));
            }
            if let Some(p) = self.rec(prev)
                && p.next != h
            {
                return Err(format!("block {addr:#x}: broken next link below it"));
            }
            let is_free = r.tag.is_free();
            if is_free && prev_free {
                return Err(format!(
                    "free blocks below {addr:#x} and at it not coalesced"
                ));
            }
            if is_free {
                free_entries.push((addr, r.len, h));
            } else {
                used_count += 1;
                if self.used.get(&addr) != Some(&h) {
                    return Err(format!("used block {addr:#x} missing from the address map"));
                }
            }
            prev_free = is_free;
            prev = h;
            addr += r.len;
        }
        if addr != self.top {
            return Err(format!("blocks end at {addr:#x}, top is {:#x}", self.top));
        }
        if self.rec(self.last).is_some_and(|r| r.next != NIL) {
            return Err("the last block has a successor".to_owned());
        }
        if used_count != self.used.len() {
            return Err(format!(
                "{} addresses mapped but {used_count} used blocks",
                self.used.len()
            ));
        }
        if order.len() + self.spare.len() != self.slab.len() {
            return Err("the slab leaks slots".to_owned());
        }
        if prev_free {
            return Err("a free block touches the heap top".to_owned());
        }
        if self.index.entries() != free_entries {
            return Err("free index disagrees with the free blocks".to_owned());
        }
        self.index.check()?;
        let mut blocks = Vec::new();
        self.blocks(&mut blocks);
        let expected = Counters::from_blocks(&blocks, self.top);
        if expected != self.counters {
            return Err(format!(
                "counters {:?} but blocks give {expected:?}",
                self.counters
            ));
        }
        if self.limit.is_some_and(|limit| self.top > limit) {
            return Err(format!("top {:#x} above the limit", self.top));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_and_detects_overflow() {
        assert_eq!(align_up(0, 16), Some(0));
        assert_eq!(align_up(1, 16), Some(16));
        assert_eq!(align_up(16, 16), Some(16));
        assert_eq!(align_up(17, 64), Some(64));
        assert_eq!(align_up(u64::MAX - 3, 16), None);
    }
}
