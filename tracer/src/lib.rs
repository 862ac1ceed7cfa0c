//! allocview's malloc tracer: a shared object loaded with `LD_PRELOAD` that records every call
//! to `malloc`, `free`, `calloc`, `realloc`, `reallocarray`, `memalign`, `posix_memalign`,
//! `aligned_alloc`, `valloc` and `pvalloc` into an allocview *spool* file. `allocview record`
//! embeds it, runs the command with it and turns each spool into a trace; the spool layout is
//! documented in the book (`docs/src/reference/binary-traces.md`) and in `loaders/src/binary/`.
//!
//! It is enabled by `ALLOCVIEW_SPOOL=<prefix>`: each process writes `<prefix>.<pid>.spool`
//! (`<prefix>.<pid>.<n>.spool` when that name exists, e.g. after `exec`, which keeps the pid).
//! Without the variable, or when the file cannot be created, every call passes straight to the
//! real allocator and the program runs as usual (a one-line notice goes to stderr in the second
//! case).
//!
//! How it works:
//! - Recording: each thread appends events to its own 256 KiB buffer (an `mmap`ed block, no
//!   locking and no system call on the hot path): an op byte, then the time delta, the size and
//!   the address delta as varints, the time and address left out (a flag in the op byte) when
//!   they equal the previous event's. A full buffer is written with one `writev` as a
//!   *segment*; segments of one thread continue each other's deltas, and a global lock keeps
//!   every segment whole in the file.
//! - Time: no clock is read per call (a TSC read alone costs about 10 ns on some virtual
//!   machines, more than the allocation it stamps). A clock thread, started by the tracer in
//!   every traced process, stores `CLOCK_MONOTONIC` in a global every [`CLOCK_PERIOD_NS`]
//!   (1 ms); each event carries the value it finds there, so times have that resolution. The
//!   free side of a call reads it before the real call and the allocation side after, so a
//!   free is never later than the allocation that reuses its address in another thread.
//! - Order: while one application thread records, its buffer's order is the order. When a
//!   second one takes a buffer, an event of a clock period that several threads record in
//!   also carries an order key, the TSC read with `rdtscp` (after an allocation's real call,
//!   before a free's; see [`order_key`]), as a zigzag prefix-varint difference from its
//!   thread's previous key: the first thread to record in a period owns it and records
//!   without keys until another one marks the period shared (see [`event_key_at`]). The
//!   loader puts the owner's events without a key first, orders the rest of a time by key,
//!   and the few of several threads without one (the period in which keys start) by
//!   causality. After each periodic flush the clock thread writes a flush mark, which lets
//!   `record` convert the spool while the program runs. Not on other architectures,
//!   nor where the TSC cannot order events across CPUs ([`KEYS_USABLE`]): there, every period
//!   is ordered by causality, which can give up under heavy hand-over of blocks between
//!   threads (see `loaders/src/binary/`).
//!   The clock thread never records, blocks every signal, holds no lock of the program's and
//!   ends (letting the process exit) when it is the last thread left.
//! - Flushing: the owner thread publishes the end of its last complete event with a release
//!   store; any thread may flush another's buffer up to that point under the buffer's lock
//!   (the owner only ever writes beyond it). The clock thread flushes every buffer every
//!   20 ms, so an idle thread's events reach the file too. Everything is flushed at `exit` (an
//!   `atexit` handler and a `.fini_array` destructor), `_exit`/`_Exit`, before `execve`/
//!   `execv`/`execvp`/`execvpe`/`fexecve`, at thread exit (a `pthread_key` destructor, which
//!   also returns the buffer to a pool), and on fatal signals (`SIGTERM`, `SIGHUP`, `SIGQUIT`,
//!   `SIGABRT`, `SIGSEGV`, `SIGBUS`, `SIGFPE`, `SIGILL`, `SIGXCPU`, `SIGXFSZ`, only where the
//!   program started with the default action; the handler flushes, restores the default and
//!   re-raises).
//! - What can be lost: events of the last moments of a process killed by `SIGKILL`, or by
//!   `SIGINT` when the program does not handle it (not caught: programs such as Python only
//!   install their own handler when `SIGINT` has its default action): at most the last 20 ms;
//!   events of other threads racing with `exit` after its final flush; events after the
//!   `.fini_array` destructor; events before `exec` through `execl`, `execlp` and `execle`,
//!   which glibc routes to `execve` internally (the periodic flush bounds that loss as above).
//! - Hard cases: allocations made by `dlsym` while the real functions are resolved come from a
//!   static 64 KiB bootstrap arena (never traced, never freed); calls made from inside the
//!   tracer (or from a signal handler interrupting it) go straight to the real functions;
//!   each lock records its holder, and a handler that interrupted the holder and then calls
//!   `_exit`, `exit`, an `exec` or `fork` never waits for it: the exit and exec paths write
//!   what they can without it (nothing at all when the interrupted code was writing to the
//!   file, whose last frame may then be cut), and the child of such a `fork` runs untraced;
//!   `fork` (through `pthread_atfork`) gives the child its own file, an empty buffer and a
//!   clock thread of its own, since the parent writes the events from before the fork; the
//!   tracer itself never calls `malloc`.
//! - The program's own heaps (`heaps.rs`): `allocview_heap_alloc`, `_free` and `_name`, which
//!   `include/allocview.h` declares weak, record a heap's events into the thread's stream as
//!   malloc's are recorded, each after a heap prefix; on x86-64, programs that fire the
//!   `otel_memory` USDT probes have them recorded the same way (`usdt.rs`).
//! - Thread-local state: one word read per call. On x86-64 it lives in the static TLS block
//!   (initial-exec model, declared in assembly below: stable Rust has no TLS-model attribute),
//!   which is valid because a preloaded library is loaded at start-up; elsewhere it is a
//!   `thread_local!`.

#![cfg(all(target_os = "linux", target_pointer_width = "64"))]
#![allow(clippy::missing_safety_doc)]

#[cfg(target_arch = "x86_64")]
mod cfi;
pub mod encode;
mod limit;
#[cfg(target_arch = "x86_64")]
mod modules;
#[cfg(target_arch = "x86_64")]
mod python;
#[cfg(target_arch = "x86_64")]
mod stacks;
#[cfg(target_arch = "x86_64")]
mod unwind;
#[cfg(target_arch = "x86_64")]
mod usdt;

use arena::*;
use clock::*;
use lifecycle::*;
use locks::*;
use record::*;
use spool::*;
use sys::*;
use tls::*;

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::ptr::{self, null_mut};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, compiler_fence,
};

use encode::{
    MAX_VARINT_BYTES, PREFIX_VARINT_STORE_BYTES, SHORT_U64_STORE_BYTES, StackWriter,
    put_prefix_varint, put_short_u64, put_varint, zigzag,
};

// ---- per-thread buffers ----

/// Bytes of events a thread buffers before writing them.
const BUF_BYTES: usize = 256 << 10;
/// Most bytes one record may write: a time change (op byte, varint), a heap prefix (an event
/// of the program's own heap, `heaps.rs`), the switch to keyed events (one op byte), then the
/// event's op byte, size, address and order key (the size and address stored as whole words,
/// past their end; the key after them).
const MAX_EVENT_BYTES: usize = 1
    + MAX_VARINT_BYTES
    + heaps::HEAP_PREFIX_BYTES
    + 1
    + 1
    + PREFIX_VARINT_STORE_BYTES
    + SHORT_U64_STORE_BYTES
    + PREFIX_VARINT_STORE_BYTES
    + PREFIX_VARINT_STORE_BYTES;
/// Where the event bytes start in a buffer's block: the [`Buf`] header and the owner's stack
/// memo (`stacks::ThreadMemo`, 18 KiB) take the pages before.
const DATA_OFFSET_BYTES: usize = 20 << 10;
const BLOCK_BYTES: usize = BUF_BYTES + DATA_OFFSET_BYTES;

/// One thread's buffer, at the start of its own `mmap`ed block with the event bytes after it;
/// what flushing threads share. The owner's write position and delta bases are in its
/// [`ThreadState`].
#[repr(C)]
struct Buf {
    /// Held while a segment of this buffer is written, or the owner resets it (the holder's
    /// [`self_id`], 0 when free).
    lock: AtomicUsize,
    /// Owned by a live thread.
    in_use: AtomicBool,
    /// Address of the end of the last complete event (release-stored by the owner), or 0 when
    /// there is none: an address rather than an offset so that the hot path stores its
    /// cursor as it is (read it with [`Buf::committed_len`]).
    committed: AtomicUsize,
    /// Bytes already written to the file (under `lock`).
    flushed: AtomicUsize,
    stream: AtomicU32,
    tid: AtomicU64,
    /// The stream's owner id (see [`event_key_at`]).
    owner: AtomicU64,
    next: AtomicPtr<Buf>,
}

const _: () = assert!(std::mem::size_of::<Buf>() <= DATA_OFFSET_BYTES);

impl Buf {
    /// The first byte of the event data.
    #[inline(always)]
    fn data(&self) -> *mut u8 {
        // SAFETY: the data follows the header inside the same mapping (see `acquire_buf`).
        unsafe {
            ptr::from_ref(self)
                .cast_mut()
                .cast::<u8>()
                .add(DATA_OFFSET_BYTES)
        }
    }

    /// Bytes of complete events from the beginning of the data (0 also for a `committed` of
    /// 0, which lies below the data).
    fn committed_len(&self) -> usize {
        self.committed
            .load(Ordering::Acquire)
            .saturating_sub(self.data() as usize)
    }

    /// The last position an event may start at (room for [`MAX_EVENT_BYTES`] after it).
    fn last_start(&self) -> *mut u8 {
        // SAFETY: inside the data, which is BUF_BYTES long.
        unsafe { self.data().add(BUF_BYTES - MAX_EVENT_BYTES) }
    }
}

// ---- global state ----

const STATE_UNINIT: u32 = 0;
const STATE_INITIALIZING: u32 = 1;
const STATE_TRACING: u32 = 2;
const STATE_OFF: u32 = 3;

static STATE: AtomicU32 = AtomicU32::new(STATE_UNINIT);
/// The run number of in-process tracking (`inprocess.rs`): a thread whose own number differs
/// starts a new stream at its next call (always 0 under `LD_PRELOAD`).
static EPOCH: AtomicU32 = AtomicU32::new(0);
static FD: AtomicI32 = AtomicI32::new(-1);
static PID: AtomicI32 = AtomicI32::new(0);
static WRITE_LOCK: AtomicUsize = AtomicUsize::new(0);
static BUFFERS: AtomicPtr<Buf> = AtomicPtr::new(null_mut());
static NEXT_STREAM: AtomicU32 = AtomicU32::new(0);
static KEY: AtomicU32 = AtomicU32::new(u32::MAX);
/// Allocations carry their call stacks (`ALLOCVIEW_STACKS=1`, x86-64 only). Set at
/// initialisation, before any event.
static STACKS: AtomicBool = AtomicBool::new(false);

#[inline(always)]
fn stacks_on() -> bool {
    STACKS.load(Ordering::Relaxed)
}
/// The process whose clock thread has been started (a fork child starts its own).
static CLOCK_PID: AtomicI32 = AtomicI32::new(0);
/// The `ALLOCVIEW_SPOOL` prefix, kept for the files of forked children.
static PREFIX: StaticPath = StaticPath::new();

/// A NUL-terminated path in static memory (the tracer cannot allocate).
struct StaticPath {
    bytes: std::cell::UnsafeCell<[u8; 4096]>,
    len: AtomicUsize,
}

// SAFETY: written once during initialisation, before any other thread reads it.
unsafe impl Sync for StaticPath {}

impl StaticPath {
    const fn new() -> Self {
        Self {
            bytes: std::cell::UnsafeCell::new([0; 4096]),
            len: AtomicUsize::new(0),
        }
    }

    fn get(&self) -> &[u8] {
        let len = self.len.load(Ordering::Acquire);
        // SAFETY: the bytes up to `len` were written before `len` was published.
        let all = unsafe { &*self.bytes.get() };
        all.get(..len).unwrap_or(&[])
    }
}

// ---- real functions ----

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type ReallocArrayFn = unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void;
type MemalignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;
type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type ExecvFn = unsafe extern "C" fn(*const c_char, *const *const c_char) -> c_int;
type FexecveFn = unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
type ExitFn = unsafe extern "C" fn(c_int) -> !;
type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

struct Real {
    malloc: AtomicUsize,
    free: AtomicUsize,
    calloc: AtomicUsize,
    realloc: AtomicUsize,
    reallocarray: AtomicUsize,
    memalign: AtomicUsize,
    posix_memalign: AtomicUsize,
    aligned_alloc: AtomicUsize,
    valloc: AtomicUsize,
    pvalloc: AtomicUsize,
    execve: AtomicUsize,
    execv: AtomicUsize,
    execvp: AtomicUsize,
    execvpe: AtomicUsize,
    fexecve: AtomicUsize,
    exit: AtomicUsize,
    exit2: AtomicUsize,
    dlclose: AtomicUsize,
}

static REAL: Real = Real {
    malloc: AtomicUsize::new(0),
    free: AtomicUsize::new(0),
    calloc: AtomicUsize::new(0),
    realloc: AtomicUsize::new(0),
    reallocarray: AtomicUsize::new(0),
    memalign: AtomicUsize::new(0),
    posix_memalign: AtomicUsize::new(0),
    aligned_alloc: AtomicUsize::new(0),
    valloc: AtomicUsize::new(0),
    pvalloc: AtomicUsize::new(0),
    execve: AtomicUsize::new(0),
    execv: AtomicUsize::new(0),
    execvp: AtomicUsize::new(0),
    execvpe: AtomicUsize::new(0),
    fexecve: AtomicUsize::new(0),
    exit: AtomicUsize::new(0),
    exit2: AtomicUsize::new(0),
    dlclose: AtomicUsize::new(0),
};

/// Loads a resolved function pointer, initialising the tracer on first use; `None` while the
/// calling thread is itself resolving (inside `dlsym`), or if the symbol does not exist.
#[inline(always)]
fn real(slot: &AtomicUsize) -> Option<usize> {
    let f = slot.load(Ordering::Acquire);
    if f != 0 {
        return Some(f);
    }
    ensure_init();
    let f = slot.load(Ordering::Acquire);
    (f != 0).then_some(f)
}

macro_rules! real_fn {
    ($slot:ident, $ty:ty) => {
        // SAFETY: the slot only ever holds the address dlsym returned for this very symbol.
        real(&REAL.$slot).map(|f| unsafe { std::mem::transmute::<usize, $ty>(f) })
    };
}

// The tracer's parts (after `real_fn!`, which some of them use).
mod arena;
mod clock;
mod control;
#[cfg(target_arch = "x86_64")]
mod got;
pub mod heaps;
#[cfg(target_arch = "x86_64")]
pub mod inprocess;
mod lifecycle;
mod locks;
pub mod mappings;
mod record;
mod sample;
mod spool;
mod sys;
mod tls;

// ---- initialisation ----

#[cold]
#[inline(never)]
fn ensure_init() {
    match STATE.compare_exchange(
        STATE_UNINIT,
        STATE_INITIALIZING,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {
            let busy = Busy::new();
            // SAFETY: runs once, with the thread marked busy so nested calls pass through.
            let tracing = unsafe { initialise() };
            STATE.store(
                if tracing { STATE_TRACING } else { STATE_OFF },
                Ordering::Release,
            );
            drop(busy);
        }
        Err(STATE_INITIALIZING) => {
            // Either this thread is inside dlsym (the callers fall back to the arena), or
            // another thread is initialising: wait for it.
            if !is_busy() {
                while STATE.load(Ordering::Acquire) == STATE_INITIALIZING {
                    std::hint::spin_loop();
                }
            }
        }
        Err(_) => {}
    }
}

unsafe fn resolve(slot: &AtomicUsize, name: &[u8]) {
    // SAFETY: name is NUL-terminated.
    let f = unsafe { dlsym(RTLD_NEXT, name.as_ptr().cast()) };
    slot.store(f as usize, Ordering::Release);
}

/// Resolves the real functions, then opens the spool; returns whether tracing is on.
unsafe fn initialise() -> bool {
    unsafe {
        // malloc and free first: dlsym may allocate, and those calls use the arena until then.
        resolve(&REAL.malloc, b"malloc\0");
        resolve(&REAL.free, b"free\0");
        resolve(&REAL.calloc, b"calloc\0");
        resolve(&REAL.realloc, b"realloc\0");
        resolve(&REAL.reallocarray, b"reallocarray\0");
        resolve(&REAL.memalign, b"memalign\0");
        resolve(&REAL.posix_memalign, b"posix_memalign\0");
        resolve(&REAL.aligned_alloc, b"aligned_alloc\0");
        resolve(&REAL.valloc, b"valloc\0");
        resolve(&REAL.pvalloc, b"pvalloc\0");
        resolve(&REAL.execve, b"execve\0");
        resolve(&REAL.execv, b"execv\0");
        resolve(&REAL.execvp, b"execvp\0");
        resolve(&REAL.execvpe, b"execvpe\0");
        resolve(&REAL.fexecve, b"fexecve\0");
        resolve(&REAL.exit, b"_exit\0");
        resolve(&REAL.exit2, b"_Exit\0");
        resolve(&REAL.dlclose, b"dlclose\0");
    }
    if REAL.malloc.load(Ordering::Acquire) == 0 || REAL.free.load(Ordering::Acquire) == 0 {
        return false;
    }
    // SAFETY: getenv does not allocate; the result is NUL-terminated or null.
    let prefix = unsafe { getenv(c"ALLOCVIEW_SPOOL".as_ptr()) };
    if prefix.is_null() {
        return false;
    }
    // SAFETY: as above.
    let prefix = unsafe { std::ffi::CStr::from_ptr(prefix) }.to_bytes();
    if prefix.is_empty() || prefix.len() > 4000 {
        return false;
    }
    // SAFETY: single-threaded here (STATE is INITIALIZING and other threads wait).
    unsafe {
        let dst = &mut *PREFIX.bytes.get();
        if let Some(d) = dst.get_mut(..prefix.len()) {
            d.copy_from_slice(prefix);
        }
    }
    PREFIX.len.store(prefix.len(), Ordering::Release);
    KEYS_USABLE.store(keys_usable(), Ordering::Relaxed);
    // SAFETY: as for the prefix above.
    let stacks = unsafe { getenv(c"ALLOCVIEW_STACKS".as_ptr()) };
    // SAFETY: as above.
    let stacks =
        !stacks.is_null() && unsafe { std::ffi::CStr::from_ptr(stacks) }.to_bytes() == b"1";
    STACKS.store(stacks && cfg!(target_arch = "x86_64"), Ordering::Relaxed);
    control::init();
    sample::init();
    // Before the limits start counting calls: the look-ups may allocate (dlerror's message).
    #[cfg(target_arch = "x86_64")]
    python::detect();
    limit::init();
    tick_clock();
    // SAFETY: plain syscalls and libc registration calls; nested allocations pass through.
    unsafe {
        if !open_spool() {
            return false;
        }
        register_process_hooks();
        // The `otel_memory` USDT probes of the objects loaded now (`usdt.rs`).
        #[cfg(target_arch = "x86_64")]
        usdt::attach();
        for sig in FLUSH_SIGNALS {
            let old = signal(sig, on_fatal_signal as *const () as usize);
            if old != SIG_DFL && old != SIG_ERR {
                // The program (or whoever started it) chose this action: keep it.
                signal(sig, old);
            }
        }
    }
    true
}

/// The process-wide hooks the tracer needs once: the key whose destructor flushes a thread's
/// buffer at its exit, the `fork` handlers, and the flush at `exit`.
unsafe fn register_process_hooks() {
    // SAFETY: libc registration calls with the tracer's own functions.
    unsafe {
        let mut key = 0u32;
        if pthread_key_create(&mut key, Some(thread_exit)) == 0 {
            KEY.store(key, Ordering::Release);
        }
        pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
        atexit(at_exit);
    }
}

// ---- the interposed functions ----

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let Some(f) = real_fn!(malloc, MallocFn) else {
        return arena_alloc(size, 16);
    };
    let p = if limit::refuse(size, 0) {
        limit::fail()
    } else {
        unsafe { f(size) }
    };
    limit::allocated(p);
    if stacks_on() {
        return record_alloc_with_stack(CALL_MALLOC, size, p);
    }
    record_alloc(CALL_MALLOC, size, p, now_word())
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if in_arena(p) {
        return;
    }
    let Some(f) = real_fn!(free, FreeFn) else {
        return;
    };
    limit::freeing(p);
    // Recorded before the real call, which then is the wrapper's tail call: nothing lives
    // across it. The time is read before the block can be handed out again, as it must be.
    let word = now_word();
    if multi_thread() || !record_fast(CALL_FREE | OP_FREE, 0, p as u64, tick_of(word), None) {
        return unsafe { free_slow(f, p, word) };
    }
    unsafe { f(p) }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(f) = real_fn!(calloc, CallocFn) else {
        // The arena is zeroed static memory that is never reused.
        return match n.checked_mul(size) {
            Some(total) => arena_alloc(total, 16),
            None => null_mut(),
        };
    };
    let Some((t, cursor)) = enter() else {
        return unsafe { f(n, size) };
    };
    let p = if limit::refuse(n.saturating_mul(size), 0) {
        limit::fail()
    } else {
        unsafe { f(n, size) }
    };
    limit::allocated(p);
    finish_alloc(t, cursor, CALL_CALLOC, n.saturating_mul(size), p)
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn realloc(old: *mut c_void, size: usize) -> *mut c_void {
    if in_arena(old) {
        return unsafe { arena_realloc(old, size) };
    }
    let Some(f) = real_fn!(realloc, ReallocFn) else {
        return if old.is_null() {
            arena_alloc(size, 16)
        } else {
            null_mut()
        };
    };
    let Some((t, cursor)) = enter() else {
        return unsafe { f(old, size) };
    };
    let before = Before::now(t);
    let old_bytes = limit::usable(old);
    let new = if size > 0 && limit::refuse(size, old_bytes) {
        limit::fail()
    } else {
        unsafe { f(old, size) }
    };
    if !new.is_null() || size == 0 {
        limit::released(old_bytes);
    }
    limit::allocated(new);
    finish_realloc(t, cursor, CALL_REALLOC, old, size, new, before)
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn reallocarray(old: *mut c_void, n: usize, size: usize) -> *mut c_void {
    if in_arena(old) {
        return match n.checked_mul(size) {
            Some(total) => unsafe { arena_realloc(old, total) },
            None => null_mut(),
        };
    }
    let Some(f) = real_fn!(reallocarray, ReallocArrayFn) else {
        return null_mut();
    };
    let Some((t, cursor)) = enter() else {
        return unsafe { f(old, n, size) };
    };
    let before = Before::now(t);
    let total = n.saturating_mul(size);
    let old_bytes = limit::usable(old);
    let new = if total > 0 && limit::refuse(total, old_bytes) {
        limit::fail()
    } else {
        unsafe { f(old, n, size) }
    };
    if !new.is_null() || total == 0 {
        limit::released(old_bytes);
    }
    limit::allocated(new);
    finish_realloc(t, cursor, CALL_REALLOCARRAY, old, total, new, before)
}

macro_rules! aligned_wrapper {
    ($name:ident, $slot:ident, $code:expr) => {
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name(align: usize, size: usize) -> *mut c_void {
            let Some(f) = real_fn!($slot, MemalignFn) else {
                return arena_alloc(size, align);
            };
            let Some((t, cursor)) = enter() else {
                return unsafe { f(align, size) };
            };
            let p = if limit::refuse(size, 0) {
                limit::fail()
            } else {
                unsafe { f(align, size) }
            };
            limit::allocated(p);
            finish_alloc(t, cursor, $code, size, p)
        }
    };
}

aligned_wrapper!(memalign, memalign, CALL_MEMALIGN);
aligned_wrapper!(aligned_alloc, aligned_alloc, CALL_ALIGNED_ALLOC);

macro_rules! page_wrapper {
    ($name:ident, $slot:ident, $code:expr) => {
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name(size: usize) -> *mut c_void {
            let Some(f) = real_fn!($slot, MallocFn) else {
                return arena_alloc(size, 4096);
            };
            let Some((t, cursor)) = enter() else {
                return unsafe { f(size) };
            };
            let p = if limit::refuse(size, 0) {
                limit::fail()
            } else {
                unsafe { f(size) }
            };
            limit::allocated(p);
            finish_alloc(t, cursor, $code, size, p)
        }
    };
}

page_wrapper!(valloc, valloc, CALL_VALLOC);
page_wrapper!(pvalloc, pvalloc, CALL_PVALLOC);

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    let Some(f) = real_fn!(posix_memalign, PosixMemalignFn) else {
        let p = arena_alloc(size, align);
        if p.is_null() {
            return 12; // ENOMEM
        }
        unsafe { out.write(p) };
        return 0;
    };
    let Some((t, cursor)) = enter() else {
        return unsafe { f(out, align, size) };
    };
    let rc = if limit::refuse(size, 0) {
        limit::ENOMEM_CODE
    } else {
        unsafe { f(out, align, size) }
    };
    let p = if rc == 0 {
        unsafe { out.read() }
    } else {
        null_mut()
    };
    limit::allocated(p);
    finish_alloc(t, cursor, CALL_POSIX_MEMALIGN, size, p);
    rc
}

/// Flushes every buffer when this is the process that opened the spool (not a `vfork` child
/// sharing our memory, which must leave the parent's buffers alone).
/// In a signal handler that interrupted the tracer while it held a lock, locks are waited
/// for a bounded time only ([`Wait::Handler`]): another thread may hold one while waiting
/// for the lock this thread holds.
fn flush_if_ours() {
    if STATE.load(Ordering::Acquire) == STATE_TRACING
        // SAFETY: plain syscall.
        && unsafe { getpid() } == PID.load(Ordering::Acquire)
    {
        let _busy = Busy::new();
        flush_all(if holds_a_lock() {
            Wait::Handler
        } else {
            Wait::Block
        });
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    flush_if_ours();
    match real_fn!(execve, ExecveFn) {
        Some(f) => unsafe { f(path, argv, envp) },
        None => -1,
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    flush_if_ours();
    match real_fn!(execv, ExecvFn) {
        Some(f) => unsafe { f(path, argv) },
        None => -1,
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    flush_if_ours();
    match real_fn!(execvp, ExecvFn) {
        Some(f) => unsafe { f(file, argv) },
        None => -1,
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    flush_if_ours();
    match real_fn!(execvpe, ExecveFn) {
        Some(f) => unsafe { f(file, argv, envp) },
        None => -1,
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    flush_if_ours();
    match real_fn!(fexecve, FexecveFn) {
        Some(f) => unsafe { f(fd, argv, envp) },
        None => -1,
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    flush_if_ours();
    match real_fn!(exit, ExitFn) {
        Some(f) => unsafe { f(status) },
        None => std::process::abort(),
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    flush_if_ours();
    match real_fn!(exit2, ExitFn) {
        Some(f) => unsafe { f(status) },
        None => std::process::abort(),
    }
}

/// `dlclose`, for the call stacks: a module it unmapped leaves the tracer's module table (a
/// library mapped at its addresses later is unwound with its own tables, and the table does
/// not fill under repeated `dlopen`/`dlclose`), and every buffer is written out, so that the
/// stacks defined while the module was mapped come before the `MODULE` frame of whatever is
/// mapped there next (the loader places a stack in the latest module frame before it that
/// covers the address).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(f) = real_fn!(dlclose, DlcloseFn) else {
        return -1;
    };
    #[cfg(target_arch = "x86_64")]
    if stacks_on() && STATE.load(Ordering::Acquire) == STATE_TRACING && !is_busy() {
        let unloads = modules::before_dlclose();
        let rc = unsafe { f(handle) };
        if modules::after_dlclose(unloads) {
            flush_if_ours();
        }
        return rc;
    }
    unsafe { f(handle) }
}

// The loader's call names, for the unit test below to check the codes against.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_codes_match_the_loaders_names() {
        let names = [
            "malloc",
            "calloc",
            "realloc",
            "free",
            "memalign",
            "posix_memalign",
            "aligned_alloc",
            "valloc",
            "pvalloc",
            "reallocarray",
            "other",
        ];
        let ours = [
            (CALL_MALLOC, "malloc"),
            (CALL_CALLOC, "calloc"),
            (CALL_REALLOC, "realloc"),
            (CALL_FREE, "free"),
            (CALL_MEMALIGN, "memalign"),
            (CALL_POSIX_MEMALIGN, "posix_memalign"),
            (CALL_ALIGNED_ALLOC, "aligned_alloc"),
            (CALL_VALLOC, "valloc"),
            (CALL_PVALLOC, "pvalloc"),
            (CALL_REALLOCARRAY, "reallocarray"),
        ];
        for (code, name) in ours {
            assert_eq!(names[code as usize], name);
        }
        assert_eq!(OP_FREE & 0x0f, 0);
    }

    #[test]
    fn arena_blocks_are_aligned_and_remember_their_size() {
        let p = arena_alloc(40, 64);
        assert!(!p.is_null());
        assert_eq!(p as usize % 64, 0);
        assert!(in_arena(p));
        let size = unsafe { ((p as usize - 8) as *const u64).read_unaligned() };
        assert_eq!(size, 40);
        assert!(arena_alloc(ARENA_BYTES, 16).is_null());
    }
}
