//! The process's life: start and end (`.init_array`/`.fini_array`, `atexit`), `fork`
//! (through `pthread_atfork`) and fatal signals, each flushing what was recorded.

use super::*;

// ---- process lifecycle ----

pub(crate) unsafe extern "C" fn at_exit() {
    flush_if_ours();
}

pub(crate) unsafe extern "C" fn fini() {
    flush_if_ours();
}

pub(crate) unsafe extern "C" fn init() {
    ensure_init();
    // Here rather than at the first call, which may come before libc is ready for threads
    // (from the dynamic loader, or another library's constructor).
    start_clock();
}

#[used]
#[unsafe(link_section = ".init_array")]
pub(crate) static INIT: unsafe extern "C" fn() = init;

#[used]
#[unsafe(link_section = ".fini_array")]
pub(crate) static FINI: unsafe extern "C" fn() = fini;

/// The pthread key destructor: the thread is ending, so its events are written and its buffer
/// goes back to the pool.
pub(crate) unsafe extern "C" fn thread_exit(value: *mut c_void) {
    let b = value.cast::<Buf>();
    if b.is_null() {
        return;
    }
    if let Some(t) = tls()
        && t.buf.get() == b
    {
        t.detach();
    }
    // SAFETY: the value is a buffer this library registered.
    let b = unsafe { &*b };
    flush_own(b);
    b.in_use.store(false, Ordering::Release);
}

pub(crate) unsafe extern "C" fn on_fatal_signal(sig: c_int) {
    if STATE.load(Ordering::Acquire) == STATE_TRACING
        // SAFETY: plain syscall.
        && unsafe { getpid() } == PID.load(Ordering::Acquire)
    {
        let _busy = Busy::new();
        flush_all(Wait::Handler);
    }
    // SAFETY: restoring the default action and re-raising ends the process as it would have
    // ended without us.
    unsafe {
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

/// Takes the file's lock, so that no segment is half-written when the child's copy of memory
/// is taken. Not when this thread holds a lock of the tracer's (a signal handler interrupted
/// it while it wrote, and forks): waiting would never end, and the child's copy has a write
/// in progress, so that child runs untraced ([`untraced_child`]).
pub(crate) unsafe extern "C" fn before_fork() {
    if holds_a_lock() {
        if let Some(t) = tls() {
            t.forks_untraced.set(t.forks_untraced.get() + 1);
        }
        return;
    }
    // Not held here (checked above), so taken.
    let _ = lock(&WRITE_LOCK);
}

/// Whether the fork ending now is one [`before_fork`] did not lock for (and counts it done).
fn fork_was_untraced() -> bool {
    let Some(t) = tls() else {
        return false;
    };
    let n = t.forks_untraced.get();
    if n > 0 {
        t.forks_untraced.set(n - 1);
    }
    n > 0
}

pub(crate) unsafe extern "C" fn after_fork_parent() {
    if !fork_was_untraced() {
        unlock(&WRITE_LOCK);
    }
}

/// The child of a fork made while this thread held a lock of the tracer's: it records
/// nothing more, and the spool it shares with the parent is replaced by `/dev/null` under
/// the same descriptor, so that the interrupted write, should the handler return, goes
/// nowhere (not into the parent's file, not into a file of the child's).
fn untraced_child() {
    STATE.store(STATE_OFF, Ordering::Release);
    let fd = FD.load(Ordering::Acquire);
    if fd < 0 {
        return;
    }
    // SAFETY: plain syscalls on our own descriptor.
    unsafe {
        let null = open(c"/dev/null".as_ptr(), O_WRONLY | O_CLOEXEC);
        if null < 0 || dup3(null, fd, O_CLOEXEC) < 0 {
            FD.store(-1, Ordering::Release);
            close(fd);
        }
        if null >= 0 {
            close(null);
        }
    }
}

pub(crate) unsafe extern "C" fn after_fork_child() {
    if fork_was_untraced() {
        if STATE.load(Ordering::Acquire) == STATE_TRACING {
            untraced_child();
        }
        return;
    }
    unlock(&WRITE_LOCK);
    if STATE.load(Ordering::Acquire) != STATE_TRACING {
        return;
    }
    let fd = FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: our own descriptor, inherited from the parent.
        unsafe { close(fd) };
    }
    // The parent writes every event from before the fork; the child starts empty. Other
    // threads (the parent's clock thread among them) do not exist in the child: their
    // buffers return to the pool.
    let t = tls();
    let mine = t.map_or(null_mut(), |t| t.buf.get());
    let mut p = BUFFERS.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: buffers are never unmapped.
        let b = unsafe { &*p };
        b.lock.store(0, Ordering::Relaxed);
        b.committed.store(0, Ordering::Relaxed);
        b.flushed.store(0, Ordering::Relaxed);
        #[cfg(target_arch = "x86_64")]
        if stacks_on() {
            stacks::forget_stack_ids(b);
        }
        if p != mine {
            b.in_use.store(false, Ordering::Relaxed);
        }
        p = b.next.load(Ordering::Acquire);
    }
    NEXT_STREAM.store(0, Ordering::Relaxed);
    #[cfg(target_arch = "x86_64")]
    stacks::reset_after_fork();
    if let (Some(t), false) = (t, mine.is_null()) {
        // SAFETY: as above.
        let mine = unsafe { &*mine };
        start_stream(mine);
        t.start_at(mine);
        if control::paused() {
            // Recording is stopped (`control.rs`): the thread takes its stream up when it
            // starts, like every other.
            t.cursor.set(null_mut());
        }
    }
    tick_clock();
    // SAFETY: a plain open of the child's own file.
    if !unsafe { open_spool() } {
        STATE.store(STATE_OFF, Ordering::Release);
        if let Some(t) = t {
            t.detach();
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if stacks_on() {
        // The child's spool needs the module map too (the stacks it will define use it).
        modules::emit_all(stacks::emit_module);
    }
    heaps::rename_in_child();
    start_clock();
}
