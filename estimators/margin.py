"""Hazards past the window when the model never saw past it: a prior shift and a sensitivity band.

Why: a hazard model fitted on a compact run's own observed outcomes learns acceptance inside the
windows, at the first trimmed position (exact from the capped bonus) and along the positions a later
step's realized tokens let the walk follow. The positions the walk could *not* follow (the realized
stream diverged from the drafts, or ended) are exactly the ones it predicts, and nothing in compact
telemetry observes them: at the same confidence they are accepted far less often than the positions
it learned from (``interval-diagnosis.md``; on the reference engine the model's hazards there were
about one logit too high, an over-estimate of up to 0.35 drafts per block).

So when hazards were fitted without truth, the model hazards of sampled blocks with log-probs (the walk
could follow their realized tokens and did not; :func:`estimators.tail.prior_rows`) are moved by
:data:`PRIOR_CENTER` logits
(the point estimate) and the estimate carries the band ``PRIOR_CENTER +- PRIOR_HALF_WIDTH``: two more
predictive means per block, summed like the point estimate so every executor carries them, that widen
the interval as a systematic term (:func:`estimators.bootstrap.request_stats`). The constants were
chosen on the validation grid's *tune* seeds (``bench/paired_grid.py --split tune``) and are scored on
its *score* seeds only (docs/validation.md). Hazards fitted on truth (a static arm's, or a recorded run's
own) get no prior: their training saw those positions.

The first trimmed positions give one check of the model past the window that the data do identify:
the logit shift that fits their outcomes (:func:`fit_shift`), reported as ``margin_check``.

**With an audit** (a cap-accept arm over part of the same traffic, or a run named by ``--hazards-from``),
the hazards stay the run's own and the audit *measures* the shift (:func:`audit_posterior`): on the
audit's blocks, with their ceilings hidden, the run's model predicts each open block's mean ceiling as a
function of the shift; per audited request the residual against the recorded ceilings is summed, and
the shift's quasi-posterior is the prior times a Student-t likelihood of the mean residual (its
variance from the spread between audited requests: the audit is a sample of requests, and blocks of one
request are not independent; pooled with the spread the tune split measured, as six requests' worth, so a
handful of audited requests does not estimate its own spread alone). A handful of audited requests moves
the prior part of the way; a large audit overrides it. Why not hazards fitted on the audit arm alone (what an audit did before): fitted on
six requests, a whole hazard model was over-confident (10% audits of 64 requests covered 33 of 45);
one shift, with its between-request spread, is what six requests can support.

Example::

    >>> import numpy as np
    >>> y = np.array([1, 0, 0, 1, 0, 0, 0, 1.0]); h = np.full(8, 0.8)
    >>> s = fit_shift(h, y)
    >>> round(float(shift_hazards(np.array([0.8]), s.delta)[0]), 3)   # the shifted hazard meets the observed rate
    0.375
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# chosen by bench/tune_prior.py on the grid's tune seeds (28600-28609; 7 configurations the prior moves by
# more than 0.02 drafts): the shifts that met the truth were -1.30 .. +0.40, median -0.95
PRIOR_CENTER = -1.0  # logit shift of model hazards the walk could not follow (hazards fitted without truth)
PRIOR_HALF_WIDTH = 1.5  # the band: PRIOR_CENTER +- this
MIN_MARGIN = 30  # known first-trimmed outcomes needed before the margin check is reported
_CLIP = 1e-6
SHIFT_GRID = np.round(np.arange(-8.0, 6.0 + 1e-9, 0.05), 2)  # logit shifts the audit's posterior is evaluated on
Z95 = 1.959963984540054  # the normal 97.5% quantile: 95% bands
# the shift's spread between requests (logits; what one audited request is worth: a band of d logits from n audited
# requests with an open block is 2 z sigma / sqrt(n)): over the 13 informative audits of the validation grid's *tune*
# split (seeds 28600-28611; estimators.audit_size.sigma_from_audit of each), median and quartiles
SIGMA_PER_REQUEST = 1.32
SIGMA_QUARTILES = (1.10, 1.68)
# how many audited requests' worth the audit's posterior gives that spread before its own requests speak (a scaled
# inverse chi-square prior on the spread): 6 matches the tune split's quartiles (sigma^2 ratio 2.33; chi-square with
# 6 degrees of freedom: 2.27), which hold each audit's own estimation noise too, so the prior is weaker than the data
SIGMA_PRIOR_DF = 6


@dataclass(frozen=True)
class MarginShift:
    """A logit shift of model hazards fitted to known outcomes (the margin check)."""

    delta: float
    se: float  # standard error (observed information)
    n: int
    observed_rate: float
    model_rate: float

    def to_json(self) -> dict:
        return dict(delta=self.delta, se=self.se, n=self.n, observed_rate=self.observed_rate, model_rate=self.model_rate)


@dataclass(frozen=True)
class UnobservedPrior:
    """The shift applied to the hazards of positions the walk could not follow, and its band.

    ``scope``: which open blocks it shifts: ``logprob`` (the prior alone: where it was measured, see
    :func:`estimators.tail.prior_rows`) or ``open`` (every open block: an audit measured it on all of
    them). ``lo``/``hi``: an asymmetric band (the audit's posterior); default ``center +- half_width``.
    ``audit``: what the audit measured (:func:`audit_posterior`), or None."""

    center: float = PRIOR_CENTER
    half_width: float = PRIOR_HALF_WIDTH
    margin_check: MarginShift | None = None
    scope: str = "logprob"
    lo: float | None = None
    hi: float | None = None
    audit: dict | None = None
    cdf: tuple | None = None  # the audit's posterior CDF on SHIFT_GRID (None: the prior alone, a band not a law)

    def draws(self, n: int) -> np.ndarray:
        """``n`` stratified draws of the shift from the audit's posterior (its ``(i + 0.5) / n`` quantiles):
        the hazard refits each take one, so the interval carries the shift's uncertainty jointly with the
        sampling noise (:meth:`estimators.tail.TailEstimator.estimate`)."""
        return np.interp((np.arange(n) + 0.5) / n, np.asarray(self.cdf), SHIFT_GRID)

    def band(self) -> tuple[float, float]:
        if self.lo is not None and self.hi is not None:
            return self.lo, self.hi
        return self.center - self.half_width, self.center + self.half_width

    def to_json(self) -> dict:
        return dict(center=self.center, band=list(self.band()), scope=self.scope, audit=self.audit,
                    margin_check=self.margin_check.to_json() if self.margin_check else None)


def audit_posterior(prior: UnobservedPrior, curves: np.ndarray, truth: np.ndarray, logprob_share: float,
                    level: float = 0.95) -> UnobservedPrior:
    """The shift measured on an audit: ``curves[r, g]`` is audited request ``r``'s sum of predicted mean
    ceilings of its open blocks under shift ``SHIFT_GRID[g]``, ``truth[r]`` their recorded sum.

    Prior: normal, ``PRIOR_CENTER`` scaled by the share of open blocks with log-probs (the prior was
    measured on those; blocks without them were never seen to need a shift), its band a 95% interval
    (widened by the rest's share). Likelihood: Student-t of the summed residual over its standard error,
    the between-request variance pooled with :data:`SIGMA_PER_REQUEST`'s as :data:`SIGMA_PRIOR_DF`
    requests' worth (``SIGMA_PRIOR_DF + n - 1`` degrees of freedom). The result's center is the posterior median, its
    band the central ``level`` interval; fewer than 2 audited requests with open blocks leave the prior as it
    was (its scope and band: an audit that measured nothing must not widen the compact run's interval).

    Example::

        >>> import numpy as np
        >>> g = SHIFT_GRID[None, :]
        >>> curves = np.repeat(10 + 2 * np.tanh(g / 2), 40, axis=0)   # 40 requests, shift-free truth 10
        >>> p = audit_posterior(UnobservedPrior(), curves + 0.0, np.full(40, 10.0) + np.linspace(-.5, .5, 40), 1.0)
        >>> abs(round(p.center, 1)), p.scope, p.audit["n_requests"]
        (0.0, 'open', 40)
    """
    n = int(curves.shape[0])
    share = float(np.clip(logprob_share, 0.0, 1.0))
    if n < 2:  # nothing measured: the estimate is the compact run's own, its prior as it was (scope, band and all)
        return replace(prior, audit=dict(n_requests=n, prior_center=prior.center, prior_band=list(prior.band()),
                                         logprob_share=share, note=f"{n} audited request(s) with open blocks: the "
                                                                   "prior alone, as without an audit"))
    c0 = prior.center * share
    s0 = (prior.half_width * (2.0 - share)) / Z95
    base = dict(n_requests=n, prior_center=c0, prior_band=[c0 - Z95 * s0, c0 + Z95 * s0], logprob_share=share)
    resid = truth[:, None] - curves  # (n, grid)
    tot = resid.sum(0)
    v_hat = n / (n - 1) * ((resid - resid.mean(0)) ** 2).sum(0)  # the summed residual's variance, between requests
    # the same variance were every request's shift spread SIGMA_PER_REQUEST around the run's (its residual moves
    # with its own slope), pooled with the audit's own as SIGMA_PRIOR_DF requests' worth: a handful of audited
    # requests no longer has to estimate its spread alone (a Student-t with n - 1 degrees of freedom, 4 for 5)
    v_0 = SIGMA_PER_REQUEST ** 2 * (np.gradient(resid, SHIFT_GRID, axis=1) ** 2).sum(0)
    nu = SIGMA_PRIOR_DF + n - 1
    se = np.sqrt(np.maximum((SIGMA_PRIOR_DF * v_0 + (n - 1) * v_hat) / nu, 1e-12))
    z = tot / se
    logpost = -((nu + 1) / 2) * np.log1p(z * z / nu) - 0.5 * ((SHIFT_GRID - c0) / s0) ** 2
    w = np.exp(logpost - logpost.max())
    cdf = np.cumsum(w) / w.sum()
    a = (1 - level) / 2
    lo, med, hi = (float(np.interp(q, cdf, SHIFT_GRID)) for q in (a, 0.5, 1 - a))
    # the shift whose predicted sum meets the recorded one (the residual falls with the shift; None: off the grid)
    moment = float(np.interp(0.0, -tot, SHIFT_GRID)) if tot[-1] <= 0 <= tot[0] else None
    # the shift's spread between requests as the likelihood alone reads it (logits, at the posterior median),
    # reported beside the band (estimators.audit_size scales the band itself, which the prior also shapes)
    g = int(np.clip(np.searchsorted(SHIFT_GRID, med), 1, SHIFT_GRID.size - 1))
    slope = abs(tot[g] - tot[g - 1]) / (SHIFT_GRID[g] - SHIFT_GRID[g - 1])
    sigma = float(np.sqrt(v_hat[g] * n) / slope) if slope > 1e-9 else None  # v_hat: of the summed residual
    return UnobservedPrior(center=med, margin_check=prior.margin_check, scope="open", lo=lo, hi=hi,
                           half_width=(hi - lo) / 2, cdf=tuple(cdf.tolist()),
                           audit=dict(base, moment_shift=moment, band=[lo, hi], sigma_request=sigma,
                                      note=f"the shift past the walk measured on {n} audited requests"))


def _logit(h: np.ndarray) -> np.ndarray:
    h = np.clip(h, _CLIP, 1 - _CLIP)
    return np.log(h) - np.log1p(-h)


def shift_hazards(h: np.ndarray, delta: float) -> np.ndarray:
    """Hazards ``h`` moved by ``delta`` on the logit scale (``delta`` 0: unchanged)."""
    if delta == 0:
        return h
    return 1 / (1 + np.exp(-(_logit(h) + delta)))


def fit_shift(h: np.ndarray, y: np.ndarray, iters: int = 50) -> MarginShift:
    """The logit shift of model hazards ``h`` that maximizes the likelihood of outcomes ``y`` (0/1)."""
    eta = _logit(np.asarray(h, float))
    y = np.asarray(y, float)
    d = 0.0
    for _ in range(iters):  # Newton on a concave 1-D likelihood
        p = 1 / (1 + np.exp(-(eta + d)))
        g, info = float((y - p).sum()), float((p * (1 - p)).sum())
        if info <= 0:
            break
        step = float(np.clip(g / info, -2.0, 2.0))
        d += step
        if abs(step) < 1e-10:
            break
    p = 1 / (1 + np.exp(-(eta + d)))
    info = float((p * (1 - p)).sum())
    se = 1 / np.sqrt(info) if info > 0 else float("inf")
    return MarginShift(float(d), float(se), int(y.size), float(y.mean()) if y.size else float("nan"),
                       float(np.clip(h, 0, 1).mean()) if y.size else float("nan"))


def margin_outcomes(frame, rows: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices into ``rows``, outcome) of the censored blocks whose first trimmed position is known
    exactly (``known``: the walk's hazards of ``rows``, NaN where unknown; exact at the margin: 0 or 1)."""
    G = frame.gamma
    w = frame.window[rows]
    i = np.flatnonzero(w < G)
    y = known[i, w[i]]
    ok = (y == 0) | (y == 1)
    return i[ok], y[ok]
