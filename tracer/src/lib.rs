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
//!   second one takes a buffer, every event from then on (all threads) also carries an order
//!   key, the TSC read with `rdtscp` (after an allocation's real call, before a free's; see
//!   [`order_key`]), as a zigzag prefix-varint difference from its thread's previous key; the
//!   loader orders the events of different threads that share a time by key, and the few
//!   without one (the period in which keys start) by causality. Not on other architectures,
//!   nor where the TSC cannot order events across CPUs ([`KEYS_USABLE`]): there, every period
//!   is ordered by causality, which can give up under heavy hand-over of blocks between
//!   threads (see `loaders/src/binary.rs`).
//!   The clock thread never records, blocks every signal, holds no lock of the program's and
//!   ends (letting the process exit) when it is the last thread left.
//! - Flushing: the owner thread publishes the end of its last complete event with a release
//!   store; any thread may flush another's buffer up to that point under the buffer's lock
//!   (the owner only ever writes beyond it). The clock thread flushes every buffer every
//!   100 ms, so an idle thread's events reach the file too. Everything is flushed at `exit` (an
//!   `atexit` handler and a `.fini_array` destructor), `_exit`/`_Exit`, before `execve`/
//!   `execv`/`execvp`/`execvpe`/`fexecve`, at thread exit (a `pthread_key` destructor, which
//!   also returns the buffer to a pool), and on fatal signals (`SIGTERM`, `SIGHUP`, `SIGQUIT`,
//!   `SIGABRT`, `SIGSEGV`, `SIGBUS`, `SIGFPE`, `SIGILL`, `SIGXCPU`, `SIGXFSZ`, only where the
//!   program started with the default action; the handler flushes, restores the default and
//!   re-raises).
//! - What can be lost: events of the last moments of a process killed by `SIGKILL`, or by
//!   `SIGINT` when the program does not handle it (not caught: programs such as Python only
//!   install their own handler when `SIGINT` has its default action): at most the last 100 ms;
//!   events of other threads racing with `exit` after its final flush; events after the
//!   `.fini_array` destructor; events before `exec` through `execl`, `execlp` and `execle`,
//!   which glibc routes to `execve` internally (the periodic flush bounds that loss as above).
//! - Hard cases: allocations made by `dlsym` while the real functions are resolved come from a
//!   static 64 KiB bootstrap arena (never traced, never freed); calls made from inside the
//!   tracer (or from a signal handler interrupting it) go straight to the real functions;
//!   `fork` (through `pthread_atfork`) gives the child its own file, an empty buffer and a
//!   clock thread of its own, since the parent writes the events from before the fork; the
//!   tracer itself never calls `malloc`.
//! - Thread-local state: one word read per call. On x86-64 it lives in the static TLS block
//!   (initial-exec model, declared in assembly below: stable Rust has no TLS-model attribute),
//!   which is valid because a preloaded library is loaded at start-up; elsewhere it is a
//!   `thread_local!`.

#![cfg(all(target_os = "linux", target_pointer_width = "64"))]
#![allow(clippy::missing_safety_doc)]

#[cfg(target_arch = "x86_64")]
mod cfi;
pub mod encode;
#[cfg(target_arch = "x86_64")]
mod modules;
#[cfg(target_arch = "x86_64")]
mod stacks;
#[cfg(target_arch = "x86_64")]
mod unwind;

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

/// `sigset_t` (1024 bits in glibc).
type SigSet = [u64; 16];
/// `pthread_attr_t` (56 bytes on x86-64, 64 on aarch64).
type PthreadAttr = [u64; 8];

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
    fn nanosleep(req: *const Timespec, rem: *mut Timespec) -> c_int;
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
    fn pthread_create(
        thread: *mut u64,
        attr: *const PthreadAttr,
        start: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
        arg: *mut c_void,
    ) -> c_int;
    fn pthread_attr_init(attr: *mut PthreadAttr) -> c_int;
    fn pthread_attr_destroy(attr: *mut PthreadAttr) -> c_int;
    fn pthread_attr_setstacksize(attr: *mut PthreadAttr, size: usize) -> c_int;
    fn pthread_attr_setdetachstate(attr: *mut PthreadAttr, state: c_int) -> c_int;
    fn pthread_sigmask(how: c_int, set: *const SigSet, old: *mut SigSet) -> c_int;
    fn prctl(option: c_int, ...) -> c_int;
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
const SIG_SETMASK: c_int = 2;
const PTHREAD_CREATE_DETACHED: c_int = 1;
const PR_SET_NAME: c_int = 15;
/// SIGHUP, SIGQUIT, SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGTERM, SIGXCPU, SIGXFSZ.
const FLUSH_SIGNALS: [c_int; 10] = [1, 3, 4, 6, 7, 8, 11, 15, 24, 25];

// ---- the file format (see loaders/src/binary.rs for the reader) ----

/// Magic bytes shared by spools and traces.
const MAGIC: [u8; 8] = [0x89, b'A', b'V', b'T', b'\r', b'\n', 0x1a, b'\n'];
const FORMAT_VERSION: u8 = 1;
const FILE_KIND_SPOOL: u8 = 1;
const FRAME_META: u8 = 0x01;
const FRAME_SEGMENT: u8 = 0x10;
/// A module of the process (see `modules.rs`), written when the unwinder first meets it.
#[cfg(target_arch = "x86_64")]
const FRAME_MODULE: u8 = 0x11;
/// A flush mark: the time (u64) read before the clock thread wrote out every buffer.
const FRAME_FLUSHED: u8 = 0x12;
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
/// Spool op byte of a time change: a zigzag varint of the time's difference follows, and the
/// events after it have that time (`loaders/src/binary.rs`, spool event encoding 2).
const OP_TIME: u8 = 0x0f;
/// Spool op-byte bits 5-7: the address delta's length code ([`put_short_u64`]).
const OP_ADDR_SHIFT: u8 = 5;
/// Spool op byte that switches its stream to keyed events: from it on, every event is
/// followed by its order key (encoding 3; written once per stream, see [`MULTI_THREAD`]).
const OP_KEYED: u8 = 0x0e;
/// The spool's event encoding, named in its META.
const SPOOL_EVENTS_ENCODING: u64 = 3;
/// The encoding with stacks: as 3, and every allocation event carries a stack id (a prefix
/// varint after the address, before the key; 0 = none), and a stream may hold stack
/// definitions (op byte `0x0d`, see `stacks.rs`).
const SPOOL_EVENTS_ENCODING_STACKS: u64 = 4;

/// Set by cargo, or by `app/build.rs` when it compiles this file with a bare `rustc`.
const TRACER_VERSION: &str = match option_env!("CARGO_PKG_VERSION") {
    Some(v) => v,
    None => "unknown",
};

// ---- per-thread buffers ----

/// Bytes of events a thread buffers before writing them.
const BUF_BYTES: usize = 256 << 10;
/// Most bytes one record may write: a time change (op byte, varint), the switch to keyed
/// events (one op byte), then the event's op byte, size, address and order key (the size and
/// address stored as whole words, past their end; the key after them).
const MAX_EVENT_BYTES: usize = 1
    + MAX_VARINT_BYTES
    + 1
    + 1
    + PREFIX_VARINT_STORE_BYTES
    + SHORT_U64_STORE_BYTES
    + PREFIX_VARINT_STORE_BYTES
    + PREFIX_VARINT_STORE_BYTES;
/// Where the event bytes start in a buffer's block (the [`Buf`] header takes the first page).
const DATA_OFFSET_BYTES: usize = 4096;
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

// ---- thread-local state ----

/// A thread's view of the tracer, with the state of its event stream: kept here rather than
/// in the [`Buf`] so that the hot path's loads depend on no earlier load (only the cursor
/// carries over from one event to the next). All-zero bytes are its initial state.
#[repr(C)]
struct ThreadState {
    /// Where the next event goes in the thread's buffer, or null when this call must not
    /// record: the thread has no buffer yet, a call of this thread is already inside the
    /// tracer (the hot path clears it for the length of a record, so a signal handler's calls
    /// then pass through), or the thread never records (the clock thread).
    cursor: Cell<*mut u8>,
    /// The buffer's [`Buf::last_start`]: beyond it the buffer is full.
    last_start: Cell<*mut u8>,
    /// The thread's buffer, once it has one.
    buf: Cell<*mut Buf>,
    /// Time of the stream's previous event (0 at its start).
    prev_ns: Cell<u64>,
    /// Address of the stream's previous event (0 at its start).
    prev_addr: Cell<u64>,
    /// Order key of the stream's previous keyed event (0 at its start).
    prev_key: Cell<u64>,
    /// The stream has switched to keyed events ([`OP_KEYED`] is written).
    keyed: Cell<bool>,
    /// Set while tracer code outside the hot path runs (initialisation, flushes, taking a
    /// buffer), and for good on the clock thread: nested calls go straight to the allocator.
    busy: Cell<bool>,
    /// The thread's stack, `[stack_lo, stack_hi)`, once the unwinder has asked (0: not yet).
    stack_lo: Cell<u64>,
    stack_hi: Cell<u64>,
}

impl ThreadState {
    /// Starts writing a new stream at the beginning of `b`, this thread's buffer.
    fn start_at(&self, b: &Buf) {
        self.prev_ns.set(0);
        self.prev_addr.set(0);
        self.prev_key.set(0);
        self.keyed.set(false);
        self.last_start.set(b.last_start());
        self.buf.set(ptr::from_ref(b).cast_mut());
        self.cursor.set(b.data());
    }

    /// Stops recording on this thread (its buffer is gone or tracing is off).
    fn detach(&self) {
        self.cursor.set(null_mut());
        self.buf.set(null_mut());
    }
}

/// Bytes reserved for [`ThreadState`] in the static TLS block.
#[cfg(target_arch = "x86_64")]
const TLS_BYTES: usize = 128;

#[cfg(target_arch = "x86_64")]
const _: () = assert!(std::mem::size_of::<ThreadState>() <= TLS_BYTES);

// The thread-local block, in `.tbss` (zero-initialised per thread). Declared here because
// `thread_local!` in a shared object uses the general-dynamic model, a `__tls_get_addr` call
// per access; the initial-exec access below is two instructions.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 4",
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
fn tls() -> Option<&'static ThreadState> {
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
            busy: Cell::new(false),
            stack_lo: Cell::new(0),
            stack_hi: Cell::new(0),
        }
    };
}

/// The calling thread's state.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn tls() -> Option<&'static ThreadState> {
    // SAFETY: thread-locals live as long as their thread, and the reference never leaves it.
    TLS.try_with(|t| unsafe { &*ptr::from_ref(t) }).ok()
}

/// A non-zero number naming the calling thread, for the locks.
fn self_id() -> usize {
    tls().map_or(1, |t| ptr::from_ref(t) as usize)
}

/// Marks the calling thread busy (nested calls go straight to the allocator) until dropped.
struct Busy {
    t: Option<&'static ThreadState>,
    cursor: *mut u8,
    buf: *mut Buf,
    was: bool,
}

impl Busy {
    fn new() -> Self {
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

fn is_busy() -> bool {
    tls().is_none_or(|t| t.busy.get())
}

// ---- global state ----

const STATE_UNINIT: u32 = 0;
const STATE_INITIALIZING: u32 = 1;
const STATE_TRACING: u32 = 2;
const STATE_OFF: u32 = 3;

static STATE: AtomicU32 = AtomicU32::new(STATE_UNINIT);
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

#[inline(always)]
fn in_arena(p: *mut c_void) -> bool {
    // One comparison: addresses below the arena wrap around to large differences.
    (p as usize).wrapping_sub(arena_base()) < ARENA_BYTES
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

/// How often the clock thread advances [`NOW_NS`]: the resolution of event times. It costs
/// the process one wake-up per period (measured in issue 8's closing note).
const CLOCK_PERIOD_NS: i64 = 1_000_000;
/// Clock periods between two flushes of every buffer by the clock thread (100 ms).
const FLUSH_EVERY_PERIODS: u32 = 100;

/// `CLOCK_MONOTONIC` nanoseconds as of the clock thread's latest tick; what events carry.
/// Only one thread stores it at a time (initialisation, then the clock thread; in a fork
/// child the fork handler, then the child's clock thread), always a fresh reading, so it
/// never goes back.
static NOW_NS: AtomicU64 = AtomicU64::new(0);

/// The time an event carries.
#[inline(always)]
fn now_ns() -> u64 {
    NOW_NS.load(Ordering::Relaxed)
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

fn tick_clock() {
    NOW_NS.store(clock_ns(CLOCK_MONOTONIC) as u64, Ordering::Relaxed);
}

// ---- order keys (several threads) ----

/// Set when a second application thread takes a buffer (its first recorded call; the clock
/// thread never records), on machines with usable keys ([`KEYS_USABLE`]). From then on every
/// event also carries an order key, which orders the events of different threads that share
/// a clock period exactly. While one thread records, events have none: the key read costs
/// more than the rest of the record, and one thread's order is the order of its buffer.
/// Never cleared: a stream that carries keys carries them to its end.
static MULTI_THREAD: AtomicBool = AtomicBool::new(false);
/// Application threads that have taken a buffer so far.
static RECORDING_THREADS: AtomicU32 = AtomicU32::new(0);
/// The CPU has `rdtscp` and an invariant TSC (one rate, counting in every power state); with
/// Linux's TSC clocksource, which it only keeps when the TSC is synchronised across CPUs,
/// that makes keys of different CPUs comparable. Set at initialisation.
static KEYS_USABLE: AtomicBool = AtomicBool::new(false);

#[inline(always)]
fn multi_thread() -> bool {
    MULTI_THREAD.load(Ordering::Relaxed)
}

/// Called when a thread takes its first buffer.
fn note_recording_thread() {
    if RECORDING_THREADS.fetch_add(1, Ordering::Relaxed) >= 1 && KEYS_USABLE.load(Ordering::Relaxed)
    {
        MULTI_THREAD.store(true, Ordering::Relaxed);
    }
}

/// Whether this machine's TSC can order events across CPUs (see [`KEYS_USABLE`]).
#[cfg(target_arch = "x86_64")]
fn keys_usable() -> bool {
    use std::arch::x86_64::__cpuid;
    // SAFETY: cpuid exists on every x86-64 CPU; leaves above the maximum return zeros.
    #[allow(unused_unsafe)]
    let (max_ext, ext1, ext7) = unsafe {
        let max_ext = __cpuid(0x8000_0000).eax;
        (max_ext, __cpuid(0x8000_0001).edx, __cpuid(0x8000_0007).edx)
    };
    let rdtscp = max_ext >= 0x8000_0001 && ext1 & (1 << 27) != 0;
    let invariant = max_ext >= 0x8000_0007 && ext7 & (1 << 8) != 0;
    rdtscp && invariant && tsc_is_the_clocksource()
}

/// Linux marks the TSC unstable, and switches the clocksource away from it, when it finds
/// the CPUs' counters out of step.
#[cfg(target_arch = "x86_64")]
fn tsc_is_the_clocksource() -> bool {
    let mut name = [0u8; 64];
    // SAFETY: reading a sysfs file into a stack buffer.
    let n = unsafe {
        let fd = open(
            c"/sys/devices/system/clocksource/clocksource0/current_clocksource".as_ptr(),
            O_RDONLY | O_CLOEXEC,
        );
        if fd < 0 {
            return false;
        }
        let n = read(fd, name.as_mut_ptr().cast(), name.len());
        close(fd);
        n
    };
    usize::try_from(n)
        .ok()
        .and_then(|n| name.get(..n))
        .is_some_and(|s| s.trim_ascii_end() == b"tsc")
}

/// Elsewhere events never carry keys: events of several threads that share a clock period
/// are ordered by the loader's causal search, as before keys existed.
#[cfg(not(target_arch = "x86_64"))]
fn keys_usable() -> bool {
    false
}

/// The order key: the TSC, read with `rdtscp`, which waits until every earlier instruction
/// has executed and its loads are done. An allocation reads it after the real call, so when
/// the allocator hands it a block another thread freed, its key is later than that free;
/// a free reads it before the real call, which the same wait keeps after whatever gave this
/// thread the block (a plain `rdtsc` could run ahead of the load that took the block from a
/// queue, and so come before the allocation that another thread made of it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn order_key() -> Option<u64> {
    let mut aux = 0u32;
    // SAFETY: only called once MULTI_THREAD is set, which requires rdtscp (keys_usable).
    #[allow(unused_unsafe)]
    Some(unsafe { std::arch::x86_64::__rdtscp(&mut aux) })
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn order_key() -> Option<u64> {
    None
}

/// The key an event carries: one when several threads record, read where the call is.
#[inline(always)]
fn event_key() -> Option<u64> {
    if multi_thread() { order_key() } else { None }
}

// ---- locks (spin then yield; held only around a write) ----

fn lock(l: &AtomicUsize) {
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
const HANDLER_LOCK_WAIT_NS: i64 = 200_000_000;

/// Takes `l` in a signal handler: waits (a bounded time) while another thread holds it, and
/// gives up at once when the interrupted code of this very thread holds it.
fn lock_in_handler(l: &AtomicUsize) -> bool {
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

fn unlock(l: &AtomicUsize) {
    l.store(0, Ordering::Release);
}

/// How a flush waits for the locks it needs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Block,
    /// In a signal handler: see [`lock_in_handler`].
    Handler,
}

fn take(l: &AtomicUsize, wait: Wait) -> bool {
    match wait {
        Wait::Block => {
            lock(l);
            true
        }
        Wait::Handler => lock_in_handler(l),
    }
}

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
    tick_clock();
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
    // Event times are `CLOCK_MONOTONIC` nanoseconds already: the calibration line has slope 1.
    let ns0 = clock_ns(CLOCK_MONOTONIC);
    let wall0 = clock_ns(CLOCK_REALTIME);
    w.put(b"pid=");
    w.put_dec(pid as u64);
    w.put(b"\nppid=");
    // SAFETY: plain syscall.
    w.put_dec(unsafe { getppid() } as u64);
    w.put(b"\ntick0=");
    w.put_dec_i64(ns0);
    w.put(b"\nmono_ns0=");
    w.put_dec_i64(ns0);
    w.put(b"\nrealtime_ns0=");
    w.put_dec_i64(wall0);
    w.put(b"\nclock=monotonic_coarse_ns\nclock_resolution_ns=");
    w.put_dec(CLOCK_PERIOD_NS as u64);
    w.put(b"\nevents=");
    if stacks_on() {
        w.put_dec(SPOOL_EVENTS_ENCODING_STACKS);
        w.put(b"\nstacks=dwarf_cfi\narch=x86_64");
    } else {
        w.put_dec(SPOOL_EVENTS_ENCODING);
    }
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

/// Writes one whole frame to the spool (under the write lock, so no segment is cut). Skipped
/// when this very thread holds the lock (an allocation made by another `pthread_atfork`
/// prepare handler after ours took it): waiting would never end.
fn write_frame(frame: &[u8]) {
    let fd = FD.load(Ordering::Acquire);
    if fd < 0 || WRITE_LOCK.load(Ordering::Relaxed) == self_id() {
        return;
    }
    lock(&WRITE_LOCK);
    // SAFETY: fd is the spool.
    if !unsafe { write_all(fd, &[frame]) } {
        FD.store(-1, Ordering::Release);
    }
    unlock(&WRITE_LOCK);
}

/// Writes a flush mark: every event of a thread that read a time before `before_ns` and
/// published its event before the flush that followed is in the file, before the mark. A
/// reader converting the spool while the program runs emits the events before a mark (with a
/// period's grace for calls held up between reading the time and writing their event).
fn write_flush_mark(before_ns: u64) {
    let mut frame = [0u8; 1 + 4 + 8];
    let mut w = StackWriter::new(&mut frame);
    w.put_u8(FRAME_FLUSHED);
    w.put_u32(8);
    w.put_u64(before_ns);
    write_frame(w.bytes());
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

/// Gives the calling thread a buffer, from the pool or a new mapping. Called on the thread's
/// first recorded call, with the thread marked busy.
fn take_buf(t: &ThreadState) -> Option<&'static Buf> {
    let b = acquire_buf()?;
    t.start_at(b);
    note_recording_thread();
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
            lock: AtomicUsize::new(0),
            in_use: AtomicBool::new(true),
            committed: AtomicUsize::new(0),
            flushed: AtomicUsize::new(0),
            stream: AtomicU32::new(0),
            tid: AtomicU64::new(0),
            next: AtomicPtr::new(null_mut()),
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

/// Starts a new event stream in `b` for the calling thread (deltas restart from zero: the
/// caller resets its [`ThreadState`] with [`ThreadState::start_at`]).
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
    unlock(&b.lock);
}

/// Writes the unwritten complete events of `b` as one segment. Call with `b.lock` held.
fn write_segment(b: &Buf, wait: Wait) {
    let end = b.committed_len();
    let start = b.flushed.load(Ordering::Relaxed);
    if end <= start {
        return;
    }
    let fd = FD.load(Ordering::Acquire);
    if fd < 0 {
        b.flushed.store(end, Ordering::Relaxed);
        return;
    }
    if !take(&WRITE_LOCK, wait) {
        return;
    }
    let mut head = [0u8; 1 + 4 + SEGMENT_HEADER_BYTES];
    let mut w = StackWriter::new(&mut head);
    w.put_u8(FRAME_SEGMENT);
    w.put_u32((SEGMENT_HEADER_BYTES + (end - start)) as u32);
    w.put_u32(b.stream.load(Ordering::Relaxed));
    w.put_u64(b.tid.load(Ordering::Relaxed));
    // The calibration point: event time and `CLOCK_MONOTONIC` are one clock now, read apart.
    w.put_u64(now_ns());
    w.put_u64(clock_ns(CLOCK_MONOTONIC) as u64);
    let header_len = w.len();
    // SAFETY: [start, end) holds complete events published by the owner's release store.
    let events = unsafe { std::slice::from_raw_parts(b.data().add(start), end - start) };
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
#[cold]
#[inline(never)]
fn flush_own(b: &Buf) {
    lock(&b.lock);
    write_segment(b, Wait::Block);
    b.committed.store(0, Ordering::Relaxed);
    b.flushed.store(0, Ordering::Relaxed);
    unlock(&b.lock);
}

/// Writes the complete events of every buffer.
fn flush_all(wait: Wait) {
    let mut p = BUFFERS.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: buffers are never unmapped.
        let b = unsafe { &*p };
        if take(&b.lock, wait) {
            write_segment(b, wait);
            unlock(&b.lock);
        }
        p = b.next.load(Ordering::Acquire);
    }
}

// ---- recording ----

/// Enters the tracer for one record: the calling thread's state and where its event goes,
/// when the call is to be recorded. Until [`leave`], nested calls of this thread (a signal
/// handler's) pass through.
#[inline(always)]
fn enter() -> Option<(&'static ThreadState, *mut u8)> {
    let t = tls()?;
    let mut cursor = t.cursor.get();
    if cursor.is_null() {
        cursor = enter_slow(t)?;
    }
    t.cursor.set(null_mut());
    // A signal handler that interrupts from here on sees the cursor cleared.
    compiler_fence(Ordering::SeqCst);
    Some((t, cursor))
}

/// The first recorded call of a thread takes a buffer; every other call that finds the cursor
/// cleared (not tracing, nested, the clock thread) is not recorded.
#[cold]
#[inline(never)]
fn enter_slow(t: &ThreadState) -> Option<*mut u8> {
    if t.busy.get() || !t.buf.get().is_null() || STATE.load(Ordering::Acquire) != STATE_TRACING {
        return None;
    }
    let busy = Busy::new();
    let b = take_buf(t);
    drop(busy);
    b.map(Buf::data)
}

/// Ends a record: `cursor` is where the next event goes.
#[inline(always)]
fn leave(t: &ThreadState, cursor: *mut u8) {
    // The record is complete before a signal handler can see the cursor again.
    compiler_fence(Ordering::SeqCst);
    t.cursor.set(cursor);
}

/// Appends one event (between [`enter`] and [`leave`]) and returns the new cursor. `key` is
/// the event's order key, when several threads record; `stack` its stack id (with stacks on,
/// every allocation has one, 0 when none was captured; frees never do).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn append(
    t: &ThreadState,
    mut cursor: *mut u8,
    op: u8,
    size: u64,
    addr: u64,
    time_ns: u64,
    key: Option<u64>,
    stack: Option<u64>,
) -> *mut u8 {
    // SAFETY: the thread's buffer, never unmapped.
    let b = unsafe { &*t.buf.get() };
    if cursor > t.last_start.get() {
        flush_own(b);
        cursor = b.data();
    }
    if time_ns != t.prev_ns.get() {
        cursor = append_time(t, cursor, time_ns);
    }
    if key.is_none() && !t.keyed.get() {
        return append_at(t, b, cursor, op, size, addr, stack);
    }
    append_keyed(t, b, cursor, op, size, addr, key, stack)
}

/// Encodes one event at `cursor`, publishes it and returns the new cursor.
#[inline(always)]
fn append_at(
    t: &ThreadState,
    b: &Buf,
    cursor: *mut u8,
    op: u8,
    size: u64,
    addr: u64,
    stack: Option<u64>,
) -> *mut u8 {
    let end = encode_at(t, cursor, op, size, addr, stack);
    commit(b, end)
}

/// Encodes one event at `cursor` and returns its end, unpublished.
#[inline(always)]
fn encode_at(
    t: &ThreadState,
    cursor: *mut u8,
    op: u8,
    size: u64,
    addr: u64,
    stack: Option<u64>,
) -> *mut u8 {
    let da = zigzag(addr.wrapping_sub(t.prev_addr.get()) as i64);
    // SAFETY: callers leave MAX_EVENT_BYTES of room after `cursor` (the time change's share
    // of it is unused here), inside the buffer; only the owner writes beyond `committed`.
    unsafe {
        let mut n = 1;
        if op & OP_FREE == 0 {
            n += put_prefix_varint(cursor.add(n), size);
        }
        let (code, len) = put_short_u64(cursor.add(n), da);
        cursor.write(op | (code << OP_ADDR_SHIFT));
        t.prev_addr.set(addr);
        n += len;
        if let Some(id) = stack {
            n += put_prefix_varint(cursor.add(n), id);
        }
        cursor.add(n)
    }
}

/// Publishes the events up to `end` (flushing threads may write them from now on).
#[inline(always)]
fn commit(b: &Buf, end: *mut u8) -> *mut u8 {
    b.committed.store(end as usize, Ordering::Release);
    end
}

/// Encodes an event with its order key (a zigzag prefix varint of the difference from the
/// stream's previous key, after the address), switching the stream to keyed events first
/// if it has not yet; publishes it and returns the new cursor.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn append_keyed(
    t: &ThreadState,
    b: &Buf,
    mut cursor: *mut u8,
    op: u8,
    size: u64,
    addr: u64,
    key: Option<u64>,
    stack: Option<u64>,
) -> *mut u8 {
    // SAFETY: within the room `append` checked (MAX_EVENT_BYTES counts the switch and the key).
    unsafe {
        if !t.keyed.get() {
            cursor.write(OP_KEYED);
            cursor = cursor.add(1);
            t.keyed.set(true);
        }
        // Every event of a keyed stream has a key; a call that found the process still
        // single-threaded before its real call and not after it takes one now.
        let key = key.or_else(order_key).unwrap_or(t.prev_key.get());
        let end = encode_at(t, cursor, op, size, addr, stack);
        let dk = zigzag(key.wrapping_sub(t.prev_key.get()) as i64);
        t.prev_key.set(key);
        commit(b, end.add(put_prefix_varint(end, dk)))
    }
}

/// Writes a time change at `cursor` (once per clock period at most, per thread) and returns
/// where the event goes.
#[cold]
#[inline(never)]
fn append_time(t: &ThreadState, cursor: *mut u8, time_ns: u64) -> *mut u8 {
    let dt = zigzag(time_ns.wrapping_sub(t.prev_ns.get()) as i64);
    t.prev_ns.set(time_ns);
    // SAFETY: within the room `append` checked.
    unsafe {
        cursor.write(OP_TIME);
        cursor.add(1 + put_varint(cursor.add(1), dt))
    }
}

/// One event, the common way while one thread records: the thread has a buffer with room,
/// the time has not changed since its last event. Returns false, having done nothing,
/// otherwise. It calls nothing, so the wrappers' hot path saves no registers.
#[inline(always)]
fn record_fast(op: u8, size: u64, addr: u64, time_ns: u64) -> bool {
    let Some(t) = tls() else {
        return false;
    };
    let cursor = t.cursor.get();
    if cursor.is_null() {
        return false;
    }
    t.cursor.set(null_mut());
    // From here a signal handler's calls pass through: they cannot interleave with the
    // buffer reads and writes below.
    compiler_fence(Ordering::SeqCst);
    if cursor > t.last_start.get() || time_ns != t.prev_ns.get() {
        leave(t, cursor);
        return false;
    }
    // SAFETY: the thread's buffer, never unmapped (a non-null cursor implies one).
    let b = unsafe { &*t.buf.get() };
    let next = append_at(t, b, cursor, op, size, addr, None);
    leave(t, next);
    true
}

/// Any event: takes a buffer, writes a full one out, notes a time change, and, when several
/// threads record, reads the order key (here, so after an allocation's real call and before
/// a free's). The path of every event once several threads record.
#[inline(never)]
fn record_slow(op: u8, size: u64, addr: u64, time_ns: u64) {
    if let Some((t, cursor)) = enter() {
        // Read after enter: a thread's first call takes its buffer there, and may be the one
        // that makes the process multi-threaded.
        let key = event_key();
        let next = append(t, cursor, op, size, addr, time_ns, key, None);
        leave(t, next);
    }
}

/// The stack of the allocation being recorded, captured between [`enter`] and [`leave`]
/// (its definition, when new, written at `cursor`): the new cursor and the event's stack
/// field, `None` when stacks are off.
#[inline(always)]
fn stack_of(t: &ThreadState, cursor: *mut u8) -> (*mut u8, Option<u64>) {
    if !stacks_on() {
        return (cursor, None);
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: a non-null cursor implies the thread's buffer, never unmapped.
        let b = unsafe { &*t.buf.get() };
        let (cursor, id) = stacks::capture(t, b, cursor);
        (cursor, Some(id))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = t;
        (cursor, None)
    }
}

/// Records an allocation with its stack (stacks on); `p` is returned.
#[inline(never)]
fn record_alloc_stacked(call: u8, size: usize, p: *mut c_void) -> *mut c_void {
    if let Some((t, cursor)) = enter() {
        let key = event_key();
        let (cursor, stack) = stack_of(t, cursor);
        let next = append(t, cursor, call, size as u64, p as u64, now_ns(), key, stack);
        leave(t, next);
    }
    p
}

/// Records an allocation; `time_ns` was read after the real call returned. Returns `p`, for
/// the wrapper to return.
#[inline(always)]
fn record_alloc(call: u8, size: usize, p: *mut c_void, time_ns: u64) -> *mut c_void {
    if multi_thread() || !record_fast(call, size as u64, p as u64, time_ns) {
        record_slow(call, size as u64, p as u64, time_ns);
    }
    p
}

/// `free`'s slow path: records the call, then makes it (a tail call from the wrapper, which
/// then needs no registers saved).
#[inline(never)]
unsafe fn free_slow(f: FreeFn, p: *mut c_void, time_ns: u64) {
    record_slow(CALL_FREE | OP_FREE, 0, p as u64, time_ns);
    unsafe { f(p) }
}

// The functions other than malloc and free enter the tracer before their real call, so that
// what the real function calls of ours is not recorded a second time (glibc's reallocarray
// calls realloc). malloc and free, the hot ones, record outside the real call (calls that an
// allocator's malloc or free makes to these functions would be recorded: glibc's make none).

/// Ends an allocation-like call entered before its real call: records it, returns `p`.
#[inline(never)]
fn finish_alloc(
    t: &ThreadState,
    cursor: *mut u8,
    call: u8,
    size: usize,
    p: *mut c_void,
) -> *mut c_void {
    let key = event_key();
    let (cursor, stack) = stack_of(t, cursor);
    let next = append(t, cursor, call, size as u64, p as u64, now_ns(), key, stack);
    leave(t, next);
    p
}

/// The time and order key of a realloc's free half, read before its real call.
#[derive(Clone, Copy)]
struct Before {
    time_ns: u64,
    key: Option<u64>,
}

impl Before {
    #[inline(always)]
    fn now() -> Self {
        Self {
            time_ns: now_ns(),
            key: event_key(),
        }
    }
}

/// Ends a realloc-like call entered before its real call: records the free of the old block
/// (`before`, read before the call) and the allocation of the new one.
#[inline(never)]
fn finish_realloc(
    t: &ThreadState,
    mut cursor: *mut u8,
    call: u8,
    old: *mut c_void,
    size: usize,
    new: *mut c_void,
    before: Before,
) -> *mut c_void {
    let after_ns = now_ns();
    let after_key = event_key();
    let (size, old, new) = (size as u64, old as u64, new as u64);
    let free_old = |cursor| {
        append(
            t,
            cursor,
            call | OP_FREE,
            0,
            old,
            before.time_ns,
            before.key,
            None,
        )
    };
    let alloc = |cursor, addr| {
        let (cursor, stack) = stack_of(t, cursor);
        append(t, cursor, call, size, addr, after_ns, after_key, stack)
    };
    if old == 0 {
        cursor = alloc(cursor, new);
    } else if new == 0 {
        if size == 0 {
            // realloc(p, 0) freed p (glibc).
            cursor = free_old(cursor);
        } else {
            // Failed: the old block is untouched.
            cursor = alloc(cursor, 0);
        }
    } else {
        cursor = free_old(cursor);
        cursor = alloc(cursor, new);
    }
    leave(t, cursor);
    new as *mut c_void
}

// ---- the interposed functions ----

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let Some(f) = real_fn!(malloc, MallocFn) else {
        return arena_alloc(size, 16);
    };
    let p = unsafe { f(size) };
    if stacks_on() {
        return record_alloc_stacked(CALL_MALLOC, size, p);
    }
    record_alloc(CALL_MALLOC, size, p, now_ns())
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if in_arena(p) {
        return;
    }
    let Some(f) = real_fn!(free, FreeFn) else {
        return;
    };
    // Recorded before the real call, which then is the wrapper's tail call: nothing lives
    // across it. The time is read before the block can be handed out again, as it must be.
    let time_ns = now_ns();
    if multi_thread() || !record_fast(CALL_FREE | OP_FREE, 0, p as u64, time_ns) {
        return unsafe { free_slow(f, p, time_ns) };
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
    let p = unsafe { f(n, size) };
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
    let before = Before::now();
    let new = unsafe { f(old, size) };
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
    let before = Before::now();
    let new = unsafe { f(old, n, size) };
    let total = n.saturating_mul(size);
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
            let p = unsafe { f(align, size) };
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
            let p = unsafe { f(size) };
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
    let rc = unsafe { f(out, align, size) };
    let p = if rc == 0 {
        unsafe { out.read() }
    } else {
        null_mut()
    };
    finish_alloc(t, cursor, CALL_POSIX_MEMALIGN, size, p);
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
        let _busy = Busy::new();
        flush_all(Wait::Block);
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
    // Here rather than at the first call, which may come before libc is ready for threads
    // (from the dynamic loader, or another library's constructor).
    start_clock();
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

unsafe extern "C" fn on_fatal_signal(sig: c_int) {
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
        stacks::forget_last_stack(b);
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
    start_clock();
}

// ---- the clock thread ----

/// Stack of the clock thread: it only sleeps, reads clocks and writes buffers out.
const CLOCK_STACK_BYTES: usize = 128 << 10;

/// Starts this process's clock thread, once per process. It is created with every signal
/// blocked (it inherits the mask), so no signal meant for the program is handled on it.
fn start_clock() {
    if STATE.load(Ordering::Acquire) != STATE_TRACING {
        return;
    }
    // SAFETY: plain syscall.
    let pid = unsafe { getpid() };
    if CLOCK_PID.swap(pid, Ordering::AcqRel) == pid {
        return;
    }
    // pthread_create allocates (the new thread's TLS vector): not part of the trace.
    let _busy = Busy::new();
    let all: SigSet = [!0; 16];
    let mut old: SigSet = [0; 16];
    let mut attr: PthreadAttr = [0; 8];
    let mut thread = 0u64;
    // SAFETY: plain libc calls on valid local objects.
    let rc = unsafe {
        pthread_sigmask(SIG_SETMASK, &all, &mut old);
        pthread_attr_init(&mut attr);
        pthread_attr_setstacksize(&mut attr, CLOCK_STACK_BYTES);
        pthread_attr_setdetachstate(&mut attr, PTHREAD_CREATE_DETACHED);
        let rc = pthread_create(&mut thread, &attr, clock_main, null_mut());
        pthread_attr_destroy(&mut attr);
        pthread_sigmask(SIG_SETMASK, &old, null_mut());
        rc
    };
    if rc != 0 {
        let msg = b"allocview tracer: cannot start the clock thread; event times stay at the \
                    time of the last flush\n";
        // SAFETY: writing a message to stderr.
        unsafe { write(2, msg.as_ptr().cast(), msg.len()) };
    }
}

unsafe extern "C" fn clock_main(_: *mut c_void) -> *mut c_void {
    if let Some(t) = tls() {
        // For good: nothing this thread does is recorded.
        t.busy.set(true);
    }
    // SAFETY: names the calling thread (shown by top and /proc) from a static string.
    unsafe { prctl(PR_SET_NAME, c"allocview-clock".as_ptr()) };
    let period = Timespec {
        tv_sec: 0,
        tv_nsec: CLOCK_PERIOD_NS,
    };
    let mut until_flush = FLUSH_EVERY_PERIODS;
    loop {
        // SAFETY: a plain sleep; an early wake-up (a signal cannot arrive, all are blocked)
        // only makes one period shorter.
        unsafe { nanosleep(&period, null_mut()) };
        tick_clock();
        until_flush -= 1;
        if until_flush == 0 {
            until_flush = FLUSH_EVERY_PERIODS;
            if STATE.load(Ordering::Acquire) == STATE_TRACING {
                let before_ns = now_ns();
                flush_all(Wait::Block);
                write_flush_mark(before_ns);
            }
            // When the program's threads are all gone (the main thread ended with
            // pthread_exit), returning makes glibc end the process as it would have.
            if live_threads() == Some(1) {
                return null_mut();
            }
        }
    }
}

/// The number of threads of this process still running: field 20 of `/proc/self/stat`, less
/// the main thread when it has ended with `pthread_exit` (it stays a zombie, counted, until
/// the process ends; field 3, the main thread's state, is then `Z`).
fn live_threads() -> Option<u64> {
    let mut stat = [0u8; 1024];
    // SAFETY: reading a procfs file into a stack buffer.
    let n = unsafe {
        let fd = open(c"/proc/self/stat".as_ptr(), O_RDONLY | O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = read(fd, stat.as_mut_ptr().cast(), stat.len());
        close(fd);
        usize::try_from(n).ok()?
    };
    let stat = stat.get(..n)?;
    // The command name (field 2) may hold spaces: count from the ')' that closes it.
    let after_name = stat.iter().rposition(|&c| c == b')')?;
    let mut fields = stat
        .get(after_name + 1..)?
        .split(|&c| c == b' ')
        .filter(|f| !f.is_empty());
    let main_ended = fields.next()? == b"Z";
    let threads: u64 = std::str::from_utf8(fields.nth(16)?)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(threads - u64::from(main_ended))
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
