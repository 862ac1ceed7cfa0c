//! The Python frames of the allocating thread, read from the interpreter's own structures at
//! each allocation (no profiling hook, so calls that do not allocate cost nothing).
//!
//! The walk starts at the thread's `PyThreadState` (`PyGILState_GetThisThreadState`, a read
//! of a thread-local key: no lock, no allocation; null for a thread that never ran Python) and
//! follows the frame chain with the offsets of [`super::layout`]. It reads the calling thread's
//! own frames, which only this thread changes, so it needs no GIL (a thread inside a C call
//! that released it still shows the Python code that called it). Each frame gives its code
//! object (checked to be one: `ob_type == &PyCode_Type`, or the walk stops) and the offset of
//! the instruction executing; frames still being set up (3.11 on: before
//! `_co_firsttraceable`) and 3.12's shim frames are left out.
//!
//! A code object is named once per process: the first walk that meets it takes the next code
//! id and writes its definition into its stream (op [`OP_PYTHON`], kind [`DEF_CODE`]: id as
//! a prefix varint, first line as a varint, then the qualified name and the file, each a
//! varint length and UTF-8, at most [`MAX_NAME_BYTES`] and [`MAX_FILE_BYTES`]). A code object
//! freed and another made at its address is told apart by its name, file and first line. A
//! line is computed once per code id and instruction offset (`PyCode_Addr2Line`, which only
//! reads the code object) and kept in a shared table.
//!
//! Each frame also says whether it is the first of a C call of `_PyEval_EvalFrameDefault`
//! (every frame in 3.9 and 3.10; 3.11's `is_entry`; the frame above a shim frame in 3.12 on),
//! which lets `stacks.rs` put each group in place of that call's native frame.

use std::mem::MaybeUninit;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::API;
use super::layout::{Chain, Layout, OWNED_BY_CSTACK, OWNED_BY_GENERATOR, STR_LENGTH, STR_STATE};
use crate::Buf;
use crate::encode::{put_prefix_varint, put_varint};
use crate::stacks::shared_table;

/// Most Python frames of one stack (deeper recursion keeps the innermost).
pub(crate) const MAX_PY_FRAMES: usize = 96;
/// The spool op byte of a Python record (call code 11, which no call has).
pub(crate) const OP_PYTHON: u8 = 0x0b;
/// Kinds of Python record: a code object's definition, a stack with Python frames.
pub(crate) const DEF_CODE: u8 = 1;
pub(crate) const DEF_STACK: u8 = 2;
pub(crate) const MAX_NAME_BYTES: usize = 256;
pub(crate) const MAX_FILE_BYTES: usize = 1024;
/// Most bytes a code definition takes.
const MAX_CODE_DEF_BYTES: usize = 2 + 9 + 10 + 2 * 10 + MAX_NAME_BYTES + MAX_FILE_BYTES;

/// One Python frame: its code id, the line executing, and whether it is the first frame of a
/// C call of the interpreter's loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PyFrame {
    pub(crate) code: u32,
    pub(crate) line: u32,
    pub(crate) entry: bool,
}

static ON: AtomicBool = AtomicBool::new(false);
static LAYOUT: AtomicPtr<Layout> = AtomicPtr::new(null_mut());
static EVAL_LO: AtomicU64 = AtomicU64::new(0);
static EVAL_HI: AtomicU64 = AtomicU64::new(0);

/// Turns the walk on, with the version's layout and the extent of the interpreter's loop.
pub(crate) fn enable(layout: &'static Layout, (lo, hi): (u64, u64)) {
    LAYOUT.store(std::ptr::from_ref(layout).cast_mut(), Ordering::Release);
    EVAL_LO.store(lo, Ordering::Release);
    EVAL_HI.store(hi, Ordering::Release);
    ON.store(true, Ordering::Release);
}

#[inline(always)]
pub(crate) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether a return address lies in `_PyEval_EvalFrameDefault` (a return address points just
/// past its call, so the end is included).
#[inline]
pub(crate) fn in_eval_loop(pc: u64) -> bool {
    pc > EVAL_LO.load(Ordering::Relaxed) && pc <= EVAL_HI.load(Ordering::Relaxed)
}

#[inline(always)]
fn rd_u64(addr: u64) -> u64 {
    // SAFETY: callers read fields of the calling thread's live interpreter structures, at
    // offsets checked against the version's headers; the address is 8-aligned and non-null.
    unsafe { (addr as *const u64).read_volatile() }
}

#[inline(always)]
fn rd_i32(addr: u64) -> i32 {
    // SAFETY: as for `rd_u64`.
    unsafe { (addr as *const i32).read_volatile() }
}

#[inline(always)]
fn rd_u8(addr: u64) -> u8 {
    // SAFETY: as for `rd_u64`.
    unsafe { (addr as *const u8).read_volatile() }
}

fn plausible(p: u64) -> bool {
    p >= 4096 && p.is_multiple_of(8) && p < (1 << 57)
}

fn is_code(p: u64) -> bool {
    plausible(p) && rd_u64(p + 8) == API.code_type.load(Ordering::Relaxed) as u64
}

/// Walks the calling thread's Python frames, innermost first, into `out`; code objects seen
/// for the first time are defined at `*cursor` in `b` (the thread's buffer). Returns how
/// many frames were written.
pub(crate) fn walk(
    b: &Buf,
    cursor: &mut *mut u8,
    out: &mut [MaybeUninit<PyFrame>; MAX_PY_FRAMES],
) -> usize {
    let layout = LAYOUT.load(Ordering::Acquire);
    if layout.is_null() {
        return 0;
    }
    // SAFETY: set once by `enable` from a static table.
    let l = unsafe { &*layout };
    type ThisState = unsafe extern "C" fn() -> u64;
    let f = API.this_thread_state.load(Ordering::Relaxed);
    // SAFETY: dlsym's address of PyGILState_GetThisThreadState (a thread-local read).
    let ts = unsafe { std::mem::transmute::<usize, ThisState>(f)() };
    if !plausible(ts) {
        return 0;
    }
    let mut frame = match l.chain {
        Chain::CFrame => {
            let cf = rd_u64(ts + l.tstate_frame as u64);
            if plausible(cf) {
                rd_u64(cf + l.cframe_current as u64)
            } else {
                0
            }
        }
        _ => rd_u64(ts + l.tstate_frame as u64),
    };
    let mut n = 0;
    // Bounds the walk of a chain that loops (it cannot in a sound interpreter).
    let mut steps = 0;
    while plausible(frame) && n < MAX_PY_FRAMES && steps < 4096 {
        steps += 1;
        let back = rd_u64(frame + l.frame_back as u64);
        let code = rd_u64(frame + l.frame_code as u64);
        let at = match l.chain {
            Chain::FrameObjects { lasti_in_units } => {
                let lasti = rd_i32(frame + l.frame_instr as u64);
                let bytes = if lasti_in_units {
                    lasti.saturating_mul(2)
                } else {
                    lasti
                };
                is_code(code).then_some((bytes, true))
            }
            Chain::CFrame | Chain::Current => {
                let owner = rd_u8(frame + l.frame_owner as u64);
                if owner == OWNED_BY_CSTACK {
                    // The shim that starts a C call: the frame above it was its first.
                    if let Some(prev) = n.checked_sub(1).and_then(|i| out.get_mut(i)) {
                        // SAFETY: the first `n` entries are written.
                        unsafe { (*prev.as_mut_ptr()).entry = true };
                    }
                    frame = back;
                    continue;
                }
                if !is_code(code) {
                    frame = back;
                    continue;
                }
                let first = code + l.code_instructions as u64;
                let units = (rd_u64(frame + l.frame_instr as u64) as i64 - first as i64) / 2;
                let traceable = i64::from(rd_i32(code + l.code_firsttraceable as u64));
                let entry = l
                    .frame_is_entry
                    .is_some_and(|o| rd_u8(frame + o as u64) != 0);
                if owner != OWNED_BY_GENERATOR && units < traceable {
                    // Still being set up: not running code yet.
                    None
                } else {
                    Some((i32::try_from(units * 2).unwrap_or(i32::MAX), entry))
                }
            }
        };
        if let Some((offset_bytes, entry)) = at
            && let Some(slot) = out.get_mut(n)
        {
            let id = code_id(l, code, b, cursor);
            slot.write(PyFrame {
                code: id,
                line: line_of(id, code, offset_bytes),
                entry,
            });
            n += 1;
        }
        frame = back;
    }
    n
}

/// In a fork child: code ids start again, as its spool has none of the parent's
/// definitions (the parent's tables stay mapped, unused).
pub(crate) fn reset_after_fork() {
    CODES.store(null_mut(), Ordering::Release);
    LINES.store(null_mut(), Ordering::Release);
    NEXT_CODE.store(1, Ordering::Release);
}

// ---- code ids ----

/// Slots of the code table (16 bytes each, mapped when first needed, touched as used).
const CODE_SLOTS: usize = 1 << 16;
const CODE_PROBES: usize = 32;

#[repr(C)]
struct CodeSlot {
    /// The code object's address (0: free).
    key: AtomicU64,
    /// `id << 32 | check`, published whole (0 until published).
    id_check: AtomicU64,
}

static CODES: AtomicPtr<CodeSlot> = AtomicPtr::new(null_mut());
static NEXT_CODE: AtomicU32 = AtomicU32::new(1);
static LINES: AtomicPtr<[AtomicU64; 2]> = AtomicPtr::new(null_mut());
const LINE_SLOTS: usize = 1 << 16;

fn hash(v: u64) -> u64 {
    (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The id of the code object at `code`, defining it at `*cursor` when new.
fn code_id(l: &Layout, code: u64, b: &Buf, cursor: &mut *mut u8) -> u32 {
    let name = rd_u64(code + l.code_qualname.unwrap_or(l.code_name) as u64);
    let file = rd_u64(code + l.code_filename as u64);
    let first_line = rd_i32(code + l.code_firstlineno as u64);
    let check = (hash(name ^ file.rotate_left(17) ^ first_line as u64) as u32) | 1;
    let t = shared_table(&CODES, CODE_SLOTS * std::mem::size_of::<CodeSlot>());
    let fresh = |cursor: &mut *mut u8| {
        let id = NEXT_CODE.fetch_add(1, Ordering::Relaxed);
        define_code(l, b, cursor, id, name, file, first_line);
        id
    };
    if t.is_null() {
        return fresh(cursor);
    }
    for probe in 0..CODE_PROBES {
        let i = (hash(code) as usize).wrapping_add(probe) & (CODE_SLOTS - 1);
        // SAFETY: below CODE_SLOTS, inside the mapping.
        let slot = unsafe { &*t.add(i) };
        let mut seen = slot.key.load(Ordering::Acquire);
        if seen == 0 {
            match slot
                .key
                .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    let id = fresh(cursor);
                    slot.id_check
                        .store(u64::from(id) << 32 | u64::from(check), Ordering::Release);
                    return id;
                }
                Err(now) => seen = now,
            }
        }
        if seen == code {
            let mut id_check = slot.id_check.load(Ordering::Acquire);
            while id_check == 0 {
                std::hint::spin_loop();
                id_check = slot.id_check.load(Ordering::Acquire);
            }
            if id_check as u32 == check {
                return (id_check >> 32) as u32;
            }
            // Another code object at a freed one's address.
            let id = fresh(cursor);
            slot.id_check
                .store(u64::from(id) << 32 | u64::from(check), Ordering::Release);
            return id;
        }
    }
    fresh(cursor)
}

/// The line executing at `offset_bytes` into code `id` (object at `code`).
fn line_of(id: u32, code: u64, offset_bytes: i32) -> u32 {
    let key = u64::from(id) << 32 | u64::from(offset_bytes as u32);
    let check = |key: u64| (hash(key) >> 40) as u32 | 1;
    let t = shared_table(&LINES, LINE_SLOTS * 16);
    let slot = (!t.is_null()).then(|| {
        // SAFETY: below LINE_SLOTS, inside the mapping.
        unsafe { &*t.add(hash(key) as usize & (LINE_SLOTS - 1)) }
    });
    if let Some([k, v]) = slot {
        let (seen, value) = (k.load(Ordering::Acquire), v.load(Ordering::Acquire));
        if seen == key && value as u32 == check(key) {
            return (value >> 32) as u32;
        }
    }
    type Addr2Line = unsafe extern "C" fn(u64, i32) -> i32;
    let f = API.addr2line.load(Ordering::Relaxed);
    // SAFETY: dlsym's address of PyCode_Addr2Line, which only reads the code object (alive:
    // a frame of this thread holds it).
    let line = unsafe { std::mem::transmute::<usize, Addr2Line>(f)(code, offset_bytes) };
    let line = u32::try_from(line).unwrap_or(0);
    if let Some([k, v]) = slot {
        // A reader between the two stores sees a check that does not match its key.
        v.store(0, Ordering::Release);
        k.store(key, Ordering::Release);
        v.store(
            u64::from(line) << 32 | u64::from(check(key)),
            Ordering::Release,
        );
    }
    line
}

/// Writes a code object's definition at `*cursor` (flushing the buffer first when it lacks
/// room).
fn define_code(
    l: &Layout,
    b: &Buf,
    cursor: &mut *mut u8,
    id: u32,
    name: u64,
    file: u64,
    first_line: i32,
) {
    let mut name_buf = [0u8; MAX_NAME_BYTES];
    let mut file_buf = [0u8; MAX_FILE_BYTES];
    let name_len = utf8_of(l, name, &mut name_buf);
    let file_len = utf8_of(l, file, &mut file_buf);
    // SAFETY: the thread's buffer; the definition fits below `last_start` after the check.
    unsafe {
        if cursor.add(MAX_CODE_DEF_BYTES) > b.last_start() {
            crate::flush_own(b);
            *cursor = b.data();
        }
        let c = *cursor;
        let mut n = 0;
        c.write(OP_PYTHON);
        c.add(1).write(DEF_CODE);
        n += 2;
        n += put_prefix_varint(c.add(n), u64::from(id));
        n += put_varint(c.add(n), u64::from(first_line.max(0) as u32));
        for (bytes, len) in [(&name_buf[..], name_len), (&file_buf[..], file_len)] {
            n += put_varint(c.add(n), len as u64);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), c.add(n), len);
            n += len;
        }
        *cursor = crate::commit(b, c.add(n));
    }
}

/// A compact `str` object's text as UTF-8 in `out` (cut at a character boundary when it does
/// not fit); 0 bytes when `obj` is not a compact `str`.
fn utf8_of(l: &Layout, obj: u64, out: &mut [u8]) -> usize {
    if !plausible(obj) || rd_u64(obj + 8) != API.unicode_type.load(Ordering::Relaxed) as u64 {
        return 0;
    }
    let state = rd_i32(obj + STR_STATE as u64) as u32;
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 {
        return 0;
    }
    let chars = rd_u64(obj + STR_LENGTH as u64).min(out.len() as u64);
    let data = obj
        + if ascii == 1 {
            l.ascii_data
        } else {
            l.compact_data
        } as u64;
    let mut n = 0;
    for i in 0..chars {
        // SAFETY: `i` is below the string's length, in its inline character data.
        let cp = unsafe {
            match kind {
                1 => u32::from((data as *const u8).add(i as usize).read()),
                2 => u32::from((data as *const u16).add(i as usize).read_unaligned()),
                4 => (data as *const u32).add(i as usize).read_unaligned(),
                _ => return n,
            }
        };
        let Some(ch) = char::from_u32(cp) else {
            break;
        };
        let Some(dst) = out.get_mut(n..n + ch.len_utf8()) else {
            break;
        };
        ch.encode_utf8(dst);
        n += ch.len_utf8();
    }
    n
}
