"""The fleet queries over a job's output whose path holds a quote and a space (no Ray needed:
the Parquet is written here). The path was pasted into the SQL, so `bob's runs` was a syntax
error and a crafted path ran SQL of its own (issue 43)."""

import pathlib

import duckdb
import pytest

from allocview_fleet import query


def write_output(out: pathlib.Path) -> None:
    """A job's output in miniature: two traces in two builds, one policy."""
    (out / "traces").mkdir(parents=True)
    (out / "policies").mkdir()
    con = duckdb.connect()
    con.sql("SELECT * FROM (VALUES ('a', 't1', 100::BIGINT), ('b', 't1', 150::BIGINT)) "
            "AS v(build, trace, peak_live_bytes)").write_parquet(
        str(out / "traces" / "part-0.parquet"))
    con.sql("SELECT * FROM (VALUES ('a', 't1', 'bfc', '', 200::BIGINT, 2.0, 0::BIGINT), "
            "('a', 't1', 'bfc', 'x=1', 150::BIGINT, 1.5, 0::BIGINT)) "
            "AS v(build, trace, policy, setting, peak_footprint_bytes, "
            "footprint_over_max_live, ooms)").write_parquet(
        str(out / "policies" / "part-0.parquet"))


@pytest.mark.parametrize("name", ["bob's runs", "x'); DROP TABLE y; --"])
def test_an_output_path_with_a_quote_and_a_space_is_read_as_a_path(tmp_path, name):
    out = tmp_path / name / "out"
    write_output(out)
    grew = query.peak_grew(out, "a", "b")
    assert grew["trace"].to_list() == ["t1"]
    assert grew["grown_bytes"].to_list() == [50]
    dist = query.distribution(out)
    assert sorted(dist["setting"].to_list()) == ["", "x=1"]
    helps = query.setting_helps(out)
    assert helps["saved_bytes"].to_list() == [50]
    # The same through a file:// URI.
    assert query.peak_grew(f"file://{out}", "a", "b")["grown_bytes"].to_list() == [50]
