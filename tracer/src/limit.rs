//! `allocview record --limit`, `--fail-nth`, `--fail-rate`: allocations made to fail, as under
//! `ulimit -v` but counted in the program's own live heap bytes, so a run is repeatable.
//!
//! Read once at start-up from `ALLOCVIEW_LIMIT` (bytes), `ALLOCVIEW_FAIL_NTH` (the 1-based
//! number of the allocation call to fail), `ALLOCVIEW_FAIL_RATE_PPB` (the probability of each
//! call failing, in parts per billion) and `ALLOCVIEW_FAIL_SEED`. Without any of them nothing
//! here runs beyond one relaxed load per call.
//!
//! - Live heap bytes are the sum of `malloc_usable_size` of the blocks allocated through the
//!   tracer since start-up and not yet freed (a free of an older block subtracts too; the sum
//!   is clamped at 0 when compared).
//! - A call fails when its request would take the live bytes past the limit (`live + request
//!   > limit`; for `realloc`, `live − old block + request`), when it is the Nth allocation
//!   call, or when a hash of its call number and the seed falls under the rate (the same calls
//!   fail on every run of a deterministic program). It returns NULL with `errno = ENOMEM`
//!   (`posix_memalign` returns `ENOMEM`), and the tracer records it as a failed allocation, with
//!   its call stack when stacks are captured. `realloc(p, 0)` never fails.
//! - Threads race: two threads may both pass the check before either adds its block, so a
//!   multi-threaded program can pass the limit by its concurrent requests.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

unsafe extern "C" {
    fn malloc_usable_size(p: *mut c_void) -> usize;
    fn __errno_location() -> *mut c_int;
}

const ENOMEM: c_int = 12;

static ACTIVE: AtomicBool = AtomicBool::new(false);
static LIMIT_BYTES: AtomicU64 = AtomicU64::new(u64::MAX);
static FAIL_NTH: AtomicU64 = AtomicU64::new(0);
/// Rate as a threshold on a 64-bit hash (0 = never).
static FAIL_THRESHOLD: AtomicU64 = AtomicU64::new(0);
static SEED: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

/// A decimal environment variable, read without allocating; `None` when unset or not a number.
fn env_u64(name: &std::ffi::CStr) -> Option<u64> {
    // SAFETY: getenv does not allocate; the result is NUL-terminated or null.
    let v: *const c_char = unsafe { super::getenv(name.as_ptr()) };
    if v.is_null() {
        return None;
    }
    // SAFETY: as above.
    let bytes = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit()
            .then(|| acc.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// Reads the settings (at tracer start-up, single-threaded).
pub(crate) fn init() {
    let limit = env_u64(c"ALLOCVIEW_LIMIT");
    let nth = env_u64(c"ALLOCVIEW_FAIL_NTH");
    let ppb = env_u64(c"ALLOCVIEW_FAIL_RATE_PPB").map(|p| p.min(1_000_000_000));
    if let Some(l) = limit {
        LIMIT_BYTES.store(l, Ordering::Relaxed);
    }
    if let Some(n) = nth {
        FAIL_NTH.store(n, Ordering::Relaxed);
    }
    if let Some(p) = ppb {
        let threshold = u128::from(p) * (u128::from(u64::MAX) + 1) / 1_000_000_000;
        FAIL_THRESHOLD.store(
            u64::try_from(threshold).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
    SEED.store(
        env_u64(c"ALLOCVIEW_FAIL_SEED").unwrap_or(0),
        Ordering::Relaxed,
    );
    ACTIVE.store(
        limit.is_some() || nth.is_some() || ppb.is_some_and(|p| p > 0),
        Ordering::Release,
    );
}

#[inline(always)]
fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// splitmix64: a well-mixed hash of the call number and the seed.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether an allocation call of `request_bytes` (releasing `released_bytes` if it succeeds,
/// for realloc) must fail.
#[inline(always)]
pub(crate) fn refuse(request_bytes: usize, released_bytes: usize) -> bool {
    active() && refuse_slow(request_bytes as u64, released_bytes as u64)
}

#[inline(never)]
fn refuse_slow(request_bytes: u64, released_bytes: u64) -> bool {
    let call = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
    if FAIL_NTH.load(Ordering::Relaxed) == call {
        return true;
    }
    let threshold = FAIL_THRESHOLD.load(Ordering::Relaxed);
    if threshold > 0 && mix(call ^ mix(SEED.load(Ordering::Relaxed))) < threshold {
        return true;
    }
    let live = u64::try_from(LIVE_BYTES.load(Ordering::Relaxed)).unwrap_or(0);
    live.saturating_sub(released_bytes)
        .saturating_add(request_bytes)
        > LIMIT_BYTES.load(Ordering::Relaxed)
}

/// The result of a refused call: NULL with `errno = ENOMEM`.
pub(crate) fn fail() -> *mut c_void {
    // SAFETY: errno is this thread's.
    unsafe { *__errno_location() = ENOMEM };
    std::ptr::null_mut()
}

/// `ENOMEM`, for `posix_memalign`.
pub(crate) const ENOMEM_CODE: c_int = ENOMEM;

/// The usable size of a live block (0 for NULL or when nothing is counted).
#[inline(always)]
pub(crate) fn usable(p: *mut c_void) -> usize {
    if !active() || p.is_null() {
        return 0;
    }
    // SAFETY: `p` is a live block of the real allocator.
    unsafe { malloc_usable_size(p) }
}

/// A block was handed out.
#[inline(always)]
pub(crate) fn allocated(p: *mut c_void) {
    let n = usable(p);
    if n > 0 {
        LIVE_BYTES.fetch_add(n as i64, Ordering::Relaxed);
    }
}

/// A block is about to be freed (before the real call, while its size can be read).
#[inline(always)]
pub(crate) fn freeing(p: *mut c_void) {
    released(usable(p));
}

/// `bytes` of a block went back (a free, or realloc's old block).
#[inline(always)]
pub(crate) fn released(bytes: usize) {
    if bytes > 0 {
        LIVE_BYTES.fetch_sub(bytes as i64, Ordering::Relaxed);
    }
}
