//! The program's own heaps: the functions `include/allocview.h` declares weak (and the
//! `allocview-heap` crate finds with `dlsym`), through which a program reports its own
//! allocator's events (an arena, a pool, a GPU memory manager), and the USDT probes of
//! `usdt.rs` feed. Their events go into the calling thread's stream exactly as malloc's do
//! (time, order key, stack when stacks are on), each after a heap prefix: op byte
//! [`OP_HEAP_PREFIX`], then the heap id as a prefix varint. Names go in [`FRAME_HEAPS`]
//! frames (varint id, then the name's bytes). The reader is `loaders/src/binary/heaps.rs`.
//!
//! Heap 0 is the malloc family's: a call naming it is refused (ignored), as is every call
//! made while the tracer is not recording (no spool, or from inside the tracer).

use super::*;

/// Spool op (encodings 3 and later): the next event belongs to the heap whose id (a prefix
/// varint, not 0) follows. Call code 11 with the free bit: no event's op byte.
pub(crate) const OP_HEAP_PREFIX: u8 = 0x1b;
/// A spool's frame naming a heap: varint id, then the name's bytes (UTF-8, no NUL).
pub(crate) const FRAME_HEAPS: u8 = 0x18;
/// Bytes of a heap name kept (a longer one is cut).
const MAX_NAME_BYTES: usize = 255;
/// Bytes a heap prefix may write (op byte, prefix varint stored whole).
pub(crate) const HEAP_PREFIX_BYTES: usize = 1 + PREFIX_VARINT_STORE_BYTES;

/// Records that the program's heap `heap` handed out `size` bytes at `ptr`.
///
/// # Safety
/// Any arguments: nothing is dereferenced.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn allocview_heap_alloc(heap: u32, ptr: *const c_void, size: usize) {
    if heap != 0 {
        record_heap(heap, CALL_MALLOC, size as u64, ptr as u64);
    }
}

/// Records that the program's heap `heap` took back the block at `ptr`.
///
/// # Safety
/// Any arguments: nothing is dereferenced.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn allocview_heap_free(heap: u32, ptr: *const c_void) {
    if heap != 0 {
        record_heap(heap, CALL_FREE | OP_FREE, 0, ptr as u64);
    }
}

/// Names the program's heap `heap` (`name`: NUL-terminated, UTF-8; at most 255 bytes kept,
/// copied at once). A later name replaces an earlier one.
///
/// # Safety
/// `name` is null or points to a NUL-terminated string.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn allocview_heap_name(heap: u32, name: *const c_char) {
    if heap == 0 || name.is_null() {
        return;
    }
    let mut len = 0;
    // SAFETY: the caller's NUL-terminated string, read up to its NUL or our limit.
    while len < MAX_NAME_BYTES && unsafe { name.add(len).read() } != 0 {
        len += 1;
    }
    // SAFETY: the `len` bytes just read.
    let bytes = unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len) };
    write_name(heap, bytes);
}

/// Writes a heap's name frame, when recording.
pub(crate) fn write_name(heap: u32, name: &[u8]) {
    // The first call into the tracer may be this one: initialise as malloc would.
    if real(&REAL.malloc).is_none() || STATE.load(Ordering::Acquire) != STATE_TRACING || is_busy() {
        return;
    }
    let _busy = Busy::new();
    remember_name(heap, name);
    write_name_frame(heap, name);
}

/// Heap names kept for the spool of a forked child (whose parent's spool got the frames).
const MAX_KEPT_NAMES: usize = 32;

struct KeptNames {
    names: std::cell::UnsafeCell<[(u32, usize, [u8; MAX_NAME_BYTES]); MAX_KEPT_NAMES]>,
    lock: AtomicUsize,
}

// SAFETY: the table is read and written under `lock` (and by a fork child alone).
unsafe impl Sync for KeptNames {}

static KEPT: KeptNames = KeptNames {
    names: std::cell::UnsafeCell::new([(0, 0, [0; MAX_NAME_BYTES]); MAX_KEPT_NAMES]),
    lock: AtomicUsize::new(0),
};

/// Keeps `heap`'s latest name (the first [`MAX_KEPT_NAMES`] heaps named).
pub(crate) fn remember_name(heap: u32, name: &[u8]) {
    if !lock(&KEPT.lock) {
        return;
    }
    // SAFETY: under the lock.
    let names = unsafe { &mut *KEPT.names.get() };
    let name = name.get(..MAX_NAME_BYTES).unwrap_or(name);
    if let Some(slot) = names.iter_mut().find(|(id, _, _)| *id == heap || *id == 0) {
        slot.0 = heap;
        slot.1 = name.len();
        if let Some(dst) = slot.2.get_mut(..name.len()) {
            dst.copy_from_slice(name);
        }
    }
    unlock(&KEPT.lock);
}

/// In a fork child, once its spool is open: the names the parent's program gave its heaps.
pub(crate) fn rename_in_child() {
    // The child has one thread: a lock another thread of the parent held is nobody's now.
    KEPT.lock.store(0, Ordering::Release);
    // SAFETY: the child's only thread.
    let names = unsafe { &*KEPT.names.get() };
    for (id, len, bytes) in names.iter().filter(|(id, _, _)| *id != 0) {
        write_name_frame(*id, bytes.get(..*len).unwrap_or(&[]));
    }
}

/// Writes a heap's name frame to the spool (when it is open).
pub(crate) fn write_name_frame(heap: u32, name: &[u8]) {
    let name = name.get(..MAX_NAME_BYTES).unwrap_or(name);
    let mut frame = [0u8; 1 + 4 + MAX_VARINT_BYTES + MAX_NAME_BYTES];
    let mut id = [0u8; MAX_VARINT_BYTES];
    // SAFETY: room for a varint of a u32.
    let id_len = unsafe { put_varint(id.as_mut_ptr(), u64::from(heap)) };
    let mut w = StackWriter::new(&mut frame);
    w.put_u8(FRAME_HEAPS);
    w.put_u32((id_len + name.len()) as u32);
    w.put(id.get(..id_len).unwrap_or(&[]));
    w.put(name);
    if !w.overflowed() {
        write_frame(w.bytes());
    }
}

/// Records one event of heap `heap` in the calling thread's stream.
#[inline(never)]
pub(crate) fn record_heap(heap: u32, op: u8, size: u64, addr: u64) {
    // A first call of the process into the tracer initialises it, as malloc's would.
    if real(&REAL.malloc).is_none() {
        return;
    }
    let Some((t, cursor)) = enter() else {
        return;
    };
    let word = now_word();
    let key = event_key_at(t, word);
    // Sampled as malloc's allocations are (`record --stack-sample`): readers weigh every
    // allocation with a stack as a sample.
    let (cursor, stack) = if op & OP_FREE == 0 {
        stack_of_sampled(t, cursor, usize::try_from(size).unwrap_or(usize::MAX))
    } else {
        (cursor, None)
    };
    let next = append_heap(t, cursor, heap, op, size, addr, tick_of(word), key, stack);
    leave(t, next);
}

/// Records one event of heap `heap` without a call stack (from a signal handler: the
/// unwinder does not cross the signal frame).
pub(crate) fn record_heap_unstacked(heap: u32, op: u8, size: u64, addr: u64) {
    if real(&REAL.malloc).is_none() {
        return;
    }
    let Some((t, cursor)) = enter() else {
        return;
    };
    let word = now_word();
    let key = event_key_at(t, word);
    let stack = (stacks_on() && op & OP_FREE == 0).then_some(0);
    let next = append_heap(t, cursor, heap, op, size, addr, tick_of(word), key, stack);
    leave(t, next);
}

/// [`append`] with a heap prefix before the event (after its time change).
#[allow(clippy::too_many_arguments)]
fn append_heap(
    t: &ThreadState,
    cursor: *mut u8,
    heap: u32,
    op: u8,
    size: u64,
    addr: u64,
    time_ns: u64,
    key: Option<u64>,
    stack: Option<u64>,
) -> *mut u8 {
    let (b, mut cursor) = append_start(t, cursor, time_ns);
    // SAFETY: within the room `append_start` made (MAX_EVENT_BYTES counts the prefix).
    unsafe {
        cursor.write(OP_HEAP_PREFIX);
        cursor = cursor.add(1 + put_prefix_varint(cursor.add(1), u64::from(heap)));
    }
    // The address is the program's own: no allocator tag (those are for Python's).
    let tag = t.addr_tag.replace(0);
    let next = append_event(t, b, cursor, op, size, addr, key, stack);
    t.addr_tag.set(tag);
    next
}
