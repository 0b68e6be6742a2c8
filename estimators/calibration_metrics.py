"""Calibration metrics of cumulative survival against a prefix label, with cluster-bootstrap CIs.

Why separate: STS fitting, the dashboard's reliability panel and the validation report all
score predictions ``p`` (cumulative survival at a position) against binary labels ``y``
(the prefix reached past that position) with the *same* definitions:

* ``ece``: SGLang/DeepSpec-comparable plug-in ECE, 15 equal-width bins,
  ``bin = floor(p * 15)`` clamped, ``p`` clamped to ``[1e-8, 1 - 1e-8]``,
  ``sum_b n_b |mean p_b - mean y_b| / N``;
* ``ece_mass``: the same with 15 equal-mass bins (edges from the sample's quantiles);
* ``ece_debiased``: Kumar et al.'s debiased L2 calibration error on equal-mass bins,
  ``sqrt(max(0, sum_b w_b [(p_b - y_b)^2 - y_b (1 - y_b) / (n_b - 1)]))``;
* ``brier``, ``nll``, ``auroc`` (ties count one half).

Every metric is computed from weighted bin sums, so a bootstrap replicate is a reweighting
(request-clustered Poisson weights): no re-sorting per replicate. Intervals are *basic*
(pivotal) bootstrap intervals, which correct the upward bias binned ECEs pick up under
resampling (the same reason Kumar et al.'s library uses a debiased bootstrap).

Example::

    >>> import numpy as np
    >>> from acceptscope.estimators.calibration_metrics import ece
    >>> p = np.array([0.05, 0.15, 0.95, 0.95]); y = np.array([0, 1, 1, 1])
    >>> round(ece(p, y, 15), 4)   # bins {0}:|.05-0|, {2}:|.15-1|, {14}:|.95-1| weighted 1,1,2
    0.25
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from acceptscope.estimators.bootstrap import cluster_weights

EPS = 1e-8
METRICS = ("ece", "ece_mass", "ece_debiased", "brier", "nll", "auroc")


def _clamp(p):
    return np.clip(np.asarray(p, np.float64), EPS, 1 - EPS)


def _width(p: np.ndarray, num_bins: int) -> np.ndarray:
    """Equal-width bin of each clamped prediction (any shape): ``floor(p * num_bins)``, clamped."""
    b = np.multiply(p, num_bins).astype(np.int64)
    return np.clip(b, 0, num_bins - 1, out=b)


def _mass(p: np.ndarray, num_bins: int) -> np.ndarray:
    """Equal-mass bin of each clamped prediction: edges at the sample's quantiles."""
    edges = np.quantile(p, np.linspace(0, 1, num_bins + 1)[1:-1]) if p.size else np.array([])
    return np.searchsorted(edges, p, side="right")


def ece_from_sums(n, sp, sy):
    """ECE from per-bin weight ``n``, prediction sum ``sp`` and label sum ``sy`` (bins on the last axis).

    The one ECE formula: every variant below (and the dashboard's SQL bins) ends here, in
    SGLang's arithmetic order ``sum_b n_b |sp_b/n_b - sy_b/n_b| / sum_b n_b``.
    """
    n, sp, sy = (np.asarray(a, np.float64) for a in (n, sp, sy))
    den = np.where(n > 0, n, 1.0)
    tot = n.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (np.abs(sp / den - sy / den) * n).sum(-1) / tot
    out = np.where(tot > 0, out, np.nan)
    return float(out) if out.ndim == 0 else out


def ece(p, y, num_bins: int = 15, w=None) -> float:
    """Plug-in ECE with equal-width bins (SGLang ``expected_calibration_error``)."""
    p = _clamp(p)
    return _ece_from_bins(p, np.asarray(y, float), _width(p, num_bins), num_bins, w)


def ece_rows(P, y, num_bins: int = 15, overwrite: bool = False) -> np.ndarray:
    """Equal-width ECE of every row of ``P`` (m, n) against one label vector ``y`` (n,), at once.

    Why: the STS grid fit scores 41 temperatures per position; one bincount beats 41 calls. Binary
    labels: each bin's count and label sum come from one count of (bin, label) cells (integers: the same
    numbers as summing the labels; the labels broadcast to ``P``'s shape were a copy per call).
    ``overwrite``: ``P`` is the caller's scratch (clamped in place)."""
    P = np.atleast_2d(np.asarray(P, np.float64))
    P = np.clip(P, EPS, 1 - EPS, out=P if overwrite else None)
    m = P.shape[0]
    size = num_bins * m
    b = _width(P, num_bins)
    b += num_bins * np.arange(m)[:, None]
    b = b.ravel()
    sp = np.bincount(b, weights=P.ravel(), minlength=size).reshape(m, num_bins)
    y = np.asarray(y, float)
    if np.isin(y, (0.0, 1.0)).all():
        b *= 2
        b += np.broadcast_to(y.astype(np.int64), P.shape).ravel()
        cells = np.bincount(b, minlength=2 * size).reshape(m, num_bins, 2)
        return ece_from_sums(cells.sum(-1).astype(float), sp, cells[..., 1].astype(float))
    n = np.bincount(b, minlength=size).reshape(m, num_bins).astype(float)
    sy = np.bincount(b, weights=np.broadcast_to(y, P.shape).ravel(), minlength=size).reshape(m, num_bins)
    return ece_from_sums(n, sp, sy)


def ece_binned(bins: pd.DataFrame, keys, n: str = "n", mean_pred: str = "mean_pred",
               rate: str = "rate") -> pd.DataFrame:
    """ECE per group of already-binned rows (one row per bin: count, mean prediction, observed rate).

    Returns ``keys + [ece, n, mean_pred, rate]`` with the pooled mean prediction and rate.
    """
    keys = list(keys)
    if bins.empty:
        return pd.DataFrame(columns=keys + ["ece", n, mean_pred, rate])
    g = bins.assign(_sp=bins[mean_pred] * bins[n], _sy=bins[rate] * bins[n])
    rows = []
    for key, grp in g.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        cnt, sp, sy = grp[n].to_numpy(float), grp["_sp"].to_numpy(float), grp["_sy"].to_numpy(float)
        tot = cnt.sum()
        rows.append((*key, ece_from_sums(cnt, sp, sy), tot, sp.sum() / tot, sy.sum() / tot))
    return pd.DataFrame(rows, columns=keys + ["ece", n, mean_pred, rate])


def _ece_from_bins(p, y, b, nb, w=None):
    w = np.ones_like(p) if w is None else w
    n = np.bincount(b, weights=w, minlength=nb)
    sp = np.bincount(b, weights=w * p, minlength=nb)
    sy = np.bincount(b, weights=w * y, minlength=nb)
    return ece_from_sums(n, sp, sy)


REPLICATE_BLOCK = 64  # bootstrap replicates scored together (memory: this many weight rows per cluster)
# a position with at least this many clusters (requests) takes its AUROC interval from the bootstrap's normal
# limit (_Prepared.auroc_sd), not 200 pair counts; the audit's exact bootstrap stops at the same size
AUROC_NORMAL_CLUSTERS = 2000


class _Prepared:
    """Fixed per-sample structure (bins, score ranks) so replicates only change weights."""

    def __init__(self, p, y, num_bins=15):
        self.p = _clamp(p)
        self.y = np.asarray(y, float)
        self.nb = num_bins
        self.bw = _width(self.p, num_bins)
        self.bm = _mass(self.p, num_bins)
        self._bound = None  # (clusters, n_clusters, per-cluster sums): see _bind
        self._ranks = False  # the binary labels' score order (see _pair_ranks); None: labels not binary

    def _pair_ranks(self):
        """For binary labels, the negatives in score order, the positives, and per positive how many
        negatives score below it (``lo``) and at most as high (``hi``), as one array ``lo + hi``;
        None otherwise. Sorted once per sample: the point AUROC and every replicate's read it."""
        if self._ranks is False:
            p, y = self.p, self.y
            self._ranks = None
            if np.isin(y, (0.0, 1.0)).all():
                neg = np.flatnonzero(y == 0)
                neg = neg[np.argsort(p[neg], kind="stable")]
                pos = np.flatnonzero(y == 1)
                ps = p[neg]
                self._ranks = (neg, pos, np.concatenate([np.searchsorted(ps, p[pos], side) for side in ("left", "right")]))
        return self._ranks

    def metrics(self, w=None) -> dict:
        p, y, nb = self.p, self.y, self.nb
        unit = w is None
        w = np.ones_like(p) if w is None else w
        W = w.sum()
        out = {}
        if W <= 0:
            return {m: float("nan") for m in METRICS}
        out["ece"] = _ece_from_bins(p, y, self.bw, nb, w)
        out["ece_mass"] = _ece_from_bins(p, y, self.bm, nb, w)
        n = np.bincount(self.bm, weights=w, minlength=nb)
        sp = np.bincount(self.bm, weights=w * p, minlength=nb) / np.maximum(n, 1e-300)
        sy = np.bincount(self.bm, weights=w * y, minlength=nb) / np.maximum(n, 1e-300)
        ok = n > 1
        term = (sp - sy) ** 2 - sy * (1 - sy) / np.maximum(n - 1, 1)
        out["ece_debiased"] = float(np.sqrt(max(0.0, (n[ok] * term[ok]).sum() / W)))
        out["brier"] = float((w * (p - y) ** 2).sum() / W)
        out["nll"] = float(-(w * (y * np.log(p) + (1 - y) * np.log1p(-p))).sum() / W)
        out["auroc"] = self._auroc(w, unit)
        return out

    def _auroc(self, w, unit: bool) -> float:
        """Weighted AUROC, ties counted one half. Unit weights on binary labels: the pair count read off
        :meth:`_pair_ranks` (integers, so exactly the per-score sums' number, without a second sort)."""
        ranks = self._pair_ranks() if unit else None
        if ranks is not None:
            P, N = float(ranks[1].size), float(ranks[0].size)
            return float(int(ranks[2].sum()) * 0.5 / (P * N)) if P > 0 and N > 0 else float("nan")
        y = self.y
        u, ui = np.unique(self.p, return_inverse=True)
        pw = np.bincount(ui, weights=w * y, minlength=u.size)
        nw = np.bincount(ui, weights=w * (1 - y), minlength=u.size)
        below = np.cumsum(nw) - nw
        P, N = pw.sum(), nw.sum()
        return float((pw * (below + 0.5 * nw)).sum() / (P * N)) if P > 0 and N > 0 else float("nan")

    def _bind(self, clusters: np.ndarray, nc: int, pair_counts: bool = True) -> tuple:
        """Per-cluster sums of everything :meth:`metrics_many` reweights, made once per cluster coding.

        ``X`` (n_clusters, 6 bins + 3): each metric is a weighted sum of its columns. The AUROC's
        pair count (binary labels): the negatives' clusters in score order, the positives' clusters,
        and per positive how many negatives score below it (``lo``) and at most as high (``hi``);
        ``pair_counts=False``: none (the AUROC's interval is its normal limit, :meth:`auroc_sd`)."""
        if self._bound is not None and self._bound[0] is clusters and self._bound[1] == nc:
            return self._bound[2]
        p, y, nb = self.p, self.y, self.nb

        def per_cluster(b, nbins, vals):  # (n_clusters, nbins) sums of vals per (cluster, bin)
            return np.bincount(clusters * nbins + b, weights=vals, minlength=nc * nbins).reshape(nc, nbins)

        ones = np.ones_like(p)
        with np.errstate(invalid="ignore", divide="ignore"):
            nll = -(y * np.log(p) + (1 - y) * np.log1p(-p))
        X = np.hstack([per_cluster(self.bw, nb, v) for v in (ones, p, y)] + [per_cluster(self.bm, nb, v) for v in (ones, p, y)]
                      + [per_cluster(np.zeros(p.size, np.int64), 1, v) for v in (ones, (p - y) ** 2, nll)])
        auc = None
        ranks = self._pair_ranks() if pair_counts else None
        if ranks is not None:  # binary labels: the pair count in exact integer arithmetic
            # a positive's negatives strictly below, and below or tied, by index into the negatives' cumsum
            auc = (clusters[ranks[0]], clusters[ranks[1]], ranks[2])
        self._bound = (clusters, nc, (X, auc))
        return self._bound[2]

    def metrics_many(self, clusters: np.ndarray, Wc: np.ndarray, auroc: bool = True) -> dict:
        """:meth:`metrics` under each row of cluster weights ``Wc`` (B, n_clusters), the rows' cluster
        codes ``clusters`` (n,) in ``0..n_clusters-1``. Why it is cheap: a replicate weighs whole
        clusters, so every binned sum is a per-cluster sum (:meth:`_bind`, once) times the weights: one
        matrix product for all replicates; the AUROC, a Mann-Whitney pair count, is one cumulative sum of
        the negatives' weights per replicate (:meth:`_auroc_many`). ``auroc=False``: no AUROC replicates
        (NaN; a sample with many clusters takes the AUROC's normal limit instead, :meth:`auroc_sd`)."""
        Wc = np.asarray(Wc, np.float64)
        X, bound_auc = self._bind(clusters, Wc.shape[1])
        out = self._from_sums(Wc @ X)
        if not auroc:
            out["auroc"] = np.full(Wc.shape[0], np.nan)
        elif bound_auc is None:
            out["auroc"] = np.array([self.metrics(w)["auroc"] for w in Wc[:, clusters]])
        else:
            out["auroc"] = self._auroc_many(Wc)
        W = out.pop("_W")
        for name in METRICS:
            out[name] = np.where(W > 0, out[name], np.nan)
        return out

    def metrics_bound(self) -> dict:
        """:meth:`metrics` (unit weights) from the sums :meth:`_bind` made for the replicates: each binned
        sum is its clusters' sums added up, not a second pass over the rows (the point and its replicates
        from the same sums; the same numbers up to rounding, ~6% of scoring saved). The AUROC is the exact
        pair count."""
        out = self._from_sums(self._bound[2][0].sum(0)[None, :])
        W = float(out.pop("_W")[0])
        res = {name: float(out[name][0]) if W > 0 else float("nan") for name in METRICS if name != "auroc"}
        res["auroc"] = self._auroc(np.ones_like(self.p), True)
        return res

    def _from_sums(self, R: np.ndarray) -> dict:
        """Every metric but the AUROC from rows of summed :meth:`_bind` columns ``R`` (B, 6 bins + 3), and the
        total weight ``_W``."""
        nb = self.nb
        cnt_w, sp_w, sy_w, n, sp, sy = (R[:, j * nb:(j + 1) * nb] for j in range(6))
        W, sq, nll = R[:, 6 * nb], R[:, 6 * nb + 1], R[:, 6 * nb + 2]
        out = {"ece": ece_from_sums(cnt_w, sp_w, sy_w), "ece_mass": ece_from_sums(n, sp, sy)}
        den = np.maximum(n, 1e-300)
        sp, sy = sp / den, sy / den
        term = (sp - sy) ** 2 - sy * (1 - sy) / np.maximum(n - 1, 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["ece_debiased"] = np.sqrt(np.maximum(0.0, np.where(n > 1, n * term, 0.0).sum(1) / W))
            out["brier"] = sq / W
            out["nll"] = nll / W
        out["_W"] = W
        return out

    def _auroc_many(self, Wc: np.ndarray) -> np.ndarray:
        """AUROC per replicate: Mann-Whitney's pair count, ``sum over positives of w (negatives' weight
        below + half the tied)``, from one cumulative sum of the negatives' weights (in score order,
        sorted once in :meth:`_bind`). Poisson weights are counts, so every sum is of integers and
        exact: the same number as :meth:`metrics`' per-score sums, ~2.5x faster (no per-replicate
        bincounts; a loop over replicates beat a (replicates x rows) array: each row stays in cache)."""
        cn, cp, lohi = self._bound[2][1]
        cum = np.zeros(cn.size + 1)
        auc = np.empty(Wc.shape[0])
        m = lohi.size // 2
        for i, w in enumerate(Wc):
            np.cumsum(w[cn], out=cum[1:])
            wp, c = w[cp], cum[lohi]
            P, N = wp.sum(), cum[-1]
            auc[i] = (np.dot(wp, c[:m]) + np.dot(wp, c[m:])) * 0.5 / (P * N) if P > 0 and N > 0 else np.nan
        return auc

    def auroc_sd(self, clusters: np.ndarray, nc: int) -> float:
        """The standard deviation of the AUROC under the request-clustered Poisson bootstrap, to first
        order: ``sqrt(sum_c IF_c^2)`` with cluster ``c``'s influence ``IF_c = u_c / (P N) - AUROC (p_c / P
        + n_c / N)``, where ``u_c`` counts the pairs its rows are in (a positive's negatives below it, a
        negative's positives above it, ties one half) and ``p_c``, ``n_c`` its positives and negatives.

        Why: the pair-count bootstrap costs a cumulative sum over the sample per replicate (200 x 35
        position-methods a run: the largest share of a recorded run's fixed cost), and with thousands of
        clusters its basic interval is this normal limit up to its own Monte Carlo noise (the limit
        :func:`estimators.bootstrap.iid_replicates` takes for the audit too). NaN: labels not binary."""
        ranks = self._pair_ranks()
        if ranks is None or ranks[0].size == 0 or ranks[1].size == 0:
            return float("nan")
        neg, pos, lohi = ranks
        P, N, m = pos.size, neg.size, lohi.size // 2
        below = 0.5 * (lohi[:m] + lohi[m:])  # per positive: negatives below it, ties one half
        pp = np.sort(self.p[pos])
        ps = self.p[neg]  # in score order (_pair_ranks sorted the negatives)
        above = P - 0.5 * (np.searchsorted(pp, ps, "left") + np.searchsorted(pp, ps, "right"))
        auc = below.sum() / (P * N)
        u = np.bincount(clusters[pos], weights=below, minlength=nc) + np.bincount(clusters[neg], weights=above, minlength=nc)
        influence = u / (P * N) - auc * (np.bincount(clusters[pos], minlength=nc) / P
                                         + np.bincount(clusters[neg], minlength=nc) / N)
        return float(np.sqrt(np.dot(influence, influence)))


def reliability_curve(p, y, num_bins: int = 15, w=None) -> pd.DataFrame:
    """One prediction's equal-width reliability curve: per bin its mean prediction, observed frequency and
    count. (The store's binned counterpart, over runs in SQL, is ``summaries.reliability_bins``.)"""
    p, y = _clamp(p), np.asarray(y, float)
    b = _width(p, num_bins)
    w = np.ones_like(p) if w is None else w
    n = np.bincount(b, weights=w, minlength=num_bins)
    sp = np.bincount(b, weights=w * p, minlength=num_bins)
    sy = np.bincount(b, weights=w * y, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return pd.DataFrame({"bin": np.arange(num_bins), "lo": np.arange(num_bins) / num_bins,
                             "hi": (np.arange(num_bins) + 1) / num_bins, "avg_pred": sp / n,
                             "avg_target": sy / n, "count": n})


def position_metrics(P: np.ndarray, Y: np.ndarray, groups=None, n_boot: int = 200, level: float = 0.95,
                     num_bins: int = 15, seed: int = 0, mask: np.ndarray | None = None) -> pd.DataFrame:
    """Per-position metrics of survival ``P`` (n, G) vs labels ``Y`` with cluster-bootstrap CIs.

    ``groups``: the cluster (request key) of each row, or None for rows as their own clusters. The
    replicate weights are :func:`estimators.bootstrap.cluster_weights`' keyed draws, so the intervals
    are the same whichever path (in memory, streamed, Spark) gathered the rows, in whatever order.
    Replicates are scored :data:`REPLICATE_BLOCK` at a time (:meth:`_Prepared.metrics_many`): memory
    ``REPLICATE_BLOCK x n`` whatever ``n_boot``. BLAS runs on one thread here: its products are small
    and on a busy machine its threads' spinning cost 30x the CPU of the work (0.13 vs 4.1 CPU-s on a
    run's 87k test rows, 2 cores)."""
    return position_metrics_many({0: P}, Y, groups, n_boot, level, num_bins, seed, mask)[0]


def position_metrics_many(Ps: dict, Y: np.ndarray, groups=None, n_boot: int = 200, level: float = 0.95,
                          num_bins: int = 15, seed: int = 0, mask: np.ndarray | None = None) -> dict:
    """:func:`position_metrics` of several predictions ``{name: P}`` of the same rows and labels (see
    :class:`PositionScorer`), each frame equal to its own call."""
    scorer = PositionScorer(len(next(iter(Ps.values()))), groups, n_boot, seed)
    return {name: scorer.score(P, Y, level, num_bins, mask) for name, P in Ps.items()}


class PositionScorer:
    """:func:`position_metrics` for several predictions of the same rows (the STS methods scored on one
    test split), one after another: the clusters are coded and the replicate weights drawn once, for
    every prediction. The weights are kept as the small counts they are (one byte a cluster and
    replicate: 2.5 MB at a 349k-row run's comparison, where float64 held 20 MB) and handed out
    :data:`REPLICATE_BLOCK` replicates at a time. A caller holds one prediction at a time."""

    def blocks(self):
        """The replicate weights, :data:`REPLICATE_BLOCK` replicates at a time."""
        if self._counts is None:
            self._counts = np.empty((self.n_boot, self.nc), np.uint8)  # Poisson(1) draws stay below 25
            for s in range(0, self.n_boot, REPLICATE_BLOCK):
                e = min(s + REPLICATE_BLOCK, self.n_boot)
                self._counts[s:e] = cluster_weights(self.uniq, e - s, self.seed, start=s)
        for s in range(0, self.n_boot, REPLICATE_BLOCK):
            yield self._counts[s:s + REPLICATE_BLOCK].astype(np.float64)

    def __init__(self, n: int, groups=None, n_boot: int = 200, seed: int = 0):
        self.n = n
        self.code, uniq = pd.factorize(np.asarray(np.arange(n) if groups is None else groups))
        self.nc = len(uniq)
        self.uniq, self.n_boot, self.seed = uniq, n_boot, seed
        self._counts = None  # (n_boot, nc) replicate weights, drawn on first use

    def score(self, P: np.ndarray, Y: np.ndarray, level: float = 0.95, num_bins: int = 15,
              mask: np.ndarray | None = None) -> pd.DataFrame:
        """:func:`position_metrics`' frame of ``P`` (n, G) against ``Y``."""
        n, code = self.n, self.code
        preps, rows, codes, sds = {}, {}, {}, {}
        for k in range(P.shape[1]):
            m = np.ones(n, bool) if mask is None else mask[:, k]
            if not m.any():
                continue
            prep = preps[k] = _Prepared(P[m, k], Y[m, k], num_bins)
            r = rows[k] = {"position": k, "n": int(m.sum()), "pred_mean": float(prep.p.mean()),
                           "target_mean": float(prep.y.mean())}
            if not self.n_boot:
                r.update(prep.metrics())
                continue
            # bound now: one position's sorted pair ranks alive at a time (then freed)
            codes[k] = code if mask is None else code[m]
            if np.count_nonzero(np.bincount(codes[k], minlength=self.nc)) >= AUROC_NORMAL_CLUSTERS:
                sd = prep.auroc_sd(codes[k], self.nc)
                if np.isfinite(sd):  # (labels not binary: the bootstrap, as for few clusters)
                    sds[k] = sd
            prep._bind(codes[k], self.nc, pair_counts=k not in sds)
            r.update(prep.metrics_bound())
            prep._ranks = False
        if self.n_boot and preps:
            with threadpool_limits(1):
                _bootstrap(preps, rows, codes, sds, self.blocks(), level)
        return pd.DataFrame([rows[k] for k in sorted(rows)])


def _bootstrap(preps: dict, rows: dict, codes: dict, sds: dict, blocks, level: float) -> None:
    """The basic bootstrap intervals of one prediction's rows (by position), in place; the AUROC of a
    position in ``sds`` (its normal limit's standard deviation, :meth:`_Prepared.auroc_sd`) is
    ``auroc +- z sd`` instead."""
    a = (1 - level) / 2
    reps = {k: {name: [] for name in METRICS} for k in preps}
    for Wc in blocks:
        for k, prep in preps.items():
            got = prep.metrics_many(codes[k], Wc, auroc=k not in sds)
            for name in METRICS:
                reps[k][name].append(got[name])
    z = NormalDist().inv_cdf(1 - a)
    for k, r in rows.items():
        for name in METRICS:
            if name == "auroc" and k in sds:
                r["auroc_lo"], r["auroc_hi"] = max(r["auroc"] - z * sds[k], 0.0), min(r["auroc"] + z * sds[k], 1.0)
                continue
            v = np.concatenate(reps[k][name])
            v = v[np.isfinite(v)]
            if not v.size:
                r[f"{name}_lo"] = r[f"{name}_hi"] = np.nan
                continue
            q_lo, q_hi = np.quantile(v, [a, 1 - a])
            # basic (pivotal) bootstrap: corrects the upward resampling bias of binned ECEs
            lo, hi = 2 * r[name] - q_hi, 2 * r[name] - q_lo
            if name.startswith("ece"):
                lo = max(lo, 0.0)
            r[f"{name}_lo"], r[f"{name}_hi"] = lo, hi


def reliability_table(P: np.ndarray, Y: np.ndarray, num_bins: int = 15) -> pd.DataFrame:
    """Long reliability table over positions (equal-width bins)."""
    out = []
    for k in range(P.shape[1]):
        r = reliability_curve(P[:, k], Y[:, k], num_bins)  # (not a _Prepared: no mass bins, no sort)
        r.insert(0, "position", k)
        out.append(r)
    return pd.concat(out, ignore_index=True)
