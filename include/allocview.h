/*
 * allocview.h: report your own allocator's events to allocview (an arena, a pool, a GPU
 * memory manager), so that they appear in `allocview record`'s trace as named heaps beside
 * malloc's, with their call stacks, and every command can read them with `--heap NAME`.
 *
 * Copy this one file into your project (no library to link). Without allocview the program
 * runs as before: the three functions are weak references that the dynamic linker leaves
 * NULL unless allocview's tracer is loaded (`allocview record -- ./prog`), and the
 * ALLOCVIEW_HEAP_* macros below then do nothing but test a pointer.
 *
 *   enum { ARENA = 1 };
 *   ALLOCVIEW_HEAP_NAME(ARENA, "arena");       // once, before or after its events
 *   void *p = bump(arena, n);
 *   ALLOCVIEW_HEAP_ALLOC(ARENA, p, n);         // a block of n bytes at p
 *   ...
 *   ALLOCVIEW_HEAP_FREE(ARENA, p);             // p given back
 *
 * The tracer's functions (exported by liballocview_tracer.so):
 *
 *   void allocview_heap_alloc(unsigned int heap, const void *ptr, size_t size);
 *   void allocview_heap_free(unsigned int heap, const void *ptr);
 *   void allocview_heap_name(unsigned int heap, const char *name);
 *
 * heap  A number you choose for the heap, 1 to 4294967295 (an `unsigned int`, 32 bits on
 *       every Linux ABI). 0 is malloc's own heap: a call naming it is ignored.
 * ptr   The block's address, or any number that tells your heap's blocks apart (an offset
 *       into a device's memory works): it is never dereferenced. Each heap's addresses are
 *       its own: a block of heap 1 may lie inside a block malloc gave (its arena). NULL (0)
 *       is a failed allocation, as malloc's NULL is: number offsets from 1 (or 256).
 * size  The block's size in bytes, as asked of your allocator.
 * name  A NUL-terminated UTF-8 string, copied at once (at most 255 bytes kept); `--heap`
 *       takes it. A heap never named is `heap-N`. A later name replaces an earlier one.
 *
 * A free of an address the heap does not hold is counted as an unknown free, as malloc's
 * are; an allocation at an address the heap still holds ends the earlier block (a missed
 * free). Every call costs about what a traced malloc costs (a stack walk with stacks on).
 * The calls may be made from any thread, and from signal handlers (what a handler reports
 * while it interrupted the tracer is dropped, as malloc's calls there are).
 *
 * Dual-licensed MIT OR Apache-2.0, as allocview.
 */
#ifndef ALLOCVIEW_H
#define ALLOCVIEW_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ALLOCVIEW_WEAK __attribute__((weak))
#else
#error "allocview.h needs weak symbols (GCC or Clang)"
#endif

ALLOCVIEW_WEAK void allocview_heap_alloc(unsigned int heap, const void *ptr, size_t size);
ALLOCVIEW_WEAK void allocview_heap_free(unsigned int heap, const void *ptr);
ALLOCVIEW_WEAK void allocview_heap_name(unsigned int heap, const char *name);

/* The wrappers are macros, not functions, so that the recorded stack starts in the function
 * that used them (an inline function would still be a frame in the debug information). Each
 * evaluates its arguments only when the tracer is loaded. */

/* Whether allocview's tracer is loaded in this process (it may still not be recording). */
#define ALLOCVIEW_HEAP_AVAILABLE() (allocview_heap_alloc != NULL)

#define ALLOCVIEW_HEAP_ALLOC(heap, ptr, size)                                                  \
    do {                                                                                       \
        if (allocview_heap_alloc) allocview_heap_alloc((heap), (ptr), (size));                 \
    } while (0)
#define ALLOCVIEW_HEAP_FREE(heap, ptr)                                                         \
    do {                                                                                       \
        if (allocview_heap_free) allocview_heap_free((heap), (ptr));                           \
    } while (0)
#define ALLOCVIEW_HEAP_NAME(heap, name)                                                        \
    do {                                                                                       \
        if (allocview_heap_name) allocview_heap_name((heap), (name));                          \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* ALLOCVIEW_H */
