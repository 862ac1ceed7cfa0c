/* A bump arena and a pool of device offsets that report their blocks to allocview through
 * allocview.h, beside some malloc traffic of the program's own. Built with -DNO_REPORTS, the
 * same program reports nothing (its malloc traffic is the same). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef NO_REPORTS
#define ALLOCVIEW_HEAP_ALLOC(h, p, n) ((void)0)
#define ALLOCVIEW_HEAP_FREE(h, p) ((void)0)
#define ALLOCVIEW_HEAP_NAME(h, n) ((void)0)
#define ALLOCVIEW_HEAP_AVAILABLE() 0
#else
#include "allocview.h"
#endif

enum { ARENA_HEAP = 7, POOL_HEAP = 8 };

struct arena { char *base; size_t used, cap; };

__attribute__((noinline)) static void *arena_alloc(struct arena *a, size_t n) {
    size_t at = (a->used + 15) & ~(size_t)15;
    if (at + n > a->cap) return NULL;
    a->used = at + n;
    void *p = a->base + at;
    ALLOCVIEW_HEAP_ALLOC(ARENA_HEAP, p, n);
    return p;
}

__attribute__((noinline)) static void arena_release(void *p) {
    ALLOCVIEW_HEAP_FREE(ARENA_HEAP, p);
}

/* A pool handing out offsets into a device's memory (from 256: 0 would be a failed
 * allocation, as malloc's NULL): numbers, not pointers. */
static void *pool_thread(void *arg) {
    (void)arg;
    for (unsigned long i = 1; i <= 200; i++) ALLOCVIEW_HEAP_ALLOC(POOL_HEAP, (void *)(i * 256), 256);
    for (unsigned long i = 1; i <= 200; i++) ALLOCVIEW_HEAP_FREE(POOL_HEAP, (void *)(i * 256));
    return NULL;
}

int main(void) {
    struct arena a = { malloc(8u << 20), 0, 8u << 20 };
    ALLOCVIEW_HEAP_NAME(ARENA_HEAP, "arena");
    ALLOCVIEW_HEAP_NAME(POOL_HEAP, "device pool");
    pthread_t t;
    pthread_create(&t, NULL, pool_thread, NULL);
    static void *blocks[1000];
    unsigned long sum = 0;
    for (int i = 0; i < 1000; i++) {
        blocks[i] = arena_alloc(&a, 4096 + i);
        memset(blocks[i], i & 0xff, 4096 + i);
        sum += ((unsigned char *)blocks[i])[0];
    }
    for (int i = 0; i < 1000; i += 3) arena_release(blocks[i]);
    pthread_join(t, NULL);
    for (int i = 0; i < 10; i++) {
        void *volatile p = malloc(100 + i);
        free(p);
    }
    printf("sum=%lu reporting=%d\n", sum, ALLOCVIEW_HEAP_AVAILABLE() ? 1 : 0);
    fflush(stdout);
    free(a.base);
    return 0;
}
