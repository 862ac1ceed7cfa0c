//! Call stacks of allocations: captured with [`crate::unwind`], deduplicated in a
//! process-wide lock-free table, and written once each into the capturing thread's event
//! stream as a stack definition, so that an allocation event carries only a stack id.
//!
//! The table maps a 64-bit hash of a stack (its return addresses and how its walk ended) to
//! its id: open addressing over [`TABLE_SLOTS`] slots of a lazily `mmap`ed block, a slot
//! claimed with one compare-and-swap of its hash; the thread that claims it takes the next id,
//! writes the definition into its own stream, then publishes the id (a thread that finds the
//! hash before the id is published waits for it: a few instructions later). Two different
//! stacks with equal 64-bit hashes would share an id (odds about n²/2⁶⁵). When the probe
//! sequence is full, the stack gets a fresh id and a definition of its own every time.
//!
//! A stack definition in the spool (op byte `0x0d`, in event encoding 4): the id as a prefix
//! varint, how the walk ended (u8, [`End`]), the number of frames (u8), then each frame's
//! address as a zigzag LEB128 varint of its difference from the previous one's (the first
//! from 0), innermost first: the first is the return address into the code that called the
//! allocation function.

use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::encode::{PREFIX_VARINT_STORE_BYTES, put_prefix_varint, put_varint, zigzag};
use crate::modules::{self, Module, Names};
use crate::python::{self, MAX_PY_FRAMES, PyFrame};
use crate::unwind::{self, End, MAX_DEPTH, Regs};
use crate::{Buf, ThreadState};

/// The op byte of a stack definition in a stream.
pub const OP_STACK: u8 = 0x0d;
/// Most bytes a definition takes.
pub const MAX_DEF_BYTES: usize = 1 + PREFIX_VARINT_STORE_BYTES + 2 + MAX_DEPTH * 10;
/// Slots of the stack table (16 bytes each: 16 MiB of address space, touched as used).
const TABLE_SLOTS: usize = 1 << 20;
/// Slots looked at before giving up on interning a stack.
const MAX_PROBES: usize = 64;

#[repr(C)]
struct Slot {
    hash: AtomicU64,
    id: AtomicU64,
}

static TABLE: AtomicPtr<Slot> = AtomicPtr::new(null_mut());
/// The next stack id (0 means "no stack").
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// The tracer's own code, whose frames start every walk and are left out.
static TRACER_LO: AtomicU64 = AtomicU64::new(0);
static TRACER_HI: AtomicU64 = AtomicU64::new(0);

/// Stack ids a thread keeps for itself (16 bytes each: 8 KiB), by hash.
const THREAD_ID_SLOTS: usize = 1 << 9;

/// What a thread's captures remember between calls, kept in its buffer's header pages (see
/// [`MEMO_OFFSET`]): the rules its walks met, and the ids of the stacks it captured, so that
/// a stack met again costs no read of the shared table (16 MiB, written by every thread).
#[repr(C)]
pub struct ThreadMemo {
    frames: unwind::Memo,
    /// `[hash, id]`, direct-mapped by the hash's low bits.
    ids: [[u64; 2]; THREAD_ID_SLOTS],
}

impl ThreadMemo {
    /// The id this thread took for the stack with hash `h`, if it still remembers it.
    #[inline(always)]
    fn known_id(&self, h: u64) -> Option<u64> {
        match self.ids.get((h as usize) & (THREAD_ID_SLOTS - 1)) {
            Some(&[seen, id]) if seen == h && id != 0 => Some(id),
            _ => None,
        }
    }

    fn note_id(&mut self, h: u64, id: u64) {
        if let Some(slot) = self.ids.get_mut((h as usize) & (THREAD_ID_SLOTS - 1)) {
            *slot = [h, id];
        }
    }
}

/// Where a [`ThreadMemo`] sits in a buffer's block: after the [`Buf`] header, inside the
/// header pages (the event data starts at `DATA_OFFSET_BYTES`).
const MEMO_OFFSET: usize = 512;
const _: () = assert!(std::mem::size_of::<Buf>() <= MEMO_OFFSET);
const _: () = assert!(MEMO_OFFSET + std::mem::size_of::<ThreadMemo>() <= crate::DATA_OFFSET_BYTES);

/// The memo in `b`'s header pages. Only the buffer's owner uses it, between `enter` and
/// `leave` (so never re-entered).
#[allow(clippy::mut_from_ref)]
fn memo_of(b: &Buf) -> &mut ThreadMemo {
    // SAFETY: the header pages are mapped with the buffer, zero-filled at first (an empty
    // memo), page-aligned, and no other code touches the bytes from MEMO_OFFSET on.
    unsafe {
        &mut *std::ptr::from_ref(b)
            .cast_mut()
            .cast::<u8>()
            .add(MEMO_OFFSET)
            .cast::<ThreadMemo>()
    }
}

/// Forgets a buffer's stack ids (a fork child's ids start again).
pub fn forget_stack_ids(b: &Buf) {
    forget_stack_ids_of(memo_of(b));
}

fn forget_stack_ids_of(memo: &mut ThreadMemo) {
    memo.ids.fill([0; 2]);
}

/// In a fork child: ids start again (its spool has none of the parent's definitions).
pub fn reset_after_fork() {
    TABLE.store(null_mut(), Ordering::Release);
    NEXT_ID.store(1, Ordering::Release);
    python::frames::reset_after_fork();
    modules::reset_lock_after_fork();
}

/// The calling thread's stack, `[lo, hi)`, found once per thread from the mapping that holds
/// `sp` in `/proc/self/maps` (`(1, 1)` when not found: such a thread records no stacks).
/// Not `pthread_getattr_np`: it takes the thread's lock, and allocates under it, so a program
/// that calls it (Rust's runtime does) would find the tracer waiting for that very lock.
/// The main thread's stack grows down: its `lo` is put 64 MiB below its top (reads are
/// bounded below by the walk's stack pointer anyway).
fn thread_stack(t: &ThreadState, sp: u64) -> (u64, u64) {
    let hi = t.stack_hi.get();
    if hi != 0 {
        return (t.stack_lo.get(), hi);
    }
    let (lo, hi) = match mapping_of(sp) {
        Some((lo, hi, true)) => (lo.min(hi.saturating_sub(64 << 20)), hi),
        Some((lo, hi, false)) => (lo, hi),
        None => (1, 1),
    };
    t.stack_lo.set(lo);
    t.stack_hi.set(hi);
    (lo, hi)
}

/// The mapping of `/proc/self/maps` that holds `addr`: start, end, and whether it is the
/// main thread's `[stack]`. Reads with plain system calls into a stack buffer. Never inlined:
/// its 8 KiB buffer would make the frame of every capture that large (two stack pages
/// probed per allocation).
#[cold]
#[inline(never)]
fn mapping_of(addr: u64) -> Option<(u64, u64, bool)> {
    // SAFETY: a plain open of a procfs file.
    let fd = unsafe {
        crate::open(
            c"/proc/self/maps".as_ptr(),
            crate::O_RDONLY | crate::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 8192];
    let mut have = 0usize;
    let mut found = None;
    while let Some(free) = buf.get_mut(have..) {
        // SAFETY: reading into the free part of a local buffer.
        let n = unsafe { crate::read(fd, free.as_mut_ptr().cast(), free.len()) };
        let Ok(n) = usize::try_from(n) else {
            break;
        };
        have += n;
        let data = buf.get(..have).unwrap_or(&[]);
        let mut used = 0;
        while let Some(nl) = data
            .get(used..)
            .and_then(|d| d.iter().position(|&c| c == b'\n'))
        {
            let line = data.get(used..used + nl).unwrap_or(&[]);
            used += nl + 1;
            if let Some((lo, hi)) = parse_range(line)
                && addr >= lo
                && addr < hi
            {
                found = Some((lo, hi, line.ends_with(b"[stack]")));
            }
        }
        if found.is_some() || n == 0 || (used == 0 && have == buf.len()) {
            break;
        }
        buf.copy_within(used..have, 0);
        have -= used;
    }
    // SAFETY: our own descriptor.
    unsafe { crate::close(fd) };
    found
}

/// `start-end` at the start of a maps line.
fn parse_range(line: &[u8]) -> Option<(u64, u64)> {
    let hex = |s: &[u8]| -> Option<u64> {
        if s.is_empty() || s.len() > 16 {
            return None;
        }
        s.iter().try_fold(0u64, |v, &c| {
            let d = (c as char).to_digit(16)?;
            Some(v << 4 | u64::from(d))
        })
    };
    let dash = line.iter().position(|&c| c == b'-')?;
    let space = line.iter().position(|&c| c == b' ')?;
    Some((hex(line.get(..dash)?)?, hex(line.get(dash + 1..space)?)?))
}

/// The tracer's own address range.
fn tracer_range() -> (u64, u64) {
    let hi = TRACER_HI.load(Ordering::Relaxed);
    if hi != 0 {
        return (TRACER_LO.load(Ordering::Relaxed), hi);
    }
    let here = tracer_range as *const () as u64;
    let (lo, hi) = modules::find_or_refresh(here, emit_module).map_or((0, 0), |m| m.span());
    TRACER_LO.store(lo, Ordering::Relaxed);
    TRACER_HI.store(hi, Ordering::Relaxed);
    (lo, hi)
}

/// Writes a module to the spool as a `MODULE` frame.
pub fn emit_module(m: &Module, names: &Names) {
    let mut frame = [0u8; 1024];
    let Some((head, body)) = frame.split_at_mut_checked(5) else {
        return;
    };
    let Some(len) = modules::encode_module(m, names, body) else {
        return;
    };
    head[0] = crate::FRAME_MODULE;
    head[1..5].copy_from_slice(&(len as u32).to_le_bytes());
    crate::write_frame(frame.get(..5 + len).unwrap_or(&[]));
}

/// The registers of the calling function, at this very point.
#[inline(always)]
fn current_regs() -> Regs {
    let (pc, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers; touches no memory.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    Regs { pc, sp, bp }
}

/// Captures the calling thread's stack (leaving out the tracer's frames), interns it, and
/// writes its definition at `cursor` when it is new. Call between `enter` and `leave`.
/// Returns the new cursor and the stack id (0 when the thread's stack is unknown).
#[inline(always)]
pub fn capture(t: &ThreadState, b: &Buf, mut cursor: *mut u8) -> (*mut u8, u64) {
    let regs = current_regs();
    let (lo, hi) = thread_stack(t, regs.sp);
    if regs.sp < lo || regs.sp >= hi {
        // Another stack (sigaltstack), or an unknown one.
        return (cursor, 0);
    }
    // Not zeroed: 1 KiB a call would cost more than a short walk.
    let mut pcs = [std::mem::MaybeUninit::<u64>::uninit(); MAX_DEPTH];
    let memo = memo_of(b);
    let walked = unwind::walk(
        regs,
        lo,
        hi,
        tracer_range(),
        &mut pcs,
        &mut memo.frames,
        emit_module,
    );
    let mut h = walked.hash;
    let mut py = [std::mem::MaybeUninit::<PyFrame>::uninit(); MAX_PY_FRAMES];
    let n_py = if python::frames::on() {
        python::frames::walk(b, &mut cursor, &mut py)
    } else {
        0
    };
    // SAFETY: `walk` wrote the first `n_py` entries.
    let py = unsafe { std::slice::from_raw_parts(py.as_ptr().cast::<PyFrame>(), n_py) };
    for f in py {
        let v = u64::from(f.code) << 32 | u64::from(f.line) << 1 | u64::from(f.entry);
        h = (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
    if let Some(id) = memo.known_id(h) {
        return (cursor, id);
    }
    let (id, new) = intern(h);
    memo.note_id(h, id);
    if new {
        let n = walked.frames.min(MAX_DEPTH);
        // SAFETY: `walk` wrote the first `walked.frames` entries (at most MAX_DEPTH).
        let pcs = unsafe { std::slice::from_raw_parts(pcs.as_ptr().cast::<u64>(), n) };
        cursor = if py.is_empty() {
            write_def(b, cursor, id, walked.end, pcs)
        } else {
            write_hybrid_def(b, cursor, id, walked.end, pcs, py)
        };
    }
    (cursor, id)
}

/// Most frames of a stack with Python frames.
const MAX_HYBRID_FRAMES: usize = 255;
/// Most bytes a definition with Python frames takes.
const MAX_HYBRID_DEF_BYTES: usize = 2 + PREFIX_VARINT_STORE_BYTES + 2 + MAX_HYBRID_FRAMES * 15;

/// Writes the definition of a stack with Python frames (op `OP_PYTHON`, kind `DEF_STACK`): id
/// as a prefix varint, how the walk ended (u8), the frame count (u8), then each frame,
/// innermost first: a native one as a varint of its zigzag address difference from the
/// previous native frame's, shifted left by one; a Python one as a varint of its code id
/// shifted left by one, plus one, then its line as a varint. Each group of Python frames
/// that one C call of the interpreter's loop runs takes the place of that call's native
/// frame; groups left over (a native walk that ended early) follow the native frames.
fn write_hybrid_def(
    b: &Buf,
    mut cursor: *mut u8,
    id: u64,
    mut end: End,
    pcs: &[u64],
    py: &[PyFrame],
) -> *mut u8 {
    use python::frames::{DEF_STACK, OP_PYTHON, in_eval_loop};
    // SAFETY: the thread's buffer; the definition fits below `last_start` after the check.
    unsafe {
        if cursor.add(MAX_HYBRID_DEF_BYTES) > b.last_start() {
            crate::flush_own(b);
            cursor = b.data();
        }
        cursor.write(OP_PYTHON);
        cursor.add(1).write(DEF_STACK);
        let mut n = 2;
        n += put_prefix_varint(cursor.add(n), id);
        let end_at = n;
        let count_at = n + 1;
        n += 2;
        let mut count = 0usize;
        let mut prev = 0u64;
        let mut next_py = 0;
        let put_py = |n: &mut usize, f: &PyFrame| {
            *n += put_varint(cursor.add(*n), u64::from(f.code) << 1 | 1);
            *n += put_varint(cursor.add(*n), u64::from(f.line));
        };
        for &pc in pcs {
            if count >= MAX_HYBRID_FRAMES {
                break;
            }
            if in_eval_loop(pc) && next_py < py.len() {
                while let Some(f) = py.get(next_py) {
                    if count >= MAX_HYBRID_FRAMES {
                        break;
                    }
                    put_py(&mut n, f);
                    count += 1;
                    next_py += 1;
                    if f.entry {
                        break;
                    }
                }
                continue;
            }
            n += put_varint(cursor.add(n), zigzag(pc.wrapping_sub(prev) as i64) << 1);
            prev = pc;
            count += 1;
        }
        for f in py.get(next_py..).unwrap_or(&[]) {
            if count >= MAX_HYBRID_FRAMES {
                break;
            }
            put_py(&mut n, f);
            count += 1;
        }
        if count >= MAX_HYBRID_FRAMES {
            end = End::DepthCap;
        }
        cursor.add(end_at).write(end as u8);
        cursor.add(count_at).write(count as u8);
        crate::commit(b, cursor.add(n))
    }
}

fn table() -> *mut Slot {
    shared_table(&TABLE, TABLE_SLOTS * std::mem::size_of::<Slot>())
}

/// The table in `slot`, a zero-filled block of `bytes` mapped by the first thread that asks
/// (null when it cannot be mapped); touched as used, so a large one costs address space only.
pub(crate) fn shared_table<T>(slot: &AtomicPtr<T>, bytes: usize) -> *mut T {
    let t = slot.load(Ordering::Acquire);
    if !t.is_null() {
        return t;
    }
    // SAFETY: a fresh anonymous mapping, zero-filled.
    let block = unsafe {
        crate::mmap(
            null_mut(),
            bytes,
            crate::PROT_RW,
            crate::MAP_PRIVATE_ANON | MAP_NORESERVE,
            -1,
            0,
        )
    };
    if block as isize == -1 || block.is_null() {
        return null_mut();
    }
    match slot.compare_exchange(
        null_mut(),
        block.cast(),
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => block.cast(),
        // Another thread mapped one first (this one stays unused).
        Err(now) => now,
    }
}

const MAP_NORESERVE: c_int = 0x4000;

/// The id of the stack with hash `h`, and whether this call assigned it (and so must write
/// the definition).
fn intern(h: u64) -> (u64, bool) {
    let t = table();
    if t.is_null() {
        return (NEXT_ID.fetch_add(1, Ordering::Relaxed), true);
    }
    for probe in 0..MAX_PROBES {
        let i = (h as usize).wrapping_add(probe) & (TABLE_SLOTS - 1);
        // SAFETY: `i` is below TABLE_SLOTS, inside the mapping.
        let slot = unsafe { &*t.add(i) };
        let mut seen = slot.hash.load(Ordering::Acquire);
        if seen == 0 {
            match slot
                .hash
                .compare_exchange(0, h, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                    slot.id.store(id, Ordering::Release);
                    return (id, true);
                }
                Err(now) => seen = now,
            }
        }
        if seen == h {
            loop {
                let id = slot.id.load(Ordering::Acquire);
                if id != 0 {
                    return (id, false);
                }
                std::hint::spin_loop();
            }
        }
    }
    (NEXT_ID.fetch_add(1, Ordering::Relaxed), true)
}

/// Writes a stack definition at `cursor` (flushing the buffer first when it lacks room).
fn write_def(b: &Buf, mut cursor: *mut u8, id: u64, end: End, pcs: &[u64]) -> *mut u8 {
    // SAFETY: the thread's buffer; the definition fits below `last_start` after the check,
    // leaving room for the event that follows it.
    unsafe {
        if cursor.add(MAX_DEF_BYTES) > b.last_start() {
            crate::flush_own(b);
            cursor = b.data();
        }
        let mut n = 0;
        cursor.write(OP_STACK);
        n += 1;
        n += put_prefix_varint(cursor.add(n), id);
        cursor.add(n).write(end as u8);
        cursor.add(n + 1).write(pcs.len() as u8);
        n += 2;
        let mut prev = 0u64;
        for &pc in pcs {
            n += put_varint(cursor.add(n), zigzag(pc.wrapping_sub(prev) as i64));
            prev = pc;
        }
        crate::commit(b, cursor.add(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_remembers_stack_ids_by_their_whole_hash() {
        // SAFETY: a memo is integers only; zeroed is empty.
        let mut memo: Box<ThreadMemo> = Box::new(unsafe { std::mem::zeroed() });
        let (a, b) = (
            0x1234_5678_0000_0005,
            0x1234_5678_0000_0005 + THREAD_ID_SLOTS as u64,
        );
        assert_eq!(memo.known_id(a), None);
        memo.note_id(a, 10);
        assert_eq!(memo.known_id(a), Some(10));
        // Same slot, another stack: not its id.
        assert_eq!(memo.known_id(b), None);
        memo.note_id(b, 11);
        assert_eq!(memo.known_id(b), Some(11));
        assert_eq!(memo.known_id(a), None);
        forget_stack_ids_of(&mut memo);
        assert_eq!(memo.known_id(b), None);
    }
}
