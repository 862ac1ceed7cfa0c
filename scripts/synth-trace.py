#!/usr/bin/env python3
"""Synthesise a large, realistic malloc trace by splicing copies of a real one.

Each copy is shifted in time (so times keep increasing) and in address space (so copies never
share pointers), which keeps every copy's allocation pattern exactly as the real program made it.
Used for load and seek benchmarks beyond the sizes of the shared traces.

usage: synth-trace.py REAL.trace.gz COPIES OUT.trace.gz
"""
import gzip
import sys


def main() -> None:
    src, copies, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with gzip.open(src, "rt") as f:
        lines = [l.rstrip("\n").split("\t") for l in f if l.strip()]
    last_t = max(float(l[0]) for l in lines)
    with gzip.open(out, "wt", compresslevel=6) as w:
        for c in range(copies):
            dt = c * (last_t + 0.001)
            base = c << 40
            buf = []
            for t, tid, size, ptr in (l[:4] for l in lines):
                if ptr != "(nil)":
                    ptr = "0x%x" % (int(ptr, 16) + base)
                buf.append("%.6f\t%s\t%s\t%s\n" % (float(t) + dt, tid, size, ptr))
            w.write("".join(buf))


if __name__ == "__main__":
    main()
