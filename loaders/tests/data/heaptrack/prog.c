#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) void *make_block(size_t n) { void *p = malloc(n); memset(p, 1, n); return p; }
__attribute__((noinline)) void *make_table(size_t n) { return calloc(n, 8); }
int main(void) {
    void *keep[10];
    for (int i = 0; i < 10; i++) keep[i] = make_block(1000);
    for (int i = 0; i < 5; i++) free(keep[i]);
    void *t = make_table(100);
    free(t);
    void *leak = make_table(3);
    (void)leak;
    return 0;
}
