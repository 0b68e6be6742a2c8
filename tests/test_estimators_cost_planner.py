"""Additive SPS cost fit (recovery, monotonicity, SGLang format) and the planner audit (budget rule, lag)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from acceptscope.domain.sps import SpsTable1D, SpsTableAdditive, parse_sps
from acceptscope.figures import figure_of
from acceptscope.estimators.cost import CostModel, step_seconds_at_tokens
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.planner import audit, budget_rule, lagged_survival
from acceptscope.estimators.synthetic import simulate


def _steps(n=1500, seed=0, null_frac=0.3):
    rng = np.random.default_rng(seed)
    bs = rng.integers(1, 65, n)
    tok = bs + rng.integers(0, 7, n) * bs // 2 + rng.integers(0, 8, n)
    alpha = lambda N: 0.03 * N + 0.5 * np.sqrt(N)          # ms, monotone
    theta = lambda B: 0.04 * B + 0.03 * np.maximum(B - 200, 0)  # ms, monotone with a kink
    ms = 6.0 + alpha(bs) + theta(tok)
    y = ms * np.exp(0.01 * rng.standard_normal(n))
    y[rng.random(n) < null_frac] = np.nan
    return pd.DataFrame(dict(bs=bs, num_verify_tokens=tok, step_cpu_ms=y)), (alpha, theta)


def test_cost_fit_recovers_known_components():
    steps, (alpha, theta) = _steps()
    m = CostModel(n_bs_probes=12, n_m_probes=40).fit(steps)
    r = m.result_
    assert r.n_dropped_null == int(steps.step_cpu_ms.isna().sum()) and r.n_used + r.n_dropped_null == len(steps)
    t = m.table_
    assert t.bias_seconds > 0
    assert all(b >= a - 1e-15 for a, b in zip(t.alpha_seconds, t.alpha_seconds[1:]))
    assert all(b >= a - 1e-15 for a, b in zip(t.theta_seconds, t.theta_seconds[1:]))
    # the noise-free step-time surface is recovered within 3% over the (N, B) the data cover
    N, B = steps.bs.to_numpy(), steps.num_verify_tokens.to_numpy()
    truth = 6.0 + alpha(N) + theta(B)
    pred = step_seconds_at_tokens(t, N, B) * 1e3
    assert np.max(np.abs(pred - truth) / truth) < 0.03
    assert r.held_out["median_rel_err"] < 0.02
    back = parse_sps(t.to_json())  # SGLang's rules: strict int probes, increasing, bias > 0
    assert back == t and np.allclose(step_seconds_at_tokens(back, N, B), step_seconds_at_tokens(t, N, B))


def test_cost_fit_errors_and_sglang_rules():
    steps, _ = _steps(n=10, null_frac=0.9)
    with pytest.raises(ValueError, match="needs >= 4 steps"):
        CostModel().fit(steps.assign(step_cpu_ms=np.nan))
    bad = json.dumps({"bias_seconds": 0.0, "bs_probes": [1, 2], "alpha_seconds": [0, 1], "m_probes": [1, 2], "theta_seconds": [0, 1]})
    with pytest.raises(ValueError, match="bias_seconds"):
        parse_sps(bad)
    bad2 = bad.replace('"bias_seconds": 0.0', '"bias_seconds": 0.1').replace('"m_probes": [1, 2]', '"m_probes": [2, 1]')
    with pytest.raises(ValueError, match="increasing"):
        parse_sps(bad2)


def test_budget_rule_hand_cases():
    t = SpsTableAdditive(1.0, [1, 2], [0.0, 0.0], [1, 3], [0.0, 0.2])
    # theta(M): (1)/1, (1.9)/1.1, (2.4)/1.2 -> argmax 2
    assert budget_rule(np.array([[0.9, 0.5]]), t)["budget"] == 2
    # a 0.1-survival second draft is not worth 10% more step time: (1.9)/1.1 > (2.0)/1.2
    b = budget_rule(np.array([[0.9, 0.1]]), t)
    assert b["budget"] == 1 and math.isclose(b["predicted_theta"], 1.9 / 1.1)
    # candidates below survival_eps are ignored; 1-D tables use the floor SPS lookup
    d = SpsTable1D([1, 2, 3], [10.0, 5.0, 4.0], 3)
    assert budget_rule(np.array([[1e-7, 1e-7]]), d)["budget"] == 0
    # theta: 10, 1.99*5 = 9.95, 2.97*4 = 11.88: the global argmax (no early stop, as SGLang) takes 2
    assert budget_rule(np.array([[0.99, 0.98]]), d)["budget"] == 2


def test_lagged_survival_rebuild():
    rows = []
    conf = {("a", 1): [0.5, 0.5], ("a", 2): [0.8, 0.5], ("a", 3): [0.9, 0.9], ("b", 3): [0.7, 0.7]}
    for (rid, f), c in conf.items():
        rows.append(dict(run_id="r", rank=0, epoch=0, forward_ct=f, rid=rid, prefix_len=10 * f, window=2, correct_drafts=0,
                         draft_tokens=[1, 2], committed_tokens=[3], bonus_token=3, confidence=c, temperature=0.0))
    df = pd.DataFrame(rows)
    steps = pd.DataFrame(dict(run_id="r", rank=0, epoch=0, forward_ct=[1, 2, 3], lag_steps=2))
    bf = BlockFrame.from_request_steps(df, gamma=2)
    S, fresh = lagged_survival(bf, steps)
    out = {(bf.df.rid[i], bf.df.forward_ct[i]): (S[i].tolist(), fresh[i]) for i in range(bf.n)}
    # survival of 'a' two decode steps back (fct 1)
    assert out[("a", 3)][0] == pytest.approx([0.5, 0.25]) and not out[("a", 3)][1]
    assert out[("a", 1)][1] and out[("a", 2)][1] and out[("b", 3)][1]  # fresh -> ones
    assert out[("b", 3)][0] == pytest.approx([1.0, 1.0])


def test_audit_reproduces_recorded_budgets():
    sim = simulate(n_requests=150, seed=51)
    a = audit(sim.tables["request_steps"], sim.tables["steps"], parse_sps(json.dumps(sim.sps_table)))
    s = a.summary
    assert s["budget_exact_match_rate"] > 0.97
    assert s["accepted_drafts_lost_source"] == "ceiling" and s["accepted_drafts_lost"] >= 0
    rs = sim.tables["request_steps"]
    assert s["verify_tokens_saved"] == pytest.approx(float((7 - rs.window).sum()))
    assert s["accepted_drafts_lost"] == pytest.approx(float((rs.ceiling - rs.correct_drafts).sum()))
    assert figure_of(a) is not None


def test_step_budgets_equal_the_budget_rule_per_step():
    """The planner audit's all-steps-at-once budget recomputation is the engine's rule, step by step
    (equal budgets, equal thetas and step times), for both table kinds, ties and fresh (all-ones) rows."""
    from acceptscope.domain.sps import SpsTable1D, SpsTableAdditive
    from acceptscope.estimators.planner import step_budgets

    rng = np.random.default_rng(11)
    n_steps = 300
    codes = np.repeat(np.arange(n_steps), rng.integers(1, 40, n_steps))
    rng.shuffle(codes)
    S = np.cumprod(rng.random((codes.size, 7)) ** 0.3, 1)
    S[rng.random(codes.size) < 0.2] = 1.0  # fresh requests: survival 1 everywhere (ties)
    S[rng.random(S.shape) < 0.05] = 0.0  # below SURVIVAL_EPS: not a candidate
    tables = (SpsTableAdditive(0.01, [1, 64, 256], [0.001, 0.002, 0.01], [1, 256, 2048], [0.001, 0.004, 0.03]),
              SpsTable1D([1, 64, 512, 2048], [90.0, 80.0, 40.0, 5.0], 2048))
    for table in tables:
        got = step_budgets(S, codes, n_steps, table)
        for s in range(n_steps):
            want = budget_rule(S[codes == s], table)
            assert got["budget"][s] == want["budget"]
            assert got["predicted_theta"][s] == pytest.approx(want["predicted_theta"], rel=1e-15)
            assert got["predicted_step_ms"][s] == pytest.approx(want["predicted_step_ms"], rel=1e-15)
