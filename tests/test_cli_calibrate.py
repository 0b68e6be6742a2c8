"""``acceptscope calibrate`` chooses by held-out score and never silently writes a table that scores
worse than the one in force (issue 31): real simulated runs in a real DuckDB store, the real CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.estimators.calibration import (METHODS, StsCalibrator, calibration_data, check_sglang_sts, choose,
                                                compare)
from acceptscope.estimators.synthetic import simulate
from acceptscope.exit_codes import EXIT_NOT_BETTER
from acceptscope.store import Store


def _in_force_temperatures() -> list[float]:
    """A table fitted on 400 other requests of the same simulated world: close to the best there is."""
    big = calibration_data(simulate(n_requests=400, seed=64).tables["request_steps"])
    return [float(t) for t in StsCalibrator("smooth-nll").fit(big.z, big.y).temperatures_]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """syn-cap: served without a table (the baseline is identity). syn-sts: served with a near-optimal
    table, recorded like an ingested SGLang STS table linked to its run."""
    p = tmp_path_factory.mktemp("cal") / "t.duckdb"
    st = Store(p)
    st.append(simulate(n_requests=100, seed=63).tables)
    T = _in_force_temperatures()
    sim = simulate(n_requests=100, seed=63, sts_temperatures=T, run_id="syn-sts")
    st.append(sim.tables)
    st.append({"sts_tables": [dict(table_hash="sts-1", position=k, temperature=t, dataset="syn", num_samples=1)
                              for k, t in enumerate(T)]})
    with st.connect() as con:
        con.execute("UPDATE runs SET sts_hash = 'sts-1' WHERE run_id = 'syn-sts'")
    return p, T


def _run(*args: str, columns: int = 80):
    return CliRunner().invoke(app, ["calibrate", *args], env={"COLUMNS": str(columns)})


def test_auto_picks_the_best_held_out_fit_and_says_so(db, tmp_path):
    p, _ = db
    out = tmp_path / "sts.json"
    r = _run("--db", str(p), "--run", "syn-cap", "--out", str(out), "--n-boot", "20", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    cmp = res["comparison"]
    scores = {row["method"]: row["ece"] for row in cmp["rows"]}
    assert set(scores) == {"identity", *METHODS} and cmp["baseline"] == "identity"
    assert res["method"] == cmp["best"] == min(METHODS, key=scores.get)
    assert cmp["better"] and res["written"] and scores[res["method"]] <= scores["identity"]
    assert [row["ece"] for row in cmp["rows"]] == sorted(scores.values())  # ranked by the choosing score
    T = check_sglang_sts(out.read_text(), gamma=7)
    assert T == pytest.approx(res["temperatures"])
    meta = json.loads(out.read_text())["acceptscope"]
    assert meta["method"] == res["method"] and meta["chosen_by"]["baseline"] == "identity"


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_refuses_a_fit_worse_than_the_table_in_force(db, tmp_path, columns):
    p, T = db
    out = tmp_path / "next.json"
    r = _run("--db", str(p), "--run", "syn-sts", "--out", str(out), "--n-boot", "20", columns=columns)
    assert r.exit_code == EXIT_NOT_BETTER, r.output
    assert not out.exists()
    lines = [ln for ln in r.output.splitlines() if ln.startswith("not written:")]
    assert len(lines) == 1 and "worse than the table in force" in lines[0] and "--force" in lines[0]
    assert "in-force" in r.output and "identity" in r.output  # the comparison is printed


def test_json_carries_the_comparison_and_force_writes(db, tmp_path):
    p, T = db
    out = tmp_path / "next.json"
    r = _run("--db", str(p), "--run", "syn-sts", "--out", str(out), "--n-boot", "20", "--json")
    assert r.exit_code == EXIT_NOT_BETTER
    res = json.loads(r.stdout)
    assert res["written"] is False and res["out"] is None and not out.exists()
    cmp = res["comparison"]
    assert cmp["baseline"] == "in-force" and not cmp["better"] and cmp["best_score"] > cmp["baseline_score"]
    assert res["in_force"] == pytest.approx(T)
    forced = _run("--db", str(p), "--run", "syn-sts", "--out", str(out), "--n-boot", "20", "--force", "--json")
    assert forced.exit_code == 0, forced.output
    doc = json.loads(forced.stdout)
    assert doc["written"] and doc["verdict"].startswith("written under --force")
    assert check_sglang_sts(out.read_text(), gamma=7) == pytest.approx(doc["temperatures"])


def test_choose_ranks_every_table_and_names_the_baseline():
    """The estimator half: every scored table ranked by the choosing score, the best fit named, and the
    table in force (here one fitted on the scoring split itself) as the baseline it is held against."""
    d = calibration_data(simulate(n_requests=80, seed=5).tables["request_steps"])
    tr, te = d.split(seed=1)
    on_test = StsCalibrator("smooth-nll").fit(te.z, te.y).temperatures_
    res = compare(tr, te, n_boot=10, seed=0, extra_fits={"in-force": on_test})
    c = choose(res, METHODS, "nll")
    assert c["baseline"] == "in-force" and c["best"] in METHODS
    nll = {row["method"]: row["nll"] for row in c["rows"]}
    assert c["best_score"] == pytest.approx(min(nll[m] for m in METHODS))
    assert c["better"] == (c["best_score"] <= c["baseline_score"])
    assert np.all(np.diff([row["nll"] for row in c["rows"]]) >= 0)
    with pytest.raises(ValueError, match="score must be one of"):
        choose(res, METHODS, "auroc")
