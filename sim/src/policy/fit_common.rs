//! Shared machinery of the simulated policies: a fast address-keyed hash map, and the
//! boundary-tag heap that `first-fit` and `best-fit` share.
//!
//! [`FitHeap`] keeps every block below the heap top (used and free) in a hash map keyed by
//! address. Each record carries its length and the address of the block physically before it (a
//! boundary tag), so freeing finds both neighbours in O(1). Free blocks are also kept in a
//! [`FreeIndex`], the one thing that differs between the fit policies: it answers "which free
//! block should a request of n bytes take" in O(log n).
//!
//! Heap top: the blocks tile `[0, top)` exactly and the block that ends at `top` is always in
//! use. A request that no hole can serve is carved at the top, which grows (the footprint is the
//! top). Freeing the last block, after coalescing with a free block below it, lowers the top, as
//! `sbrk` trimming would.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::policy::registry::PolicyConfig;
use crate::policy::{Addr, AllocError, Block, BlockState, Counters, FreeError, Placement, Request};

/// Multiplicative hasher for addresses: they are multiples of the alignment, so a plain
/// identity hash would leave the low bits (which pick the bucket) all zero.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AddrHasher(u64);

const HASH_MUL: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let product = u128::from(x ^ self.0) * u128::from(HASH_MUL);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

/// Hash map keyed by simulated address.
pub(crate) type AddrMap<V> = HashMap<Addr, V, BuildHasherDefault<AddrHasher>>;

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

/// Ordered set of free blocks that picks the block for a request.
pub(crate) trait FreeIndex: Clone + Send + Sync + 'static {
    fn insert(&mut self, addr: Addr, len: u64);
    fn remove(&mut self, addr: Addr, len: u64);
    /// Changes a block's address and/or length. The caller guarantees that no other free block
    /// lies between the old and the new address, so an address-ordered index may update in
    /// place.
    fn relocate(&mut self, old_addr: Addr, old_len: u64, new_addr: Addr, new_len: u64);
    /// The block a request of at least `min_len` bytes takes, if any.
    fn find(&mut self, min_len: u64) -> Option<(Addr, u64)>;
    /// Length of the largest free block (0 when empty).
    fn largest(&self) -> u64;
    /// Every `(addr, len)` in address order (for invariant checks).
    fn entries(&self) -> Vec<(Addr, u64)>;
    /// Self-check of the index's own structure.
    fn check(&self) -> Result<(), String>;
}

/// No block before this one (the block at address 0).
const NONE: Addr = Addr::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    Free,
    Used { id: u32, requested_bytes: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Rec {
    len: u64,
    /// Address of the physically preceding block, or [`NONE`].
    prev: Addr,
    tag: Tag,
}

/// The boundary-tag heap of the fit policies, generic over how a free block is chosen.
#[derive(Clone, Debug)]
pub(crate) struct FitHeap<I> {
    recs: AddrMap<Rec>,
    index: I,
    base_align: u64,
    limit: Option<u64>,
    top: u64,
    /// Address of the block that ends at `top`, or [`NONE`] when the heap is empty.
    last: Addr,
    counters: Counters,
}

impl<I: FreeIndex> FitHeap<I> {
    /// Drops the spare capacity of the address map. A hash map's clone copies its whole table,
    /// and the table never shrinks after the heap's busiest moment: replay checkpoints call
    /// this so each costs memory for its live blocks only.
    pub(crate) fn compact(&mut self) {
        self.recs.shrink_to_fit();
    }

    pub(crate) fn new(config: &PolicyConfig, index: I) -> Result<Self, String> {
        let base_align = check_align(config)?;
        Ok(Self {
            recs: AddrMap::default(),
            index,
            base_align,
            limit: config.limit_bytes,
            top: 0,
            last: NONE,
            counters: Counters::default(),
        })
    }

    pub(crate) fn index(&self) -> &I {
        &self.index
    }

    pub(crate) fn counters(&self) -> Counters {
        self.counters
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
        let tag = Tag::Used {
            id: req.id,
            requested_bytes: req.size_bytes,
        };
        let limit = self.limit;
        let oom = |c: &Counters| oom(req.size_bytes, c, limit);
        let Some(reserved) = self.reserved_for(req.size_bytes) else {
            return Err(oom(&self.counters));
        };
        // Every block starts at a multiple of the base alignment, so an over-aligned request
        // needs at most `align - base_align` bytes of padding: searching for the padded length
        // guarantees that the chosen hole fits, at the price of skipping holes that would
        // have fitted only because they happen to be aligned.
        let Some(search_len) = reserved.checked_add(align - self.base_align) else {
            return Err(oom(&self.counters));
        };
        let addr = match self.index.find(search_len) {
            Some((hole, hole_len)) => self.carve(hole, hole_len, align, reserved, tag),
            None => match self.extend(align, reserved, tag) {
                Some(addr) => addr,
                None => return Err(oom(&self.counters)),
            },
        };
        self.counters.live_allocs += 1;
        self.counters.live_bytes += req.size_bytes;
        self.counters.allocated_bytes += reserved;
        self.counters.largest_free_bytes = self.index.largest();
        Ok(Placement {
            addr,
            reserved_bytes: reserved,
        })
    }

    /// Places `reserved` bytes in the free block `[hole, hole + hole_len)`, which the search
    /// guaranteed to be large enough after alignment padding.
    fn carve(&mut self, hole: Addr, hole_len: u64, align: u64, reserved: u64, tag: Tag) -> Addr {
        let hole_end = hole + hole_len;
        let start = align_up(hole, align).unwrap_or(hole);
        let pad = start - hole;
        let end = start + reserved;
        let rest = hole_end - end;

        if pad > 0 {
            // The padding stays free, in the hole's record.
            self.index.relocate(hole, hole_len, hole, pad);
            if let Some(r) = self.recs.get_mut(&hole) {
                r.len = pad;
            }
            self.recs.insert(
                start,
                Rec {
                    len: reserved,
                    prev: hole,
                    tag,
                },
            );
        } else if let Some(r) = self.recs.get_mut(&hole) {
            // The allocation takes over the hole's record (same address, same predecessor).
            r.len = reserved;
            r.tag = tag;
        }
        if rest > 0 {
            if pad > 0 {
                self.index.insert(end, rest);
                self.counters.free_blocks += 1;
            } else {
                self.index.relocate(hole, hole_len, end, rest);
            }
            self.recs.insert(
                end,
                Rec {
                    len: rest,
                    prev: start,
                    tag: Tag::Free,
                },
            );
        } else if pad == 0 {
            self.index.remove(hole, hole_len);
            self.counters.free_blocks -= 1;
        }
        // A hole never touches the top, so a block always follows it.
        if let Some(next) = self.recs.get_mut(&hole_end) {
            next.prev = if rest > 0 { end } else { start };
        }
        self.counters.free_bytes -= reserved;
        start
    }

    /// Places `reserved` bytes at the heap top; `None` when the limit forbids it.
    fn extend(&mut self, align: u64, reserved: u64, tag: Tag) -> Option<Addr> {
        let start = align_up(self.top, align)?;
        let new_top = start.checked_add(reserved)?;
        if self.limit.is_some_and(|limit| new_top > limit) {
            return None;
        }
        let pad = start - self.top;
        let used_prev = if pad > 0 {
            self.recs.insert(
                self.top,
                Rec {
                    len: pad,
                    prev: self.last,
                    tag: Tag::Free,
                },
            );
            self.index.insert(self.top, pad);
            self.counters.free_bytes += pad;
            self.counters.free_blocks += 1;
            self.top
        } else {
            self.last
        };
        self.recs.insert(
            start,
            Rec {
                len: reserved,
                prev: used_prev,
                tag,
            },
        );
        self.last = start;
        self.top = new_top;
        self.counters.footprint_bytes = new_top;
        Some(start)
    }

    pub(crate) fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        let (rec, requested_bytes) = match self.recs.get(&addr) {
            Some(
                r @ Rec {
                    tag:
                        Tag::Used {
                            requested_bytes, ..
                        },
                    ..
                },
            ) => (*r, *requested_bytes),
            _ => return Err(FreeError::UnknownAddr(addr)),
        };
        self.counters.live_allocs -= 1;
        self.counters.live_bytes -= requested_bytes;
        self.counters.allocated_bytes -= rec.len;

        let end = addr + rec.len;
        let prev_free = self
            .recs
            .get(&rec.prev)
            .filter(|p| p.tag == Tag::Free)
            .map(|p| (p.len, p.prev));
        let next_free = if end < self.top {
            self.recs
                .get(&end)
                .filter(|n| n.tag == Tag::Free)
                .map(|n| n.len)
        } else {
            None
        };

        let mut start = addr;
        let mut len = rec.len;
        let mut prev = rec.prev;
        if let Some((p_len, p_prev)) = prev_free {
            start = rec.prev;
            len += p_len;
            prev = p_prev;
        }
        let prev_free = prev_free.map(|(p_len, _)| p_len);
        if let Some(n_len) = next_free {
            len += n_len;
            self.recs.remove(&end);
        }
        if start != addr {
            self.recs.remove(&addr);
        }
        let merged_end = start + len;

        if merged_end == self.top {
            // The merged block is the topmost: give it back by lowering the top. A free block
            // never ends at the top, so only the block below can have been merged.
            if let Some(p_len) = prev_free {
                self.index.remove(start, p_len);
                self.counters.free_bytes -= p_len;
                self.counters.free_blocks -= 1;
            }
            self.recs.remove(&start);
            self.top = start;
            self.last = prev;
            self.counters.footprint_bytes = start;
        } else {
            match (prev_free, next_free) {
                (None, None) => {
                    self.index.insert(addr, rec.len);
                    self.counters.free_blocks += 1;
                }
                (Some(p_len), None) => self.index.relocate(start, p_len, start, len),
                (None, Some(n_len)) => self.index.relocate(end, n_len, start, len),
                (Some(p_len), Some(n_len)) => {
                    self.index.remove(end, n_len);
                    self.index.relocate(start, p_len, start, len);
                    self.counters.free_blocks -= 1;
                }
            }
            self.counters.free_bytes += rec.len;
            // `start` is the freed block or the free block below it: its record exists.
            if let Some(r) = self.recs.get_mut(&start) {
                *r = Rec {
                    len,
                    prev,
                    tag: Tag::Free,
                };
            }
            if let Some(next) = self.recs.get_mut(&merged_end) {
                next.prev = start;
            }
        }
        self.counters.largest_free_bytes = self.index.largest();
        Ok(())
    }

    pub(crate) fn blocks(&self, out: &mut Vec<Block>) {
        let first = out.len();
        out.reserve(self.recs.len());
        out.extend(self.recs.iter().map(|(&addr, r)| Block {
            addr,
            len_bytes: r.len,
            state: match r.tag {
                Tag::Free => BlockState::Free,
                Tag::Used {
                    id,
                    requested_bytes,
                } => BlockState::Used {
                    id,
                    requested_bytes,
                },
            },
        }));
        if let Some(tail) = out.get_mut(first..) {
            tail.sort_unstable_by_key(|b| b.addr);
        }
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut addr: Addr = 0;
        let mut prev = NONE;
        let mut prev_free = false;
        let mut seen = 0usize;
        let mut free_entries = Vec::new();
        let mut blocks = Vec::new();
        while addr < self.top {
            let r = self
                .recs
                .get(&addr)
                .ok_or_else(|| format!("no block at {addr:#x} below top {:#x}", self.top))?;
            if r.len == 0
                || !r.len.is_multiple_of(self.base_align)
                || !addr.is_multiple_of(self.base_align)
            {
                return Err(format!("block {addr:#x}+{} is misaligned or empty", r.len));
            }
            if r.prev != prev {
                return Err(format!(
                    "block {addr:#x}: boundary tag says prev {:#x}, walk says {prev:#x}",
                    r.prev
                ));
            }
            let is_free = r.tag == Tag::Free;
            if is_free && prev_free {
                return Err(format!("free blocks {prev:#x} and {addr:#x} not coalesced"));
            }
            if is_free {
                free_entries.push((addr, r.len));
            }
            prev_free = is_free;
            prev = addr;
            addr += r.len;
            seen += 1;
        }
        if addr != self.top {
            return Err(format!("blocks end at {addr:#x}, top is {:#x}", self.top));
        }
        if seen != self.recs.len() {
            return Err(format!(
                "{} records but {seen} blocks below the top",
                self.recs.len()
            ));
        }
        if prev != self.last {
            return Err(format!("last block {prev:#x}, recorded {:#x}", self.last));
        }
        if prev_free {
            return Err("a free block touches the heap top".to_owned());
        }
        if self.index.entries() != free_entries {
            return Err("free index disagrees with the free blocks".to_owned());
        }
        self.index.check()?;
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

    #[test]
    fn hasher_spreads_aligned_addresses_over_low_bits() {
        let mut low_bits = std::collections::HashSet::new();
        for i in 0..64u64 {
            let mut h = AddrHasher::default();
            h.write_u64(i * 4096);
            low_bits.insert(h.finish() & 63);
        }
        assert!(low_bits.len() > 32, "{} distinct buckets", low_bits.len());
    }
}
