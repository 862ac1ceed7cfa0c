//! The [`Policy`] trait and the registry that builds a policy from its name.
//!
//! A policy simulates an allocator over plain integer offsets: no real memory is touched. Each
//! policy lives in its own module whose `//!` header describes its algorithm.

use std::any::Any;
use std::fmt;

mod addr_map;
pub mod best_fit;
pub mod bfc;
pub mod buddy;
pub mod first_fit;
mod fit_common;
pub mod glibc;
pub mod oracle;
pub mod pool;
pub mod predictive;
pub mod pytorch;
pub mod registry;
pub mod spec;

/// Byte offset inside the simulated address space.
pub type Addr = u64;

/// One allocation request. `align_bytes` is a non-zero power of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Dense trace allocation id (static plans look their offset up by it).
    pub id: u32,
    pub size_bytes: u64,
    pub align_bytes: u64,
}

/// The largest request any policy serves: 2^48 bytes, an x86-64 address space (buddy's arena
/// is capped there too). Real allocators fail larger requests (glibc refuses anything past
/// `PTRDIFF_MAX`, and no kernel maps more), and a policy's rounding and headers on a request
/// near 2^64 would wrap: the replay fails such a request as out of memory without asking the
/// policy, and the policies that add to a request's size check it themselves.
pub const MAX_REQUEST_BYTES: u64 = 1 << 48;

/// About what a B-tree map spends per entry beyond the entry itself (its nodes are at least
/// half full): for the policies' [`Policy::state_bytes`].
pub(crate) const BTREE_ENTRY_OVERHEAD_BYTES: usize = 24;

/// `policy.alloc(req)`, except that a request past [`MAX_REQUEST_BYTES`] fails as out of
/// memory without reaching the policy: what every replay of a file's requests calls.
///
/// # Errors
/// The policy's, or out of memory for a request past the cap.
#[inline(always)]
pub fn alloc_capped<P: Policy + ?Sized>(
    policy: &mut P,
    req: Request,
) -> Result<Placement, AllocError> {
    if req.size_bytes > MAX_REQUEST_BYTES {
        let c = policy.counters();
        return Err(AllocError::OutOfMemory {
            requested_bytes: req.size_bytes,
            largest_free_bytes: c.largest_free_bytes,
            footprint_bytes: c.footprint_bytes,
            limit_bytes: None,
        });
    }
    policy.alloc(req)
}

/// Where a request was placed. `reserved_bytes >= size_bytes`: rounding, headers and padding
/// that the policy charges to this allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub addr: Addr,
    pub reserved_bytes: u64,
}

/// Why an allocation failed. Failures are data for allocview, not crashes: the replay records
/// them and goes on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error(
        "out of memory: requested {requested_bytes} B, largest free block {largest_free_bytes} B, \
         footprint {footprint_bytes} B of limit {limit_bytes:?}"
    )]
    OutOfMemory {
        requested_bytes: u64,
        largest_free_bytes: u64,
        footprint_bytes: u64,
        limit_bytes: Option<u64>,
    },
    #[error("policy cannot serve this request: {0}")]
    Unsupported(String),
}

/// Why a free failed (always a bug in the caller or the policy).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FreeError {
    #[error("free of unknown address {0:#x}")]
    UnknownAddr(Addr),
}

/// What occupies a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// Free space inside the footprint, reusable by later requests.
    Free,
    /// Space held by a live allocation (`requested_bytes` of the block's length were asked for;
    /// the rest is internal waste).
    Used { id: u32, requested_bytes: u64 },
    /// Space inside the footprint that is neither live nor reusable (e.g. the bump pool's dead
    /// bytes, allocator metadata).
    Dead,
}

/// One contiguous range of the simulated address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    pub addr: Addr,
    pub len_bytes: u64,
    pub state: BlockState,
}

impl Block {
    /// One past the last byte.
    #[must_use]
    pub fn end(&self) -> Addr {
        self.addr + self.len_bytes
    }
}

/// Running totals that every policy maintains incrementally.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Live allocations.
    pub live_allocs: u64,
    /// Sum of the requested sizes of live allocations.
    pub live_bytes: u64,
    /// Sum of the bytes the policy reserved for live allocations (after rounding/headers).
    pub allocated_bytes: u64,
    /// Bytes the policy holds from the system (regions, heap top, top-level blocks, plan size).
    pub footprint_bytes: u64,
    /// Bytes inside the footprint that are free and reusable.
    pub free_bytes: u64,
    /// Number of free blocks (holes).
    pub free_blocks: u64,
    /// Size of the largest free block.
    pub largest_free_bytes: u64,
}

impl Counters {
    /// Recomputes the counters from a block list (for invariant checks). `footprint_bytes` is
    /// taken as given, since only the policy knows what it holds from the system.
    #[must_use]
    pub fn from_blocks(blocks: &[Block], footprint_bytes: u64) -> Self {
        let mut c = Self {
            footprint_bytes,
            ..Self::default()
        };
        for b in blocks {
            match b.state {
                BlockState::Free => {
                    c.free_bytes += b.len_bytes;
                    c.free_blocks += 1;
                    c.largest_free_bytes = c.largest_free_bytes.max(b.len_bytes);
                }
                BlockState::Used {
                    requested_bytes, ..
                } => {
                    c.live_allocs += 1;
                    c.live_bytes += requested_bytes;
                    c.allocated_bytes += b.len_bytes;
                }
                BlockState::Dead => {}
            }
        }
        c
    }
}

/// An allocation strategy over a simulated address space.
///
/// Contract, checked for every policy by the conformance suite:
/// - ranges `[addr, addr + reserved_bytes)` of live allocations never overlap;
/// - `addr % align_bytes == 0`;
/// - every live range lies inside the footprint;
/// - `counters()` agrees with `blocks()`;
/// - the policy is deterministic: the same requests give the same placements.
pub trait Policy: Send + Sync {
    /// The registry name (`"first-fit"`, `"bfc"`, ...).
    fn name(&self) -> &'static str;
    /// Places a request.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] when the request cannot be served within the limit.
    fn alloc(&mut self, req: Request) -> Result<Placement, AllocError>;
    /// Frees the allocation that starts at `addr`.
    ///
    /// # Errors
    /// [`FreeError::UnknownAddr`] when no live allocation starts there.
    fn free(&mut self, addr: Addr) -> Result<(), FreeError>;
    /// Current totals, in O(1).
    fn counters(&self) -> Counters;
    /// Appends every block (used, free and dead) in address order to `out`.
    fn blocks(&self, out: &mut Vec<Block>);
    /// Appends the address ranges the policy holds from the system, in address order, and
    /// returns true, when its free space is exactly the gaps between live allocations inside
    /// them (every free block coalesced with its free neighbours, none shared between two
    /// ranges): then a block list can be rebuilt from the allocations alone
    /// ([`crate::layout`]). The default, false, is for policies whose free lists keep
    /// neighbours apart (glibc's fast bins) or that hold dead space. A buddy allocator's free
    /// blocks are not whole gaps, but follow from them ([`Self::gap_block_max_bytes`]).
    fn held_ranges(&self, out: &mut Vec<(Addr, u64)>) -> bool {
        let _ = out;
        false
    }
    /// A number that changes whenever [`Self::held_ranges`] may have changed.
    fn held_ranges_epoch(&self) -> u64 {
        0
    }
    /// True when the policy holds, from each address it appends to `bases` (ascending), one
    /// range up to the end of its highest live allocation below the next base, and its free
    /// space is exactly the gaps between live allocations there: heaps that tile `[base, top)`,
    /// coalesce every free block with its free neighbours and lower their top when the topmost
    /// block is freed (first-fit's and best-fit's from 0, `predictive`'s two arenas). Then a
    /// block list can be rebuilt from the allocations alone ([`crate::layout`]) without a record
    /// of the held ranges, which move at most events. [`Self::held_ranges`] stays false for
    /// such a policy.
    fn held_up_to_tops(&self, bases: &mut Vec<Addr>) -> bool {
        let _ = bases;
        false
    }
    /// How the free space between live allocations is cut into free blocks, for the layout
    /// index: `None` (the default), each gap is one block, as in a policy that coalesces every
    /// free block with its free neighbours; `Some(max)`, as a binary buddy allocator holds it,
    /// into the largest blocks of a power-of-two size aligned to their size (from address 0)
    /// and at most `max` bytes. With [`Self::held_ranges`] true, such a policy's block list
    /// then follows from its allocations too.
    fn gap_block_max_bytes(&self) -> Option<u64> {
        None
    }
    /// About how many bytes a copy of the policy takes, for the replay's checkpoint budget. The
    /// default charges 64 bytes per live allocation and per free block, plus 256; a policy
    /// whose state grows otherwise (buddy's bitmaps grow with the footprint) says so.
    fn state_bytes(&self) -> u64 {
        let c = self.counters();
        (c.live_allocs + c.free_blocks) * 64 + 256
    }
    /// A deep copy, for replay checkpoints.
    fn clone_box(&self) -> Box<dyn Policy>;
    /// Gives back the room the policy keeps for speed (its address map is sized for at most a
    /// quarter full, and never shrinks after the busiest moment): a replay kept for seeking
    /// calls it on its final state, which the explorers hold for good.
    fn shrink_to_fit(&mut self) {}
    /// Full self-check of the internal structures; slow, for tests.
    ///
    /// # Errors
    /// A description of the first broken invariant.
    fn check_invariants(&self) -> Result<(), String>;
    /// Downcasting hook, so a frontend can draw policy-specific views (BFC bins).
    fn as_any(&self) -> &dyn Any;
    /// The replay engine's loop over `span`. Not for overriding (an override would replay and
    /// measure nothing): the default is compiled for each policy type, which makes the
    /// policy's calls in the loop direct ones.
    #[doc(hidden)]
    fn replay_span(&mut self, meter: &mut crate::replay::Meter, span: &crate::replay::Span<'_>) {
        meter.replay_span(self, span);
    }
}

impl Clone for Box<dyn Policy> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl fmt::Debug for dyn Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name())
            .field("counters", &self.counters())
            .finish()
    }
}
