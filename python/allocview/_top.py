"""The biggest sites of a trace at its peak, as the pytest plugin and the notebook magic show
them."""

from __future__ import annotations

from typing import List, Tuple


def top_sites(source, count: int = 5) -> List[Tuple[int, str]]:
    """``(live bytes, "function (file:line)")`` of the ``count`` biggest sites at the peak of
    ``source`` (a path or a loaded :class:`allocview.Trace`),
    leaving out those under 1% of the biggest."""
    from . import sites

    out = []
    rows = sites(source, at="peak", by="function")["sites"][:count]
    for site in rows:
        if site["live_bytes"] <= 0 or site["live_bytes"] * 100 < rows[0]["live_bytes"]:
            break
        where = next((f for f in site["frames"] if f["function"] == site["name"]), None)
        at = f" ({where['file']}:{where['line']})" if where and where["line"] else ""
        out.append((site["live_bytes"], f"{site['name']}{at}"))
    return out
