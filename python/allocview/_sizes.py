"""Sizes as the pytest markers take them: pytest-memray's convention (``"24 MB"``, a number, an
optional space, a unit of B, KB, MB, GB, TB or PB, powers of 1024, any case), and the IEC
units (``"64 MiB"``)."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgtp", start=1):
    _UNITS[f"{_p}b"] = 1024 ** _i
    _UNITS[f"{_p}ib"] = 1024 ** _i
    _UNITS[_p] = 1024 ** _i

_SIZE = re.compile(r"^\s*\+?(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text) -> int:
    """Bytes of ``text`` (an int is bytes already)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r}: expected a size such as '24 MB', '1.5 GiB' or '512 KiB'")
    return int(float(m.group(1)) * _UNITS[unit])


def show_size(n: float) -> str:
    """``n`` bytes, for a reader (``24.0 MiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
