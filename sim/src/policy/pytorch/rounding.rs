//! Sizes: request rounding, pool choice, new-segment sizes and the split rule (reference
//! sections 2.1, 2.2 and 2.4 step 7).
//!
//! Pure functions of a size and the settings, public so that a loader rebuilding a snapshot's
//! start state calls the same rules as the policy instead of restating them.

use super::constants::{
    LARGE_BUFFER_BYTES, MIN_BLOCK_BYTES, MIN_LARGE_ALLOC_BYTES, ROUND_LARGE_BYTES,
    ROUNDUP_POWER2_INTERVALS, SMALL_BUFFER_BYTES, SMALL_SIZE_BYTES,
};
use super::settings::PytorchSettings;

/// The largest multiple of 512: where rounding saturates (such a request never fits anyway).
const MAX_ROUNDED_BYTES: u64 = !(MIN_BLOCK_BYTES - 1);

/// Index of the power-of-two interval whose `roundup_power2_divisions` entry applies to
/// `size_bytes`: `clamp(floor(log2(size)) - 20, 0, 15)`, so interval 0 holds everything below
/// 2 MiB and interval 15 everything from 32 GiB on.
#[must_use]
pub fn division_interval(size_bytes: u64) -> usize {
    let log2 = size_bytes.max(1).ilog2() as usize;
    log2.saturating_sub(20).min(ROUNDUP_POWER2_INTERVALS - 1)
}

/// PyTorch's `roundup_power2_next_division`: a power of two stays; otherwise the interval
/// `[floor_pow2, 2 * floor_pow2)` is cut into `divisions` equal steps (a non-power-of-two count
/// acts as the power of two below it, 0 as 1) and the size goes up to the next step. When the
/// step would be 0 (more divisions than bytes), the next power of two.
#[must_use]
pub fn roundup_power2_next_division(size_bytes: u64, divisions: u32) -> u64 {
    if size_bytes == 0 || size_bytes.is_power_of_two() {
        return size_bytes;
    }
    let floor_pow2 = 1u64 << size_bytes.ilog2();
    let step = floor_pow2 >> divisions.max(1).ilog2();
    if step == 0 {
        return floor_pow2.saturating_mul(2);
    }
    let floor = size_bytes & !(step - 1);
    if floor == size_bytes {
        size_bytes
    } else {
        floor.saturating_add(step)
    }
}

/// PyTorch's `round_size`: below 512 B, 512 B; with more than one division for the size's
/// interval and a size above `512 * divisions`, [`roundup_power2_next_division`]; otherwise
/// the next multiple of 512.
#[must_use]
pub fn round_size(size_bytes: u64, settings: &PytorchSettings) -> u64 {
    if size_bytes < MIN_BLOCK_BYTES {
        return MIN_BLOCK_BYTES;
    }
    let divisions = settings
        .roundup_power2_divisions
        .get(division_interval(size_bytes))
        .copied()
        .unwrap_or(0);
    if divisions > 1 && size_bytes > MIN_BLOCK_BYTES * u64::from(divisions) {
        roundup_power2_next_division(size_bytes, divisions)
    } else {
        size_bytes
            .checked_next_multiple_of(MIN_BLOCK_BYTES)
            .unwrap_or(MAX_ROUNDED_BYTES)
    }
}

/// `get_pool`: a rounded size of at most 1 MiB goes to the small pool.
#[must_use]
pub fn is_small_pool(rounded_bytes: u64) -> bool {
    rounded_bytes <= SMALL_SIZE_BYTES
}

/// `get_allocation_size`: the size of the segment cudaMalloc'd for a rounded request that no
/// cached block serves: 2 MiB for the small pool, 20 MiB below 10 MiB, else the request
/// rounded up to 2 MiB.
#[must_use]
pub fn allocation_size(rounded_bytes: u64) -> u64 {
    if rounded_bytes <= SMALL_SIZE_BYTES {
        SMALL_BUFFER_BYTES
    } else if rounded_bytes < MIN_LARGE_ALLOC_BYTES {
        LARGE_BUFFER_BYTES
    } else {
        rounded_bytes
            .checked_next_multiple_of(ROUND_LARGE_BYTES)
            .unwrap_or(!(ROUND_LARGE_BYTES - 1))
    }
}

/// `should_split`: whether serving `rounded_bytes` from a free block of `block_bytes` leaves
/// the remainder as a free block of its own. Small pool (or expandable segments on): any
/// remainder of at least 512 B. Large pool: only for requests under `max_split_size` and a
/// remainder above 1 MiB, so a large block keeps up to 1 MiB of slack.
#[must_use]
pub fn should_split(
    block_bytes: u64,
    rounded_bytes: u64,
    small_pool: bool,
    settings: &PytorchSettings,
) -> bool {
    let remaining = block_bytes.saturating_sub(rounded_bytes);
    if small_pool || settings.expandable_segments {
        remaining >= MIN_BLOCK_BYTES
    } else {
        rounded_bytes < settings.max_split_size_bytes.unwrap_or(u64::MAX)
            && remaining > SMALL_SIZE_BYTES
    }
}
