//! Thread-local state: one word read per call (see the crate documentation), and the busy
//! flag that lets the tracer's own calls through.

use super::*;

// ---- thread-local state ----

/// A thread's view of the tracer, with the state of its event stream: kept here rather than
/// in the [`Buf`] so that the hot path's loads depend on no earlier load (only the cursor
/// carries over from one event to the next). All-zero bytes are its initial state.
#[repr(C)]
pub(crate) struct ThreadState {
    /// Where the next event goes in the thread's buffer, or null when this call must not
    /// record: the thread has no buffer yet, a call of this thread is already inside the
    /// tracer (the hot path clears it for the length of a record, so a signal handler's calls
    /// then pass through), or the thread never records (the clock thread).
    pub(crate) cursor: Cell<*mut u8>,
    /// The buffer's [`Buf::last_start`]: beyond it the buffer is full.
    pub(crate) last_start: Cell<*mut u8>,
    /// The thread's buffer, once it has one.
    pub(crate) buf: Cell<*mut Buf>,
    /// Time of the stream's previous event (0 at its start).
    pub(crate) prev_ns: Cell<u64>,
    /// Address of the stream's previous event (0 at its start).
    pub(crate) prev_addr: Cell<u64>,
    /// Order key of the stream's previous keyed event (0 at its start).
    pub(crate) prev_key: Cell<u64>,
    /// The stream's events carry keys now ([`OP_KEYED`] written, [`OP_UNKEYED`] not since).
    pub(crate) keyed: Cell<bool>,
    /// The stream's owner id (see [`event_key_at`]; 0: none).
    pub(crate) owner: Cell<u64>,
    /// Set while tracer code outside the hot path runs (initialisation, flushes, taking a
    /// buffer), and for good on the clock thread: nested calls go straight to the allocator.
    pub(crate) busy: Cell<bool>,
    /// The thread's stack, `[stack_lo, stack_hi)`, once the unwinder has asked (0: not yet).
    pub(crate) stack_lo: Cell<u64>,
    pub(crate) stack_hi: Cell<u64>,
    /// `fork`s in progress on this thread that found it holding a lock of the tracer's (from a
    /// signal handler that interrupted a write): their children run untraced (see
    /// [`before_fork`]).
    pub(crate) forks_untraced: Cell<u32>,
    /// Which allocator the events this thread records now come from (a tag in bits 60-61 of
    /// their addresses, see `python/mod.rs`; 0: the C library, called by the program).
    pub(crate) addr_tag: Cell<u64>,
    /// The run of in-process tracking this thread's stream belongs to ([`crate::EPOCH`]).
    pub(crate) epoch: Cell<u32>,
    /// Sampled stacks (`sample.rs`): bytes left before the thread's next sample point (0: no
    /// gap drawn yet), and its generator's state.
    pub(crate) sample_left: Cell<u64>,
    pub(crate) sample_rng: Cell<u64>,
}

impl ThreadState {
    /// Starts writing a new stream at the beginning of `b`, this thread's buffer.
    pub(crate) fn start_at(&self, b: &Buf) {
        self.prev_ns.set(0);
        self.prev_addr.set(0);
        self.prev_key.set(0);
        self.keyed.set(false);
        self.owner.set(b.owner.load(Ordering::Relaxed));
        self.last_start.set(b.last_start());
        self.buf.set(ptr::from_ref(b).cast_mut());
        self.cursor.set(b.data());
    }

    /// Stops recording on this thread (its buffer is gone or tracing is off).
    pub(crate) fn detach(&self) {
        self.cursor.set(null_mut());
        self.buf.set(null_mut());
    }
}

/// Bytes reserved for [`ThreadState`] in the static TLS block.
#[cfg(target_arch = "x86_64")]
pub(crate) const TLS_BYTES: usize = 128;

#[cfg(target_arch = "x86_64")]
const _: () = assert!(std::mem::size_of::<ThreadState>() <= TLS_BYTES);

// The thread-local block, in `.tbss` (zero-initialised per thread). Declared here because
// `thread_local!` in a shared object uses the general-dynamic model, a `__tls_get_addr` call
// per access; the initial-exec access below is two instructions.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 4",
    // Global (the accessor is inlined into other codegen units) but hidden: not exported.
    ".globl allocview_tracer_tls",
    ".hidden allocview_tracer_tls",
    ".type allocview_tracer_tls,@object",
    ".size allocview_tracer_tls, {bytes}",
    "allocview_tracer_tls:",
    ".zero {bytes}",
    ".popsection",
    bytes = const TLS_BYTES,
);

/// The calling thread's state.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn tls() -> Option<&'static ThreadState> {
    let p: *const ThreadState;
    // SAFETY: `fs:0` holds the thread pointer on x86-64 Linux, and the GOT slot holds the
    // block's offset from it (initial-exec TLS, resolved by the dynamic loader at load time).
    unsafe {
        std::arch::asm!(
            "mov {p}, qword ptr fs:[0]",
            "add {p}, qword ptr [rip + allocview_tracer_tls@GOTTPOFF]",
            p = out(reg) p,
            options(pure, readonly, nostack),
        );
        // The block is zero-initialised: null pointers and `false` are valid values.
        Some(&*p)
    }
}

#[cfg(not(target_arch = "x86_64"))]
thread_local! {
    static TLS: ThreadState = const {
        ThreadState {
            cursor: Cell::new(null_mut()),
            last_start: Cell::new(null_mut()),
            buf: Cell::new(null_mut()),
            prev_ns: Cell::new(0),
            prev_addr: Cell::new(0),
            prev_key: Cell::new(0),
            keyed: Cell::new(false),
            owner: Cell::new(0),
            busy: Cell::new(false),
            stack_lo: Cell::new(0),
            stack_hi: Cell::new(0),
            forks_untraced: Cell::new(0),
            addr_tag: Cell::new(0),
            epoch: Cell::new(0),
            sample_left: Cell::new(0),
            sample_rng: Cell::new(0),
        }
    };
}

/// The calling thread's state.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn tls() -> Option<&'static ThreadState> {
    // SAFETY: thread-locals live as long as their thread, and the reference never leaves it.
    TLS.try_with(|t| unsafe { &*ptr::from_ref(t) }).ok()
}

/// A non-zero number naming the calling thread, for the locks.
pub(crate) fn self_id() -> usize {
    tls().map_or(1, |t| ptr::from_ref(t) as usize)
}

/// Marks the calling thread busy (nested calls go straight to the allocator) until dropped.
pub(crate) struct Busy {
    pub(crate) t: Option<&'static ThreadState>,
    pub(crate) cursor: *mut u8,
    pub(crate) buf: *mut Buf,
    pub(crate) was: bool,
}

impl Busy {
    pub(crate) fn new() -> Self {
        let t = tls();
        let (cursor, buf, was) = t.map_or((null_mut(), null_mut(), true), |t| {
            (
                t.cursor.replace(null_mut()),
                t.buf.get(),
                t.busy.replace(true),
            )
        });
        compiler_fence(Ordering::SeqCst);
        Self {
            t,
            cursor,
            buf,
            was,
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        if let Some(t) = self.t {
            t.busy.set(self.was);
            // Unless the buffer changed meanwhile (thread exit, fork child, a first buffer).
            if !self.cursor.is_null() && t.buf.get() == self.buf && t.cursor.get().is_null() {
                t.cursor.set(self.cursor);
            }
        }
    }
}

pub(crate) fn is_busy() -> bool {
    tls().is_none_or(|t| t.busy.get())
}
