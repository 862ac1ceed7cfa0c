//! The program's own mappings: `mmap`, `munmap`, `mremap`, `brk` and `sbrk` called through
//! the dynamic linker (the program's code, its libraries', an interpreter's), each written to
//! the spool as a MAPPING frame (`0x15`) timed as a flush mark is: the clock tick u64, the
//! call u8 (1 `mmap`, 2 `munmap`, 3 `mremap`, 4 the break moved), then u64s: the address and
//! length (for a break: the old break and the new one), the new address and length (`mremap`;
//! else 0), then the `mmap` flags u32 with bit 31 set for a mapping of a file, and its
//! protection u32.
//!
//! The C library's own allocator maps through its internal entry points, which no interposer
//! sees, and the tracer maps through raw system calls ([`crate::sys`]): so what is recorded is
//! memory held outside the allocator. A call made while the thread runs the tracer (`busy`:
//! Python's arena allocator, which the tracer wraps, maps its arenas so) is the allocator's
//! and is not written. A thread in the middle of writing the spool (a signal handler's call)
//! skips its frame rather than wait for itself.

use std::ffi::CStr;

use super::*;

const CALL_MMAP: u8 = 1;
const CALL_MUNMAP: u8 = 2;
const CALL_MREMAP: u8 = 3;
const CALL_BRK: u8 = 4;
/// The spool frame of a mapping call.
pub(crate) const FRAME_MAPPING: u8 = 0x15;
/// Bit 31 of the recorded flags: a mapping of a file (`fd` given, not anonymous).
const FILE_BACKED: u32 = 1 << 31;
const MAP_ANONYMOUS: c_int = 0x20;

/// Writes one MAPPING frame, unless the calling thread runs the tracer (the allocator's call)
/// or the tracer is not recording.
fn note(call: u8, addr: u64, len: u64, new: (u64, u64), (flags, prot): (u32, u32)) {
    if STATE.load(Ordering::Acquire) != STATE_TRACING
        || control::paused()
        || tls().is_some_and(|t| t.busy.get())
    {
        return;
    }
    let mut frame = [0u8; 1 + 4 + 8 + 1 + 32 + 8];
    let mut w = StackWriter::new(&mut frame);
    w.put_u8(FRAME_MAPPING);
    w.put_u32(8 + 1 + 32 + 8);
    w.put_u64(now_ns());
    w.put_u8(call);
    w.put_u64(addr);
    w.put_u64(len);
    w.put_u64(new.0);
    w.put_u64(new.1);
    w.put_u32(flags);
    w.put_u32(prot);
    write_frame(w.bytes());
}

/// Runs `f`, an allocator's own call (Python's arena allocator mapping an arena), so that the
/// mappings it makes are the allocator's, not written as the program's.
pub(crate) fn as_allocator<R>(f: impl FnOnce() -> R) -> R {
    let t = tls();
    let was = t.map(|t| t.busy.replace(true));
    let r = f();
    if let (Some(t), Some(was)) = (t, was) {
        t.busy.set(was);
    }
    r
}

fn mmap_flags(flags: c_int, fd: c_int) -> u32 {
    let file = flags & MAP_ANONYMOUS == 0 && fd >= 0;
    (flags as u32 & !FILE_BACKED) | if file { FILE_BACKED } else { 0 }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: the program's own call, made as the C library would.
    let p = unsafe { sys::mmap(addr, len, prot, flags, fd, off) };
    if p as isize != -1 {
        note(
            CALL_MMAP,
            p as u64,
            len as u64,
            (0, 0),
            (mmap_flags(flags, fd), prot as u32),
        );
    }
    p
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: as `mmap` (one call on a 64-bit system).
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: the program's own call.
    let r = unsafe { sys::munmap(addr, len) };
    if r == 0 {
        note(CALL_MUNMAP, addr as u64, len as u64, (0, 0), (0, 0));
    }
    r
}

/// `mremap`'s fifth argument is there only with `MREMAP_FIXED` (a variadic caller passes it
/// where a fifth named argument is: integer registers, x86-64 and AArch64 Linux alike);
/// otherwise the register holds anything, and the kernel gets 0 in its place, as the C
/// library gives it.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    const MREMAP_FIXED: c_int = 2;
    let new_addr = if flags & MREMAP_FIXED != 0 {
        new_addr
    } else {
        null_mut()
    };
    // SAFETY: the program's own call.
    let p = unsafe { sys::mremap(old, old_len, new_len, flags, new_addr) };
    if p as isize != -1 {
        note(
            CALL_MREMAP,
            old as u64,
            old_len as u64,
            (p as u64, new_len as u64),
            (0, 0),
        );
    }
    p
}

type BrkFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type SbrkFn = unsafe extern "C" fn(isize) -> *mut c_void;
static REAL_BRK: AtomicUsize = AtomicUsize::new(0);
static REAL_SBRK: AtomicUsize = AtomicUsize::new(0);

/// The C library's own `name`, looked up once (the break is the C library's to keep: its
/// record of where the break is must move with it).
fn next(slot: &AtomicUsize, name: &CStr) -> usize {
    let f = slot.load(Ordering::Acquire);
    if f != 0 {
        return f;
    }
    // SAFETY: dlsym with a NUL-terminated name.
    let f = unsafe { dlsym(RTLD_NEXT, name.as_ptr()) } as usize;
    slot.store(f, Ordering::Release);
    f
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn sbrk(increment: isize) -> *mut c_void {
    let f = next(&REAL_SBRK, c"sbrk");
    if f == 0 {
        return -1isize as *mut c_void;
    }
    // SAFETY: dlsym's address of the C library's sbrk.
    let old = unsafe { std::mem::transmute::<usize, SbrkFn>(f)(increment) };
    if old as isize != -1 && increment != 0 {
        let new = (old as u64).wrapping_add_signed(increment as i64);
        note(CALL_BRK, old as u64, new, (0, 0), (0, 0));
    }
    old
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn brk(addr: *mut c_void) -> c_int {
    let (fb, fs) = (next(&REAL_BRK, c"brk"), next(&REAL_SBRK, c"sbrk"));
    if fb == 0 || fs == 0 {
        return -1;
    }
    // SAFETY: dlsym's addresses of the C library's brk and sbrk (`sbrk(0)` reads the break).
    unsafe {
        let old = std::mem::transmute::<usize, SbrkFn>(fs)(0);
        let r = std::mem::transmute::<usize, BrkFn>(fb)(addr);
        if r == 0 {
            note(CALL_BRK, old as u64, addr as u64, (0, 0), (0, 0));
        }
        r
    }
}
