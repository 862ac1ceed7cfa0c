#!/usr/bin/env python3
"""Makes a big binary malloc trace from real ones, for benchmarks on traces larger than memory.

    scripts/make-big-trace.py --events N --out FILE [--inputs TRACE...] [--allocview BIN]

Splices copies of real traces one after the other until exactly N events are written: copy k
of a trace has its times shifted to start 1 us after copy k-1 ended and its pointers moved up
by (k mod 4096 + 1) << 44, and the allocations a copy leaves live are freed at its end, so the
result is one long-running process repeating real work. The inputs default to the real traces
in ../shared/data/traces (beside the repository) and the binary sample traces in
sample-traces/; text inputs are converted to the binary form first (in a temporary folder),
so each copy is read from compact zstd blocks.

The splicing itself is `allocview splice`, which writes the output as it reads the inputs
(memory holds one copy's live pointers, never the trace). Expect about 1.3 bytes an event on
disk: 2,000,000,000 events take about 2.6 GB. Standard library only.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_inputs():
    shared = os.path.join(os.path.dirname(REPO), "shared", "data", "traces")
    found = sorted(glob.glob(os.path.join(shared, "*.trace.gz")))
    found += sorted(glob.glob(os.path.join(REPO, "sample-traces", "*.avt")))
    return found


def find_allocview(given):
    if given:
        return given
    for profile in ("release", "debug"):
        path = os.path.join(REPO, "target", profile, "allocview")
        if os.path.exists(path):
            return path
    return shutil.which("allocview") or sys.exit(
        "allocview not found: build it (cargo build --profile bench -p allocview) or pass --allocview"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, required=True, help="events to write")
    ap.add_argument("--out", required=True, help="the binary trace to write")
    ap.add_argument("--inputs", nargs="+", help="real traces to splice (text or binary)")
    ap.add_argument("--allocview", help="the allocview binary (default: target/release, then target/debug)")
    args = ap.parse_args()
    if args.events < 1:
        sys.exit("--events must be at least 1")
    inputs = args.inputs or default_inputs()
    if not inputs:
        sys.exit("no input traces: pass --inputs, or put ../shared/data/traces beside the repository")
    allocview = find_allocview(args.allocview)
    with tempfile.TemporaryDirectory(prefix="make-big-trace-") as tmp:
        binary = []
        for i, path in enumerate(inputs):
            with open(path, "rb") as f:
                is_binary = f.read(4) == b"\x89AVT"
            if is_binary:
                binary.append(path)
                continue
            out = os.path.join(tmp, f"{i}.avt")
            subprocess.run([allocview, "convert", path, out, "--to", "binary"], check=True)
            binary.append(out)
        subprocess.run(
            [allocview, "splice", "--events", str(args.events), "--out", args.out, *binary],
            check=True,
        )


if __name__ == "__main__":
    main()
