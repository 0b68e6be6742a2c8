"""Request-clustered bootstrap: the one place that draws replicate weights and builds aggregate intervals.

Why: an aggregate (mean ceiling of a run, a workload, a batch-size band) must get the same
interval whether the run was estimated in memory, in chunks of whole requests, or on another
engine (Spark). So every random draw of the bootstrap is a function of *what it is drawn
for*, not of the order rows arrive in: replicate ``i`` of request ``(run_id, rid)`` uses a
splitmix64 hash of (a stable hash of the request key, ``i``, the seed, the stream). A
request's Poisson(1) weight (``target='population'``: resampling requests) and its
imputation noise (the censored blocks' predictive variance) are then identical in any
chunking, and the estimator only has to keep **per-(group, request) sufficient statistics**
(:data:`TAIL_STATS`) between chunks: sums, not rows.

Two functions make the aggregate interface (issue 14 reuses them on Spark):

* :func:`request_stats` -- per-block columns in, per-(group, request) sums out;
* :func:`aggregate_stats` -- those sums (concatenated over any number of chunks of whole
  requests) in, the aggregate table with intervals out.

Example::

    >>> import pandas as pd
    >>> from acceptscope.estimators.bootstrap import request_stats, aggregate_stats
    >>> b = pd.DataFrame({"run_id": "r", "rid": ["a", "a", "b", "c"], "workload": ["x", "x", None, "x"],
    ...                   "mean": [1.0, 2.0, 3.0, 2.5], "var": [0.0, 0.5, 0.0, 0.2],
    ...                   "censored": [False, True, False, True]})
    >>> whole = aggregate_stats(request_stats(b, ["workload"]), ["workload"], n_boot=50)
    >>> parts = pd.concat([request_stats(b.iloc[:2], ["workload"]), request_stats(b.iloc[2:], ["workload"])])
    >>> bool(whole.equals(aggregate_stats(parts, ["workload"], n_boot=50)))   # chunking-free
    True
    >>> whole.workload.tolist()   # a NULL workload is a group of its own
    ['None', 'x']

:func:`cluster_weights` gives the same keyed Poisson(1) draws as a ``(replicates, rows)`` matrix
for estimators that refit or reweight rows (the tail's hazard refits; calibration metrics), and
:func:`iid_replicates` the seeded iid bootstrap of the audit's paired requests (exact or its normal limit)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from scipy.special import ndtri

from acceptscope.arrow_columns import one_array

TAIL_STATS = ("n", "n_censored", "sum_mean", "sum_var", "sum_below", "sum_above", "sum_truth", "n_truth")
_SUMS = ("n", "sum_mean", "n_censored", "sum_below", "sum_above", "n_truth", "sum_truth")  # per group, with the replicates
KEY = "req_key"  # uint64 stable hash of (run_id, rid)

_U64 = np.uint64
DRAW_CELLS = 1 << 16  # (replicate, request) draws made at once by the aggregates: a chunk's few requests
# draw many replicates a call (3-7x faster than one call a replicate); more cells only add cache misses
# Poisson(1) CDF up to 24 (the tail beyond is < 1e-24)
_P1_CDF = np.cumsum(np.exp(-1.0) / np.cumprod(np.concatenate([[1.0], np.arange(1, 25, dtype=float)])))


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (uint64 in, uint64 out; wraps)."""
    return _mix_into(np.array(h, dtype=np.uint64))


def _mix_into(h: np.ndarray) -> np.ndarray:
    """:func:`_mix` in place on an array this code owns, with one scratch array: the same numbers, ~10x
    faster on a (replicates x requests) block than the expression form (each ``^``, ``>>`` and ``*`` of that
    made a temporary the size of the block; the keyed draws were ~10% of ``estimate`` over a fleet)."""
    t = np.empty_like(h)
    with np.errstate(over="ignore"):
        for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
            np.right_shift(h, _U64(shift), out=t)
            h ^= t
            if mult is not None:
                h *= _U64(mult)
    return h


def _strings(x) -> np.ndarray:
    a = np.asarray(x, dtype=object)
    return a if a.size == 0 or isinstance(a.flat[0], str) else a.astype(str).astype(object)


def request_keys(run_id, rid) -> np.ndarray:
    """Stable uint64 key per (run_id, rid) (pandas' SipHash with its fixed key: the same on any
    machine, process or chunking)."""
    r = pd.util.hash_array(_strings(run_id), categorize=True)
    q = pd.util.hash_array(_strings(rid), categorize=False)
    with np.errstate(over="ignore"):
        return _mix(r * _U64(0x9E3779B97F4A7C15) ^ q)


def _arrow(values) -> pa.Array | None:
    """The one Arrow array behind ``values`` (an Arrow array, a pandas column of Arrow strings), or None."""
    arrow = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else getattr(
        getattr(values, "array", values), "__arrow_array__", lambda: None)()
    return None if arrow is None else one_array(arrow)


def _factorized(values) -> tuple[Any, np.ndarray]:
    """(the values, an Arrow array where Arrow holds them; integer codes equal exactly where they are)."""
    arrow = _arrow(values)
    if arrow is None:
        values = np.asarray(values)
        return values, pd.factorize(values)[0]
    return arrow, np.asarray(pc.dictionary_encode(arrow, null_encoding="encode").indices, dtype=np.int64)


def row_request_keys(run_id, rid) -> np.ndarray:
    """:func:`request_keys` per row, hashing each distinct request once. Columns Arrow holds are
    dictionary-encoded by Arrow and only the distinct requests' strings come out as Python objects
    (``np.asarray`` of the whole column made a string per row: ~7% of ``estimate`` at 100M rows)."""
    (runs, rc), (rids, qc) = _factorized(run_id), _factorized(rid)
    code, _ = pd.factorize(rc * (int(qc.max()) + 2 if qc.size else 1) + qc)
    first = np.zeros(int(code.max()) + 1 if code.size else 0, np.int64)
    first[code[::-1]] = np.arange(code.size)[::-1]

    def at(values, idx: np.ndarray) -> np.ndarray:
        return values.take(pa.array(idx)).to_numpy(zero_copy_only=False) if isinstance(values, pa.Array) \
            else values[idx]
    return request_keys(at(runs, first), at(rids, first))[code]


def _hashes(keys: np.ndarray, i, seed: int, stream: int) -> np.ndarray:
    """The 53-bit keyed hash per (replicate, key) behind :func:`uniforms` (one row per replicate of ``i``)."""
    with np.errstate(over="ignore"):
        idx = np.atleast_1d(np.asarray(i)).astype(np.uint64)
        salt = _mix(_U64(seed) * _U64(0xD6E8FEB86659FD93) + idx * _U64(0x9E3779B97F4A7C15)
                    + _U64(stream) * _U64(0xC2B2AE3D27D4EB4F))
        h = _mix_into(np.bitwise_xor(np.asarray(keys, np.uint64)[None, :], salt[:, None]))
    np.right_shift(h, _U64(11), out=h)
    return h


def _to_uniform(h: np.ndarray) -> np.ndarray:
    """53-bit hashes as Uniform(0, 1) draws, the midpoints of their 2**53 cells."""
    u = h.astype(np.float64)
    u += 0.5
    u *= 1.0 / float(1 << 53)  # a power of two: the same as dividing by it
    return u


def uniforms(keys: np.ndarray, i, seed: int = 0, stream: int = 0) -> np.ndarray:
    """Uniform(0, 1) per key for replicate ``i`` (independent streams by ``stream``). ``i`` an array of
    replicates: one row per replicate (each the same numbers as that replicate alone: one draw a cell)."""
    u = _to_uniform(_hashes(keys, i, seed, stream))
    return u if np.ndim(i) > 0 else u[0]


_P1_BITS = 16  # the hash's leading bits that index the Poisson(1) table


def _poisson_table() -> np.ndarray:
    """Poisson(1) value per value of a hash's leading :data:`_P1_BITS` bits, 255 where the CDF steps inside
    that cell of hashes (their draw is looked up in the CDF itself). Exact: a cell's uniforms run from its
    first hash's to its last's (the conversion is monotone), so a cell without a step holds one value."""
    shift = 53 - _P1_BITS
    first = np.arange(1 << _P1_BITS, dtype=np.uint64) << _U64(shift)
    last = first + _U64((1 << shift) - 1)
    lo, hi = (np.searchsorted(_P1_CDF, _to_uniform(h), side="right") for h in (first, last))
    return np.where(lo == hi, lo, 255).astype(np.uint8)


_P1_TABLE = _poisson_table()


def poisson_weights(keys: np.ndarray, i, seed: int = 0) -> np.ndarray:
    """Poisson(1) replicate weight per request (the request-clustered bootstrap); ``i`` as :func:`uniforms`.
    ``searchsorted(CDF, uniform)``, read off a table of the hash's leading bits (one cell in ~2,600 holds a
    step of the CDF: only its draws search); 12 of 17 ns a draw were the search (trim regret, calibration
    metrics and hazard refits draw 400 or 200 per request)."""
    h = _hashes(keys, i, seed, 1)
    w = _P1_TABLE[h >> _U64(53 - _P1_BITS)]
    step = np.flatnonzero(w == 255)
    if step.size:
        w.reshape(-1)[step] = np.searchsorted(_P1_CDF, _to_uniform(h.reshape(-1)[step]), side="right")
    w = w.astype(np.float64)
    return w if np.ndim(i) > 0 else w[0]


def normal_draws(keys: np.ndarray, i, seed: int = 0) -> np.ndarray:
    """Standard normal per request for replicate ``i`` (imputation noise); ``i`` as :func:`uniforms`."""
    return ndtri(uniforms(keys, i, seed, 2))


_MEMO: dict = {}  # the last key set's normal draws (see _normals)
MEMO_CELLS = 1 << 21  # at most this many draws kept (16 MB)


def _normals(keys: np.ndarray, n_boot: int, seed: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(draws ``(n_boot, n distinct keys)`` or None when too many to keep, the distinct keys sorted, each
    key's index among them). Why: a chunk's aggregates (4 specs, 1,000 replicates) draw the same keys'
    replicates 0..399 again and again; the keyed draws are the same whoever asks, so the last key set's
    draws are kept and reused (ndtri was ~5% of ``estimate``'s CPU)."""
    ks, kcode = np.unique(keys, return_inverse=True)
    if n_boot * ks.size > MEMO_CELLS:
        return None, ks, kcode
    m = _MEMO
    if m.get("seed") != seed or m["keys"].shape != ks.shape or not np.array_equal(m["keys"], ks):
        m.update(seed=seed, keys=ks, z=np.empty((0, ks.size)))
    have = m["z"].shape[0]
    if have < n_boot:  # the replicates not drawn yet (200 first, then 400: only 200..399)
        m["z"] = np.vstack([m["z"], normal_draws(ks, np.arange(have, n_boot), seed)])
    return m["z"][:n_boot], ks, kcode


class _Noise:
    """The replicates of per-group sums of per-(group, request) sums ``s0 + z * sd``, ``z`` keyed by the
    request (imputation noise), and with ``population`` each request's keyed Poisson(1) weight on them and
    on its count ``cnt``. One home for :func:`aggregate_stats` and :func:`replicate_sums`, which read the
    same replicates.

    Why per request, not per row: a group's replicate is its point sum plus ``sum_k z_k m_k`` over the
    requests ``k`` that drew noise, ``m_k`` the sum of their rows' ``sd`` in the group (and with
    ``population``, ``sum_k w_k (a_k + z_k m_k)``, ``a_k`` their rows' ``s0``). So a block of replicates is
    one product of its draws (replicates x requests) with those per-request columns, not a gather of the
    draws to every (group, request) row and a bincount of the result (2.4 of a fleet's 27 CPU-s). Each
    sum runs over the requests in one order whatever the block, so a replicate's numbers do not depend on
    which replicates are drawn beside it. Only requests with a positive ``sd`` draw noise (about a third
    over a fleet's runs: a request with no censored block has no predictive variance)."""

    def __init__(self, keys: np.ndarray, s0: np.ndarray, sd: np.ndarray, cnt: np.ndarray, g: np.ndarray, ng: int,
                 n_boot: int, seed: int, population: bool):
        self.seed = seed
        noisy = np.flatnonzero(sd > 0)
        self.Z, self.kuniq, kcode = _normals(keys[noisy], n_boot, seed)
        nk = self.kuniq.size
        # per noisy request and group: the sum of its rows' sd
        self.m = np.bincount(kcode * ng + g[noisy], weights=sd[noisy], minlength=nk * ng).reshape(nk, ng)
        if population:
            self.wkeys, wcode = np.unique(keys, return_inverse=True)  # every request draws its Poisson weight
            cell, size = wcode * ng + g, self.wkeys.size * ng
            self.a = np.bincount(cell, weights=s0, minlength=size).reshape(self.wkeys.size, ng)
            self.c = np.bincount(cell, weights=cnt, minlength=size).reshape(self.wkeys.size, ng)
            self.at = np.searchsorted(self.wkeys, self.kuniq)  # the noisy requests among them
            self.base = None
        else:
            self.wkeys, self.base = None, np.bincount(g, weights=s0, minlength=ng)
        # draws a replicate of a block holds: its noise, and with population its weights
        self.block_keys = nk + (self.wkeys.size if population else 0)

    def draws(self, i: np.ndarray) -> np.ndarray:
        """``(len(i), noisy requests)`` normal draws of replicates ``i``."""
        return normal_draws(self.kuniq, i, self.seed) if self.Z is None else self.Z[i]

    def group_sums(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Replicates ``i``' per-group numerators and (population target; else None) denominators."""
        z = self.draws(i) if self.kuniq.size else np.zeros((len(i), 0))
        if self.wkeys is None:
            return self.base[None, :] + _products(z, self.m), None
        w = poisson_weights(self.wkeys, i, self.seed)
        return _products(w, self.a) + _products(w[:, self.at] * z, self.m), _products(w, self.c)


def _products(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``x @ m`` ((b, k) by (k, g)) as one sum over ``k`` per cell, in the same order whatever ``b``
    (einsum's own loop, not BLAS, whose blocking may change with the number of rows)."""
    return np.einsum("bk,kg->bg", x, m)


def replicate_blocks(n_boot: int, n_keys: int, cells: int | None = None):
    """Replicate indices ``0 .. n_boot - 1`` in blocks of at most ``cells / n_keys`` (at least one):
    every replicate of a block is drawn in one vectorized call, memory ``cells`` draws."""
    step = (cells or DRAW_CELLS) // max(n_keys, 1)
    step = step if step >= 4 else 1  # a few rows a block only add index arithmetic (measured ~20% slower)
    return (np.arange(i, min(i + step, n_boot)) for i in range(0, n_boot, step))


def cluster_weights(clusters, n_boot: int, seed: int = 0, start: int = 0) -> np.ndarray:
    """``(n_boot, len(clusters))`` Poisson(1) replicate weights, one draw per cluster shared by its
    rows (the request-clustered bootstrap of every estimator: hazard refits, calibration metrics,
    aggregates). ``clusters``: uint64 request keys (:func:`request_keys`), or any labels (hashed
    stably). Replicate ``i`` of a cluster depends only on (its key, ``i``, ``seed``): not on row
    order, chunking, or which other clusters are present. ``start``: the first replicate's index
    (replicates ``start .. start + n_boot - 1``, for a bootstrap taken a block of replicates at a time)."""
    c = np.asarray(clusters)
    if c.dtype != np.uint64:
        c = pd.util.hash_array(_strings(c) if c.dtype == object else c, categorize=True)
    code, uniq = pd.factorize(c)
    uniq = np.asarray(uniq, np.uint64)
    return poisson_weights(uniq, np.arange(start, start + n_boot), seed)[:, code]


def iid_replicates(n_boot: int, seed: int = 0, *, rows: tuple | None = None, stat=None, total=None,
                   cov=None) -> np.ndarray:
    """``(n_boot, k)`` bootstrap replicates of a statistic of iid rows (the audit's paired requests).

    With ``rows`` (equal-length arrays) and ``stat`` (arrays in, ``k`` numbers out): the exact
    resampling, one index draw per replicate (no ``n_boot x m`` matrix). Otherwise the normal limit of a
    sum of ``m`` iid rows, ``N(total, cov)`` (``cov``: ``m`` times one row's covariance): ``n_boot x k``
    numbers however many rows. The caller picks by its row count; both draw from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    if rows is None:
        return rng.multivariate_normal(total, cov, size=n_boot, method="eigh", check_valid="ignore")
    m = len(rows[0])
    if n_boot == 0:  # no replicates, the statistic's width kept
        return np.empty((0, np.size(stat(*rows))))
    return np.array([stat(*(c[i] for c in rows)) for i in (rng.integers(0, m, size=m) for _ in range(n_boot))])


def group_codes(df: pd.DataFrame, by: list[str]) -> tuple[np.ndarray, pd.DataFrame]:
    """Integer code per row of the ``by`` columns (NULL is a value of its own) and the groups
    (``by`` columns, one row per code). No string joins: per-column codes combined by radix."""
    if not by:
        return np.zeros(len(df), np.int64), pd.DataFrame(index=[0])
    code = np.zeros(len(df), np.int64)
    for c in by:
        cc, _ = pd.factorize(df[c], use_na_sentinel=False)
        code = code * (int(cc.max()) + 1 if cc.size else 1) + cc
    code, first = pd.factorize(code)
    # first row of each code -> the group's values
    pos = np.full(len(first), -1, np.int64)
    pos[code[::-1]] = np.arange(len(df))[::-1]
    return code.astype(np.int64), df[by].iloc[pos].reset_index(drop=True)


def request_stats(blocks: pd.DataFrame, by: list[str] | None = None, *, keys: np.ndarray | None = None) -> pd.DataFrame:
    """Per-(group, request) sufficient statistics of per-block estimates.

    ``blocks``: ``run_id``, ``rid``, ``mean``, ``var``, ``censored`` and optionally ``mode``,
    ``resolved``, ``bound_lo``, ``bound_hi`` (greedy blocks the data leave unresolved widen the
    interval by their identification bounds), ``sens_lo``, ``sens_hi`` (the ends of the hazard model's
    extrapolation band, :mod:`estimators.margin`: they widen it too) and ``truth``. ``keys``: precomputed
    :func:`request_keys` per row. Rows of one request may be split across calls only if they
    fall in different groups' calls too: chunk by whole requests."""
    by = list(by or [])
    n = len(blocks)
    if keys is None:
        keys = row_request_keys(blocks["run_id"], blocks["rid"])
    gcode, groups = group_codes(blocks, by)
    kcode, kuniq = pd.factorize(keys)
    cl, cl_first = pd.factorize(gcode * (len(kuniq) + 1) + kcode)
    ncl = len(cl_first)
    mean = blocks["mean"].to_numpy(float)

    def s(w):
        return np.bincount(cl, weights=w, minlength=ncl)

    below = above = np.zeros(n)
    ident = np.zeros(n, bool)
    if {"bound_lo", "bound_hi", "resolved", "mode"} <= set(blocks.columns):
        ident = (blocks["mode"].to_numpy() == "greedy") & ~blocks["resolved"].to_numpy(bool)
        if ident.any():
            below = np.where(ident, np.maximum(mean - blocks["bound_lo"].to_numpy(float), 0), 0.0)
            above = np.where(ident, np.maximum(blocks["bound_hi"].to_numpy(float) - mean, 0), 0.0)
    if {"sens_lo", "sens_hi"} <= set(blocks.columns):
        # the model's extrapolation past the margin (estimators.margin): a systematic band, added, not drawn
        below = below + np.where(ident, 0.0, np.maximum(mean - blocks["sens_lo"].to_numpy(float), 0))
        above = above + np.where(ident, 0.0, np.maximum(blocks["sens_hi"].to_numpy(float) - mean, 0))
    truth = blocks["truth"].to_numpy(float) if "truth" in blocks else np.full(n, np.nan)
    has_t = ~np.isnan(truth)
    first = np.zeros(ncl, np.int64)
    first[cl[::-1]] = np.arange(n)[::-1]
    cols = dict(groups.iloc[gcode[first]].reset_index(drop=True).items()) if by else {}
    # one frame from its columns (a column at a time was ~1 ms each: 40% of this function over a fleet)
    return pd.DataFrame({**cols, KEY: keys[first], "n": np.bincount(cl, minlength=ncl).astype(np.int64),
                         "n_censored": s(blocks["censored"].to_numpy(float)).astype(np.int64),
                         "sum_mean": s(mean), "sum_var": s(np.maximum(blocks["var"].to_numpy(float), 0)),
                         "sum_below": s(below), "sum_above": s(above),
                         "sum_truth": s(np.where(has_t, truth, 0.0)),
                         "n_truth": s(has_t.astype(float)).astype(np.int64)}, index=pd.RangeIndex(ncl))


def _label(v) -> str:
    return "None" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)


def aggregate_stats(stats: pd.DataFrame, by: list[str] | None = None, *, level: float = 0.95, n_boot: int = 400,
                    target: str = "run", seed: int = 0, shift: pd.DataFrame | None = None) -> pd.DataFrame:
    """Mean ceiling per group with a request-clustered bootstrap interval, from :func:`request_stats`
    rows (of any number of chunks of whole requests).

    Replicate ``i``: every (group, request) sum gets ``z * sqrt(sum of predictive variances)``
    (imputation noise of its censored blocks, ``z`` drawn per request), and with
    ``target='population'`` a Poisson(1) weight per request. ``shift``: optional per-group rows
    (``by`` columns plus ``shift_0 .. shift_{R-1}``) of hazard-refit replicate sums minus the
    point-estimate sum; replicate ``i`` adds ``shift_{i mod R}`` (scaled by the replicate's
    weighted share of the group's blocks). Greedy blocks left unresolved widen the interval
    by their identification bounds."""
    if target not in ("run", "population"):
        raise ValueError(f"target must be 'run' or 'population', got {target!r}")
    by = list(by or [])
    gcode, groups = group_codes(stats, by)
    labels = np.array(["|".join(_label(v) for v in row) for row in groups[by].itertuples(index=False)]
                      if by else ["all"], dtype=object)  # one per group, not per row
    order = np.argsort(labels, kind="stable")  # groups in label order: independent of chunk order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    g = rank[gcode]
    groups, labels = groups.iloc[order].reset_index(drop=True), labels[order]
    ng = len(labels)
    key = stats[KEY].to_numpy(np.uint64)
    cnt = stats["n"].to_numpy(float)
    s0 = stats["sum_mean"].to_numpy(float)
    sd = np.sqrt(np.maximum(stats["sum_var"].to_numpy(float), 0))
    n_g = np.bincount(g, weights=cnt, minlength=ng)
    sum_g = np.bincount(g, weights=s0, minlength=ng)
    sh = None
    if shift is not None and len(shift):
        cols = [c for c in shift.columns if c.startswith("shift_")]
        if by:  # match on the groups' labels (NULL keys included)
            lab = np.array(["|".join(_label(v) for v in row) for row in shift[by].itertuples(index=False)], dtype=object)
            m = shift[cols].groupby(lab).sum().reindex(labels)
        else:
            m = shift[cols].sum().to_frame().T
        sh = m[cols].fillna(0.0).to_numpy(float).T  # (R, ng)
    # keys repeat across (group, request) clusters of one request: draw once per distinct key
    noise = _Noise(key, s0, sd, cnt, g, ng, n_boot, seed, target == "population")
    reps = np.empty((n_boot, ng))
    for i in replicate_blocks(n_boot, noise.block_keys):
        num, den = noise.group_sums(i)
        den = n_g if den is None else den
        if sh is not None:
            num = num + sh[i % sh.shape[0]] * den / np.maximum(n_g, 1e-12)
        reps[i] = num / np.maximum(den, 1e-12)
    a = (1 - level) / 2
    lo, hi = np.quantile(reps, [a, 1 - a], axis=0) if n_boot else (np.full(ng, np.nan), np.full(ng, np.nan))
    lo = lo - np.bincount(g, weights=stats["sum_below"].to_numpy(float), minlength=ng) / n_g
    hi = hi + np.bincount(g, weights=stats["sum_above"].to_numpy(float), minlength=ng) / n_g
    out = pd.DataFrame({"group": labels, "n": n_g.astype(np.int64),
                        "n_censored": np.bincount(g, weights=stats["n_censored"].to_numpy(float), minlength=ng).astype(np.int64),
                        "mean_ceiling": sum_g / n_g, "lo": lo, "hi": hi, "level": level, "target": target})
    nt = stats["n_truth"].to_numpy(float)
    if nt.sum() == cnt.sum() and cnt.sum() > 0:
        out["truth"] = np.bincount(g, weights=stats["sum_truth"].to_numpy(float), minlength=ng) / n_g
    for c in by:
        out[c] = [_label(v) for v in groups[c]]
    return out


def shift_sums(blocks_group: pd.DataFrame, by: list[str], deltas: np.ndarray) -> pd.DataFrame:
    """Per-group sums of hazard-refit replicate deltas ``deltas`` (R, n rows: replicate mean minus
    the point mean), as ``aggregate_stats(shift=...)`` takes them (sum them over chunks by ``by``)."""
    by = list(by or [])
    gcode, groups = group_codes(blocks_group, by)
    ng = len(groups)
    shifts = {f"shift_{j}": np.bincount(gcode, weights=deltas[j], minlength=ng) for j in range(deltas.shape[0])}
    return pd.DataFrame({**(dict(groups.items()) if by else {}), **shifts}, index=pd.RangeIndex(ng))


def replicate_sums(stats: pd.DataFrame, by: list[str] | None = None, *, n_boot: int = 400, target: str = "run",
                   seed: int = 0) -> dict:
    """:func:`aggregate_stats`' replicate numerators and denominators per group, as partial sums over
    the requests in ``stats``: they add up exactly across any split of the requests (every draw is
    keyed by the request), so executors can each reduce their own requests and
    :func:`aggregate_from_sums` finishes on the sums alone (issue 14: nothing per request moves)."""
    if target not in ("run", "population"):
        raise ValueError(f"target must be 'run' or 'population', got {target!r}")
    by = list(by or [])
    g, groups = group_codes(stats, by)
    labels = np.array(["|".join(_label(v) for v in row) for row in groups[by].itertuples(index=False)]
                      if by else ["all"], dtype=object)
    ng = len(labels) if len(stats) else 0
    cnt, s0 = stats["n"].to_numpy(float), stats["sum_mean"].to_numpy(float)
    sd = np.sqrt(np.maximum(stats["sum_var"].to_numpy(float), 0))
    key = stats[KEY].to_numpy(np.uint64)
    noise = _Noise(key, s0, sd, cnt, g, ng, n_boot if ng else 0, seed, target == "population")
    num = np.zeros((n_boot, ng))
    den = np.zeros((n_boot, ng)) if target == "population" else None
    for i in replicate_blocks(n_boot if ng else 0, noise.block_keys):
        num[i], d = noise.group_sums(i)
        if den is not None:
            den[i] = d
    out = dict(labels=labels[:ng], by=by, num=num, den=den, target=target,
               values=[[_label(v) for v in groups[c]][:ng] for c in by])
    for c in _SUMS:
        out[c] = np.bincount(g, weights=stats[c].to_numpy(float), minlength=ng)
    return out


def add_sums(parts: list[dict]) -> dict:
    """One :func:`replicate_sums` part from several of disjoint sets of requests (groups matched by
    label, in label order): what a pass keeps between chunks instead of per-request statistics."""
    by, target = parts[0]["by"], parts[0]["target"]
    labels = np.array(sorted({lab for p in parts for lab in p["labels"]}), dtype=object)
    ng, n_boot = len(labels), parts[0]["num"].shape[0]
    at = {lab: j for j, lab in enumerate(labels)}
    values = [[None] * ng for _ in by]
    out = {c: np.zeros(ng) for c in _SUMS}
    num = np.zeros((n_boot, ng))
    den = np.zeros((n_boot, ng)) if target == "population" else None
    for p in parts:
        j = np.array([at[lab] for lab in p["labels"]], np.int64)
        for c in _SUMS:
            np.add.at(out[c], j, p[c])
        np.add.at(num.T, j, p["num"].T)
        if den is not None:
            np.add.at(den.T, j, p["den"].T)
        for col, vals in zip(values, p["values"]):
            for jj, v in zip(j, vals):
                col[jj] = v
    out.update(labels=labels, by=by, num=num, den=den, target=target, values=values)
    return out


def aggregate_from_sums(parts: list[dict], *, level: float = 0.95, shift: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`aggregate_stats`' table from :func:`replicate_sums` of disjoint sets of requests."""
    s = add_sums(parts)
    by, target, labels, values, num, den = s["by"], s["target"], s["labels"], s["values"], s["num"], s["den"]
    ng, n_boot = len(labels), num.shape[0]
    acc = s
    n_g = acc["n"]
    sh = None
    if shift is not None and len(shift):
        cols = [c for c in shift.columns if c.startswith("shift_")]
        if by:
            lab = np.array(["|".join(_label(v) for v in row) for row in shift[by].itertuples(index=False)], dtype=object)
            m = shift[cols].groupby(lab).sum().reindex(labels)
        else:
            m = shift[cols].sum().to_frame().T
        sh = m[cols].fillna(0.0).to_numpy(float).T
    reps = np.empty((n_boot, ng))
    for i in range(n_boot):
        d = den[i] if den is not None else n_g
        x = num[i] if sh is None else num[i] + sh[i % sh.shape[0]] * d / np.maximum(n_g, 1e-12)
        reps[i] = x / np.maximum(d, 1e-12)
    a = (1 - level) / 2
    lo, hi = np.quantile(reps, [a, 1 - a], axis=0) if n_boot else (np.full(ng, np.nan), np.full(ng, np.nan))
    out = pd.DataFrame({"group": labels, "n": n_g.astype(np.int64), "n_censored": acc["n_censored"].astype(np.int64),
                        "mean_ceiling": acc["sum_mean"] / n_g, "lo": lo - acc["sum_below"] / n_g,
                        "hi": hi + acc["sum_above"] / n_g, "level": level, "target": target})
    if acc["n_truth"].sum() == n_g.sum() and n_g.sum() > 0:
        out["truth"] = acc["sum_truth"] / n_g
    for c, vals in zip(by, values):
        out[c] = vals
    return out
