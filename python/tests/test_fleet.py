"""The fleet job on a real Ray cluster (ALLOCVIEW_RAY_ADDRESS: CI starts a head and a worker
node), over a generated fleet of 216 traces, its answers checked against single-machine
`allocview compare --json` and `stats --json`."""

import json
import os
import pathlib
import random
import statistics
import subprocess
from collections import defaultdict

import pytest

from allocview_fleet import generate, job, query
from conftest import REPO, allocview_bin

FLEET_POLICIES = job.DEFAULT_POLICIES
SUMMARY_EXACT = ["peak_footprint_bytes", "final_footprint_bytes", "peak_live_bytes",
                 "peak_allocated_bytes", "ooms"]


def ray_address():
    address = os.environ.get("ALLOCVIEW_RAY_ADDRESS")
    if not address:
        if os.environ.get("ALLOCVIEW_REQUIRE_TEST_INPUTS") == "1":
            pytest.fail("ALLOCVIEW_RAY_ADDRESS is not set: start a Ray cluster (see .ci/run)")
        pytest.skip("no Ray cluster (ALLOCVIEW_RAY_ADDRESS)")
    return address


def shared_traces() -> pathlib.Path:
    path = REPO.parent / "shared" / "data" / "traces"
    if not path.is_dir():
        if os.environ.get("ALLOCVIEW_REQUIRE_TEST_INPUTS") == "1":
            pytest.fail(f"{path} is missing")
        pytest.skip(f"{path} is missing")
    return path


def cli(command: str, path: pathlib.Path) -> dict:
    args = [allocview_bin(), command, str(path), "--json"]
    if command == "compare":
        args[3:3] = ["--policy", ",".join(FLEET_POLICIES)]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    address = ray_address()
    root = tmp_path_factory.mktemp("fleet")
    manifest = generate.generate(root / "traces", shared_traces(), REPO / "sample-traces",
                                 allocview_bin())
    totals = job.run(root / "traces", root / "out", address=address)
    print("fleet totals:", json.dumps(totals))
    return root, manifest, totals


def single_machine(root: pathlib.Path, manifest: dict) -> dict:
    """`compare --json` and `stats --json` of what each fleet trace is made of: its base (a
    variant only shifts times and addresses) or, for a trace with a leak, the file itself."""
    out = {}
    for t in manifest["traces"]:
        source = (root / "traces" / f"build={t['build']}" / t["trace"] if t["leak_bytes"]
                  else root / "traces" / t["base"])
        if source not in out:
            out[source] = (cli("compare", source), cli("stats", source))
        t["expected"] = out[source]
    return out


def test_the_job_ran_on_two_nodes_over_the_whole_fleet(fleet):
    _, manifest, totals = fleet
    assert len(manifest["traces"]) >= 200
    assert totals["traces"] == len(manifest["traces"])
    assert totals["policy_rows"] == len(manifest["traces"]) * len(FLEET_POLICIES)
    assert totals["nodes"] == 2


def test_every_row_and_the_aggregate_match_single_machine_results(fleet):
    import polars as pl

    root, manifest, _ = fleet
    single_machine(root, manifest)
    out = root / "out"
    policies = pl.read_parquet(out / "policies" / "*.parquet")
    traces = pl.read_parquet(out / "traces" / "*.parquet")
    assert policies.height == len(manifest["traces"]) * len(FLEET_POLICIES)
    expected_rows = {}
    for t in manifest["traces"]:
        cmp, stats = t["expected"]
        row = traces.filter((pl.col("build") == t["build"]) & (pl.col("trace") == t["trace"]))
        assert row.height == 1, t["trace"]
        for key in ("events", "peak_live_bytes", "final_live_bytes", "mallocs", "frees"):
            assert row[key][0] == stats[key], (t["trace"], key)
        for p in cmp["policies"]:
            expected_rows[(t["build"], t["trace"], p["name"])] = p
    for r in policies.iter_rows(named=True):
        label = r["policy"] + (f":{r['setting']}" if r["setting"] else "")
        want = expected_rows[(r["build"], r["trace"], label)]
        for key in SUMMARY_EXACT:
            assert r[key] == want[key], (r["trace"], label, key)
        assert r["footprint_over_max_live"] == pytest.approx(want["footprint_over_max_live"])

    # The aggregate: DuckDB's distribution over the Ray job's Parquet, against the same
    # figures computed here from the single-machine results.
    dist = query.distribution(out, build="a")
    by_label = defaultdict(list)
    for (build, _, label), p in expected_rows.items():
        if build == "a":
            by_label[label].append(p)
    assert dist.height == len(FLEET_POLICIES)
    for r in dist.iter_rows(named=True):
        label = r["policy"] + (f":{r['setting']}" if r["setting"] else "")
        rows = by_label[label]
        ratios = sorted(p["footprint_over_max_live"] for p in rows)
        assert r["traces"] == len(rows)
        assert r["ratio_min"] == pytest.approx(ratios[0])
        assert r["ratio_max"] == pytest.approx(ratios[-1])
        assert r["ratio_p50"] == pytest.approx(statistics.median(ratios))
        assert r["footprint_bytes_total"] == sum(p["peak_footprint_bytes"] for p in rows)
        assert r["ooms"] == sum(p["ooms"] for p in rows)

    # Where a setting helps most: the largest saving over the same policy's defaults.
    helps = query.setting_helps(out, build="a", top=5)
    savings = []
    for (build, trace, label), p in expected_rows.items():
        name, _, setting = label.partition(":")
        if build == "a" and setting:
            default = expected_rows[(build, trace, name)]
            savings.append(default["peak_footprint_bytes"] - p["peak_footprint_bytes"])
    assert helps["saved_bytes"][0] == max(savings) > 0


def test_peak_grew_finds_exactly_the_leaks(fleet):
    _, manifest, _ = fleet
    grew = query.peak_grew(fleet[0] / "out", before="a", after="b")
    leaks = {t["trace"]: t["leak_bytes"] for t in manifest["traces"] if t["leak_bytes"]}
    assert leaks
    assert dict(zip(grew["trace"].to_list(), grew["grown_bytes"].to_list())) == leaks


def test_sampled_variants_equal_their_own_cli_results(fleet):
    """The variants are checked against their base above; a sample is also run whole by the
    CLI here, so the shift-invariance the base check relies on is itself checked."""
    import polars as pl

    root, manifest, _ = fleet
    policies = pl.read_parquet(root / "out" / "policies" / "*.parquet")
    for t in random.Random(18).sample(manifest["traces"], 6):
        path = root / "traces" / f"build={t['build']}" / t["trace"]
        for p in cli("compare", path)["policies"]:
            name, _, setting = p["name"].partition(":")
            row = policies.filter((pl.col("build") == t["build"]) & (pl.col("trace") == t["trace"])
                                  & (pl.col("policy") == name) & (pl.col("setting") == setting))
            assert row["peak_footprint_bytes"][0] == p["peak_footprint_bytes"], t["trace"]


def test_the_job_reads_and_writes_through_uris(fleet):
    """The object-store path (pyarrow's filesystems; `file://` here, `s3://` in production):
    each trace is downloaded by its worker and each part put under the output URI, with the
    same rows as the run over the directory."""
    import polars as pl

    root, manifest, _ = fleet
    totals = job.run(f"file://{root / 'traces'}", f"file://{root / 'out-uri'}",
                     address=ray_address())
    assert totals["traces"] == len(manifest["traces"])
    timing = ["seconds", "load_seconds", "events_per_second"]
    for table in ("traces", "policies"):
        keys = ["build", "trace"] + (["policy", "setting"] if table == "policies" else [])
        a, b = (pl.read_parquet(root / out / table / "*.parquet").drop(timing, strict=False)
                .sort(keys) for out in ("out", "out-uri"))
        assert a.equals(b), table
    grew = query.peak_grew(f"file://{root / 'out-uri'}")
    assert grew.height == sum(1 for t in manifest["traces"] if t["leak_bytes"])


def test_real_allocator_rows_run_on_the_workers(tmp_path):
    """A small job of its own: real rows are measurements, so they are checked against the CLI's
    within 10% (two processes' pages differ a little), not exactly."""
    import shutil

    import polars as pl

    address = ray_address()
    fleet_dir = tmp_path / "fleet" / "build=a"
    fleet_dir.mkdir(parents=True)
    names = ["find_usr_include.trace.gz", "python_fragments.trace.gz"]
    for name in names:
        shutil.copy(REPO / "sample-traces" / name, fleet_dir / name)
    policies = ["glibc", "real-jemalloc:threads=one"]
    job.run(tmp_path / "fleet", tmp_path / "out", policies=policies, address=address)
    rows = pl.read_parquet(tmp_path / "out" / "policies" / "*.parquet")
    # real-glibc comes with any real row: the allocator a recorded program used.
    assert rows.height == len(names) * 3
    for name in names:
        args = [allocview_bin(), "compare", str(fleet_dir / name), "--json", "--policy",
                ",".join(policies)]
        want = {p["name"]: p for p in json.loads(subprocess.run(
            args, check=True, capture_output=True, text=True).stdout)["policies"]}
        got = rows.filter(pl.col("trace") == name)
        for r in got.iter_rows(named=True):
            label = r["policy"] + (f":{r['setting']}" if r["setting"] else "")
            w = want[label]
            if label == "glibc":
                assert r["peak_rss_bytes"] is None
                assert r["peak_footprint_bytes"] == w["peak_footprint_bytes"]
                continue
            assert r["env"] == w["env"]
            assert r["peak_rss_bytes"] == r["peak_footprint_bytes"]
            tolerance = max(w["peak_rss_bytes"] // 10, 128 << 10)
            assert abs(r["peak_rss_bytes"] - w["peak_rss_bytes"]) <= tolerance, (name, label)
