"""The dashboard's engines page: a native compact run and TensorRT-LLM's DSpark counters of the same blocks,
side by side (streamlit.testing, no browser): the table is identify.compare's, TensorRT-LLM's model-free bound
beside acceptscope's interval on the trim loss."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from acceptscope.estimators.synthetic import compact_view
from acceptscope.ingest.engines import ingest_engine_files
from acceptscope.ingest.engines.identify import compare
from acceptscope.estimators import run_all, to_jsonable
from acceptscope.store import Store
from tests._close import assert_close
from tests.test_ingest_engines_dspark import _sim, dspark_summary

APP = str(Path(__file__).resolve().parents[1] / "app" / "dashboard.py")


def test_engines_page_sets_trt_bound_beside_our_interval(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    t, K = _sim(seed=5, n=60)
    st = Store(tmp_path / "s.duckdb")
    st.append({**t, "request_steps": compact_view(t["request_steps"]), "runs": t["runs"].assign(arm="compact")})
    s, _ = dspark_summary(t["request_steps"], K, "compact")
    (tmp_path / "dspark.json").write_text(json.dumps({**s, "max_draft_len": K}))
    ingest_engine_files(st, [tmp_path / "dspark.json"], run_id="trt")
    monkeypatch.setenv("ACCEPTSCOPE_DB", str(tmp_path / "s.duckdb"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.multiselect(key="runs").set_value(["nat", "trt"]).run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Engines side by side" in [h.value for h in at.header]
    tables = [d.value for d in at.dataframe if "trim_loss_bound_lo" in d.value.columns]
    assert len(tables) == 1
    shown = tables[0].set_index("run_id")
    want = compare(Store(tmp_path / "s.duckdb", read_only=True), ["nat", "trt"],
                   estimates={"nat": to_jsonable(run_all(Store(tmp_path / "s.duckdb", read_only=True), "nat"))}
                   ).set_index("run_id")
    assert set(shown.index) == {"nat", "trt"} and set(shown.engine) == {"tensorrt-llm", str(want.loc["nat", "engine"])}
    for col in ("trim_loss_bound_lo", "trim_loss_bound_hi", "trim_loss_estimate", "trim_loss_lo", "trim_loss_hi",
                "trim_regret_rate"):
        for rid in ("nat", "trt"):
            a, b = shown.loc[rid, col], want.loc[rid, col]
            if b is None or (isinstance(b, float) and np.isnan(b)):
                assert a is None or (isinstance(a, float) and np.isnan(a)), (rid, col, a)
            else:
                assert_close(float(a), float(b), rtol=1e-9)
    assert shown.loc["nat", "trim_loss_lo"] <= shown.loc["nat", "trim_loss_hi"] <= shown.loc["trt", "trim_loss_bound_hi"]
    assert any("Trim loss" in c.proto.spec for c in at.get("plotly_chart"))
