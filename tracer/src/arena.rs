//! The bootstrap arena: allocations made by `dlsym` while the real functions are resolved.

use super::*;

// ---- bootstrap arena for dlsym's allocations ----

pub(crate) const ARENA_BYTES: usize = 64 << 10;

#[repr(C, align(64))]
pub(crate) struct Arena(std::cell::UnsafeCell<[u8; ARENA_BYTES]>);

// SAFETY: blocks are carved out with an atomic bump pointer, so no two callers share bytes.
unsafe impl Sync for Arena {}

pub(crate) static ARENA: Arena = Arena(std::cell::UnsafeCell::new([0; ARENA_BYTES]));
pub(crate) static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn arena_base() -> usize {
    ARENA.0.get() as usize
}

#[inline(always)]
pub(crate) fn in_arena(p: *mut c_void) -> bool {
    // One comparison: addresses below the arena wrap around to large differences.
    (p as usize).wrapping_sub(arena_base()) < ARENA_BYTES
}

/// Bump allocation with the block size stored in the 8 bytes before the block.
pub(crate) fn arena_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.clamp(16, 4096);
    let mut used = ARENA_USED.load(Ordering::Relaxed);
    loop {
        let start = (arena_base() + used + 8).next_multiple_of(align);
        let end = start.saturating_add(size);
        if end > arena_base() + ARENA_BYTES {
            return null_mut();
        }
        match ARENA_USED.compare_exchange_weak(
            used,
            end - arena_base(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                // SAFETY: [start - 8, end) lies inside the arena and now belongs to this call.
                unsafe { ((start - 8) as *mut u64).write_unaligned(size as u64) };
                return start as *mut c_void;
            }
            Err(now) => used = now,
        }
    }
}

/// Moves an arena block into memory from the real allocator.
pub(crate) unsafe fn arena_realloc(old: *mut c_void, size: usize) -> *mut c_void {
    let new = unsafe { malloc(size) };
    if !new.is_null() {
        // SAFETY: arena blocks are preceded by their size.
        let old_size = unsafe { ((old as usize - 8) as *const u64).read_unaligned() } as usize;
        unsafe { ptr::copy_nonoverlapping(old.cast::<u8>(), new.cast::<u8>(), old_size.min(size)) };
    }
    new
}
