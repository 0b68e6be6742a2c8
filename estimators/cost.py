"""Additive SPS cost model fitted from step timings, in SGLang's table format.

Why: the planner's budget is only as good as its cost table. SGLang's profiler fits
``T = bias + alpha[bs] + theta[round(M/64)*64]`` by OLS on dummies with no positivity or
monotonicity (reference §4.2). Here the same additive form,
``step_time(N, B) = bias + alpha(N) + theta(B)`` with ``B = N + M`` total verify tokens and
clamped-linear interpolation between integer probes (exactly how SGLang evaluates an
additive table), is fitted by non-negative least squares on *cumulative-increment ramp
bases*: every increment between consecutive probes is >= 0, so ``alpha`` and ``theta`` are
monotone non-decreasing and start at 0, and ``bias`` > 0. Rows with NULL timing are dropped
and counted. Accuracy is reported in-sample and on a held-out split of steps.

Example::

    >>> from acceptscope.estimators.synthetic import simulate
    >>> from acceptscope.estimators.cost import CostModel
    >>> sim = simulate(n_requests=80, seed=7)
    >>> fit = CostModel().fit(sim.tables["steps"])
    >>> fit.result_.n_dropped_null > 0 and fit.table_.bias_seconds > 0
    True
    >>> all(b >= a for a, b in zip(fit.table_.theta_seconds, fit.table_.theta_seconds[1:]))
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from acceptscope.domain.sps import SpsTable, SpsTable1D, SpsTableAdditive


def table_from_long(df: pd.DataFrame) -> SpsTable:
    """The SPS table of ``sps_tables`` rows of one ``table_hash`` (validated like any other)."""
    kind = df["kind"].iloc[0]
    comp = {c: g.sort_values("probe") for c, g in df.groupby("component")}
    if kind == "additive":
        a, t = comp["alpha_seconds"], comp["theta_seconds"]
        return SpsTableAdditive(float(comp["bias_seconds"]["value"].iloc[0]), a.probe.astype(int).tolist(),
                                a.value.tolist(), t.probe.astype(int).tolist(), t.value.tolist())
    s = comp["steps_per_sec"]
    mx = comp.get("max_batch_tokens")
    return SpsTable1D(s.probe.astype(int).tolist(), s.value.tolist(),
                      int(mx.value.iloc[0]) if mx is not None else int(s.probe.max()))


def step_seconds_at_tokens(table: SpsTable, n, b) -> np.ndarray:
    """Step time for ``n`` requests and ``b`` *total* verify tokens (the steps table's columns)."""
    n = np.asarray(n, float)
    return np.asarray(table.step_seconds(n, np.asarray(b, float) - n))


def _ramps(x: np.ndarray, probes: np.ndarray) -> np.ndarray:
    """Cumulative-increment bases: column j rises 0->1 between probes j and j+1 (clamped)."""
    p = probes.astype(float)
    lo, hi = p[:-1], p[1:]
    return np.clip((x[:, None] - lo[None, :]) / (hi - lo)[None, :], 0.0, 1.0)


def _probes(x: np.ndarray, k: int) -> np.ndarray:
    q = np.unique(np.round(np.quantile(x, np.linspace(0, 1, k))).astype(np.int64))
    q = np.unique(np.concatenate([[max(1, int(x.min()))], q, [int(x.max())]]))
    return q[q >= 1]


@dataclass
class CostResult:
    n_steps: int
    n_used: int
    n_dropped_null: int
    timing_column: str
    tokens_column: str
    in_sample: dict
    held_out: dict
    table: dict
    predictions: pd.DataFrame
    baseline: dict | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "predictions"}


def _errors(pred_ms, meas_ms) -> dict:
    e = pred_ms - meas_ms
    return dict(n=int(len(e)), mae_ms=float(np.abs(e).mean()) if len(e) else float("nan"),
                bias_ms=float(e.mean()) if len(e) else float("nan"),
                median_rel_err=float(np.median(np.abs(e) / meas_ms)) if len(e) else float("nan"),
                mean_rel_err=float(np.mean(np.abs(e) / meas_ms)) if len(e) else float("nan"))


class CostModel:
    """Monotone, positive additive cost model (see module docstring)."""

    def __init__(self, n_bs_probes: int = 8, n_m_probes: int = 16, timing: str = "step_cpu_ms",
                 holdout: float = 0.3, seed: int = 0):
        self.n_bs_probes, self.n_m_probes, self.timing, self.holdout, self.seed = n_bs_probes, n_m_probes, timing, holdout, seed

    def _xy(self, steps: pd.DataFrame):
        if "executed_verify_tokens" in steps and steps["executed_verify_tokens"].notna().any():
            tok = "executed_verify_tokens"
        else:
            tok = "num_verify_tokens"
        n = pd.to_numeric(steps["bs"], errors="coerce").to_numpy(float)
        b = pd.to_numeric(steps[tok], errors="coerce").to_numpy(float)
        y = pd.to_numeric(steps[self.timing], errors="coerce").to_numpy(float) if self.timing in steps else np.full(len(steps), np.nan)
        ok = np.isfinite(n) & np.isfinite(b) & np.isfinite(y) & (n > 0) & (b > 0) & (y > 0)
        return n, b, y, ok, tok

    def fit(self, steps: pd.DataFrame, baseline: SpsTable | None = None) -> "CostModel":
        n, b, y, ok, tok = self._xy(steps)
        if ok.sum() < 4:
            raise ValueError(f"cost fit needs >= 4 steps with bs, {tok} and {self.timing}; got {int(ok.sum())}")
        rng = np.random.default_rng(self.seed)
        idx = np.flatnonzero(ok)
        test = rng.random(idx.size) < self.holdout
        tr, te = idx[~test], idx[test]
        self.bs_probes_ = _probes(n[ok], self.n_bs_probes)
        self.m_probes_ = _probes(b[ok], self.n_m_probes)
        beta = self._solve(n[tr], b[tr], y[tr] / 1e3)
        self.table_ = self._table(beta)
        # refit on everything for the exported table; held-out numbers come from the split fit
        pred_te = step_seconds_at_tokens(self.table_, n[te], b[te]) * 1e3
        held = _errors(pred_te, y[te])
        beta_all = self._solve(n[ok], b[ok], y[ok] / 1e3)
        self.table_ = self._table(beta_all)
        pred = step_seconds_at_tokens(self.table_, n, b) * 1e3
        notes = []
        if np.ptp(n[ok]) == 0 or np.ptp(b[ok]) == 0:
            notes.append("bs or the verify tokens never vary here: the alpha/theta split is not identified")
        elif np.corrcoef(n[ok], b[ok])[0, 1] > 0.999:
            notes.append(f"bs and {tok} are collinear (e.g. cap-accept executes bs*(gamma+1)): alpha/theta split is not identified")
        preds = pd.DataFrame({"bs": n, "tokens": b, "measured_ms": y, "predicted_ms": pred,
                              "split": np.where(ok, "train", "dropped")})
        preds.loc[te, "split"] = "held_out"
        base = None
        if baseline is not None:
            bp = step_seconds_at_tokens(baseline, n[ok], b[ok]) * 1e3
            base = dict(kind=baseline.kind, **_errors(bp, y[ok]))
            preds["baseline_ms"] = step_seconds_at_tokens(baseline, n, b) * 1e3
        self.result_ = CostResult(n_steps=int(len(steps)), n_used=int(ok.sum()), n_dropped_null=int((~ok).sum()),
                                  timing_column=self.timing, tokens_column=tok,
                                  in_sample=_errors(pred[ok], y[ok]), held_out=held,
                                  table=json.loads(self.table_.to_json()), predictions=preds, baseline=base, notes=notes)
        return self

    def _solve(self, n, b, y_s):
        X = np.concatenate([np.ones((n.size, 1)), _ramps(n, self.bs_probes_), _ramps(b, self.m_probes_)], 1)
        beta, _ = nnls(X, y_s)
        return beta

    def _table(self, beta) -> SpsTable:
        J = len(self.bs_probes_) - 1
        bias = max(float(beta[0]), 1e-6)
        alpha = np.concatenate([[0.0], np.cumsum(beta[1:1 + J])])
        theta = np.concatenate([[0.0], np.cumsum(beta[1 + J:])])
        return SpsTableAdditive(bias, self.bs_probes_.tolist(), alpha.tolist(), self.m_probes_.tolist(), theta.tolist())

    def predict(self, steps: pd.DataFrame) -> np.ndarray:
        """Predicted step time (ms)."""
        n, b, _, _, _ = self._xy(steps)
        return step_seconds_at_tokens(self.table_, n, b) * 1e3
