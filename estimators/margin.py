"""Hazards past the window when the model never saw past it: a prior shift and a sensitivity band.

Why: a hazard model fitted on a compact run's own observed outcomes learns acceptance inside the
windows, at the first trimmed position (exact from the capped bonus) and along the positions a later
step's realized tokens let the walk follow. The positions the walk could *not* follow (the realized
stream diverged from the drafts, or ended) are exactly the ones it predicts, and nothing in compact
telemetry observes them: at the same confidence they are accepted far less often than the positions
it learned from (``interval-diagnosis.md``; on the reference engine the model's hazards there were
about one logit too high, an over-estimate of up to 0.35 drafts per block).

So when hazards were fitted without truth, the model hazards of sampled blocks with log-probs (the walk
could follow their realized tokens and did not; :func:`estimators.tail.prior_applied`) are moved by
:data:`PRIOR_CENTER` logits
(the point estimate) and the estimate carries the band ``PRIOR_CENTER +- PRIOR_HALF_WIDTH``: two more
predictive means per block, summed like the point estimate so every executor carries them, that widen
the interval as a systematic term (:func:`estimators.bootstrap.request_stats`). The constants were
chosen on the validation grid's *tune* seeds (``bench/paired_grid.py --split tune``) and are scored on
its *score* seeds only (docs/validation.md). With a cap-accept audit (hazards fitted on truth) neither
applies: the audit observed those positions.

The first trimmed positions give one check of the model past the window that the data do identify:
the logit shift that fits their outcomes (:func:`fit_shift`), reported as ``margin_check``.

Example::

    >>> import numpy as np
    >>> y = np.array([1, 0, 0, 1, 0, 0, 0, 1.0]); h = np.full(8, 0.8)
    >>> s = fit_shift(h, y)
    >>> round(float(shift_hazards(np.array([0.8]), s.delta)[0]), 3)   # the shifted hazard meets the observed rate
    0.375
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# chosen by bench/tune_prior.py on the grid's tune seeds (28600-28609; 7 configurations the prior moves by
# more than 0.02 drafts): the shifts that met the truth were -1.30 .. +0.40, median -0.95
PRIOR_CENTER = -1.0  # logit shift of model hazards the walk could not follow (hazards fitted without truth)
PRIOR_HALF_WIDTH = 1.5  # the band: PRIOR_CENTER +- this
MIN_MARGIN = 30  # known first-trimmed outcomes needed before the margin check is reported
_CLIP = 1e-6


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
    """The shift applied to the hazards of positions the walk could not follow, and its band."""

    center: float = PRIOR_CENTER
    half_width: float = PRIOR_HALF_WIDTH
    margin_check: MarginShift | None = None

    def band(self) -> tuple[float, float]:
        return self.center - self.half_width, self.center + self.half_width

    def to_json(self) -> dict:
        return dict(center=self.center, band=list(self.band()),
                    margin_check=self.margin_check.to_json() if self.margin_check else None)


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
