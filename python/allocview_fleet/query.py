"""The fleet questions, in DuckDB SQL over the job's Parquet (``OUT_DIR/traces``,
``OUT_DIR/policies``).

    python -m allocview_fleet.query OUT_DIR [--build a] [--before a --after b]

prints the three answers as tables. Each is also a function returning a polars DataFrame.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import List, Optional

import duckdb
import polars as pl


def _views(out) -> duckdb.DuckDBPyConnection:
    """``traces`` and ``policies`` over the job's output: a directory, or a URI DuckDB reads
    (``s3://`` once its httpfs extension is loaded; ``file://`` here)."""
    base = str(out)
    if base.startswith("file://"):
        base = base[len("file://"):]
    con = duckdb.connect()
    for table in ("traces", "policies"):
        glob = f"{base.rstrip('/')}/{table}/*.parquet"
        # The path is handed to DuckDB as a value, never pasted into SQL: a quote in it
        # (`bob's runs`) is a character of the path, not the end of a string literal.
        con.read_parquet(glob, union_by_name=True).create_view(table)
    return con


# For each policy and setting, the distribution over the fleet of the peak footprint divided by
# the trace's max live bytes (1.0: no byte wasted), and of the peak footprint itself.
DISTRIBUTION = """
SELECT policy, setting, count(*) AS traces,
       min(footprint_over_max_live) AS ratio_min,
       quantile_cont(footprint_over_max_live, 0.5) AS ratio_p50,
       quantile_cont(footprint_over_max_live, 0.9) AS ratio_p90,
       max(footprint_over_max_live) AS ratio_max,
       avg(footprint_over_max_live) AS ratio_mean,
       sum(peak_footprint_bytes)::BIGINT AS footprint_bytes_total,
       quantile_cont(peak_footprint_bytes, 0.5) AS footprint_bytes_p50,
       sum(ooms)::BIGINT AS ooms
FROM policies WHERE ($build IS NULL OR build = $build)
GROUP BY policy, setting ORDER BY policy, setting
"""

# The traces where a setting saves the most against the same policy's defaults, on the same
# trace (and build).
SETTING_HELPS = """
SELECT s.build, s.trace, s.policy, s.setting,
       d.peak_footprint_bytes AS default_footprint_bytes,
       s.peak_footprint_bytes AS setting_footprint_bytes,
       d.peak_footprint_bytes - s.peak_footprint_bytes AS saved_bytes,
       1 - s.peak_footprint_bytes / d.peak_footprint_bytes AS saved_fraction
FROM policies s JOIN policies d
  ON d.trace = s.trace AND d.build IS NOT DISTINCT FROM s.build
 AND d.policy = s.policy AND d.setting = ''
WHERE s.setting <> '' AND ($build IS NULL OR s.build = $build)
ORDER BY saved_bytes DESC, s.trace, s.build, s.setting
LIMIT $top
"""

# The traces whose peak of live bytes grew from one build to the other.
PEAK_GREW = """
SELECT b.trace, a.peak_live_bytes AS before_bytes, b.peak_live_bytes AS after_bytes,
       b.peak_live_bytes - a.peak_live_bytes AS grown_bytes
FROM traces a JOIN traces b ON a.trace = b.trace
WHERE a.build = $before AND b.build = $after AND b.peak_live_bytes > a.peak_live_bytes
ORDER BY grown_bytes DESC, b.trace
"""


def _run(out, sql: str, params: dict) -> pl.DataFrame:
    # Through Arrow: DuckDB's result becomes a polars frame without a copy.
    return pl.DataFrame(_views(out).sql(sql, params=params).to_arrow_table())


def distribution(out, build: Optional[str] = None) -> pl.DataFrame:
    return _run(out, DISTRIBUTION, {"build": build})


def setting_helps(out, build: Optional[str] = None, top: int = 20) -> pl.DataFrame:
    return _run(out, SETTING_HELPS, {"build": build, "top": top})


def peak_grew(out, before: str = "a", after: str = "b") -> pl.DataFrame:
    return _run(out, PEAK_GREW, {"before": before, "after": after})


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the job's output: a directory or a URI")
    p.add_argument("--build", help="only this build in the first two answers")
    p.add_argument("--before", default="a")
    p.add_argument("--after", default="b")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args(argv)
    with pl.Config(tbl_rows=100, tbl_cols=20):
        print("Footprint / max live, per policy and setting:")
        print(distribution(a.out, a.build))
        print(f"\nWhere a setting helps most (top {a.top}):")
        print(setting_helps(a.out, a.build, a.top))
        print(f"\nTraces whose peak grew from build {a.before} to {a.after}:")
        print(peak_grew(a.out, a.before, a.after))
    return 0


if __name__ == "__main__":
    sys.exit(main())
