/* The simple interposer `allocview record` is compared against (scripts/bench-record.sh only):
 * like the libtracemalloc article's, every call takes a global mutex, formats one text line
 * and write()s it to the file named by NAIVE_TRACE_OUT. Build:
 *   cc -O2 -shared -fPIC -o naive-interposer.so naive-interposer.c -ldl -pthread */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int fd = -2;
static __thread int busy;
static char boot[4096];
static size_t boot_used;

static void init(void) {
    busy = 1;
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_free = dlsym(RTLD_NEXT, "free");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    const char *out = getenv("NAIVE_TRACE_OUT");
    fd = out ? open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    busy = 0;
}

static void log_call(long size, void *p) {
    if (fd < 0 || busy) return;
    busy = 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char line[128];
    pthread_mutex_lock(&lock);
    int n = snprintf(line, sizeof line, "%ld.%06ld\t%lu\t%ld\t%p\n", (long)ts.tv_sec,
                     ts.tv_nsec / 1000, (unsigned long)pthread_self(), size, p);
    write(fd, line, (size_t)n);
    pthread_mutex_unlock(&lock);
    busy = 0;
}

void *malloc(size_t n) {
    if (!real_malloc) init();
    void *p = real_malloc(n);
    log_call((long)n, p);
    return p;
}

void free(void *p) {
    if ((char *)p >= boot && (char *)p < boot + sizeof boot) return;
    if (!real_free) init();
    log_call(-1, p);
    real_free(p);
}

void *calloc(size_t n, size_t s) {
    if (!real_calloc) {
        if (busy) { /* dlsym's own allocation while resolving */
            void *p = boot + boot_used;
            boot_used += (n * s + 15) & ~(size_t)15;
            return p;
        }
        init();
    }
    void *p = real_calloc(n, s);
    log_call((long)(n * s), p);
    return p;
}

void *realloc(void *old, size_t n) {
    if (!real_realloc) init();
    void *p = real_realloc(old, n);
    if (old) log_call(-1, old);
    log_call((long)n, p);
    return p;
}
