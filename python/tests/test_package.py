"""The wheel against real traces: tables, the commands' JSON (equal to the CLI's), progress,
the GIL, errors."""

import threading
import time

import polars as pl
import pyarrow as pa
import pytest

import allocview
from conftest import cli_json, without_timings

XZ = "xz_T2_8KiB_blocks.trace.gz"
PERL = "perl_hash.avt"  # binary, recorded
SNAPSHOT = "pytorch/lm_train_step_b.pickle"  # with call stacks


def test_load_gives_the_parquet_tables(samples):
    t = allocview.load(samples / PERL)
    assert list(t.events.columns[:9]) == ["t_ns", "thread", "kind", "size_bytes", "address",
                                          "alloc_id", "size_class", "call", "stack_id"]
    assert t.events.schema["size_bytes"] == pl.UInt64
    stats = allocview.stats(t)
    assert t.events.height == stats["events"]
    # Live bytes recomputed in polars from the events match `stats`.
    size = pl.col("size_bytes").cast(pl.Int64)
    live = t.events.select(
        pl.when(pl.col("kind") == 0).then(size).when(pl.col("kind") == 1).then(-size)
        .otherwise(0).cum_sum().max())
    assert live.item() == stats["peak_live_bytes"]


def test_site_tables(samples):
    t = allocview.load(samples / SNAPSHOT)
    assert t.stacks is not None and t.frames is not None
    # Every stack id the events name is in the stacks table, every frame id in the frames.
    used = set(t.events["stack_id"].drop_nulls().unique().to_list())
    assert used and used <= set(t.stacks["stack_id"].unique().to_list())
    assert set(t.stacks["frame_id"].unique().to_list()) <= set(t.frames["frame_id"].to_list())
    assert {"segments", "blocks", "segment_events", "annotations"} <= set(t.tables)


def test_tables_read_by_pyarrow_too(samples):
    t = allocview.load(samples / XZ)
    native = dict(t._native.tables())
    table = pa.table(native["events"])
    assert table.num_rows == t.events.height
    assert table.column("size_bytes").to_pylist() == t.events["size_bytes"].to_list()


def test_stats_is_the_cli_json(samples):
    for name in (XZ, PERL, "pytorch/lm_train_step_b.pickle"):
        path = str(samples / name)
        # A Trace is loaded: the CLI's loaded figures (it streams a binary trace on its own).
        want = cli_json("stats", path, "--no-stream")
        assert without_timings(allocview.stats(path)) == without_timings(want)


def test_compare_is_the_cli_json_plus_series(samples):
    path = str(samples / XZ)
    got = allocview.compare(path, policies=["bfc", "first-fit", "buddy"], limit="256MiB")
    series = got.pop("series")
    want = cli_json("compare", path, "--policy", "bfc,first-fit,buddy", "--limit", "256MiB")
    assert without_timings(got) == without_timings(want)
    assert sorted(series["policy"].unique().to_list()) == ["bfc", "buddy", "first-fit"]
    peaks = series.group_by("policy").agg(pl.col("footprint_bytes").max())
    for row in got["policies"]:
        peak = peaks.filter(pl.col("policy") == row["name"])["footprint_bytes"][0]
        assert peak == row["peak_footprint_bytes"]


def test_compare_runs_the_real_allocator_rows(samples):
    t = allocview.load(samples / "python_fragments.trace.gz")
    calls = []
    got = allocview.compare(t, policies=["glibc", "real-jemalloc:dirty_decay_ms=0"],
                            progress=lambda *a: calls.append(a))
    rows = {p["name"]: p for p in got["policies"]}
    # real-glibc comes with any real row: the program's own allocator, which advice compares with.
    assert list(rows) == ["glibc", "real-glibc", "real-jemalloc:dirty_decay_ms=0"]
    assert calls[-1] == ("replay", 3, 3)
    je = rows["real-jemalloc:dirty_decay_ms=0"]
    assert je["real"] is True and je["env"].endswith("MALLOC_CONF=dirty_decay_ms:0")
    assert je["peak_rss_bytes"] == je["peak_footprint_bytes"] > 0
    assert rows["glibc"]["model_vs_real"]["real_peak_rss_bytes"] == rows["real-glibc"]["peak_rss_bytes"]
    # The series has the real rows' measured RSS on the same time axis as the model's.
    series = got["series"]
    peaks = series.group_by("policy").agg(pl.col("footprint_bytes").max())
    for name, row in rows.items():
        assert peaks.filter(pl.col("policy") == name)["footprint_bytes"][0] == \
            row["peak_footprint_bytes"]
    assert {a["policy"] for a in got["advice"]} <= set(rows)


def test_tune_is_the_cli_json(samples):
    path = str(samples / SNAPSHOT)
    got = allocview.tune(path, limit="3.8GiB", jobs=1)
    want = cli_json("tune", path, "--limit", "3.8GiB", "--jobs", "1")
    assert got == want
    assert got["fits"] and got["best"]["env"].startswith("PYTORCH_CUDA_ALLOC_CONF=")
    assert not got["default"]["fits"]


def test_sites_and_predict_are_the_cli_json(samples):
    path = str(samples / SNAPSHOT)
    got = allocview.sites(path, at="peak", by="function", policy="first-fit")
    want = cli_json("sites", path, "--at", "peak", "--by", "function", "--policy", "first-fit")
    assert got == want
    assert got["site_kind"] == "stacks" and got["sites"]
    path = str(samples / PERL)
    got = allocview.predict(path, model=["majority", "order-2"])
    want = cli_json("predict", path, "--model", "majority,order-2")
    assert without_timings(got) == without_timings(want)


def test_progress_reaches_the_total(samples):
    calls = []
    t = allocview.load(samples / "python_fragments.trace.gz",
                       progress=lambda *a: calls.append(a))
    assert calls and calls[-1] == ("load", (samples / "python_fragments.trace.gz").stat().st_size,
                                   (samples / "python_fragments.trace.gz").stat().st_size)
    calls.clear()
    allocview.compare(t, policies=["bfc", "buddy", "glibc"], jobs=1,
                      progress=lambda *a: calls.append(a))
    assert calls[-1] == ("replay", 3, 3)
    done = [c[1] for c in calls]
    assert done == sorted(done)


def test_the_gil_is_released_while_replaying(samples):
    t = allocview.load(samples / "python_fragments.trace.gz")
    ticks = 0
    stop = False

    def count():
        nonlocal ticks
        while not stop:
            ticks += 1
            time.sleep(0.001)

    th = threading.Thread(target=count)
    th.start()
    try:
        started = time.monotonic()
        calls = 0
        while time.monotonic() - started < 0.3:
            allocview.compare(t, policies=["glibc", "bfc", "first-fit"], jobs=1)
            calls += 1
        took = time.monotonic() - started
    finally:
        stop = True
        th.join()
    # Holding the GIL through each call would leave the counter a tick or two per call.
    assert ticks > took * 1000 / 4 and ticks > 10 * calls, (took, calls, ticks)


def test_errors_name_the_file(samples, tmp_path):
    with pytest.raises(allocview.AllocviewError, match="no-such-file"):
        allocview.load(tmp_path / "no-such-file.trace")
    bad = tmp_path / "bad.trace"
    bad.write_text("this is not a trace\n")
    with pytest.raises(allocview.AllocviewError, match="bad.trace"):
        allocview.stats(bad)
    with pytest.raises(allocview.AllocviewError, match="no-such-policy"):
        allocview.compare(samples / XZ, policies=["no-such-policy"])
