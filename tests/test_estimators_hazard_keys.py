"""The logistic hazard keyed by sampling temperature and workload (issue: aggregate intervals biased
by both), its pooled fallback for levels without training data, and hazard_compatibility by temperature."""

from __future__ import annotations

import numpy as np
import pytest

from acceptscope.store import Store
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.hazard import HazardModel
from acceptscope.estimators.run_data import hazard_compatibility, hazard_runs
from acceptscope.estimators.synthetic import compact_view, simulate
from acceptscope.estimators.tail import TailEstimator

G = 4
# true logit offsets per level: at a given confidence, T = 0.7 accepts less than T = 1, and "chat"
# more than "math" (the pattern the reference engine shows with the retrained pair)
T_OFF = {0.7: -0.8, 1.0: 0.3}
W_OFF = {"chat": 0.7, "math": -0.5}


def _layout(n=24000, seed=0):
    """A training layout (what ``HazardModel._long`` returns) of sampled positions whose acceptance at
    a given confidence depends on temperature and workload: y ~ Bernoulli(sigmoid(0.2 + 1.1 x + offsets))."""
    rng = np.random.default_rng(seed)
    temp = rng.choice(list(T_OFF), n, p=[0.3, 0.7])
    wl = rng.choice(list(W_OFF), n).astype(object)
    x = rng.normal(0, 1.5, n)
    z = 0.2 + 1.1 * x + np.vectorize(T_OFF.get)(temp) + np.vectorize(W_OFF.get)(wl)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(float)
    req = np.arange(n) // 4
    return dict(row=np.arange(n), k=rng.integers(0, G, n), x=x, y=y, wt=np.ones(n), greedy=np.zeros(n, bool),
                state=np.zeros(n, np.int64), req=req, n_req=int(req.max()) + 1, temp=temp.astype(float), workload=wl)


def _level_calibration(m: HazardModel, L: dict) -> dict:
    """Mean predicted minus observed acceptance per (temperature, workload) cell of the training layout."""
    n = L["k"].size
    t = np.searchsorted(m.temps_, L["temp"]) if len(getattr(m, "temps_", ())) else None
    w = np.searchsorted(m.workloads_, L["workload"].astype(str)) if len(getattr(m, "workloads_", ())) else None
    p = 1 / (1 + np.exp(-m._linear(L["k"], L["x"], L["state"], m.coef_[False], t, w, False)))
    out = {}
    for tv in T_OFF:
        for wv in W_OFF:
            sel = (L["temp"] == tv) & (L["workload"] == wv)
            out[(tv, wv)] = float(p[sel].mean() - L["y"][sel].mean())
    assert n == sum((L["temp"] == tv).sum() for tv in T_OFF)
    return out


def test_keyed_hazard_is_calibrated_per_temperature_and_workload_where_the_pooled_one_is_not():
    L = _layout()
    keyed = HazardModel().fit_long(dict(L), "truth", G)
    pooled = HazardModel(keys=()).fit_long(dict(L), "truth", G)
    assert keyed.info_["temperatures"] == pytest.approx([0.7, 1.0]) and keyed.info_["workloads"] == ["chat", "math"]
    ck, cp = _level_calibration(keyed, L), _level_calibration(pooled, L)
    assert max(abs(v) for v in ck.values()) < 0.02, ck
    assert max(abs(v) for v in cp.values()) > 0.08, cp  # the bias the keys remove
    # pooled under-predicts chat at T = 1 and over-predicts math at T = 0.7
    assert cp[(1.0, "chat")] < -0.05 and cp[(0.7, "math")] > 0.05


def test_refit_keeps_the_levels_and_matches_a_weighted_fit():
    L = _layout(n=6000, seed=1)
    L = dict(L)
    m = HazardModel().fit_long(L, "truth", G)  # adds the level codes t, w to L
    w = np.random.default_rng(2).poisson(1.0, L["n_req"]).astype(float)
    r = m.refit(w)
    direct = HazardModel().fit_long(dict(L), "truth", G, sample_weight_by_request=w)
    # cells, states, 2 temperature and 2 workload levels (intercept and slope each), and the workload x cell
    # index intercepts (2 workloads x the G - 1 cell indices past the first)
    assert r.coef_[False].shape == m.coef_[False].shape == (2 * G + 2 * m.NSTATE + 2 * 2 + 2 * 2 + 2 * (G - 1),)
    # collinear one-hot blocks (cell, state, level intercepts): the fitted hazards are identified, the split
    # of a coefficient between blocks is the penalty's; compare the hazards on every training position
    assert r.temps_ is m.temps_ and r.workloads_ is m.workloads_
    lin = [x._linear(L["k"], L["x"], L["state"], x.coef_[False], L["t"], L["w"], False) for x in (r, direct)]
    np.testing.assert_allclose(1 / (1 + np.exp(-lin[0])), 1 / (1 + np.exp(-lin[1])), atol=2e-3)


@pytest.fixture(scope="module")
def fitted():
    sim = simulate(n_requests=150, seed=31)
    rs = sim.tables["request_steps"]
    est = TailEstimator().fit(rs)
    return est, rs


def test_unseen_temperature_and_workload_get_the_pooled_hazard_and_a_note(fitted):
    est, rs = fitted
    hm = est.hazard
    assert hm.info_["temperatures"] == pytest.approx([0.0, 1.0]) and len(hm.info_["workloads"]) == 3
    comp = compact_view(rs)
    sampled = comp[comp.temperature > 0].copy()
    frame = BlockFrame.from_request_steps(sampled, gamma=7)
    rows = np.flatnonzero(frame.censored)[:300]
    st = np.zeros((rows.size, 7), np.int64)
    seen = hm.predict(frame, rows, st)
    assert est.estimate(sampled, gamma=7).notes == list(frame.notes)  # every level trained: no hazard note
    # the same rows at an unseen temperature, in an unseen workload: logit-hazard = share-weighted mean of
    # the trained levels' (exactly: the design row of an unseen level is the levels' training shares)
    odd = sampled.assign(temperature=0.45, workload="code")
    f2 = BlockFrame.from_request_steps(odd, gamma=7)
    h_unseen = hm.predict(f2, rows, st)
    lg = lambda h: np.log(h / (1 - h))  # noqa: E731
    ts, ws = hm.shares_[False]
    assert ts[list(hm.temps_).index(1.0)] == pytest.approx(1.0)  # sampled training: all at T = 1
    per_w = [lg(hm.predict(BlockFrame.from_request_steps(sampled.assign(workload=wv), gamma=7), rows, st))
             for wv in hm.workloads_]
    # logits compared where the hazard keeps them (a hazard within 1e-9 of 1 loses the logit's digits)
    ok = np.abs(lg(h_unseen)) < 15
    np.testing.assert_allclose(lg(h_unseen)[ok], sum(s * p for s, p in zip(ws, per_w))[ok], rtol=1e-9, atol=1e-9)
    assert not np.allclose(h_unseen, seen)
    notes = est.estimate(odd, gamma=7).notes
    assert any("temperature 0.45 has no training data (trained on 0, 1)" in n for n in notes), notes
    assert any("workload code has no training data" in n for n in notes), notes


def test_binned_hazard_is_not_keyed(fitted):
    _, rs = fitted
    est = TailEstimator(hazard=HazardModel(method="binned")).fit(rs)
    assert "temperatures" not in est.hazard.info_
    notes = est.estimate(compact_view(rs).assign(temperature=0.45), gamma=7).notes
    assert not any(n.startswith("hazard:") for n in notes), notes


def _run(temperature, greedy_frac, run_id, seed):
    sim = simulate(n_requests=40, seed=seed, temperature=temperature, greedy_frac=greedy_frac, run_id=run_id)
    return {k: sim.tables[k] for k in ("runs", "request_steps", "requests", "steps")}


def test_hazard_compatibility_matches_temperatures_not_greedy_share(tmp_path):
    st = Store(tmp_path / "c.duckdb")
    st.append(_run(1.0, 0.8, "cap-t1-mostly-greedy", 1))
    st.append(_run(1.0, 0.0, "cap-t1", 2))
    st.append(_run(0.7, 0.0, "cap-t07", 3))
    with st.connect() as con:
        con.execute("UPDATE runs SET audit_group = 'a'")
    # greedy shares 0.8 vs 0 once made these incompatible; the hazard is keyed by temperature now
    assert hazard_compatibility(st, "cap-t1", "cap-t1-mostly-greedy") == []
    bad = hazard_compatibility(st, "cap-t07", "cap-t1")
    assert bad == ["temperature 0.7 of cap-t07 has no training data in cap-t1 (it served 1)"], bad
    # the greedy requests of the mixed run have no greedy training data in the all-sampled one
    assert hazard_compatibility(st, "cap-t1-mostly-greedy", "cap-t1") == [
        "temperature 0 of cap-t1-mostly-greedy has no training data in cap-t1 (it served 1)"]
    with pytest.raises(ValueError, match="temperature 0.7 of cap-t07 has no training data"):
        hazard_runs(st, "cap-t07", 7, hazards_from="cap-t1")


def test_validation_cli_refuses_an_unknown_hazard_key(capsys):
    from acceptscope.estimators.validation import main

    with pytest.raises(SystemExit) as e:
        main(["--hazard-keys", "temperature,prompt", "missing.duckdb"])
    assert e.value.code == 2 and "unknown key(s) ['prompt']" in capsys.readouterr().err


def test_workload_position_learns_a_workload_specific_drop_with_depth():
    """A workload whose acceptance falls faster with the cell index than another's: the workload x cell-index
    intercepts recover it (the additive model cannot), the matrix-free prediction equals the design's, an
    unseen workload gets the share-weighted (pooled) term, and one workload adds no columns."""
    L = _layout(n=30000, seed=3)
    drop = np.where(L["workload"] == "math", -0.6, 0.0) * L["k"]  # math: -0.6 logits per cell index
    z = 0.2 + 1.1 * L["x"] + np.vectorize(T_OFF.get)(L["temp"]) + np.vectorize(W_OFF.get)(L["workload"]) + drop
    L["y"] = (np.random.default_rng(4).random(z.size) < 1 / (1 + np.exp(-z))).astype(float)
    fits = {wp: HazardModel(workload_position=wp).fit_long(dict(L), "truth", G) for wp in (False, True)}
    m = fits[True]
    T = m._train
    assert m._nwkcol() == 2 * (G - 1)
    lin = m._linear(T["k"], T["x"], T["state"], m.coef_[False], T["t"], T["w"], False)
    X = m._design(T["k"], T["x"], T["state"], T["t"], T["w"], False)
    np.testing.assert_allclose(lin, X @ m.coef_[False], rtol=1e-9, atol=1e-9)
    unseen = m._linear(T["k"], T["x"], T["state"], m.coef_[False], T["t"], None, False)
    np.testing.assert_allclose(unseen, m._design(T["k"], T["x"], T["state"], T["t"], None, False) @ m.coef_[False],
                               rtol=1e-9, atol=1e-9)
    # calibration per (workload, cell index): the additive model misses math's drop at the deepest cell
    for wp, fit in fits.items():
        p = 1 / (1 + np.exp(-fit._linear(T["k"], T["x"], T["state"], fit.coef_[False], T["t"], T["w"], False)))
        deep = (T["k"] == G - 1) & (L["workload"] == "math")
        err = abs(float(p[deep].mean() - L["y"][deep].mean()))
        assert (err < 0.02) if wp else (err > 0.03)
    one = dict(L, workload=np.full(L["k"].size, "chat", dtype=object))
    assert HazardModel(workload_position=True).fit_long(one, "truth", G)._nwkcol() == 0
