"""STS: metric definitions, SGLang's grid fit semantics, smooth fits, held-out comparison, JSON export."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from acceptscope.figures import figure_of
from acceptscope.estimators.calibration import (StsCalibrator, calibration_data, check_sglang_sts, compare, fit_grid, fit_smooth,
                                    sglang_grid, survival)
from acceptscope.estimators.calibration_metrics import (_Prepared, ece, ece_binned, ece_rows, position_metrics,
                                                        position_metrics_many)
from acceptscope.estimators.synthetic import simulate

SGLANG_PY = Path(__file__).resolve().parents[1] / ".venv-sglang" / "bin" / "python"


def test_ece_hand_computation():
    p = np.array([0.01, 0.02, 0.5, 0.52, 0.99, 1.0])
    y = np.array([0, 1, 1, 0, 1, 1])
    # bins: 0 -> {.01,.02} mean .015 vs .5; 7 -> {.5,.52} mean .51 vs .5; 14 -> {.99, 1-1e-8} vs 1
    want = (2 * abs(0.015 - 0.5) + 2 * abs(0.51 - 0.5) + 2 * abs((0.99 + 1 - 1e-8) / 2 - 1)) / 6
    assert math.isclose(ece(p, y), want, rel_tol=1e-9)
    m = _Prepared(p, y).metrics()
    assert math.isclose(m["brier"], np.mean((np.clip(p, 1e-8, 1 - 1e-8) - y) ** 2))
    # AUROC by pairs: positives {.02,.5,.99,1}, negatives {.01,.52}
    pos, neg = [0.02, 0.5, 0.99, 1.0], [0.01, 0.52]
    auc = np.mean([[1.0 if a > b else 0.5 if a == b else 0.0 for b in neg] for a in pos])
    assert math.isclose(m["auroc"], auc)


def test_ece_variants_agree():
    """The row-batched and pre-binned ECEs are the same number as the per-sample ``ece``."""
    rng = np.random.default_rng(3)
    P = rng.random((4, 500))
    y = (rng.random(500) < 0.6).astype(float)
    assert np.allclose(ece_rows(P, y, 15), [ece(p, y, 15) for p in P], atol=1e-15)
    b = np.clip((P[0] * 15).astype(int), 0, 14)
    bins = pd.DataFrame({"g": "a", "bin": b, "p": P[0], "y": y}).groupby(["g", "bin"], as_index=False).agg(
        mean_pred=("p", "mean"), rate=("y", "mean"), n=("p", "size"))
    got = ece_binned(bins, ["g"])
    assert math.isclose(got["ece"].iloc[0], ece(P[0], y, 15), rel_tol=1e-12)
    assert got["n"].iloc[0] == 500 and math.isclose(got["rate"].iloc[0], y.mean(), rel_tol=1e-12)
    assert math.isnan(ece(np.array([]), np.array([])))


def test_debiased_ece_near_zero_when_calibrated():
    rng = np.random.default_rng(0)
    p = rng.random(40000)
    y = (rng.random(40000) < p).astype(float)
    m = _Prepared(p, y).metrics()
    assert m["ece_debiased"] < 0.01 and m["ece"] < 0.02
    yb = (rng.random(40000) < p ** 2).astype(float)
    assert _Prepared(p, yb).metrics()["ece_debiased"] > 0.1


def _grid_fit_reference(z, y, nb=15):
    """Scalar loop transcription of the published procedure (identity ECE before, strict '<' over the grid)."""
    grid = sglang_grid()
    n, G = z.shape
    sig = lambda x: 1 / (1 + np.exp(-x))

    def e(p, t):
        p = np.clip(p, 1e-8, 1 - 1e-8)
        tot = 0.0
        for b in range(nb):
            m = np.clip((p * nb).astype(int), 0, nb - 1) == b
            if m.any():
                tot += m.sum() * abs(p[m].mean() - t[m].mean())
        return tot / len(p)

    prev, T = np.ones(n), []
    for k in range(G):
        best_t, best = grid[0], e(prev * sig(z[:, k] / grid[0]), y[:, k])
        for t in grid[1:]:
            v = e(prev * sig(z[:, k] / t), y[:, k])
            if v < best:
                best, best_t = v, t
        T.append(best_t)
        prev = prev * sig(z[:, k] / best_t)
    return T


def test_grid_fit_matches_loop_reference():
    d = calibration_data(simulate(n_requests=80, seed=41).tables["request_steps"])
    r = fit_grid(d.z, d.y)
    assert np.allclose(r["temperatures"], _grid_fit_reference(d.z, d.y))
    assert len(r["ece_before"]) == d.z.shape[1]


def test_smooth_fit_beats_grid_on_its_own_loss_and_held_out():
    d = calibration_data(simulate(n_requests=300, seed=42).tables["request_steps"])
    tr, te = d.split(seed=1)
    g = StsCalibrator("sequential-ece").fit(tr.z, tr.y)
    s = StsCalibrator("smooth-nll").fit(tr.z, tr.y)
    nll = lambda T, dd: -np.mean(dd.y * np.log(np.clip(survival(dd.z, T), 1e-12, 1)) +
                                 (1 - dd.y) * np.log(np.clip(1 - survival(dd.z, T), 1e-12, 1)))
    assert nll(s.temperatures_, tr) <= nll(g.temperatures_, tr) + 1e-9
    res = compare(tr, te, n_boot=20)
    summ = res.summary().set_index("method")
    assert summ.loc["smooth-nll", "ece"] < summ.loc["identity", "ece"]
    assert res.label == "realized"
    m = res.metrics
    assert {"ece_lo", "ece_hi", "auroc_lo"} <= set(m.columns)
    inside = (m.ece_lo <= m.ece + 1e-9) & (m.ece <= m.ece_hi + 1e-9)
    assert inside.mean() > 0.9 and (m.ece_hi > m.ece_lo).all()
    fig = figure_of(res, positions=[1, 2])  # positions 1..gamma, as every surface shows them
    assert len(fig.data) > 0 and [a.text for a in fig.layout.annotations] == ["position 1", "position 2"]


def test_joint_fit_and_greedy_label():
    sim = simulate(n_requests=60, seed=43)
    g = calibration_data(None, "greedy", sts_samples=sim.tables["sts_samples"])
    # SGLang's shards carry no request id: held out by contiguous blocks of rows (whole steps), and it says so
    assert g.label == "greedy" and g.groups is not None and any("no request or step id" in n for n in g.notes)
    tr, te = g.split(seed=1)
    assert len(tr.z) + len(te.z) == len(g.z) and not set(tr.groups) & set(te.groups)
    j = fit_smooth(g.z, g.y, loss="brier", sequential=False)
    assert len(j["temperatures"]) == g.z.shape[1] and all(t > 0 for t in j["temperatures"])
    with pytest.raises(ValueError, match="sts_samples"):
        calibration_data(None, "greedy", sts_samples=None)


def test_sts_json_loads_with_sglang_rules(tmp_path):
    d = calibration_data(simulate(n_requests=50, seed=44).tables["request_steps"])
    cal = StsCalibrator("smooth-brier").fit(d.z, d.y)
    text = cal.to_sglang_json(dataset="x", label="realized", extra={"ci": [0.1, 0.2]})
    T = check_sglang_sts(text, gamma=d.z.shape[1])
    assert T == pytest.approx(cal.temperatures_, rel=1e-12)
    doc = json.loads(text)
    assert doc["acceptscope"]["label"] == "realized" and doc["acceptscope"]["method"] == "smooth-brier"
    with pytest.raises(ValueError, match="refit"):
        check_sglang_sts(text, gamma=d.z.shape[1] + 1)


@pytest.mark.sglang
@pytest.mark.skipif(not SGLANG_PY.exists(), reason=".venv-sglang not present")
def test_grid_fit_and_json_match_sglang(tmp_path):
    d = calibration_data(simulate(n_requests=60, seed=45).tables["request_steps"])
    np.save(tmp_path / "z.npy", d.z)
    np.save(tmp_path / "y.npy", d.y)
    p = tmp_path / "sts.json"
    p.write_text(StsCalibrator("smooth-nll").fit(d.z, d.y).to_sglang_json(dataset="t", extra={"x": [1.0]}))
    code = ("import numpy as np, torch, json; from sglang.benchmark.dspark_sts_fit import fit_sts_temperatures, default_temperature_grid;"
            "from sglang.srt.speculative.dspark_components.dspark_sts import load_sts_calibration_from_path as load;"
            f"z=torch.tensor(np.load({str(tmp_path / 'z.npy')!r})); y=torch.tensor(np.load({str(tmp_path / 'y.npy')!r}));"
            f"print(len(load({str(p)!r}).temperatures));"
            "print(json.dumps(fit_sts_temperatures(logits=z, prefix_mask=y, grid=default_temperature_grid())))")
    r = subprocess.run([str(SGLANG_PY), "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert int(lines[-2]) == d.z.shape[1]  # our JSON (with extra keys) loads in SGLang
    theirs = json.loads(lines[-1])
    ours = fit_grid(d.z, d.y)
    assert np.allclose(ours["temperatures"], theirs["temperatures"])
    assert np.allclose(ours["ece_after"], theirs["ece_after"], atol=1e-9)
    assert np.allclose(ours["ece_before"], theirs["ece_before"], atol=1e-9)


FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"


@pytest.mark.skipif(not (FIX / "capacc.sts_calibration.json").exists(), reason="SGLang fixtures not present")
def test_grid_fit_reproduces_sglang_fixture_table():
    """The committed fixture table was written by SGLang's own dspark_sts_fit from these shards."""
    torch = pytest.importorskip("torch")
    shards = sorted(FIX.glob("capacc.sts.*.pt"))
    data = [torch.load(p, map_location="cpu", weights_only=True) for p in shards]
    z = np.concatenate([d["logits"].numpy() for d in data]).astype(np.float64)
    y = np.concatenate([d["prefix_mask"].numpy() for d in data]).astype(np.float64)
    ref = json.loads((FIX / "capacc.sts_calibration.json").read_text())
    ours = fit_grid(z, y)
    assert np.allclose(ours["temperatures"], ref["temperatures"], rtol=1e-6)
    assert np.allclose(ours["ece_after"], ref["ece_after"], atol=1e-8)
    assert np.allclose(ours["ece_before"], ref["ece_before"], atol=1e-8)


def test_replicate_metrics_equal_one_replicate_at_a_time():
    """The bootstrap scores all replicates from per-cluster sums and one pair count per replicate; each
    must be :meth:`metrics` of the rows under that replicate's weights (ties and empty clusters included)."""
    from acceptscope.estimators.bootstrap import cluster_weights

    rng = np.random.default_rng(5)
    n, nc = 3000, 180
    clusters = rng.integers(0, nc, n)
    p = np.round(rng.random(n), 2)  # many tied scores
    for y in ((rng.random(n) < p).astype(float), rng.random(n)):  # binary labels, then fractional (the loop)
        prep = _Prepared(p, y)
        Wc = cluster_weights(np.arange(nc), 40, seed=3)
        got = prep.metrics_many(clusters, Wc)
        for i in (0, 7, 39):
            want = prep.metrics(Wc[i, clusters])
            for name, v in want.items():
                assert math.isclose(got[name][i], v, rel_tol=1e-12, abs_tol=1e-15), (name, i)


def test_methods_scored_together_equal_each_alone():
    """compare scores every STS method with one coding of the clusters; each method's frame must be its
    own position_metrics call, bit for bit; the unit-weight AUROC (read off the sorted pair ranks)
    must be the per-score sums' number exactly (ties included)."""
    rng = np.random.default_rng(11)
    n, G = 2500, 3
    groups = rng.integers(0, 150, n).astype(np.uint64)
    Y = (rng.random((n, G)) < 0.6).astype(float)
    Ps = {name: np.round(rng.random((n, G)), 3) for name in ("a", "b")}  # rounded: tied scores
    Ps["a2"] = Ps["a"] ** 2  # the same order and ties as "a" at every position: the same AUROC interval
    mask = rng.random((n, G)) < 0.9
    got = position_metrics_many(Ps, Y, groups, n_boot=70, seed=4, mask=mask)
    assert not got["a"]["auroc_lo"].equals(got["b"]["auroc_lo"])
    pd.testing.assert_series_equal(got["a"]["auroc_lo"], got["a2"]["auroc_lo"], check_exact=True)
    for name, P in Ps.items():
        alone = position_metrics(P, Y, groups, n_boot=70, seed=4, mask=mask)
        pd.testing.assert_frame_equal(got[name], alone, check_exact=True)
        prep = _Prepared(P[:, 0], Y[:, 0])
        assert prep.metrics()["auroc"] == prep.metrics(np.ones(n))["auroc"]


def test_point_metrics_from_the_bootstraps_sums_equal_the_row_sums():
    """With replicates, a position's point metrics come from the per-cluster sums the replicates reweight
    (_Prepared.metrics_bound); without, from the rows (metrics): the same numbers within rounding, the
    AUROC exactly, for binary and fractional labels."""
    rng = np.random.default_rng(12)
    n, G = 3000, 3
    groups = rng.integers(0, 200, n).astype(np.uint64)
    P = np.round(rng.random((n, G)), 3)
    for Y in ((rng.random((n, G)) < 0.6).astype(float), rng.random((n, G))):
        boot = position_metrics(P, Y, groups, n_boot=30, seed=1)
        point = position_metrics(P, Y, groups, n_boot=0)
        for name in ("ece", "ece_mass", "ece_debiased", "brier", "nll"):
            np.testing.assert_allclose(boot[name], point[name], rtol=1e-10, err_msg=name)
        assert boot["auroc"].tolist() == point["auroc"].tolist()


def _clustered_sample(rng, n_clusters: int, per: int = 6):
    """Rows of a cluster share an acceptance rate (as a request's positions do): their scores are that
    rate plus noise (rounded: tied values), their labels drawn from it."""
    c = np.repeat(np.arange(n_clusters), per)
    q = rng.random(n_clusters)
    p = np.clip(np.round(q[c] + 0.15 * rng.standard_normal(c.size), 3), 0, 1)
    return c, p, (rng.random(c.size) < q[c]).astype(float)


def test_auroc_normal_limit_is_the_bootstraps_spread():
    """auroc_sd is the first-order spread of the request-clustered Poisson bootstrap of the AUROC: on
    2,500 clusters it must equal the standard deviation of 2,000 exact pair-count replicates to within
    that estimate's own noise (~1.6% at 2,000 replicates; 6% allowed), and it must be larger than the spread of the same rows taken as
    independent (the clustering is what it measures)."""
    from acceptscope.estimators.bootstrap import cluster_weights

    rng = np.random.default_rng(29)
    c, p, y = _clustered_sample(rng, 2500)
    prep = _Prepared(p, y)
    sd = prep.auroc_sd(c, 2500)
    prep._bind(c, 2500)
    reps = np.concatenate([prep.metrics_many(c, cluster_weights(np.arange(2500), 250, seed=7, start=s))["auroc"]
                           for s in range(0, 2000, 250)])
    assert math.isclose(sd, reps.std(ddof=1), rel_tol=0.06), (sd, reps.std(ddof=1))
    alone = np.arange(p.size)  # every row its own cluster: the rows of a request are not independent
    assert _Prepared(p, y).auroc_sd(alone, p.size) < 0.85 * sd
    assert math.isnan(_Prepared(p, rng.random(p.size)).auroc_sd(c, 2500))  # labels not binary


def test_many_clusters_take_the_auroc_normal_limit():
    """A position with AUROC_NORMAL_CLUSTERS clusters or more reports auroc +- z sd (clipped to [0, 1]);
    the other metrics keep their basic bootstrap intervals (bit for bit those of a scorer below the
    threshold), and a position with fewer clusters keeps the AUROC's bootstrap."""
    from acceptscope.estimators import calibration_metrics as cm

    rng = np.random.default_rng(30)
    c, p, y = _clustered_sample(rng, cm.AUROC_NORMAL_CLUSTERS)
    P, Y = p[:, None], y[:, None]
    got = position_metrics(P, Y, c, n_boot=120, seed=2).iloc[0]
    sd = _Prepared(p, y).auroc_sd(pd.factorize(c)[0], cm.AUROC_NORMAL_CLUSTERS)
    z = 1.959963984540054
    assert math.isclose(got.auroc_lo, got.auroc - z * sd, rel_tol=1e-12)
    assert math.isclose(got.auroc_hi, got.auroc + z * sd, rel_tol=1e-12)
    few = c[c < cm.AUROC_NORMAL_CLUSTERS - 1]  # one cluster short: the pair-count bootstrap
    m = c < cm.AUROC_NORMAL_CLUSTERS - 1
    boot = position_metrics(P[m], Y[m], few, n_boot=120, seed=2).iloc[0]
    assert boot.auroc_hi - boot.auroc != pytest.approx(boot.auroc - boot.auroc_lo, rel=1e-9)  # not symmetric
    assert math.isclose(boot.auroc_hi - boot.auroc_lo, got.auroc_hi - got.auroc_lo, rel_tol=0.25)
    old = cm.AUROC_NORMAL_CLUSTERS
    try:
        cm.AUROC_NORMAL_CLUSTERS = 10 ** 9
        all_boot = position_metrics(P, Y, c, n_boot=120, seed=2).iloc[0]
    finally:
        cm.AUROC_NORMAL_CLUSTERS = old
    others = [f"{m}_{e}" for m in cm.METRICS if m != "auroc" for e in ("lo", "hi")]
    assert all_boot[others].equals(got[others])
    frac = position_metrics(P, rng.random(Y.shape), c, n_boot=20, seed=2).iloc[0]  # labels not binary: bootstrapped
    assert np.isfinite(frac.auroc_lo) and frac.auroc_lo < frac.auroc < frac.auroc_hi
