//! In-process tracking's way into the C library calls (`allocview.Tracker(native=True)`): no
//! `LD_PRELOAD` is there, so the allocation functions each loaded object imports are
//! redirected to the tracer's by rewriting its global offset table, as memray does.
//!
//! For every object `dl_iterate_phdr` reports but the tracer itself, the dynamic section
//! gives the relocation tables (`DT_JMPREL` for the PLT's, `DT_RELA` for the others), the
//! symbol table and the string table; each `R_X86_64_JUMP_SLOT` or `R_X86_64_GLOB_DAT`
//! relocation of a function in [`HOOKED`] has its slot rewritten to the tracer's function
//! (made writable for the write when it lies in read-only memory after relocation,
//! `PT_GNU_RELRO`, and made read-only again), the old value kept to put back at [`restore`].
//! The tracer's wrappers call the C library's own functions (resolved with `dlsym`), never
//! through a slot. A slot is an aligned word, so a thread calling through it meanwhile gets
//! the old function or the new one, either of which works.
//!
//! Threads keep running while slots are rewritten, so the order matters: every object's
//! releasing functions (`free`, `realloc`, `reallocarray`) are redirected before any
//! allocating one, and put back after them. Otherwise a block allocated through a redirected
//! `malloc` could be freed through a `free` not yet redirected (or no longer), unseen, and the
//! trace would later see its address handed out again while it still holds it live. In the
//! order kept, what a thread can see unrecorded is only the other way round: a free, or a
//! realloc, of a block allocated before, which a recording begun mid-run expects.
//!
//! Objects loaded while tracking (`dlopen`: a Python extension imported) are found by the
//! clock thread, which compares the loader's count of loads (`dlpi_adds`) every flush period
//! (20 ms): their calls are traced from then on, not in their constructors nor in the period
//! after loading.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::modules::{DlPhdrInfo, dl_iterate_phdr};
use crate::{DlInfo, REAL, dladdr, dlopen, real};

unsafe extern "C" {
    fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int;
}

const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const R_X86_64_GLOB_DAT: u64 = 6;
const R_X86_64_JUMP_SLOT: u64 = 7;
const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const PAGE: u64 = 4096;

/// The functions redirected, by their imported names.
const HOOKED: [&CStr; 10] = [
    c"malloc",
    c"free",
    c"calloc",
    c"realloc",
    c"reallocarray",
    c"memalign",
    c"posix_memalign",
    c"aligned_alloc",
    c"valloc",
    c"pvalloc",
];

/// The tracer's own definitions of [`HOOKED`], by name: looked up through the tracer's own
/// handle (`dladdr` names its file, `dlopen` with `RTLD_NOLOAD` gives the handle of the copy
/// already loaded), whose search starts with the tracer itself. Not `crate::malloc as usize`:
/// the address of an exported function is whatever the dynamic loader binds its name to, in
/// a non-PIE executable such as Debian's `python3` the executable's own PLT entry, which
/// written into that executable's GOT would jump to itself.
fn hooked() -> Option<[(&'static [u8], u64); 10]> {
    let mut info = DlInfo::empty();
    // SAFETY: a local out-parameter; the address is one of this library's functions.
    if unsafe { dladdr(hooked as *const c_void, &mut info) } == 0 || info.fname.is_null() {
        return None;
    }
    // SAFETY: the file name the loader gave; RTLD_NOLOAD loads nothing new.
    let handle = unsafe { dlopen(info.fname, RTLD_NOW | RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    let mut out = [(&b""[..], 0u64); 10];
    for (slot, name) in out.iter_mut().zip(HOOKED) {
        // SAFETY: a NUL-terminated name, looked up in the tracer's own scope.
        let f = unsafe { crate::dlsym(handle, name.as_ptr()) };
        *slot = (name.to_bytes(), f as u64);
    }
    // SAFETY: drops the reference RTLD_NOLOAD took.
    unsafe { dlclose_real(handle) };
    out.iter().all(|&(_, f)| f != 0).then_some(out)
}

const RTLD_NOW: c_int = 2;
const RTLD_NOLOAD: c_int = 4;

/// `dlclose`, the C library's (the tracer's own `dlclose` forwards to it).
unsafe fn dlclose_real(handle: *mut c_void) {
    type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;
    if let Some(f) = real_fn!(dlclose, DlcloseFn) {
        // SAFETY: a handle dlopen gave.
        unsafe { f(handle) };
    }
}

/// Whether [`HOOKED`]'s function `name` releases a block (see the module's header: these are
/// redirected first and put back last).
fn releases(name: &[u8]) -> bool {
    matches!(name, b"free" | b"realloc" | b"reallocarray")
}

/// Which functions a pass over the loaded objects redirects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Releasing,
    Allocating,
}

/// Rewritten slots and what they held, for [`restore`].
const MAX_PATCHES: usize = 16_384;
struct Patch {
    /// The slot's address, plus 1 when it lies in read-only memory after relocation.
    slot: AtomicU64,
    old: AtomicU64,
    /// The slot is a releasing function's.
    releasing: AtomicBool,
}
static PATCHES: [Patch; MAX_PATCHES] = [const {
    Patch {
        slot: AtomicU64::new(0),
        old: AtomicU64::new(0),
        releasing: AtomicBool::new(false),
    }
}; MAX_PATCHES];
static PATCHED: AtomicUsize = AtomicUsize::new(0);
/// The loader's count of loads at the last [`patch_all`] (0: not patching).
static ADDS_SEEN: AtomicU64 = AtomicU64::new(0);

/// Redirects every loaded object's imports of the allocation functions (already redirected
/// slots are left alone). Serialised by the caller: tracking's start, or the clock thread.
pub(crate) fn patch_all() {
    let Some(hooked) = hooked() else {
        return;
    };
    for pass in [Pass::Releasing, Pass::Allocating] {
        let mut job = (hooked, pass);
        // SAFETY: the callback only reads what the loader reports about mapped objects, and
        // the table of hooked functions passed to it.
        unsafe { dl_iterate_phdr(patch_object, (&raw mut job).cast()) };
    }
}

/// Called by the clock thread each flush period while patching: patches the objects loaded
/// since.
pub(crate) fn poll_new_objects() {
    if ADDS_SEEN.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut adds = 0u64;
    // SAFETY: as in `patch_all`; the callback reads the count only.
    unsafe { dl_iterate_phdr(read_adds, (&raw mut adds).cast()) };
    if adds != ADDS_SEEN.load(Ordering::Acquire) {
        patch_all();
    }
}

unsafe extern "C" fn read_adds(info: *mut DlPhdrInfo, size: usize, data: *mut c_void) -> c_int {
    if size >= std::mem::size_of::<DlPhdrInfo>() {
        // SAFETY: the loader's record, as large as checked; `data` is a u64 of the caller.
        unsafe { *data.cast::<u64>() = (*info).adds };
    }
    1
}

/// Puts every rewritten slot back, and stops watching for new objects.
pub(crate) fn restore() {
    ADDS_SEEN.store(0, Ordering::Release);
    let n = PATCHED.swap(0, Ordering::AcqRel).min(MAX_PATCHES);
    // Allocating functions first, releasing ones last (see the module's header).
    for releasing in [false, true] {
        for p in PATCHES.iter().take(n) {
            let tagged = p.slot.load(Ordering::Acquire);
            let slot = tagged & !1;
            if slot != 0 && p.releasing.load(Ordering::Acquire) == releasing {
                write_slot(slot, p.old.load(Ordering::Acquire), tagged & 1 == 1);
            }
        }
    }
}

/// Writes `value` into the GOT slot at `slot`, its page made writable for it, and read-only
/// again when it was (`relro`: in the object's `PT_GNU_RELRO`).
fn write_slot(slot: u64, value: u64, relro: bool) {
    let page = slot & !(PAGE - 1);
    // SAFETY: the slot is an aligned word of a mapped object's GOT; its page is writable
    // after the first mprotect (a no-op for a GOT that is writable anyway).
    unsafe {
        if mprotect(page as *mut c_void, PAGE as usize, PROT_READ | PROT_WRITE) != 0 {
            return;
        }
        (*(slot as *const AtomicU64)).store(value, Ordering::Release);
        if relro {
            mprotect(page as *mut c_void, PAGE as usize, PROT_READ);
        }
    }
}

/// Whether the object is the tracer's own.
fn is_tracer(info: &DlPhdrInfo) -> bool {
    let here = patch_object as *const () as u64;
    // SAFETY: the loader's program headers of the object.
    let phdrs = unsafe { std::slice::from_raw_parts(info.phdr, usize::from(info.phnum)) };
    phdrs.iter().any(|p| {
        let lo = info.addr.wrapping_add(p.p_vaddr);
        p.p_type == 1 && here >= lo && here < lo + p.p_memsz
    })
}

unsafe extern "C" fn patch_object(info: *mut DlPhdrInfo, size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `patch_all`'s table and pass.
    let (hooked, pass) = unsafe { &*data.cast::<([(&[u8], u64); 10], Pass)>() };
    // SAFETY: the loader's record for one mapped object.
    let info = unsafe { &*info };
    if size >= std::mem::size_of::<DlPhdrInfo>() {
        ADDS_SEEN.store(info.adds.max(1), Ordering::Release);
    }
    if info.phdr.is_null() || is_tracer(info) {
        return 0;
    }
    // SAFETY: as above.
    let phdrs = unsafe { std::slice::from_raw_parts(info.phdr, usize::from(info.phnum)) };
    let relro = phdrs.iter().find(|p| p.p_type == PT_GNU_RELRO).map(|p| {
        let lo = info.addr.wrapping_add(p.p_vaddr);
        (lo, lo + p.p_memsz)
    });
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
        return 0;
    };
    let base = info.addr;
    // Relocated in place by the loader (absolute), except in a read-only dynamic section.
    let at = |v: u64| if v < base { v.wrapping_add(base) } else { v };
    let (mut symtab, mut strtab, mut jmprel, mut pltsz, mut rela, mut relasz) = (0, 0, 0, 0, 0, 0);
    let mut d = base.wrapping_add(dynamic.p_vaddr) as *const [u64; 2];
    // SAFETY: the dynamic section of a mapped object, ended by DT_NULL.
    unsafe {
        for _ in 0..4096 {
            let [tag, val] = *d;
            match tag as i64 {
                DT_NULL => break,
                DT_SYMTAB => symtab = at(val),
                DT_STRTAB => strtab = at(val),
                DT_JMPREL => jmprel = at(val),
                DT_PLTRELSZ => pltsz = val,
                DT_RELA => rela = at(val),
                DT_RELASZ => relasz = val,
                _ => {}
            }
            d = d.add(1);
        }
    }
    if symtab == 0 || strtab == 0 {
        return 0;
    }
    for (table, bytes) in [(jmprel, pltsz), (rela, relasz)] {
        if table == 0 {
            continue;
        }
        for i in 0..bytes / 24 {
            // SAFETY: an `Elf64_Rela` of the object's relocation table.
            let [offset, info_word, _] = unsafe { *((table + i * 24) as *const [u64; 3]) };
            let kind = info_word & 0xffff_ffff;
            if kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT {
                continue;
            }
            let sym = info_word >> 32;
            // SAFETY: an `Elf64_Sym` of the object's symbol table, its name in the string
            // table (NUL-terminated).
            let name = unsafe {
                let st_name = *((symtab + sym * 24) as *const u32);
                CStr::from_ptr((strtab + u64::from(st_name)) as *const c_char)
            };
            let Some(&(_, ours)) = hooked.iter().find(|(n, _)| *n == name.to_bytes()) else {
                continue;
            };
            let releasing = releases(name.to_bytes());
            if releasing != (*pass == Pass::Releasing) {
                continue;
            }
            let slot = base.wrapping_add(offset);
            // SAFETY: the slot is a mapped, aligned word of the object.
            let old = unsafe { &*(slot as *const AtomicU64) }.load(Ordering::Acquire);
            if old == ours {
                continue;
            }
            let n = PATCHED.fetch_add(1, Ordering::AcqRel);
            let Some(p) = PATCHES.get(n) else {
                PATCHED.store(MAX_PATCHES, Ordering::Release);
                return 1;
            };
            let sealed = relro.is_some_and(|(lo, hi)| slot >= lo && slot < hi);
            p.slot.store(slot | u64::from(sealed), Ordering::Release);
            p.old.store(old, Ordering::Release);
            p.releasing.store(releasing, Ordering::Release);
            write_slot(slot, ours, sealed);
        }
    }
    0
}
