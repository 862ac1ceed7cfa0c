//! The [`Policy`] trait, the policies, and the [`registry`] that builds a policy from its name.
//!
//! A policy simulates an allocator over plain integer offsets: no real memory is touched. It
//! speaks the heap's words ([`crate::heap`]: requests, placements, blocks, counters). Each
//! policy lives in its own module whose `//!` header describes its algorithm.

use std::any::Any;
use std::fmt;

use crate::heap::{Addr, AllocError, Block, Counters, FreeError, Placement, Request};

mod addr_map;
pub mod best_fit;
pub mod bfc;
mod broken;
pub mod buddy;
pub mod config;
pub mod first_fit;
mod fit_common;
pub mod glibc;
pub mod oracle;
pub mod pool;
pub mod predictive;
pub mod pytorch;
pub mod registry;
pub mod spec;

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
