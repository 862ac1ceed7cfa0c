//! The replay process of allocview's real-allocator rows (`real-glibc`, `real-jemalloc`, ...).
//!
//! `allocview_replayer OPS OUT TOUCH THREADS` replays the calls listed in `OPS` through this
//! process's own `malloc`, `calloc`, `realloc` and `free`: the C library's, or another
//! allocator's when the caller sets `LD_PRELOAD` (and that allocator's settings in the
//! environment). It writes each allocation's pages as `TOUCH` says (`0` none, `1` the first,
//! `2` every page: a program uses what it asks for), and samples its own
//! anonymous resident memory (`/proc/self/statm`: resident less shared, the `RssAnon` of
//! `/proc/self/status`) every `sample_every` calls, after the call the header marks (the
//! trace's peak of live bytes) and after the last, taken by the thread that ran it before any
//! thread ends (an ending thread's arena and cache may be given back); `OUT` gets the samples.
//!
//! Everything the replay needs is set up before the first sample, which is the baseline the
//! caller subtracts: the calls file mapped read-only (file pages, not measured), the table of live
//! pointers and the samples' array mapped and written once, the threads started. During the
//! replay this process allocates nothing of its own: every byte the allocator holds beyond
//! the baseline is the replayed program's.
//!
//! Threads: with `THREADS` `each`, each traced thread is replayed on an OS thread of its own, in
//! the recorded global order, the trace's first on the process's main thread. The thread that runs a call hands the turn to the next call's
//! thread (a word per thread, spun on briefly, then slept on with a futex), so each traced
//! thread's calls come from one OS thread, as its per-thread caches and arenas expect; with
//! `one`, every call is replayed on one thread. One calls file serves every row of a trace.
//!
//! The files (little-endian):
//! - `OPS`: the header ([`Header`], 48 bytes: magic `AVRPLAY1`, call count, slot count, thread
//!   count, 4 bytes unused, sample period, 4 bytes unused, the marked call), then one 16-byte
//!   [`Op`] per call.
//! - `OUT`: magic `AVRPOUT1`, the baseline's resident bytes, the replay's nanoseconds, the
//!   failed allocations, the sample count, then each sample as (calls done, resident bytes).

use std::ffi::c_void;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

unsafe extern "C" {
    fn malloc(size: usize) -> *mut c_void;
    fn calloc(n: usize, size: usize) -> *mut c_void;
    fn realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn free(p: *mut c_void);
    fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64)
    -> *mut c_void;
    fn open(path: *const u8, flags: i32, ...) -> i32;
    fn pread(fd: i32, buf: *mut c_void, n: usize, off: i64) -> isize;
    fn syscall(n: i64, ...) -> i64;
    fn sysconf(name: i32) -> i64;
}

const PROT_READ: i32 = 0x1;
const PROT_RW: i32 = 0x1 | 0x2;
const MAP_PRIVATE: i32 = 0x02;
const MAP_PRIVATE_ANON: i32 = 0x02 | 0x20;
/// Reads the file's pages in at once: the calls are read as the replay runs, and a page fault
/// on the page cache between calls would be time the allocator did not take.
const MAP_POPULATE: i32 = 0x8000;
#[cfg(target_arch = "x86_64")]
const SYS_FUTEX: i64 = 202;
/// The generic system call table's number (AArch64, RISC-V, LoongArch).
#[cfg(any(
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64"
))]
const SYS_FUTEX: i64 = 98;
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64"
)))]
compile_error!(
    "the replayer knows the futex system call's number on x86-64, AArch64, RISC-V and LoongArch only"
);
const FUTEX_WAIT_PRIVATE: i32 = 128;
const FUTEX_WAKE_PRIVATE: i32 = 1 | 128;
const SC_PAGESIZE: i32 = 30;

const OPS_MAGIC: &[u8; 8] = b"AVRPLAY1";
const OUT_MAGIC: &[u8; 8] = b"AVRPOUT1";
const HEADER_BYTES: usize = 48;
const OP_BYTES: usize = 16;

/// What a call does.
const MALLOC: u8 = 0;
const CALLOC: u8 = 1;
const FREE: u8 = 2;
/// The first half of a `realloc`: the old pointer and size (the next call of its thread is the
/// second).
const REALLOC_FROM: u8 = 3;
/// The second half: the new slot and size.
const REALLOC_TO: u8 = 4;
/// A call that does nothing here (`free(NULL)`, a free of an unknown pointer, a failed
/// allocation): kept so that call indices are the trace's event indices.
const NOTHING: u8 = 5;

/// How an allocation's pages are written (0: not at all).
const TOUCH_FIRST: u8 = 1;
/// The page size the writes step by: the smallest of the platforms' (a larger page is written
/// more than once, which changes nothing).
const PAGE_BYTES: usize = 4096;
const TOUCH_ALL: u8 = 2;

struct Header {
    ops: u64,
    slots: u64,
    threads: u32,
    sample_every: u32,
    mark: u64,
}

/// A block between the two halves of a `realloc`: its pointer and its size before.
#[repr(C)]
struct Pending {
    p: *mut c_void,
    size: usize,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            p: std::ptr::null_mut(),
            size: 0,
        }
    }
}

#[derive(Clone, Copy)]
#[repr(C)]
struct Op {
    op: u8,
    _pad: u8,
    thread: u16,
    slot: u32,
    size: u64,
}

fn fail(msg: &str) -> ! {
    eprintln!("allocview_replayer: {msg}");
    std::process::exit(2)
}

/// A zero-filled anonymous mapping of `bytes`, every page written once (so that it is part of
/// the baseline, not of the replay).
fn mapped(bytes: usize) -> *mut u8 {
    let len = bytes.max(1);
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe { mmap(std::ptr::null_mut(), len, PROT_RW, MAP_PRIVATE_ANON, -1, 0) };
    if p as isize == -1 || p.is_null() {
        fail("cannot map memory for the replay");
    }
    let p = p.cast::<u8>();
    for off in (0..len).step_by(4096) {
        // SAFETY: inside the mapping.
        unsafe { p.add(off).write_volatile(0) };
    }
    p
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        w.copy_from_slice(s);
    }
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_le_bytes(w)
}

fn read_header(f: &mut std::fs::File) -> Header {
    let mut h = [0u8; HEADER_BYTES];
    if f.read_exact(&mut h).is_err() || &h[..8] != OPS_MAGIC {
        fail("the calls file has no replay header");
    }
    Header {
        ops: u64_at(&h, 8),
        slots: u64_at(&h, 16),
        threads: u32_at(&h, 24),
        sample_every: u32_at(&h, 32).max(1),
        mark: u64_at(&h, 40),
    }
}

/// Anonymous resident memory, read with no allocation from `/proc/self/statm`.
struct Statm {
    fd: i32,
    page_bytes: u64,
}

impl Statm {
    fn open() -> Self {
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { open(c"/proc/self/statm".as_ptr().cast(), 0) };
        if fd < 0 {
            fail("cannot open /proc/self/statm");
        }
        // SAFETY: sysconf reads a constant.
        let page = unsafe { sysconf(SC_PAGESIZE) };
        Self {
            fd,
            page_bytes: u64::try_from(page).unwrap_or(4096),
        }
    }

    fn resident_bytes(&self) -> u64 {
        let mut buf = [0u8; 128];
        // SAFETY: reads into the stack buffer.
        let n = unsafe { pread(self.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        let text = buf.get(..usize::try_from(n).unwrap_or(0)).unwrap_or(&[]);
        let mut fields = text.split(|&c| c == b' ').map(|f| {
            f.iter()
                .take_while(|c| c.is_ascii_digit())
                .fold(0u64, |v, &c| v * 10 + u64::from(c - b'0'))
        });
        // size, resident, shared (file-backed and shared memory): resident less shared is the
        // anonymous memory (`RssAnon`), what an allocator holds. Code pages of the library
        // that the first calls bring in are not the program's memory.
        let (Some(_), Some(resident), Some(shared)) = (fields.next(), fields.next(), fields.next())
        else {
            return 0;
        };
        resident.saturating_sub(shared) * self.page_bytes
    }
}

/// What every replay thread shares.
struct Shared {
    ops: *const Op,
    n_ops: usize,
    slots: *mut *mut c_void,
    n_slots: usize,
    touch: u8,
    sample_every: usize,
    mark: usize,
    statm: Statm,
    /// `(calls done, resident bytes)`, [`Self::max_samples`] of them at most.
    samples: *mut [u64; 2],
    max_samples: usize,
    n_samples: AtomicU64,
    /// The call count at which the next periodic sample is due.
    next_sample: AtomicU64,
    failed: AtomicU64,
    /// The thread whose turn it is, and each thread's wake word.
    turn: AtomicU32,
    next_op: AtomicU64,
    wake: Vec<AtomicU32>,
    /// Threads started and waiting for their first turn.
    ready: AtomicU32,
    /// Each traced thread's pointer between the two halves of a `realloc` (another thread's
    /// calls may come between them), touched only by the thread that replays its calls.
    pending: *mut Pending,
    n_threads: usize,
}

// SAFETY: the raw pointers are the mappings above; only the thread whose turn it is touches
// the live table and the samples (the turn is handed over with release/acquire).
unsafe impl Sync for Shared {}

impl Shared {
    fn sample(&self, done: usize) {
        let i = self.n_samples.load(Ordering::Relaxed) as usize;
        if i < self.max_samples {
            let rss = self.statm.resident_bytes();
            // SAFETY: `i` is inside the samples' mapping.
            unsafe { self.samples.add(i).write([done as u64, rss]) };
            self.n_samples.store(i as u64 + 1, Ordering::Relaxed);
        }
    }

    fn touch(&self, p: *mut c_void, size: usize) {
        if p.is_null() || size == 0 {
            return;
        }
        let p = p.cast::<u8>();
        match self.touch {
            TOUCH_FIRST => {
                // SAFETY: the allocation's first byte.
                unsafe { p.write_volatile(1) };
            }
            TOUCH_ALL => {
                // One byte on each page the allocation spans: its first byte, then the first
                // byte of each page after (a small allocation is one write, to the line its
                // header just made hot).
                let start = p as usize;
                let last_page = (start + size - 1) & !(PAGE_BYTES - 1);
                let mut page = (start & !(PAGE_BYTES - 1)) + PAGE_BYTES;
                // SAFETY: the allocation's first byte.
                unsafe { p.write_volatile(1) };
                while page <= last_page {
                    // SAFETY: inside the allocation (below its last byte's page end, at or
                    // above its start).
                    unsafe { p.add(page - start).write_volatile(1) };
                    page += PAGE_BYTES;
                }
            }
            _ => {}
        }
    }

    fn slot(&self, s: u32) -> *mut *mut c_void {
        let s = (s as usize).min(self.n_slots.saturating_sub(1));
        // SAFETY: clamped into the table.
        unsafe { self.slots.add(s) }
    }

    /// The traced thread's block between the two halves of its `realloc`.
    #[allow(clippy::mut_from_ref)]
    fn pending(&self, thread: u16) -> &mut Pending {
        let t = usize::from(thread).min(self.n_threads.saturating_sub(1));
        // SAFETY: inside the mapping of `n_threads` entries; only the OS thread replaying
        // traced thread `t` touches its entry, and not re-entrantly.
        unsafe { &mut *self.pending.add(t) }
    }

    /// Runs one call; a `REALLOC_FROM` leaves its pointer as its thread's pending one, for
    /// that thread's next call, the `REALLOC_TO`.
    #[inline(always)]
    fn run(&self, op: Op) {
        let pending = self.pending(op.thread);
        let size = op.size as usize;
        // SAFETY: the calls of the replayed program, on pointers its own calls returned.
        unsafe {
            match op.op {
                MALLOC | CALLOC => {
                    let p = if op.op == MALLOC {
                        malloc(size)
                    } else {
                        calloc(1, size)
                    };
                    if p.is_null() {
                        self.failed.fetch_add(1, Ordering::Relaxed);
                    }
                    self.touch(p, size);
                    *self.slot(op.slot) = p;
                }
                FREE => {
                    let s = self.slot(op.slot);
                    free(*s);
                    *s = std::ptr::null_mut();
                }
                REALLOC_FROM => {
                    let s = self.slot(op.slot);
                    let before = std::mem::replace(pending, Pending { p: *s, size });
                    free(before.p);
                    *s = std::ptr::null_mut();
                }
                REALLOC_TO => {
                    let from = std::mem::take(pending);
                    let p = realloc(from.p, size);
                    if p.is_null() {
                        self.failed.fetch_add(1, Ordering::Relaxed);
                    } else if self.touch == TOUCH_ALL && !from.p.is_null() {
                        // The old bytes were written when they were allocated, and `realloc`
                        // moved or kept them: only the grown part is the program's to write.
                        if size > from.size {
                            self.touch(p.cast::<u8>().add(from.size).cast(), size - from.size);
                        }
                    } else {
                        self.touch(p, size);
                    }
                    *self.slot(op.slot) = p;
                }
                _ => {}
            }
        }
    }

    fn op(&self, i: usize) -> Op {
        // SAFETY: `i < n_ops`, inside the calls' mapping.
        unsafe { self.ops.add(i).read() }
    }

    /// After call `i`: a sample when one is due (a comparison, not a division, per call).
    #[inline(always)]
    fn after(&self, i: usize) {
        let done = i + 1;
        let due = self.next_sample.load(Ordering::Relaxed) as usize;
        if done == due || i == self.mark {
            self.sample(done);
            if done == due {
                self.next_sample
                    .store((due + self.sample_every) as u64, Ordering::Relaxed);
            }
        }
    }

    /// Replays every call on this thread.
    fn run_all(&self) {
        for i in 0..self.n_ops {
            self.run(self.op(i));
            self.after(i);
        }
        self.sample(self.n_ops);
    }

    /// Thread `me`'s share of the replay: waits for its turn, runs calls while they are its
    /// own, and hands the turn to the next call's thread.
    fn run_thread(&self, me: u32) {
        while self.wait_turn(me) {
            let mut i = self.next_op.load(Ordering::Acquire) as usize;
            while i < self.n_ops && self.op(i).thread as u32 == me {
                self.run(self.op(i));
                self.after(i);
                i += 1;
            }
            let next = if i < self.n_ops {
                self.op(i).thread as u32
            } else {
                u32::MAX
            };
            self.next_op.store(i as u64, Ordering::Release);
            if next == u32::MAX {
                self.sample(self.n_ops);
                // The end: every thread is woken to leave.
                self.turn.store(u32::MAX, Ordering::Release);
                for w in &self.wake {
                    wake(w);
                }
                return;
            }
            self.turn.store(next, Ordering::Release);
            if let Some(w) = self.wake.get(next as usize) {
                wake(w);
            }
        }
    }

    /// Waits until it is thread `me`'s turn (true) or the replay has ended (false).
    fn wait_turn(&self, me: u32) -> bool {
        let Some(word) = self.wake.get(me as usize) else {
            return false;
        };
        let mut spins = 0u32;
        loop {
            let seen = word.load(Ordering::Acquire);
            match self.turn.load(Ordering::Acquire) {
                t if t == me => return true,
                u32::MAX => return false,
                _ => {}
            }
            if spins < 4096 {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            // SAFETY: waits on the word while it still holds `seen` (a wake in between bumps
            // it, so the wait returns at once).
            unsafe {
                syscall(
                    SYS_FUTEX,
                    std::ptr::from_ref(word),
                    FUTEX_WAIT_PRIVATE,
                    seen,
                    std::ptr::null::<c_void>(),
                )
            };
        }
    }
}

fn wake(word: &AtomicU32) {
    word.fetch_add(1, Ordering::Release);
    // SAFETY: wakes the thread sleeping on the word, if any.
    unsafe { syscall(SYS_FUTEX, std::ptr::from_ref(word), FUTEX_WAKE_PRIVATE, 1) };
}

/// The calls file mapped read-only: its header, and its calls after it. File pages are not
/// anonymous memory, so they stay out of what the samples measure.
fn map_calls(path: &str) -> (Header, *const Op, usize) {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
    let h = read_header(&mut f);
    let n_ops = usize::try_from(h.ops).unwrap_or_else(|_| fail("too many calls"));
    let ops_bytes = n_ops
        .checked_mul(OP_BYTES)
        .unwrap_or_else(|| fail("too many calls"));
    // The size is the file's, not the header's word alone: a header that claims more calls
    // than the file holds is refused before anything is mapped.
    let file_bytes = f.metadata().map_or(0, |m| m.len()) as usize;
    if file_bytes != HEADER_BYTES + ops_bytes {
        fail("the calls file's size does not match its header");
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: a read-only private mapping of the open file, of its own length.
    let p = unsafe {
        mmap(
            std::ptr::null_mut(),
            file_bytes,
            PROT_READ,
            MAP_PRIVATE | MAP_POPULATE,
            fd,
            0,
        )
    };
    if p as isize == -1 || p.is_null() {
        fail("cannot map the calls file");
    }
    // SAFETY: the header's bytes precede the calls in the mapping (8-aligned: 48 bytes in).
    (
        h,
        unsafe { p.cast::<u8>().add(HEADER_BYTES) }.cast::<Op>(),
        n_ops,
    )
}

/// Refuses a calls file that names a call, a slot or a thread it does not have: a replay
/// would write out of its tables, or wait for a thread that never comes.
fn check_calls(ops: *const Op, n_ops: usize, n_slots: usize, threads: usize) {
    for i in 0..n_ops {
        // SAFETY: `i < n_ops`, inside the mapping.
        let op = unsafe { ops.add(i).read() };
        let bad = op.op > NOTHING
            || (op.op != NOTHING && op.slot as usize >= n_slots)
            || usize::from(op.thread) >= threads.max(1);
        if bad {
            fail(&format!(
                "call {i} of the calls file names no call, slot or thread it has"
            ));
        }
    }
}

/// Starts the threads, takes the baseline once all wait, replays, and returns the replay's
/// time. The calling thread replays the trace's first thread, as a program's first thread is
/// its main thread (glibc serves the main thread from its main arena, on `brk`, and the others
/// from arenas of their own), and with `threads` 0 every call.
fn replay(shared: &Shared, threads: u32) -> std::time::Duration {
    let started = std::thread::scope(|scope| {
        for me in 1..threads {
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn_scoped(scope, move || {
                    shared.ready.fetch_add(1, Ordering::Release);
                    shared.run_thread(me);
                })
                .unwrap_or_else(|e| fail(&format!("cannot start a replay thread: {e}")));
        }
        // Every other thread started and waiting for its turn: the baseline.
        while shared.ready.load(Ordering::Acquire) < threads.saturating_sub(1) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        shared.sample(0);
        let started = std::time::Instant::now();
        if threads == 0 {
            shared.run_all();
        } else {
            let first = if shared.n_ops > 0 {
                u32::from(shared.op(0).thread)
            } else {
                u32::MAX
            };
            shared.turn.store(first, Ordering::Release);
            if first == u32::MAX {
                for w in &shared.wake {
                    wake(w);
                }
            } else if let Some(w) = shared.wake.get(first as usize) {
                wake(w);
            }
            shared.run_thread(0);
        }
        started
    });
    started.elapsed()
}

/// Writes what was measured to `path` (the format in the module's header).
fn write_out(path: &str, shared: &Shared, elapsed_ns: u64) {
    let n = shared.n_samples.load(Ordering::Relaxed) as usize;
    let mut out = Vec::with_capacity(40 + n * 16);
    out.extend_from_slice(OUT_MAGIC);
    // SAFETY: the first sample is the baseline (taken before any call).
    let baseline = unsafe { shared.samples.read() }[1];
    for w in [
        baseline,
        elapsed_ns,
        shared.failed.load(Ordering::Relaxed),
        n as u64,
    ] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    for i in 0..n {
        // SAFETY: the first `n` samples are written.
        let [done, rss] = unsafe { shared.samples.add(i).read() };
        out.extend_from_slice(&done.to_le_bytes());
        out.extend_from_slice(&rss.to_le_bytes());
    }
    let written = std::fs::File::create(path).and_then(|mut f| f.write_all(&out));
    if let Err(e) = written {
        fail(&format!("{path}: {e}"));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: allocview_replayer OPS OUT TOUCH(0|1|2) THREADS(each|one)";
    let (Some(ops_path), Some(out_path), Some(touch), Some(mode)) =
        (args.get(1), args.get(2), args.get(3), args.get(4))
    else {
        fail(usage);
    };
    let touch: u8 = touch.parse().unwrap_or_else(|_| fail(usage));
    let one_thread = match mode.as_str() {
        "one" => true,
        "each" => false,
        _ => fail(usage),
    };
    let (h, ops, n_ops) = map_calls(ops_path);
    let n_slots = usize::try_from(h.slots)
        .unwrap_or_else(|_| fail("too many slots"))
        .max(1);
    let n_threads = (h.threads as usize).max(1);
    // The tables are mapped by these counts: a header that claims more slots than calls, or
    // more threads than a call can name, is refused before anything is mapped.
    if n_slots > n_ops.max(1) || n_threads > usize::from(u16::MAX) + 1 {
        fail("the calls file's header claims more slots or threads than its calls can use");
    }
    check_calls(ops, n_ops, n_slots, n_threads);
    let slots = mapped(n_slots * 8).cast::<*mut c_void>();
    let pending = mapped(n_threads * std::mem::size_of::<Pending>()).cast::<Pending>();
    let max_samples = n_ops / h.sample_every as usize + 4;
    let samples = mapped(max_samples * 16).cast::<[u64; 2]>();
    let threads = if one_thread { 0 } else { n_threads as u32 };
    let shared = Shared {
        ops,
        n_ops,
        slots,
        n_slots,
        touch,
        sample_every: h.sample_every as usize,
        mark: usize::try_from(h.mark).unwrap_or(usize::MAX),
        statm: Statm::open(),
        samples,
        max_samples,
        n_samples: AtomicU64::new(0),
        next_sample: AtomicU64::new(u64::from(h.sample_every)),
        failed: AtomicU64::new(0),
        turn: AtomicU32::new(u32::MAX - 1),
        next_op: AtomicU64::new(0),
        wake: (0..threads).map(|_| AtomicU32::new(0)).collect(),
        ready: AtomicU32::new(0),
        pending,
        n_threads,
    };
    let elapsed_ns = replay(&shared, threads).as_nanos() as u64;
    if n_ops == 0 {
        shared.sample(0);
    }
    write_out(out_path, &shared, elapsed_ns);
}
