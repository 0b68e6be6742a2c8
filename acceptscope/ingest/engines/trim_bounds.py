"""The cost of trimming as TensorRT-LLM's DSpark counters bound it, next to acceptscope's interval.

Why: under ``compact`` the trimmed positions are never scored, so TensorRT-LLM's ``DSparkRaggedStats`` can
only *bound* the acceptance trimming cost, while acceptscope *estimates* it with an interval. The two are put
side by side on one quantity, defined once here:

**trim loss** = accepted draft tokens lost to trimming per scored request-step = (Σ uncapped accepted drafts -
Σ accepted drafts) / request-steps. Bonus token excluded (both sides count drafts); denominator: every scored
request-step (TensorRT-LLM's ``requests_scored``: one ``record_acceptance`` per request per verify step;
acceptscope's request-steps). It equals TensorRT-LLM's ``accept_loss_per_request`` (``cap_trim_tokens /
requests_scored``, measured under ``cap-accept`` only) and acceptscope's ``mean_ceiling - mean accepted``.

What each side gives for it:

* TensorRT-LLM ``cap-accept``: measured (``cap_trim_tokens / requests_scored``).
* TensorRT-LLM ``compact`` (and acceptscope's own compact telemetry, counted the same way): only request-steps
  that accepted their whole window (``trimmed_hit_ceiling``) can have lost anything, each at most K - its
  window, so loss ∈ [0, hit x (K - w_min) / N] with w_min the smallest window handed out
  (``verify_len_hist``): model-free. TensorRT-LLM's docstrings claim more, "bounded from below by
  ``trimmed_hit_ceiling``" (loss >= hit / N): that holds only if every draft alive at the cut would have
  survived one more position, which sampling (and a greedy mismatch at the next position) does not
  guarantee; it is reported as ``trim_loss_trt_floor`` and labelled as TensorRT-LLM's claim, not a bound.
* acceptscope: the tail estimate's interval of the mean ceiling minus the exact mean accepted drafts
  (``trim_loss_estimate`` [``trim_loss_lo``, ``trim_loss_hi``]), inside the model-free bounds its telemetry
  proves (``trim_loss_identified_lo`` / ``_hi``: window-and-walk floor, first known rejection).

The regret rate has a second reading, also side by side: a request-step that accepted its whole window lost a
draft only if its first trimmed draft would have been accepted. acceptscope's ``estimators.trim_regret`` counts
those (``first_accepted_rate``: trimmed request-steps whose first trimmed draft would have been accepted /
trimmed request-steps, known from the committed stream or the capped bonus; ``first_accepted_bound_hi`` counts
the unresolved ones as accepted; a 95% request-clustered bootstrap interval ``first_accepted_lo`` / ``_hi``),
so TensorRT-LLM's ``trim_regret_rate`` is a model-free upper bound of ``first_accepted_rate``, and
``trim_regret_ci_lo`` / ``_hi`` give the sampling interval TensorRT-LLM does not state.

Not the same quantity, so never equated: TensorRT-LLM's ``trim_ratio`` (1 - delivered / ceiling tokens
*submitted to the target*, bonus included, bucket-rounded: compute saved) versus acceptscope's
``trim_ratio`` (1 - emitted / no-trim emitted tokens: acceptance lost). The comparison shows TensorRT-LLM's
as ``submitted_trim_ratio`` and computes the same (unrounded, window-based) figure for acceptscope's runs.
``trim_regret_rate`` (trimmed request-steps that accepted their whole window / trimmed request-steps) is the
same quantity on both sides (acceptscope's ``estimators.bracket.trim_counters``); TensorRT-LLM writes it
rounded to 4 decimals, so its count is an interval when the trimmed request-steps exceed ~10^4.
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd

from acceptscope.ingest.engines.trtllm_dspark import rate_preimage

LOSS_COLUMNS = ("trim_regret_rate", "trim_regret_rate_lo", "trim_regret_rate_hi", "submitted_trim_ratio",
                "trim_loss_measured", "trim_loss_bound_lo", "trim_loss_bound_hi", "trim_loss_trt_floor",
                "trim_loss_estimate", "trim_loss_lo", "trim_loss_hi", "trim_loss_identified_lo",
                "trim_loss_identified_hi", "trim_loss_source", "trim_regret_ci_lo", "trim_regret_ci_hi",
                "first_accepted_rate", "first_accepted_bound_hi", "first_accepted_lo", "first_accepted_hi")


def latest_snapshots(df: pd.DataFrame) -> dict[int, dict]:
    """Each rank's latest DSpark snapshot (its counters are cumulative: the one with the most steps, then the
    most scored request-steps) as {rank: {(field, key): value}}."""
    d = df[df.metric.str.startswith("dspark_")]
    out: dict[int, dict] = {}
    for rank, g in d.groupby("rank"):
        sizes = g[g.metric.isin(["dspark_steps_total", "dspark_requests_scored"])].pivot_table(
            index="source", columns="metric", values="value", aggfunc="max").fillna(0)
        src = sizes.sort_values(["dspark_steps_total", "dspark_requests_scored"]).index[-1]
        cells = g[g.source == src]
        out[int(rank)] = {(m[len("dspark_"):], int(p)): int(v)
                          for m, p, v in cells[["metric", "position", "value"]].itertuples(index=False)}
    return out


def _ratio(a: float, b: float) -> Optional[float]:
    return a / b if b else None


def dspark_figures(df: pd.DataFrame, K: int, mode: str) -> Optional[dict]:
    """What a run's DSpark counters give, pooled over ranks (each rank's latest snapshot); None without any."""
    snaps = latest_snapshots(df)
    if not snaps:
        return None
    tot = lambda f: sum(s.get((f, -1), 0) for s in snaps.values())  # noqa: E731
    N, T = tot("requests_scored"), tot("requests_trimmed")
    hit = [0, 0]
    acc = [0, 0]
    for s in snaps.values():
        n, t = s.get(("requests_scored", -1), 0), s.get(("requests_trimmed", -1), 0)
        h = rate_preimage(s[("trim_regret_rate_e4", -1)] / 10_000, t, t) if ("trim_regret_rate_e4", -1) in s else (0, t)
        a = rate_preimage(s[("accept_len_e4", -1)] / 10_000, n, n * K) if ("accept_len_e4", -1) in s else (0, n * K)
        h, a = h or (0, t), a or (0, n * K)  # (a stored snapshot passed the check, so these are found)
        hit = [hit[0] + h[0], hit[1] + h[1]]
        acc = [acc[0] + a[0], acc[1] + a[1]]
    windows: dict[int, int] = {}
    for s in snaps.values():
        for (f, k), v in s.items():
            if f == "verify_len_hist":
                windows[k] = windows.get(k, 0) + v
    w_min = min(windows) if windows else K
    cap_trim = tot("cap_trim_tokens")
    ceiling, window, delivered = tot("ceiling_tokens"), tot("window_tokens"), tot("delivered_tokens")
    out = {
        "mode": mode, "ranks": sorted(snaps), "steps_total": tot("steps_total"), "steps_ragged": tot("steps_ragged"),
        "steps_uniform_windows": tot("steps_uniform_windows"), "steps_no_windows": tot("steps_no_windows"),
        "ceiling_tokens": ceiling, "window_tokens": window, "delivered_tokens": delivered,
        "submitted_trim_ratio": None if not ceiling else 1 - delivered / ceiling,
        "window_trim_ratio": None if not ceiling else 1 - window / ceiling,
        "requests_scored": N, "requests_trimmed": T, "trimmed_hit_ceiling": hit, "accepted": acc,
        "verify_len_hist": dict(sorted(windows.items())), "smallest_window": w_min, "cap_trim_tokens": cap_trim,
        "trim_regret_rate": _ratio(hit[0], T) if hit[0] == hit[1] else None,
        "trim_regret_rate_lo": _ratio(hit[0], T), "trim_regret_rate_hi": _ratio(hit[1], T),
        "mean_accepted_drafts": [_ratio(acc[0], N), _ratio(acc[1], N)],
    }
    out.update(loss_bounds(mode, N, hit, K, w_min, measured=cap_trim if mode == "cap-accept" else None))
    return out


def loss_bounds(mode: str, N: int, hit: list[int], K: int, w_min: int, measured: Optional[int] = None) -> dict:
    """The trim loss per request-step from trim counters (see the module docstring)."""
    if not N:
        return {"trim_loss_measured": None, "trim_loss_bound_lo": None, "trim_loss_bound_hi": None,
                "trim_loss_trt_floor": None}
    if measured is not None:
        return {"trim_loss_measured": measured / N, "trim_loss_bound_lo": measured / N,
                "trim_loss_bound_hi": measured / N, "trim_loss_trt_floor": None}
    if mode == "static":
        return {"trim_loss_measured": 0.0, "trim_loss_bound_lo": 0.0, "trim_loss_bound_hi": 0.0,
                "trim_loss_trt_floor": None}
    return {"trim_loss_measured": None, "trim_loss_bound_lo": 0.0,
            "trim_loss_bound_hi": hit[1] * max(K - w_min, 0) / N, "trim_loss_trt_floor": hit[0] / N}


def native_trim(q: pd.DataFrame, G: int, arm: str) -> dict:
    """The same counters from acceptscope's request-steps (``q``: window w, correct_drafts c, ceiling e, count n),
    so a native run shows TensorRT-LLM's bound beside acceptscope's interval on the same blocks."""
    w, c, n = (q[k].to_numpy().astype(int) for k in ("w", "c", "n"))
    N = int(n.sum())
    trimmed = w < G
    T, hit = int(n[trimmed].sum()), int(n[trimmed & (c == w)].sum())
    known = q["e"].notna().all()
    measured = int(((q["e"].to_numpy(float) - c) * n).sum()) if known and len(q) else None
    w_min = int(w.min()) if len(w) else G
    out = {"trim_regret_rate": _ratio(hit, T) if T else None, "trim_regret_rate_lo": _ratio(hit, T) if T else None,
           "trim_regret_rate_hi": _ratio(hit, T) if T else None,
           "submitted_trim_ratio": 1 - float(((1 + w) * n).sum()) / (N * (1 + G)) if N else None}
    out.update(loss_bounds("compact" if measured is None else arm, N, [hit, hit], G, w_min, measured=measured))
    return out


def estimate_loss(est: Optional[dict], mean_accepted: Optional[float]) -> dict:
    """acceptscope's interval of the trim loss from a run's ``estimate --json`` dict (tail aggregate 'all'),
    and its trim regret figures (``estimators.trim_regret``'s run summary)."""
    out = {"trim_loss_estimate": None, "trim_loss_lo": None, "trim_loss_hi": None,
           "trim_loss_identified_lo": None, "trim_loss_identified_hi": None}
    if not est or "error" in est or mean_accepted is None:
        return out
    reg = (est.get("trim_regret") or {}).get("summary") or {}
    for key, col in (("trim_regret_lo", "trim_regret_ci_lo"), ("trim_regret_hi", "trim_regret_ci_hi"),
                     ("first_accepted_rate", "first_accepted_rate"), ("first_accepted_bound_hi", "first_accepted_bound_hi"),
                     ("first_accepted_lo", "first_accepted_lo"), ("first_accepted_hi", "first_accepted_hi")):
        if reg.get(key) is not None:
            out[col] = float(reg[key])
    tail: Any = est.get("tail") or {}
    agg = [a for a in tail.get("aggregate") or [] if a.get("group") == "all"]
    if agg:
        for key, col in (("mean_ceiling", "trim_loss_estimate"), ("lo", "trim_loss_lo"), ("hi", "trim_loss_hi")):
            if agg[0].get(key) is not None:
                out[col] = float(agg[0][key]) - mean_accepted
    ident = (tail.get("summary") or {}).get("identified") or {}
    for key, col in (("mean_ceiling_lo", "trim_loss_identified_lo"), ("mean_ceiling_hi", "trim_loss_identified_hi")):
        if ident.get(key) is not None:
            out[col] = float(ident[key]) - mean_accepted
    return out
