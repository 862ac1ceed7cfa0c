"""The book's notebook-style example (docs/src/python/package.md) runs as written, and the CI
memory check example passes and fails where it should."""

import pathlib
import re
import subprocess
import sys

from conftest import REPO

EXAMPLE = REPO / "python" / "examples" / "ci_memory_check.py"
PACKAGE_PAGE = REPO / "docs" / "src" / "python" / "package.md"


def page_python_blocks(page: pathlib.Path) -> list:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def test_book_notebook_example_runs(monkeypatch):
    blocks = page_python_blocks(PACKAGE_PAGE)
    assert blocks, "the book's Python package page has no python block"
    monkeypatch.chdir(REPO)
    scope: dict = {}
    for block in blocks:
        exec(compile(block, str(PACKAGE_PAGE.relative_to(REPO)), "exec"), scope)
    # The example ends by choosing a policy; it must be one the trace was replayed through.
    assert scope["best"]["name"] in {p["name"] for p in scope["result"]["policies"]}


def run_check(*args):
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True,
                          cwd=REPO)


def test_ci_memory_check_passes_and_fails():
    trace = "sample-traces/python_fragments.trace.gz"
    # Live bytes peak at 19,701,589 B (sample-traces/README.md).
    ok = run_check(trace, "--max-peak-live", "20MB", "--policy", "glibc",
                   "--max-footprint", "64MiB")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("ok  ") == 2
    bad = run_check(trace, "--max-peak-live", "19MB")
    assert bad.returncode == 1 and "FAIL peak live bytes: 19,701,589 B" in bad.stdout
    grew = run_check(trace, "--baseline", "sample-traces/find_usr_include.trace.gz",
                     "--max-growth", "10")
    assert grew.returncode == 1 and "FAIL peak live vs" in grew.stdout
