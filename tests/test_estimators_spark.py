"""The estimators on Spark (local[2]) over an exported lake equal ``estimate --db`` on the same runs.

Two lakes, each exported by ``acceptscope export`` from a real store: a reference-engine capture
(the shipped model pair, a compact and a cap-accept arm; the compact run's id looks numeric, so
the pinned partition types matter) and the SGLang fixtures ingested by ``acceptscope ingest``.
One SparkSession for the module; small data, two shuffle partitions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("pyspark")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning:pyspark")

from acceptscope.cli import app  # noqa: E402
from acceptscope.domain.locations import REPO_ROOT  # noqa: E402
from acceptscope.engine import EngineConfig, run_engine  # noqa: E402
from acceptscope.store import Store  # noqa: E402
from acceptscope.estimators.spark import LAKE_NO_HEALTH  # noqa: E402

FIX = REPO_ROOT / "fixtures"
RTOL = 1e-6


@pytest.fixture(scope="module")
def spark():
    from acceptscope.estimators.spark import spark_session

    s = spark_session("local[2]", shuffle_partitions=2)
    yield s
    s.stop()


def _export(db: Path, lake: Path) -> None:
    res = CliRunner().invoke(app, ["export", "--all", "--parquet", str(lake), "--db", str(db)])
    assert res.exit_code == 0, res.output


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref")
    db = root / "ref.duckdb"
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for arm, rid in (("compact", "0100"), ("cap-accept", "ref-cap")):
            run_engine(EngineConfig(arm=arm, target=str(FIX / "models" / "target"), drafter=str(FIX / "models" / "drafter"),
                                    workload="mixed", num_requests=32, max_new_tokens=32, max_running_requests=32,
                                    temperature=1.0, db=str(db), run_id=rid, threads=1, audit_group="g1"))
    finally:
        torch.set_num_threads(old)
    _export(db, root / "lake")
    return db, root / "lake"


@pytest.fixture(scope="module")
def sgl(tmp_path_factory):
    root = tmp_path_factory.mktemp("sgl")
    db = root / "sgl.duckdb"
    res = CliRunner().invoke(app, ["ingest", str(FIX / "sglang"), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    _export(db, root / "lake")
    return db, root / "lake"


def _json(args) -> dict:
    res = CliRunner().invoke(app, ["estimate", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("{"):])


def _compare(local, spark, path="") -> tuple[float, int]:
    """Worst relative difference of the numbers of two JSON trees (and how many numbers), asserting
    the same keys, lengths, strings, flags and nulls everywhere. ``fit_seconds`` are wall-clock times."""
    if isinstance(local, dict):
        assert set(local) == set(spark), (path, set(local) ^ set(spark))
        pairs = [(local[k], spark[k], f"{path}/{k}") for k in local if k != "fit_seconds"]
    elif isinstance(local, list):
        assert len(local) == len(spark), path
        pairs = [(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(local, spark))]
    elif isinstance(local, float) and isinstance(spark, (int, float)) and not isinstance(spark, bool):
        rel = 0.0 if local == spark else abs(local - spark) / max(abs(local), abs(spark))
        assert rel <= RTOL, (path, local, spark)
        return rel, 1
    else:
        assert local == spark, (path, local, spark)
        return 0.0, 1
    worst, n = 0.0, 0
    for a, b, p in pairs:
        w, m = _compare(a, b, p)
        worst, n = max(worst, w), n + m
    return worst, n


@pytest.mark.parametrize("which", ["ref", "sgl"])
def test_spark_estimate_equals_local(which, ref, sgl, spark):
    db, lake = ref if which == "ref" else sgl
    local = _json(["--db", str(db)])
    dist = _json(["--lake", str(lake), "--engine", "spark", "--master", "local[2]"])
    assert sorted(local) == sorted(dist) and len(local) == 2
    for rid, r in local.items():
        assert "error" not in r, (rid, r)
        # the parts the brief names are there and were estimated, not skipped
        assert {"tail", "utilization", "cost"} <= set(r), rid
        assert r["tail"]["summary"]["n_censored"] > 0, rid
    assert any("calibration" in r for r in local.values())
    for rid, r in local.items():  # interval health runs on the DuckDB store only; the lake says so
        if r.pop("interval_health", None) is not None:
            assert dist[rid]["skipped"].pop("interval_health") == LAKE_NO_HEALTH
    worst, n = _compare(local, dist)
    assert n > 300
    print(f"\n{which}: {n} JSON numbers, worst relative difference local vs spark {worst:.3g}")


def test_lake_read_as_exported_and_partitioning_does_not_matter(ref, spark):
    """Partition columns typed from the record model (a numeric-looking run id stays a string); the
    results do not depend on how requests are spread over partitions and chunks; what comes back
    from the executors is sums (a few payloads, one per partition), not request-steps."""
    from pyspark.sql.types import IntegerType, StringType

    from acceptscope.estimators import to_jsonable
    from acceptscope.estimators.spark import LakeStore, SparkTail, run_lake

    db, lake = ref
    store = LakeStore(spark, lake)
    sch = store.frame("request_steps").schema
    assert isinstance(sch["run_id"].dataType, StringType) and isinstance(sch["rank"].dataType, IntegerType)
    assert store.runs().run_id.tolist().count("0100") == 1
    n = int(Store(db).query_df("SELECT count(*) AS n FROM request_steps WHERE run_id = '0100'").n.iloc[0])
    results = []
    for parts, chunk in ((2, 1 << 16), (3, 7)):
        eng = SparkTail(store, chunk_rows=chunk)
        eng.parts = parts
        results.append(to_jsonable(run_lake(store, eng, "0100", n_boot=50, hazard_boot=5, seed=3)))
        assert 1 <= eng.stats["reduce_partitions"] <= parts
        # training positions, not request-steps: one row per position with a known outcome (at most gamma
        # per block; the run's own observed outcomes train its hazards) plus one per request
        assert eng.stats["fit_rows_collected"] < 8 * n
    worst, m = _compare(results[0], results[1])
    assert m > 200 and worst <= RTOL
    # and with the single-machine path's seeds they are its results
    from acceptscope.estimators import run_all

    local = to_jsonable(run_all(Store(db), "0100", n_boot=50, hazard_boot=5, seed=3))
    if local.pop("interval_health", None) is not None:  # the DuckDB store only (LAKE_NO_HEALTH)
        assert results[1]["skipped"].pop("interval_health") == LAKE_NO_HEALTH
    worst, m = _compare(local, results[1])
    assert m > 200


def test_sts_fit_over_the_lake_equals_calibrate(sgl, spark):
    """``acceptscope calibrate``'s final fit (smooth-nll, every sample) from per-position binned sums
    aggregated on the executors. The local fit is itself determined only to the optimizer's
    tolerance (``xatol=1e-5`` in log T): summation order alone moves it by a few 1e-6."""
    from acceptscope.estimators import load_run, sts_in_force
    from acceptscope.estimators.calibration import StsCalibrator, calibration_data
    from acceptscope.estimators.spark import LakeStore, sts_fit_lake

    db, lake = sgl
    run = next(r for r in Store(db).runs().run_id if "cap-accept" in r)
    data = load_run(Store(db), run)
    d = calibration_data(data["request_steps"], "realized", temperatures=sts_in_force(data), gamma=int(data["run"]["gamma"]))
    local = StsCalibrator("smooth-nll").fit(d.z, d.y)
    got = sts_fit_lake(LakeStore(spark, lake), run, "realized", "smooth-nll")
    assert got["num_samples"] == local.num_samples_ == len(d.z) > 100
    rel = np.abs(np.array(got["temperatures"]) / np.array(local.temperatures_) - 1)
    assert rel.max() <= 1e-5, (got["temperatures"], local.temperatures_)
    print(f"\nSTS fit over the lake: {len(rel)} temperatures from {got['cells']} cells, worst relative difference {rel.max():.3g}")
    with pytest.raises(ValueError, match="sequential-ece"):
        sts_fit_lake(LakeStore(spark, lake), run, "realized", "sequential-ece")


def test_replicate_partial_sums_add_up_to_the_aggregate():
    """The executors' per-replicate partial sums (``bootstrap.replicate_sums``) of disjoint sets of
    requests, finished by ``aggregate_from_sums`` in any order, are ``aggregate_stats`` of all the
    requests: the keyed Poisson bootstrap does not depend on the partitioning."""
    import pandas as pd

    from acceptscope.estimators.bootstrap import aggregate_from_sums, aggregate_stats, replicate_sums, request_stats, shift_sums

    rng = np.random.default_rng(1)
    n = 3000
    b = pd.DataFrame({"run_id": "r", "rid": rng.integers(0, 400, n).astype(str), "workload": rng.choice(["a", "b", None], n),
                      "mean": rng.random(n) * 3, "var": rng.random(n) * 0.3, "censored": rng.random(n) < 0.4,
                      "mode": rng.choice(["greedy", "sampled"], n), "resolved": rng.random(n) < 0.7})
    b["bound_lo"], b["bound_hi"] = b["mean"] - 0.5, b["mean"] + 0.7
    b = b.sort_values("rid", kind="stable", ignore_index=True)
    cut = b.rid.searchsorted(["150", "290"])
    pieces = (b.iloc[:cut[0]], b.iloc[cut[0]:cut[1]], b.iloc[cut[1]:])
    deltas = rng.normal(size=(5, n)) * 0.01
    for by in ([], ["workload"]):
        for target in ("run", "population"):
            sh = shift_sums(b, by, deltas)
            whole = aggregate_stats(request_stats(b, by), by, n_boot=100, target=target, seed=3, shift=sh)
            parts = [replicate_sums(request_stats(x, by), by, n_boot=100, target=target, seed=3) for x in pieces]
            assert whole["hi"].gt(whole["lo"]).all()
            pd.testing.assert_frame_equal(whole, aggregate_from_sums(parts[::-1], shift=sh), rtol=1e-12)


def test_cli_lake_errors(tmp_path):
    r = CliRunner().invoke(app, ["estimate", "--lake", str(tmp_path), "--json"])
    assert r.exit_code == 2 and "--engine" in r.output
    r = CliRunner().invoke(app, ["estimate", "--lake", str(tmp_path / "nope"), "--engine", "spark", "--json"])
    assert r.exit_code == 2 and "no such lake" in r.output


def test_registered_estimator_runs_on_the_executors(spark, ref):
    """A registered estimator (the toy of tests/test_estimator_registry.py, defined outside acceptscope) is
    shipped to the executors by value, fed their chunks and merged on the driver: its value equals the SQL."""
    import duckdb

    from acceptscope.estimators.registry import register, unregister
    from acceptscope.estimators.spark import estimate_lake
    from tests.test_estimator_registry import MeanWindow

    db, lake = ref
    register(MeanWindow)
    try:
        got = estimate_lake(lake, spark=spark, n_boot=20)
    finally:
        unregister(MeanWindow.name)
    with duckdb.connect(str(db), read_only=True) as con:
        want = dict(con.execute('SELECT run_id, avg("window") FROM request_steps GROUP BY run_id').fetchall())
    assert set(got) == set(want)
    for rid, r in got.items():
        assert abs(r[MeanWindow.name]["summary"]["mean_window"] - want[rid]) <= 1e-12 * want[rid], rid
