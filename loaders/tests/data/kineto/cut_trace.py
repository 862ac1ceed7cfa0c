"""Cuts a PyTorch profiler trace to the events of its first MS milliseconds (events without a
time, such as metadata, are kept), keeping the other top-level keys and the file's order, and
writes it gzipped: `python3 cut_trace.py IN OUT MS`. Used to make
`kineto_tbplugin_resnet50_first200ms.pt.trace.json.gz` from the 2021-schema trace of
pytorch/kineto's tb_plugin samples (a cut of the real file, nothing else changed)."""
import gzip
import json
import sys

src, dst, ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
opener = gzip.open if src.endswith(".gz") else open
with opener(src, "rt") as f:
    trace = json.load(f)
times = [e["ts"] for e in trace["traceEvents"] if isinstance(e.get("ts"), (int, float))]
end_us = min(times) + ms * 1000
trace["traceEvents"] = [
    e for e in trace["traceEvents"] if not isinstance(e.get("ts"), (int, float)) or e["ts"] < end_us
]
with gzip.open(dst, "wt", compresslevel=9) as f:
    json.dump(trace, f)
