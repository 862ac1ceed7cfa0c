//! The process's modules (the executable, shared objects, the vDSO) as the unwinder needs
//! them: where each is mapped (its `PT_LOAD` segments), its `.eh_frame_hdr` and its GNU build
//! id. Found with `dl_iterate_phdr` when a return address falls outside every known module
//! (at the first capture, and after a `dlopen`), kept in a fixed table that only grows (an
//! entry is complete before the count that publishes it), and written to the spool as one
//! `MODULE` frame each, so the loader can turn addresses into module + offset and the
//! symbolizer can find each file and check its build id.
//!
//! A module that `dlclose` unmaps stays in the table: should another one be mapped at the same
//! addresses, its frames may be attributed to the first (a limitation, stated in the book: `docs/src/guide/call-stacks.md`).

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::encode::StackWriter;

#[repr(C)]
struct DlPhdrInfo {
    addr: u64,
    name: *const c_char,
    phdr: *const Elf64Phdr,
    phnum: u16,
}

#[repr(C)]
struct Elf64Phdr {
    p_type: u32,
    p_flags: u32,
    p_offset: u64,
    p_vaddr: u64,
    p_paddr: u64,
    p_filesz: u64,
    p_memsz: u64,
    p_align: u64,
}

type PhdrCallback = unsafe extern "C" fn(*mut DlPhdrInfo, usize, *mut c_void) -> c_int;

unsafe extern "C" {
    fn dl_iterate_phdr(cb: PhdrCallback, data: *mut c_void) -> c_int;
    fn readlink(path: *const c_char, buf: *mut c_char, len: usize) -> isize;
}

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const NT_GNU_BUILD_ID: u32 = 3;

/// Most modules the table holds (a large Python program maps a few hundred).
pub const MAX_MODULES: usize = 2048;
/// Most `PT_LOAD` segments kept per module (linkers emit 2 to 5).
const MAX_LOADS: usize = 8;
/// Longest build id kept (GNU ids are 20 bytes).
const MAX_BUILD_ID: usize = 32;
/// Longest path kept.
const MAX_PATH: usize = 512;

/// One mapped module.
pub struct Module {
    /// Load bias: a file's virtual address plus the bias is its address in memory.
    pub bias: u64,
    /// `[start, end)` of each `PT_LOAD` segment in memory.
    loads: [(u64, u64); MAX_LOADS],
    nloads: usize,
    /// The `.eh_frame_hdr` in memory, 0 when the module has none.
    pub eh_frame_hdr: u64,
    build_id: [u8; MAX_BUILD_ID],
    build_id_len: usize,
    path: [u8; MAX_PATH],
    path_len: usize,
}

impl Module {
    const EMPTY: Self = Self {
        bias: 0,
        loads: [(0, 0); MAX_LOADS],
        nloads: 0,
        eh_frame_hdr: 0,
        build_id: [0; MAX_BUILD_ID],
        build_id_len: 0,
        path: [0; MAX_PATH],
        path_len: 0,
    };

    /// Whether `[addr, addr + len)` lies inside one of the module's segments.
    #[inline]
    pub fn holds(&self, addr: u64, len: u64) -> bool {
        self.segment_end(addr).is_some_and(|end| end - addr >= len)
    }

    /// From the start of the module's first segment to the end of its last.
    pub fn span(&self) -> (u64, u64) {
        let loads = self.loads.get(..self.nloads).unwrap_or(&[]);
        let lo = loads.iter().map(|l| l.0).min().unwrap_or(0);
        let hi = loads.iter().map(|l| l.1).max().unwrap_or(0);
        (lo, hi)
    }

    /// The end of the segment that holds `addr`.
    #[inline]
    pub fn segment_end(&self, addr: u64) -> Option<u64> {
        self.loads
            .get(..self.nloads)?
            .iter()
            .find(|&&(lo, hi)| addr >= lo && addr < hi)
            .map(|&(_, hi)| hi)
    }
}

struct Table {
    modules: UnsafeCell<[Module; MAX_MODULES]>,
    /// Entries published so far (each complete before the count covers it).
    count: AtomicUsize,
    /// Held while modules are added.
    lock: AtomicUsize,
}

// SAFETY: entries are written only under `lock`, beyond `count`, and read only below it.
unsafe impl Sync for Table {}

static TABLE: Table = Table {
    modules: UnsafeCell::new([Module::EMPTY; MAX_MODULES]),
    count: AtomicUsize::new(0),
    lock: AtomicUsize::new(0),
};

fn published() -> &'static [Module] {
    let n = TABLE.count.load(Ordering::Acquire);
    // SAFETY: entries below `count` are complete and never written again.
    let all = unsafe { &*TABLE.modules.get() };
    all.get(..n).unwrap_or(&[])
}

/// How many modules are known: a rule found for code in no module holds until it grows.
pub fn generation() -> u64 {
    TABLE.count.load(Ordering::Acquire) as u64
}

/// The module that maps `addr`, among those known.
#[inline]
pub fn find(addr: u64) -> Option<&'static Module> {
    published().iter().find(|m| m.segment_end(addr).is_some())
}

/// The module that maps `addr`, looking for new modules (and writing them to the spool with
/// `emit`) when none known does.
pub fn find_or_refresh(addr: u64, emit: fn(&Module)) -> Option<&'static Module> {
    if let Some(m) = find(addr) {
        return Some(m);
    }
    refresh(emit);
    find(addr)
}

/// Adds the modules `dl_iterate_phdr` reports that the table lacks, calling `emit` for each;
/// false when it did not look.
///
/// When another thread is adding modules, this one does not wait (the caller's frame is then
/// left unresolved): that thread may itself be waiting in `dl_iterate_phdr` for the dynamic
/// loader's lock, which this thread may hold (a `malloc` made inside the program's own
/// `dl_iterate_phdr` callback).
pub fn refresh(emit: fn(&Module)) -> bool {
    if TABLE
        .lock
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    let mut emit = emit;
    // SAFETY: the callback only reads what the dynamic loader hands it.
    unsafe { dl_iterate_phdr(add_module, (&raw mut emit).cast()) };
    crate::unlock(&TABLE.lock);
    true
}

/// Writes every known module again (a fork child's new spool).
pub fn emit_all(emit: fn(&Module)) {
    for m in published() {
        emit(m);
    }
}

/// In a fork child: the lock may have been held by a thread that does not exist there.
pub fn reset_lock_after_fork() {
    TABLE.lock.store(0, Ordering::Release);
}

unsafe extern "C" fn add_module(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid info; `data` is the `emit` of `refresh`.
    let (info, emit) = unsafe { (&*info, *data.cast::<fn(&Module)>()) };
    let mut m = Module::EMPTY;
    m.bias = info.addr;
    // SAFETY: the loader's program headers, `phnum` of them.
    let phdrs = unsafe { std::slice::from_raw_parts(info.phdr, usize::from(info.phnum)) };
    for ph in phdrs.iter().filter(|p| p.p_type == PT_LOAD) {
        if let Some(slot) = m.loads.get_mut(m.nloads) {
            let lo = info.addr.wrapping_add(ph.p_vaddr);
            *slot = (lo, lo.wrapping_add(ph.p_memsz));
            m.nloads += 1;
        }
    }
    if m.nloads == 0 {
        return 0;
    }
    let first = m.loads[0].0;
    let n = TABLE.count.load(Ordering::Relaxed);
    if published()
        .iter()
        .any(|k| k.bias == m.bias && k.loads[0].0 == first)
        || n >= MAX_MODULES
    {
        return 0;
    }
    for ph in phdrs {
        let at = info.addr.wrapping_add(ph.p_vaddr);
        if ph.p_type == PT_GNU_EH_FRAME && m.holds(at, 16) {
            m.eh_frame_hdr = at;
        } else if ph.p_type == PT_NOTE && m.holds(at, ph.p_filesz) {
            read_build_id(&mut m, at, ph.p_filesz);
        }
    }
    set_path(&mut m, info.name);
    // SAFETY: slot `n` is beyond `count`, so no reader looks at it; the lock is held.
    unsafe {
        let all = &mut *TABLE.modules.get();
        if let Some(slot) = all.get_mut(n) {
            *slot = m;
            TABLE.count.store(n + 1, Ordering::Release);
            emit(&all[n]);
        }
    }
    0
}

/// The GNU build id among the notes at `[at, at + len)` (checked to be mapped).
fn read_build_id(m: &mut Module, at: u64, len: u64) {
    let mut p = at;
    let end = at + len;
    while p + 12 <= end {
        // SAFETY: inside the note segment, which `holds` checked is mapped.
        let (namesz, descsz, kind) = unsafe {
            let w = p as *const u32;
            (
                u64::from(w.read_unaligned()),
                u64::from(w.add(1).read_unaligned()),
                w.add(2).read_unaligned(),
            )
        };
        let name_at = p + 12;
        let desc_at = name_at + namesz.next_multiple_of(4);
        let next = desc_at + descsz.next_multiple_of(4);
        if next > end || next <= p {
            return;
        }
        if kind == NT_GNU_BUILD_ID && namesz == 4 && descsz as usize <= MAX_BUILD_ID {
            // SAFETY: [desc_at, desc_at + descsz) is inside the segment.
            let id = unsafe { std::slice::from_raw_parts(desc_at as *const u8, descsz as usize) };
            m.build_id[..id.len()].copy_from_slice(id);
            m.build_id_len = id.len();
            return;
        }
        p = next;
    }
}

/// The module's file: the loader's name, or the executable's path for the program itself.
fn set_path(m: &mut Module, name: *const c_char) {
    // SAFETY: the loader's name is NUL-terminated (or null).
    let name = if name.is_null() {
        &[]
    } else {
        // SAFETY: as above.
        unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes()
    };
    if name.is_empty() {
        // SAFETY: reading a link into a local buffer of the size given.
        let n = unsafe {
            readlink(
                c"/proc/self/exe".as_ptr(),
                m.path.as_mut_ptr().cast(),
                MAX_PATH,
            )
        };
        m.path_len = usize::try_from(n).unwrap_or(0).min(MAX_PATH);
    } else {
        let n = name.len().min(MAX_PATH);
        m.path[..n].copy_from_slice(&name[..n]);
        m.path_len = n;
    }
}

/// The spool's `MODULE` frame payload for `m`: bias u64, segment count u8 and each segment's
/// start and end (u64), build id length u8 and bytes, then the path (the rest). Returns the
/// length written, or `None` when `out` is too small.
pub fn encode_module(m: &Module, out: &mut [u8]) -> Option<usize> {
    let mut w = StackWriter::new(out);
    w.put_u64(m.bias);
    w.put_u8(m.nloads as u8);
    for &(lo, hi) in m.loads.get(..m.nloads).unwrap_or(&[]) {
        w.put_u64(lo);
        w.put_u64(hi);
    }
    w.put_u8(m.build_id_len as u8);
    w.put(m.build_id.get(..m.build_id_len).unwrap_or(&[]));
    w.put(m.path.get(..m.path_len).unwrap_or(&[]));
    (!w.overflowed()).then(|| w.len())
}
