/* A workload that does nothing but allocate, for scripts/bench-record.sh.
 *
 *   alloc-workload MODE N [THREADS]
 *
 * MODE "pairs": N times malloc(16) then free (the allocator's fastest path: every call is a
 * tcache hit, so any per-call tracing cost shows in full).
 * MODE "mixed": N times free a random one of 4096 slots and malloc a random size of 8..1031
 * bytes into it (a steady live set with size churn, closer to real programs).
 * THREADS (default 1) runs that many threads, each doing N iterations. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long iters;
static int mixed;

static void *run(void *arg) {
    unsigned x = (unsigned)(size_t)arg * 2654435761u + 1;
    if (!mixed) {
        for (long i = 0; i < iters; i++) {
            void *p = malloc(16);
            __asm__ volatile("" : : "r"(p) : "memory");
            free(p);
        }
        return NULL;
    }
    void **slots = calloc(4096, sizeof(void *));
    for (long i = 0; i < iters; i++) {
        x = x * 1103515245u + 12345u;
        unsigned k = (x >> 8) & 4095;
        free(slots[k]);
        slots[k] = malloc(((x >> 20) & 1023) + 8);
    }
    for (int k = 0; k < 4096; k++) free(slots[k]);
    free(slots);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s pairs|mixed N [THREADS]\n", argv[0]);
        return 2;
    }
    mixed = strcmp(argv[1], "mixed") == 0;
    iters = atol(argv[2]);
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    if (threads <= 1) {
        run(NULL);
        return 0;
    }
    pthread_t *t = calloc((size_t)threads, sizeof(pthread_t));
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, run, (void *)(size_t)(i + 1));
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    free(t);
    return 0;
}
