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
``U = Ā / Y`` with ``Ā = Σ w_i a_i / Σ w_i`` (observed). Since every block's
ceiling is at least what it committed, ``Y = Ā + T`` where ``T`` is the mean
trimmed tail; only ``T`` is unknown. The auxiliary variable for the tail is
compact's confidence-implied tail ``z_i = max(x_i - a_i, 0)``, known for all i.

Estimators of ``T`` (weighted by ``w_i``; ``Z̄`` = full-traffic mean of z):

* ratio:       ``T̂_r = (Σ_s w t / Σ_s w z) · Z̄`` - rescales the confidence-
  implied tail by how much of it the audit actually found;
* regression:  ``T̂_g = t̄_s + b (Z̄ - z̄_s)`` with the weighted LS slope b
  (the primary estimate from ``MIN_REGRESSION_N`` = 20 audited requests up: it
  falls back to ``t̄_s`` when the confidence carries no information, and uses
  it when it does; its slope is too noisy below 20);
* difference:  ``T̂_d = t̄_s`` (realized accept length as auxiliary with slope 1;
  the primary estimate below 20 audited requests);
* direct:      ``ȳ_s`` (the audited sample alone), and ``X̄`` (confidence only,
  no audit: biased by miscalibration, shown for contrast).

Intervals: expanded-percentile bootstrap over the audited requests (Hesterberg
2015: percentile levels widened by ``sqrt(n/(n-1))`` and Student-t quantiles,
which corrects the plain percentile interval's under-coverage at a dozen
requests); Ā and Z̄ are held fixed (known for the whole traffic). No
finite-population correction, so intervals are slightly conservative for large f. Tail estimates and interval
ends are truncated at 0 (a ceiling is never below what was committed). When
every request is audited the estimates are the observed truth and the intervals
collapse to it. If no audited request shows a tail the interval collapses to Ā:
tails the sample did not see cannot be bounded (``n_with_tail`` says so, and the
report flags it). Coverage of these intervals against a full audit is measured by
``tests/test_audit.py::test_sampled_inference_coverage``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy.special import ndtr, stdtrit  # norm.cdf and t.ppf without scipy.stats (2x the start-up)

from acceptscope import schema, summaries


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
    """One row per compact request with w, a, x and (where audited) y.

    ``reader``: an ``acceptscope.reader.Reader`` or a ``Store`` (both have ``summary``); read from the
    per-request summaries (a few rows per request, not the run's request-steps).
    """
    return reader.summary(summaries.per_request, compact_run, audit_run)


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
    realized_accept_len: float  # Ā: compact, all traffic (observed)
    confidence_only_ceiling: float  # X̄: compact's Σ survival + 1, no audit
    n_with_tail: int  # audited requests whose ceiling exceeded what compact committed
    method: str  # which estimator ``ceiling``/``utilization`` report: regression | difference
    ceiling: Interval  # the primary estimate (``method``)
    utilization: Interval
    ceiling_difference: Interval
    ceiling_ratio: Interval | None  # None when the confidence implies no tail at all (Z̄ = 0)
    ceiling_regression: Interval | None  # None below MIN_REGRESSION_N audited requests
    ceiling_direct: Interval
    level: float
    n_boot: int

    def to_dict(self) -> dict:
        return asdict(self)


MIN_REGRESSION_N = 20


def expanded_alpha(alpha: float, n: int) -> float:
    """Hesterberg's expanded percentile: the tail level that corrects the percentile bootstrap's
    narrowness at small n (alpha' = Phi(sqrt(n/(n-1)) * t_{alpha, n-1}))."""
    if n < 2:
        return alpha
    return float(ndtr(np.sqrt(n / (n - 1)) * stdtrit(n - 1, alpha)))


def _difference(w, t, z, zbar):
    return float(np.sum(w * t) / np.sum(w))


def _ratio(w, t, z, zbar):
    den = np.sum(w * z)
    return float(np.sum(w * t) / den * zbar) if den > 1e-12 else float("nan")


def _regression(w, t, z, zbar):
    sw = np.sum(w)
    zm, tm = np.sum(w * z) / sw, np.sum(w * t) / sw
    vz = np.sum(w * (z - zm) ** 2)
    b = np.sum(w * (z - zm) * (t - tm)) / vz if vz > 1e-12 else 0.0
    return float(tm + b * (zbar - zm))


def infer(df: pd.DataFrame, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> SamplingInference:
    """Estimates of the full-traffic ceiling and utilization with bootstrap intervals."""
    if df.empty:
        raise ValueError("no compact requests to infer from")
    w_all = df["w"].to_numpy(float)
    a_all, x_all = df["a"].to_numpy(float), df["x"].to_numpy(float)
    abar = float(np.sum(w_all * a_all) / np.sum(w_all))
    xbar = float(np.sum(w_all * x_all) / np.sum(w_all))
    zbar = float(np.sum(w_all * np.maximum(x_all - a_all, 0)) / np.sum(w_all))
    s = df.dropna(subset=["y", "x"])
    if len(s) < 2:
        raise ValueError(f"need at least 2 audited requests paired with compact, got {len(s)}")
    w, a, x, y = (s[c].to_numpy(float) for c in ("w", "a", "x", "y"))
    t, z = y - a, np.maximum(x - a, 0)
    m = len(s)

    def resamples():  # the same n_boot index draws on every pass, one (m,) array at a time (no n_boot x m matrix)
        rng = np.random.default_rng(seed)
        for _ in range(n_boot):
            yield rng.integers(0, m, size=m)

    alpha = expanded_alpha((1 - level) / 2, len(s))
    exhaustive = len(s) == len(df)  # whole traffic audited: no sampling error left

    def ceiling(fn) -> Interval | None:
        point = fn(w, t, z, zbar)
        if np.isnan(point):
            return None
        if exhaustive:
            lo = hi = point
        else:
            boots = np.array([fn(w[i], t[i], z[i], zbar) for i in resamples()])
            lo, hi = np.nanquantile(boots, [alpha, 1 - alpha])
        # a ceiling is never below what was committed: tails truncate at 0
        return Interval(abar + max(point, 0.0), abar + max(float(lo), 0.0), abar + max(float(hi), 0.0))

    d, r = ceiling(_difference), ceiling(_ratio)
    g = ceiling(_regression) if len(s) >= MIN_REGRESSION_N else None
    wy = np.sum(w * y) / np.sum(w)
    if exhaustive:
        direct = Interval(float(wy), float(wy), float(wy))
    else:
        boots = np.array([np.sum(w[i] * y[i]) / np.sum(w[i]) for i in resamples()])
        lo, hi = np.quantile(boots, [alpha, 1 - alpha])
        direct = Interval(float(wy), float(lo), float(hi))
    method, primary = ("regression", g) if g is not None else ("difference", d)
    util = Interval(abar / primary.estimate, abar / primary.hi, abar / primary.lo)
    return SamplingInference(
        n_requests=len(df), n_audited=len(s), fraction=len(s) / len(df), realized_accept_len=abar,
        confidence_only_ceiling=xbar, n_with_tail=int(np.sum(t > 1e-9)), method=method, ceiling=primary, utilization=util,
        ceiling_difference=d, ceiling_ratio=r, ceiling_regression=g, ceiling_direct=direct,
        level=level, n_boot=n_boot,
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
