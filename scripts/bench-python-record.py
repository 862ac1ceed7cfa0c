#!/usr/bin/env python3
"""`allocview record` with Python frames against memray, side by side on one interpreter.

For each workload in scripts/bench-python/ (JSON and regex in two threads; object-heavy,
single-threaded), runs, interleaved, `rounds` times each: the program untraced, `allocview
record -o T -- PYTHON W`, `memray run --native -o T W`, `memray run -o T W` (Python frames
only) and `memray run --native --trace-python-allocators` (pymalloc's objects too, the same
work as allocview's), every one with the same interpreter binary and no PYTHONMALLOC; prints the best wall
time of each and the ratios, and what the frames cost per allocation (allocview's extra time
over untraced, divided by the allocations it recorded).

    python3 scripts/bench-python-record.py --allocview target/release/allocview \\
        --memray-python /tmp/memray-venv/bin/python --python /usr/bin/python3.11
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
WORKLOADS = sorted((HERE / "bench-python").glob("*.py"))


def timed(cmd, env=None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allocview", required=True)
    ap.add_argument("--python", required=True, help="the interpreter binary (not a shim)")
    ap.add_argument("--memray-python", required=True,
                    help="a venv's python with memray installed, on the same interpreter")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
    real = os.path.realpath(args.python)
    if os.path.realpath(args.memray_python) != real:
        print(f"note: {args.memray_python} resolves to {os.path.realpath(args.memray_python)}, "
              f"not {real}", file=sys.stderr)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for w in WORKLOADS:
            out = os.path.join(scratch, "out")
            runs = {
                "untraced": lambda: timed([real, str(w)], env),
                "allocview record": lambda: timed(
                    [args.allocview, "record", "-o", out + ".avt", "--", real, str(w)], env),
                "memray run --native": lambda: timed(
                    [args.memray_python, "-m", "memray", "run", "--native", "-f", "-o",
                     out + ".native.bin", str(w)], env),
                "memray run": lambda: timed(
                    [args.memray_python, "-m", "memray", "run", "-f", "-o", out + ".bin",
                     str(w)], env),
                # The same work as allocview's: pymalloc's objects recorded too.
                "memray run --native --trace-python-allocators": lambda: timed(
                    [args.memray_python, "-m", "memray", "run", "--native",
                     "--trace-python-allocators", "-f", "-o", out + ".objects.bin", str(w)], env),
            }
            best = {name: float("inf") for name in runs}
            for _ in range(args.rounds):
                for name, run in runs.items():
                    best[name] = min(best[name], run())
            stats = subprocess.run([args.allocview, "stats", out + ".avt", "--json"],
                                   check=True, capture_output=True, text=True)
            events = json.loads(stats.stdout)["mallocs"]
            extra_ns = (best["allocview record"] - best["untraced"]) * 1e9
            results[w.name] = {
                "best_s": best,
                "allocview_over_memray_native": best["allocview record"] / best["memray run --native"],
                "allocview_over_memray": best["allocview record"] / best["memray run"],
                "allocview_over_memray_objects": best["allocview record"]
                / best["memray run --native --trace-python-allocators"],
                "allocations_recorded": events,
                "ns_per_allocation": extra_ns / max(events, 1),
            }
            r = results[w.name]
            print(f"{w.name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in best.items()))
            print(f"  allocview/memray --native {r['allocview_over_memray_native']:.2f}x, "
                  f"allocview/memray {r['allocview_over_memray']:.2f}x, allocview/memray "
                  f"--native --trace-python-allocators {r['allocview_over_memray_objects']:.2f}x; "
                  f"{events:,} allocations recorded (objects view), "
                  f"{r['ns_per_allocation']:.0f} ns each over untraced")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
