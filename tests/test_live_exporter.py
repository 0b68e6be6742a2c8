"""The derived-metrics exporter, scraped over real loopback HTTP, against values recomputed from the store."""

from __future__ import annotations

import math

import numpy as np
import pytest
import requests

from acceptscope.live.driver import DriveConfig, load_prompts
from acceptscope.live.exporter import MetricsExporter, run_metrics
from acceptscope.live.prometheus_scrape import parse_metrics
from acceptscope.live.session import run_sglang_audit
from acceptscope.store import Store
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("exp") / "e.duckdb"
    with FakeSGLangServer(FakeConfig(mode="compact", gamma=4, seed=5)) as c, \
         FakeSGLangServer(FakeConfig(mode="cap-accept", gamma=4, seed=6, components=("core", "reqs", "step_cpu_time", "step_gpu_time"))) as a:
        run_sglang_audit(path, load_prompts("gsm8k", 10), urls={"compact": c.url, "cap-accept": a.url},
                         drive=DriveConfig(base_url="http://127.0.0.1", run_id="", concurrency=(5,), max_new_tokens=40,
                                           temperature=0.7, loopback_only=True),
                         audit_group="x", capture_defaults={"poll_interval_s": 0.1, "scrape_metrics": False})
    return str(path)


def _scrape(url):
    r = requests.get(url, timeout=10)
    r.raise_for_status()
    out = {}
    for s in parse_metrics(r.text, prefix="acceptscope_"):
        out[(s.name, s.labels)] = s.value
    return out


def _get(m, name, **labels):
    hits = [v for (n, lab), v in m.items() if n == name and all(dict(lab).get(k) == v2 for k, v2 in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_exporter_serves_derived_metrics(db):
    store = Store(db, read_only=True)
    with MetricsExporter(db, 0, refresh_s=0.0) as ex:
        assert ex.url.startswith("http://127.0.0.1:")
        m = _scrape(ex.url)
    cap, comp = "x-cap-accept", "x-compact"
    # realized accept length = mean acc_len, recomputed independently with SQL
    real = store.query_df("SELECT run_id, avg(acc_len) a, sum(correct_drafts)/sum(\"window\") r FROM request_steps GROUP BY run_id").set_index("run_id")
    for run in (cap, comp):
        assert _get(m, "acceptscope_realized_accept_length", run_id=run) == pytest.approx(real.loc[run, "a"])
        assert _get(m, "acceptscope_in_window_accept_rate", run_id=run) == pytest.approx(real.loc[run, "r"])
    # cap-accept: the ceiling is exact per row; the point is its mean (+1 bonus)
    exact = store.query_df(f"SELECT avg(ceiling) + 1 c FROM request_steps WHERE run_id = '{cap}'")["c"][0]
    assert _get(m, "acceptscope_ceiling_accept_length", run_id=cap, method="exact", bound="point") == pytest.approx(exact)
    lo, hi = (_get(m, "acceptscope_ceiling_accept_length", run_id=cap, method="exact", bound=b) for b in ("lo", "hi"))
    assert lo < exact < hi
    # compact: identification bounds bracket the imputed point; realized never exceeds the ceiling bound
    clo, cpt, chi = (_get(m, "acceptscope_ceiling_accept_length", run_id=comp, method="bounds", bound=b) for b in ("lo", "point", "hi"))
    assert clo <= cpt <= chi and real.loc[comp, "a"] == pytest.approx(clo)
    # and the estimators package's hazard model, fit on the cap-accept run of the same audit group
    hlo, hpt, hhi = (_get(m, "acceptscope_ceiling_accept_length", run_id=comp, method="hazard", bound=b) for b in ("lo", "point", "hi"))
    assert hlo <= hpt <= hhi and clo <= hpt <= chi
    assert 0 < _get(m, "acceptscope_utilization", run_id=comp, method="hazard", bound="point") <= 1
    u = _get(m, "acceptscope_utilization", run_id=cap, method="exact", bound="point")
    assert 0 < u <= 1 and u == pytest.approx(real.loc[cap, "a"] / exact)
    # calibration only where labels are uncensored (cap-accept), per position and overall
    assert {dict(l)["position"] for (n, l) in m if n == "acceptscope_calibration_ece" and dict(l)["run_id"] == cap} == {"0", "1", "2", "3", "all"}
    assert not [1 for (n, l) in m if n == "acceptscope_calibration_ece" and dict(l)["run_id"] == comp]
    # cost model: vs CPU inter-step time, and vs GPU time when that component was recorded
    assert _get(m, "acceptscope_cost_model_error_ms", run_id=cap, vs="step_cpu_ms") > 0
    assert _get(m, "acceptscope_cost_model_error_ms", run_id=cap, vs="step_gpu_ms") > 0
    n_steps = store.query_df(f"SELECT count(*) n FROM steps WHERE run_id = '{cap}'")["n"][0]
    assert _get(m, "acceptscope_rows", run_id=cap, table="steps") == n_steps
    assert _get(m, "acceptscope_exporter_errors_total") == 0


def test_exporter_is_loopback_only_and_survives_a_missing_db(tmp_path):
    with pytest.raises(ValueError, match="loopback"):
        MetricsExporter("x.duckdb", 0, host="0.0.0.0")
    with MetricsExporter(str(tmp_path / "absent.duckdb"), 0, refresh_s=0.0) as ex:
        m = _scrape(ex.url)
    assert _get(m, "acceptscope_exporter_errors_total") >= 1  # served, with the failure counted


def test_run_metrics_compact_bounds_by_hand():
    import pandas as pd

    g = 4
    rs = pd.DataFrame({
        "acc_len": [3, 2, 5], "correct_drafts": [2, 1, 4], "window": [2, 3, 4], "cap_trim": [0, 0, 0],
        "ceiling": [None, None, None],
        "confidence": [[0.9, 0.9, 0.5, 0.5], [0.9, 0.5, 0.5, 0.5], [0.9, 0.9, 0.9, 0.9]],
        "survival": [None] * 3,
    })
    m = run_metrics(rs, "compact", g)
    # row 0: window fully accepted with 2 trimmed drafts -> [3, 5], tail 0.5 + 0.25
    # row 1: rejection inside the window -> exact 2; row 2: w == gamma -> exact 5
    c = m["ceiling"]["bounds"]
    assert c["lo"] == pytest.approx((3 + 2 + 5) / 3)
    assert c["hi"] == pytest.approx((5 + 2 + 5) / 3)
    assert c["point"] == pytest.approx((3.75 + 2 + 5) / 3)
    assert m["realized"] == pytest.approx(10 / 3) and math.isclose(m["in_window_accept_rate"], 7 / 9)
    assert m["utilization"]["bounds"]["point"] == pytest.approx((10 / 3) / c["point"])
    assert np.isfinite(m["utilization"]["bounds"]["lo"])
