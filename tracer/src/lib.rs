//! allocview's malloc tracer: a shared object loaded with `LD_PRELOAD` that records every call
//! to `malloc`, `free`, `calloc`, `realloc`, `reallocarray`, `memalign`, `posix_memalign`,
//! `aligned_alloc`, `valloc` and `pvalloc` into an allocview *spool* file. `allocview record`
//! embeds it, runs the command with it and turns each spool into a trace; the spool layout is
//! documented in the README ("allocview binary traces") and in `loaders/src/binary.rs`.
//!
//! It is enabled by `ALLOCVIEW_SPOOL=<prefix>`: each process writes `<prefix>.<pid>.spool`
//! (`<prefix>.<pid>.<n>.spool` when that name exists, e.g. after `exec`, which keeps the pid).
//! Without the variable, or when the file cannot be created, every call passes straight to the
//! real allocator and the program runs as usual (a one-line notice goes to stderr in the second
//! case).
//!
//! How it works:
//! - Recording: each thread appends events to its own 256 KiB buffer (an `mmap`ed block, no
//!   locking on the hot path): an op byte, the time delta, the size and the address delta as
//!   varints. A full buffer is written with one `writev` as a *segment*; segments of one thread
//!   continue each other's deltas, and a global lock keeps every segment whole in the file.
//!   Times are TSC ticks on x86-64 (calibrated against `CLOCK_MONOTONIC` in every segment
//!   header), `CLOCK_MONOTONIC` nanoseconds elsewhere; the free side of a call is stamped before
//!   the real call and the allocation side after it, so a merge by time keeps every free after
//!   its allocation and before the address is handed out again, across threads.
//! - Flushing: the owner thread publishes the end of its last complete event with a release
//!   store; any thread may flush another's buffer up to that point under the buffer's lock
//!   (the owner only ever writes beyond it). Every 4096 events a thread checks the clock and,
//!   if 100 ms passed since the last global flush, flushes every buffer, so an idle thread's
//!   events reach the file too. Everything is flushed at `exit` (an `atexit` handler and a
//!   `.fini_array` destructor), `_exit`/`_Exit`, before `execve`/`execv`/`execvp`/`execvpe`/
//!   `fexecve`, at thread exit (a `pthread_key` destructor, which also returns the buffer to a
//!   pool), and on fatal signals (`SIGTERM`, `SIGHUP`, `SIGQUIT`, `SIGABRT`, `SIGSEGV`,
//!   `SIGBUS`, `SIGFPE`, `SIGILL`, `SIGXCPU`, `SIGXFSZ`, only where the program started with
//!   the default action; the handler flushes, restores the default and re-raises).
//! - What can be lost: events of the last moments of a process killed by `SIGKILL`, or by
//!   `SIGINT` when the program does not handle it (not caught: programs such as Python only
//!   install their own handler when `SIGINT` has its default action): at most the last 100 ms
//!   or 4096 events per thread; events of other threads racing with `exit` after its final
//!   flush; events after the `.fini_array` destructor; events before `exec` through `execl`,
//!   `execlp` and `execle`, which glibc routes to `execve` internally (the periodic flush bounds
//!   that loss as above).
//! - Hard cases: allocations made by `dlsym` while the real functions are resolved come from a
//!   static 64 KiB bootstrap arena (never traced, never freed); a thread-local guard passes
//!   calls made from inside the tracer (or from a signal handler interrupting it) straight to
//!   the real functions; `fork` (through `pthread_atfork`) gives the child its own file and an
//!   empty buffer, since the parent writes the events from before the fork; the tracer itself
//!   never calls `malloc`.

#![cfg(all(target_os = "linux", target_pointer_width = "64"))]
#![allow(clippy::missing_safety_doc)]

pub mod encode;

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::ptr::{self, null_mut};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

use encode::{MAX_VARINT_BYTES, StackWriter, put_varint, zigzag};

// ---- libc, declared by hand so the crate builds with a bare `rustc` and no dependencies ----

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

#[repr(C)]
struct IoVec {
    base: *const c_void,
    len: usize,
}

unsafe extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn getenv(name: *const c_char) -> *const c_char;
    fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize;
    fn writev(fd: c_int, iov: *const IoVec, count: c_int) -> isize;
    fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    fn close(fd: c_int) -> c_int;
    fn getpid() -> c_int;
    fn getppid() -> c_int;
    fn gettid() -> c_int;
    fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void;
    fn pthread_key_create(key: *mut u32, dtor: Option<unsafe extern "C" fn(*mut c_void)>) -> c_int;
    fn pthread_setspecific(key: u32, value: *const c_void) -> c_int;
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> c_int;
    fn atexit(f: unsafe extern "C" fn()) -> c_int;
    fn signal(sig: c_int, handler: usize) -> usize;
    fn raise(sig: c_int) -> c_int;
    fn sched_yield() -> c_int;
    fn __errno_location() -> *mut c_int;
}

const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
const O_RDONLY: c_int = 0;
const O_WRONLY: c_int = 1;
const O_CREAT: c_int = 0o100;
const O_EXCL: c_int = 0o200;
const O_APPEND: c_int = 0o2000;
const O_CLOEXEC: c_int = 0o2_000_000;
const EEXIST: c_int = 17;
const EINTR: c_int = 4;
const PROT_RW: c_int = 3;
const MAP_PRIVATE_ANON: c_int = 0x02 | 0x20;
const CLOCK_REALTIME: c_int = 0;
const CLOCK_MONOTONIC: c_int = 1;
const SIG_DFL: usize = 0;
const SIG_ERR: usize = usize::MAX;
/// SIGHUP, SIGQUIT, SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGTERM, SIGXCPU, SIGXFSZ.
const FLUSH_SIGNALS: [c_int; 10] = [1, 3, 4, 6, 7, 8, 11, 15, 24, 25];

// ---- the file format (see loaders/src/binary.rs for the reader) ----

/// Magic bytes shared by spools and traces.
const MAGIC: [u8; 8] = [0x89, b'A', b'V', b'T', b'\r', b'\n', 0x1a, b'\n'];
const FORMAT_VERSION: u8 = 1;
const FILE_KIND_SPOOL: u8 = 1;
const FRAME_META: u8 = 0x01;
const FRAME_SEGMENT: u8 = 0x10;
/// Segment header after the frame's tag and length: stream u32, tid u64, tick u64, ns i64.
const SEGMENT_HEADER_BYTES: usize = 4 + 8 + 8 + 8;

/// Call codes, as in the loader's `CALL_NAMES`.
const CALL_MALLOC: u8 = 0;
const CALL_CALLOC: u8 = 1;
const CALL_REALLOC: u8 = 2;
const CALL_FREE: u8 = 3;
const CALL_MEMALIGN: u8 = 4;
const CALL_POSIX_MEMALIGN: u8 = 5;
const CALL_ALIGNED_ALLOC: u8 = 6;
const CALL_VALLOC: u8 = 7;
const CALL_PVALLOC: u8 = 8;
const CALL_REALLOCARRAY: u8 = 9;
/// Op-byte flag: the event releases its address (size -1 in the text form).
const OP_FREE: u8 = 0x10;

/// Set by cargo, or by `app/build.rs` when it compiles this file with a bare `rustc`.
const TRACER_VERSION: &str = match option_env!("CARGO_PKG_VERSION") {
    Some(v) => v,
    None => "unknown",
};

// ---- per-thread buffers ----

/// Bytes of events a thread buffers before writing them.
const BUF_BYTES: usize = 256 << 10;
/// Largest encoded event: op byte, time, size and address varints.
const MAX_EVENT_BYTES: usize = 1 + 3 * MAX_VARINT_BYTES;
/// Events between two looks at the clock for the periodic flush.
const FLUSH_CHECK_EVENTS: u32 = 4096;
/// Time between periodic flushes of every buffer.
const FLUSH_INTERVAL_NS: i64 = 100_000_000;

/// One thread's buffer, at the start of its own `mmap`ed block with the event bytes after it.
/// Fields the owner alone touches are `Cell`s; the rest are shared with flushing threads.
#[repr(C)]
struct Buf {
    /// Held while a segment of this buffer is written, or the owner resets it.
    lock: AtomicU32,
    /// Owned by a live thread.
    in_use: AtomicBool,
    /// End of the last complete event (release-stored by the owner).
    committed: AtomicUsize,
    /// Bytes already written to the file (under `lock`).
    flushed: AtomicUsize,
    stream: AtomicU32,
    tid: AtomicU64,
    next: AtomicPtr<Buf>,
    prev_tick: Cell<u64>,
    prev_addr: Cell<u64>,
    events_to_check: Cell<u32>,
    data: *mut u8,
}

const BLOCK_BYTES: usize = BUF_BYTES + 4096;

struct ThreadState {
    buf: Cell<*mut Buf>,
    /// Set while this thread is inside the tracer: nested calls go straight to the allocator.
    busy: Cell<bool>,
}

thread_local! {
    static TLS: ThreadState = const {
        ThreadState { buf: Cell::new(null_mut()), busy: Cell::new(false) }
    };
}

// ---- global state ----

const STATE_UNINIT: u32 = 0;
const STATE_INITIALIZING: u32 = 1;
const STATE_TRACING: u32 = 2;
const STATE_OFF: u32 = 3;

static STATE: AtomicU32 = AtomicU32::new(STATE_UNINIT);
static FD: AtomicI32 = AtomicI32::new(-1);
static PID: AtomicI32 = AtomicI32::new(0);
static WRITE_LOCK: AtomicU32 = AtomicU32::new(0);
static BUFFERS: AtomicPtr<Buf> = AtomicPtr::new(null_mut());
static NEXT_STREAM: AtomicU32 = AtomicU32::new(0);
static LAST_FLUSH_NS: AtomicU64 = AtomicU64::new(0);
static KEY: AtomicU32 = AtomicU32::new(u32::MAX);
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

// ---- bootstrap arena for dlsym's allocations ----

const ARENA_BYTES: usize = 64 << 10;

#[repr(C, align(64))]
struct Arena(std::cell::UnsafeCell<[u8; ARENA_BYTES]>);

// SAFETY: blocks are carved out with an atomic bump pointer, so no two callers share bytes.
unsafe impl Sync for Arena {}

static ARENA: Arena = Arena(std::cell::UnsafeCell::new([0; ARENA_BYTES]));
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

fn arena_base() -> usize {
    ARENA.0.get() as usize
}

fn in_arena(p: *mut c_void) -> bool {
    let a = p as usize;
    a >= arena_base() && a < arena_base() + ARENA_BYTES
}

/// Bump allocation with the block size stored in the 8 bytes before the block.
fn arena_alloc(size: usize, align: usize) -> *mut c_void {
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
unsafe fn arena_realloc(old: *mut c_void, size: usize) -> *mut c_void {
    let new = unsafe { malloc(size) };
    if !new.is_null() {
        // SAFETY: arena blocks are preceded by their size.
        let old_size = unsafe { ((old as usize - 8) as *const u64).read_unaligned() } as usize;
        unsafe { ptr::copy_nonoverlapping(old.cast::<u8>(), new.cast::<u8>(), old_size.min(size)) };
    }
    new
}

// ---- time ----

#[inline(always)]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { std::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        clock_ns(CLOCK_MONOTONIC) as u64
    }
}

fn clock_ns(clock: c_int) -> i64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { clock_gettime(clock, &mut ts) };
    ts.tv_sec
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec)
}

// ---- locks (spin then yield; held only around a write) ----

fn lock(l: &AtomicU32) {
    let mut spins = 0u32;
    while l
        .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
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

fn try_lock(l: &AtomicU32) -> bool {
    l.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

fn unlock(l: &AtomicU32) {
    l.store(0, Ordering::Release);
}

// ---- initialisation ----

fn ensure_init() {
    match STATE.compare_exchange(
        STATE_UNINIT,
        STATE_INITIALIZING,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {
            let was_busy = set_busy(true);
            // SAFETY: runs once, with the thread marked busy so nested calls pass through.
            let tracing = unsafe { initialise() };
            STATE.store(
                if tracing { STATE_TRACING } else { STATE_OFF },
                Ordering::Release,
            );
            set_busy(was_busy);
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

fn set_busy(v: bool) -> bool {
    TLS.try_with(|t| t.busy.replace(v)).unwrap_or(true)
}

fn is_busy() -> bool {
    TLS.try_with(|t| t.busy.get()).unwrap_or(true)
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
    // SAFETY: plain syscalls and libc registration calls; nested allocations pass through.
    unsafe {
        if !open_spool() {
            return false;
        }
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
        for sig in FLUSH_SIGNALS {
            let old = signal(sig, on_fatal_signal as *const () as usize);
            if old != SIG_DFL && old != SIG_ERR {
                // The program (or whoever started it) chose this action: keep it.
                signal(sig, old);
            }
        }
    }
    LAST_FLUSH_NS.store(clock_ns(CLOCK_MONOTONIC) as u64, Ordering::Relaxed);
    true
}

/// Creates this process's spool (`<prefix>.<pid>[.<n>].spool`) and writes its header.
unsafe fn open_spool() -> bool {
    // SAFETY: plain syscall.
    let pid = unsafe { getpid() };
    PID.store(pid, Ordering::Release);
    let mut path = [0u8; 4200];
    for attempt in 0..1000u64 {
        let mut w = StackWriter::new(&mut path);
        w.put(PREFIX.get());
        w.put_u8(b'.');
        w.put_dec(pid as u64);
        if attempt > 0 {
            w.put_u8(b'.');
            w.put_dec(attempt);
        }
        w.put(b".spool\0");
        if w.overflowed() {
            return false;
        }
        // SAFETY: the path is NUL-terminated.
        let fd = unsafe {
            open(
                path.as_ptr().cast(),
                O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC,
                0o644 as c_int,
            )
        };
        if fd >= 0 {
            FD.store(fd, Ordering::Release);
            // SAFETY: fd is open.
            return unsafe { write_header(fd, pid) };
        }
        // SAFETY: errno is thread-local and always valid.
        if unsafe { *__errno_location() } != EEXIST {
            let mut msg = [0u8; 4400];
            let mut m = StackWriter::new(&mut msg);
            m.put(b"allocview tracer: cannot create ");
            m.put(path.split(|&b| b == 0).next().unwrap_or(&[]));
            m.put(b"; this process runs untraced\n");
            // SAFETY: writing a message to stderr.
            unsafe { write(2, m.bytes().as_ptr().cast(), m.len()) };
            return false;
        }
    }
    false
}

/// The spool header: magic, version, kind, then a META frame of `key=value` lines.
unsafe fn write_header(fd: c_int, pid: c_int) -> bool {
    let mut buf = [0u8; 8192];
    let mut w = StackWriter::new(&mut buf);
    w.put(&MAGIC);
    w.put_u8(FORMAT_VERSION);
    w.put_u8(FILE_KIND_SPOOL);
    w.put_u8(FRAME_META);
    let len_at = w.len();
    w.put_u32(0);
    let body_at = w.len();
    let tick0 = ticks();
    let ns0 = clock_ns(CLOCK_MONOTONIC);
    let wall0 = clock_ns(CLOCK_REALTIME);
    w.put(b"pid=");
    w.put_dec(pid as u64);
    w.put(b"\nppid=");
    // SAFETY: plain syscall.
    w.put_dec(unsafe { getppid() } as u64);
    w.put(b"\ntick0=");
    w.put_dec(tick0);
    w.put(b"\nmono_ns0=");
    w.put_dec_i64(ns0);
    w.put(b"\nrealtime_ns0=");
    w.put_dec_i64(wall0);
    w.put(b"\nclock=");
    w.put(if cfg!(target_arch = "x86_64") {
        b"tsc".as_slice()
    } else {
        b"monotonic_ns".as_slice()
    });
    w.put(b"\ntracer=allocview_tracer ");
    w.put(TRACER_VERSION.as_bytes());
    // The command line, one `arg=` line per argument (newlines inside become spaces).
    let mut cmdline = [0u8; 4096];
    // SAFETY: reading a procfs file into a stack buffer.
    let n = unsafe {
        let fd = open(c"/proc/self/cmdline".as_ptr(), O_RDONLY | O_CLOEXEC);
        if fd < 0 {
            0
        } else {
            let n = read(fd, cmdline.as_mut_ptr().cast(), cmdline.len());
            close(fd);
            n.max(0) as usize
        }
    };
    for arg in cmdline.get(..n).unwrap_or(&[]).split(|&b| b == 0) {
        if arg.is_empty() {
            continue;
        }
        w.put(b"\narg=");
        for &b in arg {
            w.put_u8(if b == b'\n' { b' ' } else { b });
        }
    }
    w.put(b"\n");
    if w.overflowed() {
        return false;
    }
    let body_len = (w.len() - body_at) as u32;
    w.patch_u32(len_at, body_len);
    // SAFETY: fd is open; the bytes are initialised.
    unsafe { write_all(fd, &[w.bytes()]) }
}

/// Writes every slice, in order, retrying after short writes and EINTR.
unsafe fn write_all(fd: c_int, parts: &[&[u8]]) -> bool {
    let mut iov = [
        IoVec {
            base: ptr::null(),
            len: 0,
        },
        IoVec {
            base: ptr::null(),
            len: 0,
        },
    ];
    let mut n = 0;
    for (slot, part) in iov.iter_mut().zip(parts) {
        slot.base = part.as_ptr().cast();
        slot.len = part.len();
        n += 1;
    }
    let mut first = 0usize;
    while first < n {
        // SAFETY: the iovecs point into live slices.
        let done = unsafe { writev(fd, iov.as_ptr().add(first), (n - first) as c_int) };
        if done < 0 {
            // SAFETY: errno is thread-local.
            if unsafe { *__errno_location() } == EINTR {
                continue;
            }
            return false;
        }
        let mut done = done as usize;
        while first < n {
            let Some(v) = iov.get_mut(first) else { break };
            if done >= v.len {
                done -= v.len;
                first += 1;
            } else {
                // SAFETY: advancing within the slice.
                v.base = unsafe { v.base.cast::<u8>().add(done) }.cast();
                v.len -= done;
                break;
            }
        }
    }
    true
}

// ---- buffers ----

/// The calling thread's buffer, taking one from the pool (or mapping a new one) on first use.
unsafe fn thread_buf(t: &ThreadState) -> Option<&'static Buf> {
    let b = t.buf.get();
    if !b.is_null() {
        // SAFETY: buffers are never unmapped.
        return Some(unsafe { &*b });
    }
    let b = acquire_buf()?;
    t.buf.set(ptr::from_ref(b).cast_mut());
    let key = KEY.load(Ordering::Acquire);
    if key != u32::MAX {
        // SAFETY: the key was created by this library; the value is only read by thread_exit.
        unsafe { pthread_setspecific(key, ptr::from_ref(b).cast()) };
    }
    Some(b)
}

fn acquire_buf() -> Option<&'static Buf> {
    let mut p = BUFFERS.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: buffers are never unmapped.
        let b = unsafe { &*p };
        if b.in_use
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            start_stream(b);
            return Some(b);
        }
        p = b.next.load(Ordering::Acquire);
    }
    // SAFETY: a fresh anonymous mapping.
    let block = unsafe { mmap(null_mut(), BLOCK_BYTES, PROT_RW, MAP_PRIVATE_ANON, -1, 0) };
    if block as isize == -1 || block.is_null() {
        return None;
    }
    let b = block.cast::<Buf>();
    // SAFETY: the mapping is large enough and suitably aligned (page-aligned).
    unsafe {
        b.write(Buf {
            lock: AtomicU32::new(0),
            in_use: AtomicBool::new(true),
            committed: AtomicUsize::new(0),
            flushed: AtomicUsize::new(0),
            stream: AtomicU32::new(0),
            tid: AtomicU64::new(0),
            next: AtomicPtr::new(null_mut()),
            prev_tick: Cell::new(0),
            prev_addr: Cell::new(0),
            events_to_check: Cell::new(FLUSH_CHECK_EVENTS),
            data: block.cast::<u8>().add(4096),
        });
    }
    // SAFETY: just initialised.
    let buf = unsafe { &*b };
    start_stream(buf);
    let mut head = BUFFERS.load(Ordering::Acquire);
    loop {
        buf.next.store(head, Ordering::Relaxed);
        match BUFFERS.compare_exchange_weak(head, b, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(buf),
            Err(now) => head = now,
        }
    }
}

/// Starts a new event stream in `b` for the calling thread (deltas restart from zero).
fn start_stream(b: &Buf) {
    lock(&b.lock);
    b.committed.store(0, Ordering::Relaxed);
    b.flushed.store(0, Ordering::Relaxed);
    b.stream.store(
        NEXT_STREAM.fetch_add(1, Ordering::Relaxed),
        Ordering::Relaxed,
    );
    // SAFETY: plain syscall.
    b.tid.store(unsafe { gettid() } as u64, Ordering::Relaxed);
    b.prev_tick.set(0);
    b.prev_addr.set(0);
    b.events_to_check.set(FLUSH_CHECK_EVENTS);
    unlock(&b.lock);
}

/// Writes the unwritten complete events of `b` as one segment. Call with `b.lock` held.
fn write_segment(b: &Buf, blocking: bool) {
    let end = b.committed.load(Ordering::Acquire);
    let start = b.flushed.load(Ordering::Relaxed);
    if end <= start {
        return;
    }
    let fd = FD.load(Ordering::Acquire);
    if fd < 0 {
        b.flushed.store(end, Ordering::Relaxed);
        return;
    }
    if blocking {
        lock(&WRITE_LOCK);
    } else if !try_lock(&WRITE_LOCK) {
        return;
    }
    let mut head = [0u8; 1 + 4 + SEGMENT_HEADER_BYTES];
    let mut w = StackWriter::new(&mut head);
    w.put_u8(FRAME_SEGMENT);
    w.put_u32((SEGMENT_HEADER_BYTES + (end - start)) as u32);
    w.put_u32(b.stream.load(Ordering::Relaxed));
    w.put_u64(b.tid.load(Ordering::Relaxed));
    w.put_u64(ticks());
    w.put_u64(clock_ns(CLOCK_MONOTONIC) as u64);
    let header_len = w.len();
    // SAFETY: [start, end) holds complete events published by the owner's release store.
    let events = unsafe { std::slice::from_raw_parts(b.data.add(start), end - start) };
    // SAFETY: fd is the spool.
    let ok = unsafe { write_all(fd, &[head.get(..header_len).unwrap_or(&[]), events]) };
    if !ok {
        // A full disk or a closed descriptor: stop tracing rather than write torn records.
        FD.store(-1, Ordering::Release);
    }
    unlock(&WRITE_LOCK);
    b.flushed.store(end, Ordering::Relaxed);
}

/// The owner's flush of its own buffer: writes it and starts again at the beginning.
fn flush_own(b: &Buf) {
    lock(&b.lock);
    write_segment(b, true);
    b.committed.store(0, Ordering::Relaxed);
    b.flushed.store(0, Ordering::Relaxed);
    unlock(&b.lock);
}

/// Writes the complete events of every buffer. `blocking` is false in signal handlers, where a
/// lock held by the interrupted code must not be waited for.
fn flush_all(blocking: bool) {
    let mut p = BUFFERS.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: buffers are never unmapped.
        let b = unsafe { &*p };
        if blocking {
            lock(&b.lock);
            write_segment(b, true);
            unlock(&b.lock);
        } else if try_lock(&b.lock) {
            write_segment(b, false);
            unlock(&b.lock);
        }
        p = b.next.load(Ordering::Acquire);
    }
    LAST_FLUSH_NS.store(clock_ns(CLOCK_MONOTONIC) as u64, Ordering::Relaxed);
}

// ---- recording ----

/// Enters the tracer for one call: `Some` when this call is to be recorded.
#[inline(always)]
fn enter() -> Option<&'static ThreadState> {
    if STATE.load(Ordering::Acquire) != STATE_TRACING {
        return None;
    }
    TLS.try_with(|t| {
        if t.busy.get() {
            None
        } else {
            t.busy.set(true);
            // SAFETY: thread-locals live as long as their thread; the reference never leaves
            // the wrapper that took it.
            Some(unsafe { &*ptr::from_ref(t) })
        }
    })
    .ok()
    .flatten()
}

#[inline(always)]
fn leave(t: &ThreadState) {
    t.busy.set(false);
}

/// Appends one event to the calling thread's buffer.
#[inline(always)]
fn record(t: &ThreadState, op: u8, size: u64, addr: u64, tick: u64) {
    // SAFETY: the thread state belongs to the calling thread.
    let Some(b) = (unsafe { thread_buf(t) }) else {
        return;
    };
    let mut pos = b.committed.load(Ordering::Relaxed);
    if pos + MAX_EVENT_BYTES > BUF_BYTES {
        flush_own(b);
        pos = 0;
    }
    // SAFETY: pos + MAX_EVENT_BYTES <= BUF_BYTES, inside the buffer; only the owner writes
    // beyond `committed`.
    unsafe {
        let p = b.data.add(pos);
        p.write(op);
        let mut n = 1;
        n += put_varint(
            p.add(n),
            zigzag(tick.wrapping_sub(b.prev_tick.get()) as i64),
        );
        if op & OP_FREE == 0 {
            n += put_varint(p.add(n), size);
        }
        n += put_varint(
            p.add(n),
            zigzag(addr.wrapping_sub(b.prev_addr.get()) as i64),
        );
        b.prev_tick.set(tick);
        b.prev_addr.set(addr);
        b.committed.store(pos + n, Ordering::Release);
    }
    let left = b.events_to_check.get() - 1;
    if left == 0 {
        b.events_to_check.set(FLUSH_CHECK_EVENTS);
        let now = clock_ns(CLOCK_MONOTONIC);
        let last = LAST_FLUSH_NS.load(Ordering::Relaxed) as i64;
        if now - last > FLUSH_INTERVAL_NS
            && LAST_FLUSH_NS
                .compare_exchange(
                    last as u64,
                    now as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            flush_all(true);
        }
    } else {
        b.events_to_check.set(left);
    }
}

#[inline(always)]
fn record_alloc(t: &ThreadState, call: u8, size: usize, p: *mut c_void) {
    record(t, call, size as u64, p as u64, ticks());
}

#[inline(always)]
fn record_free(t: &ThreadState, call: u8, p: *mut c_void, tick: u64) {
    record(t, call | OP_FREE, 0, p as u64, tick);
}

// ---- the interposed functions ----

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let Some(f) = real_fn!(malloc, MallocFn) else {
        return arena_alloc(size, 16);
    };
    let Some(t) = enter() else {
        return unsafe { f(size) };
    };
    let p = unsafe { f(size) };
    record_alloc(t, CALL_MALLOC, size, p);
    leave(t);
    p
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if in_arena(p) {
        return;
    }
    let Some(f) = real_fn!(free, FreeFn) else {
        return;
    };
    let Some(t) = enter() else {
        return unsafe { f(p) };
    };
    let tick = ticks();
    unsafe { f(p) };
    record_free(t, CALL_FREE, p, tick);
    leave(t);
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
    let Some(t) = enter() else {
        return unsafe { f(n, size) };
    };
    let p = unsafe { f(n, size) };
    record_alloc(t, CALL_CALLOC, n.saturating_mul(size), p);
    leave(t);
    p
}

/// Records a realloc-like call: the free of the old block (stamped before the call) and the
/// allocation of the new one.
#[inline(always)]
fn record_realloc(
    t: &ThreadState,
    call: u8,
    old: *mut c_void,
    size: usize,
    new: *mut c_void,
    tick: u64,
) {
    if old.is_null() {
        record_alloc(t, call, size, new);
    } else if new.is_null() {
        if size == 0 {
            // realloc(p, 0) freed p (glibc).
            record_free(t, call, old, tick);
        } else {
            // Failed: the old block is untouched.
            record_alloc(t, call, size, new);
        }
    } else {
        record_free(t, call, old, tick);
        record_alloc(t, call, size, new);
    }
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
    let Some(t) = enter() else {
        return unsafe { f(old, size) };
    };
    let tick = ticks();
    let new = unsafe { f(old, size) };
    record_realloc(t, CALL_REALLOC, old, size, new, tick);
    leave(t);
    new
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
    let Some(t) = enter() else {
        return unsafe { f(old, n, size) };
    };
    let tick = ticks();
    let new = unsafe { f(old, n, size) };
    record_realloc(t, CALL_REALLOCARRAY, old, n.saturating_mul(size), new, tick);
    leave(t);
    new
}

macro_rules! aligned_wrapper {
    ($name:ident, $slot:ident, $code:expr) => {
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name(align: usize, size: usize) -> *mut c_void {
            let Some(f) = real_fn!($slot, MemalignFn) else {
                return arena_alloc(size, align);
            };
            let Some(t) = enter() else {
                return unsafe { f(align, size) };
            };
            let p = unsafe { f(align, size) };
            record_alloc(t, $code, size, p);
            leave(t);
            p
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
            let Some(t) = enter() else {
                return unsafe { f(size) };
            };
            let p = unsafe { f(size) };
            record_alloc(t, $code, size, p);
            leave(t);
            p
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
    let Some(t) = enter() else {
        return unsafe { f(out, align, size) };
    };
    let rc = unsafe { f(out, align, size) };
    let p = if rc == 0 {
        unsafe { out.read() }
    } else {
        null_mut()
    };
    record_alloc(t, CALL_POSIX_MEMALIGN, size, p);
    leave(t);
    rc
}

// ---- process lifecycle ----

/// Flushes every buffer when this is the process that opened the spool (not a `vfork` child
/// sharing our memory, which must leave the parent's buffers alone).
fn flush_if_ours() {
    if STATE.load(Ordering::Acquire) == STATE_TRACING
        // SAFETY: plain syscall.
        && unsafe { getpid() } == PID.load(Ordering::Acquire)
    {
        let was = set_busy(true);
        flush_all(true);
        set_busy(was);
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

unsafe extern "C" fn at_exit() {
    flush_if_ours();
}

unsafe extern "C" fn fini() {
    flush_if_ours();
}

unsafe extern "C" fn init() {
    ensure_init();
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: unsafe extern "C" fn() = init;

#[used]
#[unsafe(link_section = ".fini_array")]
static FINI: unsafe extern "C" fn() = fini;

/// The pthread key destructor: the thread is ending, so its events are written and its buffer
/// goes back to the pool.
unsafe extern "C" fn thread_exit(value: *mut c_void) {
    let b = value.cast::<Buf>();
    if b.is_null() {
        return;
    }
    // SAFETY: the value is a buffer this library registered.
    let b = unsafe { &*b };
    flush_own(b);
    let _ = TLS.try_with(|t| {
        if t.buf.get() == ptr::from_ref(b).cast_mut() {
            t.buf.set(null_mut());
        }
    });
    b.in_use.store(false, Ordering::Release);
}

unsafe extern "C" fn on_fatal_signal(sig: c_int) {
    if STATE.load(Ordering::Acquire) == STATE_TRACING
        // SAFETY: plain syscall.
        && unsafe { getpid() } == PID.load(Ordering::Acquire)
    {
        let was = set_busy(true);
        flush_all(false);
        set_busy(was);
    }
    // SAFETY: restoring the default action and re-raising ends the process as it would have
    // ended without us.
    unsafe {
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

unsafe extern "C" fn before_fork() {
    // No segment may be half-written when the child's copy of memory is taken.
    lock(&WRITE_LOCK);
}

unsafe extern "C" fn after_fork_parent() {
    unlock(&WRITE_LOCK);
}

unsafe extern "C" fn after_fork_child() {
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
    // threads do not exist in the child: their buffers return to the pool.
    let mine = TLS.try_with(|t| t.buf.get()).unwrap_or(null_mut());
    let mut p = BUFFERS.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: buffers are never unmapped.
        let b = unsafe { &*p };
        b.lock.store(0, Ordering::Relaxed);
        b.committed.store(0, Ordering::Relaxed);
        b.flushed.store(0, Ordering::Relaxed);
        if p != mine {
            b.in_use.store(false, Ordering::Relaxed);
        }
        p = b.next.load(Ordering::Acquire);
    }
    NEXT_STREAM.store(0, Ordering::Relaxed);
    if !mine.is_null() {
        // SAFETY: as above.
        start_stream(unsafe { &*mine });
    }
    // SAFETY: a plain open of the child's own file.
    if !unsafe { open_spool() } {
        STATE.store(STATE_OFF, Ordering::Release);
    }
    LAST_FLUSH_NS.store(clock_ns(CLOCK_MONOTONIC) as u64, Ordering::Relaxed);
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
