//! Report your own allocator's events to [allocview](https://github.com/allocview/allocview):
//! an arena, a pool, a GPU memory manager. Under `allocview record` the events land in the
//! trace as a named heap beside malloc's, with their call stacks, and every command reads it
//! with `--heap NAME` (`allocview compare trace.avt --heap arena --policy buddy`: what if the
//! arena were a buddy allocator?). Without allocview every call is a no-op (one load and a
//! test).
//!
//! There is no link dependency: the tracer's functions (`allocview_heap_alloc`,
//! `allocview_heap_free`, `allocview_heap_name`, which C programs reach through
//! `include/allocview.h`) are looked up once with `dlsym(RTLD_DEFAULT, ...)`, and found only
//! when the tracer is loaded in the process (`allocview record` preloads it).
//!
//! ```
//! use allocview_heap::Heap;
//!
//! // A bump arena of 64 KiB that reports its blocks.
//! let heap = Heap::new("arena");
//! let mut arena = vec![0u8; 64 << 10];
//! let mut used = 0;
//! let mut blocks = Vec::new();
//! for size in [100, 200, 300] {
//!     let block = &mut arena[used..used + size];
//!     heap.alloc(block.as_ptr(), size);
//!     blocks.push(block.as_ptr() as usize);
//!     used += size;
//! }
//! heap.free(blocks[0] as *const u8);
//! // Without the tracer loaded (as in this doc test), nothing is recorded.
//! assert!(!allocview_heap::tracer_loaded());
//! ```
//!
//! Addresses are never dereferenced: any number that tells the heap's blocks apart works
//! (an offset into a device's memory), except 0, which is a failed allocation as malloc's
//! NULL is. Each heap's addresses are its own: an arena's blocks may lie inside a block
//! malloc gave. [`Heap::new`] numbers heaps from 2^31 up, apart from the numbers C code of
//! the same program picks for `allocview.h` (small ones, as a rule); [`Heap::with_id`] takes
//! a number of the program's choice (0 is malloc's and is refused).

use std::ffi::{CString, c_char, c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The next number [`Heap::new`] gives.
static NEXT_ID: AtomicU32 = AtomicU32::new(1 << 31);

type AllocFn = unsafe extern "C" fn(c_uint, *const c_void, usize);
type FreeFn = unsafe extern "C" fn(c_uint, *const c_void);
type NameFn = unsafe extern "C" fn(c_uint, *const c_char);

/// The tracer's functions, when it is loaded.
#[derive(Clone, Copy)]
struct Tracer {
    alloc: AllocFn,
    free: FreeFn,
    name: NameFn,
}

unsafe extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// `RTLD_DEFAULT`: the global scope, where a preloaded library's symbols are.
const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();

fn tracer() -> Option<Tracer> {
    static TRACER: OnceLock<Option<Tracer>> = OnceLock::new();
    *TRACER.get_or_init(|| {
        // SAFETY: dlsym with NUL-terminated names; a found symbol is the tracer's function of
        // the signature declared in `include/allocview.h`.
        unsafe {
            let alloc = dlsym(RTLD_DEFAULT, c"allocview_heap_alloc".as_ptr());
            let free = dlsym(RTLD_DEFAULT, c"allocview_heap_free".as_ptr());
            let name = dlsym(RTLD_DEFAULT, c"allocview_heap_name".as_ptr());
            if alloc.is_null() || free.is_null() || name.is_null() {
                return None;
            }
            Some(Tracer {
                alloc: std::mem::transmute::<*mut c_void, AllocFn>(alloc),
                free: std::mem::transmute::<*mut c_void, FreeFn>(free),
                name: std::mem::transmute::<*mut c_void, NameFn>(name),
            })
        }
    })
}

/// Whether allocview's tracer is loaded in this process (it may still not be recording).
#[must_use]
pub fn tracer_loaded() -> bool {
    tracer().is_some()
}

/// One of the program's heaps, as allocview names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heap {
    id: u32,
}

impl Heap {
    /// A new heap, named `name` in the trace (`--heap NAME`; at most 255 bytes kept, a name
    /// with a NUL is cut there), numbered from 2^31 up.
    #[must_use]
    pub fn new(name: &str) -> Self {
        Self::with_id(NEXT_ID.fetch_add(1, Ordering::Relaxed), name)
    }

    /// The heap numbered `id` (1 and up: 0 is malloc's, whose calls the tracer refuses; the
    /// number C code passes to `allocview.h` for the same heap), named `name`.
    #[must_use]
    pub fn with_id(id: u32, name: &str) -> Self {
        let heap = Self { id };
        heap.rename(name);
        heap
    }

    /// The heap's number.
    #[must_use]
    pub fn id(self) -> u32 {
        self.id
    }

    /// Names the heap (a later name replaces an earlier one).
    pub fn rename(self, name: &str) {
        let Some(t) = tracer() else {
            return;
        };
        let name = name.split('\0').next().unwrap_or_default();
        let Ok(name) = CString::new(name) else {
            return;
        };
        // SAFETY: the tracer's function, with a NUL-terminated string it copies at once.
        unsafe { (t.name)(self.id, name.as_ptr()) };
    }

    /// Records that the heap handed out `size` bytes at `ptr` (never dereferenced).
    #[inline]
    pub fn alloc<T>(self, ptr: *const T, size: usize) {
        if let Some(t) = tracer() {
            // SAFETY: the tracer's function; it only records the numbers.
            unsafe { (t.alloc)(self.id, ptr.cast(), size) };
        }
    }

    /// Records that the heap took back the block at `ptr` (never dereferenced).
    #[inline]
    pub fn free<T>(self, ptr: *const T) {
        if let Some(t) = tracer() {
            // SAFETY: as for `alloc`.
            unsafe { (t.free)(self.id, ptr.cast()) };
        }
    }
}
