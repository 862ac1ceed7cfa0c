/* A program that fires the OpenTelemetry eBPF profiler's memory USDT probes
 * (otel_memory:alloc(user, size, weight), otel_memory:free(ptr)) with a semaphore, as its
 * sampler would: 300 blocks of 64 * (i + 1) bytes, the first 100 freed. errno set before a
 * probe is what it finds after (the tracer's trap handler must keep it). */
#define _SDT_HAS_SEMAPHORES 1
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

unsigned short otel_memory_alloc_semaphore __attribute__((unused, section(".probes")));
unsigned short otel_memory_free_semaphore __attribute__((unused, section(".probes")));

static int errno_lost;

__attribute__((noinline)) static void *sampled_alloc(size_t n) {
    void *p = malloc(n);
    if (otel_memory_alloc_semaphore) {
        unsigned long weight = n;
        errno = 4242;
        DTRACE_PROBE3(otel_memory, alloc, p, n, weight);
        errno_lost += errno != 4242;
    }
    return p;
}

__attribute__((noinline)) static void sampled_free(void *p) {
    if (otel_memory_free_semaphore) DTRACE_PROBE1(otel_memory, free, p);
    free(p);
}

int main(void) {
    static void *blocks[300];
    for (int i = 0; i < 300; i++) blocks[i] = sampled_alloc(64 * (size_t)(i + 1));
    for (int i = 0; i < 100; i++) sampled_free(blocks[i]);
    printf("probes enabled=%d errno lost=%d\n", otel_memory_alloc_semaphore != 0, errno_lost);
    fflush(stdout);
    return 0;
}
