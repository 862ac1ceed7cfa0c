"""allocview.Tracker (recording this interpreter from inside), the pytest plugin
(``pytest --allocview`` and its markers, run in pytest sessions of their own) and the
``%%allocview`` notebook magic (in a real IPython shell)."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import allocview


def _frames(site):
    return [(f["function"], os.path.basename(f["file"]), f["line"])
            for f in site["frames"] if f["python"]]


def build_table(n):
    return {i: (i, str(i)) for i in range(n)}


def test_a_tracker_records_the_running_interpreter_with_python_frames(tmp_path):
    path = tmp_path / "t.avt"
    with allocview.Tracker(path) as t:
        table = build_table(50_000)
    assert t.events > 100_000
    # 50,000 tuples and strings of a few dozen bytes each: pymalloc's objects, recorded.
    assert t.peak_live_bytes > 4_000_000
    top = allocview.sites(str(path))["sites"][0]
    assert top["live_bytes"] > 4_000_000
    frames = _frames(top)
    assert any(f == "build_table" and file == "test_tracker.py" for f, file, _ in frames), frames
    assert len(table) == 50_000
    # Every command reads the trace.
    out = subprocess.run([os.environ.get("ALLOCVIEW_BIN") or str(
        pathlib.Path(__file__).resolve().parents[2] / "target" / "debug" / "allocview"),
        "stats", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_trackers_run_one_after_another(tmp_path):
    sizes = []
    for i in range(3):
        with allocview.Tracker(tmp_path / f"r{i}.avt", native=False) as t:
            kept = [bytes(1000) for _ in range(2000 * (i + 1))]
        sizes.append(t.peak_live_bytes)
        del kept
    # Each run saw its own allocations only.
    assert sizes[0] < sizes[1] < sizes[2], sizes
    assert 2_000_000 < sizes[0] < 3_000_000, sizes
    with pytest.raises(allocview.AllocviewError, match="already recording"):
        with allocview.Tracker(tmp_path / "outer.avt"):
            with allocview.Tracker(tmp_path / "inner.avt"):
                pass


def test_native_records_the_c_library_calls_of_loaded_libraries(tmp_path):
    src = tmp_path / "grab.c"
    src.write_text("#include <stdlib.h>\n"
                   "void *grab(size_t n) { return malloc(n); }\n"
                   "void drop(void *p) { free(p); }\n")
    lib_path = tmp_path / "libgrab.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib_path), str(src)], check=True)
    import ctypes

    lib = ctypes.CDLL(str(lib_path))
    lib.grab.restype = ctypes.c_void_p
    lib.grab.argtypes = [ctypes.c_size_t]
    lib.drop.argtypes = [ctypes.c_void_p]
    size = 7_654_321
    for native in (True, False):
        path = tmp_path / f"native-{native}.avt"
        with allocview.Tracker(path, native=native):
            p = lib.grab(size)
        lib.drop(p)
        events = allocview.load(str(path)).events
        hit = events.filter(events["size_bytes"] == size)
        assert hit.height == (1 if native else 0), native
    # After the run the library's calls are its own again: recording a Python-only run
    # next shows none of them.
    sites = allocview.sites(str(tmp_path / "native-True.avt"), by="stack")["sites"]
    grab = next(s for s in sites if s["live_bytes"] == size)
    names = [f["function"] for f in grab["frames"]]
    assert "grab" in names and "test_native_records_the_c_library_calls_of_loaded_libraries" \
        in names, names


PLUGIN_TESTS = '''
import pytest

def make(n):
    return [bytes(1000) for _ in range(n)]

@pytest.mark.limit_memory("24 MB")
def test_small_fits():
    make(1000)

@pytest.mark.limit_memory("1 MB")
def test_big_fails():
    make(5000)

KEPT = []

@pytest.mark.limit_leaks("100 KB")
def test_leaks():
    KEPT.append(make(1000))

@pytest.mark.limit_leaks("100 KB")
def test_no_leak():
    make(1000)

@pytest.mark.limit_footprint("64 MiB", policy="glibc")
def test_footprint_fits():
    make(2000)

@pytest.mark.limit_footprint("1 MiB", policy="bfc:allow_growth=true")
def test_footprint_fails():
    make(3000)
'''


def test_the_pytest_plugin_checks_its_markers(pytester):
    pytester.makepyfile(test_mem=PLUGIN_TESTS)
    keep = pytester.path / "traces"
    result = pytester.runpytest_subprocess("--allocview", "--allocview-dir", str(keep), "-p",
                                           "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=3)
    out = result.stdout.str()
    assert "peaked at 4.9 MiB, over its limit_memory of 1.0 MiB" in out \
        or "peaked at 5.0 MiB, over its limit_memory of 1.0 MiB" in out, out
    assert "over its limit_leaks of 100.0 KiB" in out
    assert "replayed through bfc:allow_growth=true" in out
    # The failing test's top site, with its Python file and line.
    assert "make.<locals>.<listcomp> (" in out or "make (" in out, out
    source = (pytester.path / "test_mem.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "return [bytes(1000)" in text)
    assert f"test_mem.py:{line})" in out, out
    assert len(list(keep.glob("*.avt"))) == 6


def test_without_the_flag_the_markers_do_nothing(pytester):
    pytester.makepyfile(test_mem=PLUGIN_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)


def test_the_notebook_magic_shows_the_peak_sites_and_timeline():
    IPython = pytest.importorskip("IPython", reason="the magic is tested in a real IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "allocview")
    report = shell.run_cell_magic(
        "allocview", "", "def keep():\n    return [bytes(2000) for _ in range(3000)]\nx = keep()\n")
    assert report.peak_live_bytes > 6_000_000
    assert report.sites and report.sites[0][0] > 6_000_000
    assert "keep" in report.sites[0][1], report.sites
    page = report._repr_html_()
    assert "<svg" in page and "<polyline" in page and "live at the peak" in page
    assert "allocview: peak" in repr(report)
    assert IPython.version_info[0] >= 8


def test_the_notebook_magic_shows_the_report_page_inline():
    pytest.importorskip("IPython", reason="the magic is tested in a real IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "allocview")
    page = shell.run_cell_magic(
        "allocview", "--report",
        "def keep():\n    return [bytearray(200_000) for _ in range(40)]\nx = keep()\n")
    assert isinstance(page, allocview.ReportPage)
    # The page `report --html` writes: its data and script inside, nothing fetched.
    assert page.html.lower().startswith("<!doctype html>") and "http://" not in page.html
    assert '"kind":"report"' in page.html
    inline = page._repr_html_()
    assert inline.lower().startswith('<iframe class="allocview-report" srcdoc="&lt;!doctype html&gt;')
    assert "<script" not in inline, "the page's markup is escaped into the frame's srcdoc"


def test_report_html_is_the_page_report_writes(tmp_path):
    import subprocess

    from conftest import allocview_bin

    trace = pathlib.Path(__file__).resolve().parents[2] / "sample-traces/python_fragments.trace.gz"
    page = allocview.report_html(str(trace), policies=["glibc", "bfc"])
    out = tmp_path / "page.html"
    subprocess.run([allocview_bin(), "report", str(trace), "--policy", "glibc,bfc",
                    "--html", str(out)], check=True, capture_output=True)
    written = out.read_text(encoding="utf-8")
    # The same figures: the embedded data of both pages agree (the data is one JSON object).
    import json
    import re

    def data(html: str) -> dict:
        found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                          html, re.S)
        assert found, "the page embeds its data"
        return json.loads(found.group(1))
    assert data(page.html)["runs"][0]["rows"] == data(written)["runs"][0]["rows"]
    saved = tmp_path / "saved.html"
    page.save(saved)
    assert saved.read_text(encoding="utf-8") == page.html


def test_the_books_tracker_example_runs(tmp_path, monkeypatch):
    import re

    page = pathlib.Path(__file__).resolve().parents[2] / "docs/src/guide/python-programs.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert blocks, "the page has no python block to run"
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), scope)
    assert scope["run"].peak_live_bytes > 5_000_000
    assert scope["top"]["live_bytes"] > 5_000_000


def _worker_loop(stop, kept):
    while not stop.is_set():
        kept.append([str(i) for i in range(200)])
        if len(kept) > 50:
            kept.clear()


def test_a_thread_that_recorded_in_one_run_records_in_the_next(tmp_path):
    import threading
    import time

    stop, kept = threading.Event(), []
    worker = threading.Thread(target=_worker_loop, args=(stop, kept))
    worker.start()
    try:
        for i in range(3):
            path = tmp_path / f"run{i}.avt"
            with allocview.Tracker(path, native=False):
                time.sleep(0.2)
            sites = allocview.sites(str(path), by="function")["sites"]
            names = {s["name"] for s in sites if s["alloc_count"] > 0}
            assert any(n.startswith("_worker_loop") for n in names), (i, sorted(names)[:10])
            threads = allocview.load(str(path)).threads.height
            assert threads >= 1
    finally:
        stop.set()
        worker.join()
