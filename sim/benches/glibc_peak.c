/*
 * glibc_peak: the real glibc's peak footprint for a malloc trace, the reference that the `glibc`
 * policy is tested against (sim/tests/glibc_real.rs).
 *
 *   cc -O2 -o /tmp/glibc_peak sim/benches/glibc_peak.c
 *   zcat ../shared/data/traces/git_log_p_gitui.trace.gz | /tmp/glibc_peak
 *
 * Reads a libtracemalloc text trace (<sec>.<usec> TAB <tid> TAB <size or -1> TAB <ptr or (nil)>)
 * from stdin and replays it on one thread, in file order, through malloc/free: a malloc of a
 * pointer that is still live frees it first (a realloc written as a malloc), frees of NULL or of
 * unknown pointers and failed mallocs are skipped. After every replayed call it reads mallinfo2
 * and keeps the maximum of arena (sbrk'd heap) + hblkhd (mmapped chunks).
 *
 * The harness must not disturb malloc's state: a large buffer malloc'ed and freed before the
 * replay would be mmapped and, once freed, raise the dynamic mmap threshold, changing the result
 * (reference/glibc-model.md). So every buffer here (input, pointer table) comes from mmap, and
 * nothing is printed through stdio until the replay is over.
 *
 * Figures on Debian 12 (glibc 2.36-9+deb12u14), peak bytes: find_usr_include 393,216;
 * xz_T2_8KiB_blocks 195,395,584; git_log_p_gitui 60,997,632; python311_json_re_sqlite 30,707,712.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Open addressing, linear probing: trace pointer -> replayed pointer. Sized for 8M live blocks;
 * only the touched pages are ever backed by memory. */
#define SLOTS (1u << 24)
#define TOMBSTONE UINT64_MAX
struct slot { uint64_t key; void *ptr; };
static struct slot *table;

static uint64_t hash(uint64_t k) { k *= 0x9e3779b97f4a7c15ull; return k ^ (k >> 29); }

static struct slot *find(uint64_t key) {
    for (uint64_t i = hash(key) & (SLOTS - 1);; i = (i + 1) & (SLOTS - 1)) {
        if (table[i].key == key) return &table[i];
        if (table[i].key == 0) return NULL;
    }
}

static int insert(uint64_t key, void *ptr) {
    for (uint64_t n = 0, i = hash(key) & (SLOTS - 1); n < SLOTS; n++, i = (i + 1) & (SLOTS - 1)) {
        if (table[i].key == 0 || table[i].key == TOMBSTONE) {
            table[i].key = key;
            table[i].ptr = ptr;
            return 0;
        }
    }
    return -1;
}

static size_t peak, peak_heap, peak_mmapped, calls;

static void sample(void) {
    struct mallinfo2 mi = mallinfo2();
    calls++;
    if (mi.arena + mi.hblkhd > peak) {
        peak = mi.arena + mi.hblkhd;
        peak_heap = mi.arena;
        peak_mmapped = mi.hblkhd;
    }
}

/* One trace line (NUL-terminated, no newline). Returns -1 on a malformed line. */
static int replay_line(char *line) {
    char *size_col = strchr(line, '\t');
    if (!size_col) return -1;
    size_col = strchr(size_col + 1, '\t');
    if (!size_col) return -1;
    size_col++;
    char *ptr_col = strchr(size_col, '\t');
    if (!ptr_col) return -1;
    ptr_col++;
    int is_free = size_col[0] == '-';
    unsigned long long size = is_free ? 0 : strtoull(size_col, NULL, 10);
    uint64_t key = ptr_col[0] == '(' ? 0 : strtoull(ptr_col, NULL, 16);
    if (key == 0) return 0; /* free(NULL) or a failed malloc */
    struct slot *s = find(key);
    if (s) {
        free(s->ptr);
        s->key = TOMBSTONE;
        sample();
    }
    if (!is_free) {
        if (insert(key, malloc(size)) != 0) return -1;
        sample();
    }
    return 0;
}

int main(void) {
    table = mmap(NULL, (size_t)SLOTS * sizeof *table, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    const size_t cap = 1 << 20;
    char *buf = mmap(NULL, cap + 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (table == MAP_FAILED || buf == MAP_FAILED) return 2;
    size_t have = 0, bad = 0;
    for (;;) {
        ssize_t got = read(0, buf + have, cap - have);
        if (got < 0) return 3;
        have += (size_t)got;
        size_t start = 0;
        for (size_t i = 0; i < have; i++) {
            if (buf[i] != '\n') continue;
            buf[i] = 0;
            if (replay_line(buf + start) != 0) bad++;
            start = i + 1;
        }
        if (got == 0) {
            if (start < have) {
                buf[have] = 0;
                if (replay_line(buf + start) != 0) bad++;
            }
            break;
        }
        if (start == 0 && have == cap) return 4; /* a line longer than the buffer */
        memmove(buf, buf + start, have - start);
        have -= start;
    }
    char out[256];
    int len = snprintf(out, sizeof out,
                       "peak %zu B (heap %zu + mmapped %zu) over %zu calls, %zu bad lines\n",
                       peak, peak_heap, peak_mmapped, calls, bad);
    if (write(1, out, (size_t)len) != len) return 5;
    return 0;
}
