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

from estimators.frame import BlockFrame

_CLIP = 1e-4


def _pava(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) regression by pool-adjacent-violators."""
    vals, wts, cnt = [], [], []
    for yi, wi in zip(y.tolist(), w.tolist()):
        vals.append(yi)
        wts.append(wi)
        cnt.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            v2, w2, c2 = vals.pop(), wts.pop(), cnt.pop()
            tw = wts[-1] + w2
            vals[-1] = (vals[-1] * wts[-1] + v2 * w2) / tw
            wts[-1] = tw
            cnt[-1] += c2
    return np.repeat(vals, cnt)


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
    def _long(self, frame: BlockFrame, walk: np.ndarray | None, state: np.ndarray | None):
        G = frame.gamma
        k = np.arange(G)[None, :]
        st = np.zeros((frame.n, G), np.int64) if state is None else state
        if self.source == "truth" or (self.source == "auto" and frame.has_truth.any()):
            # the population the model is used on: trimmed positions of censored blocks, reached
            K = frame.ceiling[:, None]
            w = frame.window[:, None]
            ok = frame.has_truth[:, None] & frame.censored[:, None] & (k >= w) & (k <= K) & (k < G)
            r, kk = np.nonzero(ok)
            y = (kk < frame.ceiling[r]).astype(float)
            wt = np.ones(r.size)
            used = "truth"
        else:
            H = known_hazards(frame, walk)
            reach = np.cumprod(np.where(np.isnan(H), 1.0, H), 1)
            reach = np.concatenate([np.ones((frame.n, 1)), reach[:, :-1]], 1)
            ok = ~np.isnan(H) & (reach > 0)
            r, kk = np.nonzero(ok)
            y, wt = H[r, kk], reach[r, kk]
            st = np.zeros((frame.n, G), np.int64)  # no unobserved-state data without truth
            used = "observed"
        x = conf_feature(frame.confidence[r, kk])
        return dict(row=r, k=kk, x=x, y=y, wt=wt, greedy=frame.greedy[r], state=st[r, kk],
                    req=frame.request[r], n_req=int(frame.request.max()) + 1), used

    def fit(self, frame: BlockFrame, walk: np.ndarray | None = None, state: np.ndarray | None = None,
            sample_weight_by_request=None) -> "HazardModel":
        """Fit on a frame. ``walk``: known tail hazards for rows without truth (``source='observed'``);
        ``state``: the walk state of every (row, position) (0 unknown, 1 matched so far, 2 diverged)."""
        G = frame.gamma
        self.gamma_ = G
        if self.method == "confidence":
            self.fitted_ = True
            self.info_ = dict(method="confidence", source="none")
            return self
        L, used = self._long(frame, walk, state)
        self._train = L
        self.info_ = dict(method=self.method, source=used, n_positions=int(L["k"].size),
                          n_rows=int(np.unique(L["row"]).size))
        if L["k"].size == 0:
            raise ValueError("no training positions for the hazard model (no truth rows and nothing observed)")
        if self.method == "binned":
            # bin edges per (greedy, k) from the unweighted training features
            self.edges_ = {}
            for k in range(G):
                xs = L["x"][L["k"] == k]
                if xs.size >= 2 * self.n_bins:
                    e = np.unique(np.quantile(xs, np.linspace(0, 1, self.n_bins + 1)[1:-1]))
                else:
                    e = np.array([])
                self.edges_[k] = e
            self._table(weights=sample_weight_by_request)
        elif self.method == "logistic":
            self._fit_logistic(sample_weight_by_request)
        else:
            raise ValueError(f"unknown hazard method {self.method!r}")
        self.fitted_ = True
        return self

    def _bin_index(self, k: np.ndarray, x: np.ndarray) -> np.ndarray:
        out = np.zeros(x.shape, np.int64)
        for kk in range(self.gamma_):
            m = k == kk
            if m.any():
                out[m] = np.searchsorted(self.edges_[kk], x[m], side="right")
        return out

    NSTATE = 4

    def _group(self, g, st, k):
        return (g.astype(np.int64) * self.NSTATE + st) * self.gamma_ + k

    def _table(self, weights=None) -> None:
        L = self._train
        G, nb = self.gamma_, self.n_bins
        ngrp = 2 * self.NSTATE * G
        if not hasattr(self, "_cell"):
            self._grp = self._group(L["greedy"], L["state"], L["k"])
            self._cell = self._grp * nb + self._bin_index(L["k"], L["x"])
        cell = self._cell
        wt = L["wt"] if weights is None else L["wt"] * weights[L["req"]]
        n2 = np.bincount(cell, weights=wt, minlength=ngrp * nb).reshape(ngrp, nb)
        a2 = np.bincount(cell, weights=wt * L["y"], minlength=ngrp * nb).reshape(ngrp, nb)
        # hierarchical shrinkage: cell -> (greedy, state, k) -> (greedy, k) -> (greedy)
        ng, ag = n2.sum(1), a2.sum(1)
        gk_n = ng.reshape(2, self.NSTATE, G).sum(1)
        gk_a = ag.reshape(2, self.NSTATE, G).sum(1)
        g_rate = (gk_a.sum(1) + 0.5) / (gk_n.sum(1) + 1.0)
        gk_rate = (gk_a + self.prior_strength * g_rate[:, None]) / (gk_n + self.prior_strength)
        prior = np.repeat(gk_rate[:, None, :], self.NSTATE, 1).reshape(ngrp)
        grp_rate = (ag + self.prior_strength * prior) / (ng + self.prior_strength)
        rate = (a2 + self.prior_strength * grp_rate[:, None]) / (n2 + self.prior_strength)
        out = np.empty_like(rate)
        for i in range(ngrp):
            m = n2[i] > 0
            if m.sum() >= 2:
                # bins without data take the fitted value of the nearest populated bin
                fitted = _pava(rate[i, m], n2[i, m] + self.prior_strength)
                idx = np.flatnonzero(m)
                out[i] = fitted[np.clip(np.searchsorted(idx, np.arange(nb)), 0, idx.size - 1)]
                lower = np.searchsorted(idx, np.arange(nb), side="right") - 1
                out[i] = np.where((lower >= 0) & ~m, fitted[np.clip(lower, 0, None)], out[i])
            else:
                out[i] = grp_rate[i]
        self.table_ = np.clip(out, 1e-6, 1 - 1e-6)
        self.counts_ = n2

    def _design(self, k, x, st):
        G = self.gamma_
        X = np.zeros((k.size, 2 * G + 2 * self.NSTATE))
        X[np.arange(k.size), k] = 1.0
        X[np.arange(k.size), G + k] = x
        X[np.arange(k.size), 2 * G + st] = 1.0
        X[np.arange(k.size), 2 * G + self.NSTATE + st] = x
        return X

    def _fit_logistic(self, weights=None) -> None:
        from sklearn.linear_model import LogisticRegression

        L = self._train
        self.coef_ = {}
        wt = L["wt"] if weights is None else L["wt"] * weights[L["req"]]
        for g in (False, True):
            m = L["greedy"] == g
            if not m.any():
                continue
            k, x, y, w = L["k"][m], L["x"][m], L["y"][m], wt[m]
            X = self._design(k, x, L["state"][m])
            Xd = np.concatenate([X, X])
            yd = np.concatenate([np.ones(k.size), np.zeros(k.size)])
            wd = np.concatenate([w * y, w * (1 - y)])
            keep = wd > 0
            lr = LogisticRegression(C=10.0, fit_intercept=False, max_iter=500)
            lr.fit(Xd[keep], yd[keep], sample_weight=wd[keep])
            self.coef_[g] = lr.coef_[0]

    # ------------------------------------------------------------------
    def predict(self, frame: BlockFrame, rows: np.ndarray | None = None, state: np.ndarray | None = None) -> np.ndarray:
        """``(len(rows), G)`` hazards for every position of the given rows (``state``: walk state)."""
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
        st = np.zeros(x.shape, np.int64) if state is None else state
        if self.info_.get("source") == "observed":
            st = np.zeros(x.shape, np.int64)
        g = np.broadcast_to(frame.greedy[rows][:, None], x.shape)
        k = np.broadcast_to(np.arange(G)[None, :], x.shape)
        if self.method == "binned":
            b = self._bin_index(k.ravel(), x.ravel()).reshape(x.shape)
            return self.table_[self._group(g, st, k), b]
        out = np.empty(x.shape)
        for gg in (False, True):
            coef = self.coef_.get(gg, self.coef_.get(not gg))
            z = self._design(k.ravel(), x.ravel(), st.ravel()) @ coef
            out = np.where(g == gg, 1 / (1 + np.exp(-z.reshape(x.shape))), out)
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
