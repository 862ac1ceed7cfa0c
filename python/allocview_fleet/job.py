"""The fleet job: ``compare`` and ``stats`` over every trace under a directory, on a Ray cluster,
written as Parquet.

    python -m allocview_fleet.job FLEET_DIR OUT_DIR [--address auto] [--policy glibc,bfc,...]

Traces are listed on the driver (``*.trace``, ``*.trace.gz``, ``*.avt``, ``*.pickle``, ``*.log``
below FLEET_DIR; a ``name=value`` directory in a trace's path becomes a column, so
``build=a/svc.trace.gz`` has ``build`` = ``a``), cut into batches, and each batch is one Ray task
that loads each trace once, runs ``allocview.stats`` and ``allocview.compare`` on it and writes
its rows as two Parquet part files, keyed by the batch's first trace and its size, so a retried
task overwrites its own output and nothing is gathered on the driver but counts and timings:

- ``OUT_DIR/traces/part-*.parquet``: one row per trace: the keys (``trace``, the path's columns),
  ``format``, ``events``, ``max_live_bytes`` and the scalar figures of ``stats --json``
  (``peak_live_bytes``, ``final_live_bytes``, ``mallocs``, ...), ``seconds`` (the worker's time);
- ``OUT_DIR/policies/part-*.parquet``: one row per trace and policy: the keys, ``policy`` (the
  plain name), ``setting`` (the variant's parameters, ``""`` for the defaults) and the columns of
  ``report --parquet``'s ``summary.parquet`` (``name``, ``peak_footprint_bytes``,
  ``final_footprint_bytes``, ``peak_live_bytes``, ``peak_allocated_bytes``,
  ``fragmentation_at_peak``, ``mean_fragmentation``, ``footprint_over_max_live``, ``ooms``,
  ``events_per_second``), which are the keys of ``compare --json``'s rows.

``allocview_fleet.query`` answers the fleet questions over those files with DuckDB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time
from typing import Dict, List, Optional, Sequence

DEFAULT_POLICIES = ["glibc", "glibc:mmap_threshold=32768", "bfc", "buddy", "buddy:min_block=64",
                    "first-fit"]
SUFFIXES = (".trace", ".trace.gz", ".avt", ".pickle", ".log")
SUMMARY_COLUMNS = ["name", "peak_footprint_bytes", "final_footprint_bytes", "peak_live_bytes",
                   "peak_allocated_bytes", "fragmentation_at_peak", "mean_fragmentation",
                   "footprint_over_max_live", "ooms", "events_per_second"]


def list_traces(root: pathlib.Path) -> List[Dict[str, str]]:
    """Every trace below root with its keys: ``trace`` (its name) and the ``name=value``
    directories of its path, sorted so batches are the same from run to run."""
    out = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or not path.name.endswith(SUFFIXES):
            continue
        rel = path.relative_to(root)
        keys = dict(p.split("=", 1) for p in rel.parts[:-1] if "=" in p)
        if len(keys) != len(rel.parts) - 1:
            continue  # a plain directory (e.g. the generator's bases) is not part of the fleet
        out.append({**keys, "trace": rel.name, "path": str(path)})
    return out


def split_policy(label: str):
    name, _, setting = label.partition(":")
    return name, setting


def analyse(item: Dict[str, str], policies: Sequence[str], limit: Optional[str]):
    """One trace's rows: (trace row, policy rows). Runs in a worker."""
    import allocview

    keys = {k: v for k, v in item.items() if k != "path"}
    started = time.perf_counter()
    t = allocview.load(item["path"])
    stats = allocview.stats(t)
    # One replay at a time: the task holds one CPU of the cluster (num_cpus=1).
    cmp = allocview.compare(t, policies=list(policies), limit=limit, jobs=1)
    seconds = time.perf_counter() - started
    row = dict(keys)
    row.update({k: v for k, v in stats.items()
                if isinstance(v, (int, float, str, bool)) and k not in keys and k != "file"})
    row["max_live_bytes"] = cmp["max_live_bytes"]
    row["seconds"] = seconds
    rows = []
    for p in cmp["policies"]:
        policy, setting = split_policy(p["name"])
        r = dict(keys)
        r.update({"policy": policy, "setting": setting})
        r.update({c: p.get(c) for c in SUMMARY_COLUMNS})
        rows.append(r)
    return row, rows


def part_name(batch: List[Dict[str, str]]) -> str:
    """The batch's output key: the same batch always writes the same file."""
    first = json.dumps({k: v for k, v in batch[0].items() if k != "path"}, sort_keys=True)
    digest = hashlib.sha1(f"{first}|{len(batch)}".encode()).hexdigest()[:16]
    return f"part-{digest}.parquet"


def run_batch(batch: List[Dict[str, str]], policies: Sequence[str], limit: Optional[str],
              out_dir: str) -> dict:
    """A Ray task's body: analyse the batch, write its two part files, return counts."""
    import polars as pl

    started = time.perf_counter()
    traces, rows = [], []
    for item in batch:
        t_row, p_rows = analyse(item, policies, limit)
        traces.append(t_row)
        rows.extend(p_rows)
    name = part_name(batch)
    out = pathlib.Path(out_dir)
    for table, data in (("traces", traces), ("policies", rows)):
        (out / table).mkdir(parents=True, exist_ok=True)
        final = out / table / name
        tmp = final.with_suffix(f".tmp{os.getpid()}")
        pl.DataFrame(data, infer_schema_length=None).write_parquet(tmp)
        os.replace(tmp, final)
    return {"traces": len(traces), "rows": len(rows),
            "events": sum(int(t.get("events", 0)) for t in traces),
            "seconds": time.perf_counter() - started, "node": _node()}


def _node() -> str:
    try:
        import ray
        return ray.get_runtime_context().get_node_id()
    except Exception:  # outside Ray (a plain call in a test)
        return "local"


def run(fleet: pathlib.Path, out_dir: pathlib.Path, policies: Sequence[str] = DEFAULT_POLICIES,
        limit: Optional[str] = None, address: Optional[str] = None, batch_size: int = 4) -> dict:
    """Runs the job on the Ray cluster at ``address`` (``None``: ``RAY_ADDRESS`` or a local
    one); returns the totals and per-task timings."""
    import ray

    items = list_traces(fleet)
    if not items:
        raise SystemExit(f"no traces under {fleet}")
    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(num_cpus=1, max_retries=2)(run_batch)
    started = time.perf_counter()
    results = ray.get([task.remote(b, list(policies), limit, str(out_dir)) for b in batches])
    wall = time.perf_counter() - started
    busy = sum(r["seconds"] for r in results)
    return {
        "traces": sum(r["traces"] for r in results),
        "policy_rows": sum(r["rows"] for r in results),
        "events": sum(r["events"] for r in results),
        "tasks": len(results),
        "nodes": len({r["node"] for r in results}),
        "wall_seconds": wall,
        "worker_seconds": busy,
        "traces_per_worker_second": sum(r["traces"] for r in results) / busy if busy else 0.0,
        "events_per_worker_second": sum(r["events"] for r in results) / busy if busy else 0.0,
    }


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("fleet", type=pathlib.Path)
    p.add_argument("out", type=pathlib.Path)
    p.add_argument("--address", help="the Ray cluster (default: RAY_ADDRESS, else local)")
    p.add_argument("--policy", default=",".join(DEFAULT_POLICIES))
    p.add_argument("--limit", help="memory limit for every policy, e.g. 512MiB")
    p.add_argument("--batch-size", type=int, default=4)
    a = p.parse_args(argv)
    totals = run(a.fleet, a.out, a.policy.split(","), a.limit, a.address, a.batch_size)
    print(json.dumps(totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
