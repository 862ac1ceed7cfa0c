/*
 * real_rss: the test's own measurement of an allocator's peak resident memory on a malloc
 * trace, to check allocview's real-allocator rows against (app/tests/real_rows.rs). It shares
 * no code with allocview: it parses the libtracemalloc text trace itself, replays it with its
 * own pointer table, and reads its anonymous resident memory after every call instead of sampling.
 *
 *   cc -O2 -o /tmp/real_rss app/tests/real_rss.c
 *   zcat sample-traces/find_usr_include.trace.gz | LD_PRELOAD=libjemalloc.so.2 /tmp/real_rss
 *
 * Reads the trace (<sec>.<usec> TAB <tid> TAB <size or -1> TAB <ptr or (nil)>) from stdin into an
 * mmap'ed buffer, maps and writes its pointer table, then reads RssAnon (the baseline) and
 * replays every line on one thread, in file order: a malloc of a pointer still live frees it
 * first (a realloc written as a free and a malloc), frees of NULL or of unknown pointers and
 * failed mallocs are skipped, and every page of each allocation is written once when it is
 * allocated. After every line it reads RssAnon again (anonymous memory: the library's code
 * pages that its first calls bring in are not counted). Prints "peak_above_baseline_bytes
 * final_above_baseline_bytes". Every buffer of its own comes from mmap, so the allocator under
 * test serves only the replayed calls (and stdio's, after the last).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

struct slot { uint64_t key; void *ptr; };
static struct slot *table;
static uint64_t mask;
#define TOMBSTONE UINT64_MAX

static uint64_t hash(uint64_t k) { k *= 0x9e3779b97f4a7c15ull; return k ^ (k >> 29); }

static struct slot *find(uint64_t key) {
    for (uint64_t i = hash(key) & mask;; i = (i + 1) & mask) {
        if (table[i].key == key) return &table[i];
        if (table[i].key == 0) return NULL;
    }
}

static void insert(uint64_t key, void *ptr) {
    for (uint64_t i = hash(key) & mask;; i = (i + 1) & mask) {
        if (table[i].key == 0 || table[i].key == TOMBSTONE) {
            table[i].key = key;
            table[i].ptr = ptr;
            return;
        }
    }
}

static void *map(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { _exit(3); }
    return p;
}

/* A field of /proc/self/status, in bytes, read with no stdio and no malloc. */
static uint64_t status_kb(const char *name) {
    static char buf[8192];
    int fd = open("/proc/self/status", 0);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *at = strstr(buf, name);
    if (!at) return 0;
    at += strlen(name);
    while (*at == ' ' || *at == '\t' || *at == ':') at++;
    return strtoull(at, NULL, 10) * 1024;
}

int main(void) {
    size_t cap = 1u << 30, len = 0;
    char *in = map(cap);
    ssize_t n;
    while ((n = read(0, in + len, cap - len - 1)) > 0) len += (size_t)n;
    in[len] = 0;
    uint64_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += in[i] == '\n';
    uint64_t slots = 1024;
    while (slots < 2 * lines) slots <<= 1;
    mask = slots - 1;
    table = map(slots * sizeof *table);
    memset(table, 0, slots * sizeof *table);
    /* The allocator starts (its first call sets it up) before the baseline, as in the rows'
     * replay process, whose runtime allocates before its baseline. */
    free(malloc(1));
    uint64_t baseline = status_kb("RssAnon"), peak = baseline;
    for (char *p = in; *p;) {
        char *end = strchr(p, '\n');
        if (!end) end = p + strlen(p);
        char *tab1 = memchr(p, '\t', (size_t)(end - p));
        char *tab2 = tab1 ? memchr(tab1 + 1, '\t', (size_t)(end - tab1 - 1)) : NULL;
        char *tab3 = tab2 ? memchr(tab2 + 1, '\t', (size_t)(end - tab2 - 1)) : NULL;
        if (tab3) {
            long long size = strtoll(tab2 + 1, NULL, 10);
            uint64_t key = strtoull(tab3 + 1, NULL, 16);
            if (size < 0) {
                struct slot *s = key ? find(key) : NULL;
                if (s) { free(s->ptr); s->key = TOMBSTONE; }
            } else if (key) {
                struct slot *s = find(key);
                if (s) { free(s->ptr); s->key = TOMBSTONE; }
                char *q = malloc((size_t)size);
                if (q) {
                    for (long long off = 0; off < size; off += 4096) ((volatile char *)q)[off] = 1;
                    if (size > 0) ((volatile char *)q)[size - 1] = 1;
                    insert(key, q);
                }
            }
        }
        p = *end ? end + 1 : end;
        uint64_t now = status_kb("RssAnon");
        if (now > peak) peak = now;
    }
    uint64_t now = status_kb("RssAnon");
    printf("%llu %llu\n", (unsigned long long)(peak - baseline),
           (unsigned long long)(now > baseline ? now - baseline : 0));
    return 0;
}
