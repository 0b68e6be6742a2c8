"""Per-position acceptance hazards as a function of confidence: the model of the unobserved tail.

Why: beyond the last position a trimmed block can be followed in later steps, the
ceiling is unobserved. The scheduler chose the cut from confidence (informative
censoring), so the tail is modelled *conditionally on confidence*: the hazard
``h_k(c) = P(draft k accepted | drafts < k accepted, confidence c_k)``, per position
and separately for greedy and sampled requests (their acceptance laws differ).

Training data is a discrete-time survival layout: for each request-step, each
position it reached with a known outcome. Rows with a ceiling (cap-accept, static)
contribute every position up to the first rejection; rows without one (compact)
contribute what the tail walk observed (in-window outcomes, exact greedy walks, and
Rao-Blackwellised ``min(1, p/q)`` soft labels weighted by the probability of reaching
the position). Censoring then depends only on covariates, so the likelihood is valid.

Methods:

* ``binned`` (default): per position, quantile bins of ``logit(c)``, Jeffreys-smoothed
  rates shrunk toward the position's pooled rate, made monotone in confidence by
  weighted isotonic regression. Refits under request-bootstrap weights are a bincount,
  which is what makes the aggregate bootstrap cheap.
* ``logistic``: per-position intercept and slope on ``logit(c)``.
* ``confidence``: the (calibrated) confidence itself, no fit.

Example::

    >>> from estimators.synthetic import simulate
    >>> from estimators.frame import BlockFrame
    >>> from estimators.hazard import HazardModel
    >>> bf = BlockFrame.from_request_steps(simulate(n_requests=60, seed=2).tables["request_steps"])
    >>> hm = HazardModel().fit(bf)
    >>> h = hm.predict(bf)
    >>> bool(((h >= 0) & (h <= 1)).all())
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sklearn.isotonic import IsotonicRegression

from estimators.frame import BlockFrame

_CLIP = 1e-4


def conf_feature(c: np.ndarray) -> np.ndarray:
    """logit of the (rounded, post-STS) confidence, clipped; NaN confidence -> 0 (c = 0.5)."""
    c = np.where(np.isnan(c), 0.5, c)
    c = np.clip(c, _CLIP, 1 - _CLIP)
    return np.log(c / (1 - c))


def known_hazards(frame: BlockFrame, walk: np.ndarray | None = None) -> np.ndarray:
    """``(n, G)`` matrix of per-position acceptance probabilities that are *known* for each row
    (given the earlier positions were accepted); NaN where unknown or never reachable.

    Truth rows (ceiling known): 1 before the ceiling, 0 at it. Others: in-window outcomes
    (1 before ``correct``, 0 at ``correct`` when it is inside the window) plus, for the
    trimmed positions, the tail walk's known hazards ``walk`` (from :func:`estimators.tail.walk`).
    """
    n, G = frame.n, frame.gamma
    k = np.arange(G)[None, :]
    H = np.full((n, G), np.nan)
    cl = frame.correct[:, None]
    w = frame.window[:, None]
    H = np.where(k < cl, 1.0, H)
    H = np.where((k == cl) & (cl < w), 0.0, H)
    if walk is not None:
        H = np.where((k >= w) & (cl == w), walk, H)
    truth = frame.ceiling[:, None]
    has = frame.has_truth[:, None]
    H = np.where(has, np.where(k < truth, 1.0, np.where(k == truth, 0.0, np.nan)), H)
    return H


@dataclass
class HazardModel:
    """Per-position hazard of acceptance given confidence (see module docstring)."""

    method: str = "binned"
    n_bins: int = 16
    prior_strength: float = 4.0
    source: str = "auto"  # truth | observed | auto (truth rows if any, else observed)
    fitted_: bool = False
    info_: dict = field(default_factory=dict)

    # ------------------------------------------------------------------
    def _long(self, frame: BlockFrame, walk: np.ndarray | None):
        H = known_hazards(frame, walk)
        if self.source == "truth" or (self.source == "auto" and frame.has_truth.any()):
            H = np.where(frame.has_truth[:, None], H, np.nan)
            used = "truth"
        else:
            used = "observed"
        # probability of reaching position k given known hazards (soft labels)
        reach = np.cumprod(np.where(np.isnan(H), 1.0, H), 1)
        reach = np.concatenate([np.ones((frame.n, 1)), reach[:, :-1]], 1)
        ok = ~np.isnan(H) & (reach > 0)
        # a position after an unknown one is still usable: its reach weight uses known parts only
        r, k = np.nonzero(ok)
        x = conf_feature(frame.confidence[r, k])
        return dict(row=r, k=k, x=x, y=H[r, k], wt=reach[r, k], greedy=frame.greedy[r],
                    req=frame.request[r], n_req=int(frame.request.max()) + 1), used

    def fit(self, frame: BlockFrame, walk: np.ndarray | None = None, sample_weight_by_request=None) -> "HazardModel":
        """Fit on a frame. ``walk``: known tail hazards for rows without truth (``source='observed'``)."""
        G = frame.gamma
        self.gamma_ = G
        if self.method == "confidence":
            self.fitted_ = True
            self.info_ = dict(method="confidence", source="none")
            return self
        L, used = self._long(frame, walk)
        self._train = L
        self.info_ = dict(method=self.method, source=used, n_positions=int(L["k"].size),
                          n_rows=int(np.unique(L["row"]).size))
        if L["k"].size == 0:
            raise ValueError("no training positions for the hazard model (no truth rows and nothing observed)")
        if self.method == "binned":
            # bin edges per (greedy, k) from the unweighted training features
            self.edges_ = {}
            for g in (False, True):
                for k in range(G):
                    m = (L["greedy"] == g) & (L["k"] == k)
                    xs = L["x"][m]
                    if xs.size >= 2 * self.n_bins:
                        e = np.unique(np.quantile(xs, np.linspace(0, 1, self.n_bins + 1)[1:-1]))
                    else:
                        e = np.array([])
                    self.edges_[(g, k)] = e
            self._table(weights=sample_weight_by_request)
        elif self.method == "logistic":
            self._fit_logistic(sample_weight_by_request)
        else:
            raise ValueError(f"unknown hazard method {self.method!r}")
        self.fitted_ = True
        return self

    def _bin_index(self, g: np.ndarray, k: np.ndarray, x: np.ndarray) -> np.ndarray:
        G = self.gamma_
        out = np.zeros(x.shape, np.int64)
        for gg in (False, True):
            for kk in range(G):
                m = (g == gg) & (k == kk)
                if m.any():
                    out[m] = np.searchsorted(self.edges_[(gg, kk)], x[m], side="right")
        return out

    def _table(self, weights=None) -> None:
        L = self._train
        G, nb = self.gamma_, self.n_bins
        if not hasattr(self, "_cell"):
            b = self._bin_index(L["greedy"], L["k"], L["x"])
            self._cell = (L["greedy"].astype(np.int64) * G + L["k"]) * nb + b
        cell = self._cell
        wt = L["wt"] if weights is None else L["wt"] * weights[L["req"]]
        ncell = 2 * G * nb
        n = np.bincount(cell, weights=wt, minlength=ncell)
        a = np.bincount(cell, weights=wt * L["y"], minlength=ncell)
        xs = np.bincount(cell, weights=wt * L["x"], minlength=ncell)
        n2, a2 = n.reshape(2 * G, nb), a.reshape(2 * G, nb)
        pooled = (a2.sum(1) + 0.5) / (n2.sum(1) + 1.0)
        # fall back from greedy to sampled pooled rates if one family is empty
        rate = (a2 + self.prior_strength * pooled[:, None]) / (n2 + self.prior_strength)
        ctr = np.where(n > 0, xs / np.maximum(n, 1e-12), np.nan).reshape(2 * G, nb)
        out = np.empty_like(rate)
        for i in range(2 * G):
            m = n2[i] > 0
            if m.sum() >= 2:
                iso = IsotonicRegression(increasing=True, y_min=0.0, y_max=1.0, out_of_bounds="clip")
                iso.fit(np.arange(nb)[m], rate[i, m], sample_weight=n2[i, m] + self.prior_strength)
                out[i] = iso.predict(np.arange(nb))
            else:
                out[i] = pooled[i]
        self.table_ = np.clip(out, 1e-6, 1 - 1e-6)
        self.counts_ = n2
        self.centers_ = ctr

    def _fit_logistic(self, weights=None) -> None:
        from sklearn.linear_model import LogisticRegression

        L = self._train
        G = self.gamma_
        self.coef_ = {}
        wt = L["wt"] if weights is None else L["wt"] * weights[L["req"]]
        for g in (False, True):
            m = L["greedy"] == g
            if not m.any():
                continue
            k, x, y, w = L["k"][m], L["x"][m], L["y"][m], wt[m]
            X = np.zeros((k.size, 2 * G))
            X[np.arange(k.size), k] = 1.0
            X[np.arange(k.size), G + k] = x
            Xd = np.concatenate([X, X])
            yd = np.concatenate([np.ones(k.size), np.zeros(k.size)])
            wd = np.concatenate([w * y, w * (1 - y)])
            keep = wd > 0
            lr = LogisticRegression(C=10.0, fit_intercept=False, max_iter=500)
            lr.fit(Xd[keep], yd[keep], sample_weight=wd[keep])
            self.coef_[g] = lr.coef_[0]

    # ------------------------------------------------------------------
    def predict(self, frame: BlockFrame, rows: np.ndarray | None = None) -> np.ndarray:
        """``(len(rows), G)`` hazards for every position of the given rows."""
        if not self.fitted_:
            raise RuntimeError("HazardModel is not fitted")
        rows = np.arange(frame.n) if rows is None else rows
        G = frame.gamma
        c = frame.confidence[rows]
        if self.method == "confidence":
            return np.clip(np.where(np.isnan(c), 0.5, c), 0, 1)
        if G != self.gamma_:
            raise ValueError(f"hazard model fitted for gamma={self.gamma_}, frame has gamma={G}")
        x = conf_feature(c)
        g = np.broadcast_to(frame.greedy[rows][:, None], x.shape)
        k = np.broadcast_to(np.arange(G)[None, :], x.shape)
        if self.method == "binned":
            b = self._bin_index(g.ravel(), k.ravel(), x.ravel()).reshape(x.shape)
            return self.table_[(g.astype(np.int64) * G + k), b]
        out = np.empty(x.shape)
        for gg in (False, True):
            coef = self.coef_.get(gg, self.coef_.get(not gg))
            z = coef[k] + coef[G + k] * x
            out = np.where(g == gg, 1 / (1 + np.exp(-z)), out)
        return out

    def refit(self, request_weights: np.ndarray) -> "HazardModel":
        """A copy refitted with per-training-request weights (cluster bootstrap)."""
        import copy

        m = copy.copy(self)
        if self.method == "binned":
            m._table(weights=request_weights)
        elif self.method == "logistic":
            m._fit_logistic(weights=request_weights)
        return m
