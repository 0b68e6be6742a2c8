"""Planner audit: rebuild the lagged survival the budget came from, recompute theta(M) and the budget.

SGLang sizes the verify budget from the confidence of ``lag_steps`` decode steps earlier
(the relay ring; reference §7), with fresh requests at survival 1, then takes the global
argmax of ``theta(M) = (N + sum of the M largest survivals) / step_time(N, N + M)``
(additive table; 1-D: ``tau * SPS_floor(N + M)``; reference §4.3). The lagged survival is
not recorded, so this module rebuilds it from the same rid's survival ``lag_steps`` decode
records back (the latest record at or before that step; none -> ones), recomputes the
budget with an SPS table, and audits it against the recorded ``budget`` /
``predicted_theta`` / ``predicted_step_ms``. It also counts trimming and what it saved:
verify tokens not scheduled vs accepted drafts lost (``ceiling - correct_drafts``, exact
with a ceiling, else the tail estimate), and the optimism of fresh requests.

Example (the budget rule on a hand case: one request, survivals 0.9 and 0.5, a table where
each extra token costs 10% of the base step)::

    >>> import numpy as np
    >>> from acceptscope.domain.sps import SpsTableAdditive
    >>> from acceptscope.estimators.planner import budget_rule
    >>> t = SpsTableAdditive(1.0, [1, 2], [0.0, 0.0], [1, 3], [0.0, 0.2])
    >>> budget_rule(np.array([[0.9, 0.5]]), t)["budget"]   # theta: 1/1, 1.9/1.1, 2.4/1.2
    2
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from acceptscope.domain.scheduler import SURVIVAL_EPS, compute_budget
from acceptscope.domain.sps import SpsTable, SpsTableAdditive
from acceptscope.estimators.bootstrap import group_codes
from acceptscope.estimators.frame import BlockFrame

STEP_CELLS = 1 << 20  # (step, candidate) cells of the budget recomputation held at once (8 MB an array)
# the request_steps columns the audit reads (its frame's confidences, windows, outcomes, keys): a window of
# rows kept for it need not hold the draft tokens and log-probs
AUDIT_COLUMNS = ("run_id", "rank", "epoch", "forward_ct", "rid", "step_index", "prefix_len", "window",
                 "correct_drafts", "cap_trim", "bonus_token", "confidence", "ceiling", "temperature", "workload",
                 "finished")

def budget_rule(S_lag: np.ndarray, table: SpsTable) -> dict:
    """SGLang's ``compute_verify_token_budget`` on an ``(N, G)`` lagged-survival matrix (the engine's rule)."""
    d = compute_budget(np.asarray(S_lag), table)
    step_ms = d.predicted_step_seconds * 1e3 if d.predicted_step_seconds is not None else float("inf")
    return dict(budget=d.budget, predicted_theta=d.predicted_theta, predicted_step_ms=step_ms,
                n_candidates=d.n_candidates)


def step_budgets(S_lag: np.ndarray, codes: np.ndarray, n_steps: int, table: SpsTable) -> dict:
    """:func:`budget_rule` of every decode step at once: rows ``S_lag`` (n, G) of step ``codes`` (n,).

    Why: one call per step was the planner audit's cost (~0.3 ms a step, 52k steps on a 2M fleet).
    Each step's candidates are sorted and summed in a row of a zero-padded matrix (steps bucketed by
    candidate count, powers of two), so every prefix sum adds the same numbers in the same order as
    :func:`domain.scheduler.compute_budget`: the same budgets, thetas and step times, not just close."""
    S = np.asarray(S_lag, np.float64)
    valid = S >= SURVIVAL_EPS
    k = np.bincount(codes, weights=valid.sum(1), minlength=n_steps).astype(np.int64)  # candidates per step
    N = np.bincount(codes, minlength=n_steps).astype(np.float64)
    step = np.repeat(codes, valid.sum(1))
    v = S[valid]
    order = np.lexsort((-v, step))  # by step, then descending value
    v, step = v[order], step[order]
    start = np.concatenate([[0], np.cumsum(k)[:-1]])
    col = np.arange(v.size) - start[step]
    budget = np.zeros(n_steps, np.int64)
    theta = np.full(n_steps, np.nan)
    step_s = np.full(n_steps, np.inf)
    width = 1 << np.ceil(np.log2(k + 1)).astype(np.int64)  # row length: candidates + the empty prefix
    at = np.full(n_steps, -1, np.int64)
    for wd in np.unique(width):
        same = np.flatnonzero(width == wd)
        for rows in np.array_split(same, -(-same.size * int(wd) // STEP_CELLS)):  # bounded memory
            at[rows] = np.arange(rows.size)
            mine = at[step] >= 0
            A = np.zeros((rows.size, int(wd)))
            A[at[step[mine]], col[mine] + 1] = v[mine]  # row: 0, then the step's candidates, descending
            at[rows] = -1
            budget[rows], theta[rows], step_s[rows] = _argmax_theta(A, N[rows], k[rows], table)
    return dict(budget=budget, predicted_theta=theta, predicted_step_ms=step_s * 1e3)


def _argmax_theta(A: np.ndarray, N: np.ndarray, k: np.ndarray, table: SpsTable) -> tuple:
    """Budget, theta and step seconds of steps with ``N`` requests and candidate rows ``A`` (``k`` long)."""
    tau = N[:, None] + np.cumsum(A, 1)
    m = np.arange(A.shape[1], dtype=np.float64)[None, :]
    if isinstance(table, SpsTableAdditive):
        st = table.step_seconds(N[:, None], m)
        th = tau / st
    else:
        sps = np.broadcast_to(table.lookup(N[:, None] + m), tau.shape)
        th = tau * sps
        st = np.where(sps > 0, 1.0 / np.where(sps > 0, sps, 1.0), np.inf)
    th = np.where(m <= k[:, None], th, -np.inf)  # past a step's candidates: not a choice
    i = np.argmax(th, 1)
    r = np.arange(A.shape[0])
    return i, th[r, i], st[r, i]


def _step_ordinals(st: pd.DataFrame, rows: pd.DataFrame, lag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``rows``, its decode step's ordinal within its (run, rank, epoch) in ``st`` (steps by
    ``forward_ct``) and that step's ``lag``; NaN ordinal where the step is not in ``st``. One integer key per
    step (per-column codes in value order, combined by radix) and a sorted search: a pandas merge on the
    four columns, string run ids included, was most of the planner audit's rebuild of the lagged survival."""
    ns = len(st)
    code = np.zeros(ns + len(rows), np.int64)
    for c in st.columns:
        cc, uniq = pd.factorize(pd.concat([st[c], rows[c]], ignore_index=True), sort=True, use_na_sentinel=False)
        span = max(len(uniq), 1)  # the last column's (forward_ct): key // span is the (run, rank, epoch)
        code = code * span + cc
    ks, kr = code[:ns], code[ns:]
    order = np.argsort(ks, kind="stable")
    ks = ks[order]
    grp = ks // span  # (run, rank, epoch)
    start = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1]])
    ordinal = np.arange(ns) - np.repeat(start, np.diff(np.r_[start, ns]))
    if not ns:
        return np.full(len(rows), np.nan), np.zeros(len(rows), np.int64)
    at = np.minimum(np.searchsorted(ks, kr), ns - 1)
    hit = ks[at] == kr
    return np.where(hit, ordinal[at], np.nan), np.where(hit, lag[order][at], 0)


def lagged_survival(frame: BlockFrame, steps: pd.DataFrame | None = None, default_lag: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Per request-step, the same rid's survival ``lag`` decode steps back (ones when fresh).

    Returns ``(S_lag (n, G), fresh (n,))``. Decode-step ordinals come from the ``steps`` table
    of each (run, rank, epoch) when given, else from the request-steps' forward_ct values."""
    cols = ["run_id", "rank", "epoch", "forward_ct"]
    df = frame.pandas_columns(cols)
    if steps is not None and len(steps):
        st = steps[cols]
        lag_steps = steps["lag_steps"].to_numpy(float) if "lag_steps" in steps else np.full(len(steps), np.nan)
    else:
        st = df.drop_duplicates()
        lag_steps = np.full(len(st), np.nan)
    ord_, lag = _step_ordinals(st, df, np.clip(np.nan_to_num(lag_steps, nan=default_lag), 1, None).astype(np.int64))
    lag = np.where(np.isnan(ord_), default_lag, lag)
    surv = np.where(np.isnan(frame.confidence), np.nan, np.cumprod(np.nan_to_num(frame.confidence, nan=1.0), 1))
    # rows are sorted by request then step: find, per row, the latest earlier row of the same
    # request whose ordinal <= ord - lag
    req = frame.request
    target = ord_ - lag
    G = frame.gamma
    out = np.ones((frame.n, G))
    fresh = np.ones(frame.n, bool)
    okord = ~np.isnan(ord_)
    comp = np.where(okord, req * 10_000_000 + np.nan_to_num(ord_, nan=-1), -1)
    tq = np.where(okord, req * 10_000_000 + np.nan_to_num(target, nan=-1), -1)
    # comp is non-decreasing within each request (rows sorted by step); search the latest <= tq
    pos = np.searchsorted(comp, tq, side="right") - 1
    hit = (pos >= 0) & okord
    hit &= req[np.clip(pos, 0, None)] == req
    hit &= comp[np.clip(pos, 0, None)] <= tq
    idx = np.flatnonzero(hit)
    out[idx] = np.nan_to_num(surv[pos[idx]], nan=1.0)
    fresh[idx] = False
    return out, fresh


@dataclass
class PlannerAudit:
    per_step: pd.DataFrame
    summary: dict
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(summary=self.summary, notes=self.notes)


def audit(request_steps, steps: pd.DataFrame, table: SpsTable, ceiling_estimate: np.ndarray | None = None,
          gamma: int | None = None) -> PlannerAudit:
    """Recompute every recorded step's budget and count trimming (see module docstring).

    ``ceiling_estimate``: per-request-step ceiling (frame order) for runs without truth."""
    frame = request_steps if isinstance(request_steps, BlockFrame) else BlockFrame.from_request_steps(request_steps, gamma)
    G = frame.gamma
    S_lag, fresh = lagged_survival(frame, steps)
    df = frame.df
    key = ["run_id", "rank", "epoch", "forward_ct"]
    codes, uniq = group_codes(df, key)  # integer codes per decode step (no per-row string join)
    ns = len(uniq)
    b = step_budgets(S_lag, codes, ns, table)
    surv_now = np.cumprod(np.nan_to_num(frame.confidence, nan=1.0), 1)
    w = frame.window
    in_window = np.where(np.arange(G)[None, :] < w[:, None], surv_now, 0).sum(1)
    n_rows = np.bincount(codes, minlength=ns)

    def per_step(v) -> np.ndarray:
        return np.bincount(codes, weights=v, minlength=ns)

    ps = pd.DataFrame({c: uniq[c].to_numpy() for c in key})
    ps = ps.assign(n_rows=n_rows, fresh_rows=per_step(fresh).astype(np.int64), recomputed_budget=b["budget"],
                   recomputed_theta=b["predicted_theta"], recomputed_step_ms=b["predicted_step_ms"],
                   scheduled_window_tokens=per_step(w).astype(np.int64),
                   expected_committed_scheduled=n_rows + per_step(in_window),
                   committed=per_step(frame.correct + 1).astype(np.int64), trimmed_rows=per_step(w < G).astype(np.int64))
    if len(steps):
        cols = [c for c in ("bs", "budget", "predicted_theta", "predicted_step_ms", "step_cpu_ms", "step_gpu_ms",
                            "num_verify_tokens", "lag_steps") if c in steps]
        ps = ps.merge(steps[key + cols], on=key, how="left")
    has_b = ps["budget"].notna() if "budget" in ps else pd.Series(False, index=ps.index)
    ceil = frame.ceiling.astype(float) if frame.has_truth.all() else (
        None if ceiling_estimate is None else np.asarray(ceiling_estimate, float))
    saved = float((G - frame.window).sum())
    summary = dict(
        steps=int(len(ps)), steps_with_recorded_budget=int(has_b.sum()),
        budget_exact_match_rate=float((ps.loc[has_b, "budget"] == ps.loc[has_b, "recomputed_budget"]).mean()) if has_b.any() else None,
        budget_mae=float((ps.loc[has_b, "budget"] - ps.loc[has_b, "recomputed_budget"]).abs().mean()) if has_b.any() else None,
        predicted_theta_median_rel_err=float(((ps.loc[has_b, "predicted_theta"] - ps.loc[has_b, "recomputed_theta"]).abs()
                                              / ps.loc[has_b, "predicted_theta"]).median()) if has_b.any() and "predicted_theta" in ps else None,
        steps_with_trimming=int((ps.trimmed_rows > 0).sum()),
        request_steps=int(frame.n), trimmed_request_steps=int((frame.window < G).sum()),
        fresh_request_steps=int(fresh.sum()),
        verify_tokens_saved=saved,
        accepted_drafts_lost=None if ceil is None else float((ceil - frame.correct).sum()),
        accepted_drafts_lost_source="ceiling" if frame.has_truth.all() else ("tail estimate" if ceil is not None else None),
        expected_committed_scheduled=float(ps.expected_committed_scheduled.sum()), committed=int(ps.committed.sum()),
    )
    if ceil is not None:
        summary["lost_per_saved_token"] = summary["accepted_drafts_lost"] / max(saved, 1.0)
    notes = [f"lag from steps.lag_steps (default 2); SPS table kind: {table.kind}"]
    return PlannerAudit(per_step=ps, summary=summary, notes=notes)
