//! `pytorch`: PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`), rule for
//! rule (reference `pytorch.md` section 2; the citations there name the upstream functions).
//!
//! **Rounding.** A request of `s` bytes becomes `round_size(s)`: 512 below 512, else the next
//! multiple of 512, unless `roundup_power2_divisions` gives the size's interval
//! (`clamp(floor(log2 s) - 20, 0, 15)`) `d > 1` divisions and `s > 512 d`: then a power of two
//! stays and anything else goes up to the next of `d` equal steps of `[2^k, 2^(k+1))` (the next
//! power of two when the step is 0).
//!
//! **Pools and segments.** Rounded sizes up to 1 MiB use the small pool, the rest the large
//! pool; blocks never move between pools or streams. When no cached block serves a request,
//! a new segment (one cudaMalloc) of `get_allocation_size` is made: 2 MiB for the small pool,
//! 20 MiB below 10 MiB, else the size rounded up to 2 MiB. Here a segment goes at the lowest
//! 2 MiB-aligned free device address, from [`DEVICE_BASE_ADDR`].
//!
//! **Best fit.** Each pool keeps its free blocks ordered by `(stream, size, address)`; the
//! search takes the first block at or after `(stream, size, 0)` and fails when that block is of
//! another stream: the smallest block that fits, on the request's stream, lowest address on a
//! tie. With `max_split_size` set, a request under it fails rather than take a block of at
//! least `max_split_size`, and a request of at least it fails rather than take a block
//! `max_non_split_rounding` or more larger than itself: both then get a new segment.
//!
//! **Split, merge.** The request takes the block's low address. The rest becomes a free block
//! when it is at least 512 B in the small pool (or with expandable segments), and when it is
//! above 1 MiB and the request under `max_split_size` in the large pool; otherwise the block
//! keeps the slack. A free merges the block with a free previous and next neighbour of its own
//! segment (never across segments), and the result re-enters its pool.
//!
//! **Limit.** `PolicyConfig::limit_bytes` is PyTorch's `set_per_process_memory_fraction`: a
//! cudaMalloc that would take the reserved bytes past it fails. Then, in order: with a
//! `garbage_collection_threshold` (only under a limit) and reserved bytes above `threshold ×
//! limit`, unsplit large-pool blocks at least as old as the mean (age = `get_free_block` calls
//! on the pool since the block became free) are released, round after round, until the excess
//! is reclaimed; then cudaMalloc; then, with `max_split_size` set, one cached whole-segment
//! block of at least `max(request, max_split_size)` is released (or, lacking one, such blocks
//! from the largest down until as many bytes are freed) and cudaMalloc retried; then every
//! wholly free segment is released (large pool, then small) and cudaMalloc retried; then out of
//! memory. PyTorch keeps what it released on the way to an OOM; here a failed allocation
//! changes nothing, as the [`Policy`] contract asks: whether the last retry can pass the limit
//! is decided before anything is released (exactly for cudaMalloc segments), and the changes
//! of a request that fails all the same (expandable segments) are journaled and undone.
//!
//! **Expandable segments.** Each (stream, pool) reserves `1.125 ×` device memory of address
//! space and maps 2 MiB (small) or 20 MiB (large) pages into it on demand: a request no mapped
//! block serves extends the lowest run of free and unmapped space that can hold it, mapping
//! only the pages it lacks. Splits keep any remainder of 512 B or more; blocks merge only with
//! neighbours of the same mapped state; the best-fit search prefers, among fitting blocks, one
//! whose size plus the unmapped space after it is smallest. Releasing unmaps the whole pages of
//! free blocks (and drops a reservation once it is all unmapped). The footprint is the mapped
//! bytes; the device's memory is the limit, or [`DEFAULT_DEVICE_BYTES`] without one.
//!
//! **Script mode** (`PolicyConfig::pytorch_script`): a snapshot's replay from its rebuilt start
//! state (reference section 6). The start segments are all free; carried-in allocations are
//! placed at their recorded addresses, each keeping the slack up to the next one that the split
//! rule would not have cut off. For each traced allocation the trace's `segment_free`/`unmap`
//! before it are applied, the algorithm above chooses a block, a new segment takes the address
//! of the trace's `segment_alloc` (cudaMalloc addresses cannot be predicted), and the choice
//! is compared with the recorded address and the recorded segment decisions ([`Fidelity`]). On
//! a difference the replay goes on from the recorded placement. The limit is not applied: the
//! trace's own releases stand in for it.
//!
//! Alloc and free are O(log n) in the number of blocks; a cudaMalloc is O(segments) for the
//! lowest-fit address.

use std::any::Any;
use std::sync::Arc;

use super::Policy;
use super::config::PolicyConfig;
use crate::heap::{Addr, AllocError, Block, Counters, FreeError, Placement, Request};

pub mod constants;
mod expandable;
mod heap;
mod malloc;
pub mod rounding;
mod script;
pub(crate) mod settings;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_limits;
#[cfg(test)]
mod tests_script;

pub use rounding::{allocation_size, round_size, roundup_power2_next_division, should_split};

use constants::MIN_BLOCK_BYTES;
use heap::Heap;
pub use settings::{PytorchScript, PytorchSettings, ScriptSegment, SegmentOp, SegmentOpKind};

/// Lowest device address a generic-mode segment gets (a typical CUDA virtual address).
pub const DEVICE_BASE_ADDR: u64 = 0x7f00_0000_0000;
/// Device memory assumed without a limit, which sizes expandable segments' reservations: an
/// 80 GiB GPU.
pub const DEFAULT_DEVICE_BYTES: u64 = 80 << 30;
/// A segment larger than this is refused as out of memory (no device has 1 TiB), which keeps
/// the simulated address space from ever filling up.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 40;
/// Alignment of cudaMalloc addresses and VA reservations.
pub const SEGMENT_ALIGN_BYTES: u64 = 2 << 20;

/// Where a script-mode replay first parted from the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    pub alloc_id: u32,
    pub requested_bytes: u64,
    pub recorded_addr: u64,
    /// Where the algorithm put the allocation (`None` when it could not).
    pub policy_addr: Option<u64>,
    /// What differed and how the replay went on.
    pub what: String,
}

/// How closely a script-mode replay follows its trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fidelity {
    /// Traced (not carried-in) allocations compared.
    pub checked: u64,
    /// Of those, the ones the algorithm placed at the recorded address.
    pub address_matches: u64,
    /// Moments where the trace or the policy (or both) made a new segment.
    pub segment_allocs_checked: u64,
    /// The policy needed a new segment exactly where the trace has one, of the size the trace
    /// shows.
    pub segment_alloc_matches: u64,
    pub first_divergence: Option<Divergence>,
    /// Allocations at which anything differed (one per allocation, however many things).
    pub divergences: u64,
}

/// One cudaMalloc/cudaFree/map/unmap the policy did (so frontends can show segment_alloc/segment_free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentEvent {
    /// The request that caused it, `u32::MAX` for none.
    pub alloc_id: u32,
    pub op: SegmentOp,
}

/// The `pytorch` policy. See the module documentation for the algorithm.
#[derive(Clone, Debug)]
pub struct Pytorch {
    settings: PytorchSettings,
    /// `allowed_memory_maximum`, when set (`set_fraction`); never in script mode.
    limit_bytes: Option<u64>,
    /// Device memory: sizes VA reservations and bounds what expandable segments map.
    device_bytes: u64,
    /// Where lowest-fit placement of new segments starts.
    device_base_addr: u64,
    heap: Heap,
    script: Option<script::ScriptState>,
}

impl Pytorch {
    /// A caching allocator with `settings`, limited by `config.limit_bytes`, replaying
    /// `config.pytorch_script` when there is one.
    ///
    /// # Errors
    /// Invalid settings, or a script whose start segments overlap or whose expandable
    /// segments are not whole pages apart.
    pub fn new(settings: PytorchSettings, config: &PolicyConfig) -> Result<Self, String> {
        settings.validate()?;
        let mut policy = Self {
            settings,
            limit_bytes: config.limit_bytes,
            device_bytes: config.limit_bytes.unwrap_or(DEFAULT_DEVICE_BYTES),
            device_base_addr: DEVICE_BASE_ADDR,
            heap: Heap::default(),
            script: None,
        };
        if let Some(script) = &config.pytorch_script {
            policy.limit_bytes = None;
            policy.device_bytes = DEFAULT_DEVICE_BYTES;
            policy.start_script(Arc::clone(script))?;
        }
        Ok(policy)
    }

    /// Replay statistics; `Some` only in script mode.
    #[must_use]
    pub fn fidelity(&self) -> Option<&Fidelity> {
        self.script.as_ref().map(script::ScriptState::fidelity)
    }

    /// Every cudaMalloc, cudaFree, map and unmap so far, in order.
    #[must_use]
    pub fn segment_events(&self) -> &[SegmentEvent] {
        self.heap.events()
    }

    /// The options this policy runs with.
    #[must_use]
    pub fn settings(&self) -> &PytorchSettings {
        &self.settings
    }

    /// [`round_size`] under this policy's settings.
    #[must_use]
    pub fn round_size(&self, size_bytes: u64) -> u64 {
        round_size(size_bytes, &self.settings)
    }

    /// Segments in address order (for heap-map views): (addr, size, small_pool, stream,
    /// expandable). An expandable segment is listed once per mapped range, as snapshots do;
    /// [`Policy::blocks`] gives the blocks inside them.
    #[must_use]
    pub fn segments(&self) -> Vec<ScriptSegment> {
        self.heap.segment_list()
    }

    /// `torch.cuda.empty_cache()`: cudaFree every wholly free segment and unmap the whole
    /// free pages of expandable ones (events tagged `u32::MAX`).
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks(u32::MAX);
    }

    fn out_of_memory(&self, requested_bytes: u64) -> AllocError {
        let c = self.heap.counters();
        AllocError::OutOfMemory {
            requested_bytes,
            largest_free_bytes: c.largest_free_bytes,
            footprint_bytes: c.footprint_bytes,
            limit_bytes: self.limit_bytes,
        }
    }
}

impl Policy for Pytorch {
    fn name(&self) -> &'static str {
        "pytorch"
    }

    /// Blocks sit at multiples of 512 from 2 MiB-aligned segments, so any alignment up to
    /// 512 B holds; PyTorch has no way to ask for more.
    fn alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
        if req.align_bytes > MIN_BLOCK_BYTES {
            return Err(AllocError::Unsupported(format!(
                "the PyTorch caching allocator places blocks on a 512 B grid; {} B alignment \
                 requested",
                req.align_bytes
            )));
        }
        if req.size_bytes == 0 {
            return Err(AllocError::Unsupported(
                "PyTorch returns a null pointer for 0 bytes and allocates nothing".to_owned(),
            ));
        }
        if self.script.is_some() {
            return self.script_alloc(req);
        }
        let p = self
            .params(req.id, req.size_bytes, 0)
            .ok_or_else(|| self.out_of_memory(req.size_bytes))?;
        self.malloc(&p)
            .ok_or_else(|| self.out_of_memory(req.size_bytes))
    }

    fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        self.free_block(addr)
    }

    fn counters(&self) -> Counters {
        self.heap.counters()
    }

    fn blocks(&self, out: &mut Vec<Block>) {
        self.heap.append_blocks(out);
    }

    fn held_ranges(&self, out: &mut Vec<(Addr, u64)>) -> bool {
        // Free blocks merge with free neighbours of their segment and never across segments
        // or unmapped pages, so a segment (a mapped range of an expandable one) is a range.
        out.extend(
            self.heap
                .segment_list()
                .iter()
                .map(|s| (s.addr, s.size_bytes)),
        );
        true
    }

    fn held_ranges_epoch(&self) -> u64 {
        self.heap.segment_ops()
    }

    fn clone_box(&self) -> Box<dyn Policy> {
        Box::new(self.clone())
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.heap.check(expandable::page_bytes)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
