//! Time and order: the clock global the clock thread keeps, the order keys read once
//! several threads record, and the clock thread itself (which also flushes every buffer,
//! writes the flush marks and samples the process's memory).

use super::*;

// ---- time ----

/// How often the clock thread advances [`NOW_NS`]: the resolution of event times. It costs
/// the process one wake-up per period (measured in issue 8's closing note).
pub(crate) const CLOCK_PERIOD_NS: i64 = 1_000_000;
/// Clock periods between two flushes of every buffer by the clock thread (20 ms).
pub(crate) const FLUSH_EVERY_PERIODS: u32 = 20;
/// Clock periods between two samples of the process's memory (10 ms; a read of
/// `/proc/self/statm`, a few microseconds).
pub(crate) const MEMORY_EVERY_PERIODS: u32 = 10;

/// `CLOCK_MONOTONIC` nanoseconds as of the clock thread's latest tick, in its high bits
/// (what events carry: [`tick_of`]), and the period's owner in its low [`OWNER_BITS`] (see
/// [`event_key_at`]). Only one thread stores a new time at a time (initialisation, then the
/// clock thread; in a fork child the fork handler, then the child's clock thread), always a
/// fresh reading, so it never goes back; recording threads only change the owner bits, by
/// compare-and-swap, so the time and the owner an event reads come from one load.
pub(crate) static NOW_NS: AtomicU64 = AtomicU64::new(0);

/// The low bits of [`NOW_NS`] that name the period's owner (times keep a resolution of 64 µs
/// above them, finer than the clock period).
pub(crate) const OWNER_BITS: u64 = 0xffff;
/// No thread has recorded in the period since several threads record.
const OWNER_NONE: u64 = 0;
/// Several threads have recorded in the period: every event of it from then on is keyed.
const OWNER_SHARED: u64 = OWNER_BITS;
/// The owner ids of streams (1 to `OWNER_SHARED - 1`; 0 once they run out: such a stream
/// never owns a period and keys every event).
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// A new stream's owner id.
pub(crate) fn next_owner_id() -> u64 {
    let id = NEXT_OWNER.fetch_add(1, Ordering::Relaxed);
    if id < OWNER_SHARED { id } else { 0 }
}

/// The time in a [`NOW_NS`] word.
#[inline(always)]
pub(crate) fn tick_of(word: u64) -> u64 {
    word & !OWNER_BITS
}

/// The clock word: the time an event carries, and the period's owner.
#[inline(always)]
pub(crate) fn now_word() -> u64 {
    NOW_NS.load(Ordering::Relaxed)
}

/// The time an event carries.
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    tick_of(now_word())
}

pub(crate) fn clock_ns(clock: c_int) -> i64 {
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

/// Advances [`NOW_NS`] to the current time, which starts a period with no owner; a time
/// that has not moved past the owner bits leaves the period (and its owner) as it is.
pub(crate) fn tick_clock() {
    let tick = tick_of(clock_ns(CLOCK_MONOTONIC) as u64);
    if tick_of(now_word()) != tick {
        NOW_NS.store(tick, Ordering::Relaxed);
    }
}

// ---- order keys (several threads) ----

/// Set when a second application thread takes a buffer (its first recorded call; the clock
/// thread never records), on machines with usable keys ([`KEYS_USABLE`]). From then on every
/// event also carries an order key, which orders the events of different threads that share
/// a clock period exactly. While one thread records, events have none: the key read costs
/// more than the rest of the record, and one thread's order is the order of its buffer.
/// Never cleared: a stream that carries keys carries them to its end.
pub(crate) static MULTI_THREAD: AtomicBool = AtomicBool::new(false);
/// Application threads that have taken a buffer so far.
pub(crate) static RECORDING_THREADS: AtomicU32 = AtomicU32::new(0);
/// The CPU has `rdtscp` and an invariant TSC (one rate, counting in every power state); with
/// Linux's TSC clocksource, which it only keeps when the TSC is synchronised across CPUs,
/// that makes keys of different CPUs comparable. Set at initialisation.
pub(crate) static KEYS_USABLE: AtomicBool = AtomicBool::new(false);

#[inline(always)]
pub(crate) fn multi_thread() -> bool {
    MULTI_THREAD.load(Ordering::Relaxed)
}

/// Called when a thread takes its first buffer.
pub(crate) fn note_recording_thread() {
    if RECORDING_THREADS.fetch_add(1, Ordering::Relaxed) >= 1 && KEYS_USABLE.load(Ordering::Relaxed)
    {
        MULTI_THREAD.store(true, Ordering::Relaxed);
    }
}

/// Whether this machine's TSC can order events across CPUs (see [`KEYS_USABLE`]).
#[cfg(target_arch = "x86_64")]
pub(crate) fn keys_usable() -> bool {
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
pub(crate) fn tsc_is_the_clocksource() -> bool {
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
pub(crate) fn keys_usable() -> bool {
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
pub(crate) fn order_key() -> Option<u64> {
    let mut aux = 0u32;
    // SAFETY: only called once MULTI_THREAD is set, which requires rdtscp (keys_usable).
    #[allow(unused_unsafe)]
    Some(unsafe { std::arch::x86_64::__rdtscp(&mut aux) })
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn order_key() -> Option<u64> {
    None
}

/// The key of an event that read the clock word `word` (where the call is: after an
/// allocation's real call, before a free's). While one thread records, none. Once several
/// do, none either while the calling thread owns the period (it was the first to record in
/// it and no other thread has since): one thread's events of a period are ordered by its
/// stream. The first event of another thread in the period marks it shared, and from then
/// on every event of the period carries a key. The loader puts a period's events without a
/// key first, then the keyed ones by key: no event without a key can depend on a keyed one,
/// since it read the word before the mark (a later reader, which anything depending on the
/// marking event is, sees the mark, or a later period).
#[inline(always)]
pub(crate) fn event_key_at(t: &ThreadState, word: u64) -> Option<u64> {
    if !multi_thread() {
        return None;
    }
    let me = t.owner.get();
    if me != 0 && word & OWNER_BITS == me {
        return None;
    }
    claim_or_key(me, word)
}

/// [`event_key_at`]'s slow path: claims a period without an owner, or marks it shared and
/// reads a key.
#[inline(never)]
fn claim_or_key(me: u64, word: u64) -> Option<u64> {
    let mut w = word;
    loop {
        let owner = w & OWNER_BITS;
        let next = match owner {
            OWNER_SHARED => return order_key(),
            _ if me != 0 && owner == me => return None,
            OWNER_NONE if me != 0 => tick_of(w) | me,
            _ => tick_of(w) | OWNER_SHARED,
        };
        match NOW_NS.compare_exchange(w, next, Ordering::SeqCst, Ordering::Relaxed) {
            Ok(_) if next & OWNER_BITS == me => return None,
            Ok(_) => return order_key(),
            // A new period began: this event's is over, and whoever reads the word after
            // this one sees the new period, so a key orders this event among the old one's.
            Err(now) if tick_of(now) != tick_of(w) => return order_key(),
            Err(now) => w = now,
        }
    }
}

// ---- the clock thread ----

/// The generation of the newest clock thread of this process (see [`clock_main`]).
pub(crate) static CLOCK_GEN: AtomicU32 = AtomicU32::new(0);

/// Stack of the clock thread: it only sleeps, reads clocks and writes buffers out.
pub(crate) const CLOCK_STACK_BYTES: usize = 128 << 10;

/// Starts this process's clock thread, once per process. It is created with every signal
/// blocked (it inherits the mask), so no signal meant for the program is handled on it.
pub(crate) fn start_clock() {
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
        let generation = CLOCK_GEN.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        let rc = pthread_create(
            &mut thread,
            &attr,
            clock_main,
            generation as usize as *mut c_void,
        );
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

/// The clock thread's loop; `arg` is its generation ([`CLOCK_GEN`] when it started): it ends
/// when a newer one is started or in-process tracking stops its run.
pub(crate) unsafe extern "C" fn clock_main(arg: *mut c_void) -> *mut c_void {
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
    let mut until_memory = 1;
    let generation = arg as usize as u32;
    loop {
        // SAFETY: a plain sleep; an early wake-up (a signal cannot arrive, all are blocked)
        // only makes one period shorter.
        unsafe { nanosleep(&period, null_mut()) };
        tick_clock();
        #[cfg(target_arch = "x86_64")]
        crate::python::poll();
        // In-process tracking stopped its run (or started another, with a clock of its own).
        if CLOCK_GEN.load(Ordering::Acquire) != generation {
            return null_mut();
        }
        until_memory -= 1;
        if until_memory == 0 {
            until_memory = MEMORY_EVERY_PERIODS;
            if STATE.load(Ordering::Acquire) == STATE_TRACING && !control::paused() {
                write_memory_sample(now_ns());
            }
        }
        until_flush -= 1;
        if until_flush == 0 {
            until_flush = FLUSH_EVERY_PERIODS;
            // Objects loaded since (in-process tracking): a look at the loader's list takes
            // its lock, so once a flush period, not every clock period.
            #[cfg(target_arch = "x86_64")]
            crate::inprocess::poll();
            if STATE.load(Ordering::Acquire) == STATE_TRACING {
                control::poll();
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
pub(crate) fn live_threads() -> Option<u64> {
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
