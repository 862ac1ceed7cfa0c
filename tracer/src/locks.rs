//! Spin-then-yield locks, held only around a write. Each records its holder (the holder's
//! [`self_id`]), so that a signal handler that interrupted the holder, and then enters the
//! tracer on the same thread (`_exit`, `exit`, `execve`, `fork`, or an allocation), never
//! waits for a lock its own thread holds: that wait would never end.

use super::*;

// ---- locks (spin then yield; held only around a write) ----

/// Takes `l`, waiting while another thread holds it. Returns false at once, without taking
/// it, when the calling thread already holds it (a signal handler interrupted the holder).
#[must_use]
pub(crate) fn lock(l: &AtomicUsize) -> bool {
    let me = self_id();
    let mut spins = 0u32;
    loop {
        match l.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(holder) if holder == me => return false,
            Err(_) => {}
        }
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

/// Whether the calling thread holds `l`.
pub(crate) fn held_here(l: &AtomicUsize) -> bool {
    l.load(Ordering::Relaxed) == self_id()
}

/// Whether the calling thread holds one of the tracer's buffer or file locks: then it runs in
/// a signal handler that interrupted the tracer while it wrote, and must not wait for locks
/// (another thread holding one may wait for the one this thread holds).
pub(crate) fn holds_a_lock() -> bool {
    if held_here(&WRITE_LOCK) {
        return true;
    }
    let mut p = BUFFERS.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: buffers are never unmapped.
        let b = unsafe { &*p };
        if held_here(&b.lock) {
            return true;
        }
        p = b.next.load(Ordering::Acquire);
    }
    false
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
        Wait::Block => lock(l),
        Wait::Handler => lock_in_handler(l),
    }
}
