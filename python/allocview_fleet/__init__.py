"""allocview over a fleet of traces on a Ray cluster.

- ``allocview_fleet.generate``: a fleet of traces made from real ones (variants, two builds,
  recorded runs), for tests and trials;
- ``allocview_fleet.job``: ``compare`` and ``stats`` mapped over a directory of traces as Ray
  tasks, written as Parquet;
- ``allocview_fleet.query``: the fleet questions in DuckDB SQL over that Parquet.

Needs the ``fleet`` extra: ``pip install 'allocview[fleet]'`` (ray, duckdb, pyarrow).
"""
