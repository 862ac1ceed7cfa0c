//! Python programs seen as Python: CPython's own allocators and its frames.
//!
//! When the traced process is a CPython interpreter (its executable or a library it was
//! linked with exports the C API), the tracer joins the interpreter once it is initialised:
//! the clock thread sees `Py_IsInitialized()` turn true and asks, with `Py_AddPendingCall`,
//! for [`install`] to run on the main thread between two bytecodes, with the GIL held. No
//! flag, environment variable or change to the program is needed, and interpreters without
//! symbols (Debian's) work: only exported functions are called. [`install`] then
//!
//! - wraps the allocators of the `PYMEM_DOMAIN_MEM` and `PYMEM_DOMAIN_OBJ` domains and the
//!   arena allocator ([`pymem`]), unless `PYTHONMALLOC` chose another allocator than pymalloc:
//!   each request the program makes (`PyObject_Malloc`, `PyMem_Malloc`...) is recorded, and
//!   what pymalloc asks of the C library and the arenas it maps are recorded too, tagged;
//! - turns on the frame walk ([`frames`]) when stacks are recorded and the version's layout
//!   is known (3.9 to 3.13): every allocation's stack then holds the Python frames (function,
//!   file, line executing) in place of the interpreter's evaluation frames.
//!
//! **Tags.** Which allocator served an event is in bits 60-61 of its recorded address (user
//! addresses stay below 2^57): 0 the C library, called by the program; [`TAG_OBJECT`] a request
//! to Python's allocator; [`TAG_BACKING`] a C library call made by Python's allocator for such
//! a request; [`TAG_ARENA`] one of pymalloc's arenas. The two views a reader builds (what the
//! program asked for: untagged and object events; what the C library served: untagged,
//! backing and arena events) each keep addresses unique, so the spool's merge and the
//! loader's pairing need no change. See `loaders/src/events/requests.rs`.
//!
//! What is missed: allocations made before the interpreter finished initialising carry no
//! Python frames, and Python objects freed later that were allocated before [`install`]
//! ran show as frees of unknown objects (the reader drops those quietly); an interpreter
//! embedded by a program that loads libpython with `dlopen` is not joined.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::encode::StackWriter;
use crate::{DlInfo, dladdr1, dlerror};

pub(crate) mod frames;
pub(crate) mod layout;
mod pymem;

pub(crate) use frames::{MAX_PY_FRAMES, PyFrame};

/// See the module documentation.
pub(crate) const TAG_OBJECT: u64 = 1 << 60;
pub(crate) const TAG_BACKING: u64 = 2 << 60;
pub(crate) const TAG_ARENA: u64 = 3 << 60;

const NONE: u32 = 0;
const WAITING: u32 = 1;
const REQUESTED: u32 = 2;
const INSTALLED: u32 = 3;
/// In-process tracking stopped its run: the allocators are the interpreter's again.
const UNWRAPPED: u32 = 4;

static STATE: AtomicU32 = AtomicU32::new(NONE);

/// The interpreter's exported functions and objects (addresses, 0 until found).
pub(crate) struct Api {
    is_initialized: AtomicUsize,
    add_pending_call: AtomicUsize,
    get_version: AtomicUsize,
    pub(crate) this_thread_state: AtomicUsize,
    pub(crate) addr2line: AtomicUsize,
    pub(crate) code_type: AtomicUsize,
    pub(crate) unicode_type: AtomicUsize,
    eval_frame: AtomicUsize,
    mem_get: AtomicUsize,
    mem_set: AtomicUsize,
    arena_get: AtomicUsize,
    arena_set: AtomicUsize,
}

pub(crate) static API: Api = Api {
    is_initialized: AtomicUsize::new(0),
    add_pending_call: AtomicUsize::new(0),
    get_version: AtomicUsize::new(0),
    this_thread_state: AtomicUsize::new(0),
    addr2line: AtomicUsize::new(0),
    code_type: AtomicUsize::new(0),
    unicode_type: AtomicUsize::new(0),
    eval_frame: AtomicUsize::new(0),
    mem_get: AtomicUsize::new(0),
    mem_set: AtomicUsize::new(0),
    arena_get: AtomicUsize::new(0),
    arena_set: AtomicUsize::new(0),
};

const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();
const RTLD_DL_SYMENT: c_int = 1;

fn find(slot: &AtomicUsize, name: &std::ffi::CStr) -> bool {
    // SAFETY: a NUL-terminated name; dlsym allocates at most through the interposed malloc.
    let f = unsafe { crate::dlsym(RTLD_DEFAULT, name.as_ptr()) };
    slot.store(f as usize, Ordering::Release);
    !f.is_null()
}

/// At the tracer's initialisation: whether the process is a CPython interpreter (its C API
/// is exported by the executable or a library loaded with it). The clock thread then waits
/// for it to be initialised ([`poll`]).
pub(crate) fn detect() {
    let all = [
        find(&API.is_initialized, c"Py_IsInitialized"),
        find(&API.add_pending_call, c"Py_AddPendingCall"),
        find(&API.get_version, c"Py_GetVersion"),
        find(&API.this_thread_state, c"PyGILState_GetThisThreadState"),
        find(&API.addr2line, c"PyCode_Addr2Line"),
        find(&API.code_type, c"PyCode_Type"),
        find(&API.unicode_type, c"PyUnicode_Type"),
        find(&API.eval_frame, c"_PyEval_EvalFrameDefault"),
        find(&API.mem_get, c"PyMem_GetAllocator"),
        find(&API.mem_set, c"PyMem_SetAllocator"),
        find(&API.arena_get, c"PyObject_GetArenaAllocator"),
        find(&API.arena_set, c"PyObject_SetArenaAllocator"),
    ];
    if all.iter().all(|&found| found) {
        STATE.store(WAITING, Ordering::Release);
    }
    // A look-up that failed left an error message, allocated (untraced: the tracer is
    // initialising); the second `dlerror` frees it now, untraced too, instead of a later
    // call of the program's freeing what the trace never saw allocated.
    // SAFETY: plain libc calls.
    unsafe {
        dlerror();
        dlerror();
    }
}

/// Called by the clock thread every period: once the interpreter is initialised, asks for
/// [`install`] to run on its main thread.
pub(crate) fn poll() {
    if STATE.load(Ordering::Acquire) != WAITING {
        return;
    }
    type IsInit = unsafe extern "C" fn() -> c_int;
    type Pending =
        unsafe extern "C" fn(unsafe extern "C" fn(*mut c_void) -> c_int, *mut c_void) -> c_int;
    let init = API.is_initialized.load(Ordering::Acquire);
    let pending = API.add_pending_call.load(Ordering::Acquire);
    // SAFETY: the addresses dlsym gave for these very functions (checked non-zero in
    // `detect`); `Py_IsInitialized` reads a flag, and `Py_AddPendingCall` may be called from
    // any thread, without the GIL or a thread state (CPython's documentation).
    unsafe {
        let init: IsInit = std::mem::transmute::<usize, IsInit>(init);
        if init() == 0 {
            return;
        }
        let pending: Pending = std::mem::transmute::<usize, Pending>(pending);
        // A full queue (-1) is tried again next period.
        if pending(install, std::ptr::null_mut()) == 0 {
            STATE.store(REQUESTED, Ordering::Release);
        }
    }
}

/// `3.x`'s `x` from `Py_GetVersion()` ("3.11.2 (main, ...").
fn minor_version() -> Option<u32> {
    type GetVersion = unsafe extern "C" fn() -> *const c_char;
    let f = API.get_version.load(Ordering::Acquire);
    // SAFETY: dlsym's address for Py_GetVersion, which returns a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(std::mem::transmute::<usize, GetVersion>(f)()) };
    let v = v.to_bytes();
    let rest = v.strip_prefix(b"3.")?;
    let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(rest.get(..digits)?).ok()?.parse().ok()
}

/// The extent of `_PyEval_EvalFrameDefault` (from its symbol's size), whose native frames the
/// Python frames replace.
fn eval_frame_range() -> Option<(u64, u64)> {
    let addr = API.eval_frame.load(Ordering::Acquire);
    let mut info = DlInfo::empty();
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: a local out-parameter each; dladdr1 writes an `Elf64_Sym` pointer into `sym`.
    let ok = unsafe { dladdr1(addr as *const c_void, &mut info, &mut sym, RTLD_DL_SYMENT) };
    if ok == 0 || sym.is_null() {
        return None;
    }
    // SAFETY: `st_size` is the u64 at offset 16 of an `Elf64_Sym`.
    let size = unsafe { sym.cast::<u8>().add(16).cast::<u64>().read_unaligned() };
    (size > 0).then_some((addr as u64, addr as u64 + size))
}

/// Whether the program left Python's allocator to pymalloc (no `PYTHONMALLOC`, or one of
/// pymalloc's).
fn pymalloc_in_use() -> bool {
    // SAFETY: getenv does not allocate; the result is NUL-terminated or null.
    let v = unsafe { crate::getenv(c"PYTHONMALLOC".as_ptr()) };
    if v.is_null() {
        return true;
    }
    // SAFETY: as above.
    let v = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
    v.is_empty() || v.starts_with(b"pymalloc")
}

/// Runs once, on the interpreter's main thread with the GIL held (a pending call): see
/// [`set_up`].
unsafe extern "C" fn install(_: *mut c_void) -> c_int {
    set_up();
    0
}

/// In-process tracking's start (the caller holds the GIL): [`set_up`] now.
pub(crate) fn wrap_running() {
    if matches!(STATE.load(Ordering::Acquire), WAITING | UNWRAPPED) {
        set_up();
    }
}

/// In-process tracking's stop (the caller holds the GIL): the interpreter's own allocators
/// back.
pub(crate) fn unwrap_running() {
    if STATE.load(Ordering::Acquire) == INSTALLED {
        if pymalloc_in_use() {
            // SAFETY: with the GIL held, as `wrap` was.
            unsafe { pymem::unwrap() };
        }
        STATE.store(UNWRAPPED, Ordering::Release);
    }
}

/// Wraps Python's allocators and turns the frame walk on. Writes what it did to the spool
/// as a `PYTHON` frame (`key=value` lines).
fn set_up() {
    let minor = minor_version();
    let layout = minor.and_then(layout::of_minor);
    let range = eval_frame_range();
    let frames = match (crate::stacks_on(), layout, range) {
        (false, _, _) => "off (no stacks)",
        (true, None, _) => "off (no layout for this version)",
        (true, Some(_), None) => "off (no extent for _PyEval_EvalFrameDefault)",
        (true, Some(l), Some(r)) => {
            frames::enable(l, r);
            "on"
        }
    };
    let pymalloc = if pymalloc_in_use() {
        // SAFETY: with the GIL held, before any other thread can allocate through them.
        unsafe { pymem::wrap() };
        "on"
    } else {
        "off (PYTHONMALLOC)"
    };
    let mut text = [0u8; 160];
    let mut t = StackWriter::new(&mut text);
    t.put(b"version=3.");
    let minor = minor.unwrap_or(0).min(99) as u8;
    if minor >= 10 {
        t.put_u8(b'0' + minor / 10);
    }
    t.put_u8(b'0' + minor % 10);
    t.put(b"\nframes=");
    t.put(frames.as_bytes());
    t.put(b"\nobjects=");
    t.put(pymalloc.as_bytes());
    t.put(b"\n");
    let mut frame = [0u8; 170];
    let mut w = StackWriter::new(&mut frame);
    w.put_u8(crate::spool::FRAME_PYTHON);
    w.put_u32(t.len() as u32);
    w.put(t.bytes());
    crate::write_frame(w.bytes());
    STATE.store(INSTALLED, Ordering::Release);
}
