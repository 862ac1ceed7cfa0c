//! Python's allocators, wrapped: each request the program makes of `PyMem_*` and
//! `PyObject_*` (the `MEM` and `OBJ` domains, served by pymalloc) is recorded as an
//! allocation of its own, tagged [`TAG_OBJECT`], with its stack; what the wrapped allocator
//! asks of the C library meanwhile is recorded by the ordinary wrappers, tagged
//! [`TAG_BACKING`]; the arenas pymalloc maps (`PyObject_SetArenaAllocator`) are recorded as
//! allocations tagged [`TAG_ARENA`]. The `RAW` domain calls `malloc` directly and is
//! recorded as the program's own C library calls.
//!
//! A request is recorded after the wrapped call returns (an allocation) or before it is
//! made (a free: the address may be handed out again by another thread as soon as it is
//! freed), like the C library's. A realloc is recorded as the free of the old block before
//! the call and the allocation of the new one after; when it fails, the old block, which
//! stays, is recorded as allocated again, with the size asked for (its own is not known).

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

use super::{API, TAG_ARENA, TAG_BACKING, TAG_OBJECT};
use crate::{
    CALL_CALLOC, CALL_FREE, CALL_MALLOC, CALL_REALLOC, OP_FREE, multi_thread, now_word,
    record_alloc, record_alloc_with_stack, record_fast, record_slow, stacks_on, tick_of, tls,
};

type Ctx = *mut c_void;

/// CPython's `PyMemAllocatorEx`.
#[repr(C)]
struct MemAllocator {
    ctx: Ctx,
    malloc: Option<unsafe extern "C" fn(Ctx, usize) -> *mut c_void>,
    calloc: Option<unsafe extern "C" fn(Ctx, usize, usize) -> *mut c_void>,
    realloc: Option<unsafe extern "C" fn(Ctx, *mut c_void, usize) -> *mut c_void>,
    free: Option<unsafe extern "C" fn(Ctx, *mut c_void)>,
}

/// CPython's `PyObjectArenaAllocator`.
#[repr(C)]
struct ArenaAllocator {
    ctx: Ctx,
    alloc: Option<unsafe extern "C" fn(Ctx, usize) -> *mut c_void>,
    free: Option<unsafe extern "C" fn(Ctx, *mut c_void, usize)>,
}

const DOMAIN_MEM: i32 = 1;
const DOMAIN_OBJ: i32 = 2;

/// The wrapped allocators, written once by [`wrap`] before the wrappers are installed.
struct Wrapped(UnsafeCell<[MemAllocator; 2]>, UnsafeCell<ArenaAllocator>);
// SAFETY: written once, under the GIL, before any wrapper that reads it can run.
unsafe impl Sync for Wrapped {}

const EMPTY: MemAllocator = MemAllocator {
    ctx: null_mut(),
    malloc: None,
    calloc: None,
    realloc: None,
    free: None,
};

static WRAPPED: Wrapped = Wrapped(
    UnsafeCell::new([EMPTY, EMPTY]),
    UnsafeCell::new(ArenaAllocator {
        ctx: null_mut(),
        alloc: None,
        free: None,
    }),
);

/// Installs the wrappers (once, with the GIL held).
pub(super) unsafe fn wrap() {
    type GetMem = unsafe extern "C" fn(i32, *mut MemAllocator);
    type SetMem = unsafe extern "C" fn(i32, *const MemAllocator);
    type GetArena = unsafe extern "C" fn(*mut ArenaAllocator);
    type SetArena = unsafe extern "C" fn(*const ArenaAllocator);
    // SAFETY: dlsym's addresses of these very functions; the structures are CPython's; the
    // GIL is held, so no allocation runs through the domains while they change.
    unsafe {
        let get_mem = std::mem::transmute::<usize, GetMem>(API.mem_get.load(Ordering::Acquire));
        let set_mem = std::mem::transmute::<usize, SetMem>(API.mem_set.load(Ordering::Acquire));
        let get_arena =
            std::mem::transmute::<usize, GetArena>(API.arena_get.load(Ordering::Acquire));
        let set_arena =
            std::mem::transmute::<usize, SetArena>(API.arena_set.load(Ordering::Acquire));
        let wrapped = &mut *WRAPPED.0.get();
        for (slot, domain) in wrapped.iter_mut().zip([DOMAIN_MEM, DOMAIN_OBJ]) {
            get_mem(domain, slot);
            let ours = MemAllocator {
                ctx: std::ptr::from_mut(slot).cast(),
                malloc: Some(py_malloc),
                calloc: Some(py_calloc),
                realloc: Some(py_realloc),
                free: Some(py_free),
            };
            set_mem(domain, &ours);
        }
        let arena = &mut *WRAPPED.1.get();
        get_arena(arena);
        let ours = ArenaAllocator {
            ctx: std::ptr::from_mut(arena).cast(),
            alloc: Some(arena_alloc),
            free: Some(arena_free),
        };
        set_arena(&ours);
    }
}

/// Puts the wrapped allocators back (in-process tracking's stop, with the GIL held). Blocks
/// allocated through the wrappers are freed by the wrapped allocator that served them.
pub(super) unsafe fn unwrap() {
    type SetMem = unsafe extern "C" fn(i32, *const MemAllocator);
    type SetArena = unsafe extern "C" fn(*const ArenaAllocator);
    // SAFETY: as in `wrap`; the entries hold what `wrap` read.
    unsafe {
        let set_mem = std::mem::transmute::<usize, SetMem>(API.mem_set.load(Ordering::Acquire));
        let set_arena =
            std::mem::transmute::<usize, SetArena>(API.arena_set.load(Ordering::Acquire));
        let wrapped = &*WRAPPED.0.get();
        for (slot, domain) in wrapped.iter().zip([DOMAIN_MEM, DOMAIN_OBJ]) {
            set_mem(domain, slot);
        }
        set_arena(WRAPPED.1.get());
    }
}

/// Runs `f` with the calling thread's events tagged `tag`.
#[inline(always)]
fn tagged<R>(tag: u64, f: impl FnOnce() -> R) -> R {
    match tls() {
        Some(t) => {
            let old = t.addr_tag.replace(tag);
            let r = f();
            t.addr_tag.set(old);
            r
        }
        None => f(),
    }
}

fn record_allocation(call: u8, size: usize, p: *mut c_void) -> *mut c_void {
    if stacks_on() {
        record_alloc_with_stack(call, size, p)
    } else {
        record_alloc(call, size, p, now_word())
    }
}

fn record_free(call: u8, p: *mut c_void) {
    let word = now_word();
    let op = call | OP_FREE;
    if multi_thread() || !record_fast(op, 0, p as u64, tick_of(word), None) {
        record_slow(op, 0, p as u64, word, None);
    }
}

/// The wrapped allocator behind `ctx`.
fn wrapped(ctx: Ctx) -> &'static MemAllocator {
    // SAFETY: `ctx` is the address of one of WRAPPED's entries, as `wrap` set it.
    unsafe { &*ctx.cast::<MemAllocator>() }
}

unsafe extern "C" fn py_malloc(ctx: Ctx, size: usize) -> *mut c_void {
    let w = wrapped(ctx);
    let Some(f) = w.malloc else {
        return null_mut();
    };
    // SAFETY: the wrapped allocator's own function and context.
    let p = tagged(TAG_BACKING, || unsafe { f(w.ctx, size) });
    tagged(TAG_OBJECT, || record_allocation(CALL_MALLOC, size, p))
}

unsafe extern "C" fn py_calloc(ctx: Ctx, n: usize, size: usize) -> *mut c_void {
    let w = wrapped(ctx);
    let Some(f) = w.calloc else {
        return null_mut();
    };
    // SAFETY: as in `py_malloc`.
    let p = tagged(TAG_BACKING, || unsafe { f(w.ctx, n, size) });
    tagged(TAG_OBJECT, || {
        record_allocation(CALL_CALLOC, n.saturating_mul(size), p)
    })
}

unsafe extern "C" fn py_realloc(ctx: Ctx, old: *mut c_void, size: usize) -> *mut c_void {
    let w = wrapped(ctx);
    let Some(f) = w.realloc else {
        return null_mut();
    };
    if !old.is_null() {
        tagged(TAG_OBJECT, || record_free(CALL_REALLOC, old));
    }
    // SAFETY: as in `py_malloc`.
    let new = tagged(TAG_BACKING, || unsafe { f(w.ctx, old, size) });
    // Python's allocators never free on a size of 0: a null result is a failure.
    let p = if new.is_null() { old } else { new };
    if !p.is_null() {
        tagged(TAG_OBJECT, || record_allocation(CALL_REALLOC, size, p));
    }
    new
}

unsafe extern "C" fn py_free(ctx: Ctx, p: *mut c_void) {
    let w = wrapped(ctx);
    let Some(f) = w.free else {
        return;
    };
    if !p.is_null() {
        tagged(TAG_OBJECT, || record_free(CALL_FREE, p));
    }
    // SAFETY: as in `py_malloc`.
    tagged(TAG_BACKING, || unsafe { f(w.ctx, p) });
}

unsafe extern "C" fn arena_alloc(ctx: Ctx, size: usize) -> *mut c_void {
    // SAFETY: `ctx` is WRAPPED's arena entry, as `wrap` set it.
    let w = unsafe { &*ctx.cast::<ArenaAllocator>() };
    let Some(f) = w.alloc else {
        return null_mut();
    };
    // SAFETY: the wrapped arena allocator's own function and context; its mapping is the
    // allocator's, recorded as the arena, not as a mapping of the program's.
    let p = crate::mappings::as_allocator(|| unsafe { f(w.ctx, size) });
    tagged(TAG_ARENA, || record_allocation(CALL_MALLOC, size, p))
}

unsafe extern "C" fn arena_free(ctx: Ctx, p: *mut c_void, size: usize) {
    // SAFETY: as in `arena_alloc`.
    let w = unsafe { &*ctx.cast::<ArenaAllocator>() };
    let Some(f) = w.free else {
        return;
    };
    tagged(TAG_ARENA, || record_free(CALL_FREE, p));
    // SAFETY: as in `arena_alloc`.
    crate::mappings::as_allocator(|| unsafe { f(w.ctx, p, size) });
}
