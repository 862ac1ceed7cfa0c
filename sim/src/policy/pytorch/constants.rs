//! The caching allocator's constants, named as PyTorch names them (`kMinBlockSize`, ...):
//! what the rounding rules, the pools, the segments and the settings' bounds are made of.

/// `kMinBlockSize`: every block size is a multiple of this.
pub const MIN_BLOCK_BYTES: u64 = 512;
/// `kSmallSize`: the largest request (after rounding) served from the small pool.
pub const SMALL_SIZE_BYTES: u64 = 1 << 20;
/// `kSmallBuffer`: the size of a small-pool segment, and an expandable small pool's page.
pub const SMALL_BUFFER_BYTES: u64 = 2 << 20;
/// `kLargeBuffer`: the segment size for requests under 10 MiB, and an expandable large pool's
/// page.
pub const LARGE_BUFFER_BYTES: u64 = 20 << 20;
/// `kMinLargeAlloc`: from here on, a new segment is the request rounded to 2 MiB.
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;
/// `kRoundLarge`: the rounding unit of large segments.
pub const ROUND_LARGE_BYTES: u64 = 2 << 20;
/// `kRoundUpPowerOfTwoIntervals`.
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;
