//! Sampled stacks (`ALLOCVIEW_STACK_SAMPLE=<mean bytes>`, with stacks on, from
//! `allocview record --stack-sample SIZE`): every event is still recorded, but the stack is
//! walked only for the allocations a Poisson process over the bytes each thread allocates
//! picks, as tcmalloc and heapprofd sample. An unsampled allocation carries stack id 0.
//!
//! Each thread counts down the bytes left to its next sample point ([`ThreadState`]'s
//! `sample_left`); the gaps between points are drawn from an exponential distribution of mean
//! R (the variable's value). An allocation of `s` bytes is sampled when the point falls in its
//! bytes, which happens with probability `1 - exp(-s/R)`, independently of every other
//! allocation (the exponential has no memory): the reader weighs a sampled allocation by the
//! inverse of that probability for unbiased estimates per site (`loaders/src/analysis/`).
//! After a sample the next gap starts at the allocation's end. Gaps are whole bytes, the
//! exponential draw rounded up, which keeps the probability exact for whole sizes.
//!
//! An allocation of R bytes or more is always sampled, and left out of the count-down (the
//! Poisson process runs over the smaller allocations' bytes only, so their probability is
//! unchanged): the largest blocks, which the Poisson rule would miss now and then
//! (`exp(-s/R)`: one 4 MiB block in 3,000 at 512 KiB), always have their stack, and weigh 1.
//!
//! The hot path is a compare and a subtraction on the thread's state; a draw (a 64-bit PRNG
//! step and a logarithm, no allocation, no system call) happens once per sample.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::ThreadState;

/// The mean gap between sample points in bytes (0: every allocation's stack is walked).
static MEAN_BYTES: AtomicU64 = AtomicU64::new(0);
/// Distinguishes the threads' PRNG seeds.
static SEEDS: AtomicU64 = AtomicU64::new(0);

/// Reads `ALLOCVIEW_STACK_SAMPLE` (a decimal byte count); at initialisation, before any event.
pub(crate) fn init() {
    // SAFETY: getenv does not allocate; the result is NUL-terminated or null.
    let v = unsafe { crate::getenv(c"ALLOCVIEW_STACK_SAMPLE".as_ptr()) };
    if v.is_null() {
        return;
    }
    // SAFETY: as above.
    let text = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
    MEAN_BYTES.store(parse_decimal(text).unwrap_or(0), Ordering::Relaxed);
}

/// A decimal number of at most 18 digits (no sign, no units: `record` converts them).
fn parse_decimal(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 18 {
        return None;
    }
    text.iter().try_fold(0u64, |v, &c| {
        c.is_ascii_digit().then(|| v * 10 + u64::from(c - b'0'))
    })
}

/// Whether stacks are sampled.
#[inline(always)]
pub(crate) fn on() -> bool {
    MEAN_BYTES.load(Ordering::Relaxed) != 0
}

/// The mean gap between sample points, in bytes (0: off).
pub(crate) fn mean_bytes() -> u64 {
    MEAN_BYTES.load(Ordering::Relaxed)
}

/// Whether the allocation of `size` bytes that thread `t` is recording gets its stack walked
/// (sampling on).
#[inline(always)]
pub(crate) fn take(t: &ThreadState, size: usize) -> bool {
    let left = t.sample_left.get();
    let size = size as u64;
    if left > size && size < mean_bytes() {
        t.sample_left.set(left - size);
        return false;
    }
    take_slow(t, left, size)
}

/// A sample point falls in this allocation, it is of R bytes or more, or the thread has
/// drawn no gap yet (`left` 0).
#[cold]
#[inline(never)]
fn take_slow(t: &ThreadState, left: u64, size: u64) -> bool {
    let mean = mean_bytes().max(1);
    if size >= mean {
        return true;
    }
    if left == 0 {
        // The thread's first allocation: seed its generator, draw its first gap.
        let n = SEEDS.fetch_add(1, Ordering::Relaxed);
        let seed = (std::ptr::from_ref(t) as u64) ^ crate::now_word() ^ n.rotate_left(32);
        t.sample_rng.set(splitmix(seed) | 1);
        let gap = draw_gap(t, mean);
        if gap > size {
            t.sample_left.set(gap - size);
            return false;
        }
    }
    t.sample_left.set(draw_gap(t, mean));
    true
}

/// A gap of mean `mean` bytes: an exponential draw rounded up (at least 1).
fn draw_gap(t: &ThreadState, mean: u64) -> u64 {
    let x = xorshift(t.sample_rng.get());
    t.sample_rng.set(x);
    gap_from(x, mean)
}

/// The exponential gap that the random word `x` gives: `-mean * ln(u)`, `u` uniform in (0, 1].
fn gap_from(x: u64, mean: u64) -> u64 {
    let u = ((x >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
    let gap = (-(mean as f64) * u.ln()).ceil();
    // Far beyond any sum of sizes (u >= 2^-53 bounds it by 37 means).
    (gap as u64).max(1)
}

/// One step of xorshift64* (never 0 from a non-zero state).
fn xorshift(mut x: u64) -> u64 {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_decimal_byte_counts() {
        assert_eq!(parse_decimal(b"524288"), Some(524_288));
        assert_eq!(parse_decimal(b"512KiB"), None);
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"-1"), None);
    }

    /// An allocation of s bytes is sampled with probability 1 - exp(-s/R); from R bytes on,
    /// always, without moving the count-down.
    #[test]
    fn allocations_are_sampled_by_their_bytes() {
        MEAN_BYTES.store(512 << 10, Ordering::Relaxed);
        // SAFETY: the state is cells of integers and pointers; zeroed is a new thread's.
        let t: Box<ThreadState> = Box::new(unsafe { std::mem::zeroed() });
        let n = 200_000u32;
        let hits = (0..n).filter(|_| take(&t, 1024)).count() as f64;
        let p = 1.0 - (-1024f64 / f64::from(512u32 << 10)).exp();
        let (want, sd) = (f64::from(n) * p, (f64::from(n) * p * (1.0 - p)).sqrt());
        assert!(
            (hits - want).abs() < 5.0 * sd,
            "{hits} sampled, {want} expected"
        );
        let left = t.sample_left.get();
        assert!((0..100).all(|_| take(&t, 4 << 20)));
        assert_eq!(t.sample_left.get(), left);
        assert!(!take(&t, 0));
    }

    /// Gaps have the exponential's mean and its tail: P(gap > m) = exp(-m/mean).
    #[test]
    fn gaps_are_exponential() {
        let mean = 512 << 10;
        let n = 200_000u32;
        let mut x = 0x1234_5678_9abc_def1u64;
        let (mut sum, mut beyond) = (0f64, 0u32);
        for _ in 0..n {
            x = xorshift(x);
            let g = gap_from(x, mean);
            assert!(g >= 1);
            sum += g as f64;
            beyond += u32::from(g > mean);
        }
        let avg = sum / f64::from(n);
        // Standard error of the mean: mean / sqrt(n) (0.22%); 5 of them.
        assert!(
            (avg / mean as f64 - 1.0).abs() < 5.0 / f64::from(n).sqrt(),
            "{avg}"
        );
        let p = f64::from(beyond) / f64::from(n);
        let want = (-1f64).exp();
        let sd = (want * (1.0 - want) / f64::from(n)).sqrt();
        assert!((p - want).abs() < 5.0 * sd, "{p} vs {want}");
    }
}
