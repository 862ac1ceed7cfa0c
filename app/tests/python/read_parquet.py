"""Reads allocview's Parquet output with pyarrow and DuckDB and prints what they found, as JSON.

Run by app/tests/parquet_consumers.rs: read_parquet.py EVENTS THREADS SERIES
EVENTS is `allocview convert`'s event table, THREADS its threads table, SERIES the file
`allocview compare --parquet` wrote. The test compares the figures with allocview's own.
"""

import json
import sys

import duckdb
import pyarrow.parquet as pq


def main() -> None:
    events, threads, series = sys.argv[1:4]
    meta = pq.ParquetFile(events)
    out = {
        "schema": [[f.name, str(f.type)] for f in meta.schema_arrow],
        "rows": meta.metadata.num_rows,
        "row_groups": meta.metadata.num_row_groups,
        "threads_rows": pq.read_table(threads).num_rows,
        "series_schema": [f.name for f in pq.ParquetFile(series).schema_arrow],
        # allocview's file-level key-value metadata.
        "metadata": {
            k.decode(): v.decode()
            for k, v in (meta.metadata.metadata or {}).items()
            if k.startswith(b"allocview.")
        },
    }
    con = duckdb.connect()
    # Live bytes after each event in file order (DuckDB's file_row_number), then its peak.
    peak, final, mallocs = con.execute(
        """
        WITH live AS (
          SELECT kind, sum(CASE kind WHEN 0 THEN size_bytes::HUGEINT
                                     WHEN 1 THEN -size_bytes::HUGEINT
                                     ELSE 0 END)
                   OVER (ORDER BY file_row_number ROWS UNBOUNDED PRECEDING) AS live_bytes,
                 file_row_number
          FROM read_parquet(?, file_row_number = true)
        )
        SELECT max(live_bytes),
               arg_max(live_bytes, file_row_number),
               count(*) FILTER (WHERE kind IN (0, 4))
        FROM live
        """,
        [events],
    ).fetchone()
    out["peak_live_bytes"] = int(peak)
    out["final_live_bytes"] = int(final)
    out["mallocs"] = int(mallocs)
    out["peak_footprint_bytes"] = {
        policy: int(peak)
        for policy, peak in con.execute(
            "SELECT policy, max(footprint_bytes) FROM read_parquet(?) GROUP BY policy",
            [series],
        ).fetchall()
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
