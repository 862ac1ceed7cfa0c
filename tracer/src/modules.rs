//! The process's modules (the executable, shared objects, the vDSO) as the unwinder needs
//! them: where each is mapped (its `PT_LOAD` segments), its `.eh_frame_hdr` and its GNU build
//! id. Found with `dl_iterate_phdr` when a return address falls outside every known module
//! (at the first capture, and after a `dlopen`), kept in a fixed table, and written to the
//! spool as one `MODULE` frame each, so the loader can turn addresses into module + offset and
//! the symbolizer can find each file and check its build id.
//!
//! A module that `dlclose` unmaps leaves the table ([`after_dlclose`], called by the
//! tracer's `dlclose`), and its slot is used again: otherwise a library mapped later at the
//! same addresses would be unwound with the first one's tables, and a program that loads and
//! unloads libraries in a loop would fill the table. The unwinder reads a slot while another
//! thread may rewrite it, so each slot's place in memory is a few atomic words under a
//! sequence number (a seqlock): a reader copies them and checks the number did not move.
//! Each removal bumps [`unloads`], which the unwinder's rule caches and stack ids are keyed by.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

use crate::encode::StackWriter;

/// glibc's `struct dl_phdr_info`; `adds` and `subs` are there when the size the loader passes
/// the callback covers them.
#[repr(C)]
pub(crate) struct DlPhdrInfo {
    pub(crate) addr: u64,
    pub(crate) name: *const c_char,
    pub(crate) phdr: *const Elf64Phdr,
    pub(crate) phnum: u16,
    /// How many objects were loaded, and unloaded, since the process started.
    pub(crate) adds: u64,
    pub(crate) subs: u64,
}

#[repr(C)]
pub(crate) struct Elf64Phdr {
    pub(crate) p_type: u32,
    pub(crate) p_flags: u32,
    pub(crate) p_offset: u64,
    pub(crate) p_vaddr: u64,
    pub(crate) p_paddr: u64,
    pub(crate) p_filesz: u64,
    pub(crate) p_memsz: u64,
    pub(crate) p_align: u64,
}

pub(crate) type PhdrCallback = unsafe extern "C" fn(*mut DlPhdrInfo, usize, *mut c_void) -> c_int;

unsafe extern "C" {
    pub(crate) fn dl_iterate_phdr(cb: PhdrCallback, data: *mut c_void) -> c_int;
    fn readlink(path: *const c_char, buf: *mut c_char, len: usize) -> isize;
}

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const NT_GNU_BUILD_ID: u32 = 3;

/// Most modules the table holds at once (a large Python program maps a few hundred).
pub const MAX_MODULES: usize = 2048;
/// Most `PT_LOAD` segments kept per module (linkers emit 2 to 5).
const MAX_LOADS: usize = 8;
/// Longest build id kept (GNU ids are 20 bytes).
const MAX_BUILD_ID: usize = 32;
/// Longest path kept.
const MAX_PATH: usize = 512;
/// A module's place as a slot stores it: bias, `.eh_frame_hdr`, segment count, then each
/// segment's start and end.
const WORDS: usize = 3 + 2 * MAX_LOADS;

/// Where one module is mapped: what the unwinder reads (a copy of its slot).
#[derive(Clone, Copy)]
pub struct Module {
    /// Load bias: a file's virtual address plus the bias is its address in memory.
    pub bias: u64,
    /// `[start, end)` of each `PT_LOAD` segment in memory.
    loads: [(u64, u64); MAX_LOADS],
    nloads: usize,
    /// The `.eh_frame_hdr` in memory, 0 when the module has none.
    pub eh_frame_hdr: u64,
}

/// What else a `MODULE` frame says of a module: its file and build id.
pub struct Names {
    build_id: [u8; MAX_BUILD_ID],
    build_id_len: usize,
    path: [u8; MAX_PATH],
    path_len: usize,
}

/// Writes a module to the spool.
pub type Emit = fn(&Module, &Names);

impl Names {
    const EMPTY: Self = Self {
        build_id: [0; MAX_BUILD_ID],
        build_id_len: 0,
        path: [0; MAX_PATH],
        path_len: 0,
    };
}

impl Module {
    const EMPTY: Self = Self {
        bias: 0,
        loads: [(0, 0); MAX_LOADS],
        nloads: 0,
        eh_frame_hdr: 0,
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

    /// What tells modules apart in `dl_iterate_phdr`'s reports: the bias and the first
    /// segment's start.
    fn key(&self) -> (u64, u64) {
        (self.bias, self.loads[0].0)
    }

    fn to_words(self) -> [u64; WORDS] {
        let mut w = [0u64; WORDS];
        w[0] = self.bias;
        w[1] = self.eh_frame_hdr;
        w[2] = self.nloads as u64;
        for (i, &(lo, hi)) in self.loads.iter().enumerate() {
            w[3 + 2 * i] = lo;
            w[4 + 2 * i] = hi;
        }
        w
    }

    fn from_words(w: &[u64; WORDS]) -> Self {
        let mut m = Self {
            bias: w[0],
            eh_frame_hdr: w[1],
            nloads: (w[2] as usize).min(MAX_LOADS),
            ..Self::EMPTY
        };
        for (i, l) in m.loads.iter_mut().enumerate() {
            *l = (w[3 + 2 * i], w[4 + 2 * i]);
        }
        m
    }
}

/// One entry of the table: a module's words under a sequence number (odd while a writer,
/// holding the table's lock, rewrites them). A slot without segments is free.
struct Slot {
    seq: AtomicU64,
    words: [AtomicU64; WORDS],
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    seq: AtomicU64::new(0),
    words: [const { AtomicU64::new(0) }; WORDS],
};

impl Slot {
    /// A copy of the module in the slot, or `None` when it is free or being written (the
    /// module being written is a new one: the caller then finds no module, and looks again
    /// once [`generation`] moved).
    fn read(&self) -> Option<Module> {
        // A writer holds the slot for a few stores: a read that saw one finish tries again.
        for _ in 0..4 {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                return None;
            }
            let words: [u64; WORDS] =
                std::array::from_fn(|i| self.words.get(i).map_or(0, |w| w.load(Ordering::Relaxed)));
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == seq {
                return (words[2] != 0).then(|| Module::from_words(&words));
            }
        }
        None
    }

    /// Whether the slot may hold `addr`: a racy look, confirmed by [`Slot::read`].
    fn may_hold(&self, addr: u64) -> bool {
        let n = (self.words[2].load(Ordering::Relaxed) as usize).min(MAX_LOADS);
        (0..n).any(|i| {
            let lo = self.words[3 + 2 * i].load(Ordering::Relaxed);
            let hi = self.words[4 + 2 * i].load(Ordering::Relaxed);
            addr >= lo && addr < hi
        })
    }

    /// Rewrites the slot. Only with the table's lock held.
    fn write(&self, m: &Module) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(m.to_words()) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The slot's module key, read by the lock's holder (the only writer).
    fn key_locked(&self) -> Option<(u64, u64)> {
        (self.words[2].load(Ordering::Relaxed) != 0).then(|| {
            (
                self.words[0].load(Ordering::Relaxed),
                self.words[3].load(Ordering::Relaxed),
            )
        })
    }
}

struct Table {
    slots: [Slot; MAX_MODULES],
    /// Each slot's names: written and read only under `lock` (or in a fork child, alone).
    names: UnsafeCell<[Names; MAX_MODULES]>,
    /// Slots used so far: readers look below it (some of those may be free again).
    count: AtomicUsize,
    /// Bumped when a module is added or removed.
    changes: AtomicU64,
    /// Bumped when modules are removed.
    unloads: AtomicU64,
    /// `dlclose` calls under way.
    closing: AtomicUsize,
    /// Held (by its [`crate::self_id`]) while modules are added or removed.
    lock: AtomicUsize,
}

// SAFETY: `names` is touched only under `lock`; the slots are atomics.
unsafe impl Sync for Table {}

static TABLE: Table = Table {
    slots: [EMPTY_SLOT; MAX_MODULES],
    names: UnsafeCell::new([Names::EMPTY; MAX_MODULES]),
    count: AtomicUsize::new(0),
    changes: AtomicU64::new(0),
    unloads: AtomicU64::new(0),
    closing: AtomicUsize::new(0),
    lock: AtomicUsize::new(0),
};

fn used_slots() -> &'static [Slot] {
    let n = TABLE.count.load(Ordering::Acquire);
    TABLE.slots.get(..n).unwrap_or(&[])
}

/// How often the table changed: a rule found for code in no module holds until it does.
pub fn generation() -> u64 {
    TABLE.changes.load(Ordering::Acquire)
}

/// How many times modules were removed: rules and stacks found before then may be of a
/// module no longer mapped.
#[inline(always)]
pub fn unloads() -> u64 {
    TABLE.unloads.load(Ordering::Acquire)
}

/// A copy of the module that maps `addr`, among those known.
#[inline]
pub fn find(addr: u64) -> Option<Module> {
    used_slots()
        .iter()
        .filter(|s| s.may_hold(addr))
        .find_map(|s| s.read().filter(|m| m.segment_end(addr).is_some()))
}

/// The module that maps `addr`, looking for new modules (and writing them to the spool with
/// `emit`) when none known does.
pub fn find_or_refresh(addr: u64, emit: Emit) -> Option<Module> {
    if let Some(m) = find(addr) {
        return Some(m);
    }
    refresh(emit);
    find(addr)
}

/// Takes the table's lock without waiting: false when another thread (or this one, in a
/// signal handler) holds it.
fn try_lock() -> bool {
    TABLE
        .lock
        .compare_exchange(0, crate::self_id(), Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

/// Adds the modules `dl_iterate_phdr` reports that the table lacks, calling `emit` for each;
/// false when it did not look.
///
/// When another thread is adding modules, this one does not wait (the caller's frame is then
/// left unresolved): that thread may itself be waiting in `dl_iterate_phdr` for the dynamic
/// loader's lock, which this thread may hold (a `malloc` made inside the program's own
/// `dl_iterate_phdr` callback).
pub fn refresh(emit: Emit) -> bool {
    if !try_lock() {
        return false;
    }
    let mut emit = emit;
    // SAFETY: the callback only reads what the dynamic loader hands it.
    unsafe { dl_iterate_phdr(add_module, (&raw mut emit).cast()) };
    crate::unlock(&TABLE.lock);
    true
}

/// Before the real `dlclose`: from here until [`after_dlclose`], a rule computed for code
/// not in the caches first drops the modules already unloaded (see [`find_current`]).
/// Returns [`unloads`] as it is, for [`after_dlclose`].
pub fn before_dlclose() -> u64 {
    TABLE.closing.fetch_add(1, Ordering::AcqRel);
    unloads()
}

/// After the real `dlclose`: removes the modules it unloaded; returns whether modules were
/// removed since [`before_dlclose`] returned `unloads_before`.
pub fn after_dlclose(unloads_before: u64) -> bool {
    forget_unloaded(true);
    TABLE.closing.fetch_sub(1, Ordering::AcqRel);
    unloads() != unloads_before
}

/// [`find`], for a rule about to be computed from the module's tables: while a `dlclose` is
/// under way, the modules it unloaded are dropped first. Another thread may map a library
/// where that `dlclose` just unmapped one, and call `malloc` from it, before the `dlclose`
/// returns: the table's entry for the old one would send the unwinder to tables no longer
/// mapped. (The dynamic loader takes a module off its list before unmapping it.)
pub fn find_current(addr: u64) -> Option<Module> {
    if TABLE.closing.load(Ordering::Acquire) != 0 {
        forget_unloaded(false);
    }
    find(addr)
}

/// Removes the modules `dl_iterate_phdr` no longer reports, freeing their slots, and bumps
/// [`unloads`] when there were any. With `wait` (the caller holds none of the dynamic
/// loader's locks), waits for the table's lock unless this thread holds it (a `dlclose` in a
/// signal handler); else gives up when it is busy, as [`refresh`] does.
fn forget_unloaded(wait: bool) {
    let locked = if wait {
        crate::lock(&TABLE.lock)
    } else {
        try_lock()
    };
    if !locked {
        return;
    }
    let mut seen = [0u64; MAX_MODULES / 64];
    // SAFETY: the callback only reads what the dynamic loader hands it.
    unsafe { dl_iterate_phdr(mark_seen, (&raw mut seen).cast()) };
    let mut removed = false;
    for (i, slot) in used_slots().iter().enumerate() {
        let marked = seen.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1);
        if !marked && slot.key_locked().is_some() {
            slot.write(&Module::EMPTY);
            removed = true;
        }
    }
    if removed {
        TABLE.changes.fetch_add(1, Ordering::AcqRel);
        TABLE.unloads.fetch_add(1, Ordering::AcqRel);
    }
    crate::unlock(&TABLE.lock);
}

/// Writes every known module again (a fork child's new spool).
pub fn emit_all(emit: Emit) {
    // SAFETY: in a fork child, alone: no other thread touches the names.
    let names = unsafe { &*TABLE.names.get() };
    for (slot, names) in used_slots().iter().zip(names.iter()) {
        if let Some(m) = slot.read() {
            emit(&m, names);
        }
    }
}

/// In a fork child: the lock may have been held, and a `dlclose` under way, in a thread that
/// does not exist there.
pub fn reset_lock_after_fork() {
    TABLE.lock.store(0, Ordering::Release);
    TABLE.closing.store(0, Ordering::Release);
}

/// The module a `dl_iterate_phdr` report describes (its segments), `None` without any.
///
/// # Safety
/// `info` is a report of the dynamic loader's.
unsafe fn reported(info: &DlPhdrInfo) -> Option<(Module, &[Elf64Phdr])> {
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
    (m.nloads > 0).then_some((m, phdrs))
}

unsafe extern "C" fn mark_seen(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid info; `data` is the bit set of `forget_unloaded`.
    let (info, seen) = unsafe { (&*info, &mut *data.cast::<[u64; MAX_MODULES / 64]>()) };
    // SAFETY: as above.
    let Some((m, _)) = (unsafe { reported(info) }) else {
        return 0;
    };
    let key = m.key();
    for (i, slot) in used_slots().iter().enumerate() {
        if slot.key_locked() == Some(key)
            && let Some(w) = seen.get_mut(i / 64)
        {
            *w |= 1 << (i % 64);
        }
    }
    0
}

unsafe extern "C" fn add_module(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid info; `data` is the `emit` of `refresh`.
    let (info, emit) = unsafe { (&*info, *data.cast::<Emit>()) };
    // SAFETY: as above.
    let Some((mut m, phdrs)) = (unsafe { reported(info) }) else {
        return 0;
    };
    let slots = used_slots();
    if slots.iter().any(|s| s.key_locked() == Some(m.key())) {
        return 0;
    }
    // A free slot, else the next one.
    let Some(at) = slots
        .iter()
        .position(|s| s.key_locked().is_none())
        .or((slots.len() < MAX_MODULES).then_some(slots.len()))
    else {
        return 0;
    };
    let mut names = Names::EMPTY;
    for ph in phdrs {
        let at = info.addr.wrapping_add(ph.p_vaddr);
        if ph.p_type == PT_GNU_EH_FRAME && m.holds(at, 16) {
            m.eh_frame_hdr = at;
        } else if ph.p_type == PT_NOTE && m.holds(at, ph.p_filesz) {
            read_build_id(&mut names, at, ph.p_filesz);
        }
    }
    set_path(&mut names, info.name);
    let (Some(slot), Some(slot_names)) = (
        TABLE.slots.get(at),
        // SAFETY: the lock is held: no one else touches the names.
        unsafe { (*TABLE.names.get()).get_mut(at) },
    ) else {
        return 0;
    };
    *slot_names = names;
    slot.write(&m);
    if at == slots.len() {
        TABLE.count.store(at + 1, Ordering::Release);
    }
    TABLE.changes.fetch_add(1, Ordering::AcqRel);
    emit(&m, slot_names);
    0
}

/// The GNU build id among the notes at `[at, at + len)` (checked to be mapped).
fn read_build_id(names: &mut Names, at: u64, len: u64) {
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
            names.build_id[..id.len()].copy_from_slice(id);
            names.build_id_len = id.len();
            return;
        }
        p = next;
    }
}

/// The module's file: the loader's name, or the executable's path for the program itself.
fn set_path(m: &mut Names, name: *const c_char) {
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
pub fn encode_module(m: &Module, names: &Names, out: &mut [u8]) -> Option<usize> {
    let mut w = StackWriter::new(out);
    w.put_u64(m.bias);
    w.put_u8(m.nloads as u8);
    for &(lo, hi) in m.loads.get(..m.nloads).unwrap_or(&[]) {
        w.put_u64(lo);
        w.put_u64(hi);
    }
    w.put_u8(names.build_id_len as u8);
    w.put(names.build_id.get(..names.build_id_len).unwrap_or(&[]));
    w.put(names.path.get(..names.path_len).unwrap_or(&[]));
    (!w.overflowed()).then(|| w.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_reads_back_what_was_written_and_nothing_once_freed() {
        let slot = EMPTY_SLOT;
        assert!(slot.read().is_none());
        let mut m = Module::EMPTY;
        m.bias = 0x7000_0000;
        m.eh_frame_hdr = 0x7000_1800;
        m.loads[0] = (0x7000_0000, 0x7000_1000);
        m.loads[1] = (0x7000_1000, 0x7000_2000);
        m.nloads = 2;
        slot.write(&m);
        let back = slot.read().map(|b| (b.bias, b.eh_frame_hdr, b.span()));
        assert_eq!(
            back,
            Some((0x7000_0000, 0x7000_1800, (0x7000_0000, 0x7000_2000)))
        );
        assert!(slot.may_hold(0x7000_1fff) && !slot.may_hold(0x7000_2000));
        assert_eq!(slot.key_locked(), Some((0x7000_0000, 0x7000_0000)));
        slot.write(&Module::EMPTY);
        assert!(slot.read().is_none() && slot.key_locked().is_none());
        // Written twice per write: even again.
        assert_eq!(slot.seq.load(Ordering::Relaxed), 4);
    }
}
