"""Confidence scheduler (SGLang 0.5.23 budget rule + top-k allocation), SPS and STS file formats."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from acceptscope.domain import sps as sps_mod
from acceptscope.domain import sts as sts_mod
from acceptscope.domain.scheduler import LaggedSurvival, allocate, compute_budget, schedule_step
from acceptscope.engine.sts_torch import calibrate
from acceptscope.estimators.calibration import survival

ADD = sps_mod.SpsTableAdditive(0.010, [1, 8, 32], [0.0, 0.002, 0.006], [1, 16, 64, 256], [0.0, 0.001, 0.008, 0.05])
ONE_D = sps_mod.SpsTable1D([1, 8, 16, 64, 128], [100.0, 90.0, 70.0, 40.0, 20.0], 256)


def _brute_budget(S: np.ndarray, table) -> int:
    """argmax over M of theta(M), written independently from the scheduler."""
    n = S.shape[0]
    c = sorted((float(x) for x in S.reshape(-1) if x >= 1e-6), reverse=True)
    best, arg = -1.0, 0
    for m in range(len(c) + 1):
        tau = n + sum(c[:m])
        if isinstance(table, sps_mod.SpsTableAdditive):
            theta = tau / table.step_seconds(n, m)
        else:
            theta = tau * table.lookup(n + m)
        if theta > best:  # first maximum
            best, arg = theta, m
    return arg


@pytest.mark.parametrize("table", [ADD, ONE_D], ids=["additive", "1d"])
def test_budget_is_exact_argmax(table):
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 12))
        c = rng.uniform(0.2, 1.0, size=(n, 5)).astype(np.float32)
        S = np.cumprod(c, axis=1)
        S[rng.uniform(size=S.shape) < 0.1] = 1e-9  # below eps: never a candidate
        d = compute_budget(S, table)
        assert d.budget == _brute_budget(S, table)
        assert d.predicted_step_seconds == pytest.approx(table.step_seconds(n, d.budget))
        assert d.predicted_theta > 0


def test_allocation_order_and_prefix_property():
    S = np.array([[0.9, 0.5, 0.2], [0.9, 0.9, 0.1], [0.3, 0.2, 0.1]], dtype=np.float32)
    # order: (0,0)=0.9,(1,0)=0.9 [pos asc, req asc], then (1,1)=0.9 (pos 1), (0,1)=0.5, (2,0)=0.3 ...
    assert allocate(S, 0).tolist() == [0, 0, 0]
    assert allocate(S, 1).tolist() == [1, 0, 0]
    assert allocate(S, 2).tolist() == [1, 1, 0]
    assert allocate(S, 3).tolist() == [1, 2, 0]
    assert allocate(S, 4).tolist() == [2, 2, 0]
    assert allocate(S, 5).tolist() == [2, 2, 1]
    assert allocate(S, 100).tolist() == [3, 3, 3]
    S2 = S.copy()
    S2[2] = [1e-7, 1e-8, 1e-9]  # invalid cells are never selected
    assert allocate(S2, 100).tolist() == [3, 3, 0]


def test_allocation_is_a_prefix_per_request_for_random_survival():
    rng = np.random.default_rng(1)
    for _ in range(50):
        S = np.cumprod(rng.uniform(0, 1, size=(6, 7)), axis=1).astype(np.float32)
        for b in range(0, 43, 6):
            w = allocate(S, b)
            assert w.sum() == min(b, int((S >= 1e-6).sum()))
            chosen = {(r, k) for r in range(6) for k in range(w[r])}
            thr = min((S[r, k] for r, k in chosen), default=np.inf)
            # everything strictly above the cut-off was chosen
            assert all((r, k) in chosen for r, k in itertools.product(range(6), range(7)) if S[r, k] > thr)


def test_lagged_survival_uses_two_steps_back_and_ones_for_fresh():
    lag = LaggedSurvival(gamma=3, lag_steps=2)
    s = [np.full(3, v, np.float32) for v in (0.1, 0.2, 0.3)]
    assert lag.lagged(["a"]).tolist() == [[1, 1, 1]]
    lag.push(["a"], s[0][None])
    assert lag.lagged(["a"]).tolist() == [[1, 1, 1]]
    lag.push(["a"], s[1][None])
    np.testing.assert_allclose(lag.lagged(["a", "b"]), [[0.1] * 3, [1] * 3])
    lag.push(["a"], s[2][None])
    np.testing.assert_allclose(lag.lagged(["a"]), [[0.2] * 3])
    lag.drop("a")
    assert lag.lagged(["a"]).tolist() == [[1, 1, 1]]


def test_schedule_step_warmup_and_uninitialized_table_verify_all():
    S = np.full((4, 5), 0.5, np.float32)
    assert schedule_step(S, S, ADD, warm=False).budget is None
    assert schedule_step(S, S, ADD, warm=False).windows.tolist() == [5] * 4
    un = sps_mod.uninitialized_table(64)
    sc = schedule_step(S, S, un, warm=True)
    assert sc.budget is None and sc.windows.tolist() == [5] * 4
    sc = schedule_step(S, S, ADD, warm=True)
    assert sc.budget is not None and sc.windows.sum() <= sc.budget


def test_sps_formats_roundtrip_and_byte_conventions(tmp_path):
    p1, p2 = tmp_path / "a.json", tmp_path / "b.json"
    h1 = sps_mod.write_sps(ONE_D, p1)
    h2 = sps_mod.write_sps(ADD, p2)
    t1, t2 = p1.read_text(), p2.read_text()
    assert "bias_seconds" not in t1 and '"bias_seconds"' in t2
    assert " " not in t1 and t1.startswith('{"sample_batch_tokens":[1,8,16,64,128],')
    assert '"max_batch_tokens":256' in t1
    assert json.loads(t2)["m_probes"] == [1, 16, 64, 256] and t2.startswith('{"bias_seconds":0.01,"bs_probes":[1,8,32]')
    assert sps_mod.load_sps(p1) == ONE_D and sps_mod.load_sps(p2) == ADD
    assert h1 == sps_mod.table_hash(p1) and h2 == sps_mod.table_hash(p2)
    # floor lookup, clamped at both ends
    assert [ONE_D.lookup(b) for b in (0, 1, 7, 8, 15, 16, 500)] == pytest.approx([100.0, 100.0, 100.0, 90.0, 90.0, 70.0, 20.0])
    # additive: linear, clamped
    assert ADD.step_seconds(1, 0) == pytest.approx(0.010)
    assert ADD.step_seconds(8, 56) == pytest.approx(0.010 + 0.002 + 0.008)  # theta at N + M = 64
    assert ADD.step_seconds(8, 32) == pytest.approx(0.010 + 0.002 + 0.001 + 24 / 48 * 0.007)
    assert ADD.step_seconds(100, 1000) == pytest.approx(0.010 + 0.006 + 0.05)


def test_sps_bad_input_names_file_and_field(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"sample_batch_tokens":[1.0,2],"sample_steps_per_sec":[1,2],"max_batch_tokens":2}')
    with pytest.raises(ValueError, match=r"bad.json: line 1: field sample_batch_tokens"):
        sps_mod.load_sps(p)
    p.write_text('{"bias_seconds":0.0,"bs_probes":[1],"alpha_seconds":[0],"m_probes":[1],"theta_seconds":[0]}')
    with pytest.raises(ValueError, match="bias_seconds must be > 0"):
        sps_mod.load_sps(p)
    p.write_text("{nope")
    with pytest.raises(ValueError, match="bad.json: line 1: invalid JSON"):
        sps_mod.load_sps(p)


def test_sts_roundtrip_apply_and_gamma_check(tmp_path):
    t = sts_mod.StsTable([1.0, 2.0, 0.5], dataset="x/*.pt", num_samples=10)
    p = tmp_path / "sts.json"
    sts_mod.write_sts(t, p)
    text = p.read_text()
    assert text == '{"temperatures":[1.0,2.0,0.5],"dataset":"x/*.pt","num_samples":10}'  # defaults omitted
    p.write_text(text[:-1] + ',"extra_key":1}')  # unknown keys are ignored, like SGLang
    assert sts_mod.load_sts(p) == t
    z = torch.tensor([[2.0, 2.0, 2.0]])
    c = calibrate(z, t.temperatures)
    torch.testing.assert_close(c, torch.sigmoid(torch.tensor([[2.0, 1.0, 4.0]])))
    # the runner's torch.cumprod of calibrated confidences is the estimators' one survival function
    np.testing.assert_allclose(torch.cumprod(c, -1).numpy(), survival(z.numpy(), t.temperatures), rtol=1e-6)
    with pytest.raises(ValueError, match="refit the table for gamma=7"):
        t.check_gamma(7)
    p.write_text('{"temperatures":[1.0,-1.0]}')
    with pytest.raises(ValueError, match="> 0"):
        sts_mod.load_sts(p)


def test_profiler_fits_recover_a_known_cost_model():
    from acceptscope.engine.profiler import Cell, fit_additive, fit_diagonal

    rng = np.random.default_rng(0)
    cells = []
    for bs in (1, 2, 4, 8, 16):
        for f in (0.0, 0.25, 0.5, 0.75, 1.0):
            m = bs + int(f * bs * 7)
            cells.append(Cell(bs, f, m, 0.01 + 0.002 * bs + 0.0003 * m + rng.uniform(-2e-4, 2e-4), 5))
    for mono in (False, True):
        t = fit_additive(cells, mbin=16, monotone=mono)
        assert t.bias_seconds > 0 and t.bs_probes == [1, 2, 4, 8, 16]
        for c in cells:  # the fitted table predicts every cell within the noise + binning error
            assert t.step_seconds(c.bs, c.batch_tokens - c.bs) == pytest.approx(c.median_s, abs=3e-3)
        if mono:
            assert all(b >= a for a, b in zip(t.alpha_seconds, t.alpha_seconds[1:]))
            assert all(b >= a for a, b in zip(t.theta_seconds, t.theta_seconds[1:]))
    d = fit_diagonal(cells, 7, max_batch_tokens=256)
    assert d.sample_batch_tokens == [8, 16, 32, 64, 128] and d.max_batch_tokens == 256
    assert d.lookup(64) == pytest.approx(1 / [c.median_s for c in cells if c.bs == 8 and c.frac == 1.0][0])
