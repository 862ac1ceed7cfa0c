#!/usr/bin/env python3
"""Makes a big PyTorch memory snapshot from a real one, for load and memory benchmarks.

    scripts/make-big-snapshot.py --in SNAPSHOT.pickle --out BIG.pickle --min-bytes 1GB

Repeats the trace of the first device (device_traces[0]) until the pickle is at least
--min-bytes long. Copy k (k = 1, 2, ...) lives in its own address range, k strides above the
original's (a stride is the original's address span rounded up to 1 GiB), and its times come
after copy k-1's (a period is the original's time span plus 1 us). Each copy gets its own
shifted segments and blocks, so the result is a consistent snapshot: its final segments hold
every copy's final blocks, and walking the whole trace backwards from them rebuilds every
copy's start state. external_annotations are repeated with the same time shifts.

Frames lists (and frame dicts, and strings) are the same Python objects in every copy, as
PyTorch shares them: the pickler memoizes by identity, so the copies reference them.

Sizes accept B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024).
Standard library only. Needs roughly 5 times the output size in memory (Python objects).
"""

import argparse
import io
import pickle
import re
import sys
import time

# Trace actions whose `addr` is not an address in the device's memory.
NO_ADDRESS_ACTIONS = {"snapshot", "oom", "user_defined"}

UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


def parse_size(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1GB, 512MB, 20MiB)")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


class PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: a snapshot never needs a class."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to import {module}.{name}: not a plain snapshot")


def load(path):
    with open(path, "rb") as f:
        return PlainUnpickler(f).load()


def device_of(segment):
    return segment.get("device", 0)


def has_address(entry):
    return "addr" in entry and entry.get("action") not in NO_ADDRESS_ACTIONS


class Repeater:
    """Builds the shifted copies of one snapshot's device-0 trace and segments."""

    def __init__(self, snap):
        self.snap = snap
        traces = snap.get("device_traces") or []
        if not traces or not traces[0]:
            sys.exit("the snapshot has no trace for device 0: nothing to repeat")
        self.trace = traces[0]
        # device_traces is indexed by device.
        self.device = 0
        self.segments = [s for s in snap.get("segments", []) if device_of(s) == self.device]
        self.others = [s for s in snap.get("segments", []) if device_of(s) != self.device]
        self.annotations = [
            a for a in snap.get("external_annotations", []) if a.get("device", 0) == self.device
        ]

        starts, ends = [], []
        for s in self.segments:
            starts.append(s["address"])
            ends.append(s["address"] + s["total_size"])
        for e in self.trace:
            if has_address(e):
                starts.append(e["addr"])
                ends.append(e["addr"] + max(e.get("size", 0), 0))
        span = max(ends) - min(starts)
        self.stride = max(1, -(-span // 2**30)) * 2**30

        times = [e["time_us"] for e in self.trace if "time_us" in e]
        times += [a["time_us"] for a in self.annotations if "time_us" in a]
        self.period = (max(times) - min(times) + 1) if times else 0

    def segments_copy(self, k):
        shift = k * self.stride
        out = []
        for s in self.segments:
            c = dict(s)
            c["address"] = s["address"] + shift
            blocks = []
            for b in s.get("blocks", []):
                bc = dict(b)
                if "address" in b:
                    bc["address"] = b["address"] + shift
                blocks.append(bc)
            c["blocks"] = blocks
            out.append(c)
        return out

    def trace_copy(self, k):
        shift, dt = k * self.stride, k * self.period
        out = []
        for e in self.trace:
            c = dict(e)
            if has_address(e):
                c["addr"] = e["addr"] + shift
            if "time_us" in e:
                c["time_us"] = e["time_us"] + dt
            out.append(c)
        return out

    def annotations_copy(self, k):
        dt = k * self.period
        out = []
        for a in self.annotations:
            c = dict(a)
            if "time_us" in c:
                c["time_us"] = a["time_us"] + dt
            out.append(c)
        return out

    def build(self, copies):
        """The snapshot with `copies` copies in all (1 = the original)."""
        if copies * self.stride + max(s["address"] for s in self.segments or [{"address": 0}]) >= 2**64:
            sys.exit(f"{copies} copies of a {self.stride} B stride run past 2^64")
        out = dict(self.snap)
        segments = []
        trace = []
        annotations = []
        for k in range(copies):
            segments += self.segments_copy(k) if k else [dict(s) for s in self.segments]
            trace += self.trace_copy(k) if k else list(self.trace)
            annotations += self.annotations_copy(k) if k else list(self.annotations)
        out["segments"] = sorted(segments + self.others, key=lambda s: (device_of(s), s["address"]))
        out["device_traces"] = [trace] + list(self.snap["device_traces"][1:])
        if "external_annotations" in self.snap:
            others = [
                a for a in self.snap["external_annotations"] if a.get("device", 0) != self.device
            ]
            out["external_annotations"] = annotations + others
        return out


def pickled_size(obj):
    buf = io.BytesIO()
    pickle.dump(obj, buf, protocol=4)
    return buf.tell()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in", dest="input", required=True, help="a snapshot pickle")
    parser.add_argument("--out", required=True, help="where to write the big snapshot")
    parser.add_argument("--min-bytes", type=parse_size, required=True, help="e.g. 1GB, 512MB")
    args = parser.parse_args()

    t0 = time.time()
    snap = load(args.input)
    rep = Repeater(snap)
    # Bytes per copy, measured where memo references are already long (LONG_BINGET).
    s2, s3 = pickled_size(rep.build(2)), pickled_size(rep.build(3))
    per_copy = max(1, s3 - s2)
    copies = max(1, 3 + -(-(args.min_bytes - s3) // per_copy))
    while True:
        big = rep.build(copies)
        with open(args.out, "wb") as f:
            pickle.dump(big, f, protocol=4)
            size = f.tell()
        if size >= args.min_bytes:
            break
        copies += max(1, -(-(args.min_bytes - size) // per_copy))
        del big

    trace = big["device_traces"][0]
    actions = {}
    for e in trace:
        actions[e.get("action")] = actions.get(e.get("action"), 0) + 1
    blocks = sum(len(s.get("blocks", [])) for s in big["segments"])
    print(f"wrote {args.out}: {size:,} bytes, {copies} copies of {len(rep.trace):,} entries "
          f"(address stride {rep.stride:#x}, time period {rep.period} us)")
    print(f"  trace entries: {len(trace):,} ("
          + ", ".join(f"{a} {n:,}" for a, n in sorted(actions.items(), key=lambda x: str(x[0])))
          + ")")
    print(f"  segments: {len(big['segments']):,}, blocks: {blocks:,}, "
          f"annotations: {len(big.get('external_annotations', [])):,}")
    print(f"  {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
