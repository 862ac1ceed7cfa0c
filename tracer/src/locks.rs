//! Spin-then-yield locks, held only around a write.

use super::*;

// ---- locks (spin then yield; held only around a write) ----

pub(crate) fn lock(l: &AtomicUsize) {
    let me = self_id();
    let mut spins = 0u32;
    while l
        .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            // SAFETY: plain syscall wrapper.
            unsafe { sched_yield() };
        }
    }
}

/// Longest wait for a lock in a signal handler.
pub(crate) const HANDLER_LOCK_WAIT_NS: i64 = 200_000_000;

/// Takes `l` in a signal handler: waits (a bounded time) while another thread holds it, and
/// gives up at once when the interrupted code of this very thread holds it.
pub(crate) fn lock_in_handler(l: &AtomicUsize) -> bool {
    let me = self_id();
    let mut deadline = None;
    loop {
        match l.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(holder) if holder == me => return false,
            Err(_) => {}
        }
        let now = clock_ns(CLOCK_MONOTONIC);
        let until = *deadline.get_or_insert(now + HANDLER_LOCK_WAIT_NS);
        if now > until {
            return false;
        }
        // SAFETY: plain syscall wrapper.
        unsafe { sched_yield() };
    }
}

pub(crate) fn unlock(l: &AtomicUsize) {
    l.store(0, Ordering::Release);
}

/// How a flush waits for the locks it needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    Block,
    /// In a signal handler: see [`lock_in_handler`].
    Handler,
}

pub(crate) fn take(l: &AtomicUsize, wait: Wait) -> bool {
    match wait {
        Wait::Block => {
            lock(l);
            true
        }
        Wait::Handler => lock_in_handler(l),
    }
}
