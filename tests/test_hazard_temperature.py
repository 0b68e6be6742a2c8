"""The continuous temperature term of the logistic hazard (issue 28): a temperature between trained ones
is interpolated, one outside the trained range is clamped with a note, greedy rows carry no temperature
term, and the fast paths (prediction without a design matrix, deduplicated design rows) match the
design. Measured against the one-hot levels in docs/hazard.md (bench/hazard_temperature.py)."""

from __future__ import annotations

import numpy as np
import pytest

from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.hazard import HazardModel
from acceptscope.estimators.synthetic import compact_view, simulate
from acceptscope.estimators.tail import TailEstimator

G = 4


def _z(temp, x):
    """True logit: acceptance at a given confidence rises linearly with temperature (and its slope too)."""
    return -0.4 + 2.0 * (temp - 0.7) + (1.0 + 0.5 * (temp - 0.7)) * x


def _layout(temps, n=30000, seed=0):
    """A training layout (what ``HazardModel._long`` returns) of sampled positions at ``temps``."""
    rng = np.random.default_rng(seed)
    temp = rng.choice(temps, n)
    x = rng.normal(0, 1.5, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-_z(temp, x)))).astype(float)
    req = np.arange(n) // 4
    return dict(row=np.arange(n), k=rng.integers(0, G, n), x=x, y=y, wt=np.ones(n), greedy=np.zeros(n, bool),
                state=np.zeros(n, np.int64), req=req, n_req=int(req.max()) + 1, temp=temp.astype(float),
                workload=np.full(n, "chat", object))


def _predict(m: HazardModel, temp: float, x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Hazards of sampled positions at one temperature through the model's own codes."""
    n = x.size
    if m.temperature_model == "continuous":
        t = m._tau(np.full(n, temp))
    else:
        i = np.flatnonzero(np.isclose(m.temps_, temp))
        t = np.full(n, i[0] if i.size else len(m.temps_))
    return 1 / (1 + np.exp(-m._linear(k, x, np.zeros(n, np.int64), m.coef_[False], t, np.zeros(n, np.int64), False)))


def test_a_temperature_between_trained_ones_is_interpolated_where_levels_pool():
    L = _layout([0.5, 0.7, 0.9])
    cont = HazardModel(temperature_model="continuous").fit_long(dict(L), "truth", G)
    lev = HazardModel(temperature_model="levels").fit_long(dict(L), "truth", G)
    assert cont.info_["temperature_range"] == pytest.approx([0.5, 0.9])
    assert cont.info_["temperature_model"] == "continuous" and lev.info_["temperature_model"] == "levels"
    rng = np.random.default_rng(5)
    x, k = rng.normal(0, 1.5, 20000), rng.integers(0, G, 20000)
    for t in (0.6, 0.8):  # never trained on
        truth = 1 / (1 + np.exp(-_z(t, x)))
        err_c = np.abs(_predict(cont, t, x, k) - truth).mean()
        err_l = np.abs(_predict(lev, t, x, k) - truth).mean()  # unseen level: the pooled hazard
        assert err_c < 0.02, (t, err_c)
        assert err_l > 2 * err_c, (t, err_l, err_c)
    # monotone in temperature between the trained ones, as the truth is
    means = [_predict(cont, t, x, k).mean() for t in (0.5, 0.6, 0.7, 0.8, 0.9)]
    assert np.all(np.diff(means) > 0), means


def test_linear_matches_the_design_and_cells_dedupe():
    L = _layout([0.5, 0.7, 0.9], n=8000, seed=1)
    L["greedy"] = L["greedy"].copy()
    L["greedy"][:1000] = True
    L["temp"] = np.where(L["greedy"], 0.0, L["temp"])
    for pos in (False, True):
        m = HazardModel(temperature_model="continuous", temperature_position=pos).fit_long(dict(L), "truth", G)
        T = m._train
        assert m._ncoef() == 2 * (G + m.NSTATE + 1) + 2 + (G - 1 if pos else 0)
        for g in (False, True):
            s = T["greedy"] == g
            X = m._design(T["k"][s], T["x"][s], T["state"][s], T["tau"][s], T["w"][s], g)
            lin = m._linear(T["k"][s], T["x"][s], T["state"][s], m.coef_[g], T["tau"][s], T["w"][s], g)
            np.testing.assert_allclose(lin, X @ m.coef_[g], rtol=1e-9, atol=1e-9)
            o = 2 * G + 2 * m.NSTATE
            if g:  # greedy rows: no temperature term
                assert np.all(X[:, o:o + m._ntcol()] == 0)
            else:
                assert np.unique(T["tau"][s]).size == 3 and np.abs(X[:, o:o + 2]).sum() > 0
        cells = m._logistic_cells()
        # distinct rows: the confidence is continuous here, so only the greedy share collapses; every
        # position maps to one design row and the rows reproduce the positions' designs
        mm, cell, Xc = cells[False]
        Xf = m._design(T["k"][mm], T["x"][mm], T["state"][mm], T["tau"][mm], T["w"][mm], False)
        np.testing.assert_allclose(Xc[cell], Xf, rtol=0, atol=0)


def test_refit_matches_a_weighted_fit():
    L = _layout([0.5, 0.7, 0.9], n=6000, seed=2)
    m = HazardModel(temperature_model="continuous").fit_long(dict(L), "truth", G)
    w = np.random.default_rng(3).poisson(1.0, L["n_req"]).astype(float)
    r = m.refit(w)
    direct = HazardModel(temperature_model="continuous").fit_long(dict(L), "truth", G, sample_weight_by_request=w)
    T = m._train
    lin = [x._linear(T["k"], T["x"], T["state"], x.coef_[False], T["tau"], T["w"], False) for x in (r, direct)]
    np.testing.assert_allclose(1 / (1 + np.exp(-lin[0])), 1 / (1 + np.exp(-lin[1])), atol=2e-3)


@pytest.fixture(scope="module")
def mixed_run():
    """A simulated run whose sampled requests pick their own temperature (0.5-0.9), 30% greedy."""
    rng = np.random.default_rng(7)
    T = rng.choice([0.5, 0.6, 0.7, 0.8, 0.9], 160)
    rs = simulate(n_requests=160, seed=41, temperature=T, greedy_frac=0.3).tables["request_steps"]
    est = TailEstimator(hazard=HazardModel(temperature_model="continuous")).fit(rs)
    return est, rs


def test_outside_the_trained_range_is_clamped_with_a_note(mixed_run):
    est, rs = mixed_run
    hm = est.hazard
    assert hm.info_["temperature_range"] == pytest.approx([0.5, 0.9])
    comp = compact_view(rs)
    sampled = comp[comp.temperature > 0]
    assert est.estimate(sampled, gamma=7).notes == list(BlockFrame.from_request_steps(sampled, gamma=7).notes)
    frame = BlockFrame.from_request_steps(sampled, gamma=7)
    rows = np.flatnonzero(frame.censored)[:300]
    st = np.zeros((rows.size, 7), np.int64)

    def at(t):
        return hm.predict(BlockFrame.from_request_steps(sampled.assign(temperature=t), gamma=7), rows, st)

    np.testing.assert_allclose(at(1.3), at(0.9), rtol=1e-12)  # clamped to the top of the range
    np.testing.assert_allclose(at(0.2), at(0.5), rtol=1e-12)
    assert not np.allclose(at(0.9), at(0.5))
    mid = at(0.75)  # interpolated: between its neighbours' hazards wherever those differ (logit-linear)
    lo, hi = np.minimum(at(0.7), at(0.8)), np.maximum(at(0.7), at(0.8))
    assert np.all((mid >= lo - 1e-12) & (mid <= hi + 1e-12))
    notes = est.estimate(sampled.assign(temperature=1.3), gamma=7).notes
    assert any("temperature 1.3 is outside the trained range 0.5-0.9" in n and "clamped" in n for n in notes), notes
    assert not any("outside" in n for n in est.estimate(sampled.assign(temperature=0.65), gamma=7).notes)


def test_greedy_rows_have_no_temperature_term(mixed_run):
    est, rs = mixed_run
    comp = compact_view(rs)
    greedy = comp[comp.temperature <= 0]
    frame = BlockFrame.from_request_steps(greedy, gamma=7)
    rows = np.flatnonzero(frame.censored)
    f = est.hazard.features(frame, rows, np.zeros((rows.size, 7), np.int64))
    assert np.all(f["t"] == 0)
    assert not any(n.startswith("hazard:") for n in est.estimate(greedy, gamma=7).notes)


def test_unknown_temperature_model_is_refused():
    with pytest.raises(ValueError, match="unknown temperature_model 'spline'"):
        HazardModel(temperature_model="spline").fit_long(_layout([0.7], n=400), "truth", G)
