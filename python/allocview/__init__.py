"""allocview from Python: memory-allocation traces as polars DataFrames, and the ``allocview``
commands' ``--json`` objects as dicts.

>>> import allocview
>>> t = allocview.load("sample-traces/xz_T2_8KiB_blocks.trace.gz")
>>> t.events                      # polars DataFrame, the `convert --to parquet` schema
>>> allocview.stats(t)["peak_live_bytes"]
>>> allocview.compare(t, policies=["bfc", "first-fit"], limit="512MiB")["policies"]

Every function that reads a trace takes a path or a :class:`Trace` (loaded once, used by
several commands). Loading and replaying run in Rust with the GIL released; ``progress`` is
``None`` (quiet), ``True`` (a line on stderr) or a callable ``f(stage, done, total)``
(``stage`` is ``"load"``, counted in bytes, or ``"replay"``, counted in policies).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, Iterable, Optional, Union

import polars as pl

from . import _native
from ._native import AllocviewError, parse_bytes, policy_names
from .tracker import Tracker

__all__ = [
    "AllocviewError",
    "Trace",
    "Tracker",
    "compare",
    "from_snapshot",
    "load",
    "parse_bytes",
    "policy_names",
    "predict",
    "report_html",
    "sites",
    "stats",
    "tune",
]
__version__ = _native.__version__

Progress = Union[None, bool, Callable[[str, int, int], Any]]
Source = Union[str, "os.PathLike[str]", "Trace"]


class Trace:
    """A loaded input (a malloc trace, a TensorFlow memory log, a PyTorch snapshot, a plan).

    Its tables are the ones ``allocview convert IN OUT.parquet`` writes, with the same columns
    (docs/src/reference/events.md): ``events`` (``t_ns``, ``thread``, ``kind``, ``size_bytes``,
    ``address``, ``alloc_id``, ``size_class``, ``call``, ``stack_id``, then the input's own),
    ``threads``, and where the input has them ``stacks`` and ``frames`` (the site tables) and a
    snapshot's ``segments``, ``blocks``, ``segment_events``, ``annotations``.
    """

    def __init__(self, native: "_native.Trace"):
        self._native = native
        self._tables: Optional[Dict[str, pl.DataFrame]] = None

    @property
    def path(self) -> str:
        return self._native.path

    @property
    def recorded_in_python(self) -> bool:
        """Recorded in a CPython interpreter: its requests are read in one of two views
        (``load(..., requests="objects")``, the default, or ``"libc"``, what ``compare``
        replays)."""
        return self._native.recorded_in_python

    @property
    def warnings(self) -> list:
        """What the loader noticed and kept going past."""
        return self._native.warnings

    @property
    def tables(self) -> Dict[str, pl.DataFrame]:
        """Every table by name, imported through the Arrow C stream interface (made once)."""
        if self._tables is None:
            self._tables = {
                name: pl.DataFrame(table) for name, table in self._native.tables()
            }
        return self._tables

    @property
    def events(self) -> pl.DataFrame:
        """The event table (a memory plan's buffers table for a plan)."""
        tables = self.tables
        return tables["events"] if "events" in tables else tables["buffers"]

    @property
    def threads(self) -> Optional[pl.DataFrame]:
        return self.tables.get("threads")

    @property
    def stacks(self) -> Optional[pl.DataFrame]:
        """One row per frame of each call stack: ``stack_id``, ``depth``, ``frame_id``."""
        return self.tables.get("stacks")

    @property
    def frames(self) -> Optional[pl.DataFrame]:
        """``frame_id``, ``function``, ``file``, ``line``, ``module``."""
        return self.tables.get("frames")

    def __repr__(self) -> str:
        return f"allocview.Trace({self.path!r})"


def _stderr_progress(stage: str, done: int, total: int) -> None:
    if total > 0:
        sys.stderr.write(f"\rallocview: {stage} {100 * done // total:3d}%")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _callback(progress: Progress) -> Optional[Callable[[str, int, int], Any]]:
    if progress is None or progress is False:
        return None
    if progress is True:
        return _stderr_progress
    if not callable(progress):
        raise TypeError("progress must be None, True or a callable(stage, done, total)")
    return progress


def _native_trace(source: Source, progress: Progress) -> "_native.Trace":
    if isinstance(source, Trace):
        return source._native
    return _native.load(os.fspath(source), progress=_callback(progress))


def load(path: Union[str, "os.PathLike[str]"], *, lenient: bool = False,
         progress: Progress = None, requests: str = "objects") -> Trace:
    """Loads a trace, as ``allocview`` does (``lenient``: skip malformed lines, as
    ``--lenient``; ``requests``: of a trace recorded in a CPython interpreter, ``"objects"``,
    the requests the program made, or ``"libc"``, what reached the C library, as
    ``--requests``)."""
    return Trace(_native.load(os.fspath(path), lenient=lenient, progress=_callback(progress),
                              requests=requests))


def stats(source: Source, *, progress: Progress = None) -> dict:
    """What ``allocview stats FILE --json --no-stream`` prints (the trace is loaded)."""
    return json.loads(_native.stats(_native_trace(source, progress)))


def _policy_list(policies: Union[None, str, Iterable[str]]) -> list:
    if policies is None:
        return []
    if isinstance(policies, str):
        return [policies]
    return list(policies)


def _bytes(limit: Union[None, int, str]) -> Optional[int]:
    if limit is None or isinstance(limit, int):
        return limit
    return parse_bytes(limit)


def compare(source: Source, policies: Union[None, str, Iterable[str]] = None,
            limit: Union[None, int, str] = None, *, min_limit: bool = False,
            align: int = 16, jobs: Optional[int] = None,
            progress: Progress = None) -> dict:
    """What ``allocview compare FILE --policy ... [--limit X] --json`` prints, plus ``series``:
    every policy's timeline (one row per policy and time bucket, the ``--parquet`` table) as a
    polars DataFrame. ``policies``: names or variants (``"pytorch:max_split_size_mb=128"``);
    none means all. ``limit``: bytes, or a size as the command line takes it (``"512MiB"``)."""
    native = _native_trace(source, progress)
    text, series = _native.compare(
        native, _policy_list(policies), limit_bytes=_bytes(limit), min_limit=min_limit,
        align_bytes=align, jobs=jobs, progress=_callback(progress))
    out = json.loads(text)
    out["series"] = pl.DataFrame(series)
    return out


def sites(source: Source, at: Union[str, int] = "peak", by: str = "function",
          policy: Optional[str] = None, *, progress: Progress = None) -> dict:
    """What ``allocview sites FILE --at AT --by BY [--policy P] --json`` prints."""
    return json.loads(_native.sites(_native_trace(source, progress), at=str(at), by=by,
                                    policy=policy))


class ReportPage:
    """``allocview report FILE --html OUT.html``'s page: ``html`` is the whole self-contained
    file; in a notebook it shows inline (in a frame of its own, its script apart from the
    notebook's); ``save(path)`` writes it."""

    def __init__(self, html: str):
        self.html = html

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html)

    def _repr_html_(self) -> str:
        import html as _html

        return (f'<iframe class="allocview-report" srcdoc="{_html.escape(self.html, quote=True)}" '
                'style="width:100%;height:900px;border:0" sandbox="allow-scripts"></iframe>')

    def __repr__(self) -> str:
        return f"<allocview report page, {len(self.html):,} characters>"


def report_html(source: Source, policies: Union[None, str, Iterable[str]] = None, *,
                jobs: Optional[int] = None, progress: Progress = None) -> ReportPage:
    """The page ``allocview report FILE --policy ... --html OUT.html`` writes, as a
    :class:`ReportPage`: shown inline in a notebook, ``.save(path)`` to share it. A path is
    read as ``report`` reads it (of a trace recorded in a CPython interpreter, what reached the
    C library, which the policies replay)."""
    if isinstance(source, Trace):
        native = source._native
    else:
        native = _native.load(os.fspath(source), progress=_callback(progress), requests="libc")
    return ReportPage(_native.report_html(native, _policy_list(policies), jobs=jobs))


def tune(source: Source, limit: Union[None, int, str] = None, policy: Optional[str] = None, *,
         jobs: Optional[int] = None, progress: Progress = None) -> dict:
    """What ``allocview tune FILE [--limit L] [--policy FAMILY] --json`` prints: the settings
    of the allocator family that replay the input under the limit, best first (``best``,
    ``default``, ``candidates``, each with the ``env`` line to set and the ``policy`` variant
    that ``compare`` proves it with)."""
    return json.loads(_native.tune(_native_trace(source, progress), limit_bytes=_bytes(limit),
                                   family=policy, jobs=jobs))


def predict(source: Source, model: Union[None, str, Iterable[str]] = None, order: int = 8,
            split: float = 0.8, train: Union[None, str, "os.PathLike[str]"] = None, *,
            progress: Progress = None) -> dict:
    """What ``allocview predict FILE [--model ...] --json`` prints."""
    models = None if model is None else ",".join(_policy_list(model))
    return json.loads(_native.predict(
        _native_trace(source, progress), model=models, order=order, split=split,
        train=None if train is None else os.fspath(train)))


def from_snapshot(snapshot: dict, name: str = "<snapshot>") -> Trace:
    """A PyTorch memory snapshot from the object ``torch.cuda.memory._snapshot()`` returns
    (no pickle file), read exactly as ``allocview`` reads the same snapshot saved with
    ``pickle.dump``. ``name`` stands for the file in the commands' output; ``stats`` reports
    its ``pickle_protocol`` as 0 (there was no pickle)."""
    return Trace(_native.from_snapshot(snapshot, name))


def load_ipython_extension(ipython) -> None:
    """``%load_ext allocview``: the ``%%allocview`` cell magic (see :mod:`allocview.notebook`)."""
    from .notebook import register

    register(ipython)
