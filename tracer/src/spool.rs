//! The spool file: its format's constants, its creation and header, whole frames written
//! under the write lock, and the per-thread buffers written out as segments.

use super::*;

// ---- the file format (see loaders/src/binary/ for the reader) ----

/// Magic bytes shared by spools and traces.
pub(crate) const MAGIC: [u8; 8] = [0x89, b'A', b'V', b'T', b'\r', b'\n', 0x1a, b'\n'];
pub(crate) const FORMAT_VERSION: u8 = 1;
pub(crate) const FILE_KIND_SPOOL: u8 = 1;
pub(crate) const FRAME_META: u8 = 0x01;
pub(crate) const FRAME_SEGMENT: u8 = 0x10;
/// A module of the process (see `modules.rs`), written when the tracer first finds it loaded
/// (the first walk that meets an address in no known module looks at the loaded modules).
#[cfg(target_arch = "x86_64")]
pub(crate) const FRAME_MODULE: u8 = 0x11;
/// A flush mark: the time (u64) read before the clock thread wrote out every buffer.
pub(crate) const FRAME_FLUSHED: u8 = 0x12;
/// What the tracer did in a CPython interpreter (`key=value` lines: `version`, `frames`,
/// `objects`; see `python/mod.rs`).
#[cfg(target_arch = "x86_64")]
pub(crate) const FRAME_PYTHON: u8 = 0x13;
/// Segment header after the frame's tag and length: stream u32, tid u64, tick u64, ns i64.
pub(crate) const SEGMENT_HEADER_BYTES: usize = 4 + 8 + 8 + 8;

/// Call codes, as in the loader's `CALL_NAMES`.
pub(crate) const CALL_MALLOC: u8 = 0;
pub(crate) const CALL_CALLOC: u8 = 1;
pub(crate) const CALL_REALLOC: u8 = 2;
pub(crate) const CALL_FREE: u8 = 3;
pub(crate) const CALL_MEMALIGN: u8 = 4;
pub(crate) const CALL_POSIX_MEMALIGN: u8 = 5;
pub(crate) const CALL_ALIGNED_ALLOC: u8 = 6;
pub(crate) const CALL_VALLOC: u8 = 7;
pub(crate) const CALL_PVALLOC: u8 = 8;
pub(crate) const CALL_REALLOCARRAY: u8 = 9;
/// Op-byte flag: the event releases its address (size -1 in the text form).
pub(crate) const OP_FREE: u8 = 0x10;
/// Spool op byte of a time change: a zigzag varint of the time's difference follows, and the
/// events after it have that time (`loaders/src/binary/`, spool event encoding 2).
pub(crate) const OP_TIME: u8 = 0x0f;
/// Spool op-byte bits 5-7: the address delta's length code ([`put_short_u64`]).
pub(crate) const OP_ADDR_SHIFT: u8 = 5;
/// Spool op byte that switches its stream to keyed events: from it on, every event is
/// followed by its order key (encoding 3; see [`MULTI_THREAD`] and [`event_key_at`]).
pub(crate) const OP_KEYED: u8 = 0x0e;
/// Spool op byte that switches its stream back to events without keys (encoding 5 and 6:
/// a period the thread owns, see [`event_key_at`]).
pub(crate) const OP_UNKEYED: u8 = 0x0c;
/// The spool's event encoding, named in its META: 5 is 3 (keyed events) with
/// [`OP_UNKEYED`].
pub(crate) const SPOOL_EVENTS_ENCODING: u64 = 5;
/// The encoding with stacks: as 5, and every allocation event carries a stack id (a prefix
/// varint after the address, before the key; 0 = none), and a stream may hold stack
/// definitions (op byte `0x0d`, see `stacks.rs`) (4 was this without [`OP_UNKEYED`]).
pub(crate) const SPOOL_EVENTS_ENCODING_STACKS: u64 = 6;

/// Set by cargo, or by `app/build.rs` when it compiles this file with a bare `rustc`.
pub(crate) const TRACER_VERSION: &str = match option_env!("CARGO_PKG_VERSION") {
    Some(v) => v,
    None => "unknown",
};

/// Creates this process's spool (`<prefix>.<pid>[.<n>].spool`) and writes its header.
pub(crate) unsafe fn open_spool() -> bool {
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
pub(crate) unsafe fn write_header(fd: c_int, pid: c_int) -> bool {
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
    // The clock word's time as the first events read it, not a fresh reading: masked, that can
    // be a 64 µs step later, and the first events would come before the start (a negative
    // time, which the text form cannot hold).
    let ns0 = match now_ns() {
        0 => tick_of(clock_ns(CLOCK_MONOTONIC) as u64),
        t => t,
    } as i64;
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
        if crate::sample::on() {
            // Only the sampled allocations carry a stack: readers weigh them (`sample.rs`).
            w.put(b"\nstack_sample_bytes=");
            w.put_dec(crate::sample::mean_bytes());
        }
    } else {
        w.put_dec(SPOOL_EVENTS_ENCODING);
    }
    if crate::clock::KEYS_USABLE.load(Ordering::Relaxed) {
        // Keys order the threads' events once several record: a reader then knows that after
        // that moment no period has events without keys from two threads.
        w.put(b"\norder_keys=tsc");
    }
    // Started stopped (`record --paused`) or by `allocview attach`: blocks allocated before
    // recording starts are freed in the trace without having been seen.
    let mid_run = crate::control::paused();
    #[cfg(target_arch = "x86_64")]
    let mid_run = mid_run || crate::inprocess::MID_RUN.load(Ordering::Acquire);
    if mid_run {
        w.put(b"\nstarted_mid_run=1");
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
/// prepare handler after ours took it, or a signal handler that interrupted a write):
/// waiting would never end.
pub(crate) fn write_frame(frame: &[u8]) {
    let fd = FD.load(Ordering::Acquire);
    if fd < 0 || !lock(&WRITE_LOCK) {
        return;
    }
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
pub(crate) fn write_flush_mark(before_ns: u64) {
    let mut frame = [0u8; 1 + 4 + 8];
    let mut w = StackWriter::new(&mut frame);
    w.put_u8(FRAME_FLUSHED);
    w.put_u32(8);
    w.put_u64(before_ns);
    write_frame(w.bytes());
}

/// A spool's frame holding one sample of the process's memory.
pub(crate) const FRAME_MEMORY: u8 = 0x14;

/// Writes a sample of the process's own memory, timed `tick` as a flush mark is: its resident
/// and anonymous resident bytes, read from `/proc/self/statm` (no allocation).
pub(crate) fn write_memory_sample(tick: u64) {
    let Some((resident_bytes, anon_bytes)) = statm_bytes() else {
        return;
    };
    let mut frame = [0u8; 1 + 4 + 24];
    let mut w = StackWriter::new(&mut frame);
    w.put_u8(FRAME_MEMORY);
    w.put_u32(24);
    w.put_u64(tick);
    w.put_u64(resident_bytes);
    w.put_u64(anon_bytes);
    write_frame(w.bytes());
}

/// `/proc/self/statm`'s resident pages, and those less the shared ones (anonymous memory),
/// in bytes.
fn statm_bytes() -> Option<(u64, u64)> {
    const SC_PAGESIZE: c_int = 30;
    let mut text = [0u8; 128];
    // SAFETY: reading a procfs file into a stack buffer; sysconf reads a constant.
    let (n, page) = unsafe {
        let fd = open(c"/proc/self/statm".as_ptr(), O_RDONLY | O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = read(fd, text.as_mut_ptr().cast(), text.len());
        close(fd);
        (usize::try_from(n).ok()?, sysconf(SC_PAGESIZE))
    };
    let page = u64::try_from(page).ok().filter(|&p| p > 0)?;
    let mut fields = text.get(..n)?.split(|&c| c == b' ').map(|f| {
        f.iter()
            .take_while(|c| c.is_ascii_digit())
            .fold(0u64, |v, &c| {
                v.saturating_mul(10).saturating_add(u64::from(c - b'0'))
            })
    });
    let (_, resident, shared) = (fields.next()?, fields.next()?, fields.next()?);
    Some((
        resident.saturating_mul(page),
        resident.saturating_sub(shared).saturating_mul(page),
    ))
}

/// Writes every slice, in order, retrying after short writes and EINTR.
pub(crate) unsafe fn write_all(fd: c_int, parts: &[&[u8]]) -> bool {
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
pub(crate) fn take_buf(t: &ThreadState) -> Option<&'static Buf> {
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

pub(crate) fn acquire_buf() -> Option<&'static Buf> {
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
            owner: AtomicU64::new(0),
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
pub(crate) fn start_stream(b: &Buf) {
    // Not held here: the buffer was just taken from the pool, or reset in a fork child; a
    // signal handler interrupting this thread finds it busy and records nothing.
    let locked = lock(&b.lock);
    b.committed.store(0, Ordering::Relaxed);
    b.flushed.store(0, Ordering::Relaxed);
    b.stream.store(
        NEXT_STREAM.fetch_add(1, Ordering::Relaxed),
        Ordering::Relaxed,
    );
    // SAFETY: plain syscall.
    b.tid.store(unsafe { gettid() } as u64, Ordering::Relaxed);
    b.owner.store(next_owner_id(), Ordering::Relaxed);
    if locked {
        unlock(&b.lock);
    }
}

/// Writes the unwritten complete events of `b` as one segment. Call with `b.lock` held.
pub(crate) fn write_segment(b: &Buf, wait: Wait) {
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
pub(crate) fn flush_own(b: &Buf) {
    // Never held here: the owner flushes between `enter` and `leave` (a signal handler's calls
    // then pass through) or at thread exit (the thread no longer records); should it be, the
    // events are dropped rather than written twice.
    if !lock(&b.lock) {
        return;
    }
    write_segment(b, Wait::Block);
    b.committed.store(0, Ordering::Relaxed);
    b.flushed.store(0, Ordering::Relaxed);
    unlock(&b.lock);
}

/// Writes the complete events of every buffer. In a signal handler that interrupted this
/// thread while it held a lock of the tracer's, the buffer it was writing is skipped; when
/// that lock is the file's, nothing is written (a segment is half-written, and another
/// thread holding a buffer's lock may be waiting for the file's).
pub(crate) fn flush_all(wait: Wait) {
    if held_here(&WRITE_LOCK) {
        return;
    }
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
