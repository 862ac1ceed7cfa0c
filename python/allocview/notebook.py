"""The ``%%allocview`` cell magic (``%load_ext allocview``): runs the cell under
:class:`allocview.Tracker` and shows, inline, the peak, the top sites with file and line, and
the live-bytes timeline.

``%%allocview -o run.avt`` keeps the trace; ``--python-only`` records only the requests to
Python's allocators (``native=False``); ``--report`` shows instead the page ``allocview report
--html`` writes, inline (timeline, heap maps, sites, flame graph, size classes).
"""

from __future__ import annotations

import html
import os
import shlex
import tempfile
from typing import List, Tuple

from ._sizes import show_size
from ._top import top_sites

_WIDTH, _HEIGHT, _POINTS = 640, 120, 400


class CellReport:
    """What the magic shows: HTML in a notebook, text elsewhere."""

    def __init__(self, peak: int, final: int, sites: List[Tuple[int, str]],
                 series: List[Tuple[float, int]], path: str):
        self.peak_live_bytes = peak
        self.final_live_bytes = final
        self.sites = sites
        self.series = series
        self.path = path

    def __repr__(self) -> str:
        lines = [f"allocview: peak {show_size(self.peak_live_bytes)} live, "
                 f"{show_size(self.final_live_bytes)} left live at the end"]
        lines += [f"  {show_size(b):>11}  {where}" for b, where in self.sites]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td style='text-align:right'>{html.escape(show_size(b))}</td>"
            f"<td><code>{html.escape(where)}</code></td></tr>" for b, where in self.sites)
        return (
            f"<div class='allocview-cell'><b>allocview</b>: peak "
            f"{html.escape(show_size(self.peak_live_bytes))} live, "
            f"{html.escape(show_size(self.final_live_bytes))} left live at the end"
            f"{self._svg()}<table><tr><th>live at the peak</th><th>site</th></tr>{rows}"
            f"</table></div>")

    def _svg(self) -> str:
        if len(self.series) < 2:
            return ""
        t0, t1 = self.series[0][0], self.series[-1][0]
        top = max(v for _, v in self.series) or 1
        span = (t1 - t0) or 1.0
        pts = " ".join(
            f"{(t - t0) / span * _WIDTH:.1f},{_HEIGHT - v / top * (_HEIGHT - 4):.1f}"
            for t, v in self.series)
        return (
            f"<svg class='allocview-timeline' width='{_WIDTH}' height='{_HEIGHT}' "
            f"viewBox='0 0 {_WIDTH} {_HEIGHT}' xmlns='http://www.w3.org/2000/svg'>"
            f"<title>live bytes over time (peak {html.escape(show_size(top))}, "
            f"{span / 1e9:.3f} s)</title>"
            f"<polyline fill='none' stroke='#3b82f6' stroke-width='1.5' points='{pts}'/>"
            f"</svg>")


def _series(trace) -> List[Tuple[float, int]]:
    """Live bytes over time, at most a few hundred points (each the highest of its span)."""
    import polars as pl

    events = trace.events
    if events.height == 0:
        return []
    sign = (pl.when(pl.col("kind") == 0).then(1)
            .when(pl.col("kind").is_in([1, 2])).then(-1).otherwise(0))
    live = events.select(
        pl.col("t_ns"), (sign * pl.col("size_bytes").cast(pl.Int64)).cum_sum().alias("live"))
    step = max(1, live.height // _POINTS)
    grouped = (live.with_row_index("i")
               .group_by((pl.col("i") // step).alias("g"), maintain_order=True)
               .agg(pl.col("t_ns").last(), pl.col("live").max()))
    return [(float(t), int(v)) for t, v in zip(grouped["t_ns"], grouped["live"])]


def run_cell(ipython, line: str, cell: str):
    """Runs ``cell`` in ``ipython`` under a Tracker; the report (a :class:`CellReport`, or with
    ``--report`` the whole page, an :class:`allocview.ReportPage`)."""
    from . import load
    from .tracker import Tracker

    args = shlex.split(line)
    keep = None
    if "-o" in args:
        keep = args[args.index("-o") + 1]
    native = "--python-only" not in args
    directory = tempfile.mkdtemp(prefix="allocview-cell-")
    path = keep or os.path.join(directory, "cell.avt")
    tracker = Tracker(path, native=native)
    with tracker:
        ipython.run_cell(cell)
    if "--report" in args:
        from . import report_html

        return report_html(path)
    trace = load(path)
    return CellReport(tracker.peak_live_bytes or 0, tracker.final_live_bytes or 0,
                      top_sites(trace), _series(trace), path)


def register(ipython) -> None:
    def allocview(line: str, cell: str):
        return run_cell(ipython, line, cell)

    ipython.register_magic_function(allocview, magic_kind="cell", magic_name="allocview")
