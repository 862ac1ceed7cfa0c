/* A heap named before a fork: the child's trace knows its name too (10 blocks of 50 bytes
 * allocated by the child, 1 of 100 by the parent). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "allocview.h"
int main(void) {
    static char pool[1 << 16];
    ALLOCVIEW_HEAP_NAME(5, "pool");
    ALLOCVIEW_HEAP_ALLOC(5, pool, 100);
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 1; i <= 10; i++) ALLOCVIEW_HEAP_ALLOC(5, pool + 128 * i, 50);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    printf("done\n");
    return 0;
}
