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

* ``logistic`` (default): per greedy/sampled, a logistic regression on an intercept and a
  ``logit(c)`` slope per cell index plus an intercept and a slope per walk state (additive in
  logit: the confidence slope is shared, so small cells keep it). Cross-fitted on the
  reference engine it is calibrated (reliability within a few points in every hazard decile;
  unresolved-block bias ~0) where the binned table, shrunk toward flat cell means, was
  under-confident (predicted 0.3 / 0.85 hazards were 0.1 / 0.92 empirically). Refits under
  request-bootstrap weights are two or three Newton steps each from the full fit (:func:`fit_penalized_logistic`).
  Keyed (``keys``, default :data:`KEYS`) by the sampling temperature and the workload label: an
  intercept and a ``logit(c)`` slope per temperature level and per workload, additive in logit.
  Why: with the retrained fixture pair acceptance at a given confidence differs by both, and the
  unkeyed model (pooling T = 0.7 with T = 1, chat with math) biased every aggregate whose interval
  is narrow (10 of 29 groups covered). Both are known for every request in production. A level
  without training data (a temperature the training runs never served, a workload label they
  never carried) gets the training-share-weighted mean of the levels' terms, the pooled hazard,
  and the estimate says so in its notes. ``binned`` is not keyed.
  ``temperature_model='continuous'``: instead of levels, a centred, scaled temperature ``tau`` and
  ``tau * logit(c)`` for sampled requests (greedy ones: no temperature term), so a temperature
  between trained ones is interpolated and one outside the trained range is clamped to it (with a
  note); ``temperature_position`` adds a ``tau`` term per cell index. Not the default: on the paired
  grid's truth runs it beat the pooled levels at held-out temperatures but was no better calibrated,
  and the levels fitted a pooled multi-temperature run better (docs/hazard.md has the numbers).
* ``binned``: per (greedy, walk state, offset ``k - window`` into the trimmed
  tail), quantile bins of ``logit(c)``, rates shrunk toward the (greedy, walk state) rate
  pooled over offsets, made monotone in confidence by weighted isotonic regression. The
  number of bins (``n_bins='auto'``) is chosen by request-grouped cross-validated
  log-likelihood on the training data, on the positions the model is used for (those the
  walk left unknown): confidence is informative for a real drafter and pure noise in some
  toy decodes (SGLang's fixture). Refits under request-bootstrap weights are a bincount,
  which is what makes the aggregate bootstrap cheap.
* ``confidence``: the (calibrated) confidence itself, no fit.

Cells follow what the walk knew (:func:`estimators.tail.walk`). Walk states: 1 the realized
tokens matched the trimmed drafts so far, 2 a realized token diverged earlier, 0 the stream
ended earlier, 3 known (never predicted); refined here into 4 (the *first* trimmed position
unobserved: a last step without a recorded bonus) and 5-7 (states 0-2 two or more positions
past the first trimmed one, which the walk knew only softly or not at all). The index is the
offset into the trimmed tail rather than the absolute position (models fitted on observed
in-window outcomes, without truth, keep the absolute position). The old layout (absolute
position, prior pooled over states per position) mixed populations with very different
hazards: the rare unknown states were pulled toward the first-trimmed-position rate, which
the scheduler keeps low (~0.18), so unresolved sampled blocks were underestimated by ~0.17
drafts on the reference engine.

Example::

    >>> from acceptscope.estimators.synthetic import simulate
    >>> from acceptscope.estimators.frame import BlockFrame
    >>> from acceptscope.estimators.hazard import HazardModel
    >>> bf = BlockFrame.from_request_steps(simulate(n_requests=60, seed=2).tables["request_steps"])
    >>> hm = HazardModel().fit(bf)
    >>> h = hm.predict(bf)
    >>> bool(((h >= 0) & (h <= 1)).all())
    True
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import isotonic_regression
from threadpoolctl import threadpool_limits

from acceptscope.estimators.frame import BlockFrame

_CLIP = 1e-4
L2_C = 10.0  # the logistic hazard's inverse L2 penalty: |b|^2 / 20 against the summed weighted log-loss, a weak pull
KEYS = ("temperature", "workload")  # what the logistic hazard is keyed by, beyond cell, walk state, greedy


def fit_penalized_logistic(X: np.ndarray, pos: np.ndarray, neg: np.ndarray, C: float = L2_C,
                           start: np.ndarray | None = None, tol: float = 1e-9, max_iter: int = 100) -> np.ndarray:
    """``argmin_b sum_j pos_j log(1 + e^-z_j) + neg_j log(1 + e^z_j) + |b|^2 / (2 C)``, ``z = X b``: a logistic
    regression on distinct design rows with accepted / rejected weights, L2-penalized, no separate intercept
    (scikit-learn's ``LogisticRegression(C=C, fit_intercept=False)`` objective, ``tests/test_hazard_fit.py``).

    Why our own: the design has a few tens of columns, so Newton's method with the exact Hessian reaches the
    optimum in a handful of steps (two or three from a warm start: a bootstrap refit), where lbfgs stopped at its
    tolerance; and importing scikit-learn cost ~0.5 CPU-s in every process that fits a hazard.

    Example::

        >>> X = np.array([[1.0, -1.0], [1.0, 0.0], [1.0, 1.0]])
        >>> b = fit_penalized_logistic(X, np.array([2.0, 5.0, 9.0]), np.array([8.0, 5.0, 1.0]), C=1e6)
        >>> bool(b[1] > 1.5)   # acceptance rises with the second column
        True
    """
    n = pos + neg
    b = np.zeros(X.shape[1]) if start is None else np.array(start, float)

    def objective(beta):
        z = X @ beta
        return float(pos @ np.logaddexp(0.0, -z) + neg @ np.logaddexp(0.0, z) + beta @ beta / (2 * C))

    f = objective(b)
    eye = np.eye(X.shape[1]) / C
    for _ in range(max_iter):
        p = 1.0 / (1.0 + np.exp(-(X @ b)))
        grad = X.T @ (n * p - pos) + b / C
        hess = (X.T * (n * p * (1 - p))) @ X + eye
        step = np.linalg.solve(hess, grad)
        if np.max(np.abs(step)) < tol:  # converged (quadratically): the last step is below rounding
            return b - step
        t, decrease = 1.0, float(grad @ step)
        while True:  # backtracking (Armijo): Newton's full step can overshoot far from the optimum
            nb = b - t * step
            nf = objective(nb)
            if nf <= f - 1e-4 * t * decrease + 1e-12 * abs(f) or t < 1e-8:
                break
            t *= 0.5
        b, f = nb, nf
    return b


def temperature_key(t: np.ndarray) -> np.ndarray:
    """The sampling temperature as a hazard level: greedy (T <= 0) is 0, others rounded to 3 dp
    (a float32 0.7 and a float64 0.7 are one level)."""
    t = np.asarray(t, float)
    return np.round(np.where(t <= 0, 0.0, t), 3)


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

    method: str = "logistic"
    n_bins: int | str = "auto"  # or an int; 'auto': cross-validated over bin_candidates
    prior_strength: float = 4.0
    bin_candidates: tuple = (1, 2, 4, 8, 16)
    cv_folds: int = 3
    index: str = "offset"  # cells by offset into the trimmed tail (k - window) or absolute "position" k
    source: str = "auto"  # truth | observed | auto (truth rows if any, else observed)
    keys: tuple = KEYS  # logistic: per-level intercept and confidence slope for each (see _set_levels)
    temperature_model: str = "levels"  # logistic: one-hot "levels" or "continuous" (tau, tau * logit c): docs/hazard.md
    temperature_position: bool = False  # continuous: a tau term per cell index too (measured: docs/hazard.md)
    workload_position: bool = True  # an intercept per (workload, cell index past the first) (measured: docs/hazard.md)
    fitted_: bool = False
    info_: dict = field(default_factory=dict)

    # ------------------------------------------------------------------
    def _eff_state(self, frame: BlockFrame, rows: np.ndarray, state: np.ndarray | None) -> np.ndarray:
        """The walk state refined by where the walk's knowledge ends: 4 the first trimmed position
        unobserved; states 0-2 one position past the first trimmed one (whose outcome is exact)
        stay 0-2, deeper ones become 5-7 (the positions before them were known only softly,
        or not at all). 3 (known) is never predicted."""
        G = frame.gamma
        st = np.zeros((len(rows), G), np.int64) if state is None else np.array(state, np.int64)
        kw = np.arange(G)[None, :] - frame.window[rows][:, None]
        st = np.where((kw >= 2) & (st != 3), st + 5, st)
        return np.where((kw == 0) & (st != 3), 4, st)

    def _kidx(self, frame: BlockFrame, rows: np.ndarray, source: str | None = None) -> np.ndarray:
        """Cell index of every position of ``rows``: the offset ``k - window`` into the trimmed tail
        (truth-fitted models; what the walk knew depends on it: the first trimmed position is exact,
        later ones soft or unknown), or the absolute position ``k`` (``index='position'``, and
        models fitted on observed in-window outcomes)."""
        G = frame.gamma
        k = np.broadcast_to(np.arange(G)[None, :], (len(rows), G))
        if self.index == "position" or (source or self.info_.get("source")) == "observed":
            return k
        return np.clip(k - frame.window[rows][:, None], 0, G - 1)

    def _long(self, frame: BlockFrame, walk: np.ndarray | None, state: np.ndarray | None):
        G = frame.gamma
        k = np.arange(G)[None, :]
        st = self._eff_state(frame, np.arange(frame.n), state)
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
        ki = self._kidx(frame, np.arange(frame.n), used)[r, kk]
        return dict(row=r, k=ki, x=x, y=y, wt=wt, greedy=frame.greedy[r], state=st[r, kk],
                    req=frame.request[r], n_req=int(frame.request.max()) + 1, temp=frame.temperature[r],
                    workload=frame.workload[r]), used

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
        return self.fit_long(L, used, G, sample_weight_by_request)

    def fit_long(self, L: dict, used: str, gamma: int, sample_weight_by_request=None) -> "HazardModel":
        """Fit on a training layout already built by :meth:`_long` (one entry per training position;
        the Spark path builds it per partition of requests and concatenates it in frame order)."""
        self.gamma_ = gamma
        self._train = L
        self.info_ = dict(method=self.method, source=used, n_positions=int(L["k"].size),
                          n_rows=int(np.unique(L["row"]).size))
        if L["k"].size == 0:
            raise ValueError("no training positions for the hazard model (no truth rows and nothing observed)")
        if self.method == "binned":
            self.n_bins_ = self._select_bins(L) if self.n_bins == "auto" else int(self.n_bins)
            self.info_["n_bins"] = self.n_bins_
            self._set_edges()
            self._table(weights=sample_weight_by_request)
        elif self.method == "logistic":
            self._set_levels(L)
            self._fit_logistic(sample_weight_by_request)
        else:
            raise ValueError(f"unknown hazard method {self.method!r}")
        self.fitted_ = True
        return self

    def _set_edges(self) -> None:
        """Bin edges per cell index, from the unweighted training features."""
        L, nb = self._train, self.n_bins_
        self.edges_ = {}
        for k in range(self.gamma_):
            xs = L["x"][L["k"] == k]
            if nb > 1 and xs.size >= 2 * nb:
                e = np.unique(np.quantile(xs, np.linspace(0, 1, nb + 1)[1:-1]))
            else:
                e = np.array([])
            self.edges_[k] = e

    def _select_bins(self, L: dict) -> int:
        """Number of confidence bins by request-grouped K-fold log-likelihood on the training
        positions the model is used for (walk state != 3); ties -> fewer bins."""
        cands = [int(c) for c in self.bin_candidates]
        use = L["state"] != 3
        if len(cands) == 1 or use.sum() < 50:
            return max(cands)
        fold = np.random.default_rng(0).integers(0, self.cv_folds, L["n_req"])[L["req"]]
        score = np.zeros(len(cands))
        for j in range(self.cv_folds):
            tr, te = fold != j, (fold == j) & use
            if not te.any() or not tr.any():
                continue
            sub = {key: (v[tr] if isinstance(v, np.ndarray) and v.shape == L["k"].shape else v) for key, v in L.items()}
            y, wt = L["y"][te], L["wt"][te]
            for i, nb in enumerate(cands):
                m = HazardModel(method="binned", n_bins=nb, prior_strength=self.prior_strength)
                m.gamma_, m.n_bins_, m._train = self.gamma_, nb, sub
                m._set_edges()
                m._table()
                p = m.table_[m._group(L["greedy"][te], L["state"][te], L["k"][te]), m._bin_index(L["k"][te], L["x"][te])]
                score[i] += np.sum(wt * (y * np.log(p) + (1 - y) * np.log1p(-p)))
        self.info_["bins_cv_loglik"] = dict(zip(cands, np.round(score, 3).tolist()))
        return cands[int(np.flatnonzero(score >= score.max() - 1e-9)[0])]

    def _bin_index(self, k: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``searchsorted(edges_[k], x, 'right')`` elementwise, in one pass: locate ``x`` among the
        union of all edges, then count each position's own edges up to there (exact: every edge is
        in the union)."""
        edges = [np.asarray(self.edges_[kk], float) for kk in range(self.gamma_)]
        union = np.unique(np.concatenate(edges))
        below = np.concatenate([[-np.inf], union])  # the largest union value <= x, by slot
        counts = np.stack([np.searchsorted(e, below, side="right") for e in edges])  # (gamma, slots)
        return counts[k, np.searchsorted(union, x, side="right")]

    NSTATE = 8

    def _group(self, g, st, k):
        return (g.astype(np.int64) * self.NSTATE + st) * self.gamma_ + k

    def _table(self, weights=None) -> None:
        L = self._train
        G, nb, S = self.gamma_, self.n_bins_, self.NSTATE
        ngrp = 2 * S * G
        if not hasattr(self, "_cell"):
            self._grp = self._group(L["greedy"], L["state"], L["k"])
            self._cell = self._grp * nb + self._bin_index(L["k"], L["x"])
        cell = self._cell
        wt = L["wt"] if weights is None else L["wt"] * weights[L["req"]]
        n2 = np.bincount(cell, weights=wt, minlength=ngrp * nb).reshape(ngrp, nb)
        a2 = np.bincount(cell, weights=wt * L["y"], minlength=ngrp * nb).reshape(ngrp, nb)
        # hierarchical shrinkage: cell -> (greedy, state, k) -> (greedy, state) -> (greedy)
        ng, ag = n2.sum(1), a2.sum(1)
        gs_n = ng.reshape(2, S, G).sum(2)
        gs_a = ag.reshape(2, S, G).sum(2)
        g_rate = (gs_a.sum(1) + 0.5) / (gs_n.sum(1) + 1.0)
        gs_rate = (gs_a + self.prior_strength * g_rate[:, None]) / (gs_n + self.prior_strength)
        prior = np.repeat(gs_rate[:, :, None], G, 2).reshape(ngrp)
        grp_rate = (ag + self.prior_strength * prior) / (ng + self.prior_strength)
        rate = (a2 + self.prior_strength * grp_rate[:, None]) / (n2 + self.prior_strength)
        out = np.empty_like(rate)
        for i in range(ngrp):
            m = n2[i] > 0
            if m.sum() >= 2:
                # bins without data take the fitted value of the nearest populated bin
                fitted = isotonic_regression(rate[i, m], weights=n2[i, m] + self.prior_strength).x
                idx = np.flatnonzero(m)
                out[i] = fitted[np.clip(np.searchsorted(idx, np.arange(nb)), 0, idx.size - 1)]
                lower = np.searchsorted(idx, np.arange(nb), side="right") - 1
                out[i] = np.where((lower >= 0) & ~m, fitted[np.clip(lower, 0, None)], out[i])
            else:
                out[i] = grp_rate[i]
        self.table_ = np.clip(out, 1e-6, 1 - 1e-6)
        self.counts_ = n2

    # ------------------------------------------------------------------
    # temperature and workload levels (logistic)
    def _set_levels(self, L: dict) -> None:
        """Levels of the keys seen in training, each training position's code, and per greedy/sampled
        the training share of every level. Why: with the retrained fixture pair acceptance at a given
        confidence differs by sampling temperature and workload (pooled, T = 0.7 runs were over- and
        T = 1 runs under-estimated beyond their aggregate intervals). Both are known per request in
        production. A level the training never saw (a temperature, a workload label) is predicted
        with the share-weighted mean of the trained levels' terms: the pooled hazard, said in the
        estimate's notes (:meth:`fallback_notes`)."""
        n = L["k"].size
        if self.temperature_model not in ("levels", "continuous"):
            raise ValueError(f"unknown temperature_model {self.temperature_model!r} (levels or continuous)")
        use_t = "temperature" in self.keys and "temp" in L
        use_w = "workload" in self.keys and "workload" in L
        t = temperature_key(L["temp"]) if use_t else np.zeros(n)
        self.temps_ = np.unique(t) if use_t else np.zeros(0)
        self.trange_ = None
        if self.temperature_model == "continuous":
            self._set_tau(t, L["wt"], use_t)
            L["tau"] = self._tau(t)
        wl = np.asarray(L["workload"], object) if use_w else np.zeros(0, object)
        wc, wu = pd.factorize(wl, sort=True) if use_w else (np.zeros(n, np.int64), [])
        self.workloads_ = [str(w) for w in wu]
        if self.trange_ is not None:  # the distinct tau values' codes: what _logistic_cells dedupes by
            L["t"] = np.asarray(pd.factorize(L["tau"], sort=True)[0], np.int64)
        else:
            L["t"] = np.searchsorted(self.temps_, t).astype(np.int64) if use_t else np.zeros(n, np.int64)
        L["w"] = np.asarray(wc, np.int64)
        NT, NW = self._nlev(), len(self.workloads_)
        self.shares_ = {}
        for g in (False, True):
            m = L["greedy"] == g
            ts = np.bincount(L["t"][m], weights=L["wt"][m], minlength=NT)[:NT]
            ws = np.bincount(L["w"][m], weights=L["wt"][m], minlength=NW)[:NW]
            self.shares_[g] = (ts / max(ts.sum(), 1e-300), ws / max(ws.sum(), 1e-300))
        self.info_.update(temperatures=self.temps_.tolist(), workloads=list(self.workloads_),
                          temperature_model=self.temperature_model if use_t else "none")
        if self.trange_ is not None:
            self.info_["temperature_range"] = [float(v) for v in self.trange_]

    def _set_tau(self, t: np.ndarray, wt: np.ndarray, use_t: bool) -> None:
        """The continuous temperature term's centring, scale and trained range, from the sampled
        training positions (greedy ones carry no temperature term). Why: production requests pick their
        own temperatures (0.6, 0.65, 0.72 ...); one-hot levels made a sparse level of each and pooled any
        temperature the training never served, where a slope in temperature interpolates."""
        s = t > 0
        if not use_t or not s.any():
            return
        ts, ws = t[s], np.maximum(wt[s], 0) + 1e-12
        c = float(np.average(ts, weights=ws))
        sd = float(np.sqrt(np.average((ts - c) ** 2, weights=ws)))
        self.tcs_ = (c, sd if sd > 1e-6 else 1.0)
        self.trange_ = (float(ts.min()), float(ts.max()))

    def _tau(self, t: np.ndarray) -> np.ndarray:
        """Centred, scaled temperature of sampled rows, clamped to the trained range; 0 for greedy rows
        (no temperature term) and for every row of a model without a trained range."""
        t = np.asarray(t, float)
        if self.trange_ is None:
            return np.zeros(t.shape)
        (c, sd), (lo, hi) = self.tcs_, self.trange_
        return np.where(t > 0, (np.clip(t, lo, hi) - c) / sd, 0.0)

    def _continuous(self) -> bool:
        return getattr(self, "trange_", None) is not None

    def _nlev(self) -> int:
        """Temperature levels of the one-hot model (0 for the continuous one)."""
        return 0 if self.temperature_model == "continuous" else len(getattr(self, "temps_", ()))

    def _ntcol(self) -> int:
        """Design columns of the temperature term: 2 per level, or tau and tau * x (and tau per cell
        index past the first, with ``temperature_position``)."""
        if self._continuous():
            return 2 + (self.gamma_ - 1 if self.temperature_position else 0)
        return 2 * self._nlev()

    def _codes(self, frame: BlockFrame, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Temperature and workload codes of rows (``len(levels)``: unseen, pooled); the continuous
        model's temperature code is the row's tau (clamped to the trained range)."""
        NT, NW = self._nlev(), len(getattr(self, "workloads_", ()))
        t = np.full(len(rows), NT, np.int64)
        if self._continuous():
            t = self._tau(temperature_key(frame.temperature[rows]))
        elif NT:
            tk = temperature_key(frame.temperature[rows])
            i = np.minimum(np.searchsorted(self.temps_, tk), NT - 1)
            t = np.where(self.temps_[i] == tk, i, NT)
        w = np.full(len(rows), NW, np.int64)
        if NW:  # the frame's workload codes: only its handful of labels are looked up
            level = {v: i for i, v in enumerate(self.workloads_)}
            lv = np.array([level.get(str(v), NW) for v in frame.workload_labels], np.int64)
            w = lv.take(frame.workload_codes[rows])
        return t, w

    def fallback_notes(self, frame: BlockFrame, rows: np.ndarray) -> list[str]:
        """Notes for rows whose temperature or workload the hazards were not trained on (pooled there)."""
        if self.method != "logistic" or not self.fitted_ or not len(rows):
            return []
        out = []  # compares the rows' distinct levels with the trained ones (no per-row codes)
        fmt = lambda v: ", ".join(f"{x:g}" for x in v)  # noqa: E731
        if self._continuous():
            out += self._clamp_notes(np.unique(temperature_key(frame.temperature[rows])), fmt)
        elif len(self.temps_) and self.temperature_model == "continuous":  # no sampled training: greedy only
            unseen = np.setdiff1d(np.unique(temperature_key(frame.temperature[rows])), self.temps_)
            if unseen.size:
                out.append(f"hazard: temperature {fmt(unseen)} has no training data (trained on {fmt(self.temps_)}): "
                           "those blocks use the hazards of the trained requests, not validated there")
        elif len(self.temps_):
            unseen = np.setdiff1d(np.unique(temperature_key(frame.temperature[rows])), self.temps_)
            if unseen.size:
                out.append(f"hazard: temperature {fmt(unseen)} has no training data (trained on {fmt(self.temps_)}): "
                           "those blocks use hazards pooled over the trained temperatures, not validated there")
        if len(self.workloads_):
            present = frame.workload_labels[np.bincount(frame.workload_codes[rows],
                                                        minlength=len(frame.workload_labels)) > 0]
            unseen = sorted({str(v) for v in present} - set(self.workloads_))
            if unseen:
                out.append(f"hazard: workload {', '.join(unseen)} has no training data (trained on "
                           f"{', '.join(self.workloads_)}): those blocks use hazards pooled over the trained workloads")
        return out

    def _clamp_notes(self, temps: np.ndarray, fmt) -> list[str]:
        """Notes for sampled temperatures outside the continuous model's trained range (clamped), and for
        greedy rows of a model trained on sampled requests only."""
        lo, hi = self.trange_
        out = []
        far = temps[(temps > 0) & ((temps < lo - 5e-4) | (temps > hi + 5e-4))]
        if far.size:
            out.append(f"hazard: temperature {fmt(far)} is outside the trained range {lo:g}-{hi:g}: those blocks "
                       f"use the hazard at the nearest trained temperature (clamped), not validated there")
        if (temps <= 0).any() and not (self.temps_ <= 0).any():
            out.append(f"hazard: temperature 0 (greedy) has no training data (trained on {lo:g}-{hi:g}): those "
                       "blocks use the sampled requests' hazards at the centre temperature, not validated there")
        return out

    def _key_tables(self, coef: np.ndarray, g: bool):
        """Intercept and slope terms of each temperature level and workload code (the last: unseen, the
        share-weighted mean of the trained levels' terms); the continuous model has no temperature levels."""
        G, S = self.gamma_, self.NSTATE
        NT, NW = self._nlev(), len(getattr(self, "workloads_", ()))
        o, ow = 2 * G + 2 * S, 2 * G + 2 * S + self._ntcol()
        ts, ws = self.shares_[g] if NT + NW else (np.zeros(0), np.zeros(0))
        out = []
        for at, n, sh in ((o, NT, ts), (o + NT, NT, ts), (ow, NW, ws), (ow + NW, NW, ws)):
            c = coef[at:at + n]
            out.append(np.append(c, sh @ c if n else 0.0))
        return out  # t intercept, t slope, w intercept, w slope

    def _linear(self, k, x, st, coef, t=None, w=None, g: bool = True):
        """``_design(k, x, st, t, w, g) @ coef`` (to float rounding) read off the one-hot structure,
        without building the design matrix (``t``/``w`` None: unseen, pooled; the continuous model's
        ``t`` is tau, None: the centre)."""
        G, S = self.gamma_, self.NSTATE
        NT, NW = self._nlev(), len(getattr(self, "workloads_", ()))
        ta, tb, wa, wb = self._key_tables(coef, g)
        # per (k, state, t, w) cell: intercept and slope tables, one take each
        a = (coef[:G, None] + coef[None, 2 * G:2 * G + S]).reshape(-1)
        b = (coef[G:2 * G, None] + coef[None, 2 * G + S:2 * G + 2 * S]).reshape(-1)
        cell = k * S + st
        if NT + NW:
            wk = self._wk_table(coef, g)  # zeros without workload_position
            a = (a.reshape(G, S)[:, :, None, None] + ta[None, None, :, None] + wa[None, None, None, :]
                 + wk[:, None, None, :]).reshape(-1)
            b = (b[:, None, None] + tb[None, :, None] + wb[None, None, :]).reshape(-1)
            tc = NT if t is None or self._continuous() else t  # continuous: no temperature level
            w = NW if w is None else w
            cell = (cell * (NT + 1) + tc) * (NW + 1) + w
        z = a.take(cell) + x * b.take(cell)
        if self._continuous() and t is not None:  # tau * (intercept + slope * x [+ per cell index])
            o = 2 * G + 2 * S
            term = coef[o] + coef[o + 1] * x
            if self.temperature_position:
                term = term + np.append(0.0, coef[o + 2:o + G + 1]).take(k)
            z += t * term
        return z

    def _ncoef(self) -> int:
        return 2 * (self.gamma_ + self.NSTATE + len(getattr(self, "workloads_", ()))) + self._ntcol() + self._nwkcol()

    def _nwkcol(self) -> int:
        """Design columns of the workload x cell-index intercepts (``workload_position``): one per workload and
        cell index past the first, after every other column."""
        NW = len(getattr(self, "workloads_", ()))
        return NW * (self.gamma_ - 1) if self.workload_position and NW > 1 else 0  # one workload: the cells' own

    def _wk_table(self, coef: np.ndarray, g: bool) -> np.ndarray:
        """``(G, NW + 1)`` workload x cell-index intercepts (cell index 0: none; the last column, an unseen
        workload: the training shares' mean, the pooled term)."""
        G, NW = self.gamma_, len(getattr(self, "workloads_", ()))
        out = np.zeros((G, NW + 1))
        if self._nwkcol():
            wk = coef[self._ncoef() - self._nwkcol():].reshape(NW, G - 1).T  # (G - 1, NW)
            out[1:, :NW] = wk
            out[1:, NW] = wk @ self.shares_[g][1]
        return out

    def _flat_coef(self, accepted: float, total: float) -> np.ndarray:
        """Logistic coefficients of a constant hazard (accepted + 0.5) / (total + 1) at every position."""
        rate = (accepted + 0.5) / (total + 1.0)
        coef = np.zeros(self._ncoef())
        coef[: self.gamma_] = np.log(rate / (1 - rate))
        return coef

    def _design(self, k, x, st, t=None, w=None, g: bool = True):
        """Columns: cell intercepts, cell slopes, state intercepts, state slopes, then per temperature
        level intercepts and slopes (continuous: tau, tau * x [, tau per cell index past the first]), per
        workload likewise (an unseen level, ``t``/``w`` None or ``len(levels)``: the training shares of the
        levels, i.e. the pooled term)."""
        G, S = self.gamma_, self.NSTATE
        NT, NW = self._nlev(), len(getattr(self, "workloads_", ()))
        n = k.size
        X = np.zeros((n, self._ncoef()))
        X[np.arange(n), k] = 1.0
        X[np.arange(n), G + k] = x
        X[np.arange(n), 2 * G + st] = 1.0
        X[np.arange(n), 2 * G + S + st] = x
        o = 2 * G + 2 * S
        if self._continuous() and t is not None:
            tau = np.broadcast_to(np.asarray(t, float), (n,))
            X[:, o], X[:, o + 1] = tau, tau * x
            if self.temperature_position:
                at = np.flatnonzero(k > 0)
                X[at, o + 1 + k[at]] = tau[at]
        for code, N, sh, at in ((t, NT, self.shares_[g][0] if NT else None, o),
                                (w, NW, self.shares_[g][1] if NW else None, o + self._ntcol())):
            if not N:
                continue
            code = np.full(n, N) if code is None else np.broadcast_to(code, (n,))
            oh = np.vstack([np.eye(N), sh[None, :]])[code]  # unseen: the level shares
            X[:, at:at + N] = oh
            X[:, at + N:at + 2 * N] = oh * np.asarray(x, float)[:, None]
        if self._nwkcol():  # workload x cell index (past the first): the workload's one-hot at column k - 1
            code = np.full(n, NW) if w is None else np.broadcast_to(w, (n,))
            oh = np.vstack([np.eye(NW), self.shares_[g][1][None, :]])[code]
            at = self._ncoef() - self._nwkcol()
            past = np.flatnonzero(k > 0)
            for j in range(NW):
                X[past, at + j * (G - 1) + k[past] - 1] = oh[past, j]
        return X

    def _logistic_cells(self) -> dict:
        """Per greedy/sampled: the training positions, the distinct design row of each, and the
        distinct rows' design matrix. Why: the design's one continuous column is the confidence,
        rounded to 4 dp in the telemetry, so ~750k positions collapse to a few tens of thousands of
        rows; a refit is then a bincount plus a small fit. Cached in the training layout (refits
        copy the model and share it)."""
        L = self._train
        if "_logistic_cells" not in L:
            out = {}
            for g in (False, True):
                m = np.flatnonzero(L["greedy"] == g)
                if not m.size:
                    continue
                k, st, x = L["k"][m], L["state"][m], L["x"][m]
                t, w = L["t"][m], L["w"][m]
                xc, xu = pd.factorize(x)
                nt = int(L["t"].max()) + 2 if L["t"].size else 1
                kc = ((k.astype(np.int64) * self.NSTATE + st) * nt + t) * (len(self.workloads_) + 1) + w
                key = kc * (len(xu) + 1) + xc
                _, first, cell = np.unique(key, return_index=True, return_inverse=True)
                tv = L["tau"][m][first] if self._continuous() else t[first]  # the continuous design reads tau
                out[g] = (m, cell.reshape(-1), self._design(k[first], x[first], st[first], tv, w[first], g))
            L["_logistic_cells"] = out
        return L["_logistic_cells"]

    def _fit_logistic(self, weights=None) -> None:
        L = self._train
        previous = getattr(self, "coef_", {})  # a refit keeps these where a replicate is degenerate
        self.coef_ = {}
        wt = L["wt"] if weights is None else L["wt"] * weights[L["req"]]
        cells = self._logistic_cells()
        for g in (False, True):
            if g not in cells:
                continue
            m, cell, X = cells[g]
            y, w = L["y"][m], wt[m]
            # the weighted log-likelihood summed per distinct design row: the same objective over far fewer rows
            pos = np.bincount(cell, weights=w * y, minlength=X.shape[0])
            neg = np.bincount(cell, weights=w * (1 - y), minlength=X.shape[0])
            if not (pos > 0).any() or not (neg > 0).any():
                # every (weighted) position accepted, or none: a logistic fit has no solution. Keep the
                # full-data fit in a bootstrap replicate, else a flat hazard at the smoothed rate.
                self.coef_[g] = previous[g] if g in previous else self._flat_coef((w * y).sum(), w.sum())
                continue
            keep = (pos + neg) > 0
            # a refit (bootstrap replicate) starts from the full-data fit: same optimum, two or three Newton steps
            start = np.asarray(previous[g], float) if g in previous else None
            with threadpool_limits(1):  # a small design: BLAS/OpenMP threads only contend (8x the CPU on 2 cores)
                self.coef_[g] = fit_penalized_logistic(X[keep], pos[keep], neg[keep], C=L2_C, start=start)

    # ------------------------------------------------------------------
    def predict(self, frame: BlockFrame, rows: np.ndarray | None = None, state: np.ndarray | None = None) -> np.ndarray:
        """``(len(rows), G)`` hazards for every position of the given rows (``state``: walk state)."""
        return self.predict_features(self.features(frame, rows, state))

    def features(self, frame: BlockFrame, rows: np.ndarray | None = None, state: np.ndarray | None = None) -> dict:
        """What :meth:`predict` reads of the rows (confidence feature, cell index, walk state, greedy):
        computed once and shared by the refits of one model (:meth:`predict_features`)."""
        if not self.fitted_:
            raise RuntimeError("HazardModel is not fitted")
        rows = np.arange(frame.n) if rows is None else rows
        G = frame.gamma
        c = frame.list_rows("confidence", rows)
        if self.method == "confidence":
            return dict(c=c)
        if G != self.gamma_:
            raise ValueError(f"hazard model fitted for gamma={self.gamma_}, frame has gamma={G}")
        x = conf_feature(c)
        if self.info_.get("source") == "observed":  # fitted without truth: no unobserved states
            st = np.zeros(x.shape, np.int64)
        else:
            st = self._eff_state(frame, rows, state)
        g = np.broadcast_to(frame.greedy[rows][:, None], x.shape)
        out = dict(c=c, x=x, st=st, g=g, k=self._kidx(frame, rows))
        if self.method == "logistic":
            t, w = self._codes(frame, rows)
            out.update(t=np.broadcast_to(t[:, None], x.shape), w=np.broadcast_to(w[:, None], x.shape))
        return out

    def predict_features(self, f: dict) -> np.ndarray:
        """:meth:`predict` from :meth:`features` of the same model (or of the model it was refitted from)."""
        if self.method == "confidence":
            c = f["c"]
            return np.clip(np.where(np.isnan(c), 0.5, c), 0, 1)
        x, st, g, k = f["x"], f["st"], f["g"], f["k"]
        if self.method == "binned":
            b = self._bin_index(k.ravel(), x.ravel()).reshape(x.shape)
            return self.table_.reshape(-1).take(self._group(g, st, k) * self.table_.shape[1] + b)  # table_[grp, b]
        out = np.empty(x.shape)
        t, w = f.get("t"), f.get("w")
        for gg in (False, True):
            m = g[:, 0] == gg
            cg = gg if gg in self.coef_ else (not gg)
            coef = self.coef_[cg]
            if m.all():  # one kind of row (the usual case): no masked copies
                z = self._linear(k, x, st, coef, t, w, cg)
                np.negative(z, out=z)
                np.exp(z, out=z)
                z += 1
                return np.divide(1, z, out=z)
            if m.any():
                out[m] = 1 / (1 + np.exp(-self._linear(k[m], x[m], st[m], coef, None if t is None else t[m],
                                                       None if w is None else w[m], cg)))
        return out

    def refit(self, request_weights: np.ndarray) -> "HazardModel":
        """A copy refitted with per-training-request weights (cluster bootstrap)."""
        m = copy.copy(self)
        if self.method == "binned":
            m._table(weights=request_weights)
        elif self.method == "logistic":
            m._fit_logistic(weights=request_weights)
        return m
