"""pytest plugin (registered by the wheel): ``pytest --allocview`` records each test with
:class:`allocview.Tracker` and checks its markers.

- ``@pytest.mark.limit_memory("24 MB")``: the test's peak live bytes, counting only what it
  allocated, stay within the size.
- ``@pytest.mark.limit_leaks("1 MB")``: the bytes the test allocated that are still live after
  it (and after a garbage collection) stay within the size.
- ``@pytest.mark.limit_footprint("64 MiB", policy="glibc")``: the test's allocations, replayed
  through the policy (any variant ``allocview compare --policy`` takes), need at most that
  footprint. The replay reads what reached the C library (``--requests libc``).

Sizes follow pytest-memray's convention (``"24 MB"`` is 24 × 1024² bytes); a suite written for
pytest-memray's ``limit_memory`` and ``limit_leaks`` runs unchanged (pytest-memray's
``limit_leaks`` limits each location's leaked bytes, and takes a ``filter_fn``; here the limit
is on the test's leaked bytes in all, and ``filter_fn`` is not applied). A failing test's report
names the top sites, with Python file and line, and the figures. ``--allocview-dir DIR`` keeps
each test's trace there (named after the test); otherwise traces go to a temporary folder.
Markers do nothing without ``--allocview``.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import tempfile

import pytest

from ._sizes import parse_size, show_size
from ._top import top_sites


def pytest_addoption(parser):
    group = parser.getgroup("allocview")
    group.addoption("--allocview", action="store_true", default=False,
                    help="record each test with allocview's in-process tracker and check its "
                         "limit_memory, limit_leaks and limit_footprint markers")
    group.addoption("--allocview-dir", metavar="DIR", default=None,
                    help="keep each test's allocview trace in DIR")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "limit_memory(size): with --allocview, fail when the test's peak live bytes "
                   "(what it allocated) pass size ('24 MB')")
    config.addinivalue_line(
        "markers", "limit_leaks(size): with --allocview, fail when the bytes the test "
                   "allocated and left live pass size")
    config.addinivalue_line(
        "markers", "limit_footprint(size, policy='glibc'): with --allocview, fail when the "
                   "test's allocations replayed through the allocator policy need more than "
                   "size")


def _trace_path(item, directory: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid).strip("_") or "test"
    return os.path.join(directory, f"{name[:150]}.avt")


def _footprint(path: str, policy: str) -> int:
    from . import compare, load

    trace = load(path, requests="libc")
    return compare(trace, policies=[policy])["policies"][0]["peak_footprint_bytes"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    config = item.config
    if not config.getoption("allocview"):
        return (yield)
    from .tracker import Tracker

    keep = config.getoption("allocview_dir")
    directory = keep or tempfile.mkdtemp(prefix="allocview-test-")
    if keep:
        os.makedirs(keep, exist_ok=True)
    path = _trace_path(item, directory)
    tracker = Tracker(path, native=True)
    try:
        with tracker:
            try:
                result = yield
            finally:
                gc.collect()
        _check(item, tracker, path)
        return result
    finally:
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


def _limit(mark, *names) -> int:
    """The size a marker gives: its first argument, or a keyword among ``names``."""
    size = mark.args[0] if mark.args else next(
        (mark.kwargs[n] for n in names if n in mark.kwargs), None)
    if size is None:
        raise pytest.UsageError(f"@pytest.mark.{mark.name} needs a size, such as '24 MB'")
    return parse_size(size)


def _check(item, tracker, path: str) -> None:
    failures = []
    mark = item.get_closest_marker("limit_memory")
    if mark is not None and tracker.peak_live_bytes > (limit := _limit(mark, "limit")):
        failures.append(
            f"the test's live bytes peaked at {show_size(tracker.peak_live_bytes)}, over "
            f"its limit_memory of {show_size(limit)}")
    mark = item.get_closest_marker("limit_leaks")
    # pytest-memray names the argument `location_limit`.
    if mark is not None and tracker.final_live_bytes > (
            limit := _limit(mark, "location_limit", "limit")):
        failures.append(
            f"the test left {show_size(tracker.final_live_bytes)} it allocated live, over "
            f"its limit_leaks of {show_size(limit)}")
    mark = item.get_closest_marker("limit_footprint")
    if mark is not None:
        limit = _limit(mark, "limit")
        policy = mark.kwargs.get("policy", mark.args[1] if len(mark.args) > 1 else "glibc")
        footprint = _footprint(path, policy)
        if footprint > limit:
            failures.append(
                f"replayed through {policy}, the test's allocations need a footprint of "
                f"{show_size(footprint)}, over its limit_footprint of {show_size(limit)}")
    if failures:
        lines = failures + ["top sites at the peak (allocview sites):"] + [
            f"  {show_size(b):>11}  {where}" for b, where in top_sites(path)]
        pytest.fail("\n".join(lines), pytrace=False)
