//! `first-fit`: address-ordered first fit with immediate coalescing.
//!
//! A request takes the free block with the LOWEST ADDRESS among those large enough; it is
//! carved from the block's low end and the remainder stays free. With no such block the request
//! is placed at the heap top, which grows. Freeing coalesces with both physical neighbours
//! (boundary tags, O(1)) and a freed block that reaches the heap top lowers it. Sizes are
//! rounded up to `align_bytes` (default 16); a zero-byte request reserves one alignment unit.
//! See `fit_common` for the heap layout shared with `best-fit`.
//!
//! Finding the lowest fitting address without scanning the free list: free blocks are kept in
//! address order in chunks of at most 32 (parallel sorted arrays, `fit_common::AddrChunks`),
//! and an implicit binary max-tree over the chunks holds each chunk's largest block. A search
//! descends the tree to the leftmost chunk holding a large enough block (O(log n)), then takes
//! the chunk's first such block (a vectorised scan of at most 32 lengths). Insertions and
//! removals find the chunk by a binary search on the chunks' first addresses (or through the
//! chunk the block was last seen in) and shift at most 32 entries; a block whose address
//! changes without passing another free block is updated in place. A full chunk splits and a
//! nearly empty one merges into a neighbour, and only then is the max-tree rebuilt, a pass over
//! the chunk maxima (n/32 words) at most once every dozen updates of a chunk: amortised, a
//! small fraction of a word per block per update. The arrays keep the hot data contiguous; on
//! the real traces this ran 1.3 (python) to 1.7 (git) times faster than the balanced tree (a
//! treap) it replaced, and with a million free blocks an operation still takes under 0.2 µs.
//! The used blocks sit in a hash map (O(1)).

use crate::policy::config::PolicyConfig;
use crate::policy::fit_common::{AddrChunks, FitHeap, FitIndex, FitPolicy};

/// Address-ordered first fit (see the module docs).
pub type FirstFit = FitPolicy<AddrChunks>;

impl FitIndex for AddrChunks {
    const POLICY_NAME: &'static str = "first-fit";
}

impl FirstFit {
    /// A first-fit heap honouring `config.align_bytes` and `config.limit_bytes`.
    ///
    /// # Errors
    /// When `align_bytes` is not a power of two.
    pub fn new(config: &PolicyConfig) -> Result<Self, String> {
        Ok(Self {
            heap: FitHeap::new(config, AddrChunks::default())?,
        })
    }
}
