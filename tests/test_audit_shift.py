"""An audit measures the shift past the walk; the estimate says how much audit reaches a target width.

The paired grid (bench/paired_grid.py, docs/validation.md) is the measurement; these tests hold the
mechanics: the posterior follows the audit as it grows, leaves the prior alone without one, and the real
audit CLI's sampled arm calibrates the compact run's estimate and gives advice.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.cli._common import EXIT_OK
from acceptscope.estimators.audit_size import SIGMA_PER_REQUEST, audit_advice
from acceptscope.estimators.margin import PRIOR_CENTER, SHIFT_GRID, UnobservedPrior, audit_posterior
from tests.test_audit import sampled_audit


def _audit(n: int, true_shift: float, seed: int = 0, spread: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """``n`` audited requests whose predicted sums rise with the shift; each request's recorded sum is its
    prediction at the true shift plus a per-request residual (sd ``spread`` drafts)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(5, 15, n)[:, None]
    curves = base + 3 * np.tanh(SHIFT_GRID[None, :] / 2)
    truth = base[:, 0] + 3 * np.tanh(true_shift / 2) + spread * rng.standard_normal(n)
    return curves, truth


def test_posterior_follows_a_large_audit_and_narrows_with_it():
    bands = {}
    for n in (10, 160):
        curves, truth = _audit(n, -2.0)
        p = audit_posterior(UnobservedPrior(), curves, truth, 1.0)
        lo, hi = p.band()
        assert p.scope == "open" and p.audit["n_requests"] == n and lo < p.center < hi
        bands[n] = (lo, hi, p.center)
    lo, hi, c = bands[160]
    assert lo <= -2.0 <= hi and abs(c + 2.0) < 0.5
    # 16x the requests: the band narrows about 4x once the audit dominates the prior
    assert (bands[10][1] - bands[10][0]) / (hi - lo) > 2.5
    assert 0.3 * SIGMA_PER_REQUEST < p.audit["sigma_request"] < 3 * SIGMA_PER_REQUEST


def test_one_audited_request_leaves_the_prior():
    curves, truth = _audit(1, 1.5)
    p = audit_posterior(UnobservedPrior(), curves, truth, 1.0)
    assert p.center == pytest.approx(PRIOR_CENTER) and p.band() == pytest.approx(UnobservedPrior().band())
    assert "prior alone" in p.audit["note"]
    # an audit that measured nothing leaves the compact run's prior exactly as it was, scope included (it
    # shifts the blocks with log-probs, where it was measured): the interval is the compact run's own
    q = audit_posterior(UnobservedPrior(), curves, truth, 0.0)
    assert q.center == pytest.approx(PRIOR_CENTER) and q.scope == UnobservedPrior().scope == "logprob"
    assert q.band() == pytest.approx(UnobservedPrior().band()) and q.cdf is None


def test_advice_says_when_auditing_cannot_reach_the_target():
    # the part auditing does not shrink is already wider than the target
    a = audit_advice(width=0.30, band_width=0.05, band=(-2.5, 0.5), n_requests=500, n_open_requests=300,
                     audit=None, half_width=0.10)
    assert a["reachable"] is False and a["fraction"] is None and "more traffic" in a["why"]
    b = audit_advice(width=0.08, band_width=0.05, band=(-2.5, 0.5), n_requests=500, n_open_requests=300,
                     audit=None, half_width=0.05)
    assert b["reachable"] and b["fraction"] == 0
    c = audit_advice(width=0.40, band_width=0.36, band=(-2.5, 0.5), n_requests=500, n_open_requests=300,
                     audit=None, half_width=0.05)
    d = audit_advice(width=0.40, band_width=0.36, band=(-2.5, 0.5), n_requests=500, n_open_requests=300,
                     audit=None, half_width=0.10)
    assert 0 < d["fraction"] < c["fraction"] <= 1  # a tighter target needs more audit


def test_sampled_audit_calibrates_the_compact_estimate(tmp_path):
    """`audit --audit-fraction`: the compact run's hazards are its own, the audit arm measures the shift,
    and the estimate carries the audit-size advice (the reference engine, sampled decoding)."""
    db = tmp_path / "sampled.duckdb"
    res = sampled_audit(db, "1.0", requests=12, max_new_tokens=24)
    assert res.exit_code == EXIT_OK, res.output
    compact = json.loads(res.stdout[res.stdout.index("{"):])["runs"]["compact"]["run_id"]
    out = CliRunner().invoke(app, ["estimate", "--db", str(db), "--run", compact, "--json"])
    assert out.exit_code == EXIT_OK, out.output
    tail = json.loads(out.stdout[out.stdout.index("{"):])[compact]["tail"]
    summary = tail["summary"]
    note = " ".join(summary["notes"])
    assert "this run's own observed outcomes" in note and "measured on" in note
    prior = summary["hazard"]["unobserved_prior"]
    assert prior["audit"]["n_audited_requests"] == 6
    if prior["audit"]["n_requests"] >= 2:  # the audit measured the shift on every open block
        assert prior["scope"] == "open"
    else:  # too few audited requests with an open block: the compact run's prior as it was, and the note says so
        assert prior["scope"] == "logprob" and "as without an audit" in note
    lo, hi = prior["band"]
    assert lo <= prior["center"] <= hi
    advice = summary["audit_advice"]
    assert [a["half_width"] for a in advice] == [0.05, 0.10]
    for a in advice:
        assert a["reachable"] in (True, False) and a["why"]
        assert a["fraction"] is None or 0 <= a["fraction"] <= 1
    run = tail["aggregate"][0]
    ident = summary["identified"]
    assert ident["mean_ceiling_lo"] - 1e-9 <= run["lo"] <= run["mean_ceiling"] <= run["hi"] <= ident["mean_ceiling_hi"] + 1e-9
