"""Makes a fleet of traces for the fleet job to chew on, from real traces.

    python -m allocview_fleet.generate OUT_DIR --shared ../shared/data/traces \\
        --samples sample-traces --allocview target/debug/allocview

writes ``OUT_DIR/build=a/`` and ``OUT_DIR/build=b/`` (two builds of the same services, hive
style, so the build is a column) and ``OUT_DIR/manifest.json``, which says what each trace is
made from:

- bases: the small real traces whole, and windows of the large ones (a run of their lines, with
  the frees of blocks allocated before the window left out, so each window is a trace of its
  own);
- variants of each base: every time shifted by an offset and every address by a multiple of
  1 MiB (block alignment kept), so the replays' results are those of the base; the same
  variants in both builds, except that in build ``b`` some carry a leak: one more allocation of
  a known size at the first instant, never freed, which raises the peak of live bytes by exactly
  that size (the query for "traces whose peak grew" must find exactly those);
- recordings: small programs run under ``allocview record`` (binary traces), in both builds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import subprocess
import sys
from typing import Dict, List, Optional

MIB = 1 << 20

# Small programs recorded at generation time (each under `allocview record`).
PROGRAMS = {
    "rec_python_dicts": [sys.executable, "-c",
                         "d=[{i: str(i)*k for i in range(2000)} for k in range(1, 12)]"],
    "rec_python_bytes": [sys.executable, "-c",
                         "import random; r=random.Random(3); "
                         "k=[bytearray(r.randrange(16, 9000)) for _ in range(20000)][::5]"],
    "rec_sort": ["sort", "-o", os.devnull, "/etc/services"],
    "rec_ls": ["ls", "-lR", "/usr/include/linux"],
}


def read_lines(path: pathlib.Path) -> List[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return f.read().splitlines()


def window(lines: List[str], start: int, count: int) -> List[str]:
    """Lines start..start+count, without the frees of blocks allocated before them."""
    out, live = [], set()
    for line in lines[start:start + count]:
        cols = line.split("\t")
        if cols[2] == "-1":
            if cols[3] == "(nil)" or cols[3] in live:
                live.discard(cols[3])
                out.append(line)
        else:
            if cols[3] != "(nil)":
                live.add(cols[3])
            out.append(line)
    return out


def shifted(lines: List[str], dt_s: float, da: int) -> List[str]:
    """The trace with every time moved by dt_s seconds and every address by da bytes."""
    out = []
    for line in lines:
        cols = line.split("\t")
        decimals = len(cols[0].split(".")[1]) if "." in cols[0] else 6
        cols[0] = f"{float(cols[0]) + dt_s:.{decimals}f}"
        if cols[3] != "(nil)":
            cols[3] = hex(int(cols[3], 16) + da)
        out.append("\t".join(cols))
    return out


def with_leak(lines: List[str], size_bytes: int) -> List[str]:
    """One more allocation, never freed, at the first line's time and thread, far above every
    address of the trace."""
    cols = lines[0].split("\t")
    top = max(int(c.split("\t")[3], 16) for c in lines if c.split("\t")[3] != "(nil)")
    leak = [cols[0], cols[1], str(size_bytes), hex((top + 2 * size_bytes + MIB) & ~(MIB - 1))]
    if len(cols) > 4:
        leak.append("malloc")
    return ["\t".join(leak)] + lines


def write_text(path: pathlib.Path, lines: List[str]) -> None:
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write("\n".join(lines) + "\n")


def bases(shared: pathlib.Path, samples: pathlib.Path, window_events: int) -> Dict[str, List[str]]:
    out = {}
    for name in ("xz_T2_8KiB_blocks", "find_usr_include"):
        out[name] = read_lines(shared / f"{name}.trace.gz")
    out["python_fragments"] = read_lines(samples / "python_fragments.trace.gz")
    for name, windows in (("git_log_p_gitui", 5), ("python311_json_re_sqlite", 5)):
        lines = read_lines(shared / f"{name}.trace.gz")
        step = (len(lines) - window_events) // max(windows - 1, 1)
        for w in range(windows):
            out[f"{name}_w{w}"] = window(lines, w * step, window_events)
    return out


def record(allocview: str, out: pathlib.Path) -> Dict[str, str]:
    made = {}
    for name, argv in PROGRAMS.items():
        path = out / f"{name}.avt"
        subprocess.run([allocview, "record", "-o", str(path), "--", *argv], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        made[name] = path.name
    return made


def generate(out: pathlib.Path, shared: pathlib.Path, samples: pathlib.Path, allocview: str,
             variants: int = 8, leak_every: int = 6, window_events: int = 30000) -> dict:
    build_a, build_b = out / "build=a", out / "build=b"
    build_a.mkdir(parents=True, exist_ok=True)
    build_b.mkdir(parents=True, exist_ok=True)
    manifest = {"traces": []}
    n = 0
    for base, lines in bases(shared, samples, window_events).items():
        base_path = out / "bases" / f"{base}.trace.gz"
        base_path.parent.mkdir(exist_ok=True)
        write_text(base_path, lines)
        for v in range(variants):
            name = f"{base}_v{v}.trace.gz"
            lines_v = shifted(lines, dt_s=17.0 * v + 0.25, da=(v + 1) * 64 * MIB)
            write_text(build_a / name, lines_v)
            leak = (n % leak_every == 0) and (n // leak_every) % 2 == 0
            leak_bytes = (n % 5 + 1) * MIB if leak else 0
            write_text(build_b / name, with_leak(lines_v, leak_bytes) if leak else lines_v)
            for build in ("a", "b"):
                manifest["traces"].append({
                    "build": build, "trace": name, "base": f"bases/{base}.trace.gz",
                    "leak_bytes": leak_bytes if build == "b" else 0})
            n += 1
    for name, file in record(allocview, build_a).items():
        (build_b / file).write_bytes((build_a / file).read_bytes())
        for build in ("a", "b"):
            manifest["traces"].append({"build": build, "trace": file,
                                       "base": f"build=a/{file}", "leak_bytes": 0})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=pathlib.Path)
    p.add_argument("--shared", type=pathlib.Path, default=pathlib.Path("../shared/data/traces"))
    p.add_argument("--samples", type=pathlib.Path, default=pathlib.Path("sample-traces"))
    p.add_argument("--allocview", default="target/debug/allocview")
    p.add_argument("--variants", type=int, default=8)
    a = p.parse_args(argv)
    m = generate(a.out, a.shared, a.samples, a.allocview, variants=a.variants)
    print(f"{len(m['traces'])} traces in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
