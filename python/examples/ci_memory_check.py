"""A CI memory check in Python: fail the build when a run's memory passes a budget.

Record the test run (``allocview record -o run.avt -- ./my_tests``), then:

    python ci_memory_check.py run.avt --max-peak-live 200MiB \\
        --policy glibc --max-footprint 256MiB --baseline main.avt --max-growth 5

checks the peak of live bytes, the footprint the allocator policy would need for the same
allocations (``compare``), and the growth of the peak against a baseline run; prints one line
per check and exits 1 when any fails (0 otherwise), so any CI system can run it.
"""

import argparse
import sys

import allocview


def check(trace, max_peak_live=None, policy="glibc", max_footprint=None, baseline=None,
          max_growth_percent=None):
    """The checks' results: (name, measured, limit, passed) tuples."""
    results = []
    t = allocview.load(trace)
    peak_live = allocview.stats(t)["peak_live_bytes"]
    if max_peak_live is not None:
        limit = allocview.parse_bytes(str(max_peak_live))
        results.append(("peak live bytes", peak_live, limit, peak_live <= limit))
    if max_footprint is not None:
        limit = allocview.parse_bytes(str(max_footprint))
        row = allocview.compare(t, policies=[policy])["policies"][0]
        footprint = row["peak_footprint_bytes"]
        results.append((f"{policy} peak footprint", footprint, limit, footprint <= limit))
    if baseline is not None and max_growth_percent is not None:
        before = allocview.stats(baseline)["peak_live_bytes"]
        allowed = before * (1 + max_growth_percent / 100)
        results.append((f"peak live vs {baseline}", peak_live, int(allowed),
                        peak_live <= allowed))
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--max-peak-live", help="e.g. 200MiB")
    p.add_argument("--policy", default="glibc", help="allocator policy to replay (compare)")
    p.add_argument("--max-footprint", help="the policy's peak footprint budget, e.g. 256MiB")
    p.add_argument("--baseline", help="an earlier run's trace")
    p.add_argument("--max-growth", type=float, help="allowed peak growth over it, in percent")
    a = p.parse_args(argv)
    results = check(a.trace, a.max_peak_live, a.policy, a.max_footprint, a.baseline,
                    a.max_growth)
    for name, measured, limit, ok in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {measured:,} B (limit {limit:,} B)")
    return 0 if all(ok for *_, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
