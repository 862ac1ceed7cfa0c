//! `glibc`: a footprint model of glibc 2.36's ptmalloc (main arena, one thread, x86-64).
//!
//! A request becomes a chunk of `max(32, (req + 8 + 15) & !15)` bytes. The heap is one
//! address-ordered run of chunks ending in the top chunk, grown by `sbrk` in whole pages by
//! `nb + top_pad + 32 - top` bytes (top pad 128 KiB) and trimmed back to `top_pad` when a free
//! of at least 64 KiB (after coalescing) leaves the top above the trim threshold. malloc looks,
//! in glibc's order, in the tcache (7 chunks per size class up to 1040-byte chunks, LIFO, never
//! coalesced while cached), the fastbins (chunks up to 128 B, LIFO, coalesced only by a
//! consolidation: a large request, a big free, or a top too small), then takes the best fitting
//! free chunk (smallest, lowest address; the high remainder stays free if >= 32 B), then the top,
//! and finally `sysmalloc`: an `mmap` of `ALIGN_UP(nb + 8, 4096)` bytes when `nb` reaches the mmap
//! threshold, else heap growth. Freeing an mmapped chunk larger than the threshold (up to 32 MiB)
//! raises the threshold to its size and the trim threshold to twice that. A free coalesces with
//! free neighbours and the top. The unsorted bin, the last-remainder rule and the smallbin-to-
//! tcache stash are not modelled: measured against the real glibc they move peaks by under 1.5%
//! (`reference/glibc-model.md`); this model's peaks are within one page of glibc 2.36's on the
//! shared traces (`tests/glibc_real.rs`).
//! Footprint = sbrk'd heap bytes + mmapped bytes (mallinfo2's arena + hblkhd). Addresses are chunk
//! starts (glibc returns `addr + 16`); mmapped chunks live far above the heap. O(log n) per call.

use std::any::Any;
use std::collections::BTreeMap;

use super::Policy;
use super::broken::Broken;
use super::config::{PolicyConfig, RegistryError};
use crate::heap::{Addr, AllocError, Block, BlockState, Counters, FreeError, Placement, Request};
use crate::trace::NO_ALLOC_ID;

mod check;
#[cfg(test)]
mod tests;
mod views;

/// `MINSIZE`: the smallest chunk.
pub const MIN_CHUNK_BYTES: u64 = 32;
/// `MALLOC_ALIGNMENT`.
pub const ALIGN_BYTES: u64 = 16;
/// Page size used for sbrk, trim and mmap rounding.
pub const PAGE_BYTES: u64 = 4096;
/// `DEFAULT_MMAP_THRESHOLD_MIN`, `DEFAULT_TRIM_THRESHOLD`, `DEFAULT_TOP_PAD`.
pub const DEFAULT_THRESHOLD_BYTES: u64 = 128 << 10;
/// `DEFAULT_MMAP_THRESHOLD_MAX` on 64-bit: the dynamic threshold never goes above it.
pub const MMAP_THRESHOLD_MAX_BYTES: u64 = 32 << 20;
/// `TCACHE_MAX_BINS`: tcache size classes cover chunks of 32..=1040 bytes.
pub const TCACHE_BINS: usize = 64;
/// `TCACHE_FILL_COUNT`.
pub const TCACHE_FILL_COUNT: usize = 7;
/// Default `global_max_fast`: chunks up to this size go to fastbins.
pub const MAX_FAST_BYTES: u64 = 128;
/// `FASTBIN_CONSOLIDATION_THRESHOLD`: a free that yields a chunk this big consolidates and may
/// trim.
pub const CONSOLIDATION_THRESHOLD_BYTES: u64 = 64 << 10;
/// `sizeof(tcache_perthread_struct)`, malloc'ed from the heap on the first call.
const TCACHE_STRUCT_BYTES: u64 = 640;
/// `MIN_LARGE_SIZE`: requests of chunks this big are large-bin requests, which consolidate the
/// fastbins first.
const MIN_LARGE_BYTES: u64 = 1024;
const NUM_FASTBINS: usize = 7;
/// `DEFAULT_MMAP_MAX`: at most this many live mappings.
const MMAP_MAX: usize = 65536;
const NONE: u32 = u32::MAX;

/// glibc's `request2size`: `max(32, (req + 8 + 15) & !15)`, saturating for absurd sizes.
#[must_use]
pub fn chunk_size(req_bytes: u64) -> u64 {
    let padded = req_bytes.saturating_add(8 + ALIGN_BYTES - 1) & !(ALIGN_BYTES - 1);
    padded.max(MIN_CHUNK_BYTES)
}

/// Bytes an mmapped chunk occupies: `ALIGN_UP(chunk + 8, 4096)`.
#[must_use]
pub fn mmapped_bytes(chunk_bytes: u64) -> u64 {
    align_up(chunk_bytes.saturating_add(8), PAGE_BYTES)
}

fn align_up(n: u64, to: u64) -> u64 {
    n.checked_next_multiple_of(to)
        .unwrap_or(u64::MAX - (to - 1))
}

/// tcache index of a chunk size, if it has one.
fn tcache_index(chunk_bytes: u64) -> Option<usize> {
    let idx = usize::try_from((chunk_bytes - MIN_CHUNK_BYTES) / ALIGN_BYTES).ok()?;
    (idx < TCACHE_BINS).then_some(idx)
}

/// Fastbin index of a chunk size, if it is fast.
fn fastbin_index(chunk_bytes: u64) -> Option<usize> {
    (chunk_bytes <= MAX_FAST_BYTES)
        .then(|| usize::try_from((chunk_bytes - MIN_CHUNK_BYTES) / ALIGN_BYTES).ok())
        .flatten()
}

/// Construction options (glibc's tunables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlibcOptions {
    /// Initial `mmap_threshold`.
    pub mmap_threshold_bytes: u64,
    /// Initial `trim_threshold`.
    pub trim_threshold_bytes: u64,
    /// `top_pad`: slack added to every sbrk and kept by every trim.
    pub top_pad_bytes: u64,
    /// Apply glibc's dynamic mmap threshold rule (off when a program calls `mallopt`).
    pub dynamic_threshold: bool,
    /// Chunks cached per tcache size class (0 disables the tcache).
    pub tcache_count: usize,
    /// Model the fastbins.
    pub fastbins: bool,
    /// Fail (out of memory) rather than let heap + mmapped bytes exceed this.
    pub limit_bytes: Option<u64>,
    /// Where the heap starts (page-aligned).
    pub heap_base: Addr,
    /// Where mmapped chunks are placed (first fit upward; page-aligned, far above the heap).
    pub mmap_base: Addr,
}

impl Default for GlibcOptions {
    fn default() -> Self {
        Self {
            mmap_threshold_bytes: DEFAULT_THRESHOLD_BYTES,
            trim_threshold_bytes: DEFAULT_THRESHOLD_BYTES,
            top_pad_bytes: DEFAULT_THRESHOLD_BYTES,
            dynamic_threshold: true,
            tcache_count: TCACHE_FILL_COUNT,
            fastbins: true,
            limit_bytes: None,
            heap_base: 0,
            mmap_base: 1 << 44,
        }
    }
}

/// Where a heap chunk is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Used,
    /// Cached in the tcache: still "in use" for coalescing.
    Tcache,
    /// In a fastbin: still "in use" for coalescing until consolidated.
    Fast,
    /// In the best-fit free set.
    Free,
    /// The tcache's own struct.
    Meta,
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    addr: Addr,
    size_bytes: u64,
    requested_bytes: u64,
    request_id: u32,
    state: State,
    prev: u32,
    next: u32,
}

/// What `_int_malloc` produced.
enum Got {
    Heap(u32),
    Mapped(Addr),
}

#[derive(Clone, Copy, Debug)]
struct Mapped {
    size_bytes: u64,
    requested_bytes: u64,
    request_id: u32,
}

/// An internal structure is inconsistent (a bug, never a user error).
fn broken(what: &'static str) -> Broken {
    Broken {
        model: "glibc model",
        what,
    }
}

/// Chunk handle by address (the multiplicative hasher shared by the policies).
type AddrMap = crate::policy::fit_common::AddrMap<u32>;

fn free_key(size_bytes: u64, addr: Addr) -> u128 {
    (u128::from(size_bytes) << 64) | u128::from(addr)
}

/// The tunables that move during a run, and the totals glibc reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlibcStats {
    /// Current `mmap_threshold`.
    pub mmap_threshold_bytes: u64,
    /// Current `trim_threshold`.
    pub trim_threshold_bytes: u64,
    /// sbrk'd heap bytes (mallinfo2 `arena`).
    pub heap_bytes: u64,
    /// mmapped chunk bytes (mallinfo2 `hblkhd`).
    pub mmapped_bytes: u64,
    /// Live mmapped chunks (mallinfo2 `hblks`).
    pub mmapped_chunks: u64,
    /// Size of the top chunk.
    pub top_bytes: u64,
    /// Chunks held by the tcache and the fastbins.
    pub cached_chunks: u64,
}

/// The ptmalloc model. See the module header.
#[derive(Clone, Debug)]
pub struct Glibc {
    opts: GlibcOptions,
    mmap_threshold: u64,
    trim_threshold: u64,
    chunks: Vec<Chunk>,
    unused_head: u32,
    /// Heap chunk just below the top (`NONE` when the heap holds only the top).
    last: u32,
    top_addr: Addr,
    top_bytes: u64,
    heap_bytes: u64,
    tcache_ready: bool,
    tcache: Vec<Vec<u32>>,
    /// Bit i set when tcache bin i is non-empty.
    tcache_mask: u64,
    fastbins: Vec<Vec<u32>>,
    /// Bit i set when fastbin i is non-empty.
    fast_mask: u8,
    free_by_size: BTreeMap<u128, u32>,
    live_heap: AddrMap,
    mapped: BTreeMap<Addr, Mapped>,
    mmapped_bytes: u64,
    live_bytes: u64,
    allocated_bytes: u64,
    cached_bytes: u64,
    cached_chunks: u64,
}

impl Default for Glibc {
    fn default() -> Self {
        Self::new(GlibcOptions::default())
    }
}

impl Glibc {
    /// An empty process heap with glibc's default state.
    #[must_use]
    pub fn new(opts: GlibcOptions) -> Self {
        Self {
            opts,
            mmap_threshold: opts.mmap_threshold_bytes,
            trim_threshold: opts.trim_threshold_bytes,
            chunks: Vec::new(),
            unused_head: NONE,
            last: NONE,
            top_addr: opts.heap_base,
            top_bytes: 0,
            heap_bytes: 0,
            tcache_ready: false,
            tcache: vec![Vec::new(); TCACHE_BINS],
            tcache_mask: 0,
            fastbins: vec![Vec::new(); NUM_FASTBINS],
            fast_mask: 0,
            free_by_size: BTreeMap::new(),
            live_heap: AddrMap::default(),
            mapped: BTreeMap::new(),
            mmapped_bytes: 0,
            live_bytes: 0,
            allocated_bytes: 0,
            cached_bytes: 0,
            cached_chunks: 0,
        }
    }

    /// The model the registry builds: default glibc state, the configured initial mmap
    /// threshold and limit.
    ///
    /// # Errors
    /// When the mmap threshold is 0. (Alignments above 16 B are refused per request, as
    /// [`AllocError::Unsupported`].)
    pub fn from_config(config: &PolicyConfig) -> Result<Self, RegistryError> {
        if config.glibc_mmap_threshold_bytes == 0 {
            return Err(RegistryError::InvalidConfig {
                name: "glibc".into(),
                reason: "mmap threshold must be positive".into(),
            });
        }
        Ok(Self::new(GlibcOptions {
            mmap_threshold_bytes: config.glibc_mmap_threshold_bytes,
            limit_bytes: config.limit_bytes,
            ..GlibcOptions::default()
        }))
    }

    /// The options this model was built with.
    #[must_use]
    pub fn options(&self) -> &GlibcOptions {
        &self.opts
    }

    /// Current thresholds and totals.
    #[must_use]
    pub fn stats(&self) -> GlibcStats {
        GlibcStats {
            mmap_threshold_bytes: self.mmap_threshold,
            trim_threshold_bytes: self.trim_threshold,
            heap_bytes: self.heap_bytes,
            mmapped_bytes: self.mmapped_bytes,
            mmapped_chunks: self.mapped.len() as u64,
            top_bytes: self.top_bytes,
            cached_chunks: self.cached_chunks,
        }
    }

    /// `malloc(req_bytes)` tagged with trace id `request_id`: (chunk address, reserved bytes).
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] when the limit refuses heap growth and mmap.
    pub fn malloc(&mut self, req_bytes: u64, request_id: u32) -> Result<Placement, AllocError> {
        if self.tcache_ready {
            return self.malloc_inner(req_bytes, request_id);
        }
        // glibc sets up its tcache on the first malloc even when the request itself then
        // fails. The model undoes that set-up when the first request fails, so that a failed
        // allocation changes nothing (the promise every policy keeps); the set-up then happens
        // at the first malloc that succeeds.
        let before = self.clone();
        let r = self.malloc_inner(req_bytes, request_id);
        if r.is_err() {
            *self = before;
        }
        r
    }

    fn malloc_inner(&mut self, req_bytes: u64, request_id: u32) -> Result<Placement, AllocError> {
        if req_bytes > super::MAX_REQUEST_BYTES {
            // glibc fails such a request with ENOMEM before touching its arena.
            return Err(self.out_of_memory(req_bytes));
        }
        let nb = chunk_size(req_bytes);
        if !self.tcache_ready {
            self.tcache_ready = true;
            // The struct is far below any sane mmap threshold; never map it.
            if let Got::Heap(h) = self.int_malloc(chunk_size(TCACHE_STRUCT_BYTES), false)? {
                self.chunk_mut(h)?.state = State::Meta;
            }
        }
        if let Some(idx) = tcache_index(nb)
            && let Some(h) = self.tcache.get_mut(idx).and_then(Vec::pop)
        {
            if self.tcache.get(idx).is_some_and(Vec::is_empty) {
                self.tcache_mask &= !(1u64 << idx);
            }
            self.uncache(nb);
            return self.hand_out(h, req_bytes, request_id);
        }
        let got = self.int_malloc(nb, true).map_err(|e| match e {
            AllocError::OutOfMemory {
                largest_free_bytes,
                footprint_bytes,
                limit_bytes,
                ..
            } => AllocError::OutOfMemory {
                requested_bytes: req_bytes,
                largest_free_bytes,
                footprint_bytes,
                limit_bytes,
            },
            other => other,
        })?;
        match got {
            Got::Heap(h) => self.hand_out(h, req_bytes, request_id),
            Got::Mapped(addr) => {
                let m = self
                    .mapped
                    .get_mut(&addr)
                    .ok_or(broken("mapping vanished"))?;
                m.requested_bytes = req_bytes;
                m.request_id = request_id;
                let size = m.size_bytes;
                self.live_bytes += req_bytes;
                self.allocated_bytes += size;
                Ok(Placement {
                    addr,
                    reserved_bytes: size,
                })
            }
        }
    }

    /// `free` of the chunk at `addr`.
    ///
    /// # Errors
    /// [`FreeError::UnknownAddr`] when no live allocation starts there.
    pub fn free_chunk(&mut self, addr: Addr) -> Result<(), FreeError> {
        let unknown = FreeError::UnknownAddr(addr);
        if let Some(m) = self.mapped.remove(&addr) {
            if self.opts.dynamic_threshold
                && m.size_bytes > self.mmap_threshold
                && m.size_bytes <= MMAP_THRESHOLD_MAX_BYTES
            {
                self.mmap_threshold = m.size_bytes;
                self.trim_threshold = 2 * m.size_bytes;
            }
            self.mmapped_bytes -= m.size_bytes;
            self.live_bytes -= m.requested_bytes;
            self.allocated_bytes -= m.size_bytes;
            return Ok(());
        }
        let h = self.live_heap.remove(&addr).ok_or(unknown.clone())?;
        let c = self.chunk_mut(h).map_err(|_| unknown.clone())?;
        let size = c.size_bytes;
        let requested = c.requested_bytes;
        c.requested_bytes = 0;
        c.request_id = NO_ALLOC_ID;
        self.live_bytes -= requested;
        self.allocated_bytes -= size;
        if let Some(idx) = tcache_index(size)
            && let Some(bin) = self.tcache.get_mut(idx)
            && bin.len() < self.opts.tcache_count
        {
            bin.push(h);
            self.tcache_mask |= 1u64 << idx;
            self.cache(h, State::Tcache, size).map_err(|_| unknown)?;
            return Ok(());
        }
        if self.opts.fastbins
            && let Some(idx) = fastbin_index(size)
            && let Some(bin) = self.fastbins.get_mut(idx)
        {
            bin.push(h);
            self.fast_mask |= 1 << idx;
            self.cache(h, State::Fast, size).map_err(|_| unknown)?;
            return Ok(());
        }
        let merged = self.merge_free(h).map_err(|_| unknown.clone())?;
        if merged >= CONSOLIDATION_THRESHOLD_BYTES {
            self.consolidate().map_err(|_| unknown)?;
            if self.top_bytes >= self.trim_threshold {
                self.trim();
            }
        }
        Ok(())
    }

    fn chunk(&self, h: u32) -> Result<&Chunk, Broken> {
        self.chunks
            .get(h as usize)
            .ok_or(broken("bad chunk handle"))
    }

    fn chunk_mut(&mut self, h: u32) -> Result<&mut Chunk, Broken> {
        self.chunks
            .get_mut(h as usize)
            .ok_or(broken("bad chunk handle"))
    }

    fn cache(&mut self, h: u32, state: State, size: u64) -> Result<(), Broken> {
        self.chunk_mut(h)?.state = state;
        self.cached_bytes += size;
        self.cached_chunks += 1;
        Ok(())
    }

    fn uncache(&mut self, size: u64) {
        self.cached_bytes -= size;
        self.cached_chunks -= 1;
    }

    fn hand_out(
        &mut self,
        h: u32,
        req_bytes: u64,
        request_id: u32,
    ) -> Result<Placement, AllocError> {
        let c = self.chunk_mut(h)?;
        c.state = State::Used;
        c.requested_bytes = req_bytes;
        c.request_id = request_id;
        let (addr, size) = (c.addr, c.size_bytes);
        self.live_heap.insert(addr, h);
        self.live_bytes += req_bytes;
        self.allocated_bytes += size;
        Ok(Placement {
            addr,
            reserved_bytes: size,
        })
    }

    fn new_handle(&mut self, chunk: Chunk) -> u32 {
        if let Some(slot) = self.chunks.get_mut(self.unused_head as usize) {
            let h = self.unused_head;
            self.unused_head = slot.next;
            *slot = chunk;
            h
        } else {
            let h = u32::try_from(self.chunks.len()).unwrap_or(NONE - 1);
            self.chunks.push(chunk);
            h
        }
    }

    fn delete_handle(&mut self, h: u32) {
        let head = self.unused_head;
        if let Some(c) = self.chunks.get_mut(h as usize) {
            c.next = head;
            c.prev = NONE;
            c.state = State::Free;
            c.size_bytes = 0;
            self.unused_head = h;
        }
    }

    /// `_int_malloc`: fastbins, best fit, top, then sysmalloc (mmap when `nb` reaches the
    /// threshold and `may_map`, else heap growth).
    fn int_malloc(&mut self, nb: u64, may_map: bool) -> Result<Got, AllocError> {
        if self.opts.fastbins
            && let Some(idx) = fastbin_index(nb)
            && let Some(h) = self.fast_pop(idx)
        {
            self.uncache(nb);
            self.stash_fastbin(idx, nb)?;
            return Ok(Got::Heap(h));
        }
        if nb >= MIN_LARGE_BYTES {
            self.consolidate()?;
        }
        loop {
            if let Some((&key, &h)) = self.free_by_size.range(free_key(nb, 0)..).next() {
                self.free_by_size.remove(&key);
                self.carve(h, nb)?;
                return Ok(Got::Heap(h));
            }
            if self.top_bytes >= nb + MIN_CHUNK_BYTES {
                return Ok(Got::Heap(self.take_from_top(nb)));
            }
            if self.fast_mask == 0 {
                break;
            }
            self.consolidate()?;
        }
        if may_map
            && nb >= self.mmap_threshold
            && self.mapped.len() < MMAP_MAX
            && let Some(addr) = self.map(nb)
        {
            return Ok(Got::Mapped(addr));
        }
        self.grow_heap(nb)?;
        Ok(Got::Heap(self.take_from_top(nb)))
    }

    /// After a fastbin hit, glibc moves the bin's other chunks into the tcache.
    fn stash_fastbin(&mut self, idx: usize, nb: u64) -> Result<(), Broken> {
        let Some(tidx) = tcache_index(nb) else {
            return Ok(());
        };
        loop {
            let room = self
                .tcache
                .get(tidx)
                .is_some_and(|t| t.len() < self.opts.tcache_count);
            let next = if room { self.fast_pop(idx) } else { None };
            let Some(h) = next else {
                return Ok(());
            };
            if let Some(t) = self.tcache.get_mut(tidx) {
                t.push(h);
            }
            self.tcache_mask |= 1u64 << tidx;
            self.chunk_mut(h)?.state = State::Tcache;
        }
    }

    /// Takes `nb` from the low end of free chunk `h` (already out of the free set); a remainder
    /// of at least `MINSIZE` stays free.
    fn carve(&mut self, h: u32, nb: u64) -> Result<(), Broken> {
        let c = *self.chunk(h)?;
        let rest_bytes = c.size_bytes - nb;
        if rest_bytes < MIN_CHUNK_BYTES {
            return Ok(());
        }
        let rest = Chunk {
            addr: c.addr + nb,
            size_bytes: rest_bytes,
            requested_bytes: 0,
            request_id: NO_ALLOC_ID,
            state: State::Free,
            prev: h,
            next: c.next,
        };
        let r = self.new_handle(rest);
        if let Some(n) = self.chunks.get_mut(c.next as usize) {
            n.prev = r;
        }
        if self.last == h {
            self.last = r;
        }
        let c = self.chunk_mut(h)?;
        c.next = r;
        c.size_bytes = nb;
        self.free_by_size.insert(free_key(rest_bytes, rest.addr), r);
        Ok(())
    }

    fn take_from_top(&mut self, nb: u64) -> u32 {
        let chunk = Chunk {
            addr: self.top_addr,
            size_bytes: nb,
            requested_bytes: 0,
            request_id: NO_ALLOC_ID,
            state: State::Used,
            prev: self.last,
            next: NONE,
        };
        let h = self.new_handle(chunk);
        if let Some(p) = self.chunks.get_mut(self.last as usize) {
            p.next = h;
        }
        self.last = h;
        self.top_addr += nb;
        self.top_bytes -= nb;
        h
    }

    fn over_limit(&self, extra_bytes: u64) -> bool {
        self.opts.limit_bytes.is_some_and(|l| {
            self.heap_bytes
                .saturating_add(self.mmapped_bytes)
                .saturating_add(extra_bytes)
                > l
        })
    }

    fn out_of_memory(&self, nb: u64) -> AllocError {
        AllocError::OutOfMemory {
            requested_bytes: nb,
            largest_free_bytes: self.largest_free(),
            footprint_bytes: self.heap_bytes + self.mmapped_bytes,
            limit_bytes: self.opts.limit_bytes,
        }
    }

    /// sysmalloc's mmap path: maps `nb` (the caller fills in the request).
    fn map(&mut self, nb: u64) -> Option<Addr> {
        let size = mmapped_bytes(nb);
        if self.over_limit(size) {
            return None;
        }
        // First fit among the gaps between live mappings.
        let mut addr = self.opts.mmap_base;
        for (&a, m) in &self.mapped {
            if a >= addr.saturating_add(size) {
                break;
            }
            addr = addr.max(a.saturating_add(m.size_bytes));
        }
        self.mapped.insert(
            addr,
            Mapped {
                size_bytes: size,
                requested_bytes: 0,
                request_id: NO_ALLOC_ID,
            },
        );
        self.mmapped_bytes += size;
        Some(addr)
    }

    /// sysmalloc's sbrk path: grow the top by whole pages to `nb + top_pad + MINSIZE`.
    fn grow_heap(&mut self, nb: u64) -> Result<(), AllocError> {
        let want = nb
            .saturating_add(self.opts.top_pad_bytes)
            .saturating_add(MIN_CHUNK_BYTES)
            .saturating_sub(self.top_bytes);
        let size = align_up(want, PAGE_BYTES);
        if self.over_limit(size) {
            return Err(self.out_of_memory(nb));
        }
        self.heap_bytes += size;
        self.top_bytes += size;
        Ok(())
    }

    /// Frees `h` into the heap proper: merge with a free previous chunk, then with the top or a
    /// free next chunk. Returns the size of the resulting chunk (the top's if it merged there).
    fn merge_free(&mut self, h: u32) -> Result<u64, Broken> {
        let mut h = h;
        let c = *self.chunk(h)?;
        let mut addr = c.addr;
        let mut size = c.size_bytes;
        if let Some(p) = self.chunks.get(c.prev as usize)
            && p.state == State::Free
        {
            let p = *p;
            self.free_by_size.remove(&free_key(p.size_bytes, p.addr));
            self.unlink_into_prev(c.prev, h)?;
            h = c.prev;
            addr = p.addr;
            size += p.size_bytes;
        }
        let c = *self.chunk(h)?;
        if c.next == NONE {
            self.last = c.prev;
            if let Some(p) = self.chunks.get_mut(c.prev as usize) {
                p.next = NONE;
            }
            self.delete_handle(h);
            self.top_addr = addr;
            self.top_bytes += size;
            return Ok(self.top_bytes);
        }
        if let Some(n) = self.chunks.get(c.next as usize)
            && n.state == State::Free
        {
            let n = *n;
            self.free_by_size.remove(&free_key(n.size_bytes, n.addr));
            self.unlink_into_prev(h, c.next)?;
            size += n.size_bytes;
        }
        let c = self.chunk_mut(h)?;
        c.state = State::Free;
        c.size_bytes = size;
        self.free_by_size.insert(free_key(size, addr), h);
        Ok(size)
    }

    /// Absorbs chunk `h2` into its left neighbour `h1`.
    fn unlink_into_prev(&mut self, h1: u32, h2: u32) -> Result<(), Broken> {
        let c2 = *self.chunk(h2)?;
        let c1 = self.chunk_mut(h1)?;
        c1.size_bytes += c2.size_bytes;
        c1.next = c2.next;
        if let Some(n) = self.chunks.get_mut(c2.next as usize) {
            n.prev = h1;
        }
        if self.last == h2 {
            self.last = h1;
        }
        self.delete_handle(h2);
        Ok(())
    }

    fn fast_pop(&mut self, idx: usize) -> Option<u32> {
        let bin = self.fastbins.get_mut(idx)?;
        let h = bin.pop()?;
        if bin.is_empty() {
            self.fast_mask &= !(1 << idx);
        }
        Some(h)
    }

    /// `malloc_consolidate`: every fastbin chunk is freed into the heap proper, bins in index
    /// order, each from its most recent chunk.
    fn consolidate(&mut self) -> Result<(), Broken> {
        for idx in 0..NUM_FASTBINS {
            while let Some(h) = self.fast_pop(idx) {
                let size = self.chunk(h)?.size_bytes;
                self.uncache(size);
                self.merge_free(h)?;
            }
        }
        Ok(())
    }

    /// `systrim(top_pad)`: give whole pages of the top back, keeping `top_pad` (+ MINSIZE).
    fn trim(&mut self) {
        let top_area = self.top_bytes.saturating_sub(MIN_CHUNK_BYTES + 1);
        if top_area <= self.opts.top_pad_bytes {
            return;
        }
        let extra = (top_area - self.opts.top_pad_bytes) / PAGE_BYTES * PAGE_BYTES;
        self.top_bytes -= extra;
        self.heap_bytes -= extra;
    }
}

impl Policy for Glibc {
    fn name(&self) -> &'static str {
        "glibc"
    }

    /// Chunk addresses are 16-aligned (glibc's user pointer, `addr + 16`, too); stronger
    /// alignments would need memalign's extra chunk splitting, which is not modelled.
    fn alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
        if req.align_bytes > ALIGN_BYTES {
            return Err(AllocError::Unsupported(format!(
                "glibc model aligns to 16 B; {} B requested",
                req.align_bytes
            )));
        }
        self.malloc(req.size_bytes, req.id)
    }

    fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        self.free_chunk(addr)
    }

    fn counters(&self) -> Counters {
        self.counters_impl()
    }

    fn blocks(&self, out: &mut Vec<Block>) {
        self.blocks_impl(out);
    }

    fn state_bytes(&self) -> u64 {
        self.state_bytes_impl()
    }

    fn shrink_to_fit(&mut self) {
        self.live_heap.shrink_to_fit();
    }

    fn clone_box(&self) -> Box<dyn Policy> {
        // The address map's copy is sized to its entries (see `AddrMap`'s `Clone`), so a
        // checkpoint keeps only what the live entries need.
        Box::new(self.clone())
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.check()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
