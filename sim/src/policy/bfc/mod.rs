//! `bfc`: TensorFlow's BFC ("best-fit with coalescing") allocator, tsl variant.
//!
//! Requests are rounded up to 256 bytes. Memory comes in regions (TF: one `cudaMalloc` each),
//! split into chunks that tile each region exactly; a free chunk lives in one of 21 bins, bin `b`
//! holding sizes in `[256 << b, 256 << (b + 1))` (bin 20: everything >= 256 MiB), each ordered by
//! (size, address). An allocation takes the smallest free chunk >= the rounded size (lowest
//! address on ties), searching from the request's bin upward, and splits off the high part as a
//! new free chunk when `chunk >= 2 * rounded` or `chunk - rounded >= 128 MiB` (tsl:
//! `fragmentation_fraction * limit` when that fraction is set). A free merges the chunk with its
//! next, then its previous neighbour, never across regions. When nothing fits, `Extend` adds a
//! region: with `allow_growth` it is sized by a target that starts at 2 MiB and doubles (or
//! doubles until the request fits, and then does not double again); without it, the first
//! region takes the whole limit. Optional garbage collection releases wholly free regions when
//! the limit would otherwise refuse a new one.
//!
//! Because every chunk of a higher bin is larger than every chunk of a lower one, the 21 bins
//! are kept as one index in (size, address) order (exact-size heaps under 1 MiB with a bitmap,
//! an ordered map above); [`Bfc::bins`] partitions it on demand. Alloc and free are O(log n) in
//! the number of free chunks of one size (amortized); chunk lookup by address is a hash.
//! Exact constants and rules: `reference/allocators.md` section 1.

use std::any::Any;
use std::collections::VecDeque;

use super::Policy;
use super::broken::Broken;
use super::config::{PolicyConfig, RegistryError};
use crate::heap::{Addr, AllocError, Block, BlockState, Counters, FreeError, Placement, Request};
use crate::trace::NO_ALLOC_ID;

mod check;
mod free_index;
mod from_state;
mod regions;
mod views;

pub use views::{BinsSink, bins_of};
#[cfg(test)]
mod tests;

use free_index::FreeIndex;

/// Number of bins (`kNumBins`).
pub const NUM_BINS: usize = 21;
/// Every chunk size is a multiple of this (`kMinAllocationSize`).
pub const MIN_ALLOCATION_BYTES: u64 = 256;
/// Split threshold on the leftover when no fragmentation fraction is set (core-2.x's
/// `kMaxInternalFragmentation`, tsl's fallback).
pub const DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES: u64 = 128 << 20;
/// Memory limit used when the caller gives none: 1 TiB, large enough never to bind on a trace
/// replay, small enough that region arithmetic cannot overflow.
pub const DEFAULT_LIMIT_BYTES: u64 = 1 << 40;
/// First region size target with `allow_growth` (capped by the limit).
pub const INITIAL_GROWTH_REGION_BYTES: u64 = 2 << 20;

const MIN_ALLOCATION_BITS: u32 = 8;
const NONE: u32 = u32::MAX;

/// TF's `RoundedBytes`: `n` rounded up to a multiple of 256. Saturates near `u64::MAX` (such a
/// request can never fit anyway).
#[must_use]
pub fn rounded_bytes(n: u64) -> u64 {
    n.checked_next_multiple_of(MIN_ALLOCATION_BYTES)
        .unwrap_or(u64::MAX - (MIN_ALLOCATION_BYTES - 1))
}

/// TF's `BinNumForSize`: `min(20, floor(log2(max(n, 256) >> 8)))`.
#[must_use]
pub fn bin_num_for_size(n: u64) -> usize {
    let v = n.max(MIN_ALLOCATION_BYTES) >> MIN_ALLOCATION_BITS;
    // v >= 1, so ilog2 is defined and at most 55.
    (v.ilog2() as usize).min(NUM_BINS - 1)
}

/// TF's `BinNumToSize`: the smallest chunk size of bin `bin` (`256 << bin`).
#[must_use]
pub fn bin_size_bytes(bin: usize) -> u64 {
    u32::try_from(bin)
        .ok()
        .and_then(|b| MIN_ALLOCATION_BYTES.checked_shl(b))
        .unwrap_or(0)
}

/// Construction options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BfcOptions {
    /// `memory_limit_` (TF's `total_memory`): regions never add up to more.
    pub limit_bytes: u64,
    /// Grow by doubling regions from 2 MiB (true) or take the whole limit at once (false).
    pub allow_growth: bool,
    /// Release wholly free regions when the limit blocks an `Extend` (TF's GPU garbage
    /// collection).
    pub garbage_collection: bool,
    /// tsl's `fragmentation_fraction`: when > 0, a chunk is also split when its leftover is at
    /// least `fraction * limit_bytes` bytes instead of 128 MiB.
    pub fragmentation_fraction: f64,
    /// Where the first region goes when the caller queues no base (later regions follow the
    /// highest region end so far).
    pub first_region_base: Addr,
}

impl Default for BfcOptions {
    fn default() -> Self {
        Self {
            limit_bytes: DEFAULT_LIMIT_BYTES,
            allow_growth: true,
            garbage_collection: false,
            fragmentation_fraction: 0.0,
            first_region_base: 0,
        }
    }
}

/// TF's `AllocatorStats` as BFC maintains them (`bytes_reserved`, `peak_bytes_reserved` and
/// `largest_free_block_bytes` are never written by tsl's BFC, so they are left out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BfcStats {
    /// Successful allocations since construction or the last [`Bfc::clear_stats`].
    pub num_allocs: u64,
    /// Sum of the CHUNK sizes of in-use chunks.
    pub bytes_in_use: u64,
    pub peak_bytes_in_use: u64,
    /// Largest chunk handed out.
    pub largest_alloc_size: u64,
    pub bytes_limit: u64,
}

/// One region (one sub-allocator grab).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    pub base: Addr,
    pub size_bytes: u64,
}

/// One chunk, as [`Bfc::chunks`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    pub addr: Addr,
    pub size_bytes: u64,
    pub in_use: bool,
    /// Bytes the client asked for (0 for a free chunk).
    pub requested_bytes: u64,
    /// TF's `allocation_id` (1, 2, ...), `None` when free.
    pub allocation_id: Option<u64>,
    /// Trace id of the request that holds the chunk ([`NO_ALLOC_ID`] when free or unknown).
    pub request_id: u32,
    /// `BinNumForSize(size)`: the bin a free chunk is in, and the bin TF's dump counts any chunk
    /// under.
    pub bin: usize,
    /// Index into [`Bfc::regions`].
    pub region: usize,
    /// TF's chunk handle (index into its `chunks_` vector; deleted handles are reused LIFO, as
    /// TF does). The dump's `next <h>` refers to these.
    pub handle: u32,
    /// Handle of the next chunk in the region, `None` for the last (TF prints `-1` as
    /// `18446744073709551615`).
    pub next_handle: Option<u32>,
}

/// One bin, as [`Bfc::bins`] reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BinInfo {
    /// `256 << bin`.
    pub bin_size_bytes: u64,
    /// The bin's free chunks `(addr, size_bytes)` in search order (size, then address).
    pub free_chunks: Vec<(Addr, u64)>,
    /// TF's `get_bin_debug_info`, which buckets ALL chunks (free and in use) by
    /// `BinNumForSize(chunk size)`.
    pub total_chunks: u64,
    pub chunks_in_use: u64,
    pub total_bytes: u64,
    pub bytes_in_use: u64,
    pub requested_bytes_in_use: u64,
}

/// One live chunk for [`Bfc::from_state`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveChunk {
    pub addr: Addr,
    /// Chunk size (a multiple of 256).
    pub size_bytes: u64,
    /// What the client asked for (`<= size_bytes`).
    pub requested_bytes: u64,
    /// TF's allocation id of the chunk.
    pub allocation_id: u64,
    /// Trace id the replay will free it by ([`NO_ALLOC_ID`] if the trace does not know it).
    pub request_id: u32,
}

/// A successful [`Bfc::allocate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BfcAllocation {
    pub addr: Addr,
    pub chunk_bytes: u64,
    pub allocation_id: u64,
}

/// Why [`Bfc::from_state`] refused its input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BfcStateError {
    #[error(
        "region {index} at {base:#x} of {size_bytes} B is empty, not a multiple of 256 B or overflows"
    )]
    BadRegion {
        index: usize,
        base: Addr,
        size_bytes: u64,
    },
    #[error("regions at {first:#x} and {second:#x} overlap")]
    RegionsOverlap { first: Addr, second: Addr },
    #[error(
        "chunk at {addr:#x} of {size_bytes} B (requested {requested_bytes} B) is empty, \
         not a multiple of 256 B or smaller than its request"
    )]
    BadChunk {
        addr: Addr,
        size_bytes: u64,
        requested_bytes: u64,
    },
    #[error("chunk at {addr:#x} of {size_bytes} B lies outside every region or off its 256 B grid")]
    ChunkOutsideRegions { addr: Addr, size_bytes: u64 },
    #[error("chunks at {first:#x} and {second:#x} overlap")]
    ChunksOverlap { first: Addr, second: Addr },
    #[error("stats say {stats_bytes} B in use, the live chunks hold {chunk_bytes} B")]
    BytesInUseMismatch { stats_bytes: u64, chunk_bytes: u64 },
    #[error("regions hold {region_bytes} B, more than the limit of {limit_bytes} B")]
    OverLimit { region_bytes: u64, limit_bytes: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    addr: Addr,
    size_bytes: u64,
    requested_bytes: u64,
    /// 0 when free (TF: -1).
    allocation_id: u64,
    request_id: u32,
    prev: u32,
    next: u32,
}

impl Chunk {
    fn in_use(&self) -> bool {
        self.allocation_id != 0
    }
}

#[derive(Clone, Copy, Debug)]
struct Region {
    base: Addr,
    size_bytes: u64,
    /// Handle of the region's first chunk. It never changes: merges only ever delete the
    /// right-hand chunk, and the first chunk has no left neighbour.
    first: u32,
}

/// An internal structure is inconsistent (a bug, never a user error).
fn broken(what: &'static str) -> Broken {
    Broken { model: "bfc", what }
}

/// Chunk handle by address (the multiplicative hasher shared by the policies).
type AddrMap = crate::policy::fit_common::AddrMap<u32>;

/// TensorFlow's BFC allocator over simulated addresses. See the module header.
#[derive(Clone, Debug)]
pub struct Bfc {
    opts: BfcOptions,
    max_internal_fragmentation_bytes: u64,
    /// TF's `chunks_`: handles index it; deleted chunks form a LIFO list through `next`.
    chunks: Vec<Chunk>,
    unused_head: u32,
    /// Every free chunk, searchable in (size, addr) order: the 21 bins.
    free: FreeIndex,
    in_use_by_addr: AddrMap,
    /// Sorted by base.
    regions: Vec<Region>,
    pending_region_bases: VecDeque<Addr>,
    next_default_base: Addr,
    /// Largest power of two (at most 256) dividing every region base: the alignment BFC can
    /// promise, since chunk offsets are multiples of 256.
    base_align_bytes: u64,
    curr_region_allocation_bytes: u64,
    total_region_allocated_bytes: u64,
    next_allocation_id: u64,
    stats: BfcStats,
    live_bytes: u64,
    /// Regions added or released so far (the layout index's epoch of the held ranges).
    region_changes: u64,
}

impl Default for Bfc {
    fn default() -> Self {
        Self::new(BfcOptions::default())
    }
}

impl Bfc {
    /// An empty allocator (no region yet).
    #[must_use]
    pub fn new(opts: BfcOptions) -> Self {
        let limit = opts.limit_bytes;
        let curr = if opts.allow_growth {
            rounded_bytes(limit.min(INITIAL_GROWTH_REGION_BYTES))
        } else {
            rounded_bytes(limit)
        };
        let max_frag = if opts.fragmentation_fraction > 0.0 {
            // TF multiplies in double and truncates into an int64.
            (opts.fragmentation_fraction * limit as f64) as u64
        } else {
            DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES
        };
        Self {
            opts,
            max_internal_fragmentation_bytes: max_frag,
            chunks: Vec::new(),
            unused_head: NONE,
            free: FreeIndex::default(),
            in_use_by_addr: AddrMap::default(),
            regions: Vec::new(),
            pending_region_bases: VecDeque::new(),
            next_default_base: opts.first_region_base,
            base_align_bytes: MIN_ALLOCATION_BYTES,
            curr_region_allocation_bytes: curr,
            total_region_allocated_bytes: 0,
            next_allocation_id: 1,
            stats: BfcStats {
                bytes_limit: limit,
                ..BfcStats::default()
            },
            live_bytes: 0,
            region_changes: 0,
        }
    }

    /// The allocator the registry builds: limit (default [`DEFAULT_LIMIT_BYTES`]), growth and
    /// garbage collection from `config`. Without growth the first region is the whole limit, so
    /// pair `bfc_allow_growth = false` with a limit, or the footprint is 1 TiB. Alignments beyond
    /// the chunk grid are refused per request (as [`AllocError::Unsupported`]), not here.
    ///
    /// # Errors
    /// None today; the signature matches the other policies' constructors.
    pub fn from_config(config: &PolicyConfig) -> Result<Self, RegistryError> {
        Ok(Self::new(BfcOptions {
            limit_bytes: config.limit_bytes.unwrap_or(DEFAULT_LIMIT_BYTES),
            allow_growth: config.bfc_allow_growth,
            garbage_collection: config.bfc_garbage_collection,
            ..BfcOptions::default()
        }))
    }

    /// The options this allocator was built with.
    #[must_use]
    pub fn options(&self) -> &BfcOptions {
        &self.opts
    }

    /// The split threshold on a chunk's leftover in effect.
    #[must_use]
    pub fn max_internal_fragmentation_bytes(&self) -> u64 {
        self.max_internal_fragmentation_bytes
    }

    /// TF's split rule: would a free chunk of `chunk_bytes` chosen for a request rounded to
    /// `rounded_bytes` be split (true) or handed out whole? (Replays of logs that give only the
    /// requested bytes use it to infer chunk sizes.)
    #[must_use]
    pub fn splits(&self, chunk_bytes: u64, rounded_bytes: u64) -> bool {
        chunk_bytes / 2 >= rounded_bytes
            || chunk_bytes.saturating_sub(rounded_bytes) >= self.max_internal_fragmentation_bytes
    }

    /// The next region base is `addr` (for replays at TensorFlow's own addresses). Replaces
    /// any queued bases; later regions follow the highest region end again.
    pub fn set_next_region_base(&mut self, addr: Addr) {
        self.pending_region_bases.clear();
        self.pending_region_bases.push_back(addr);
    }

    /// Appends bases for the next regions, consumed one per `Extend` in order.
    pub fn queue_region_bases(&mut self, bases: impl IntoIterator<Item = Addr>) {
        self.pending_region_bases.extend(bases);
    }

    /// Size target of the next region (`curr_region_allocation_bytes_`).
    #[must_use]
    pub fn curr_region_allocation_bytes(&self) -> u64 {
        self.curr_region_allocation_bytes
    }

    /// Sum of region sizes (`total_region_allocated_bytes_`).
    #[must_use]
    pub fn total_region_allocated_bytes(&self) -> u64 {
        self.total_region_allocated_bytes
    }

    /// TF's `AllocatorStats`.
    #[must_use]
    pub fn stats(&self) -> BfcStats {
        self.stats
    }

    /// TF's `ClearStats`: resets the allocation count and the largest allocation, and sets the
    /// peak to the current use.
    pub fn clear_stats(&mut self) {
        self.stats.num_allocs = 0;
        self.stats.peak_bytes_in_use = self.stats.bytes_in_use;
        self.stats.largest_alloc_size = 0;
    }

    /// The id the next allocation will get.
    #[must_use]
    pub fn next_allocation_id(&self) -> u64 {
        self.next_allocation_id
    }

    /// TF's `AllocateRaw(num_bytes)`, tagging the chunk with trace id `request_id`.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] when no chunk fits and the limit refuses a region;
    /// [`AllocError::Unsupported`] for a zero-byte request (TF returns null) or a queued region
    /// base that overlaps an existing region.
    pub fn allocate(
        &mut self,
        num_bytes: u64,
        request_id: u32,
    ) -> Result<BfcAllocation, AllocError> {
        if num_bytes == 0 {
            return Err(AllocError::Unsupported(
                "zero-byte request (BFC returns null)".into(),
            ));
        }
        let rounded = rounded_bytes(num_bytes);
        if let Some(a) = self.find_chunk(rounded, num_bytes, request_id)? {
            return Ok(a);
        }
        if self.extend(rounded)?
            && let Some(a) = self.find_chunk(rounded, num_bytes, request_id)?
        {
            return Ok(a);
        }
        if self.deallocate_free_regions(rounded)?
            && self.extend(rounded)?
            && let Some(a) = self.find_chunk(rounded, num_bytes, request_id)?
        {
            return Ok(a);
        }
        Err(AllocError::OutOfMemory {
            requested_bytes: num_bytes,
            largest_free_bytes: self.largest_free_chunk_bytes(),
            footprint_bytes: self.total_region_allocated_bytes,
            limit_bytes: Some(self.opts.limit_bytes),
        })
    }

    /// TF's `DeallocateRaw`: frees the in-use chunk at `addr` and coalesces it with its free
    /// neighbours. Returns the freed chunk's size.
    ///
    /// # Errors
    /// [`FreeError::UnknownAddr`] when no in-use chunk starts at `addr`.
    pub fn deallocate(&mut self, addr: Addr) -> Result<u64, FreeError> {
        let unknown = FreeError::UnknownAddr(addr);
        let h = self.in_use_by_addr.remove(&addr).ok_or(unknown.clone())?;
        let c = self.chunks.get_mut(h as usize).ok_or(unknown.clone())?;
        let size = c.size_bytes;
        self.stats.bytes_in_use -= size;
        self.live_bytes -= c.requested_bytes;
        c.allocation_id = 0;
        c.requested_bytes = 0;
        c.request_id = NO_ALLOC_ID;
        let (prev, next) = (c.prev, c.next);
        let mut h = h;
        if let Some(n) = self.chunks.get(next as usize)
            && !n.in_use()
        {
            self.free.remove(n.size_bytes, n.addr);
            self.merge(h, next).map_err(|_| unknown.clone())?;
        }
        if let Some(p) = self.chunks.get(prev as usize)
            && !p.in_use()
        {
            self.free.remove(p.size_bytes, p.addr);
            self.merge(prev, h).map_err(|_| unknown.clone())?;
            h = prev;
        }
        let c = self.chunks.get(h as usize).ok_or(unknown)?;
        let (size, addr) = (c.size_bytes, c.addr);
        self.free.insert(&self.chunks, size, addr, h);
        Ok(size)
    }

    /// Links `chunk` after `*prev` (from_state builds regions left to right).
    fn append_chunk(&mut self, chunk: Chunk, prev: &mut u32, first: &mut u32) -> u32 {
        let h = self.new_handle(chunk);
        if let Some(p) = self.chunks.get_mut(*prev as usize) {
            p.next = h;
        }
        if *first == NONE {
            *first = h;
        }
        *prev = h;
        h
    }

    fn note_base(&mut self, base: Addr) {
        let align = 1u64 << base.trailing_zeros().min(MIN_ALLOCATION_BITS);
        self.base_align_bytes = self.base_align_bytes.min(align);
    }

    fn new_handle(&mut self, chunk: Chunk) -> u32 {
        if let Some(slot) = self.chunks.get_mut(self.unused_head as usize) {
            let h = self.unused_head;
            self.unused_head = slot.next;
            *slot = chunk;
            h
        } else {
            // More than 4 billion chunks cannot be simulated in memory anyway.
            let h = u32::try_from(self.chunks.len()).unwrap_or(NONE - 1);
            self.chunks.push(chunk);
            h
        }
    }

    fn delete_handle(&mut self, h: u32) {
        let head = self.unused_head;
        if let Some(c) = self.chunks.get_mut(h as usize) {
            *c = free_chunk(0, 0, NONE);
            c.next = head;
            self.unused_head = h;
        }
    }

    /// `Merge(h1, h2)`: `h2` (the right neighbour) is absorbed into `h1`.
    fn merge(&mut self, h1: u32, h2: u32) -> Result<(), Broken> {
        let c2 = *self
            .chunks
            .get(h2 as usize)
            .ok_or(broken("merge: bad handle"))?;
        let c1 = self
            .chunks
            .get_mut(h1 as usize)
            .ok_or(broken("merge: bad handle"))?;
        c1.next = c2.next;
        c1.size_bytes += c2.size_bytes;
        if let Some(n) = self.chunks.get_mut(c2.next as usize) {
            n.prev = h1;
        }
        self.delete_handle(h2);
        Ok(())
    }

    /// `FindChunkPtr`: smallest free chunk >= `rounded`, lowest address on ties; split it when
    /// the rule says so; mark the low part in use.
    fn find_chunk(
        &mut self,
        rounded: u64,
        num_bytes: u64,
        request_id: u32,
    ) -> Result<Option<BfcAllocation>, Broken> {
        let Some((size, _, h)) = self.free.take_best_fit(&self.chunks, rounded) else {
            return Ok(None);
        };
        if self.splits(size, rounded) {
            self.split(h, rounded)?;
        }
        let id = self.next_allocation_id;
        self.next_allocation_id += 1;
        let c = self
            .chunks
            .get_mut(h as usize)
            .ok_or(broken("find_chunk: bad handle"))?;
        c.requested_bytes = num_bytes;
        c.allocation_id = id;
        c.request_id = request_id;
        let (addr, chunk_bytes) = (c.addr, c.size_bytes);
        self.in_use_by_addr.insert(addr, h);
        self.live_bytes += num_bytes;
        let s = &mut self.stats;
        s.num_allocs += 1;
        s.bytes_in_use += chunk_bytes;
        s.peak_bytes_in_use = s.peak_bytes_in_use.max(s.bytes_in_use);
        s.largest_alloc_size = s.largest_alloc_size.max(chunk_bytes);
        Ok(Some(BfcAllocation {
            addr,
            chunk_bytes,
            allocation_id: id,
        }))
    }

    /// `SplitChunk(h, num_bytes)`: the high part becomes a new free chunk, binned without
    /// coalescing (its right neighbour cannot be free).
    fn split(&mut self, h: u32, num_bytes: u64) -> Result<(), Broken> {
        let c = *self
            .chunks
            .get(h as usize)
            .ok_or(broken("split: bad handle"))?;
        let rest = Chunk {
            addr: c.addr + num_bytes,
            size_bytes: c.size_bytes - num_bytes,
            requested_bytes: 0,
            allocation_id: 0,
            request_id: NO_ALLOC_ID,
            prev: h,
            next: c.next,
        };
        let h2 = self.new_handle(rest);
        if let Some(n) = self.chunks.get_mut(c.next as usize) {
            n.prev = h2;
        }
        let c = self
            .chunks
            .get_mut(h as usize)
            .ok_or(broken("split: bad handle"))?;
        c.next = h2;
        c.size_bytes = num_bytes;
        self.free
            .insert(&self.chunks, rest.size_bytes, rest.addr, h2);
        Ok(())
    }

    fn counters_impl(&self) -> Counters {
        let footprint = self.total_region_allocated_bytes;
        Counters {
            live_allocs: self.in_use_by_addr.len() as u64,
            live_bytes: self.live_bytes,
            allocated_bytes: self.stats.bytes_in_use,
            footprint_bytes: footprint,
            free_bytes: footprint - self.stats.bytes_in_use,
            free_blocks: self.free.len() as u64,
            largest_free_bytes: self.largest_free_chunk_bytes(),
        }
    }
}

fn free_chunk(addr: Addr, size_bytes: u64, prev: u32) -> Chunk {
    Chunk {
        addr,
        size_bytes,
        requested_bytes: 0,
        allocation_id: 0,
        request_id: NO_ALLOC_ID,
        prev,
        next: NONE,
    }
}

impl Policy for Bfc {
    fn name(&self) -> &'static str {
        "bfc"
    }

    /// BFC ignores the requested alignment, as TF does; chunks sit at multiples of 256 from
    /// their region base, so any alignment up to the bases' own is honoured and larger ones are
    /// refused.
    fn alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
        if req.align_bytes > self.base_align_bytes {
            return Err(AllocError::Unsupported(format!(
                "bfc places chunks on a {} B grid; {} B alignment requested",
                self.base_align_bytes, req.align_bytes
            )));
        }
        let a = self.allocate(req.size_bytes, req.id)?;
        Ok(Placement {
            addr: a.addr,
            reserved_bytes: a.chunk_bytes,
        })
    }

    fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        self.deallocate(addr).map(|_| ())
    }

    fn counters(&self) -> Counters {
        self.counters_impl()
    }

    fn blocks(&self, out: &mut Vec<Block>) {
        self.blocks_impl(out);
    }

    fn held_ranges(&self, out: &mut Vec<(Addr, u64)>) -> bool {
        // Freed chunks merge with their free neighbours within a region and never across
        // regions, so the free chunks are exactly the gaps between in-use chunks inside the
        // regions: what the layout index needs to rebuild the chunk list at any event.
        out.extend(self.regions.iter().map(|r| (r.base, r.size_bytes)));
        true
    }

    fn held_ranges_epoch(&self) -> u64 {
        self.region_changes
    }

    fn state_bytes(&self) -> u64 {
        // What `clone_box` copies: the chunk table (deleted chunks included: TF never shrinks
        // it), the regions, the free index with its 4,096 exact-size buckets, and the address
        // map shrunk to its entries. The default (64 bytes a block) left out the chunk table
        // and the buckets, which a copy holds whatever the number of blocks.
        let bytes = self.chunks.len() * std::mem::size_of::<Chunk>()
            + self.regions.len() * std::mem::size_of::<Region>()
            + self.pending_region_bases.len() * std::mem::size_of::<Addr>()
            + self.free.copy_bytes()
            + self.in_use_by_addr.shrunk_bytes()
            + std::mem::size_of::<Self>();
        bytes as u64
    }

    fn shrink_to_fit(&mut self) {
        self.in_use_by_addr.shrink_to_fit();
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
