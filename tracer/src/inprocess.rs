//! In-process tracking: the Python package's `allocview.Tracker` loads this library with
//! `dlopen` into a running interpreter (no `LD_PRELOAD`, no restart) and brackets what it
//! records with [`allocview_tracker_start`] and [`allocview_tracker_stop`], any number of
//! times.
//!
//! Start opens a spool of its own (`<prefix>.<pid>.spool`, the prefix given), wraps Python's
//! allocators (`python/pymem.rs`: the running interpreter, whose GIL the caller holds), turns
//! the frame walk on, and with `native` redirects the C library calls of every loaded object
//! to the tracer (`got.rs`). Stop undoes all three, writes every buffer out and closes the
//! spool, which the caller then converts into a trace as `record` does.
//!
//! `allocview attach` loads the library the same way into a process that was started without
//! allocview (through ptrace, from a thread it stopped: no GIL is held, whatever the program)
//! and brackets its run with [`allocview_attach_start`] and [`allocview_tracker_stop`]: a
//! native-only run (the C library calls, redirected as with `native`; Python's allocators are
//! left alone, since wrapping them needs the GIL), whose spool says `started_mid_run=1`.
//!
//! An attached run also ends when its `allocview attach` is gone (killed, out of memory)
//! without stopping it: that command holds a lock on `<prefix>.owner` while it runs, and the
//! clock thread ends the run within a second of the lock's release ([`poll`]), as
//! [`allocview_tracker_stop`] would have; else the program would record into its spool until
//! it ends, filling the disk, and no attach could start again.
//!
//! Between the two, every thread records as under `LD_PRELOAD`. A thread that recorded in an
//! earlier run finds the run number ([`crate::EPOCH`]) moved at its next call and starts a new
//! stream in its buffer (the spool, the stack and code ids and the module map start again too).

use std::ffi::{CStr, c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

use crate::*;

/// Whether a run was ever started here (the process-wide set-up is done once).
static SET_UP: AtomicBool = AtomicBool::new(false);
/// The current run redirects the C library calls.
static NATIVE: AtomicBool = AtomicBool::new(false);
/// Whether Python's C API was looked up (the first run that wraps Python's allocators).
static PY_DETECTED: AtomicBool = AtomicBool::new(false);
/// The current run was started by `allocview attach`, in the middle of the program's run: its
/// spool's META says `started_mid_run=1`.
pub(crate) static MID_RUN: AtomicBool = AtomicBool::new(false);
/// An attached run: the open `<prefix>.owner`, whose lock `allocview attach` holds while it
/// runs (-1: none).
static OWNER_FD: AtomicI32 = AtomicI32::new(-1);
/// Flush periods until the next look at the owner's lock.
static OWNER_COUNTDOWN: AtomicU32 = AtomicU32::new(0);
/// How many flush periods (of 20 ms) apart the owner's lock is looked at.
const OWNER_EVERY_PERIODS: u32 = 25;

/// Starts recording into `<prefix>.<pid>.spool`; `native` also records the C library calls
/// of the whole process. Returns 0, or -1 when a run is on (or the tracer is preloaded and
/// tracing), -2 when the prefix is unusable, -3 when the spool cannot be created.
///
/// # Safety
/// `prefix` is a NUL-terminated path; the caller holds the GIL of the running interpreter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn allocview_tracker_start(prefix: *const c_char, native: c_int) -> c_int {
    // SAFETY: the caller's guarantees.
    unsafe { start_run(prefix, native != 0, true) }
}

/// `allocview attach`'s start: records the C library calls of the whole process into
/// `<prefix>.<pid>.spool`, whose META says the run started mid-run. Python's allocators are
/// not wrapped (that needs the GIL, which the caller, a thread stopped anywhere, may not hold).
/// Returns as [`allocview_tracker_start`].
///
/// # Safety
/// `prefix` is a NUL-terminated path.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn allocview_attach_start(prefix: *const c_char) -> c_int {
    // SAFETY: the caller's NUL-terminated path; no Python call is made.
    unsafe { start_run(prefix, true, false) }
}

/// Starts a run (see the two entry points); `python` wraps Python's allocators.
///
/// # Safety
/// `prefix` is a NUL-terminated path; with `python`, the caller holds the GIL.
unsafe fn start_run(prefix: *const c_char, native: bool, python: bool) -> c_int {
    // Resolves the real functions (the constructor did already: no ALLOCVIEW_SPOOL, so off).
    ensure_init();
    if STATE.load(Ordering::Acquire) != STATE_OFF || prefix.is_null() {
        return -1;
    }
    // SAFETY: the caller's NUL-terminated path.
    let prefix = unsafe { CStr::from_ptr(prefix) }.to_bytes();
    if prefix.is_empty() || prefix.len() > 4000 {
        return -2;
    }
    let _busy = Busy::new();
    // SAFETY: no run is on: nothing reads the prefix meanwhile.
    unsafe {
        let dst = &mut *PREFIX.bytes.get();
        if let Some(d) = dst.get_mut(..prefix.len()) {
            d.copy_from_slice(prefix);
        }
    }
    PREFIX.len.store(prefix.len(), Ordering::Release);
    STACKS.store(true, Ordering::Relaxed);
    MID_RUN.store(!python, Ordering::Release);
    if !SET_UP.swap(true, Ordering::AcqRel) {
        KEYS_USABLE.store(keys_usable(), Ordering::Relaxed);
        // SAFETY: once per process.
        unsafe { register_process_hooks() };
    } else {
        restart_streams();
    }
    // Looked up only for a run that wraps Python's allocators: once found, the clock thread
    // would ask the interpreter to let it wrap them (`python::poll`).
    if python && !PY_DETECTED.swap(true, Ordering::AcqRel) {
        python::detect();
    }
    tick_clock();
    // SAFETY: creates the run's spool.
    if !unsafe { open_spool() } {
        return -3;
    }
    if native && !python {
        // SAFETY: a NUL-terminated path in a stack buffer.
        unsafe { open_owner() };
    }
    modules::emit_all(stacks::emit_module);
    // Redirected before the run is on, so that recording starts for every function at once:
    // until then the tracer's functions pass calls through. Slots rewritten one by one while
    // tracing would let a thread allocate through a rewritten `malloc` and free through a
    // `free` not yet rewritten, unseen (`got.rs`).
    if python {
        python::wrap_running();
    }
    NATIVE.store(native, Ordering::Release);
    if native {
        got::patch_all();
    }
    // Tracing first, then the new run number: a thread that sees the new number sees the
    // run on (it starts a new stream), and one that saw the old number before moves on at
    // its next call. The other order could leave a thread that took the new number with no
    // run on yet holding its buffer without a cursor, recording nothing in this run.
    STATE.store(STATE_TRACING, Ordering::Release);
    EPOCH.fetch_add(1, Ordering::AcqRel);
    start_clock();
    0
}

/// Stops the run: puts back what start changed, writes every buffer out and closes the
/// spool. Returns 0, -1 when no run is on, or -2 when the calling thread holds one of the
/// tracer's locks (`allocview attach` may make a thread stopped inside the tracer call this:
/// the buffers it would write wait for that lock, so it asks to be called from another).
///
/// # Safety
/// After [`allocview_tracker_start`], the caller holds the GIL of the running interpreter
/// (the Python allocators are put back); after [`allocview_attach_start`], nothing is needed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn allocview_tracker_stop() -> c_int {
    if STATE.load(Ordering::Acquire) != STATE_TRACING || PID.load(Ordering::Acquire) == 0 {
        return -1;
    }
    if holds_a_lock() {
        return -2;
    }
    // The run ends for every function at once, before anything is put back (as at the
    // start): from here the tracer's functions pass calls through.
    STATE.store(STATE_OFF, Ordering::Release);
    // Threads see the run end at their next call (their buffers start again next run).
    EPOCH.fetch_add(1, Ordering::AcqRel);
    if NATIVE.swap(false, Ordering::AcqRel) {
        got::restore();
    }
    python::unwrap_running();
    let _busy = Busy::new();
    // Also what a thread finished after the run ended for it (it entered before).
    flush_all(Wait::Block);
    // The clock thread ends at its next period; the next run starts one.
    CLOCK_GEN.fetch_add(1, Ordering::AcqRel);
    CLOCK_PID.store(0, Ordering::Release);
    let fd = FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: the run's own spool.
        unsafe { close(fd) };
    }
    let owner = OWNER_FD.swap(-1, Ordering::AcqRel);
    if owner >= 0 {
        // SAFETY: the run's own descriptor.
        unsafe { close(owner) };
    }
    0
}

/// Opens `<prefix>.owner` for an attached run (none when `allocview attach` made none: the run
/// then ends only when asked).
///
/// # Safety
/// Called while starting a run, before the clock thread looks at [`OWNER_FD`].
unsafe fn open_owner() {
    let mut path = [0u8; 4200];
    let mut w = StackWriter::new(&mut path);
    w.put(PREFIX.get());
    w.put(b".owner\0");
    if w.overflowed() {
        return;
    }
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { open(path.as_ptr().cast(), O_RDONLY | O_CLOEXEC) };
    OWNER_COUNTDOWN.store(OWNER_EVERY_PERIODS, Ordering::Relaxed);
    let old = OWNER_FD.swap(fd.max(-1), Ordering::AcqRel);
    if old >= 0 {
        // SAFETY: an earlier run's descriptor, left open.
        unsafe { close(old) };
    }
}

/// Whether the `allocview attach` of this run is gone: its lock on the owner file was
/// released (a lock this can take). Looked at every [`OWNER_EVERY_PERIODS`] flush periods.
fn owner_gone() -> bool {
    let fd = OWNER_FD.load(Ordering::Acquire);
    if fd < 0 {
        return false;
    }
    let left = OWNER_COUNTDOWN.load(Ordering::Relaxed);
    if left > 1 {
        OWNER_COUNTDOWN.store(left - 1, Ordering::Relaxed);
        return false;
    }
    OWNER_COUNTDOWN.store(OWNER_EVERY_PERIODS, Ordering::Relaxed);
    // SAFETY: the run's own descriptor; the lock is dropped with it by the stop.
    unsafe { flock(fd, LOCK_EX | LOCK_NB) == 0 }
}

/// Before a new run: every buffer empty and its thread's stream to start again, stack and
/// code ids and the module map's emission from the beginning.
fn restart_streams() {
    let mut p = BUFFERS.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: buffers are never unmapped.
        let b = unsafe { &*p };
        b.committed.store(0, Ordering::Relaxed);
        b.flushed.store(0, Ordering::Relaxed);
        stacks::forget_stack_ids(b);
        p = b.next.load(Ordering::Acquire);
    }
    NEXT_STREAM.store(0, Ordering::Relaxed);
    stacks::reset_after_fork();
}

/// Called by the clock thread each flush period: the objects loaded since are redirected too,
/// and an attached run whose `allocview attach` is gone ends.
pub(crate) fn poll() {
    if owner_gone() {
        // SAFETY: an attached run: nothing is needed; the clock thread holds none of the
        // tracer's locks here.
        unsafe { allocview_tracker_stop() };
        return;
    }
    if NATIVE.load(Ordering::Acquire) {
        got::poll_new_objects();
    }
}
