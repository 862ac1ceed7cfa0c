//! Shared machinery of the simulated policies: alignment helpers, and the
//! boundary-tag heap that `first-fit` and `best-fit` share.
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
use crate::policy::registry::PolicyConfig;
use crate::policy::{Addr, AllocError, Block, BlockState, Counters, FreeError, Placement, Request};

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

    pub(crate) fn index(&self) -> &I {
        &self.index
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

/// Most free blocks one chunk holds; a full chunk splits in two.
const CHUNK_CAP: usize = 32;
/// A chunk this short merges into a neighbour when the two fit in half a chunk.
const CHUNK_MERGE: usize = CHUNK_CAP / 8;

/// Index of the first length of at least `min_len`. Compares eight at a time without an early
/// exit inside a group, which the compiler turns into vector compares: a plain `position` loop
/// is scalar and was the search's main cost on real traces.
fn first_at_least(lens: &[u64], min_len: u64) -> Option<usize> {
    let mut groups = lens.chunks_exact(8);
    let mut base = 0;
    for group in &mut groups {
        let mask = group
            .iter()
            .enumerate()
            .fold(0u32, |m, (k, &l)| m | (u32::from(l >= min_len) << k));
        if mask != 0 {
            return Some(base + mask.trailing_zeros() as usize);
        }
        base += 8;
    }
    groups
        .remainder()
        .iter()
        .position(|&l| l >= min_len)
        .map(|i| base + i)
}

/// Free blocks of one stretch of the address order, as parallel sorted arrays (the lengths
/// contiguous, so the in-chunk search is a short linear scan the compiler vectorises).
#[derive(Clone, Debug, Default)]
struct Chunk {
    addr: Vec<Addr>,
    len: Vec<u64>,
    handle: Vec<u32>,
    max_len: u64,
}

impl Chunk {
    fn recompute_max(&mut self) {
        self.max_len = self.len.iter().copied().max().unwrap_or(0);
    }

    /// Position of `addr` in this chunk, or where it would be inserted.
    fn position(&self, addr: Addr) -> Result<usize, usize> {
        // Counting the smaller addresses compares the whole (short) chunk with vector
        // instructions and no branches, faster here than a binary search's dependent steps.
        let i = self.addr.iter().filter(|&&a| a < addr).count();
        if self.addr.get(i) == Some(&addr) {
            Ok(i)
        } else {
            Err(i)
        }
    }

    fn insert_at(&mut self, i: usize, addr: Addr, len: u64, handle: u32) {
        self.addr.insert(i, addr);
        self.len.insert(i, len);
        self.handle.insert(i, handle);
        self.max_len = self.max_len.max(len);
    }

    fn remove_at(&mut self, i: usize) {
        if i < self.addr.len() {
            self.addr.remove(i);
            let len = self.len.remove(i);
            self.handle.remove(i);
            if len == self.max_len {
                self.recompute_max();
            }
        }
    }

    /// Moves the upper half into a new chunk.
    fn split_off_half(&mut self) -> Chunk {
        let at = self.addr.len() / 2;
        let mut upper = Chunk {
            addr: self.addr.split_off(at),
            len: self.len.split_off(at),
            handle: self.handle.split_off(at),
            max_len: 0,
        };
        upper.recompute_max();
        self.recompute_max();
        upper
    }

    fn append(&mut self, other: Chunk) {
        self.addr.extend(other.addr);
        self.len.extend(other.len);
        self.handle.extend(other.handle);
        self.max_len = self.max_len.max(other.max_len);
    }
}

/// Free blocks in address order (first fit's index, the oracle's gaps): sorted chunks of at most
/// [`CHUNK_CAP`] blocks and a max-tree over the chunks' largest lengths (the `first_fit` module
/// docs describe the operations and their costs).
#[derive(Clone, Debug, Default)]
pub(crate) struct AddrChunks {
    chunks: Vec<Chunk>,
    /// First address of each chunk (chunks are never empty), for locating an address.
    firsts: Vec<Addr>,
    /// Implicit binary tree over the chunks: leaf `leaves + c` holds chunk `c`'s largest
    /// length, each inner node the larger of its children; `tree[1]` is the largest of all.
    tree: Vec<u64>,
    leaves: usize,
    len: usize,
    /// `(chunk, index)` of the block the last search returned, while nothing has moved.
    found: Option<(usize, usize)>,
    /// Per handle, the chunk its block was last seen in (possibly stale).
    hint: Vec<u32>,
}

impl AddrChunks {
    /// Number of blocks held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The block with the highest address at or below `addr`, as `(addr, len)`.
    pub(crate) fn at_or_below(&self, addr: Addr) -> Option<(Addr, u64)> {
        let c = self.chunk_for(addr);
        let chunk = self.chunks.get(c)?;
        let i = chunk.addr.partition_point(|&a| a <= addr).checked_sub(1)?;
        Some((*chunk.addr.get(i)?, *chunk.len.get(i)?))
    }

    /// Rebuilds the max-tree after chunks were added or removed.
    fn rebuild(&mut self) {
        self.leaves = self.chunks.len().next_power_of_two();
        self.tree.clear();
        self.tree.resize(2 * self.leaves, 0);
        for (c, chunk) in self.chunks.iter().enumerate() {
            if let Some(slot) = self.tree.get_mut(self.leaves + c) {
                *slot = chunk.max_len;
            }
        }
        for node in (1..self.leaves).rev() {
            let m = self.child_max(node);
            if let Some(slot) = self.tree.get_mut(node) {
                *slot = m;
            }
        }
        self.firsts.clear();
        self.firsts.extend(
            self.chunks
                .iter()
                .map(|c| c.addr.first().copied().unwrap_or(0)),
        );
    }

    fn child_max(&self, node: usize) -> u64 {
        let l = self.tree.get(2 * node).copied().unwrap_or(0);
        let r = self.tree.get(2 * node + 1).copied().unwrap_or(0);
        l.max(r)
    }

    /// Propagates chunk `c`'s largest length (and first address) up the tree.
    fn refresh(&mut self, c: usize) {
        let Some(chunk) = self.chunks.get(c) else {
            return;
        };
        let (max_len, first) = (chunk.max_len, chunk.addr.first().copied().unwrap_or(0));
        if let Some(f) = self.firsts.get_mut(c) {
            *f = first;
        }
        let mut node = self.leaves + c;
        if let Some(slot) = self.tree.get_mut(node) {
            if *slot == max_len {
                return;
            }
            *slot = max_len;
        }
        while node > 1 {
            node /= 2;
            let m = self.child_max(node);
            match self.tree.get_mut(node) {
                Some(slot) if *slot != m => *slot = m,
                _ => break,
            }
        }
    }

    /// The chunk whose range holds `addr`: the last one starting at or below it (or the first).
    fn chunk_for(&self, addr: Addr) -> usize {
        self.firsts
            .partition_point(|&f| f <= addr)
            .saturating_sub(1)
    }

    /// `(chunk, index)` of block `handle` at `addr`: the last search's result, else the chunk
    /// the block was last seen in (chunks shift when one splits or empties, so the hint is
    /// checked), else a binary search of the chunks by address.
    fn locate(&mut self, addr: Addr, handle: u32) -> Option<(usize, usize)> {
        if let Some((c, i)) = self.found
            && self.chunks.get(c).and_then(|ch| ch.addr.get(i)) == Some(&addr)
        {
            return Some((c, i));
        }
        if let Some(&c) = self.hint.get(handle as usize)
            && let Some(Ok(i)) = self.chunks.get(c as usize).map(|ch| ch.position(addr))
        {
            return Some((c as usize, i));
        }
        let c = self.chunk_for(addr);
        let i = self.chunks.get(c)?.position(addr).ok()?;
        self.set_hint(handle, c);
        Some((c, i))
    }

    fn set_hint(&mut self, handle: u32, c: usize) {
        let h = handle as usize;
        if h >= self.hint.len() {
            self.hint.resize(h + 1, u32::MAX);
        }
        if let Some(slot) = self.hint.get_mut(h) {
            *slot = c as u32;
        }
    }

    /// Chunk `c` lost blocks: drops it when empty, or merges it into a neighbour when both are
    /// short.
    fn after_removal(&mut self, c: usize) {
        let Some(n) = self.chunks.get(c).map(|ch| ch.addr.len()) else {
            return;
        };
        if n == 0 {
            self.chunks.remove(c);
            self.rebuild();
            return;
        }
        if n <= CHUNK_MERGE {
            let small_neighbour = |d: usize| {
                self.chunks
                    .get(d)
                    .is_some_and(|ch| ch.addr.len() + n <= CHUNK_CAP / 2)
            };
            let pair = if c > 0 && small_neighbour(c - 1) {
                Some(c - 1)
            } else if small_neighbour(c + 1) {
                Some(c)
            } else {
                None
            };
            if let Some(lower) = pair
                && lower + 1 < self.chunks.len()
            {
                let upper = self.chunks.remove(lower + 1);
                if let Some(ch) = self.chunks.get_mut(lower) {
                    ch.append(upper);
                }
                self.rebuild();
                return;
            }
        }
        self.refresh(c);
    }
}

impl FreeIndex for AddrChunks {
    fn insert(&mut self, addr: Addr, len: u64, handle: u32) {
        self.found = None;
        self.len += 1;
        if self.chunks.is_empty() {
            self.chunks.push(Chunk::default());
            self.rebuild();
        }
        let c = self.chunk_for(addr);
        let Some(chunk) = self.chunks.get_mut(c) else {
            return;
        };
        let i = chunk.position(addr).unwrap_or_else(|i| i);
        chunk.insert_at(i, addr, len, handle);
        if chunk.addr.len() > CHUNK_CAP {
            let upper = chunk.split_off_half();
            for &h in &upper.handle {
                self.set_hint(h, c + 1);
            }
            self.chunks.insert(c + 1, upper);
            self.rebuild();
        } else {
            self.refresh(c);
        }
        // After a split the block may sit in either half: a wrong hint is only a slower lookup.
        self.set_hint(handle, c);
    }

    fn remove(&mut self, addr: Addr, _len: u64, handle: u32) {
        let Some((c, i)) = self.locate(addr, handle) else {
            return;
        };
        self.found = None;
        self.len -= 1;
        if let Some(chunk) = self.chunks.get_mut(c) {
            chunk.remove_at(i);
        }
        self.after_removal(c);
    }

    fn relocate(
        &mut self,
        handle: u32,
        old_addr: Addr,
        old_len: u64,
        new_addr: Addr,
        new_len: u64,
    ) {
        let Some((c, i)) = self.locate(old_addr, handle) else {
            return;
        };
        let Some(chunk) = self.chunks.get_mut(c) else {
            return;
        };
        // The caller guarantees no free block lies between the two addresses: the rank holds.
        if let (Some(a), Some(l)) = (chunk.addr.get_mut(i), chunk.len.get_mut(i)) {
            *a = new_addr;
            *l = new_len;
        }
        if new_len >= chunk.max_len {
            chunk.max_len = new_len;
        } else if old_len == chunk.max_len {
            chunk.recompute_max();
        }
        self.found = Some((c, i));
        self.refresh(c);
    }

    fn find(&mut self, min_len: u64) -> Option<(Addr, u64, u32)> {
        self.found = None;
        if self.tree.get(1).copied().unwrap_or(0) < min_len {
            return None;
        }
        let mut node = 1;
        while node < self.leaves {
            node = if self.tree.get(2 * node).is_some_and(|&m| m >= min_len) {
                2 * node
            } else {
                2 * node + 1
            };
        }
        let c = node - self.leaves;
        let chunk = self.chunks.get(c)?;
        let i = first_at_least(&chunk.len, min_len)?;
        self.found = Some((c, i));
        Some((
            *chunk.addr.get(i)?,
            *chunk.len.get(i)?,
            *chunk.handle.get(i)?,
        ))
    }

    fn largest(&self) -> u64 {
        self.tree.get(1).copied().unwrap_or(0)
    }

    fn entries(&self) -> Vec<(Addr, u64, u32)> {
        let mut out = Vec::with_capacity(self.len);
        for ch in &self.chunks {
            out.extend(
                ch.addr
                    .iter()
                    .zip(&ch.len)
                    .zip(&ch.handle)
                    .map(|((&a, &l), &h)| (a, l, h)),
            );
        }
        out
    }

    fn remap_handles(&mut self, new_of: &[u32]) {
        for h in self.chunks.iter_mut().flat_map(|ch| ch.handle.iter_mut()) {
            *h = new_of.get(*h as usize).copied().unwrap_or(u32::MAX);
        }
        self.hint = Vec::new();
        let placed: Vec<(u32, usize)> = (0..self.chunks.len())
            .flat_map(|c| {
                let handles = self.chunks.get(c).map_or(&[][..], |ch| &ch.handle[..]);
                handles.iter().map(move |&h| (h, c))
            })
            .collect();
        for (h, c) in placed {
            self.set_hint(h, c);
        }
    }

    fn check(&self) -> Result<(), String> {
        let mut count = 0;
        let mut prev: Option<Addr> = None;
        for (c, ch) in self.chunks.iter().enumerate() {
            if ch.addr.is_empty() || ch.addr.len() > CHUNK_CAP {
                return Err(format!("chunk {c} holds {} blocks", ch.addr.len()));
            }
            if ch.len.len() != ch.addr.len() || ch.handle.len() != ch.addr.len() {
                return Err(format!("chunk {c}: arrays of different lengths"));
            }
            for &a in &ch.addr {
                if prev.is_some_and(|p| p >= a) {
                    return Err(format!("address order broken at {a:#x}"));
                }
                prev = Some(a);
            }
            if ch.max_len != ch.len.iter().copied().max().unwrap_or(0) {
                return Err(format!("chunk {c}: largest length wrong"));
            }
            if self.firsts.get(c) != ch.addr.first() {
                return Err(format!("chunk {c}: first address wrong"));
            }
            if self.tree.get(self.leaves + c) != Some(&ch.max_len) {
                return Err(format!("chunk {c}: max-tree leaf wrong"));
            }
            count += ch.addr.len();
        }
        if self.firsts.len() != self.chunks.len() {
            return Err("one first address per chunk expected".to_owned());
        }
        for node in 1..self.leaves {
            if self.tree.get(node) != Some(&self.child_max(node)) {
                return Err(format!("max-tree node {node} wrong"));
            }
        }
        if count != self.len {
            return Err(format!(
                "{count} free blocks indexed, len says {}",
                self.len
            ));
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

    #[test]
    fn chunks_finds_lowest_fitting_address() {
        let mut t = AddrChunks::default();
        for (addr, len) in [(0, 32), (100, 64), (200, 16), (300, 128), (500, 64)] {
            t.insert(addr, len, addr as u32);
            t.check().unwrap();
        }
        assert_eq!(t.find(16), Some((0, 32, 0)));
        assert_eq!(t.find(33), Some((100, 64, 100)));
        assert_eq!(t.find(65), Some((300, 128, 300)));
        assert_eq!(t.find(129), None);
        assert_eq!(t.largest(), 128);
        t.remove(300, 128, 300);
        t.check().unwrap();
        assert_eq!(t.find(65), None);
        assert_eq!(t.largest(), 64);
        t.relocate(100, 100, 64, 110, 200);
        t.check().unwrap();
        assert_eq!(t.find(65), Some((110, 200, 100)));
        assert_eq!(
            t.entries(),
            vec![(0, 32, 0), (110, 200, 100), (200, 16, 200), (500, 64, 500)]
        );
    }

    #[test]
    fn chunks_stay_consistent_under_many_operations() {
        let mut t = AddrChunks::default();
        let mut model = std::collections::BTreeMap::new();
        let mut x: u64 = 7;
        // Grows to thousands of blocks (many splits), shrinks back to none (merges and empty
        // chunks), and grows again; every search is checked against the sorted map.
        for step in 0..60_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let addr = (x >> 40) % 8192 * 16;
            let len = (x >> 20) % 4096 + 1;
            let growing = (step / 20_000) % 2 == 0;
            if model.contains_key(&addr) && (!growing || x.is_multiple_of(4)) {
                model.remove(&addr);
                t.remove(addr, 0, addr as u32);
            } else if growing && !model.contains_key(&addr) {
                model.insert(addr, len);
                t.insert(addr, len, addr as u32);
            } else if let Some((&a, &l)) = model.range(addr..).next() {
                // Shrink or grow a block in place, as carving and coalescing do.
                let new_len = (l / 2).max(1) + x % 3;
                model.insert(a, new_len);
                t.relocate(a as u32, a, l, a, new_len);
            }
            let want = (x >> 8) % 4200;
            let expected = model
                .iter()
                .find(|&(_, &l)| l >= want)
                .map(|(&a, &l)| (a, l, a as u32));
            assert_eq!(t.find(want), expected, "step {step}");
            assert_eq!(t.largest(), model.values().copied().max().unwrap_or(0));
            let at = (x >> 30) % 8300 * 16;
            assert_eq!(
                t.at_or_below(at),
                model.range(..=at).next_back().map(|(&a, &l)| (a, l))
            );
            if step % 997 == 0 {
                t.check().unwrap();
            }
        }
        t.check().unwrap();
        assert_eq!(
            t.entries(),
            model
                .into_iter()
                .map(|(a, l)| (a, l, a as u32))
                .collect::<Vec<_>>()
        );
    }
}
