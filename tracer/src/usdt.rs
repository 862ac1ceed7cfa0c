//! The OpenTelemetry eBPF profiler's memory USDT contract, accepted without root or eBPF: a
//! program that fires `otel_memory:alloc(user, size, weight)` and `otel_memory:free(ptr)`
//! (on the allocations its sampler picks, see the profiler's design note
//! `design-docs/00003-memory-profiling`) has them recorded as heap `otel_memory`.
//!
//! At start-up, for every object loaded then (the executable and its libraries, found with
//! `dl_iterate_phdr`), the tracer maps its file and reads its `.note.stapsdt` notes (owner
//! `stapsdt`, type 3: the probe's address, the `.stapsdt.base` address, the semaphore's, then
//! provider, name and argument spec, NUL-terminated). For each `otel_memory` probe it adds one
//! to the probe's semaphore (so the program's `if (semaphore)` guard fires it) and turns the
//! probe's `nop` into `int3`. The `SIGTRAP` handler finds the probe at the trapping address,
//! reads its arguments from the registers and memory the spec names (`8@%rdi`, `-4@%eax`,
//! `8@16(%rsp)`, `8@$5`), records the event and returns past the `nop`.
//!
//! What it does not do: objects `dlopen`ed later are not searched; prelinked objects (whose
//! `.stapsdt.base` moved) are not adjusted; the events carry no call stack (the unwinder does
//! not cross the signal frame); the weight argument is not kept (the heap holds the sampled
//! blocks at their sizes). x86-64 only.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};

use super::*;
use crate::modules::{DlPhdrInfo, PhdrCallback, dl_iterate_phdr};

/// The heap the probes' events land in.
pub(crate) const OTEL_HEAP: u32 = 0xffff_ff00;
const PROVIDER: &[u8] = b"otel_memory";
/// Most probes kept.
const MAX_PROBES: usize = 64;
/// Most arguments a probe's spec is read for.
const MAX_ARGS: usize = 3;
const SIGTRAP: c_int = 5;
const SA_SIGINFO: c_int = 4;
const SA_RESTART: c_int = 0x1000_0000;
const SA_NODEFER: c_int = 0x4000_0000;
const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const PROT_EXEC: c_int = 4;
const MAP_PRIVATE: c_int = 2;
const SEEK_END: c_int = 2;
const NOP: u8 = 0x90;
const INT3: u8 = 0xcc;
/// `uc_mcontext.gregs` in glibc's x86-64 `ucontext_t`: after `uc_flags`, `uc_link` and
/// `uc_stack` (8 + 8 + 24 bytes).
const GREGS_OFFSET: usize = 40;
const REG_RIP: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Alloc,
    Free,
}

/// One argument's location: a register (its `gregs` index), memory at a register plus an
/// offset, or a constant; read as `bytes` bytes (sign-extended when `signed`).
#[derive(Clone, Copy)]
enum Operand {
    None,
    Reg(usize, u8, bool),
    Mem(usize, i64, u8, bool),
    Imm(i64),
}

#[derive(Clone, Copy)]
struct Probe {
    pc: u64,
    kind: Kind,
    args: [Operand; MAX_ARGS],
}

struct Probes {
    list: UnsafeCell<[Probe; MAX_PROBES]>,
    len: AtomicUsize,
}

// SAFETY: written at initialisation only, before the handler is installed and the probes
// patched; read-only afterwards.
unsafe impl Sync for Probes {}

static PROBES: Probes = Probes {
    list: UnsafeCell::new(
        [Probe {
            pc: 0,
            kind: Kind::Free,
            args: [Operand::None; MAX_ARGS],
        }; MAX_PROBES],
    ),
    len: AtomicUsize::new(0),
};

#[repr(C)]
struct SigAction {
    handler: usize,
    mask: [u64; 16],
    flags: c_int,
    restorer: usize,
}

unsafe extern "C" {
    fn sigaction(sig: c_int, act: *const SigAction, old: *mut SigAction) -> c_int;
    fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int;
    fn lseek(fd: c_int, off: i64, whence: c_int) -> i64;
}

/// Finds the `otel_memory` probes of the objects loaded now, arms them and installs the
/// handler. Called once, at initialisation, when tracing.
pub(crate) fn attach() {
    // SAFETY: the callback reads what the loader reports.
    unsafe { dl_iterate_phdr(search_object as PhdrCallback, null_mut()) };
    let n = PROBES.len.load(Ordering::Acquire);
    if n == 0 {
        return;
    }
    let act = SigAction {
        handler: on_trap as *const () as usize,
        mask: [0; 16],
        flags: SA_SIGINFO | SA_RESTART | SA_NODEFER,
        restorer: 0,
    };
    // SAFETY: installing our handler; the struct has glibc's layout.
    if unsafe { sigaction(SIGTRAP, &act, null_mut()) } != 0 {
        return;
    }
    // SAFETY: written above, read-only from here on.
    let probes = unsafe { &*PROBES.list.get() };
    for p in probes.iter().take(n) {
        patch(p.pc);
    }
    heaps::remember_name(OTEL_HEAP, PROVIDER);
    heaps::write_name_frame(OTEL_HEAP, PROVIDER);
}

/// Turns the `nop` at `pc` into `int3`.
fn patch(pc: u64) {
    let page = pc & !4095;
    let len = if (pc & 4095) == 4095 { 8192 } else { 4096 };
    // SAFETY: `pc` is a probe site in a loaded object's text (its note says so, and it holds
    // a `nop`); the pages are made writable for the one byte and executable again after.
    unsafe {
        if (pc as *const u8).read_volatile() != NOP {
            return;
        }
        if mprotect(page as *mut c_void, len, PROT_READ | PROT_WRITE | PROT_EXEC) != 0 {
            return;
        }
        (pc as *mut u8).write_volatile(INT3);
        mprotect(page as *mut c_void, len, PROT_READ | PROT_EXEC);
    }
}

/// `dl_iterate_phdr`'s callback: the object's probes.
unsafe extern "C" fn search_object(info: *mut DlPhdrInfo, _size: usize, _: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid info.
    let info = unsafe { &*info };
    // SAFETY: a NUL-terminated name, or null.
    let name = if info.name.is_null() {
        &[][..]
    } else {
        unsafe { std::ffi::CStr::from_ptr(info.name) }.to_bytes()
    };
    if name.starts_with(b"linux-vdso") {
        return 0;
    }
    let path: *const c_char = if name.is_empty() {
        c"/proc/self/exe".as_ptr()
    } else {
        info.name
    };
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { open(path, O_RDONLY | O_CLOEXEC) };
    if fd < 0 {
        return 0;
    }
    // SAFETY: our descriptor.
    let len = unsafe { lseek(fd, 0, SEEK_END) };
    if len > 64 {
        let len = len as usize;
        // SAFETY: a private read-only mapping of the whole file, unmapped below.
        let map = unsafe { mmap(null_mut(), len, PROT_READ, MAP_PRIVATE, fd, 0) };
        if map as isize != -1 {
            // SAFETY: the mapping's `len` bytes.
            let file = unsafe { std::slice::from_raw_parts(map.cast::<u8>(), len) };
            read_notes(file, info.addr);
            // SAFETY: our mapping.
            unsafe { munmap(map, len) };
        }
    }
    // SAFETY: our descriptor.
    unsafe { close(fd) };
    0
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads the `stapsdt` notes of every note section of an ELF64 file mapped at `bias`.
fn read_notes(file: &[u8], bias: u64) -> Option<()> {
    if file.get(..4)? != b"\x7fELF" || *file.get(4)? != 2 {
        return None;
    }
    let shoff = usize::try_from(u64_at(file, 0x28)?).ok()?;
    let shentsize = usize::from(u16_at(file, 0x3a)?);
    let shnum = usize::from(u16_at(file, 0x3c)?);
    for i in 0..shnum {
        let sh = shoff.checked_add(i.checked_mul(shentsize)?)?;
        if u32_at(file, sh + 4)? != 7 {
            continue; // not SHT_NOTE
        }
        let off = usize::try_from(u64_at(file, sh + 0x18)?).ok()?;
        let size = usize::try_from(u64_at(file, sh + 0x20)?).ok()?;
        let notes = file.get(off..off.checked_add(size)?)?;
        read_section(notes, bias);
    }
    Some(())
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn read_section(notes: &[u8], bias: u64) -> Option<()> {
    let mut at = 0;
    while at + 12 <= notes.len() {
        let namesz = u32_at(notes, at)? as usize;
        let descsz = u32_at(notes, at + 4)? as usize;
        let kind = u32_at(notes, at + 8)?;
        let name = notes.get(at + 12..at + 12 + namesz)?;
        let desc_at = at + 12 + align4(namesz);
        let desc = notes.get(desc_at..desc_at + descsz)?;
        at = desc_at + align4(descsz);
        if kind == 3 && name == b"stapsdt\0" {
            read_probe(desc, bias);
        }
    }
    Some(())
}

/// One probe's note: pc, base, semaphore (u64 each), then provider, name, args.
fn read_probe(desc: &[u8], bias: u64) -> Option<()> {
    let pc = u64_at(desc, 0)?;
    let semaphore = u64_at(desc, 16)?;
    let mut strings = desc.get(24..)?.split(|&b| b == 0);
    let (provider, name, args) = (strings.next()?, strings.next()?, strings.next()?);
    if provider != PROVIDER {
        return None;
    }
    let kind = match name {
        b"alloc" => Kind::Alloc,
        b"free" => Kind::Free,
        _ => return None,
    };
    let mut ops = [Operand::None; MAX_ARGS];
    for (slot, spec) in ops
        .iter_mut()
        .zip(args.split(|&b| b == b' ').filter(|s| !s.is_empty()))
    {
        *slot = operand(spec)?;
    }
    let n = PROBES.len.load(Ordering::Relaxed);
    if n >= MAX_PROBES {
        return None;
    }
    // SAFETY: initialisation, single-threaded, before the handler reads the table.
    unsafe {
        (*PROBES.list.get())[n] = Probe {
            pc: bias.wrapping_add(pc),
            kind,
            args: ops,
        };
    }
    PROBES.len.store(n + 1, Ordering::Release);
    if semaphore != 0 {
        let at = bias.wrapping_add(semaphore) as *mut u16;
        // SAFETY: the object's semaphore, a u16 in its writable data (the note says so).
        unsafe { at.write_volatile(at.read_volatile().wrapping_add(1)) };
    }
    Some(())
}

/// The `gregs` index of a register name (64-bit or 32-bit form).
fn reg(name: &[u8]) -> Option<usize> {
    const NAMES: [(&[u8], &[u8], usize); 16] = [
        (b"r8", b"r8d", 0),
        (b"r9", b"r9d", 1),
        (b"r10", b"r10d", 2),
        (b"r11", b"r11d", 3),
        (b"r12", b"r12d", 4),
        (b"r13", b"r13d", 5),
        (b"r14", b"r14d", 6),
        (b"r15", b"r15d", 7),
        (b"rdi", b"edi", 8),
        (b"rsi", b"esi", 9),
        (b"rbp", b"ebp", 10),
        (b"rbx", b"ebx", 11),
        (b"rdx", b"edx", 12),
        (b"rax", b"eax", 13),
        (b"rcx", b"ecx", 14),
        (b"rsp", b"esp", 15),
    ];
    NAMES
        .iter()
        .find(|(a, b, _)| *a == name || *b == name)
        .map(|&(_, _, i)| i)
}

fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.first()? {
        b'-' => (true, s.get(1..)?),
        _ => (false, s),
    };
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if neg { -v } else { v })
}

/// An argument spec: `N@%reg`, `N@off(%reg)`, `N@$imm` (N: bytes, negative when signed).
fn operand(spec: &[u8]) -> Option<Operand> {
    let at = spec.iter().position(|&b| b == b'@')?;
    let size = parse_i64(spec.get(..at)?)?;
    let (signed, bytes) = (size < 0, u8::try_from(size.unsigned_abs()).ok()?);
    let loc = spec.get(at + 1..)?;
    if let Some(imm) = loc.strip_prefix(b"$") {
        return Some(Operand::Imm(parse_i64(imm)?));
    }
    if let Some(r) = loc.strip_prefix(b"%") {
        return Some(Operand::Reg(reg(r)?, bytes, signed));
    }
    let open = loc.iter().position(|&b| b == b'(')?;
    let off = if open == 0 {
        0
    } else {
        parse_i64(loc.get(..open)?)?
    };
    let inner = loc
        .get(open + 1..)?
        .strip_suffix(b")")?
        .strip_prefix(b"%")?;
    Some(Operand::Mem(reg(inner)?, off, bytes, signed))
}

/// `v` cut to `bytes` bytes, sign-extended when `signed`.
fn sized(v: u64, bytes: u8, signed: bool) -> u64 {
    if bytes >= 8 || bytes == 0 {
        return v;
    }
    let bits = u32::from(bytes) * 8;
    let cut = v & ((1u64 << bits) - 1);
    if signed && cut >> (bits - 1) != 0 {
        cut | !((1u64 << bits) - 1)
    } else {
        cut
    }
}

/// The value of `op` in the trapped context's registers `gregs`.
///
/// # Safety
/// `gregs` are the trapped thread's registers; a memory operand reads the thread's stack or
/// data as the probe's spec says the program's code does.
unsafe fn value(op: Operand, gregs: *const u64) -> u64 {
    // SAFETY: indices below 16, inside `gregs`; memory as the caller says.
    unsafe {
        match op {
            Operand::None => 0,
            Operand::Imm(v) => v as u64,
            Operand::Reg(r, bytes, signed) => sized(gregs.add(r).read(), bytes, signed),
            Operand::Mem(r, off, bytes, signed) => {
                let at = gregs.add(r).read().wrapping_add(off as u64);
                // Only the operand's own bytes: eight read for a 4-byte operand at the end of
                // a mapping would fault, in a signal handler.
                let raw = match bytes {
                    1 => u64::from((at as *const u8).read()),
                    2 => u64::from((at as *const u16).read_unaligned()),
                    4 => u64::from((at as *const u32).read_unaligned()),
                    _ => (at as *const u64).read_unaligned(),
                };
                sized(raw, bytes, signed)
            }
        }
    }
}

/// The `SIGTRAP` handler: a probe's `int3` records its event and goes on past the `nop`. The
/// interrupted code's `errno` is kept (recording may make a system call that sets it).
unsafe extern "C" fn on_trap(sig: c_int, info: *mut c_void, ctx: *mut c_void) {
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *__errno_location() };
    // SAFETY: as the kernel called this.
    unsafe { trapped(sig, info, ctx) };
    // SAFETY: as above.
    unsafe { *__errno_location() = errno };
}

/// What [`on_trap`] does.
///
/// # Safety
/// Called from the `SIGTRAP` handler with its arguments.
unsafe fn trapped(_sig: c_int, _info: *mut c_void, ctx: *mut c_void) {
    // SAFETY: the kernel's ucontext; `gregs` sits at glibc's offset.
    let gregs = unsafe { ctx.cast::<u8>().add(GREGS_OFFSET).cast::<u64>() };
    // SAFETY: as above.
    let rip = unsafe { gregs.add(REG_RIP).read() };
    let pc = rip.wrapping_sub(1);
    let n = PROBES.len.load(Ordering::Acquire);
    // SAFETY: read-only once the handler is installed.
    let probes = unsafe { &*PROBES.list.get() };
    let Some(p) = probes.iter().take(n).find(|p| p.pc == pc) else {
        // Not one of ours: the default action, as before the tracer.
        // SAFETY: plain libc calls.
        unsafe {
            signal(SIGTRAP, SIG_DFL);
            raise(SIGTRAP);
        }
        return;
    };
    // SAFETY: the trapped context's registers, read as the probe's spec says.
    let (a0, a1) = unsafe { (value(p.args[0], gregs), value(p.args[1], gregs)) };
    match p.kind {
        Kind::Alloc => heaps::record_heap_unstacked(OTEL_HEAP, CALL_MALLOC, a1, a0),
        Kind::Free => heaps::record_heap_unstacked(OTEL_HEAP, CALL_FREE | OP_FREE, 0, a0),
    }
    // `rip` is past the `int3`, which took the `nop`'s one byte: execution goes on there.
}
