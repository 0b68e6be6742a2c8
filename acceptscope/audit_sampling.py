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
from acceptscope.estimators.bootstrap import iid_replicates


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


# Every estimator is a function of six weighted totals over the audited requests, so an estimate (and
# each bootstrap replicate) needs only those sums: S = (Σw, Σwt, Σwz, Σwz², Σwzt, Σwy).
_W, _WT, _WZ, _WZZ, _WZT, _WY = range(6)


def _sums(w, t, z, y) -> np.ndarray:
    return np.array([np.sum(w), np.sum(w * t), np.sum(w * z), np.sum(w * z * z), np.sum(w * z * t), np.sum(w * y)])


def _difference(S, zbar):
    return S[..., _WT] / S[..., _W]


def _ratio(S, zbar):
    den = S[..., _WZ]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 1e-12, S[..., _WT] / den * zbar, np.nan)


def _regression(S, zbar):
    zm, tm = S[..., _WZ] / S[..., _W], S[..., _WT] / S[..., _W]
    vz = S[..., _WZZ] - S[..., _WZ] * zm  # Σw(z - z̄)², from raw moments: relative floor against cancellation
    cov = S[..., _WZT] - S[..., _WZ] * tm
    ok = vz > np.maximum(1e-12, 1e-9 * np.abs(S[..., _WZZ]))
    with np.errstate(divide="ignore", invalid="ignore"):
        b = np.where(ok, cov / np.where(ok, vz, 1.0), 0.0)
    return tm + b * (zbar - zm)


def _direct(S, zbar):
    return S[..., _WY] / S[..., _W]


# Above this many audited requests the bootstrap replicates' totals are drawn from their normal limit
# N(S, m Σ) (Σ: the covariance of one request's six terms; a replicate's totals are a sum of m iid draws
# from the audited requests, so the CLT applies): n_boot x 6 numbers instead of n_boot resamples of m rows.
# At and below it, the exact resampling.
EXACT_BOOT_MAX = 2000


@dataclass
class Moments:
    """What :func:`infer_moments` needs: full-traffic means and the audited requests' (w, t, z, y)."""

    n_requests: int
    abar: float
    xbar: float
    zbar: float
    m: int  # audited requests paired with compact
    n_with_tail: int
    sums: np.ndarray  # (6,) S over the audited requests
    rows: tuple  # (w, t, z, y) arrays of the audited requests

    def cov(self) -> np.ndarray:
        """(6, 6) population covariance of one audited request's terms (w, wt, wz, wz², wzt, wy)."""
        w, t, z, y = self.rows
        return np.cov(np.stack([w, w * t, w * z, w * z * z, w * z * t, w * y]), bias=True)


def moments_of(w_all: np.ndarray, a_all: np.ndarray, x_all: np.ndarray, y_all: np.ndarray) -> Moments:
    """:class:`Moments` of per-request columns (one entry per compact request; y NaN where not audited)."""
    w_all, a_all, x_all, y_all = (np.asarray(v, float) for v in (w_all, a_all, x_all, y_all))
    if len(w_all) == 0:
        raise ValueError("no compact requests to infer from")
    sw = np.sum(w_all)
    s = ~np.isnan(y_all) & ~np.isnan(x_all)
    w, a, x, y = w_all[s], a_all[s], x_all[s], y_all[s]
    t, z = y - a, np.maximum(x - a, 0)
    return Moments(n_requests=len(w_all), abar=float(np.sum(w_all * a_all) / sw),
                   xbar=float(np.sum(w_all * x_all) / sw),
                   zbar=float(np.sum(w_all * np.maximum(x_all - a_all, 0)) / sw), m=int(np.sum(s)),
                   n_with_tail=int(np.sum(t > 1e-9)), sums=_sums(w, t, z, y), rows=(w, t, z, y))


def infer(df: pd.DataFrame, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> SamplingInference:
    """Estimates of the full-traffic ceiling and utilization with bootstrap intervals."""
    if df.empty:
        raise ValueError("no compact requests to infer from")
    return infer_moments(moments_of(*(df[c].to_numpy(float) for c in ("w", "a", "x", "y"))),
                         n_boot=n_boot, level=level, seed=seed)


def _replicates(mom: Moments, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, 6) bootstrap totals: exact resampling of few rows, else the normal limit."""
    if mom.m <= EXACT_BOOT_MAX:
        return iid_replicates(n_boot, seed, rows=mom.rows, stat=_sums)
    return iid_replicates(n_boot, seed, total=mom.sums, cov=mom.m * mom.cov())


def infer_moments(mom: Moments, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> SamplingInference:
    """:func:`infer` from :class:`Moments`."""
    if mom.n_requests == 0:
        raise ValueError("no compact requests to infer from")
    if mom.m < 2:
        raise ValueError(f"need at least 2 audited requests paired with compact, got {mom.m}")
    abar, zbar, S = mom.abar, mom.zbar, mom.sums
    alpha = expanded_alpha((1 - level) / 2, mom.m)
    exhaustive = mom.m == mom.n_requests  # whole traffic audited: no sampling error left
    boots = None if exhaustive else _replicates(mom, n_boot, seed)

    def interval(fn, tail: bool = True) -> Interval | None:
        point = float(fn(S, zbar))
        if np.isnan(point):
            return None
        lo = hi = point
        if boots is not None:
            lo, hi = (float(v) for v in np.nanquantile(fn(boots, zbar), [alpha, 1 - alpha]))
        if not tail:
            return Interval(point, lo, hi)
        # a ceiling is never below what was committed: tails truncate at 0
        return Interval(abar + max(point, 0.0), abar + max(lo, 0.0), abar + max(hi, 0.0))

    d, r = interval(_difference), interval(_ratio)
    g = interval(_regression) if mom.m >= MIN_REGRESSION_N else None
    direct = interval(_direct, tail=False)
    method, primary = ("regression", g) if g is not None else ("difference", d)
    util = Interval(abar / primary.estimate, abar / primary.hi, abar / primary.lo)
    return SamplingInference(
        n_requests=mom.n_requests, n_audited=mom.m, fraction=mom.m / mom.n_requests, realized_accept_len=abar,
        confidence_only_ceiling=mom.xbar, n_with_tail=mom.n_with_tail, method=method, ceiling=primary,
        utilization=util, ceiling_difference=d, ceiling_ratio=r, ceiling_regression=g, ceiling_direct=direct,
        level=level, n_boot=n_boot,
    )


def moments_of_totals(tot: dict) -> Moments:
    """:class:`Moments` from :func:`summaries.pair_totals` (DuckDB's totals over the compact keys; the
    audited rows' own totals by :func:`_sums`, as :func:`moments_of` makes them, when they came along)."""
    sw = tot["sw"]
    sums = tot["sums"] if tot["rows"] is None else _sums(*tot["rows"])
    return Moments(n_requests=tot["n_requests"], abar=float(tot["swa"] / sw), xbar=float(tot["swx"] / sw),
                   zbar=float(tot["swz"] / sw), m=tot["m"], n_with_tail=tot["n_with_tail"], sums=sums,
                   rows=tot["rows"] if tot["rows"] is not None else ())


def infer_runs(reader: Any, compact_run: str, audit_run: str, **kw: Any) -> SamplingInference:
    """:func:`infer` for a pair of runs. A kept audit pair (``summaries.pair_totals``, schema version 5)
    answers from one table: a row of totals, plus the audited keys' rows unless every key is audited
    (a few kilobytes at a 1% audit). Otherwise four numeric columns per request (DuckDB joins the two
    runs' request-key summaries); a sample small enough for the exact bootstrap is read again in
    :func:`per_request`'s order, so its replicates are those of :func:`infer`."""
    tot = reader.summary(summaries.pair_totals, compact_run, audit_run)
    if tot is not None:
        return infer_moments(moments_of_totals(tot), **kw)
    mom = moments_of(*reader.summary(summaries.per_request_columns, compact_run, audit_run))
    if mom.m <= EXACT_BOOT_MAX and mom.m < mom.n_requests:
        mom = moments_of(*reader.summary(summaries.per_request_columns, compact_run, audit_run, True))
    return infer_moments(mom, **kw)


def keys_of(reader: Any, run_id: str) -> pd.DataFrame:
    """(workload, prompt_index, seed) of a run's requests."""
    q = getattr(reader, "df", None) or reader.query_df
    return q(f'SELECT workload, prompt_index, seed FROM "{schema.REQUESTS.name}" WHERE run_id = ? '
             "ORDER BY workload, prompt_index, seed", [run_id])


def pairs_table(keys: Sequence[tuple]) -> pd.DataFrame:
    return pd.DataFrame(list(keys), columns=["workload", "prompt_index", "seed"])
