//! The words of a simulated heap: addresses ([`Addr`]), requests ([`Request`]) and where they
//! were placed ([`Placement`]), why an allocation or a free failed ([`AllocError`],
//! [`FreeError`]), blocks of the address space and their states ([`Block`], [`BlockState`]),
//! and the running totals every policy keeps ([`Counters`]).
//!
//! The policies ([`crate::policy`]) speak it, and so do those that drive or read them without
//! knowing any one: the replay engine ([`crate::replay`]), the layout index ([`crate::layout`]),
//! the [`crate::metrics`] and the [`crate::series`]. It names no policy and no part of the
//! engine, so every one of them can stand on it.

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
