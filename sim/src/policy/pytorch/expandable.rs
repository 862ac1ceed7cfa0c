//! Expandable segments (`expandable_segments:True`): one VA reservation per (stream, pool),
//! with pages mapped on demand (`try_allocate_expandable_block`, `map_block`) and whole free
//! pages unmapped on release (`unmap_block`).
//!
//! Unlike PyTorch, which maps page by page and keeps what it mapped when a later map fails,
//! the pages a request needs are counted first ([`Pytorch::map_plan_bytes`]) and nothing is
//! mapped unless all of them fit the device, so a failed request leaves no trace.

use super::constants::{LARGE_BUFFER_BYTES, SMALL_BUFFER_BYTES};
use super::heap::{BlockRec, Occupant, SegmentRec, pool_index};
use super::malloc::Params;
use super::{Pytorch, SEGMENT_ALIGN_BYTES, SegmentOpKind};
use crate::heap::Addr;

/// The page size of a pool's expandable segments: 2 MiB small, 20 MiB large.
pub(super) fn page_bytes(small_pool: bool) -> u64 {
    if small_pool {
        SMALL_BUFFER_BYTES
    } else {
        LARGE_BUFFER_BYTES
    }
}

/// True when `[addr, addr + size_bytes)` is whole pages of `rec`'s segment.
pub(super) fn is_whole_pages(rec: &BlockRec, addr: Addr, size_bytes: u64) -> bool {
    let page = page_bytes(rec.small_pool);
    addr >= rec.segment_addr
        && (addr - rec.segment_addr).is_multiple_of(page)
        && size_bytes.is_multiple_of(page)
}

impl Pytorch {
    /// A reservation's size: whole pages covering 1.125 × device memory.
    pub(super) fn reservation_bytes(&self, small_pool: bool) -> u64 {
        let page = page_bytes(small_pool);
        let want = self.device_bytes.saturating_add(self.device_bytes / 8);
        want.checked_next_multiple_of(page)
            .unwrap_or(u64::MAX - u64::MAX % page)
    }

    /// `try_allocate_expandable_block`: maps the pages the request lacks at the lowest run of
    /// free and unmapped space that holds it, and returns the resulting free block.
    pub(super) fn try_allocate_expandable_block(&mut self, p: &Params) -> Option<Addr> {
        let page = page_bytes(p.small_pool);
        let start = self.find_expandable_block(p);
        let map_bytes = match start {
            Some(addr) => self.map_plan_bytes(addr, p.size_bytes)?,
            None => {
                let pages = p.size_bytes.checked_next_multiple_of(page)?;
                (pages <= self.reservation_bytes(p.small_pool)).then_some(pages)?
            }
        };
        let device_cap = self.limit_bytes.unwrap_or(u64::MAX);
        if self
            .heap
            .counters()
            .footprint_bytes
            .saturating_add(map_bytes)
            > device_cap
        {
            return None;
        }
        let mut cand = match start {
            Some(addr) => addr,
            None => self.create_reservation(p)?,
        };
        let first = self.heap.block(cand)?;
        if first.occupant == Occupant::Unmapped {
            cand = self.map_block(cand, first.size_bytes.min(p.size_bytes), p.id)?;
        }
        loop {
            let rec = self.heap.block(cand)?;
            if rec.size_bytes >= p.size_bytes {
                return Some(cand);
            }
            // The run is free -> unmapped -> ...: map what is still missing.
            let (next, n) = self
                .heap
                .next_of(cand + rec.size_bytes, rec.segment_addr)
                .filter(|(_, n)| n.occupant == Occupant::Unmapped)?;
            let remaining = p.size_bytes - rec.size_bytes;
            cand = self.map_block(next, remaining.min(n.size_bytes), p.id)?;
        }
    }

    /// `find_expandable_block` over existing reservations: the lowest unmapped range of the
    /// request's stream and pool (started at the free block before it, if any) from which
    /// enough free and unmapped space runs on. `None` means a new reservation.
    fn find_expandable_block(&self, p: &Params) -> Option<Addr> {
        let pool = pool_index(p.small_pool);
        for &(stream, addr) in self.heap.unmapped_set(pool).range((p.stream, 0)..) {
            if stream != p.stream {
                break;
            }
            let Some(rec) = self.heap.block(addr) else {
                continue;
            };
            let start = match self.heap.prev_of(addr, rec.segment_addr) {
                Some((prev, r)) if !matches!(r.occupant, Occupant::Used { .. }) => prev,
                _ => addr,
            };
            if self.available_bytes_from(start, p.size_bytes) >= p.size_bytes {
                return Some(start);
            }
        }
        None
    }

    /// `has_available_address_space`: free and unmapped bytes from `addr` on, counted until
    /// `want_bytes` or an allocated block.
    fn available_bytes_from(&self, addr: Addr, want_bytes: u64) -> u64 {
        let mut bytes = 0u64;
        let mut cur = self.heap.block(addr).map(|r| (addr, r));
        while let Some((a, rec)) = cur {
            if bytes >= want_bytes || matches!(rec.occupant, Occupant::Used { .. }) {
                break;
            }
            bytes += rec.size_bytes;
            cur = self.heap.next_of(a + rec.size_bytes, rec.segment_addr);
        }
        bytes
    }

    /// Bytes [`Self::try_allocate_expandable_block`] maps to serve `want_bytes` from the run at
    /// `addr`: each unmapped range met gives `min(pages missing, range)`.
    fn map_plan_bytes(&self, addr: Addr, want_bytes: u64) -> Option<u64> {
        let mut have = 0u64;
        let mut mapped = 0u64;
        let mut cur = self.heap.block(addr).map(|r| (addr, r));
        while have < want_bytes {
            let (a, rec) = cur?;
            match rec.occupant {
                Occupant::Free => have += rec.size_bytes,
                Occupant::Unmapped => {
                    let page = page_bytes(rec.small_pool);
                    let pages = (want_bytes - have).checked_next_multiple_of(page)?;
                    let m = pages.min(rec.size_bytes);
                    have += m;
                    mapped += m;
                }
                Occupant::Used { .. } => return None,
            }
            cur = self.heap.next_of(a + rec.size_bytes, rec.segment_addr);
        }
        Some(mapped)
    }

    /// A new VA reservation for the request's stream and pool, all unmapped.
    fn create_reservation(&mut self, p: &Params) -> Option<Addr> {
        let page = page_bytes(p.small_pool);
        let mut size_bytes = self.reservation_bytes(p.small_pool);
        let addr = match self.script_reservation_base(p) {
            Some(base) => {
                // The trace's reservation may sit closer to a neighbour than a full one would.
                if let Some(next) = self.heap.next_segment_start(base) {
                    size_bytes = size_bytes.min((next - base) / page * page);
                }
                base
            }
            None => self
                .heap
                .lowest_fit(self.device_base_addr, size_bytes, SEGMENT_ALIGN_BYTES)?,
        };
        let seg = SegmentRec {
            size_bytes,
            stream: p.stream,
            small_pool: p.small_pool,
            expandable: true,
        };
        self.heap
            .create_segment(addr, seg, Occupant::Unmapped)
            .then_some(addr)
    }

    /// `map_block`: maps whole pages covering `size_bytes` at the start of the unmapped range
    /// at `addr`; the mapped part merges with free neighbours. Returns the merged block.
    pub(super) fn map_block(&mut self, addr: Addr, size_bytes: u64, id: u32) -> Option<Addr> {
        let rec = self.heap.block(addr)?;
        if rec.occupant != Occupant::Unmapped {
            return None;
        }
        let page = page_bytes(rec.small_pool);
        let mapped = size_bytes
            .checked_next_multiple_of(page)?
            .min(rec.size_bytes);
        self.heap.take(addr);
        self.heap.add(addr, rec.with(mapped, Occupant::Free));
        if mapped < rec.size_bytes {
            self.heap.add(
                addr + mapped,
                rec.with(rec.size_bytes - mapped, Occupant::Unmapped),
            );
        }
        self.heap.log(id, SegmentOpKind::Map, addr, mapped);
        self.note_policy_op(SegmentOpKind::Map, addr, mapped);
        Some(self.heap.coalesce(addr))
    }

    /// The whole pages inside a free expandable block, `[begin, end)`, if any.
    pub(super) fn unmappable_range(&self, addr: Addr, rec: &BlockRec) -> Option<(Addr, Addr)> {
        let page = page_bytes(rec.small_pool);
        let base = rec.segment_addr;
        let begin = (addr - base).checked_next_multiple_of(page)?;
        let end = (addr + rec.size_bytes - base) / page * page;
        (begin < end).then_some((base + begin, base + end))
    }

    /// `unmap_block`: unmaps the whole pages of the free block at `addr`; the slivers before
    /// and after stay free, the unmapped range merges with unmapped neighbours. Returns the
    /// merged unmapped block, `None` when there was no whole page.
    pub(super) fn unmap_block(&mut self, addr: Addr, id: u32) -> Option<Addr> {
        let rec = self.heap.block(addr)?;
        if rec.occupant != Occupant::Free || !rec.expandable {
            return None;
        }
        let (begin, end) = self.unmappable_range(addr, &rec)?;
        Some(self.unmap_range(addr, rec, begin, end, id))
    }

    /// Unmaps `[begin, end)` inside the free block `rec` at `addr` (page-aligned, checked by
    /// the caller).
    pub(super) fn unmap_range(
        &mut self,
        addr: Addr,
        rec: BlockRec,
        begin: Addr,
        end: Addr,
        id: u32,
    ) -> Addr {
        self.heap.take(addr);
        if begin > addr {
            self.heap.add(addr, rec.with(begin - addr, Occupant::Free));
        }
        let block_end = addr + rec.size_bytes;
        if end < block_end {
            self.heap
                .add(end, rec.with(block_end - end, Occupant::Free));
        }
        self.heap
            .add(begin, rec.with(end - begin, Occupant::Unmapped));
        self.heap.log(id, SegmentOpKind::Unmap, begin, end - begin);
        self.heap.coalesce(begin)
    }
}
