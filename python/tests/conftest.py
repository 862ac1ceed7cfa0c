"""Shared fixtures: the repository's sample traces and the `allocview` binary the package's
results are checked against (ALLOCVIEW_BIN, else the workspace's debug build)."""

import json
import os
import pathlib
import subprocess

import pytest

# `pytester` runs the pytest plugin's own sessions (tests/test_tracker.py).
pytest_plugins = ["pytester"]

REPO = pathlib.Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample-traces"


def allocview_bin() -> str:
    path = os.environ.get("ALLOCVIEW_BIN") or str(REPO / "target" / "debug" / "allocview")
    if not os.path.exists(path):
        pytest.fail(f"no allocview binary at {path}: build it or set ALLOCVIEW_BIN")
    return path


def cli_json(*args: str) -> dict:
    """What `allocview ARGS --json` prints, parsed."""
    out = subprocess.run([allocview_bin(), *args, "--json"], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


# Figures that measure the run (seconds, speeds), not the trace: they differ between two runs.
TIMINGS = ("seconds", "per_second", "per_s")


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items()
                if not any(k == t or k.endswith("_" + t) for t in TIMINGS)}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


@pytest.fixture
def samples() -> pathlib.Path:
    return SAMPLES
