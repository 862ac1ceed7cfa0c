"""Allocation-heavy multi-threaded Python for scripts/bench-stacks.sh (run it with
PYTHONMALLOC=malloc so that every object allocation goes through malloc)."""
import sys
import threading


def leaf(i):
    return {"k": [i] * 8, "s": str(i) * 3, "t": (i, i + 1)}


def middle(n):
    out = []
    for i in range(n):
        out.append(leaf(i))
        if len(out) > 500:
            out = []
    return len(out)


def work(n):
    return middle(n)


n = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 4
ts = [threading.Thread(target=work, args=(n,)) for _ in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
