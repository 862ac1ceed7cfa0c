"""The fleet job: ``compare`` and ``stats`` over every trace under a directory, on a Ray cluster,
written as Parquet.

    python -m allocview_fleet.job FLEET OUT [--address auto] [--policy glibc,bfc,...]

FLEET and OUT are directories or URIs of pyarrow's filesystems (``s3://bucket/prefix``,
``gs://...``, ``file:///...``): a worker downloads each trace behind a URI to a temporary file
and puts its part files there. Traces are listed on the driver (``*.trace``, ``*.trace.gz``,
``*.avt``, ``*.pickle``, ``*.log`` below FLEET; a ``name=value`` directory in a trace's path becomes a column, so
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
  ``events_per_second``), which are the keys of ``compare --json``'s rows; and, for the
  real-allocator rows (``real-jemalloc``, ...: the trace replayed through the library itself on
  the worker), ``peak_rss_bytes``, ``rss_at_peak_live_bytes``, ``final_rss_bytes`` and ``env``
  (null in the models' rows).

``allocview_fleet.query`` answers the fleet questions over those files with DuckDB.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

DEFAULT_POLICIES = ["glibc", "glibc:mmap_threshold=32768", "bfc", "buddy", "buddy:min_block=64",
                    "first-fit"]
SUFFIXES = (".trace", ".trace.gz", ".avt", ".pickle", ".log")
SUMMARY_COLUMNS = ["name", "peak_footprint_bytes", "final_footprint_bytes", "peak_live_bytes",
                   "peak_allocated_bytes", "fragmentation_at_peak", "mean_fragmentation",
                   "footprint_over_max_live", "ooms", "events_per_second"]
# A real-allocator row's measurements (null for the models' rows).
REAL_COLUMNS = ["peak_rss_bytes", "rss_at_peak_live_bytes", "final_rss_bytes", "env"]


def _is_uri(location: str) -> bool:
    return "://" in location


def list_traces(root: str) -> List[Dict[str, str]]:
    """Every trace below ``root`` (a directory, or a URI pyarrow's filesystems open:
    ``s3://bucket/prefix``, ``gs://...``, ``file:///...``) with its keys: ``trace`` (its name)
    and the ``name=value`` directories of its path, sorted so batches are the same from run to
    run. A trace behind a URI carries ``uri``, one on disk ``path``."""
    if _is_uri(root):
        from pyarrow import fs

        filesystem, base = fs.FileSystem.from_uri(root)
        scheme = root.split("://", 1)[0]
        infos = filesystem.get_file_info(fs.FileSelector(base, recursive=True))
        found = [(i.path[len(base):].lstrip("/"), f"{scheme}://{i.path}") for i in infos
                 if i.type == fs.FileType.File]
    else:
        base_dir = pathlib.Path(root)
        found = [(str(p.relative_to(base_dir)), str(p)) for p in base_dir.rglob("*")
                 if p.is_file()]
    out = []
    for rel, location in sorted(found):
        parts = rel.split("/")
        if not parts[-1].endswith(SUFFIXES):
            continue
        keys = dict(p.split("=", 1) for p in parts[:-1] if "=" in p)
        if len(keys) != len(parts) - 1:
            continue  # a plain directory (e.g. the generator's bases) is not part of the fleet
        where = "uri" if _is_uri(root) else "path"
        out.append({**keys, "trace": parts[-1], where: location})
    return out


def _local_copy(uri: str, directory: str) -> str:
    """The object at ``uri`` downloaded into ``directory`` (the loaders read local files)."""
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(uri)
    local = os.path.join(directory, os.path.basename(path))
    with filesystem.open_input_stream(path) as src, open(local, "wb") as dst:
        while True:
            chunk = src.read(1 << 20)
            if not chunk:
                break
            dst.write(chunk)
    return local


def split_policy(label: str):
    name, _, setting = label.partition(":")
    return name, setting


def analyse(item: Dict[str, str], policies: Sequence[str], limit: Optional[str]):
    """One trace's rows: (trace row, policy rows). Runs in a worker."""
    import allocview

    keys = {k: v for k, v in item.items() if k not in ("path", "uri")}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="allocview-fleet-") as tmp:
        path = _local_copy(item["uri"], tmp) if "uri" in item else item["path"]
        t = allocview.load(path)
        # As `compare`: a Python program's policies replay what reached the C library.
        replayed = allocview.load(path, requests="libc") if t.recorded_in_python else t
    stats = allocview.stats(t)
    # One replay at a time: the task holds one CPU of the cluster (num_cpus=1).
    cmp = allocview.compare(replayed, policies=list(policies), limit=limit, jobs=1)
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
        r.update({c: p.get(c) for c in REAL_COLUMNS})
        rows.append(r)
    return row, rows


def part_name(batch: List[Dict[str, str]]) -> str:
    """The batch's output key: the same batch always writes the same file."""
    first = json.dumps({k: v for k, v in batch[0].items() if k not in ("path", "uri")},
                       sort_keys=True)
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
    for table, data in (("traces", traces), ("policies", rows)):
        frame = pl.DataFrame(data, infer_schema_length=None)
        if _is_uri(out_dir):
            # An object store's put is atomic: the part appears whole or not at all.
            from pyarrow import fs

            filesystem, base = fs.FileSystem.from_uri(out_dir)
            filesystem.create_dir(f"{base}/{table}", recursive=True)
            buf = io.BytesIO()
            frame.write_parquet(buf)
            with filesystem.open_output_stream(f"{base}/{table}/{name}") as dst:
                dst.write(buf.getvalue())
        else:
            out = pathlib.Path(out_dir) / table
            out.mkdir(parents=True, exist_ok=True)
            tmp = out / f"{name}.tmp{os.getpid()}"
            frame.write_parquet(tmp)
            os.replace(tmp, out / name)
    return {"traces": len(traces), "rows": len(rows),
            "events": sum(int(t.get("events", 0)) for t in traces),
            "seconds": time.perf_counter() - started, "node": _node()}


def _node() -> str:
    try:
        import ray
        return ray.get_runtime_context().get_node_id()
    except Exception:  # outside Ray (a plain call in a test)
        return "local"


def run(fleet, out_dir, policies: Sequence[str] = DEFAULT_POLICIES,
        limit: Optional[str] = None, address: Optional[str] = None, batch_size: int = 4) -> dict:
    """Runs the job on the Ray cluster at ``address`` (``None``: ``RAY_ADDRESS`` or a local
    one); returns the totals and per-task timings."""
    import ray

    items = list_traces(str(fleet))
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
    p.add_argument("fleet", help="a directory, or a URI (s3://bucket/prefix, file:///...)")
    p.add_argument("out", help="a directory, or a URI")
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
