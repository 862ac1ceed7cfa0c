/*
 * libc_replay: replays a trace's allocation calls through the C library's malloc/free and
 * prints the rate, for `allocview bench replay` (which writes the input and compiles this file
 * with `cc -O2` at run time, so the comparison runs in one go on one machine).
 *
 * Input (little-endian): u64 events, u64 allocations, then kind[events] (u8: 0 alloc, 1 free,
 * other codes are no-ops), id[events] (u32), size[events] (u64).
 * Output: one line, "<events> <seconds>", for the replay loop alone.
 *
 * Buffers come from mmap so the harness does not disturb malloc's state before the replay.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) { fputs("usage: libc_replay ARRAYS\n", stderr); return 2; }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror(argv[1]); return 1; }
    struct stat st;
    if (fstat(fd, &st) != 0) { perror("fstat"); return 1; }
    const uint8_t *base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) { perror("mmap"); return 1; }
    uint64_t n, allocs;
    memcpy(&n, base, 8);
    memcpy(&allocs, base + 8, 8);
    if ((uint64_t)st.st_size != 16 + n * 13) { fputs("bad input size\n", stderr); return 1; }
    const uint8_t *kind = base + 16;
    const uint32_t *id = (const uint32_t *)(kind + n);
    const uint64_t *size = (const uint64_t *)((const uint8_t *)id + 4 * n);
    void **ptrs = mmap(NULL, (allocs + 1) * sizeof(void *), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (ptrs == MAP_FAILED) { perror("mmap"); return 1; }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (uint64_t i = 0; i < n; i++) {
        if (kind[i] == 0) {
            void *p = malloc(size[i] ? size[i] : 1);
            /* Touch nothing: the policies do not touch memory either. */
            ptrs[id[i]] = p;
        } else if (kind[i] == 1) {
            free(ptrs[id[i]]);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    printf("%llu %.9f\n", (unsigned long long)n, s);
    return 0;
}
