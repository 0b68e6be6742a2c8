"""The streaming estimator pass (estimators.stream) and the request-keyed bootstrap (estimators.bootstrap)."""

import json

import numpy as np
import pandas as pd
import pytest

from acceptscope.store import Store
from estimators.frame import NO_WORKLOAD
from estimators import run_all, to_jsonable
from estimators.bootstrap import aggregate_stats, poisson_weights, request_keys, request_stats
from estimators.stream import run_all_stream
from estimators.synthetic import compact_view, simulate


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("stream") / "s.duckdb")
    st.append(simulate(n_requests=60, seed=1).tables)  # syn-cap: truth
    t = dict(simulate(n_requests=50, seed=2, run_id="syn-c").tables)
    rs = compact_view(t["request_steps"])
    rs.loc[rs.rid.isin(["r3", "r7"]), "workload"] = None  # a NULL workload is a group of its own
    t["request_steps"], t["runs"] = rs, t["runs"].assign(arm="compact")
    st.append(t)
    return st


def _drop_timings(j):
    j = json.loads(json.dumps(j))
    j.get("calibration", {}).pop("fit_seconds", None)
    return j


def test_stream_equals_in_memory_and_does_not_depend_on_chunking(store):
    whole = run_all_stream(store, n_boot=40, chunk_rows=1 << 20)
    small = run_all_stream(store, n_boot=40, chunk_rows=250)  # several chunks per run
    for rid in ("syn-cap", "syn-c"):
        mem = to_jsonable(run_all(store, rid, n_boot=40))
        a, b = to_jsonable(whole[rid]), to_jsonable(small[rid])
        assert a["tail"]["aggregate"] == mem["tail"]["aggregate"]
        pd.testing.assert_frame_equal(pd.DataFrame(b["tail"]["aggregate"]), pd.DataFrame(a["tail"]["aggregate"]),
                                      check_exact=False, rtol=1e-12)  # 250-row chunks: the same intervals
        assert a["tail"]["summary"]["n_censored"] == mem["tail"]["summary"]["n_censored"] > 0
        assert _drop_timings(a)["calibration"] == _drop_timings(mem)["calibration"]
        ra, rb = whole[rid]["tail"].aggregate(by="workload", n_boot=60, target="population"), \
            small[rid]["tail"].aggregate(by="workload", n_boot=60, target="population")
        pd.testing.assert_frame_equal(ra, rb, check_exact=False, rtol=1e-12)
        ua = pd.DataFrame(a["utilization"]["by_group"]).set_index(["by", "group"])
        um = pd.DataFrame(mem["utilization"]["by_group"]).set_index(["by", "group"])
        common = um.index.intersection(ua.index)
        assert len(common) >= 3
        pd.testing.assert_frame_equal(ua.loc[common], um.loc[common], check_exact=False, rtol=1e-9)
    agg = small["syn-c"]["tail"].aggregate(by="workload", n_boot=40)
    assert NO_WORKLOAD in set(agg.workload) and (agg.lo <= agg.mean_ceiling).all() and (agg.mean_ceiling <= agg.hi).all()
    assert any("chunks of whole requests" in n for n in small["syn-c"]["tail"].notes)


def test_bootstrap_draws_are_keyed_by_request_not_position():
    k = request_keys(["run"] * 4, ["a", "b", "c", "d"])
    assert np.array_equal(poisson_weights(k, 3, seed=5)[::-1], poisson_weights(k[::-1], 3, seed=5))
    w = np.concatenate([poisson_weights(request_keys(["r"] * 20000, [f"q{i}" for i in range(20000)]), i) for i in range(3)])
    assert abs(w.mean() - 1) < 0.02 and abs(w.var() - 1) < 0.05  # Poisson(1)
    b = pd.DataFrame({"run_id": "r", "rid": np.repeat([f"q{i}" for i in range(50)], 3),
                      "workload": np.tile(["x", "y", None], 50), "mean": np.linspace(0, 3, 150),
                      "var": 0.1, "censored": True})
    shuffled = b.sample(frac=1.0, random_state=0)
    a1 = aggregate_stats(request_stats(b, ["workload"]), ["workload"], n_boot=80, target="population")
    a2 = aggregate_stats(request_stats(shuffled, ["workload"]), ["workload"], n_boot=80, target="population")
    pd.testing.assert_frame_equal(a1, a2, check_exact=False, rtol=1e-12)
    assert a1.workload.tolist() == ["None", "x", "y"] and (a1.hi > a1.lo).all()
