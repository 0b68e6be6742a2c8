"""Validation harness, utilization, the run_all facade, docstring examples and the CLI commands."""

from __future__ import annotations

import doctest
import importlib
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.store import Store
from estimators.synthetic import simulate
from estimators.utilization import utilization
from estimators.validation import batch_band, validate

MODULES = ["estimators", "estimators.frame", "estimators.synthetic", "estimators.hazard", "estimators.tail",
           "estimators.bracket", "estimators.validation", "estimators.calibration", "estimators.calibration_metrics",
           "estimators.utilization", "estimators.cost", "estimators.planner"]


@pytest.mark.parametrize("name", MODULES)
def test_module_docstring_examples_run(name):
    mod = importlib.import_module(name)
    r = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert r.attempted > 0 or name in ("estimators.frame",), f"{name} has no runnable example"
    assert r.failed == 0


def test_validation_targets_on_synthetic():
    sim = simulate(n_requests=700, seed=61)
    t = sim.tables
    v = validate(t["request_steps"], steps=t["steps"], n_boot=100, hazard_boot=10,
                 jsonl=dict(rows=t["estimator_rows"], gather=t["estimator_gather"], eos=t["estimator_eos"]))
    pm = v.per_mode.set_index("mode")
    assert pm.loc["greedy", "resolved_exact"] == pm.loc["greedy", "n_resolved"] > 100
    for m in ("logprob", "confidence"):
        assert pm.loc[m, "n_blocks"] - pm.loc[m, "n_resolved"] > 800
        assert 0.86 <= pm.loc[m, "cov90_unresolved"] <= 0.94
        assert 0.76 <= pm.loc[m, "cov80_unresolved"] <= 0.84
    assert v.aggregate.covers.mean() >= 0.7  # 95% aggregate intervals (8 groups)
    b = v.bracket.iloc[0]
    assert b.source == "estimator JSONL" and b.our_width < b.sglang_width and b.our_covers
    assert b.block_cover_rate_ours90 > b.block_cover_rate_sglang
    json.dumps(v.to_json(), default=str)
    assert len(v.figure().data) > 0


def test_utilization_exact_hand_numbers():
    sim = simulate(n_requests=80, seed=62)
    rs = sim.tables["request_steps"]
    u = utilization(rs, steps=sim.tables["steps"])
    run = u.by_group[u.by_group.by == "run"].iloc[0]
    assert np.isclose(run.utilization, (rs.correct_drafts + 1).sum() / (rs.ceiling + 1).sum())
    assert np.isclose(run.in_window_accept_rate, rs.correct_drafts.sum() / rs.window.sum())
    assert np.isclose(run.spec_accept_rate, rs.correct_drafts.sum() / (len(rs) * 7))
    assert set(u.windows.workload) == set(rs.workload)
    assert len(u.figure().data) > 0
    assert list(batch_band([1, 8, 9, 64, 65, 500])) == ["1-8", "1-8", "9-16", "33-64", "65-128", ">128"]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    p = tmp_path_factory.mktemp("est") / "t.duckdb"
    st = Store(p)
    sim = simulate(n_requests=100, seed=63)
    st.append(sim.tables)
    from estimators.synthetic import compact_view

    comp = compact_view(sim.tables["request_steps"], run_id="syn-compact")
    runs = sim.tables["runs"].assign(run_id="syn-compact", arm="compact")
    st.append({"runs": runs, "request_steps": comp, "steps": sim.tables["steps"].assign(run_id="syn-compact")})
    # the SPS table the simulated planner used, recorded like an ingested SGLang table
    t = sim.sps_table
    long = [dict(table_hash="h", kind="additive", component="bias_seconds", probe=-1, value=t["bias_seconds"])]
    long += [dict(table_hash="h", kind="additive", component="alpha_seconds", probe=b, value=v)
             for b, v in zip(t["bs_probes"], t["alpha_seconds"])]
    long += [dict(table_hash="h", kind="additive", component="theta_seconds", probe=b, value=v)
             for b, v in zip(t["m_probes"], t["theta_seconds"])]
    st.append({"sps_tables": long})
    with st.connect() as con:
        con.execute("UPDATE runs SET sps_hash = 'h'")
    return p


def test_cli_estimate_json(db):
    r = CliRunner().invoke(app, ["estimate", "--db", str(db), "--json", "--n-boot", "30"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) == {"syn-cap", "syn-compact"}
    c = out["syn-compact"]
    assert "truth runs" in " ".join(c["tail"]["summary"]["notes"])  # compact borrows hazards from the audit arm
    a = c["tail"]["aggregate"][0]
    assert a["lo"] <= a["mean_ceiling"] <= a["hi"]
    assert out["syn-cap"]["planner"]["summary"]["budget_exact_match_rate"] > 0.9
    r2 = CliRunner().invoke(app, ["estimate", "--db", str(db), "--run", "nope"])
    assert r2.exit_code == 3


def test_cli_calibrate_writes_sglang_json(db, tmp_path):
    out = tmp_path / "sts.json"
    r = CliRunner().invoke(app, ["calibrate", "--db", str(db), "--run", "syn-cap", "--out", str(out),
                                 "--method", "sequential-ece", "--n-boot", "20", "--json"])
    assert r.exit_code == 0, r.output
    from estimators.calibration import check_sglang_sts

    T = check_sglang_sts(out.read_text(), gamma=7)
    assert len(T) == 7 and json.loads(out.read_text())["acceptscope"]["method"] == "sequential-ece"
    r2 = CliRunner().invoke(app, ["calibrate", "--db", str(db), "--run", "syn-compact", "--out", str(out)])
    assert r2.exit_code == 3  # compact run: no realized label
    r3 = CliRunner().invoke(app, ["calibrate", "--db", str(db), "--run", "syn-cap", "--method", "bogus"])
    assert r3.exit_code == 2
