"""Counterfactual tail (block-accept) estimator: what a full-gamma verify would have accepted.

A request-step is *right-censored* when its whole window was accepted while drafts were
trimmed (``correct_drafts == window < gamma``): the uncapped ceiling ``K`` is at least
``window`` and the rest is unobserved. For every such block this module returns the
predictive distribution of ``K`` (discrete, on ``window..gamma``), its mean, quantile
intervals, deterministic identification bounds, and aggregates with bootstrap intervals.

How each trimmed position ``k`` (draft ``d_k`` at absolute position ``prefix+k+1``) gets
its conditional acceptance probability ``h_k`` (given ``d_<k`` accepted):

* **first trimmed position** (``k = window``): the bonus row was verified, and the capped
  bonus equals ``d_w`` exactly when ``d_w`` was accepted (greedy argmax; residual
  resampling puts no mass on a rejected draft), so ``h_w = 1[bonus == d_w]`` is exact (read
  from ``bonus_token`` when a last step's output was cut before the bonus: the verify still
  recorded it);
* **greedy requests**: walk the request's later committed tokens against the trimmed
  drafts; acceptance is deterministic given the prefix, so ``h_k = 1[realized == d_k]``
  while the earlier trimmed drafts matched. A walk that runs off the end of the request
  (or a stream discontinuity) is censored, with bounds;
* **sampled requests with log-probs**: while the realized tokens follow the trimmed drafts,
  a later step's verified row scored the same position with the same prefix; where it
  scored the same token, ``h_k = min(1, p/q)`` (Rao-Blackwellised: the exact acceptance
  probability; the later step's coins are independent of the counterfactual coin). SGLang
  estimator JSONL (``gather={"gather": pg entries, "rows": row records}``) can supply ``p`` and
  ``q`` where the telemetry lacks them (SGLang's info dump carries no log-probs). That path is
  experimental: on synthetic truth it lowers MAE but leaves a small negative bias the aggregate
  intervals do not cover, so the facade and the harness keep it off by default;
* **everything else** (after a divergence, after the request ended, no log-probs): a
  :class:`~estimators.hazard.HazardModel` conditioned on the block's own confidence (the
  scheduler cut from confidence: conditioning on it handles the informative censoring).

Example::

    >>> from acceptscope.estimators.synthetic import simulate, compact_view
    >>> from acceptscope.estimators.tail import TailEstimator
    >>> sim = simulate(n_requests=80, seed=3)
    >>> rs = sim.tables["request_steps"]
    >>> est = TailEstimator().fit(rs)            # hazards from cap-accept truth
    >>> res = est.estimate(compact_view(rs))     # estimate as if compact (ceiling hidden)
    >>> from acceptscope.estimators.frame import BlockFrame
    >>> truth = BlockFrame.from_request_steps(rs).ceiling   # same row order
    >>> g = res.blocks.assign(truth=truth)
    >>> g = g[g["mode"] == "greedy"]
    >>> bool(((g.truth == g["mean"]) | ~g.resolved).all())   # greedy resolved blocks are exact
    True
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from acceptscope.estimators.bootstrap import aggregate_stats, cluster_weights, request_stats, row_request_keys, shift_sums
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.hazard import HazardModel
from acceptscope.estimators.margin import (MIN_MARGIN, SHIFT_GRID, UnobservedPrior, audit_posterior, fit_shift,
                                          margin_outcomes, shift_hazards)

LEVELS = (0.8, 0.9, 0.95)
_MODES = ("exact-in-window", "greedy", "logprob", "confidence")  # blocks.mode, by code
_STATE = np.array([0, 2, 0, 2, 3, 3, 1, 1], np.int64)  # walk state by 4*path_ok + 2*unknown + diverged


def prior_rows(prior: UnobservedPrior | None, mode: np.ndarray) -> np.ndarray:
    """The open blocks (by ``mode``, a code of :data:`_MODES` or its name) the prior's shift applies to:
    the sampled blocks with log-probs for the prior alone, every open block once an audit measured it. Why
    only those for the prior alone: it was measured there (the tune split's engine runs all carry log-probs);
    blocks without log-probs (SGLang's dumps) or greedy ones were never seen to need it, and shifting them
    broke the per-block calibration of SGLang's own recorder scenarios (cov90 0.76)."""
    if prior is not None and prior.scope == "open":
        return np.ones(len(mode), bool)
    return (mode == 2) if mode.dtype.kind in "iu" else (mode == "logprob")


def prior_applied(hm: np.ndarray, delta: float, rows: np.ndarray) -> np.ndarray:
    """Model hazards ``hm`` (open blocks x positions) with the unobserved-position shift ``delta`` on ``rows``
    (:func:`prior_rows`)."""
    if delta == 0 or not rows.any():
        return hm
    return np.where(rows[:, None], shift_hazards(hm, delta), hm)


def strip_training(model: HazardModel) -> HazardModel:
    """A copy of a fitted hazard model without its training layout (what predicting needs)."""
    m = copy.copy(model)
    for a in ("_train", "_grp", "_cell"):
        m.__dict__.pop(a, None)
    return m


def _as_frame(data, gamma=None) -> BlockFrame:
    return data if isinstance(data, BlockFrame) else BlockFrame.from_request_steps(data, gamma=gamma)


def gather_matrix(frame: BlockFrame, gather: pd.DataFrame | None, rows: np.ndarray) -> np.ndarray:
    """SGLang ``pg`` target log-probs as an ``(len(rows), G)`` matrix keyed by (rid, block_fct, offset)."""
    G = frame.gamma
    out = np.full((len(rows), G), np.nan)
    if gather is None or len(gather) == 0:
        return out
    key = pd.MultiIndex.from_arrays([frame.df["run_id"].to_numpy()[rows], frame.df["rid"].to_numpy()[rows],
                                     frame.df["forward_ct"].to_numpy()[rows]])
    gk = pd.MultiIndex.from_arrays([gather["run_id"], gather["rid"], gather["block_fct"]])
    pos = key.get_indexer(gk) if key.is_unique else pd.Index(key).get_indexer(gk)
    ok = pos >= 0
    k = gather["offset"].to_numpy()[ok] - 1
    inside = (k >= 0) & (k < G)
    out[pos[ok][inside], k[inside]] = gather["p_lp"].to_numpy()[ok][inside]
    return out


def q_matrix(frame: BlockFrame, est_rows: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """SGLang estimator-row ``q_lp`` (draft log-probs of the trimmed tokens) by absolute draft index."""
    G = frame.gamma
    out = np.full((len(rows), G), np.nan)
    if est_rows is None or len(est_rows) == 0:
        return out
    er = est_rows[[isinstance(x, (list, tuple, np.ndarray)) for x in est_rows["q_lp"]]]
    if er.empty:
        return out
    key = pd.MultiIndex.from_arrays([frame.df["run_id"].to_numpy()[rows], frame.df["rid"].to_numpy()[rows],
                                     frame.df["forward_ct"].to_numpy()[rows]])
    pos = key.get_indexer(pd.MultiIndex.from_arrays([er["run_id"], er["rid"], er["fct"]]))
    for p, w, q in zip(pos, er["w"].to_numpy(), er["q_lp"]):
        if p >= 0:
            q = np.asarray(q, float)[: G - w]
            out[p, w:w + q.size] = q
    return out


def walk(frame: BlockFrame, rows: np.ndarray, *, use_logprobs: bool = True, exact_first: bool = True,
         gather=None) -> dict:
    """Known per-position hazards of the trimmed positions of ``rows`` (NaN: unknown).

    Returns ``h`` (len(rows), G), ``walked`` (positions observed along the matched path),
    ``path_ok`` (earlier trimmed drafts all matched the realized tokens) and ``state`` per
    position for the hazard model: 1 matched so far but ``h`` unknown here, 3 matched and ``h``
    known, 2 a realized token diverged from an earlier trimmed draft (informative: bad news
    for the drafter), 0 unknown (stream ended). The state depends on what the walk could see
    (it differs with and without log-probs), so hazards are fitted with the same walk."""
    G = frame.gamma
    k = np.arange(G)[None, :]
    w = frame.window[rows][:, None]
    d = frame.draft.take(rows, axis=0)  # (a row take: several times a fancy index d[rows])
    lt = frame.later(rows)  # this call's own arrays: combined in place below
    valid = lt["valid"]
    valid &= d >= 0
    match = lt["realized"] == d
    match &= valid
    tail = k >= w
    path_ok = _before_all(~tail | match)
    on_path = tail & path_ok
    greedy = frame.greedy[rows][:, None]
    # greedy: exact indicator along the matched path; first trimmed position: exact via the
    # capped bonus (all modes)
    exact = on_path & valid
    exact &= greedy
    if exact_first:
        exact |= (k == w) & valid
    h = np.where(exact, match, np.nan)
    dlp = frame.list_rows("draft_logprob", rows)
    has_q = has_lp = ~np.isnan(dlp).all(1)
    if use_logprobs:
        lp = lt["scored_lp"]
        np.putmask(lp, lt["scored_tok"] != d, np.nan)
        if gather is not None:
            pg = gather.get("gather") if isinstance(gather, dict) else gather
            gm = gather_matrix(frame, pg, rows)
            lp = np.where(np.isnan(lp), gm, lp)
            if isinstance(gather, dict) and gather.get("rows") is not None:
                dlp = np.where(np.isnan(dlp), q_matrix(frame, gather["rows"], rows), dlp)
                has_q = ~np.isnan(np.where(tail, dlp, np.nan)).all(1)
        # h is NaN there, as is min(1, p/q) where unknown: computed only where the later step scored the draft
        soft = on_path & ~exact
        soft &= ~greedy
        soft &= ~np.isnan(lp)
        soft = np.flatnonzero(soft)
        h.reshape(-1)[soft] = np.minimum(1.0, np.exp(lp.reshape(-1)[soft] - dlp.reshape(-1)[soft]))
    unknown = np.isnan(h)
    walked = np.count_nonzero(on_path & ~unknown, axis=1)
    off = tail & valid  # a realized token that is not the draft: the walk diverged after it
    off &= ~match
    diverged = ~_before_all(~off)
    # state by lookup of (path_ok, unknown, diverged): matched -> 3 known / 1 unknown; else 2 / 0
    code = path_ok * np.int8(4)
    code += unknown * np.int8(2)
    code += diverged
    state = _STATE.take(code)
    return dict(h=h, walked=walked, path_ok=path_ok, state=state, has_q=has_q, has_lp=has_lp | has_q)


def _before_all(ok: np.ndarray) -> np.ndarray:
    """``out[:, j] = ok[:, :j].all(1)`` (True at ``j = 0``), one column at a time (G is small)."""
    out = np.ones(ok.shape, bool)
    for j in range(1, ok.shape[1]):
        np.logical_and(out[:, j - 1], ok[:, j - 1], out=out[:, j])
    return out


def _pick(X: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``X[i, j[i]]`` for every row ``i``, as one flat take (a 2-D fancy index is several times slower)."""
    return X.reshape(-1).take(np.arange(len(j)) * X.shape[1] + j)


def quantile_intervals(pmf: np.ndarray, levels, rule: str, u: np.ndarray | None = None) -> dict:
    """Equal-tailed intervals of discrete distributions on 0..G (rows of ``pmf``)."""
    F = np.cumsum(pmf, 1)
    Fm = np.concatenate([np.zeros((pmf.shape[0], 1)), F[:, :-1]], 1)  # P(K < v)
    G1 = pmf.shape[1]
    out = {}
    support = pmf > 1e-12
    for L in levels:
        a2 = (1 - L) / 2
        if rule == "conservative":
            lo = np.argmax(F >= a2 - 1e-12, axis=1)
            hi = np.argmax(F >= 1 - a2 - 1e-12, axis=1)
        elif rule == "nearest":
            # lower end: excluded lower mass nearest a/2 (within the support); then the upper end
            # making the interval's total mass nearest L (ties -> shorter)
            cand = np.where(support, np.abs(Fm - a2), np.inf)
            lo = np.argmin(cand, 1)
            mass = F - _pick(Fm, lo)[:, None]
            vv = np.arange(G1)[None, :]
            cand2 = np.where((vv >= lo[:, None]) & support, np.abs(mass - L), np.inf)
            hi = np.argmin(cand2 + 1e-9 * vv, 1)
        if rule == "randomized":
            # lower end: excluded lower mass nearest a/2; upper end: the shortest hi with mass >= L
            # ("above") or the one before it ("below"), chosen with the probability that makes the
            # expected mass exactly L (a randomized interval: discrete predictive distributions
            # cannot hit a nominal level otherwise). Uniforms come from ``u`` (seeded per block).
            cand = np.where(support, np.abs(Fm - a2), np.inf)
            lo = np.argmin(cand, 1)
            base = _pick(Fm, lo)[:, None]
            mass = F - base
            vv = np.arange(G1)[None, :]
            above = np.argmax((mass >= L - 1e-12) & (vv >= lo[:, None]), 1)
            m_above = _pick(mass, above)
            below = np.maximum(above - 1, lo)
            m_below = np.where(above > lo, _pick(mass, below), 0.0)
            pi = np.where(m_above > m_below, (L - m_below) / np.maximum(m_above - m_below, 1e-12), 1.0)
            take_below = (u >= pi) & (above > lo)
            hi = np.where(take_below, below, above)
        m = _pick(F, hi) - _pick(Fm, lo)
        out[L] = (lo, hi, m)
    return out


def observation_statement(n: int, n_cens: int, resolved: int, truth_mean: float | None, notes: list[str]) -> str:
    """What is observed and what is estimated, in one sentence a reader can check (``truth_mean``:
    the recorded mean ceiling when the run recorded it, else None)."""
    if truth_mean is not None:
        return (f"ceiling recorded on all {n} request-steps (the verify ran the whole block; mean "
                f"{truth_mean:.3f} drafts): utilization is exact; the tail figures are the estimator run as if it "
                f"were hidden ({n_cens - resolved} of {n_cens} trimmed blocks model-based), for comparison with "
                "the recorded ceiling")
    src = next((x for x in notes if x.startswith("hazards fitted")), "hazards from a fitted model")
    return (f"{n - n_cens} of {n} request-steps observed in full (a rejection inside the window, or no "
            f"trimming); {n_cens} trimmed blocks accepted their whole window: {resolved} resolved exactly from "
            f"the telemetry (capped bonus, greedy walks, log-probs), {n_cens - resolved} unresolved and "
            f"estimated with predictive intervals ({src})")


def _block_uniforms(frame: BlockFrame, rows: np.ndarray, seed: int) -> np.ndarray:
    """A reproducible uniform per block, a splitmix64 hash of what identifies the block in the
    telemetry (forward_ct, prefix_len, window, drafted tokens): the same block gets the same draw
    whatever subset or chunk it is estimated in."""
    M = np.uint64(0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        h = frame.forward_ct[rows].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        h ^= frame.prefix[rows].astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
        h ^= frame.window[rows].astype(np.uint64) * np.uint64(0x165667B19E3779F9)
        d = frame.draft.take(rows, axis=0).view(np.uint64)  # (int64 -> uint64: the same bits, no copy)
        for k in range(frame.gamma):
            h ^= d[:, k]
            h *= np.uint64(0x100000001B3)
        h ^= np.uint64(seed) * np.uint64(0xD6E8FEB86659FD93)
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        h = (h ^ (h >> np.uint64(31))) & M
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass
class TailResult:
    """Per-request-step predictive ceilings. ``blocks`` has one row per request-step."""

    blocks: pd.DataFrame
    pmf: np.ndarray  # (n, G+1) predictive distribution of the ceiling (accepted drafts)
    gamma: int
    levels: tuple
    hazard_info: dict
    notes: list[str] = field(default_factory=list)
    _boot: dict | None = None

    @property
    def censored(self) -> pd.DataFrame:
        return self.blocks[self.blocks.censored]

    def summary(self) -> dict:
        b = self.blocks
        c = b[b.censored]
        modes = c["mode"].value_counts().to_dict()
        resolved = int(c.resolved.sum())
        recorded = "truth" in b and not b["truth"].isna().any()
        out = dict(n_request_steps=int(len(b)), n_censored=int(len(c)), censored_by_mode=modes,
                   mean_ceiling=float(b["mean"].mean()), mean_accept_length=float(b["mean"].mean() + 1),
                   greedy_resolved=int((c["mode"].eq("greedy") & c.resolved).sum()),
                   n_resolved=resolved, n_unresolved=int(len(c)) - resolved,
                   ceiling="recorded" if recorded else "estimated",
                   statement=observation_statement(len(b), len(c), resolved,
                                                   float(b["truth"].mean()) if recorded else None, self.notes),
                   hazard=self.hazard_info, notes=self.notes)
        return out

    def aggregate(self, by: list[str] | str | None = None, level: float = 0.95, n_boot: int = 400,
                  target: str = "run", seed: int = 0) -> pd.DataFrame:
        """Mean ceiling per group with a bootstrap interval.

        ``target='run'``: the realized mean of these request-steps (imputation noise of the
        censored blocks, plus hazard-model refits when the result was estimated with
        ``hazard_boot > 0``);
        ``target='population'``: also resamples requests (request-clustered bootstrap), for
        the mean of the traffic these requests were drawn from.

        Per-(group, request) sums and replicate draws seeded by the request key
        (:mod:`estimators.bootstrap`): the interval does not depend on row order or chunking.
        """
        b = self.blocks
        by = [by] if isinstance(by, str) else list(by or [])
        keys = row_request_keys(b["run_id"], b["rid"])
        shift = None
        if self._boot:  # hazard refits: per-group sums of each replicate's shift from the point estimate
            shift = shift_sums(b, by, self._boot["means"] - b["mean"].to_numpy(float)[None, :])
        return aggregate_stats(request_stats(b, by, keys=keys), by, level=level, n_boot=n_boot, target=target,
                               seed=seed, shift=shift)

    def to_json(self) -> dict:
        return dict(summary=self.summary(), aggregate=self.aggregate().to_dict("records"))


@dataclass
class TailEstimator:
    """Fit hazards on truth-bearing (or observed) traffic; estimate ceilings of any run.

    ``mode``: ``auto`` uses every source available per row; ``confidence`` ignores
    log-probs (SGLang's cheap compact telemetry); ``logprob`` requires them.
    ``interval``: ``randomized`` (default: the upper end randomized between the two
    candidates bracketing the level so the expected mass equals it; seeded per block, so
    reproducible), ``nearest`` (mass nearest the level) or ``conservative`` (mass >= level).
    """

    hazard: HazardModel = field(default_factory=HazardModel)
    mode: str = "auto"
    levels: tuple = LEVELS
    interval: str = "randomized"
    exact_first: bool = True
    margin: bool = True  # hazards fitted without truth: the prior for positions the walk could not follow (estimators.margin)
    # fitted state (not fields): the unobserved-position prior (fit_margin) and the refits of a frozen copy
    prior_ = None
    refits_ = None

    def fit(self, data, gamma: int | None = None, gather=None) -> "TailEstimator":
        frame = _as_frame(data, gamma)
        # the walk never reads truth columns, and on a cap-accept frame it sees exactly what the
        # compact view of the same draws would show (later steps' on-path rows are verified in both)
        wk = self._walk(frame, np.arange(frame.n), gather)
        self.hazard.fit(frame, wk["h"], wk["state"])
        self.__dict__.pop("_refits", None)  # refits of an earlier fit are stale
        self.gamma_ = frame.gamma
        self.fit_margin(frame, wk)
        return self

    @classmethod
    def confidence_only(cls, gamma: int, why: str) -> "TailEstimator":
        """An estimator whose hazards are the confidences themselves (no fit): for a run whose training
        runs hold no position to learn from (a static run never trims, so nothing lies past a window)."""
        est = cls(hazard=HazardModel(method="confidence"))
        hz = est.hazard
        hz.gamma_, hz.fitted_, hz.info_ = gamma, True, dict(method="confidence", source="none", why=why)
        est.gamma_ = gamma
        return est

    def fit_margin(self, frame: BlockFrame, wk: dict | None = None) -> "TailEstimator":
        """The prior for positions the walk could not follow (:mod:`estimators.margin`) when the hazards
        were fitted on observed outcomes (no truth), with the margin check from ``frame``'s first trimmed
        positions; None for hazards fitted on truth (an audit saw those positions)."""
        self.prior_ = None
        if not self.margin or self.hazard.method == "confidence" or self.hazard.info_.get("source") != "observed":
            return self
        rows = np.flatnonzero(frame.censored)
        if wk is None:
            wk = self._walk(frame, rows, None)
            known, state = wk["h"], wk["state"]
        else:
            known, state = wk["h"][rows], wk["state"][rows]
        i, y = margin_outcomes(frame, rows, known)
        check = None
        if y.size >= MIN_MARGIN:
            check = fit_shift(self.hazard.predict(frame, rows[i], state[i])[np.arange(i.size), frame.window[rows[i]]], y)
        self.prior_ = UnobservedPrior(margin_check=check)
        self.hazard.info_ = dict(self.hazard.info_, unobserved_prior=self.prior_.to_json())
        return self

    def _walk(self, frame, rows, gather):
        wk = walk(frame, rows, use_logprobs=self.mode != "confidence", exact_first=self.exact_first, gather=gather)
        if self.exact_first:
            _first_from_bonus(frame, rows, wk)
        return wk

    def hazard_refits(self, hazard_boot: int, seed: int = 0) -> list:
        """The ``hazard_boot`` request-bootstrap refits of the fitted hazard model that :meth:`estimate`
        uses: fitted once and reused by every call (chunks of one run share them; the Spark path makes
        them once on the driver and broadcasts them)."""
        key = (id(self.hazard), hazard_boot, seed)
        cache = self.__dict__.setdefault("_refits", {})
        if key not in cache:
            cache.clear()
            cache[key] = [self.hazard.refit(w) for w in self.refit_weights(hazard_boot, seed)]
        return cache[key]

    def frozen(self, hazard_boot: int, seed: int = 0) -> "TailEstimator":
        """A copy ready to estimate chunk after chunk: its ``hazard_boot`` refits made now, every training
        layout dropped. Why: a layout is the size of the training sample (~150 MB at 256k request-steps),
        and a store's runs each held one through the pass, so memory grew with the number of runs."""
        e = copy.copy(self)
        e.__dict__.pop("_refits", None)
        e.refits_ = [strip_training(m) for m in self.hazard_refits(hazard_boot, seed)] \
            if hazard_boot and hasattr(self.hazard, "_train") else None
        e.hazard = strip_training(self.hazard)
        return e

    def refit_weights(self, hazard_boot: int, seed: int = 0) -> list[np.ndarray]:
        """Poisson(1) weights per training request of each hazard refit: the keyed draws of
        :func:`estimators.bootstrap.cluster_weights`, keyed by the request's code in the training
        frame (codes follow sorted (run_id, rid), so the Spark driver's layout gets the same)."""
        nreq = self.hazard._train["n_req"]
        return list(cluster_weights(np.arange(nreq, dtype=np.uint64), hazard_boot, seed))

    def estimate(self, data, gamma: int | None = None, gather=None,
                 hazard_boot: int = 0, seed: int = 0, chunk_rows: int = 1 << 19, refits=None) -> TailResult:
        """Predictive ceilings for every request-step of ``data`` (truth columns are never read,
        except to copy them into ``blocks.truth`` for validation).

        Only censored blocks need the walk, the hazards and the intervals: whole-array passes over
        them, ``chunk_rows`` censored blocks at a time (bounded memory; fewer, larger passes are
        faster). Every step is row-wise, so the result does not depend on the chunking.
        ``refits``: the hazard refits of :meth:`hazard_refits`, when made elsewhere (default: those a
        :meth:`frozen` copy holds)."""
        refits = self.refits_ if refits is None else refits
        if isinstance(data, BlockFrame):
            frame = data
        else:
            G0 = gamma or getattr(self, "gamma_", None)
            frame = BlockFrame.from_request_steps(data, gamma=G0, skip=("confidence_logit", "survival"))
        G, n = frame.gamma, frame.n
        cens = frame.censored
        rows = np.flatnonzero(cens)
        # every column starts as the exact answer of an uncensored row; each chunk of censored rows
        # writes its own rows in place (no per-chunk columns concatenated, then scattered, again)
        correct = frame.correct
        col = dict(mean=correct.astype(float), var=np.zeros(n), bound_lo=correct.copy(), bound_hi=correct.copy(),
                   sens_lo=correct.astype(float), sens_hi=correct.astype(float),
                   resolved=np.ones(n, bool), walked=np.zeros(n, np.int64), mode=np.zeros(n, np.int8))
        for L in self.levels:
            tag = int(round(L * 100))
            col[f"lo{tag}"], col[f"hi{tag}"], col[f"mass{tag}"] = correct.copy(), correct.copy(), np.ones(n)
        # an audit's posterior of the shift past the walk rides on the hazard refits (one draw each): the
        # interval then holds the shift and the sampling noise jointly; without refits, its band is added whole.
        # Jointly, the band's ends are still kept (band_lo/band_hi, not widening): the audit-size advice reads them
        joint = bool(hazard_boot and (refits is not None or hasattr(self.hazard, "_train")) and self.prior_ is not None
                     and self.prior_.cdf is not None)
        if joint:
            col["band_lo"], col["band_hi"] = correct.astype(float), correct.astype(float)
        cell = correct.copy()  # the pmf's point mass: correct, or a resolved block's bound
        parts = [self._censored(frame, r, gather, seed, col, cell, joint)
                 for r in np.array_split(rows, max(1, -(-rows.size // chunk_rows)))]
        if frame is not data:  # our own frame: its committed stream (a few arrays over all rows) is done
            frame._stream = None  # (freed now, the result's pmf and columns reuse its memory: fewer page faults)
        pmf = np.zeros((n, G + 1))
        cell += np.arange(0, n * (G + 1), G + 1)  # flat index of each row's point mass
        pmf.reshape(-1)[cell] = 1.0
        for p in parts:
            pmf[p["open"]] = p["pmf"]
        df = frame.pandas_columns(("run_id", "rid", "forward_ct", "rank", "epoch", "workload"))
        cols = {
            "run_id": df["run_id"].array, "rid": df["rid"].array, "forward_ct": df["forward_ct"].to_numpy(),
            "rank": df["rank"].to_numpy(), "epoch": df["epoch"].to_numpy(),
            "workload": df["workload"].array if "workload" in df else None,
            "temperature": frame.temperature, "window": frame.window, "correct": correct,
            "acc_len": correct + 1, "censored": cens,
            "mode": pa.array(_MODES).take(pa.array(col.pop("mode"))).to_pandas(),
        }
        cols.update(col)
        if frame.has_truth.any():
            cols["truth"] = np.where(frame.has_truth, frame.ceiling, np.nan)
        res = TailResult(blocks=pd.DataFrame(cols, copy=False), pmf=pmf, gamma=G, levels=tuple(self.levels),
                         hazard_info=dict(self.hazard.info_),
                         notes=list(frame.notes) + self.hazard.fallback_notes(frame, rows))
        if hazard_boot and (refits is not None or hasattr(self.hazard, "_train")):
            models = self.hazard_refits(hazard_boot, seed) if refits is None else refits
            mean, var = col["mean"], col["var"]
            means = np.empty((len(models), n))
            vars_ = np.empty((len(models), n))
            # resolved blocks keep their point mass under any hazards: only the open ones are refitted
            ro = np.concatenate([p["open"] for p in parts])
            feats = self.hazard.features(frame, ro, np.concatenate([p["state"] for p in parts]))  # shared by every refit
            h_op = np.concatenate([p["h"] for p in parts])
            deltas = self.prior_.draws(len(models)) if joint else \
                np.full(len(models), self.prior_.center if self.prior_ else 0.0)
            lp = prior_rows(self.prior_, res.blocks["mode"].to_numpy()[ro])  # the prior's blocks
            for i, model in enumerate(models):
                hm = prior_applied(model.predict_features(feats), float(deltas[i]), lp)
                _, mc, vc = self._pmf(frame, ro, h_op, hm)
                means[i], vars_[i] = mean, var
                means[i, ro], vars_[i, ro] = mc, vc
            res._boot = dict(means=means, vars=vars_)
        return res

    def _censored(self, frame: BlockFrame, rows: np.ndarray, gather, seed: int, col: dict, cell: np.ndarray,
                  joint: bool = False) -> dict:
        """Walk, hazards, predictive pmf, identification bounds and intervals of censored ``rows``,
        written into their rows of the result columns ``col`` (and ``cell``, the pmf's point mass).

        A block the walk resolved (its identification bounds meet) has all its mass on that
        bound whatever the hazards say (the known 1s up to a known 0, or to gamma): its pmf, mean,
        variance and intervals are written directly (the same values the general path computes,
        bit for bit); only the open blocks get hazard predictions, pmfs and intervals. Returns the
        open blocks' frame rows (``open``), pmfs, walk hazards and states (the refits reuse them).
        Why: on the reference engine about two thirds of the censored blocks are resolved."""
        wk = self._walk(frame, rows, gather)
        Hk = wk["h"]
        G = frame.gamma
        blo, bhi = identification_bounds(frame.window[rows], Hk)
        op = np.flatnonzero(blo != bhi)
        ro = rows[op]
        cell[rows] = blo
        col["mean"][rows] = blo
        col["bound_lo"][rows], col["bound_hi"][rows] = blo, bhi
        col["sens_lo"][rows], col["sens_hi"][rows] = blo, blo
        col["resolved"][ro] = False
        col["walked"][rows] = wk["walked"]
        col["mode"][rows] = np.where(frame.greedy[rows], 1, np.where(wk["has_lp"] & (self.mode != "confidence"), 2, 3))
        pmo = np.zeros((0, G + 1))
        if op.size:
            h_op, st_op = Hk[op], wk["state"][op]
            hm = self.hazard.predict(frame, ro, st_op)
            sh = self.prior_
            lp = prior_rows(sh, col["mode"][ro])  # the prior's blocks
            pmo, col["mean"][ro], col["var"][ro] = self._pmf(frame, ro, h_op, prior_applied(hm, sh.center, lp) if sh else hm)
            col["sens_lo"][ro] = col["sens_hi"][ro] = col["mean"][ro]
            if sh:  # the band's ends: the positions the walk could not follow under the band's shifts
                lo_d, hi_d = sh.band()
                ends = ("band_lo", "band_hi") if joint else ("sens_lo", "sens_hi")  # jointly: kept, not widening
                col[ends[0]][ro] = self._pmf(frame, ro, h_op, prior_applied(hm, lo_d, lp))[1]
                col[ends[1]][ro] = self._pmf(frame, ro, h_op, prior_applied(hm, hi_d, lp))[1]
            iv = quantile_intervals(pmo, self.levels, self.interval, _block_uniforms(frame, ro, seed))
        else:
            h_op, st_op = Hk[:0], wk["state"][:0]
        for L in self.levels:
            tag = int(round(L * 100))
            lo, hi, m = col[f"lo{tag}"], col[f"hi{tag}"], col[f"mass{tag}"]
            lo[rows], hi[rows] = blo, blo
            if op.size:
                lo[ro], hi[ro], m[ro] = iv[L]
        return dict(open=ro, pmf=pmo, h=h_op, state=st_op)

    def calibrate_prior(self, audit, seed: int = 0) -> "TailEstimator":
        """The unobserved-position shift measured on ``audit`` (a truth-bearing frame of the same traffic:
        a cap-accept arm; :func:`estimators.margin.audit_posterior`), in place of the prior alone. Its
        ceilings are hidden from the walk and the model, as in :meth:`estimate`; only the open blocks
        (those the walk leaves between two bounds) carry information about the shift. A fit on truth
        (no prior) is left as it is."""
        if self.prior_ is None:
            return self
        frame = _as_frame(audit, self.gamma_)
        rows = np.flatnonzero(frame.censored & frame.has_truth)
        wk = self._walk(frame, rows, None)
        blo, bhi = identification_bounds(frame.window[rows], wk["h"])
        op = np.flatnonzero(blo != bhi)
        ro = rows[op]
        codes, uniq = pd.factorize(frame.request[ro])  # the audited requests with an open block
        curves = np.zeros((len(uniq), SHIFT_GRID.size))
        truth = np.bincount(codes, weights=frame.ceiling[ro].astype(float), minlength=len(uniq))
        if ro.size:
            hm = self.hazard.predict(frame, ro, wk["state"][op])
            h_op = wk["h"][op]
            for g, d in enumerate(SHIFT_GRID):
                curves[:, g] = np.bincount(codes, weights=self._pmf(frame, ro, h_op, shift_hazards(hm, d))[1],
                                           minlength=len(uniq))
        lp = wk["has_lp"][op] & ~frame.greedy[ro] & (self.mode != "confidence")  # the prior's own blocks
        lp_share = float(lp.mean()) if op.size else 0.0
        self.prior_ = audit_posterior(self.prior_, curves, truth, lp_share)
        n_req = int(frame.request.max()) + 1 if frame.n else 0  # codes 0.. per (run_id, rid)
        self.prior_.audit.update(n_open_blocks=int(ro.size), n_blocks=int(frame.n), n_audited_requests=n_req)
        self.hazard.info_ = dict(self.hazard.info_, unobserved_prior=self.prior_.to_json())
        return self

    def calibration_note(self) -> str:
        """What the hazard note adds after :meth:`calibrate_prior`: nothing when the audit measured the shift,
        else why the prior stands as it was (fewer than 2 audited requests with an open block)."""
        audit = self.prior_.audit if self.prior_ is not None else None
        return f" ({audit['note']})" if audit and self.prior_.cdf is None else ""

    @staticmethod
    def _pmf(frame, rows, Hk, Hm):
        G = frame.gamma
        k = np.arange(G)[None, :]
        w = frame.window[rows][:, None]
        H = np.where(np.isnan(Hk), Hm, Hk)
        H = np.where(k >= w, H, 1.0)
        S = np.concatenate([np.ones((len(rows), 1)), np.cumprod(H, 1)], 1)  # P(K >= m), m=0..G
        pm = S - np.concatenate([S[:, 1:], np.zeros((len(rows), 1))], 1)
        pm = np.maximum(pm, 0)
        v = np.arange(G + 1)[None, :]
        mean = (pm * v).sum(1)
        var = np.maximum((pm * v * v).sum(1) - mean ** 2, 0)
        return pm, mean, var


def identification_bounds(w: np.ndarray, Hk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block, the ceiling's model-free bounds from its window ``w`` and the walk's known hazards
    ``Hk`` (blocks x positions; 1/0 known, NaN unknown): the leading exact accepts past the window, and
    the first exact rejection (or gamma)."""
    blo, bhi = w.copy(), w.copy()
    lead1, notzero = np.ones(len(w), bool), np.ones(len(w), bool)
    for j in range(Hk.shape[1]):  # column by column (an accumulate along rows is several times slower)
        before = w > j
        lead1 &= (Hk[:, j] == 1.0) | before
        notzero &= (Hk[:, j] != 0.0) | before
        blo += lead1 & ~before
        bhi += notzero & ~before
    return blo, bhi


def _first_from_bonus(frame: BlockFrame, rows: np.ndarray, wk: dict) -> dict:
    """First trimmed position from the recorded bonus where the committed stream does not reach it.

    On a request's last step the output can be cut (``max_new_tokens``, EOS) before the bonus,
    so the walk, which reads the committed stream, leaves ``d_w`` unknown. The verify still
    produced the capped bonus (``bonus_token`` is the real one, never a placeholder: reference
    engine and SGLang's dump alike), and ``bonus == d_w`` iff ``d_w`` was accepted, so the
    first trimmed position stays exact. A missing bonus (NULL) leaves it unknown. In place."""
    G = frame.gamma
    w = frame.window[rows]
    i = np.flatnonzero(w < G)
    if i.size == 0:
        return wk
    # flat indices: a 2-D fancy index is several times slower
    at = i * G + w[i]
    b = frame.bonus[rows[i]]
    d = frame.draft.reshape(-1).take(rows[i] * G + w[i])
    h, state = wk["h"].reshape(-1), wk["state"].reshape(-1)
    ok = np.isnan(h.take(at)) & (b >= 0) & (d >= 0)
    at = at[ok]
    h[at] = (b[ok] == d[ok]).astype(float)
    state[at] = 3
    wk["walked"][i[ok]] += 1
    return wk
