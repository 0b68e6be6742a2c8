"""SGLang's deterministic ``[lo, hi]`` block-accept bracket and TensorRT-LLM's trim counters.

Why: they are the upstream numbers users already see; acceptscope reports them next to its
own estimates so the two can be compared on the same blocks.

* :func:`bracket_from_jsonl` recomputes SGLang 0.5.23's offline bracket from the estimator
  JSONL tables (``estimator_rows`` / ``estimator_gather`` / ``estimator_eos``; reference
  §5.4/§5.7): ``a = min(1, exp(p_lp - q_lp))``, ``prod *= a``, ``lo += prod`` along the walk;
  a divergence adds ``prod * (gamma - offset)`` to ``hi``, a walk cut at the end of the data
  adds ``prod * (gamma - offset + 1)``, an EOS marker adds nothing. Units: accept length
  (accepted drafts + 1 bonus). Rows that open no block are exact (``cl + 1``).
* :func:`bracket_from_frame` applies the same recipe to acceptscope's own telemetry
  (``target_logprob`` of the bonus row and of later steps that scored the same token).
* :func:`trim_counters`: ``trim_ratio = 1 - delivered / ceiling`` (needs the ceiling) and
  ``trim_regret_rate`` = trimmed request-steps that accepted their whole window / trimmed
  request-steps (model-free).

Example::

    >>> from acceptscope.estimators.synthetic import simulate
    >>> from acceptscope.estimators.bracket import bracket_from_jsonl
    >>> sim = simulate(n_requests=40, seed=4)
    >>> br = bracket_from_jsonl(sim.tables["estimator_rows"], sim.tables["estimator_gather"])
    >>> bool((br.hi >= br.lo - 1e-9).all()) and set(br.category) <= {
    ...     "exact_in_window", "walked", "censored_diverged", "censored_at_end", "censored_eos"}
    True
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from acceptscope.estimators.frame import BlockFrame, padded


def _walk_bracket(w, G, plp, qlp, present, diverged, eos):
    """Vectorised SGLang walk. Arrays are (n, G) by absolute draft index k; w, G, eos are (n,)."""
    n, Gm = plp.shape
    k = np.arange(Gm)[None, :]
    tail = (k >= w[:, None]) & (k < G[:, None])
    a = np.where(present, np.minimum(1.0, np.exp(plp - qlp)), np.nan)
    miss = tail & ~present
    e = np.where(miss.any(1), np.argmax(miss, 1), G)  # first missing
    dvm = tail & present & diverged
    dv = np.where(dvm.any(1), np.argmax(dvm, 1), G)
    stop = np.minimum(np.where(dv < e, dv + 1, e), G)  # positions w..stop-1 contribute
    use = tail & (k < stop[:, None])
    prod = np.cumprod(np.where(use, a, 1.0), 1)
    lo_extra = np.where(use, prod, 0.0).sum(1)
    last = np.where(stop > w, prod[np.arange(n), np.maximum(stop - 1, 0)], 1.0)
    base = w + 1.0
    lo = base + lo_extra
    cat = np.full(n, "walked", dtype=object)
    hi = lo.copy()
    isdv = dv < e
    cat[isdv] = "censored_diverged"
    hi = np.where(isdv, lo + last * np.maximum(G - (dv + 1), 0), hi)
    isend = ~isdv & (e < G)
    cat[isend & eos] = "censored_eos"
    cat[isend & ~eos] = "censored_at_end"
    hi = np.where(isend & ~eos, lo + last * (G - e), hi)
    return lo, hi, cat


def bracket_from_jsonl(rows: pd.DataFrame, gather: pd.DataFrame, eos: pd.DataFrame | None = None,
                       gamma: int | None = None) -> pd.DataFrame:
    """Per row record: ``lo``, ``hi`` (accept length) and SGLang's category."""
    rows = rows.reset_index(drop=True)
    n = len(rows)
    w = rows["w"].to_numpy(np.int64)
    cl = rows["cl"].to_numpy(np.int64)
    has_q = (np.array([isinstance(x, (list, tuple, np.ndarray)) for x in rows["q_lp"]], bool)
             if "q_lp" in rows else np.zeros(n, bool))
    if has_q.any():
        tlen = np.array([len(x) if isinstance(x, (list, tuple, np.ndarray)) else 0 for x in rows["trimmed_tokens"]])
    else:
        tlen = np.zeros(n, np.int64)
    G = np.where(has_q, w + tlen, w)
    if gamma is not None:
        G = np.where(has_q, gamma, G)
    Gm = int(max(G.max() if n else 1, 1))
    clean = lambda col: [x if isinstance(x, (list, tuple, np.ndarray)) else None for x in rows[col]] if col in rows else [None] * n
    q_rel = padded(clean("q_lp"), Gm)
    tt_rel = padded(clean("trimmed_tokens"), Gm, -1)
    # shift to absolute draft index k = w + i
    k = np.arange(Gm)[None, :]
    src = k - w[:, None]
    okk = (src >= 0) & (src < Gm)
    qlp = np.where(okk, np.take_along_axis(q_rel, np.clip(src, 0, Gm - 1), 1), np.nan)
    ttok = np.where(okk, np.take_along_axis(tt_rel, np.clip(src, 0, Gm - 1), 1), -1)
    plp = np.full((n, Gm), np.nan)
    real = np.full((n, Gm), -1.0)
    if gather is not None and len(gather):
        key = pd.MultiIndex.from_arrays([rows["run_id"], rows["rid"], rows["fct"]])
        gk = pd.MultiIndex.from_arrays([gather["run_id"], gather["rid"], gather["block_fct"]])
        pos = key.get_indexer(gk)
        kk = gather["offset"].to_numpy() - 1
        ok = (pos >= 0) & (kk >= 0) & (kk < Gm)
        plp[pos[ok], kk[ok]] = gather["p_lp"].to_numpy()[ok]
        real[pos[ok], kk[ok]] = gather["realized_token"].to_numpy()[ok]
        ttok_g = np.full((n, Gm), -1.0)
        ttok_g[pos[ok], kk[ok]] = gather["trimmed_token"].to_numpy()[ok]
        ttok = np.where(ttok < 0, ttok_g, ttok)
    present = ~np.isnan(plp)
    diverged = present & (real != ttok)
    eosm = np.zeros(n, bool)
    if eos is not None and len(eos):
        ek = pd.MultiIndex.from_arrays([eos["run_id"], eos["rid"], eos["block_fct"]])
        key = pd.MultiIndex.from_arrays([rows["run_id"], rows["rid"], rows["fct"]])
        eosm = key.isin(ek)
    lo, hi, cat = _walk_bracket(w, G, plp, qlp, present, diverged, eosm)
    exact = ~has_q
    lo = np.where(exact, cl + 1.0, lo)
    hi = np.where(exact, cl + 1.0, hi)
    cat = np.where(exact, "exact_in_window", cat)
    return pd.DataFrame({"run_id": rows["run_id"], "rid": rows["rid"], "fct": rows["fct"], "w": w, "cl": cl,
                         "lo": lo, "hi": hi, "mid": (lo + hi) / 2, "category": cat})


def bracket_from_frame(frame: BlockFrame) -> pd.DataFrame:
    """SGLang's recipe on acceptscope telemetry, for sampled rows (greedy rows are skipped, as SGLang does)."""
    G = frame.gamma
    rows = np.flatnonzero(~frame.greedy)
    w = frame.window[rows]
    cl = frame.correct[rows]
    opened = (cl == w) & (w < G)
    lt = frame.later(rows)
    d = frame.draft[rows]
    plp = np.where(lt["valid"] & (lt["scored_tok"] == d), lt["scored_lp"], np.nan)
    present = ~np.isnan(plp)
    diverged = lt["realized"] != d
    lo, hi, cat = _walk_bracket(w, np.full(len(rows), G), plp, frame.draft_logprob[rows], present, diverged,
                                frame.finished[rows] & False)
    lo = np.where(opened, lo, cl + 1.0)
    hi = np.where(opened, hi, cl + 1.0)
    cat = np.where(opened, cat, "exact_in_window")
    df = frame.df
    return pd.DataFrame({"run_id": df["run_id"].to_numpy()[rows], "rid": df["rid"].to_numpy()[rows],
                         "fct": df["forward_ct"].to_numpy()[rows], "w": w, "cl": cl, "lo": lo, "hi": hi,
                         "mid": (lo + hi) / 2, "category": cat})


def trim_counters(frame: BlockFrame, ceiling: np.ndarray | None = None) -> dict:
    """TensorRT-LLM-style counters over request-steps. ``ceiling``: accepted drafts (exact or estimated)."""
    G = frame.gamma
    trimmed = frame.window < G
    regret = trimmed & (frame.correct == frame.window)
    out = {
        "request_steps": int(frame.n),
        "trimmed_request_steps": int(trimmed.sum()),
        "trim_regret_rate": float(regret.sum() / max(trimmed.sum(), 1)),
        "window_tokens": int(frame.window.sum()),
        "delivered_tokens": int((frame.correct + 1).sum()),
    }
    if ceiling is None and frame.has_truth.all():
        ceiling = frame.ceiling
    if ceiling is not None:
        ct = float((np.asarray(ceiling, float) + 1).sum())
        out["ceiling_tokens"] = ct
        out["trim_ratio"] = float(1 - out["delivered_tokens"] / ct)
    return out
