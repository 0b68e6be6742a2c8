"""Audit sampling: infer the full-traffic ceiling from an audited sample of requests.

Why this module exists: the audit arm (cap-accept) verifies every block in full,
so auditing all traffic costs as much as not speculating smartly at all. With
``--audit-fraction f`` only a seeded random sample of requests is replayed in
the audit arm; the production arm (compact) still runs everything.

Units are requests ``i``, paired across arms by ``(workload, prompt_index, seed)``.

* ``w_i`` - blocks of request i in compact (its share of decode traffic);
* ``a_i`` - mean realized accept length of request i in compact (observed, all i);
* ``x_i`` - compact's confidence-only estimate of the uncapped accept length,
  mean over its blocks of ``1 + Σ_k survival_k`` (observed for all i; biased
  when the confidence head is miscalibrated);
* ``y_i`` - the true ceiling accept length, mean over the audit arm's blocks of
  ``ceiling + 1`` (observed only for sampled i).

Target: ``Y = Σ w_i y_i / Σ w_i`` over all requests, and utilization
``U = (Σ w_i a_i / Σ w_i) / Y``.

Estimators (weighted by ``w_i``; ``X̄`` is the known full-traffic mean of x):

* ratio:       ``Ŷ_r = (Σ_s w y / Σ_s w x) · X̄`` - corrects x's calibration bias
  multiplicatively; exact when the whole traffic is audited;
* regression:  ``Ŷ_g = ȳ_s + b (X̄ - x̄_s)`` with the weighted LS slope b;
* direct:      ``ȳ_s`` (ignores x), and the confidence-only ``X̄`` (no audit).

The regression estimator is reported only from 10 audited requests up (its
slope is unstable below). When every request is audited the estimates are the
observed truth and the intervals collapse to it.

Intervals: percentile bootstrap over sampled requests (X̄ held fixed; no finite
population correction, so intervals are slightly conservative for large f).
Every block's ceiling is at least its committed length, so ceiling estimates and
interval ends are truncated below at the realized mean (utilization at 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from acceptscope import schema


def sample_keys(keys: pd.DataFrame, fraction: float, seed: int, min_n: int = 2) -> pd.DataFrame:
    """A seeded simple random sample of request keys (rows of ``keys``); all rows when fraction >= 1."""
    if not 0 < fraction <= 1:
        raise ValueError(f"--audit-fraction must be in (0, 1], got {fraction}")
    n = len(keys)
    if fraction >= 1 or n <= min_n:
        return keys.reset_index(drop=True)
    k = min(n, max(min_n, int(round(fraction * n))))
    idx = np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))
    return keys.iloc[idx].reset_index(drop=True)


def per_request(reader: Any, compact_run: str, audit_run: str) -> pd.DataFrame:
    """One row per compact request with w, a, x and (where audited) y."""
    q = getattr(reader, "df", None) or reader.query_df
    rs, req = schema.REQUEST_STEPS.name, schema.REQUESTS.name
    sql = f"""
    WITH c AS (
      SELECT q.workload, q.prompt_index, q.seed, count(*) AS w, avg(s.acc_len) AS a,
             avg(1 + list_sum(s.survival)) AS x
      FROM "{rs}" s JOIN "{req}" q ON q.run_id = s.run_id AND q.rid = s.rid
      WHERE s.run_id = ? GROUP BY ALL),
    t AS (
      SELECT q.workload, q.prompt_index, q.seed, avg(s.ceiling + 1) AS y, count(*) AS audit_blocks
      FROM "{rs}" s JOIN "{req}" q ON q.run_id = s.run_id AND q.rid = s.rid
      WHERE s.run_id = ? AND s.ceiling IS NOT NULL GROUP BY ALL)
    SELECT c.*, t.y, t.audit_blocks FROM c LEFT JOIN t USING (workload, prompt_index, seed)
    ORDER BY workload, prompt_index, seed
    """
    return q(sql, [compact_run, audit_run])


@dataclass
class Interval:
    estimate: float
    lo: float
    hi: float


@dataclass
class SamplingInference:
    """Full-traffic ceiling and utilization inferred from an audited sample."""

    n_requests: int
    n_audited: int
    fraction: float
    realized_accept_len: float  # compact, all traffic (observed)
    confidence_only_ceiling: float  # X̄: compact's Σ survival, no audit
    ceiling_ratio: Interval
    ceiling_regression: Interval | None  # None below MIN_REGRESSION_N audited requests (slope unstable)
    ceiling_direct: Interval
    utilization_ratio: Interval
    utilization_regression: Interval | None
    level: float
    n_boot: int

    def to_dict(self) -> dict:
        return asdict(self)


MIN_REGRESSION_N = 10


def _ratio(w, x, y, xbar):
    return float(np.sum(w * y) / np.sum(w * x) * xbar)


def _regression(w, x, y, xbar):
    sw = np.sum(w)
    xm, ym = np.sum(w * x) / sw, np.sum(w * y) / sw
    vx = np.sum(w * (x - xm) ** 2)
    b = np.sum(w * (x - xm) * (y - ym)) / vx if vx > 1e-12 else 0.0
    return float(ym + b * (xbar - xm))


def _direct(w, x, y, xbar):
    return float(np.sum(w * y) / np.sum(w))


def infer(df: pd.DataFrame, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> SamplingInference:
    """Ratio / regression estimates of the full-traffic ceiling with bootstrap intervals."""
    if df.empty:
        raise ValueError("no compact requests to infer from")
    w_all = df["w"].to_numpy(float)
    xbar = float(np.sum(w_all * df["x"].to_numpy(float)) / np.sum(w_all))
    abar = float(np.sum(w_all * df["a"].to_numpy(float)) / np.sum(w_all))
    s = df.dropna(subset=["y", "x"])
    if len(s) < 2:
        raise ValueError(f"need at least 2 audited requests paired with compact, got {len(s)}")
    w, x, y = (s[c].to_numpy(float) for c in ("w", "x", "y"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(s), size=(n_boot, len(s)))
    alpha = (1 - level) / 2

    exhaustive = len(s) == len(df)  # whole traffic audited: no sampling error left

    def interval(fn) -> Interval:
        point = fn(w, x, y, xbar)
        if exhaustive:
            return Interval(point, point, point)
        boots = np.array([fn(w[i], x[i], y[i], xbar) for i in idx])
        lo, hi = np.nanquantile(boots, [alpha, 1 - alpha])
        return Interval(point, float(lo), float(hi))

    r, d = interval(_ratio), interval(_direct)
    g = interval(_regression) if len(s) >= MIN_REGRESSION_N else None

    def clip(iv: Interval | None) -> Interval | None:  # the ceiling is never below what was committed
        if iv is None:
            return None
        return Interval(max(iv.estimate, abar), max(iv.lo, abar), max(iv.hi, abar))

    r, g, d = clip(r), clip(g), clip(d)

    def util(iv: Interval | None) -> Interval | None:  # U = abar / Y is monotone in Y: map the ends
        if iv is None or iv.lo <= 0:
            return None
        return Interval(abar / iv.estimate, abar / iv.hi, abar / iv.lo)

    return SamplingInference(
        n_requests=len(df), n_audited=len(s), fraction=len(s) / len(df), realized_accept_len=abar,
        confidence_only_ceiling=xbar, ceiling_ratio=r, ceiling_regression=g, ceiling_direct=d,
        utilization_ratio=util(r), utilization_regression=util(g), level=level, n_boot=n_boot,
    )


def infer_runs(reader: Any, compact_run: str, audit_run: str, **kw: Any) -> SamplingInference:
    return infer(per_request(reader, compact_run, audit_run), **kw)


def keys_of(reader: Any, run_id: str) -> pd.DataFrame:
    """(workload, prompt_index, seed) of a run's requests."""
    q = getattr(reader, "df", None) or reader.query_df
    return q(f'SELECT workload, prompt_index, seed FROM "{schema.REQUESTS.name}" WHERE run_id = ? '
             "ORDER BY workload, prompt_index, seed", [run_id])


def pairs_table(keys: Sequence[tuple]) -> pd.DataFrame:
    return pd.DataFrame(list(keys), columns=["workload", "prompt_index", "seed"])
