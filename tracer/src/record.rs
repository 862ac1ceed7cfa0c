//! Recording one event: entering the tracer, encoding into the thread's buffer, the order
//! key and the stack, and leaving.

use super::*;

// ---- recording ----

/// Enters the tracer for one record: the calling thread's state and where its event goes,
/// when the call is to be recorded. Until [`leave`], nested calls of this thread (a signal
/// handler's) pass through.
#[inline(always)]
pub(crate) fn enter() -> Option<(&'static ThreadState, *mut u8)> {
    let t = tls()?;
    let mut cursor = t.cursor.get();
    if cursor.is_null() || t.epoch.get() != EPOCH.load(Ordering::Relaxed) {
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
pub(crate) fn enter_slow(t: &ThreadState) -> Option<*mut u8> {
    if t.epoch.get() != EPOCH.load(Ordering::Acquire) {
        return new_run(t);
    }
    if t.busy.get()
        || !t.buf.get().is_null()
        || STATE.load(Ordering::Acquire) != STATE_TRACING
        || control::paused()
    {
        return None;
    }
    // Its first stream belongs to this run.
    t.epoch.set(EPOCH.load(Ordering::Acquire));
    let busy = Busy::new();
    let b = take_buf(t);
    drop(busy);
    b.map(Buf::data)
}

/// The first call of a thread since in-process tracking started or stopped a run: its
/// stream starts again in its buffer (or it takes one), or, with no run on, it records
/// nothing.
#[cold]
#[inline(never)]
fn new_run(t: &ThreadState) -> Option<*mut u8> {
    if t.busy.get() {
        return None;
    }
    t.epoch.set(EPOCH.load(Ordering::Acquire));
    t.cursor.set(null_mut());
    if STATE.load(Ordering::Acquire) != STATE_TRACING || control::paused() {
        return None;
    }
    let b = t.buf.get();
    if b.is_null() {
        let busy = Busy::new();
        let b = take_buf(t);
        drop(busy);
        return b.map(Buf::data);
    }
    // SAFETY: the thread's own buffer, never unmapped.
    let b = unsafe { &*b };
    // Recording resumed (`control.rs`): an event the thread finished after the stop's flush
    // is still there, and goes out before the new stream starts.
    let busy = Busy::new();
    flush_own(b);
    drop(busy);
    start_stream(b);
    t.start_at(b);
    Some(b.data())
}

/// Ends a record: `cursor` is where the next event goes.
#[inline(always)]
pub(crate) fn leave(t: &ThreadState, cursor: *mut u8) {
    // The record is complete before a signal handler can see the cursor again.
    compiler_fence(Ordering::SeqCst);
    t.cursor.set(cursor);
}

/// Appends one event (between [`enter`] and [`leave`]) and returns the new cursor. `key` is
/// the event's order key, when several threads record; `stack` its stack id (with stacks on,
/// every allocation has one, 0 when none was captured; frees never do).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn append(
    t: &ThreadState,
    cursor: *mut u8,
    op: u8,
    size: u64,
    addr: u64,
    time_ns: u64,
    key: Option<u64>,
    stack: Option<u64>,
) -> *mut u8 {
    let (b, cursor) = append_start(t, cursor, time_ns);
    append_event(t, b, cursor, op, size, addr, key, stack)
}

/// The start of every record (between [`enter`] and [`leave`]): the thread's buffer, written
/// out first when full, and the time change when the time moved; returns where what follows
/// goes (an event, or a heap prefix before it: `heaps.rs`).
#[inline(always)]
pub(crate) fn append_start(
    t: &ThreadState,
    mut cursor: *mut u8,
    time_ns: u64,
) -> (&'static Buf, *mut u8) {
    // SAFETY: the thread's buffer, never unmapped.
    let b = unsafe { &*t.buf.get() };
    if cursor > t.last_start.get() {
        flush_own(b);
        cursor = b.data();
    }
    if time_ns != t.prev_ns.get() {
        cursor = append_time(t, cursor, time_ns);
    }
    (b, cursor)
}

/// The event itself, after [`append_start`]: keyed or not, published; returns the new
/// cursor.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn append_event(
    t: &ThreadState,
    b: &Buf,
    mut cursor: *mut u8,
    op: u8,
    size: u64,
    addr: u64,
    key: Option<u64>,
    stack: Option<u64>,
) -> *mut u8 {
    let Some(key) = key else {
        if t.keyed.get() {
            cursor = append_unkeyed(t, cursor);
        }
        return append_at(t, b, cursor, op, size, addr, stack);
    };
    append_keyed(t, b, cursor, op, size, addr, key, stack)
}

/// Switches the stream back to events without keys (a period this thread owns, see
/// [`event_key_at`]) and returns where the event goes.
#[cold]
#[inline(never)]
pub(crate) fn append_unkeyed(t: &ThreadState, cursor: *mut u8) -> *mut u8 {
    t.keyed.set(false);
    // SAFETY: within the room `append` checked (MAX_EVENT_BYTES counts the switch).
    unsafe {
        cursor.write(OP_UNKEYED);
        cursor.add(1)
    }
}

/// Encodes one event at `cursor`, publishes it and returns the new cursor.
#[inline(always)]
pub(crate) fn append_at(
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
pub(crate) fn encode_at(
    t: &ThreadState,
    cursor: *mut u8,
    op: u8,
    size: u64,
    addr: u64,
    stack: Option<u64>,
) -> *mut u8 {
    // Tagged with the allocator that served it (never a null result).
    let addr = if addr == 0 {
        0
    } else {
        addr | t.addr_tag.get()
    };
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
pub(crate) fn commit(b: &Buf, end: *mut u8) -> *mut u8 {
    b.committed.store(end as usize, Ordering::Release);
    end
}

/// Encodes an event with its order key (a zigzag prefix varint of the difference from the
/// stream's previous key, after the address), switching the stream to keyed events first
/// if it is not; publishes it and returns the new cursor.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn append_keyed(
    t: &ThreadState,
    b: &Buf,
    mut cursor: *mut u8,
    op: u8,
    size: u64,
    addr: u64,
    key: u64,
    stack: Option<u64>,
) -> *mut u8 {
    // SAFETY: within the room `append` checked (MAX_EVENT_BYTES counts the switch and the key).
    unsafe {
        if !t.keyed.get() {
            cursor.write(OP_KEYED);
            cursor = cursor.add(1);
            t.keyed.set(true);
        }
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
pub(crate) fn append_time(t: &ThreadState, cursor: *mut u8, time_ns: u64) -> *mut u8 {
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
/// otherwise. It calls nothing, so the wrappers' hot path saves no registers. `stack` is the
/// stack id field (an allocation's, with stacks on; `None` otherwise).
#[inline(always)]
pub(crate) fn record_fast(op: u8, size: u64, addr: u64, time_ns: u64, stack: Option<u64>) -> bool {
    let Some(t) = tls() else {
        return false;
    };
    let cursor = t.cursor.get();
    if cursor.is_null() || t.epoch.get() != EPOCH.load(Ordering::Relaxed) {
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
    let next = append_at(t, b, cursor, op, size, addr, stack);
    leave(t, next);
    true
}

/// Any event: takes a buffer, writes a full one out, notes a time change, and, when several
/// threads record, reads the order key (see [`event_key_at`]: `word` is the clock word the
/// wrapper read after an allocation's real call, before a free's). The path of every event
/// once several threads record.
#[inline(never)]
pub(crate) fn record_slow(op: u8, size: u64, addr: u64, word: u64, stack: Option<u64>) {
    if let Some((t, cursor)) = enter() {
        // Decided after enter: a thread's first call takes its buffer there, and may be the
        // one that makes the process multi-threaded.
        let key = event_key_at(t, word);
        let next = append(t, cursor, op, size, addr, tick_of(word), key, stack);
        leave(t, next);
    }
}

/// The stack of the allocation being recorded, captured between [`enter`] and [`leave`]
/// (its definition, when new, written at `cursor`): the new cursor and the event's stack
/// field, `None` when stacks are off.
#[inline(always)]
pub(crate) fn stack_of(t: &ThreadState, cursor: *mut u8) -> (*mut u8, Option<u64>) {
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

/// The stack field of an allocation whose stack was not walked (not sampled), or 0 when none
/// could be captured.
const NO_STACK_ID: Option<u64> = Some(0);

/// The stack of an allocation of `size` bytes entered before its real call (see
/// [`stack_of`]): with sampled stacks, walked only when the allocation is sampled.
#[inline(always)]
pub(crate) fn stack_of_sampled(
    t: &ThreadState,
    cursor: *mut u8,
    size: usize,
) -> (*mut u8, Option<u64>) {
    if stacks_on() && crate::sample::on() && !crate::sample::take(t, size) {
        return (cursor, NO_STACK_ID);
    }
    stack_of(t, cursor)
}

/// Records an allocation (stacks on): with its stack, or, with sampled stacks and the
/// allocation not sampled, the way events without stacks are (stack id 0). `p` is returned.
#[inline(always)]
pub(crate) fn record_alloc_with_stack(call: u8, size: usize, p: *mut c_void) -> *mut c_void {
    if crate::sample::on()
        && let Some(t) = tls()
        && !crate::sample::take(t, size)
    {
        let word = now_word();
        if multi_thread() || !record_fast(call, size as u64, p as u64, tick_of(word), NO_STACK_ID) {
            record_slow(call, size as u64, p as u64, word, NO_STACK_ID);
        }
        return p;
    }
    record_alloc_stacked(call, size, p)
}

/// Records an allocation with its stack (stacks on); `p` is returned. The capture is inlined
/// here: the walk starts with two frames of the tracer's (this one and `malloc`'s) instead of
/// four.
#[inline(never)]
pub(crate) fn record_alloc_stacked(call: u8, size: usize, p: *mut c_void) -> *mut c_void {
    match enter() {
        // Sampled already (see `record_alloc_with_stack`).
        Some((t, cursor)) => finish_alloc_here(t, cursor, call, size, p, false),
        None => p,
    }
}

/// Records an allocation; the clock `word` was read after the real call returned. Returns
/// `p`, for the wrapper to return.
#[inline(always)]
pub(crate) fn record_alloc(call: u8, size: usize, p: *mut c_void, word: u64) -> *mut c_void {
    if multi_thread() || !record_fast(call, size as u64, p as u64, tick_of(word), None) {
        record_slow(call, size as u64, p as u64, word, None);
    }
    p
}

/// `free`'s slow path: records the call, then makes it (a tail call from the wrapper, which
/// then needs no registers saved).
#[inline(never)]
pub(crate) unsafe fn free_slow(f: FreeFn, p: *mut c_void, word: u64) {
    record_slow(CALL_FREE | OP_FREE, 0, p as u64, word, None);
    unsafe { f(p) }
}

// The functions other than malloc and free enter the tracer before their real call, so that
// what the real function calls of ours is not recorded a second time (glibc's reallocarray
// calls realloc). malloc and free, the hot ones, record outside the real call (calls that an
// allocator's malloc or free makes to these functions would be recorded: glibc's make none).

/// Ends an allocation-like call entered before its real call: records it, returns `p`.
#[inline(never)]
pub(crate) fn finish_alloc(
    t: &ThreadState,
    cursor: *mut u8,
    call: u8,
    size: usize,
    p: *mut c_void,
) -> *mut c_void {
    finish_alloc_here(t, cursor, call, size, p, true)
}

#[inline(always)]
fn finish_alloc_here(
    t: &ThreadState,
    cursor: *mut u8,
    call: u8,
    size: usize,
    p: *mut c_void,
    sample: bool,
) -> *mut c_void {
    let word = now_word();
    let key = event_key_at(t, word);
    let (cursor, stack) = if sample {
        stack_of_sampled(t, cursor, size)
    } else {
        stack_of(t, cursor)
    };
    let next = append(
        t,
        cursor,
        call,
        size as u64,
        p as u64,
        tick_of(word),
        key,
        stack,
    );
    leave(t, next);
    p
}

/// The time and order key of a realloc's free half, read before its real call.
#[derive(Clone, Copy)]
pub(crate) struct Before {
    pub(crate) time_ns: u64,
    pub(crate) key: Option<u64>,
}

impl Before {
    #[inline(always)]
    pub(crate) fn now(t: &ThreadState) -> Self {
        let word = now_word();
        Self {
            time_ns: tick_of(word),
            key: event_key_at(t, word),
        }
    }
}

/// Ends a realloc-like call entered before its real call: records the free of the old block
/// (`before`, read before the call) and the allocation of the new one.
#[inline(never)]
pub(crate) fn finish_realloc(
    t: &ThreadState,
    mut cursor: *mut u8,
    call: u8,
    old: *mut c_void,
    size: usize,
    new: *mut c_void,
    before: Before,
) -> *mut c_void {
    let after = now_word();
    let (after_ns, after_key) = (tick_of(after), event_key_at(t, after));
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
        let (cursor, stack) = stack_of_sampled(t, cursor, size as usize);
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
