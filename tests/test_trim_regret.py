"""The registered trim-regret estimator (estimators.trim_regret): TensorRT-LLM's model-free rate and the
regret known to be real, with request-clustered bootstrap intervals, equal on every executor.

The store holds a cap-accept run (the ceiling recorded) and the compact view of another simulation whose
truth the test keeps: some requests' last censored step lost its bonus token and the committed token past
its window (an output cut before the bonus), so the first trimmed draft's outcome is unknown there and the
known count must bracket the truth; two requests carry no workload.
"""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.estimators import Chunk, RunInfo, Skip, registered, run_all, to_jsonable
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.stream import run_all_stream
from acceptscope.estimators.synthetic import compact_view, simulate
from acceptscope.estimators.tail import TailEstimator
from acceptscope.estimators.trim_regret import TrimRegret, TrimRegretResult
from acceptscope.figures import figure_of
from acceptscope.store import Store
from tests._close import assert_close

TOL = 1e-9


def _cut_compact(seed: int, run_id: str, n: int = 80) -> tuple[dict, pd.DataFrame]:
    """A compact run (and its cap-accept truth) whose last censored steps lost the bonus (output cut)."""
    t = dict(simulate(n_requests=n, seed=seed, run_id=run_id).tables)
    truth = t["request_steps"]
    rs = compact_view(truth)
    G = int(t["runs"].gamma.iat[0])
    w, c = rs["window"].to_numpy(), rs["correct_drafts"].to_numpy()
    last = rs.groupby("rid")["step_index"].transform("max").to_numpy() == rs["step_index"].to_numpy()
    cut = last & (c == w) & (w < G)
    assert cut.sum() >= 3
    rs["bonus_token"] = rs["bonus_token"].astype("Int64")
    rs.loc[cut, "bonus_token"] = pd.NA
    rs["committed_tokens"] = [list(x)[:wi] if k else x for x, wi, k in zip(rs["committed_tokens"], w, cut)]
    rs.loc[rs.rid.isin(["r3", "r7"]), "workload"] = None  # a NULL workload is a group of its own
    t["request_steps"], t["runs"] = rs, t["runs"].assign(arm="compact")
    return t, truth


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("trim") / "t.duckdb"
    st = Store(path)
    st.append(simulate(n_requests=60, seed=1).tables)  # syn-cap: the ceiling recorded
    t, truth = _cut_compact(4, "syn-c")
    st.append(t)
    return path, truth


@pytest.fixture(scope="module")
def results(db):
    st = Store(db[0], read_only=True)
    return {rid: to_jsonable(run_all(st, rid, n_boot=20)) for rid in ("syn-cap", "syn-c")}


def _counts(rs: pd.DataFrame, gamma: int) -> dict:
    w, c, k = (rs[x].to_numpy() for x in ("window", "correct_drafts", "ceiling"))
    regret = (c == w) & (w < gamma)
    return dict(trimmed=int((w < gamma).sum()), regret=int(regret.sum()), first=int((regret & (k > w)).sum()))


def test_registered_and_counts_are_exact(db, results):
    path, truth = db
    assert "trim_regret" in registered()
    st = Store(path, read_only=True)
    gamma = int(st.runs().set_index("run_id").loc["syn-c", "gamma"])
    # the cap-accept run: every figure from its recorded ceiling
    cap = _counts(st.query_df("SELECT * FROM request_steps WHERE run_id = 'syn-cap'"), gamma)
    s = results["syn-cap"]["trim_regret"]["summary"]
    assert (s["n_trimmed"], s["n_regret"], s["n_first_accepted"], s["n_first_unknown"]) == \
        (cap["trimmed"], cap["regret"], cap["first"], 0)
    assert s["first_accepted_bound_hi"] == pytest.approx(s["first_accepted_rate"], abs=TOL)
    # the compact run: the known count brackets the truth of the same draws, every unknown block named
    want = _counts(truth, gamma)
    s = results["syn-c"]["trim_regret"]["summary"]
    assert (s["n_trimmed"], s["n_regret"]) == (want["trimmed"], want["regret"])
    assert s["n_first_unknown"] >= 3 and s["n_first_accepted"] + s["n_first_rejected"] + s["n_first_unknown"] == s["n_regret"]
    assert s["n_first_accepted"] <= want["first"] <= s["n_first_accepted"] + s["n_first_unknown"]
    assert s["first_accepted_rate"] == pytest.approx(s["n_first_accepted"] / s["n_trimmed"], abs=TOL)
    assert any("unresolved" in n for n in results["syn-c"]["trim_regret"]["notes"])
    assert results["syn-c"]["trim_regret"]["unknown_by_reason"] == {"no_bonus": s["n_first_unknown"]}  # the cut outputs
    for rid, r in results.items():
        s = r["trim_regret"]["summary"]
        # TensorRT-LLM's point rate is the trim counters' (one definition)
        assert s["trim_regret_rate"] == pytest.approx(r["bracket"]["trim"]["trim_regret_rate"], abs=TOL)
        assert s["trim_regret_lo"] < s["trim_regret_rate"] < s["trim_regret_hi"]
        assert s["first_accepted_lo"] <= s["first_accepted_rate"] <= s["first_accepted_bound_hi"] <= s["first_accepted_hi"]


def test_workload_groups_add_up_to_the_run(results):
    rows = pd.DataFrame(results["syn-c"]["trim_regret"]["by_group"])
    run, wl = rows[rows.by == "run"].iloc[0], rows[rows.by == "workload"]
    assert len(wl) >= 3
    for c in ("n_trimmed", "n_regret", "n_first_accepted", "n_first_rejected", "n_first_unknown"):
        assert wl[c].sum() == run[c], c
    assert ((wl.trim_regret_lo <= wl.trim_regret_rate) & (wl.trim_regret_rate <= wl.trim_regret_hi)).all()


def test_in_memory_streamed_and_partitioned_merges_are_equal(db, results):
    """One chunk, 97-row chunks of the streamed scan, and partitions merged after a pickle round trip (what
    the Spark executors send back) give the same counts and intervals: the keyed replicate sums add up."""
    path, _ = db
    st = Store(path, read_only=True)
    streamed = run_all_stream(st, ["syn-cap", "syn-c"], n_boot=20, chunk_rows=97)
    for rid, mem in results.items():
        assert_close(to_jsonable(streamed[rid])["trim_regret"], mem["trim_regret"], rtol=TOL)
    rs = st.query_df("SELECT * FROM request_steps WHERE run_id = 'syn-c'")
    gamma = int(st.runs().set_index("run_id").loc["syn-c", "gamma"])
    est = TailEstimator().fit(BlockFrame.from_request_steps(st.query_df(
        "SELECT * FROM request_steps WHERE run_id = 'syn-cap'"), gamma=gamma))
    rids = sorted(rs.rid.unique())
    parts = [rids[i::3] for i in range(3)]  # requests dealt to three "executors"
    accs = []
    for p in parts[::-1]:
        acc = TrimRegret(RunInfo(run_id="syn-c", gamma=gamma, exact=False, seed=0))
        sub = rs[rs.rid.isin(p)].reset_index(drop=True)
        for chunk in np.array_split(np.array(p, dtype=object), 2):  # two chunks of whole requests each
            frame = BlockFrame.from_request_steps(sub[sub.rid.isin(chunk)].reset_index(drop=True), gamma=gamma)
            acc.add(Chunk(frame=frame, blocks=est.estimate(frame).blocks, ceiling=np.zeros(frame.n), exact=False))
        accs.append(pickle.loads(pickle.dumps(acc)))
    merged = TrimRegret(RunInfo(run_id="syn-c", gamma=gamma, exact=False, seed=0))
    for a in accs:
        merged.merge(a)
    whole = TrimRegret(RunInfo(run_id="syn-c", gamma=gamma, exact=False, seed=0))
    frame = BlockFrame.from_request_steps(rs, gamma=gamma)
    whole.add(Chunk(frame=frame, blocks=est.estimate(frame).blocks, ceiling=np.zeros(frame.n), exact=False))
    a, b = merged.result().to_json(), whole.result().to_json()
    assert_close(a, b, rtol=TOL)
    assert a["summary"]["n_regret"] == results["syn-c"]["trim_regret"]["summary"]["n_regret"]


def test_no_trimming_is_a_skip_and_the_figure_draws_both_rates(results):
    with pytest.raises(Skip, match="no trimmed blocks"):
        TrimRegret(RunInfo(run_id="static", gamma=7, exact=True, seed=0)).result()
    rows = pd.DataFrame(results["syn-c"]["trim_regret"]["by_group"])
    fig = figure_of(TrimRegretResult(rows, exact=False, n_boot=400, level=0.95, seed=0))
    assert len(fig.data) == 2 and len(fig.data[0].x) == len(rows)
    assert list(fig.data[0].y) == pytest.approx(rows.trim_regret_rate.tolist())


def test_estimate_json_and_the_report_pick_it_up(db, tmp_path):
    """No wiring of its own: the registered section of the report and estimate --json carry it."""
    path, _ = db
    res = CliRunner().invoke(app, ["estimate", "--db", str(path), "--json"])
    assert res.exit_code == 0, res.output
    import json

    out = json.loads(res.stdout[res.stdout.index("{"):])
    runs = out["runs"] if "runs" in out else out
    assert runs["syn-c"]["trim_regret"]["summary"]["n_regret"] > 0
    html = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", "--db", str(path), "--out", str(html)])
    assert res.exit_code == 0, res.output
    assert "estimators.trim_regret on" in html.read_text()


def test_spark_executors_equal_in_memory(db, results, tmp_path):
    """The lake path (``acceptscope export`` of the same store, Spark local[2]): three partitions of 64-row
    chunks each, their accumulators pickled back and merged on the driver, equal the in-memory result."""
    pytest.importorskip("pyspark")
    from acceptscope.estimators.spark import LakeStore, SparkTail, run_lake, spark_session

    lake = tmp_path / "lake"
    res = CliRunner().invoke(app, ["export", "--all", "--parquet", str(lake), "--db", str(db[0])])
    assert res.exit_code == 0, res.output
    spark = spark_session("local[2]", shuffle_partitions=2)
    try:
        store = LakeStore(spark, lake)
        for rid, mem in results.items():
            eng = SparkTail(store, chunk_rows=64)
            eng.parts = 3
            got = to_jsonable(run_lake(store, eng, rid, n_boot=20))
            assert eng.stats["reduce_partitions"] >= 2, eng.stats
            assert_close(got["trim_regret"], mem["trim_regret"], rtol=TOL)
    finally:
        spark.stop()
