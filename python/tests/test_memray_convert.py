"""The fallback for memray captures allocview does not read natively (allocview/memray_convert.py):
a capture read by the installed memray's FileReader and written again as format 13 loads with
the figures memray gives the original. Needs memray (CI does not install it: skipped there);
run by hand in a venv with memray, e.g. memray 1.19.3 on the format-12 capture:

    ALLOCVIEW_BIN=target/debug/allocview python -m pytest python/tests/test_memray_convert.py

(memray 1.19.3 `memray stats --json sample-traces/memray/threads12.bin`: peak_memory 6307295,
total_num_allocations 1309; FileReader: 4 thread ids, 2 memory snapshots, largest rss 51417088.)
"""

import json
import subprocess
import sys

import pytest

from conftest import REPO, SAMPLES, allocview_bin

memray = pytest.importorskip("memray")

CONVERT = REPO / "python" / "allocview" / "memray_convert.py"


def test_a_capture_converted_through_memrays_reader_keeps_memrays_figures(tmp_path):
    source = SAMPLES / "memray" / "threads12.bin"
    reader = memray.FileReader(str(source))
    if reader.metadata.peak_memory != 6307295:
        pytest.skip("this memray reads the capture differently from 1.19.3")
    out = tmp_path / "converted.bin"
    subprocess.run([sys.executable, str(CONVERT), str(source), str(out)], check=True)
    done = subprocess.run([allocview_bin(), "stats", str(out), "--json"], check=True,
                          capture_output=True, text=True)
    stats = json.loads(done.stdout)
    assert stats["peak_live_bytes"] == 6307295
    assert stats["mallocs"] == 1309
    assert stats["threads"] == 4
    assert stats["recorded_memory"]["samples"] == 2
    assert stats["recorded_memory"]["peak_rss_bytes"] == 51417088
    done = subprocess.run([allocview_bin(), "sites", str(out), "--json"], check=True,
                          capture_output=True, text=True)
    sites = json.loads(done.stdout)["sites"]
    make_table = next(s for s in sites if s["name"] == "make_table")
    assert any(f["function"] == "make_table" and f["file"] == "prog.py" and f["line"] == 6
               for f in make_table["frames"])
